//! `-lock-timeout`: a command that meets the state lock another process holds waits for it,
//! saying once who holds it, and goes on as soon as it is released; past its timeout it fails as
//! it does without the flag, naming the holder. For the local file and for PostgreSQL (a
//! throwaway cluster, `common::pg`). `state push` is the command: it takes the lock and needs no
//! machine.

use crate::common::pg::Pg;
use crate::pg_state::folder;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sparkform::state::{PgTarget, State, StateLock, StateStore};

/// A document `state push` takes over `store`'s state: the same lineage, serial `serial`.
fn newer(store: &StateStore, dir: &Path, serial: u64) -> std::path::PathBuf {
    let mut s = store.load().unwrap().unwrap();
    s.serial = serial;
    let file = dir.join(format!("pushed-{serial}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(&s).unwrap()).unwrap();
    file
}

/// `sparkform state push FILE DIR ARGS…` while `held` holds the lock, released after `release`
/// (`None`: once the command has ended): exit code, stderr (one line, single spaces) and how
/// long the command took.
fn push_while_held(
    dir: &Path,
    file: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    held: StateLock,
    release: Option<Duration>,
) -> (i32, String, Duration) {
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args(["state", "push"])
        .arg(file)
        .arg(dir)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("SPARKFORM_STATE_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sparkform");
    if let Some(after) = release {
        std::thread::sleep(after);
        drop(held);
        let out = child.wait_with_output().expect("wait");
        return finished(out, started);
    }
    let out = child.wait_with_output().expect("wait");
    drop(held);
    finished(out, started)
}

fn finished(out: std::process::Output, started: Instant) -> (i32, String, Duration) {
    let err = String::from_utf8_lossy(&out.stderr).replace('│', " ");
    (
        out.status.code().unwrap_or(-1),
        err.split_whitespace().collect::<Vec<_>>().join(" "),
        started.elapsed(),
    )
}

/// The three ways a lock held by another process ends for a command, on `store`: waited for
/// and taken once released; waited for past the timeout; refused at once without the flag.
fn waits_then_takes_or_fails(store: &StateStore, dir: &Path, env: &[(&str, &str)]) {
    store.write(&mut State::new()).unwrap();

    let held = store.lock("apply").unwrap();
    let file = newer(store, dir, 5);
    let (code, err, took) = push_while_held(
        dir,
        &file,
        &["-lock-timeout", "30s"],
        env,
        held,
        Some(Duration::from_secs(2)),
    );
    assert_eq!(code, 0, "the push did not take the released lock: {err}");
    assert!(
        err.contains("Waiting up to 30.0 s for the state lock: `apply` holds it since"),
        "{err}"
    );
    assert_eq!(
        err.matches("Waiting up to").count(),
        1,
        "said more than once: {err}"
    );
    assert!(took >= Duration::from_secs(2), "did not wait: {took:?}");
    assert_eq!(store.load().unwrap().unwrap().serial, 5);

    let held = store.lock("apply").unwrap();
    let file = newer(store, dir, 6);
    let (code, err, took) = push_while_held(dir, &file, &["-lock-timeout=1s"], env, held, None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("state is locked: `apply` started at"), "{err}");
    assert!(err.contains("Waiting up to 1.0 s"), "{err}");
    assert!(took >= Duration::from_secs(1), "gave up early: {took:?}");
    assert_eq!(
        store.load().unwrap().unwrap().serial,
        5,
        "written while locked"
    );

    // Without the flag, as before: refused at once, no wait said.
    let held = store.lock("apply").unwrap();
    let (code, err, _) = push_while_held(dir, &file, &[], env, held, None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("state is locked"), "{err}");
    assert!(!err.contains("Waiting"), "{err}");
}

#[test]
fn a_local_state_lock_is_waited_for_up_to_the_timeout() {
    let dir = folder("");
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    waits_then_takes_or_fails(&store, dir.path(), &[]);
}

#[test]
fn a_lock_timeout_that_is_not_a_duration_is_refused_naming_it() {
    let dir = folder("");
    let out = Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args(["state", "push", "x.json"])
        .arg(dir.path())
        .args(["-lock-timeout", "5 parsecs"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"5 parsecs\" is not a duration: write 30s, 5m or 1h"),
        "{err}"
    );
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn a_postgresql_state_lock_is_waited_for_up_to_the_timeout() {
    let pg = Pg::start();
    let dir = folder("state {\n  backend   = \"pg\"\n  workspace = \"waits\"\n}");
    let store = StateStore::postgres(
        dir.path().join("state/sparkform.json"),
        PgTarget {
            schema: "sparkform".into(),
            workspace: "waits".into(),
        },
        &pg.conn,
    )
    .unwrap();
    waits_then_takes_or_fails(&store, dir.path(), &[("SPARKFORM_PG_CONN", &pg.conn)]);
}

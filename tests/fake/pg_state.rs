//! The PostgreSQL state backend against a real server (a throwaway cluster per test,
//! `common::pg`): compare-and-swap writes, the session lock (a second holder refused naming
//! the first, a SIGKILLed holder's lock gone at once), migration local → pg → local byte for
//! byte, encryption with a wrong key, an apply on fake nodes recorded in PostgreSQL, and an
//! apply SIGKILLed by the chaos hook right after a journal write (a whole state, no lock left).

use crate::common;
use crate::common::pg::Pg;

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparkform::apply::{apply, ApplyRequest};
use sparkform::hosts::{HostOptions, HostPool};
use sparkform::ops::apply::{lock_and_plan, PlanRequest, PlanSource};
use sparkform::ops::ReadMode;
use sparkform::plan::PlanOptions;
use sparkform::state::{
    HashKey, LockStatus, PgTarget, ResourceState, State, StateError, StateKey, StateStore,
};
use sparkform_testkit::fake::{FakeHost, FakeWorld};
use tokio_util::sync::CancellationToken;

fn target(workspace: &str) -> PgTarget {
    PgTarget {
        schema: "sparkform".into(),
        workspace: workspace.into(),
    }
}

fn pg_store(pg: &Pg, local: &Path, workspace: &str) -> StateStore {
    StateStore::postgres(
        local.join("state/sparkform.json"),
        target(workspace),
        &pg.conn,
    )
    .unwrap_or_else(|e| panic!("{e:?}"))
}

fn sample() -> State {
    let mut s = State::new();
    s.resources.insert(
        "container.web".into(),
        ResourceState {
            kind: sparkform::vocabulary::KindId::Container,
            node: Some("n1".into()),
            config_hash: "sha256:00".into(),
            config: serde_json::json!({"image": "nginx", "ports": [80]}).into(),
            attributes: Default::default(),
            depends_on: vec![],
            last_apply_secs: Some(1.5),
            schema_version: 1,
        },
    );
    s
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_a_write_from_a_stale_serial_is_refused_and_nothing_is_lost() {
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        pg_store(&pg, dir.path(), "w"),
        pg_store(&pg, dir.path(), "w"),
    );
    assert_eq!(a.load().unwrap(), None);
    let mut first = sample();
    a.write(&mut first).unwrap();
    assert_eq!(first.serial, 1);
    // B reads serial 1; A writes serial 2; B's write from serial 1 is refused.
    let mut stale = b.load().unwrap().unwrap();
    first.outputs.insert(
        "url".into(),
        sparkform::state::OutputState {
            value: serde_json::json!("http://a"),
            sensitive: false,
        },
    );
    a.write(&mut first).unwrap();
    stale.resources.clear();
    match b.write(&mut stale) {
        Err(StateError::Stale {
            read_serial,
            found_serial,
            ..
        }) => assert_eq!((read_serial, found_serial), (1, 2)),
        other => panic!("a stale write went through: {other:?}"),
    }
    assert_eq!(stale.serial, 1, "a refused write leaves the caller's state");
    let now = a.load().unwrap().unwrap();
    assert_eq!(now, first, "the newer document is intact");
    assert_eq!(now.resources.len(), 1);
    // A second first write of a new lineage is refused too.
    let mut other = State::new();
    assert!(matches!(b.write(&mut other), Err(StateError::Stale { .. })));
    // The previous document is kept in the row.
    let previous = pg.psql("SELECT previous FROM sparkform.states WHERE workspace = 'w'");
    assert!(previous.contains("\"serial\": 1"), "{previous}");
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_a_second_lock_holder_is_refused_naming_the_first() {
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    let store = pg_store(&pg, dir.path(), "w");
    assert_eq!(store.lock_status().unwrap(), LockStatus::Free);
    let first = store.lock("apply").unwrap();
    assert!(first.took_over.is_none());
    match store.lock("destroy") {
        Err(StateError::Locked { holder, .. }) => {
            assert_eq!(holder.id, first.info().id);
            assert_eq!(holder.operation, "apply");
            assert_eq!(holder.pid, std::process::id());
        }
        other => panic!("a second holder got in: {other:?}"),
    }
    let note = store.lock_status().unwrap().note().unwrap();
    assert!(
        note.contains("`apply`") && note.contains(&first.info().id),
        "{note}"
    );
    // Another workspace of the same schema has a lock of its own.
    let other = pg_store(&pg, dir.path(), "other").lock("apply").unwrap();
    // force-unlock refuses a live lock, naming it.
    assert!(matches!(
        store.force_unlock(&first.info().id, false),
        Err(StateError::LockLive { .. })
    ));
    first.release().unwrap();
    assert_eq!(store.lock_status().unwrap(), LockStatus::Free);
    let again = store.lock("destroy").unwrap();
    assert!(
        again.took_over.is_none(),
        "a released lock leaves no holder row"
    );
    drop((again, other));
}

/// Not a test of its own: the child process of the next test (it does nothing unless the
/// parent set the variable). It takes the lock, says so, and waits to be killed.
#[test]
fn pg_lock_holder_child() {
    let Ok(conn) = std::env::var("SPARKFORM_TEST_PG_CHILD_CONN") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::postgres(dir.path().join("s.json"), target("killed"), &conn).unwrap();
    let _lock = store.lock("apply").unwrap();
    println!("LOCKED {}", std::process::id());
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_a_killed_holder_leaves_no_lock() {
    let pg = Pg::start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "pg_state::pg_lock_holder_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SPARKFORM_TEST_PG_CHILD_CONN", &pg.conn)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let pid = loop {
        let line = lines
            .next()
            .expect("the child ended before taking the lock")
            .unwrap();
        // libtest may have written `test NAME ... ` ahead of it on the line.
        if let Some((_, pid)) = line.split_once("LOCKED ") {
            break pid.trim().parse::<u32>().unwrap();
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let store = pg_store(&pg, dir.path(), "killed");
    match store.lock("apply") {
        Err(StateError::Locked { holder, .. }) => assert_eq!(holder.pid, pid),
        other => panic!("the child's lock is not held: {other:?}"),
    }
    // SIGKILL: no destructor runs; the server drops the session and its lock.
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let lock = loop {
        match store.lock("apply") {
            Ok(l) => break l,
            Err(StateError::Locked { .. }) if killed.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("the killed holder's lock stayed: {e:?}"),
        }
    };
    let took = killed.elapsed();
    eprintln!("pg lock free {took:?} after the holder's SIGKILL");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let old = lock
        .took_over
        .clone()
        .expect("the killed holder's row is reported");
    assert_eq!(old.pid, pid);
    drop(lock);
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_migrate_local_to_pg_and_back_keeps_the_document_byte_for_byte() {
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    let local = StateStore::new(dir.path().join("state/sparkform.json"));
    let mut s = sample();
    local.write(&mut s).unwrap();
    local.write(&mut s).unwrap();
    let original = std::fs::read(local.path()).unwrap();
    let remote = pg_store(&pg, dir.path(), "default");

    let moved = local.migrate_to(&remote).unwrap();
    assert_eq!((moved.serial, moved.replaced), (2, None));
    assert!(!local.path().exists(), "the local file is set aside");
    assert!(dir.path().join("state/sparkform.json.migrated").exists());
    assert_eq!(remote.read_document().unwrap().unwrap(), original);
    assert_eq!(remote.load().unwrap().unwrap(), s);

    // A write in PostgreSQL, then back to the file.
    let mut s2 = remote.load().unwrap().unwrap();
    remote.write(&mut s2).unwrap();
    let in_pg = remote.read_document().unwrap().unwrap();
    let back = remote.migrate_to(&local).unwrap();
    assert_eq!(back.serial, 3);
    assert_eq!(std::fs::read(local.path()).unwrap(), in_pg);
    assert_eq!(local.load().unwrap().unwrap(), s2);
    // Byte for byte but the serial.
    let strip = |b: &[u8]| String::from_utf8_lossy(b).replace("\"serial\": 3", "\"serial\": 2");
    assert_eq!(strip(&in_pg), String::from_utf8_lossy(&original));

    // A target holding another lineage is refused, and left as it is.
    let other = pg_store(&pg, dir.path(), "other");
    let mut theirs = State::new();
    other.write(&mut theirs).unwrap();
    match local.migrate_to(&other) {
        Err(StateError::OtherLineage { .. }) => {}
        r => panic!("another lineage was overwritten: {r:?}"),
    }
    assert_eq!(other.load().unwrap().unwrap(), theirs);
    assert!(
        local.path().exists(),
        "a refused migration keeps its source"
    );
}

/// `state migrate` carries the key of the hashes with the state: to PostgreSQL (where another
/// checkout, with no key file, reads it) and back to a folder that has none.
#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_migrate_carries_the_key_of_the_hashes_both_ways() {
    let pg = Pg::start();
    let (dir, teammate, back) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let local = StateStore::new(dir.path().join("state/sparkform.json"));
    local.write(&mut sample()).unwrap();
    let key = local.key_or_create().unwrap();
    local
        .migrate_to(&pg_store(&pg, dir.path(), "default"))
        .unwrap();
    let remote = pg_store(&pg, teammate.path(), "default");
    assert_eq!(remote.read_key().unwrap(), Some(key.clone()));

    let fresh = StateStore::new(back.path().join("state/sparkform.json"));
    assert_eq!(fresh.read_key().unwrap(), None);
    remote.migrate_to(&fresh).unwrap();
    assert_eq!(fresh.read_key().unwrap(), Some(key));
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_an_encrypted_state_read_with_the_wrong_key_fails_without_writing() {
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    let key = StateKey::from_bytes([1; 32]);
    let store = pg_store(&pg, dir.path(), "w").with_key(Some(key.clone()));
    let mut s = sample();
    store.write(&mut s).unwrap();
    let row = pg.psql("SELECT document FROM sparkform.states WHERE workspace = 'w'");
    assert!(row.contains("sparkform-encrypted-state"), "{row}");
    assert!(
        !row.contains("nginx"),
        "the row holds the document in clear: {row}"
    );
    assert_eq!(store.load().unwrap().unwrap(), s);

    let wrong = pg_store(&pg, dir.path(), "w").with_key(Some(StateKey::from_bytes([2; 32])));
    assert!(matches!(wrong.load(), Err(StateError::WrongKey { .. })));
    // Even a writer that knows the serial and lineage (they are not secret) cannot write over it.
    let mut guess = s.clone();
    guess.resources.clear();
    assert!(matches!(
        wrong.write(&mut guess),
        Err(StateError::WrongKey { .. })
    ));
    let none = pg_store(&pg, dir.path(), "w");
    assert!(matches!(
        none.load(),
        Err(StateError::EncryptedNoKey { .. })
    ));
    assert!(matches!(
        none.write(&mut guess),
        Err(StateError::EncryptedNoKey { .. })
    ));
    let after = pg.psql("SELECT document FROM sparkform.states WHERE workspace = 'w'");
    assert_eq!(after, row, "nothing was written");
}

const DEFS: &str = r#"
state {
  backend = "pg"
}
node "n1" {
  address        = "10.0.0.1"
  gpus           = 1
  memory_gib     = 128
  unified_memory = true
}
network "fabric" {
  subnet = "192.168.1.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.1.1"
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
async fn pg_plan_and_apply_on_a_fake_node_record_in_postgres() {
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), DEFS).unwrap();
    let (config, graph) = common::load(dir.path());
    let store = pg_store(&pg, dir.path(), "default");
    let key = HashKey::from_bytes([7; 32]);
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let prepared = lock_and_plan(
        PlanRequest {
            evaluated: sparkform::ops::definitions::load(
                &sparkform::workspace::Workspace::new(dir.path(), None),
                &sparkform::config::VarInputs::default(),
            )
            .unwrap_or_else(|e| panic!("{e:?}")),
            lockfile_readonly: false,
            store: store.clone(),
            source: PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions::with_key(key.clone()),
            },
            hosts: HostOptions::default(),
        },
        &events,
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(prepared.plan.summary.create, 1);
    // The prepared apply holds the lock in PostgreSQL.
    assert!(matches!(store.lock_status(), Ok(LockStatus::Held(_))));
    let plan = prepared.plan.clone();
    drop(prepared);

    let world = FakeWorld::new();
    let node = Arc::new(FakeHost::new("node.n1", &world).interface("eth1", 9000, &[]));
    let pool = HostPool::from_hosts(
        [(
            "node.n1".to_string(),
            node as Arc<dyn sparkform::hosts::Host>,
        )]
        .into_iter()
        .collect(),
    );
    let lock = store.lock("apply").unwrap();
    let outcome = apply(ApplyRequest {
        config: &config,
        graph: &graph,
        plan: &plan,
        store: &store,
        state: State::default(),
        parallelism: 4,
        rollback: true,
        hosts: HostOptions::default(),
        pool: Some(pool),
        events: tokio::sync::mpsc::unbounded_channel().0,
        cancel: CancellationToken::new(),
    })
    .await;
    drop(lock);
    assert!(outcome.ok, "{:?}", outcome.failures);
    let recorded = store.load().unwrap().unwrap();
    assert!(recorded.resources.contains_key("network.fabric.attach.n1"));
    assert!(
        !dir.path().join("state/sparkform.json").exists(),
        "nothing in the local file"
    );
    let serial: u64 = pg
        .psql("SELECT serial FROM sparkform.states WHERE workspace = 'default'")
        .parse()
        .unwrap();
    assert_eq!(serial, recorded.serial);
    // The next plan, from PostgreSQL, has nothing to do.
    let next =
        sparkform::plan::plan(&config, &graph, &recorded, &PlanOptions::with_key(key)).unwrap();
    assert_eq!(
        next.summary.create + next.summary.update + next.summary.replace,
        0
    );
}

const TWO_NODES: &str = r#"
state {
  backend = "pg"
}
node "n1" {
  address        = "10.0.0.1"
  gpus           = 1
  memory_gib     = 128
  unified_memory = true
}
node "n2" {
  address        = "10.0.0.2"
  gpus           = 1
  memory_gib     = 128
  unified_memory = true
}
network "fabric" {
  subnet = "192.168.1.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.1.1"
  }
  attach "n2" {
    node      = node.n2
    interface = "eth1"
    address   = "192.168.1.2"
  }
}
"#;

/// Not a test of its own: the child process of the next test (it does nothing unless the
/// parent set the variables). It applies TWO_NODES on fake nodes with the state in PostgreSQL,
/// holding the lock, one step at a time; the chaos hook kills it after a journal write.
#[test]
fn pg_apply_child() {
    let (Ok(conn), Ok(dir)) = (
        std::env::var("SPARKFORM_TEST_PG_APPLY_CONN"),
        std::env::var("SPARKFORM_TEST_PG_APPLY_DIR"),
    ) else {
        return;
    };
    // The kill at the journal write SPARKFORM_CHAOS_KILL_AFTER names (the harness's observer).
    sparkform_testkit::chaos::install();
    let dir = std::path::PathBuf::from(dir);
    let (config, graph) = common::load(&dir);
    let store = pg_store_conn(&conn, &dir, "default");
    let key = HashKey::from_bytes([7; 32]);
    let plan =
        sparkform::plan::plan(&config, &graph, &State::new(), &PlanOptions::with_key(key)).unwrap();
    let world = FakeWorld::new();
    let pool = HostPool::from_hosts(
        ["node.n1", "node.n2"]
            .into_iter()
            .map(|n| {
                let h = Arc::new(FakeHost::new(n, &world).interface("eth1", 9000, &[]));
                (n.to_string(), h as Arc<dyn sparkform::hosts::Host>)
            })
            .collect(),
    );
    let _lock = store.lock("apply").unwrap();
    println!("APPLYING {}", std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(apply(ApplyRequest {
        config: &config,
        graph: &graph,
        plan: &plan,
        store: &store,
        state: State::default(),
        parallelism: 1,
        rollback: true,
        hosts: HostOptions::default(),
        pool: Some(pool),
        events: tokio::sync::mpsc::unbounded_channel().0,
        cancel: CancellationToken::new(),
    }));
    // Reached only when the hook did not fire.
    println!("APPLIED ok={}", outcome.ok);
}

fn pg_store_conn(conn: &str, local: &Path, workspace: &str) -> StateStore {
    StateStore::postgres(local.join("state/sparkform.json"), target(workspace), conn)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_an_apply_killed_after_a_journal_write_leaves_a_whole_state_and_no_lock() {
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), TWO_NODES).unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "pg_state::pg_apply_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SPARKFORM_TEST_PG_APPLY_CONN", &pg.conn)
        .env("SPARKFORM_TEST_PG_APPLY_DIR", dir.path())
        .env("SPARKFORM_CHAOS_KILL_AFTER", "create:attach.n1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        child.status.signal(),
        Some(9),
        "the hook did not kill the apply: {stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    let pid: u32 = stdout
        .split_once("APPLYING ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("the child's pid");
    let killed = Instant::now();
    let store = pg_store(&pg, dir.path(), "default");
    // The server ends the killed run's session, and so its lock, once it sees the connection
    // closed: a moment after the kill (pg_a_killed_holder_leaves_no_lock bounds it).
    let lock = loop {
        match store.lock("apply") {
            Ok(l) => break l,
            Err(StateError::Locked { .. }) if killed.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("the killed apply's lock stayed: {e:?}"),
        }
    };
    let took = killed.elapsed();
    eprintln!("pg lock free {took:?} after the apply was killed");
    assert_eq!(lock.took_over.as_ref().map(|i| i.pid), Some(pid));
    // The state is a whole document: the step the kill followed is recorded, the next is not.
    let state = store.load().unwrap().expect("the journal wrote the state");
    assert!(
        state.resources.contains_key("network.fabric.attach.n1"),
        "{:?}",
        state.resources.keys()
    );
    assert!(!state.resources.contains_key("network.fabric.attach.n2"));
    assert!(
        state.serial >= 2,
        "the lineage first, then the step: {}",
        state.serial
    );
    drop(lock);
    // A next run writes from what it read.
    let mut next = state.clone();
    store.write(&mut next).unwrap();
    assert_eq!(next.serial, state.serial + 1);
}

const CHAIN: &str = r#"
node "n1" {
  address    = "10.0.0.1"
  gpus       = 1
  memory_gib = 128
}
container "a" {
  node    = node.n1
  name    = "a"
  image   = "img:1"
  command = ["a"]
}
container "b" {
  node       = node.n1
  name       = "b"
  image      = "img:1"
  command    = ["b"]
  depends_on = [container.a]
  ready {
    exec     = ["check"]
    timeout  = "60s"
    interval = "1s"
  }
}
container "c" {
  node       = node.n1
  name       = "c"
  image      = "img:1"
  command    = ["c"]
  depends_on = [container.b]
}
"#;

/// `sparkform apply DIR -auto-approve` of `dir` on `fakes`, the state in `store`.
async fn apply_on(
    dir: &Path,
    store: StateStore,
    fakes: &sparkform_testkit::fake::FakeNodes,
) -> sparkform::apply::ApplyOutcome {
    let hosts = HostOptions {
        opener: fakes.opener(),
        ..HostOptions::default()
    };
    let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
    let prepared = lock_and_plan(
        PlanRequest {
            evaluated: sparkform::ops::definitions::load(
                &sparkform::workspace::Workspace::new(dir, None),
                &sparkform::config::VarInputs::default(),
            )
            .unwrap_or_else(|e| panic!("{e:?}")),
            lockfile_readonly: false,
            store,
            source: PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions::default(),
            },
            hosts: hosts.clone(),
        },
        &events,
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    prepared
        .apply(
            sparkform::ops::apply::RunOptions {
                parallelism: 4,
                rollback: true,
                hosts,
            },
            events,
            CancellationToken::new(),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
async fn pg_stopped_mid_apply_stops_the_apply_loses_nothing_and_the_next_apply_converges() {
    use sparkform_testkit::fake_docker::{FakeDocker, Fault};
    let pg = Pg::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), CHAIN).unwrap();
    let engine = Arc::new(FakeDocker::start().unwrap());
    // b is not ready until the test says so: PostgreSQL stops while it waits.
    engine.fault("b", Fault::ExecExits("check".into(), 1, "not yet".into()));
    let host = FakeHost::new("node.n1", &FakeWorld::new()).docker_engine(engine.clone());
    let fakes = sparkform_testkit::fake::FakeNodes::new(
        [(
            "node.n1".to_string(),
            Arc::new(host) as Arc<dyn sparkform::hosts::Host>,
        )]
        .into_iter()
        .collect(),
    );
    // The tables (what the lock creates first), so the watch below can read them.
    drop(pg_store(&pg, dir.path(), "default").lock("test").unwrap());
    let recorded = |pg: &Pg| {
        pg.psql("SELECT coalesce(max(serial), 0) || ' ' || coalesce(bool_or(document LIKE '%\"container.a\"%'), false) FROM sparkform.states WHERE workspace = 'default'")
    };
    let stop_when_a_is_recorded = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = recorded(&pg);
            if now.ends_with("true") {
                pg.stop();
                engine.heal();
                return now;
            }
            assert!(Instant::now() < deadline, "a was never recorded: {now}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (outcome, at_stop) = tokio::join!(
        apply_on(dir.path(), pg_store(&pg, dir.path(), "default"), &fakes),
        stop_when_a_is_recorded
    );
    assert!(!outcome.ok, "the apply stops");
    let error = outcome.state_error.clone().unwrap_or_default();
    assert!(error.contains("PostgreSQL"), "{error}");
    assert!(
        engine.container("c").is_none(),
        "nothing after the lost write ran: {:?}",
        outcome.not_run
    );
    assert!(
        outcome.failures.iter().any(|(a, _)| a == "container.b"),
        "{:?}",
        outcome.failures
    );

    // Nothing lost: the row is whole, as of the last write that went through.
    pg.start_again();
    assert_eq!(recorded(&pg), at_stop, "no write after the stop");
    let store = pg_store(&pg, dir.path(), "default");
    let state = store.load().unwrap().expect("a state");
    assert!(state.resources.contains_key("container.a"));
    assert!(!state.resources.contains_key("container.c"));

    // The next apply converges, and then there is nothing to do.
    let again = apply_on(dir.path(), store.clone(), &fakes).await;
    assert!(again.ok, "{:?} {:?}", again.failures, again.state_error);
    let state = store.load().unwrap().unwrap();
    for c in ["container.a", "container.b", "container.c"] {
        assert!(state.resources.contains_key(c), "{c} recorded");
    }
    for name in ["a", "b", "c"] {
        assert!(engine.container(name).is_some_and(|c| c.running), "{name}");
    }
    let last = apply_on(dir.path(), store.clone(), &fakes).await;
    assert!(
        last.ok && last.ran.create + last.ran.replace == 0,
        "{:?}",
        last.ran
    );
    assert!(matches!(store.lock_status(), Ok(LockStatus::Free)));
}

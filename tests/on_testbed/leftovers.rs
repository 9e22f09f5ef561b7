//! However `sparkform apply` ends (SIGKILL, SIGTERM, Ctrl-C twice) mid-apply, with the Docker
//! socket and a port forwarded, no ssh process and no control folder of that run is left.
//!
//! A run's leftovers are counted precisely, so tests running beside it do not disturb the
//! count: its control folder is the `/tmp/sf*` folder whose `owner` file names its pid, and its
//! ssh processes are those whose arguments name that folder (masters, their ProxyJump hops).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::{self, control_dirs_of, ssh_of};
use common::testbed::{sparkform, testbed, Testbed};

/// Every sparkform that connects first sweeps the control folders of dead runs: the test that
/// watches a dead run's folder stay until a sweep runs alone; the others may run together.
static SWEEPS: std::sync::RwLock<()> = std::sync::RwLock::new(());

const TINY: &str = "sparkform-testbed/tiny:latest";

/// A sleeper on each node whose ready check never passes: the apply waits on it with the
/// Docker socket and a port forward open.
fn config(tb: &Testbed, prefix: &str) -> String {
    let mut s = tb.hcl(
        &[("node1", "sf-node1"), ("node2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    );
    s.push_str(&format!(
        r#"
container "slow" {{
  for_each     = {{ node1 = node.node1, node2 = node.node2 }}
  node         = each.value
  name         = "{prefix}-slow-${{each.key}}"
  image        = "{TINY}"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
  ready {{
    http     = "http://127.0.0.1:9/"
    timeout  = "120s"
    interval = "1s"
  }}
}}
"#
    ));
    s
}

fn start_apply(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(["apply", dir.to_str().unwrap_or_default(), "-auto-approve"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sparkform")
}

/// The control folder of process `pid`, if it has one now.
fn control_dir_of(pid: u32) -> Option<PathBuf> {
    control_dirs_of(pid).into_iter().next()
}

/// Wait until the run is mid-apply: both node masters up, each node's Docker socket forwarded
/// and a port forwarded (the ready check's). Returns its control folder.
fn wait_mid_apply(child: &mut Child) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("sparkform apply ended before the test could interrupt it: {status}");
        }
        if let Some(dir) = control_dir_of(child.id()) {
            let subdirs: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map(|r| r.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            let masters = subdirs.iter().filter(|p| p.join("master").exists()).count();
            let forwards = subdirs
                .iter()
                .filter(|p| p.join("f0.sock").exists())
                .count();
            let dockers = subdirs
                .iter()
                .filter(|p| p.join("docker.sock").exists())
                .count();
            if masters == 2 && dockers == 2 && forwards >= 1 {
                return dir;
            }
        }
        assert!(
            Instant::now() < deadline,
            "sparkform apply did not reach its ready checks within 90 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_exit(child: &mut Child, within: Duration) {
    let deadline = Instant::now() + within;
    while child.try_wait().ok().flatten().is_none() {
        assert!(
            Instant::now() < deadline,
            "sparkform did not end within {within:?} of its signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait up to `within` for the run's ssh processes (and its folder, when `folder` is set) to
/// be gone; fail with what is left.
fn assert_nothing_left(dir: &Path, folder: bool, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let ssh = ssh_of(dir);
        let left = folder && dir.exists();
        if ssh.is_empty() && !left {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "after {within:?}: {} ssh processes of the run left{}:\n{}",
            ssh.len(),
            if left {
                format!(" and its folder {}", dir.display())
            } else {
                String::new()
            },
            ssh.iter()
                .map(|p| format!("  {} (parent {}) {}", p.pid, p.ppid, p.cmdline))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes the run's containers: `destroy` (a normal run, which must leave nothing of its own
/// either), then by name, as a killed apply may have created a container it had not recorded
/// yet (destroy does not look for those).
fn clean_up(tb: &Testbed, cfg: &Path, prefix: &str) {
    let d = cfg.to_str().unwrap_or_default();
    let (code, out, err) = sparkform(&["destroy", d, "-auto-approve"]);
    assert_eq!(
        code, 0,
        "destroy after the interrupted apply:\n{out}\n{err}"
    );
    for node in ["node1", "node2"] {
        tb.ssh(
            &format!("sf-{node}"),
            &format!("docker rm -f {prefix}-slow-{node} >/dev/null 2>&1; true"),
        );
    }
}

/// Interrupt an apply with `signals` (sent 300 ms apart) and check what it leaves.
fn interrupted(prefix: &str, signals: &[&str]) {
    let _sweeps = SWEEPS.read().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    let cfg = common::write_config(&[("main.hcl", &config(&tb, prefix))]);
    let mut child = start_apply(cfg.path());
    let dir = wait_mid_apply(&mut child);
    assert!(
        ssh_of(&dir).len() >= 3,
        "the count must see the run's masters"
    );
    for (i, sig) in signals.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        procs::signal(child.id(), sig);
    }
    wait_exit(&mut child, Duration::from_secs(60));
    let took = assert_nothing_left(&dir, true, Duration::from_secs(15));
    eprintln!("{prefix}: {signals:?}: nothing left {took:?} after sparkform ended");
    clean_up(&tb, cfg.path(), prefix);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn sigkill_mid_apply_leaves_no_ssh_and_no_folder() {
    interrupted("lk", &["KILL"]);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn sigterm_mid_apply_leaves_no_ssh_and_no_folder() {
    interrupted("lt", &["TERM"]);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn ctrl_c_twice_mid_apply_leaves_no_ssh_and_no_folder() {
    interrupted("li", &["INT", "INT"]);
}

/// With its janitor killed too, the masters still end by themselves (their lifeline is gone:
/// bounded ControlPersist, a node master's hop then the jump master), and the next sparkform
/// sweeps the folder of the dead run (the sweep's own rules: `hosts::lifetime`'s unit tests).
#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn without_its_janitor_masters_still_end_and_the_next_run_sweeps_the_folder() {
    let _alone = SWEEPS.write().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    let cfg = common::write_config(&[("main.hcl", &config(&tb, "lj"))]);
    let mut child = start_apply(cfg.path());
    let dir = wait_mid_apply(&mut child);
    let janitor = procs::all()
        .into_iter()
        .find(|p| p.ppid == child.id() && p.cmdline.contains("sparkform-janitor"))
        .expect("the run has a janitor process");
    procs::signal(janitor.pid, "KILL");
    procs::signal(child.id(), "KILL");
    wait_exit(&mut child, Duration::from_secs(10));
    // Two hops of ControlPersist (10 s each) and some slack for a loaded machine.
    let took = assert_nothing_left(&dir, false, Duration::from_secs(40));
    eprintln!("masters of the dead run ended by themselves {took:?} after it");
    // Any command that connects sweeps first: this test's `nodes`, or a sparkform that runs
    // beside it (`.ci/test` runs the second pair's tests and bench/chaos at the same time), which
    // sweeps every dead run's folder of the user alike.
    let swept_already = !dir.exists();
    let (code, out, err) = sparkform(&["nodes", cfg.path().to_str().unwrap_or_default()]);
    assert!(code == 0 || code == 1, "nodes:\n{out}\n{err}");
    assert!(
        !dir.exists(),
        "the next sparkform did not sweep {}",
        dir.display()
    );
    if swept_already {
        eprintln!("a sparkform running beside this test swept the folder before `nodes` did");
    }
    clean_up(&tb, cfg.path(), "lj");
}

/// The masters' ControlPersist is bounded, so they must not end while their owner lives but is
/// idle for longer: the lifeline counts as a client. A pool idle for twice the bound still runs
/// commands and reaches Docker through the forward it opened before, and closing it leaves no
/// master and no folder.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
// The guard only orders this file's tests, each on its own thread: no task of this test's
// runtime ever waits for it.
#[allow(clippy::await_holding_lock)]
async fn an_idle_owner_keeps_its_masters_and_closing_ends_them() {
    use sparkform::hosts::{lifetime, Cmd, HostOptions, HostPool};
    let _sweeps = SWEEPS.read().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    let cfg = common::write_config(&[(
        "main.hcl",
        &tb.hcl(
            &[("node1", "sf-node1"), ("node2", "sf-node2")],
            &tb.known_hosts(),
            2222,
        ),
    )]);
    let c = sparkform::config::load(cfg.path(), &Default::default())
        .unwrap_or_else(|d| panic!("{}", sparkform::diag::render_plain(&d.0)));
    let opts = HostOptions {
        use_user_config: false,
        ..HostOptions::default()
    };
    let nodes: Vec<String> = c.nodes.keys().cloned().collect();
    // This process is the test binary, which the tests of other files share: the pool's folder
    // is the one it adds.
    let before = control_dirs_of(std::process::id());
    let pool = HostPool::connect(&c, &nodes, &opts).await;
    assert!(pool.errors().is_empty(), "{:?}", pool.errors());
    let dir = control_dirs_of(std::process::id())
        .into_iter()
        .find(|d| !before.contains(d))
        .expect("the pool's control folder");
    let docker = pool
        .get("node.node1")
        .expect("node1")
        .docker()
        .await
        .expect("docker");
    tokio::time::sleep(Duration::from_secs(2 * lifetime::PERSIST_SECS + 2)).await;
    for node in ["node.node1", "node.node2"] {
        let out = pool
            .get(node)
            .expect("connected")
            .exec(&Cmd::new("true"))
            .await
            .unwrap_or_else(|e| panic!("{node} after idling: {e}"));
        assert!(out.success());
    }
    docker.ping().await.expect("docker through the old forward");
    pool.close().await;
    assert_nothing_left(&dir, true, Duration::from_secs(5));
}

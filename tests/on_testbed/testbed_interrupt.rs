//! Ctrl-C in a terminal signals the whole foreground process group, sparkform and every process
//! it started there. An apply interrupted that way says "Interrupted", blames no step, and its
//! rollback still reaches the nodes through the ssh masters (whose ProxyJump helpers must not
//! be in that group), with the counts it announced.

use crate::common;

use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::testbed::{sparkform, testbed};

const TINY: &str = "sparkform-testbed/tiny:latest";

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn ctrl_c_to_the_process_group_rolls_back_through_the_nodes() {
    let tb = testbed();
    let mut hcl = tb.hcl(
        &[("node1", "sf-node1"), ("node2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    );
    // `first` completes at once; `slow`, after it on the other node, waits for a ready check
    // that never passes, so Ctrl-C comes while it runs and `first` must be undone.
    hcl.push_str(&format!(
        r#"
container "first" {{
  node         = node.node1
  name         = "ci-first"
  image        = "{TINY}"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
}}
container "slow" {{
  node         = node.node2
  name         = "ci-slow"
  image        = "{TINY}"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
  depends_on   = [container.first]
  ready {{
    http     = "http://127.0.0.1:9/"
    timeout  = "120s"
    interval = "1s"
  }}
}}
"#
    ));
    let cfg = common::write_config(&[("main.hcl", &hcl)]);
    let d = cfg.path().to_str().unwrap_or_default();
    let state = cfg.path().join("state/sparkform.json");
    // Its own process group, as a shell gives a foreground job: the signal goes to the group.
    let child = Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(["apply", d, "-auto-approve"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start sparkform");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !std::fs::read_to_string(&state).is_ok_and(|s| s.contains("\"container.first\"")) {
        assert!(Instant::now() < deadline, "container.first never completed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // `slow` is now being created and waited on.
    std::thread::sleep(Duration::from_secs(2));
    let pgid = child.id().to_string();
    let sent = Command::new("kill")
        .args(["-s", "INT", "--", &format!("-{pgid}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill -INT -{pgid}");
    let out = child.wait_with_output().expect("sparkform ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let left = tb.ssh(
        "sf-node1",
        "docker ps -a --format '{{.Names}}' | grep '^ci-first' || true",
    );
    let _ = sparkform(&["destroy", d, "-auto-approve"]);
    for node in ["sf-node1", "sf-node2"] {
        tb.ssh(node, "docker rm -f ci-first ci-slow >/dev/null 2>&1; true");
    }
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Interrupted: the apply stopped on Ctrl-C while container.slow ran."),
        "{stderr}"
    );
    assert!(!stderr.contains("Error:"), "no step is blamed: {stderr}");
    assert!(
        stdout.contains("rolling back 1 completed step")
            && stdout.contains("interrupted; 1 step rolled back"),
        "{stdout}"
    );
    assert!(
        stderr.contains("Rolled back 1 step: the machines and the state are as they were"),
        "{stderr}"
    );
    assert_eq!(left.trim(), "", "the rollback removed ci-first");
}

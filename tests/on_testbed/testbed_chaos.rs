//! A crash loop on a real Docker Engine: a container under `restart = "always"` that exits at
//! once is restarted by Docker (Running stays true, RestartCount rises); the apply fails its
//! step at once, naming the crash loop and showing the container's log, instead of waiting for
//! the 300 s ready timeout. bench/chaos runs this and more on the testbed.

use crate::common;

use std::time::{Duration, Instant};

use common::testbed::{sparkform, testbed};

const TINY: &str = "sparkform-testbed/tiny:latest";

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_crash_looping_container_fails_its_apply_at_once_with_its_log() {
    let tb = testbed();
    let mut hcl = tb.hcl(&[("node1", "sf-node1")], &tb.known_hosts(), 2222);
    hcl.push_str(&format!(
        r#"
container "looping" {{
  node         = node.node1
  name         = "ci-crashloop"
  image        = "{TINY}"
  command      = ["sh", "-c", "echo ci-crashloop: cannot open the model; exit 3"]
  restart      = "always"
  stop_timeout = "1s"
  ready {{
    exec     = ["true"]
    timeout  = "300s"
    interval = "1s"
  }}
}}
"#
    ));
    let cfg = common::write_config(&[("main.hcl", &hcl)]);
    let d = cfg.path().to_str().unwrap_or_default();
    tb.ssh(
        "sf-node1",
        "docker rm -f ci-crashloop >/dev/null 2>&1; true",
    );
    let started = Instant::now();
    let (code, stdout, stderr) = sparkform(&["apply", d, "-auto-approve"]);
    let took = started.elapsed();
    let left = tb.ssh(
        "sf-node1",
        "docker ps -a --format '{{.Names}}' | grep '^ci-crashloop' || true",
    );
    tb.ssh(
        "sf-node1",
        "docker rm -f ci-crashloop >/dev/null 2>&1; true",
    );
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("container ci-crashloop is crash-looping: Docker restarted it"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ci-crashloop: cannot open the model"),
        "the log lines: {stderr}"
    );
    assert!(took < Duration::from_secs(90), "took {took:?}");
    assert_eq!(left.trim(), "", "the rollback removed it");
}

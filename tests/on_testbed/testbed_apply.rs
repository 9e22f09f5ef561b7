//! apply, destroy and rollback end to end on the testbed, through the command line.
//! Each test uses its own container names, fabric addresses and ports, so they run in parallel.

use crate::common;

use std::time::{Duration, Instant};

use common::testbed::{cluster_hcl, sparkform, testbed, Testbed};

const TINY: &str = "sparkform-testbed/tiny:latest";

/// An HTTP server on each node's fabric address, a sleeper on node1, and a probe from node1 to
/// node2's server that expects `var.expect` in the answer.
fn config(tb: &Testbed, prefix: &str, a1: u8, a2: u8, port: u16) -> String {
    let mut s = cluster_hcl(tb, a1, a2);
    s.push_str(&format!(
        r#"
variable "greeting" {{
  default = "hello"
}}
variable "greeting2" {{
  default = "hello"
}}
variable "expect" {{
  default = "hello"
}}

locals {{
  greetings = {{ node1 = var.greeting, node2 = var.greeting2 }}
}}

container "web" {{
  for_each     = {{ node1 = node.node1, node2 = node.node2 }}
  node         = each.value
  name         = "{prefix}-web-${{each.key}}"
  image        = "{TINY}"
  network_mode = "host"
  stop_timeout = "1s"
  env = {{
    GREETING = "${{local.greetings[each.key]}} from ${{each.key}}"
    IP       = network.fabric.attach[each.key].address
  }}
  command = ["sh", "-c", "mkdir -p /www && echo \"$GREETING\" > /www/index.html && exec httpd -f -p $IP:{port} -h /www"]
  ready {{
    http     = "http://${{network.fabric.attach[each.key].address}}:{port}/"
    timeout  = "30s"
    interval = "1s"
  }}
}}

container "side" {{
  node         = node.node1
  name         = "{prefix}-side"
  image        = "{TINY}"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
}}

probe "hello" {{
  http {{
    via = node.node1
    url = "http://${{network.fabric.attach.node2.address}}:{port}/"
  }}
  expect {{
    contains = var.expect
  }}
  timeout    = "20s"
  interval   = "1s"
  depends_on = [container.web]
}}
"#
    ));
    s
}

fn lineage(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string(dir.join("state/sparkform.json")).expect("state");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["lineage"].as_str().unwrap().to_string()
}

fn id_of(tb: &Testbed, node: &str, name: &str) -> Option<String> {
    tb.containers(node, "sparkform.lineage")
        .into_iter()
        .find(|c| c.0 == name)
        .map(|c| c.1)
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn apply_replan_change_one_env_destroy() {
    let tb = testbed();
    let dir = common::write_config(&[("main.hcl", &config(&tb, "ta", 41, 42, 8141))]);
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = sparkform(&["apply", d, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Apply complete: 5 added"), "{out}");
    assert!(
        out.contains("passed in") && out.contains("hello from node2"),
        "{out}"
    );
    // Planning again finds nothing to do (with refresh).
    let (code, out, err) = sparkform(&["plan", d, "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let web1 = id_of(&tb, "sf-node1", "ta-web-node1").expect("web on node1");
    let web2 = id_of(&tb, "sf-node2", "ta-web-node2").expect("web on node2");
    let side = id_of(&tb, "sf-node1", "ta-side").expect("side");
    assert!(tb
        .fabric_addresses("sf-node1")
        .contains("192.168.201.41/24"));
    // One container's env changes: only it is replaced.
    let (code, out, _) = sparkform(&["plan", d, "-var", "greeting2=servus", "-detailed-exitcode"]);
    assert_eq!(code, 2);
    assert!(
        out.contains("Plan: 0 to add, 0 to change, 1 to replace, 0 to destroy; 1 probe to run."),
        "{out}"
    );
    assert!(
        out.contains(
            "container.web[\"node2\"] (container on node.node2) must be replaced (`env` changes)"
        ),
        "{out}"
    );
    let (code, out, err) = sparkform(&[
        "apply",
        d,
        "-auto-approve",
        "-var",
        "greeting2=servus",
        "-var",
        "expect=servus",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        id_of(&tb, "sf-node1", "ta-web-node1").as_deref(),
        Some(web1.as_str()),
        "web on node1 restarted"
    );
    assert_eq!(
        id_of(&tb, "sf-node1", "ta-side").as_deref(),
        Some(side.as_str()),
        "side restarted"
    );
    let new2 = id_of(&tb, "sf-node2", "ta-web-node2").expect("new web on node2");
    assert_ne!(new2, web2);
    // The replaced container is gone, not left aside.
    assert_eq!(
        tb.containers(
            "sf-node2",
            &format!("sparkform.lineage={}", lineage(dir.path()))
        )
        .len(),
        1
    );
    // Destroy leaves no labelled container and no address.
    let l = lineage(dir.path());
    let (code, out, err) = sparkform(&["destroy", d, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    for node in ["sf-node1", "sf-node2"] {
        assert!(
            tb.containers(node, &format!("sparkform.lineage={l}"))
                .is_empty(),
            "containers left on {node}"
        );
    }
    assert!(!tb.fabric_addresses("sf-node1").contains("192.168.201.41"));
    assert!(!tb.fabric_addresses("sf-node2").contains("192.168.201.42"));
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_failing_probe_after_a_replacement_rolls_back_and_the_old_container_answers() {
    let tb = testbed();
    let dir = common::write_config(&[("main.hcl", &config(&tb, "tb", 43, 44, 8143))]);
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = sparkform(&["apply", d, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let before = std::fs::read_to_string(dir.path().join("state/sparkform.json")).unwrap();
    let old2 = id_of(&tb, "sf-node2", "tb-web-node2").unwrap();
    // The new node2 server says "bye", the probe still expects "hello": it fails after the replacement.
    let (code, out, err) = sparkform(&["apply", d, "-auto-approve", "-var", "greeting2=bye"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        // Under load an attempt can also time out; either way the probe is what failed.
        err.contains("probe.hello")
            && (err.contains("does not contain \"hello\"") || err.contains("no answer")),
        "{err}"
    );
    assert!(err.contains("Rolled back"), "{err}");
    assert!(
        out.contains(
            "↶ container.web[\"node2\"]: removed the new tb-web-node2, the previous one runs again"
        ),
        "{out}"
    );
    assert_eq!(
        id_of(&tb, "sf-node2", "tb-web-node2").as_deref(),
        Some(old2.as_str())
    );
    let answer = tb.ssh("sf-node1", "curl -s http://192.168.201.44:8143/");
    assert_eq!(answer.trim(), "hello from node2");
    // The state is what it was (serial aside), so the next plan has nothing to do.
    let after: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("state/sparkform.json")).unwrap(),
    )
    .unwrap();
    let before: serde_json::Value = serde_json::from_str(&before).unwrap();
    assert_eq!(after["resources"], before["resources"]);
    let (code, out, err) = sparkform(&["plan", d, "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = sparkform(&["verify", d]);
    assert_eq!(code, 0, "{out}\n{err}");
    // verify fails when the probe would.
    let (code, out, _) = sparkform(&["verify", d, "-var", "expect=nope"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("0 probes passed, 1 failed"), "{out}");
    let (code, _, _) = sparkform(&["destroy", d, "-auto-approve"]);
    assert_eq!(code, 0);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_container_that_never_gets_ready_fails_with_its_logs_and_nothing_stays() {
    let tb = testbed();
    let mut text = cluster_hcl(&tb, 45, 46);
    text.push_str(&format!(
        r#"
container "stuck" {{
  node         = node.node1
  name         = "tc-stuck"
  image        = "{TINY}"
  stop_timeout = "1s"
  command      = ["sh", "-c", "echo tc-marker-starting; echo loading weights; sleep 3600"]
  ready {{
    exec     = ["test", "-f", "/ready"]
    timeout  = "4s"
    interval = "1s"
  }}
  depends_on = [network.fabric]
}}
"#
    ));
    let dir = common::write_config(&[("main.hcl", &text)]);
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = sparkform(&["apply", d, "-auto-approve"]);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("tc-stuck was not ready after 4 s"), "{err}");
    assert!(
        err.contains("tc-marker-starting") && err.contains("loading weights"),
        "logs missing:\n{err}"
    );
    assert!(err.contains("Rolled back"), "{err}");
    // The nodes are as before: no container, no address.
    assert!(tb
        .containers("sf-node1", "sparkform.address=container.stuck")
        .is_empty());
    assert!(!tb.fabric_addresses("sf-node1").contains("192.168.201.45"));
    assert!(!tb.fabric_addresses("sf-node2").contains("192.168.201.46"));
    // With --no-rollback the attachments stay, for debugging; destroy cleans up.
    let (code, _, _) = sparkform(&["apply", d, "-auto-approve", "--no-rollback"]);
    assert_eq!(code, 1);
    assert!(tb.fabric_addresses("sf-node1").contains("192.168.201.45"));
    let (code, out, err) = sparkform(&["destroy", d, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!tb.fabric_addresses("sf-node1").contains("192.168.201.45"));
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_second_apply_fails_at_once_and_names_the_holder() {
    let tb = testbed();
    let mut text = cluster_hcl(&tb, 47, 48);
    text.push_str(&format!(
        r#"
container "slow" {{
  node         = node.node1
  name         = "td-slow"
  image        = "{TINY}"
  stop_timeout = "1s"
  command      = ["sh", "-c", "sleep 4; touch /ready; sleep 3600"]
  ready {{
    exec     = ["test", "-f", "/ready"]
    timeout  = "30s"
    interval = "1s"
  }}
}}
"#
    ));
    let dir = common::write_config(&[("main.hcl", &text)]);
    let d = dir.path().to_str().unwrap().to_string();
    let first = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(["apply", &d, "-auto-approve"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let start = Instant::now();
    let (code, _, err) = sparkform(&["apply", &d, "-auto-approve"]);
    assert_eq!(code, 1);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "the second apply waited"
    );
    assert!(
        err.contains(&format!("PID {}", first.id())) || err.contains(&first.id().to_string()),
        "{err}"
    );
    assert!(err.contains("apply"), "{err}");
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success());
    let (code, _, _) = sparkform(&["destroy", &d, "-auto-approve"]);
    assert_eq!(code, 0);
}

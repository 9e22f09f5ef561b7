//! More of apply on the testbed: bad interface, image archives, every probe form, plan files,
//! -target, -replace and Ctrl-C.

use crate::common;

use std::time::{Duration, Instant};

use common::testbed::{cluster_hcl, sparkform, testbed};

const TINY: &str = "sparkform-testbed/tiny:latest";

fn api_server(port: u16) -> String {
    format!(
        r#"
container "api" {{
  node         = node.node1
  name         = "tg-api"
  image        = "{TINY}"
  network_mode = "host"
  stop_timeout = "1s"
  command = ["sh", "-c", "mkdir -p /www/v1 && printf '{{\"choices\":[{{\"message\":{{\"content\":\"Hi, I am Qwen.\"}}}}]}}' > /www/v1/chat && exec httpd -f -p ${{network.fabric.attach.node1.address}}:{port} -h /www"]
  ready {{
    tcp      = "${{network.fabric.attach.node1.address}}:{port}"
    timeout  = "20s"
    interval = "1s"
  }}
}}

probe "chat" {{
  http {{
    via     = node.node2
    url     = "http://${{network.fabric.attach.node1.address}}:{port}/v1/chat"
    headers = {{ X-Test = "1" }}
  }}
  expect {{
    status    = 200
    json_path = "choices[0].message.content"
    matches   = "(?i)qwen"
  }}
  timeout    = "10s"
  depends_on = [container.api]
}}

probe "port" {{
  tcp {{
    via     = node.node2
    address = "${{network.fabric.attach.node1.address}}:{port}"
  }}
  depends_on = [container.api]
}}

probe "on_node" {{
  exec {{
    node    = node.node2
    command = ["ip", "-br", "addr", "show", "dev", "enp1s0f0np0"]
  }}
  expect {{
    stdout_contains = network.fabric.attach.node2.address
  }}
  depends_on = [container.api]
}}

probe "in_container" {{
  exec {{
    container = container.api
    command   = ["cat", "/www/v1/chat"]
  }}
  expect {{
    stdout_contains = "Qwen"
  }}
}}
"#
    )
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn probes_plan_files_target_replace() {
    let tb = testbed();
    let mut text = cluster_hcl(&tb, 61, 62);
    text.push_str(&api_server(8161));
    let dir = common::write_config(&[("main.hcl", &text)]);
    let d = dir.path().to_str().unwrap();
    // A saved plan applies as saved.
    let plan_file = dir.path().join("p.plan");
    let (code, _, err) = sparkform(&["plan", d, "-out", plan_file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sparkform(&["apply", plan_file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    for p in [
        "probe.chat",
        "probe.port",
        "probe.on_node",
        "probe.in_container",
    ] {
        assert!(
            out.contains(&format!("✓ {p}: run done")),
            "{p} did not pass:\n{out}"
        );
    }
    assert!(out.contains("200: Hi, I am Qwen."), "{out}");
    // ... and refuses to run again: the state moved on.
    let (code, _, err) = sparkform(&["apply", plan_file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("stale"), "{err}");
    // -replace one container: only it (and the probes after it) run.
    let id = tb.containers("sf-node1", "sparkform.address=container.api")[0]
        .1
        .clone();
    let (code, out, err) = sparkform(&["apply", d, "-auto-approve", "-replace", "container.api"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("requested with -replace"), "{out}");
    let new_id = tb.containers("sf-node1", "sparkform.address=container.api")[0]
        .1
        .clone();
    assert_ne!(id, new_id);
    // -target a probe: only it runs (its dependencies are unchanged).
    let (code, out, _) = sparkform(&[
        "apply",
        d,
        "-auto-approve",
        "-target",
        "probe.port",
        "-replace",
        "container.api",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1 to replace") && out.contains("probe.port") && !out.contains("probe.chat"),
        "{out}"
    );
    let (code, _, _) = sparkform(&["destroy", d, "-auto-approve"]);
    assert_eq!(code, 0);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn missing_interface_and_missing_image_are_clear_errors() {
    let tb = testbed();
    // An interface the node does not have: the error lists the ones it has.
    let text =
        cluster_hcl(&tb, 63, 64).replacen("interface = \"enp1s0f0np0\"", "interface = \"eth9\"", 1);
    let dir = common::write_config(&[("main.hcl", &text)]);
    let (code, _, err) = sparkform(&["apply", dir.path().to_str().unwrap(), "-auto-approve"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("interface eth9 does not exist") && err.contains("enp1s0f0np0"),
        "{err}"
    );
    assert!(
        !tb.fabric_addresses("sf-node2").contains("192.168.201.64"),
        "node2's attachment was not rolled back"
    );
    // An image that is not on the node, then the same loaded from an archive.
    let archive = tempfile::tempdir().unwrap();
    let tar = archive.path().join("img.tar");
    assert!(std::process::Command::new("docker")
        .args(["tag", TINY, "sf-archive-test:1"])
        .status()
        .unwrap()
        .success());
    assert!(std::process::Command::new("docker")
        .args(["save", "-o", tar.to_str().unwrap(), "sf-archive-test:1"])
        .status()
        .unwrap()
        .success());
    // The archive holds it now: the host keeps no tag of the test's.
    let _ = std::process::Command::new("docker")
        .args(["rmi", "sf-archive-test:1"])
        .stdout(std::process::Stdio::null())
        .status();
    tb.ssh(
        "sf-node1",
        "docker rmi -f sf-archive-test:1 >/dev/null 2>&1; true",
    );
    let container = |archive: Option<&std::path::Path>| {
        format!(
            "container \"arch\" {{\n  node = node.node1\n  name = \"tg-arch\"\n  image = \"sf-archive-test:1\"\n  command = [\"sleep\", \"3600\"]\n  stop_timeout = \"1s\"\n{}}}\n",
            archive.map(|p| format!("  image_archive = \"{}\"\n", p.display())).unwrap_or_default()
        )
    };
    let text = format!("{}{}", cluster_hcl(&tb, 65, 66), container(None));
    let dir = common::write_config(&[("main.hcl", &text)]);
    let (code, _, err) = sparkform(&["apply", dir.path().to_str().unwrap(), "-auto-approve"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("image sf-archive-test:1 is not on node.node1")
            && err.contains("image_archive"),
        "{err}"
    );
    let text = format!("{}{}", cluster_hcl(&tb, 65, 66), container(Some(&tar)));
    std::fs::write(dir.path().join("main.hcl"), text).unwrap();
    let (code, out, err) = sparkform(&["apply", dir.path().to_str().unwrap(), "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        tb.ssh("sf-node1", "docker image ls -q sf-archive-test:1")
            .trim()
            .len()
            >= 12
    );
    let (code, _, _) = sparkform(&["destroy", dir.path().to_str().unwrap(), "-auto-approve"]);
    assert_eq!(code, 0);
    tb.ssh(
        "sf-node1",
        "docker rmi -f sf-archive-test:1 >/dev/null 2>&1; true",
    );
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn ctrl_c_stops_and_rolls_back() {
    let tb = testbed();
    let mut text = cluster_hcl(&tb, 67, 68);
    text.push_str(&format!(
        "container \"wait\" {{\n  node = node.node1\n  name = \"tg-wait\"\n  image = \"{TINY}\"\n  stop_timeout = \"1s\"\n  command = [\"sleep\", \"3600\"]\n  ready {{\n    exec = [\"test\", \"-f\", \"/never\"]\n    timeout = \"60s\"\n    interval = \"1s\"\n  }}\n}}\n"
    ));
    let dir = common::write_config(&[("main.hcl", &text)]);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(["apply", dir.path().to_str().unwrap(), "-auto-approve"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while tb
        .containers("sf-node1", "sparkform.address=container.wait")
        .is_empty()
    {
        assert!(start.elapsed() < Duration::from_secs(90));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 130: ended by Ctrl-C (128 + SIGINT), as shells report it.
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Interrupted") && stderr.contains("Rolled back"),
        "{stderr}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(40),
        "Ctrl-C did not stop the wait"
    );
    assert!(tb
        .containers("sf-node1", "sparkform.address=container.wait")
        .is_empty());
    assert!(!tb.fabric_addresses("sf-node1").contains("192.168.201.67"));
}

/// The kernel deletes a subnet's secondary addresses with its primary (without systemd's
/// `promote_secondaries`): removing sparkform's address must leave an address someone else added.
#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn destroy_removes_only_its_own_address_even_the_primary_of_a_subnet() {
    let tb = testbed();
    // A /28 of the fabric's own subnet of its own, so sparkform's address is its primary.
    let text = cluster_hcl(&tb, 209, 210).replace("192.168.201.0/24", "192.168.201.208/28");
    let dir = common::write_config(&[("main.hcl", &text)]);
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = sparkform(&["apply", d, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    // Added after sparkform's, so it is the secondary of 192.168.201.208/28.
    tb.ssh("sf-node1", "ip addr add 192.168.201.222/28 dev enp1s0f0np0");
    let (code, out, err) = sparkform(&["destroy", d, "-auto-approve"]);
    let after = tb.fabric_addresses("sf-node1");
    tb.ssh("sf-node1", "ip addr del 192.168.201.222/28 dev enp1s0f0np0");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!after.contains("192.168.201.209/"), "{after}");
    assert!(after.contains("192.168.201.222/28"), "{after}");
}

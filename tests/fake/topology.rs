//! Topology mistakes in a deployment through the launchers (`modules/vllm-ray`,
//! `modules/vllm-mp`): each gives one error that names the node and the fix, not a message
//! about GPU counts, duplicate keys or a missing key inside a module; a fabric on the
//! management network gives a warning; attachments on the broadcast address and bad ports are
//! refused.

use std::path::Path;

use sparkform::config::{self, VarInputs};
use sparkform::diag::render_plain;

const NODES: &str = r#"
node "n1" {
  address = "10.0.0.1"
  gpus    = 1
}
node "n2" {
  address = "10.0.0.2"
  gpus    = 1
}
node "n3" {
  address = "10.0.0.3"
  gpus    = 1
}
"#;

/// A network attaching `attached` nodes (by name) on `subnet`.
fn network(subnet: &str, attached: &[&str]) -> String {
    let base = subnet.split('/').next().unwrap_or_default();
    let prefix = base.rsplit_once('.').map(|(p, _)| p).unwrap_or_default();
    let mut s = format!("network \"roce\" {{\n  subnet = \"{subnet}\"\n  mtu = 9000\n");
    for (i, n) in attached.iter().enumerate() {
        s += &format!(
            "  attach \"{n}\" {{\n    node = node.{n}\n    interface = \"eth1\"\n    address = \"{prefix}.{}\"\n  }}\n",
            i + 11
        );
    }
    s + "}\n"
}

fn launcher(kind: &str, head: &str, workers: &[&str], extra: &str) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("modules")
        .join(kind);
    // What the user meant: one GPU per distinct node.
    let mut distinct: Vec<&str> = vec![head];
    distinct.extend(workers.iter().filter(|w| **w != head));
    distinct.sort_unstable();
    distinct.dedup();
    let gpus = distinct.len();
    let workers: Vec<String> = workers.iter().map(|w| format!("node.{w}")).collect();
    format!(
        "module \"m\" {{\n  source = {:?}\n  image = \"img\"\n  network = network.roce\n  head = node.{head}\n  workers = [{}]\n  model = \"m\"\n  tensor_parallel_size = {gpus}\n  gpu_memory_utilization = 0.8\n{extra}}}\n",
        src.display().to_string(),
        workers.join(", ")
    )
}

/// The rendered diagnostics of a load, and whether it failed.
fn load(text: &str) -> (bool, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("main.hcl"), text).expect("write");
    match config::load(tmp.path(), &VarInputs::default()) {
        Ok(c) => (false, render_plain(&c.warnings)),
        Err(d) => (true, render_plain(&d.0)),
    }
}

fn assert_one_error(text: &str, expect: &[&str]) {
    let (failed, out) = load(text);
    assert!(failed, "accepted:\n{out}");
    assert_eq!(
        out.matches("\n  × ").count() + usize::from(out.starts_with("  × ")),
        1,
        "not one error:\n{out}"
    );
    for e in expect {
        assert!(out.contains(e), "no {e:?} in\n{out}");
    }
    for noise in ["no such key", "GPUs", "already exists", "duplicate"] {
        assert!(!out.contains(noise), "{noise:?} in\n{out}");
    }
}

#[test]
fn the_head_listed_as_a_worker_is_named() {
    for kind in ["vllm-ray", "vllm-mp"] {
        let text = format!(
            "{NODES}{}{}",
            network("192.168.200.0/24", &["n1", "n2"]),
            launcher(kind, "n1", &["n2", "n1"], "")
        );
        assert_one_error(
            &text,
            &[
                "the head node n1 is also listed in workers",
                "remove n1 from workers",
            ],
        );
    }
}

#[test]
fn a_worker_listed_twice_is_named() {
    for kind in ["vllm-ray", "vllm-mp"] {
        let text = format!(
            "{NODES}{}{}",
            network("192.168.200.0/24", &["n1", "n2"]),
            launcher(kind, "n1", &["n2", "n2"], "")
        );
        assert_one_error(
            &text,
            &["a worker is listed twice in workers (n2)", "list it once"],
        );
    }
}

#[test]
fn a_worker_without_an_attachment_is_named() {
    for kind in ["vllm-ray", "vllm-mp"] {
        let text = format!(
            "{NODES}{}{}",
            network("192.168.200.0/24", &["n1", "n2"]),
            launcher(kind, "n1", &["n2", "n3"], "")
        );
        assert_one_error(
            &text,
            &[
                "every node needs an attachment to network roce",
                "n3",
                "Add an `attach",
            ],
        );
    }
}

#[test]
fn a_good_deployment_loads_without_warnings() {
    for kind in ["vllm-ray", "vllm-mp"] {
        let text = format!(
            "{NODES}{}{}",
            network("192.168.200.0/24", &["n1", "n2", "n3"]),
            launcher(kind, "n1", &["n2", "n3"], "")
        );
        let (failed, out) = load(&text);
        assert!(!failed, "{kind}: refused:\n{out}");
        assert!(!out.contains("management"), "{kind}: {out}");
    }
}

#[test]
fn a_fabric_on_the_management_network_is_a_warning() {
    let text = format!("{NODES}{}", network("10.0.0.0/24", &["n1", "n2"]));
    let (failed, out) = load(&text);
    assert!(!failed, "refused:\n{out}");
    assert!(
        out.contains("its subnet 10.0.0.0/24 contains node.n1's SSH address 10.0.0.1"),
        "{out}"
    );
    assert!(out.contains("that is the management network"), "{out}");
}

#[test]
fn an_attachment_on_the_broadcast_address_is_refused() {
    let text = format!("{NODES}{}", network("192.168.200.0/24", &["n1"]))
        .replace("192.168.200.11", "192.168.200.255");
    let (failed, out) = load(&text);
    assert!(failed, "{out}");
    assert!(
        out.contains("192.168.200.255 is the broadcast address of 192.168.200.0/24"),
        "{out}"
    );
    assert!(
        out.contains("the last usable address is 192.168.200.254"),
        "{out}"
    );
}

#[test]
fn a_module_port_out_of_range_is_refused() {
    for port in ["0", "65536", "70000"] {
        for kind in ["vllm-ray", "vllm-mp"] {
            let text = format!(
                "{NODES}{}{}",
                network("192.168.200.0/24", &["n1", "n2"]),
                launcher(kind, "n1", &["n2"], &format!("  port = {port}\n"))
            );
            let (failed, out) = load(&text);
            assert!(failed, "{kind} port {port}: accepted\n{out}");
            assert!(
                out.contains("port must be a whole number from 1 to 65535"),
                "{kind} port {port}:\n{out}"
            );
        }
    }
}

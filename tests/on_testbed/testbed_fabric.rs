//! The fabric on the testbed, with fake RDMA devices in the nodes' sysfs (`testbed rdma`): the
//! RoCE v2 GID index and the RDMA ports each node has reach NCCL's environment through the
//! modules' fabric-env in the containers of that node; a GID index moved on node2 between two
//! applies is found by the plan, which replaces what uses it on node2 and leaves node1's
//! container running; an end of
//! the fabric fallen back to MTU 1500 is named by the plan with the other end, and the apply
//! sets 9000 again.

use crate::common;

use std::path::Path;

use common::testbed::{sparkform, testbed, Testbed};

/// The tests change node-wide settings of node2 for a while (its fabric's MTU, logind's
/// RemoveIPC), which the other's plan reads: one at a time, whatever the test threads.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

const RANK1: (&str, &str) = ("sf-node1", "sparkform-fabric-node1");
const RANK2: (&str, &str) = ("sf-node2", "sparkform-fabric-node2");

/// `testbed rdma NODE ARGS…`.
fn rdma(node: &str, args: &[&str]) {
    let mut a = vec!["rdma", node];
    a.extend(args);
    common::testbed::script(&a);
}

/// Takes the fake RDMA devices off both nodes however the test ends.
struct FakeRdma;

impl Drop for FakeRdma {
    fn drop(&mut self) {
        for node in ["sf-node1", "sf-node2"] {
            rdma(node, &["off"]);
        }
    }
}

/// Both nodes on the fabric, the modules' fabric-env with RDMA on, and a container on each node
/// with what fabric-env gives it (its node's environment, the RDMA devices and IPC_LOCK). Not
/// the memlock limit: this machine's Docker Engine lacks `SYS_RESOURCE`, so no container here
/// can raise it (the example's Ray containers with `rdma = true` cannot start on the testbed).
fn definitions(tb: &Testbed, dir: &Path) {
    let fabric_env = Path::new(env!("CARGO_MANIFEST_DIR")).join("modules/fabric-env");
    let mut s = common::testbed::cluster_hcl(tb, 41, 42);
    s.push_str(&format!(
        r#"
module "fabric" {{
  source      = "{}"
  network     = network.fabric
  nodes       = [node.node1, node.node2]
  gpu_devices = false
}}

container "rank" {{
  for_each     = {{ node1 = node.node1, node2 = node.node2 }}
  node         = each.value
  name         = "sparkform-fabric-${{each.key}}"
  image        = "sparkform-testbed/tiny:latest"
  command      = ["sleep", "3600"]
  network_mode = module.fabric.network_mode
  env          = module.fabric.node_env[each.key]
  devices      = module.fabric.devices
  cap_add      = module.fabric.cap_add
}}
"#,
        fabric_env.display()
    ));
    std::fs::write(dir.join("main.hcl"), s).unwrap();
}

/// A container's environment, `NAME=VALUE` each.
fn env(tb: &Testbed, (node, name): (&str, &str)) -> Vec<String> {
    let out = tb.ssh(
        node,
        &format!("docker inspect -f '{{{{json .Config.Env}}}}' {name}"),
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{name}: {e}: {out}"))
}

fn assert_nccl(tb: &Testbed, c: (&str, &str), gid: &str) {
    let e = env(tb, c);
    assert!(
        e.iter().any(|v| v == &format!("NCCL_IB_GID_INDEX={gid}")),
        "{}: {e:?}",
        c.1
    );
    assert!(
        e.iter().any(|v| v == "NCCL_IB_HCA==rocep1s0f0:1"),
        "{}: {e:?}",
        c.1
    );
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_moved_gid_index_replaces_what_uses_it_and_one_end_at_mtu_1500_is_named_with_the_other() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    tb.clear_leftovers();
    let _off = FakeRdma;
    let on = |node: &str, address: &str, gid: &str| {
        rdma(node, &["on", "--address", address, "--gid-index", gid]);
    };
    on("sf-node1", "192.168.201.41", "3");
    on("sf-node2", "192.168.201.42", "3");
    let tmp = tempfile::tempdir().unwrap();
    definitions(&tb, tmp.path());
    let dir = tmp.path().to_str().unwrap().to_string();
    let st = tmp.path().join("state.json").to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend([dir.as_str(), "-state", st.as_str()]);
        sparkform(&a)
    };

    let (code, out, err) = run(&["apply", "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_nccl(&tb, RANK1, "3");
    assert_nccl(&tb, RANK2, "3");
    let rank1 = tb
        .running_id(RANK1.0, RANK1.1)
        .expect("node1's container runs");

    // node2 rebooted: its fabric address's GID is at 5 now.
    on("sf-node2", "192.168.201.42", "5");
    let (code, out, err) = run(&["plan", "-detailed-exitcode"]);
    assert_eq!(code, 2, "{out}\n{err}");
    for (what, wanted) in [
        (
            "network.fabric.attach.node2 (attachment on node.node2) will be updated in place",
            true,
        ),
        (
            "container.rank[\"node2\"] (container on node.node2) must be replaced",
            true,
        ),
        ("network.fabric.attach.node1 (attachment", false),
        ("container.rank[\"node1\"] (container", false),
    ] {
        assert_eq!(out.contains(what), wanted, "{what}: {out}");
    }
    let old_new = out
        .lines()
        .filter(|l| l.contains("NCCL_IB_GID_INDEX") || l.contains("gid_index"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        old_new.contains("\"3\"") && old_new.contains("\"5\"") || old_new.contains("3 -> 5"),
        "the old and the new index: {old_new}\n{out}"
    );
    let (code, out, err) = run(&["apply", "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_nccl(&tb, RANK2, "5");
    assert_nccl(&tb, RANK1, "3");
    assert_eq!(
        tb.running_id(RANK1.0, RANK1.1),
        Some(rank1),
        "node1's kept running"
    );
    let (code, out, err) = run(&["plan", "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}\n{err}");

    // A firmware reboot set node2's fabric interface back to 1500: the plan is refused, naming
    // both ends and how to set it back.
    tb.ssh("sf-node2", "ip link set dev enp1s0f0np0 mtu 1500");
    let both = "network.fabric: the MTU differs between the ends of the fabric: node.node1 enp1s0f0np0 9000, node.node2 enp1s0f0np0 1500 (the network sets 9000)";
    // A diagnostic as a terminal shows it, wrapped: its words in order.
    let words = |err: &str| {
        err.replace('│', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (code, out, err) = run(&["plan", "-detailed-exitcode"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(words(&err).contains(both), "{out}\n{err}");
    assert!(
        words(&err).contains("on node.node2: ip link set dev enp1s0f0np0 mtu 9000"),
        "{err}"
    );
    // With on_mtu_mismatch = "fix" it is a warning, and the apply sets 9000 again.
    let main = tmp.path().join("main.hcl");
    let text = std::fs::read_to_string(&main).unwrap();
    let fixed = text.replacen(
        "mtu    = 9000",
        "mtu    = 9000\n  on_mtu_mismatch = \"fix\"",
        1,
    );
    assert_ne!(text, fixed);
    std::fs::write(&main, fixed).unwrap();
    let (code, out, err) = run(&["plan", "-detailed-exitcode"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(words(&err).contains(both), "{out}\n{err}");
    let (code, out, err) = run(&["apply", "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        tb.ssh("sf-node2", "cat /sys/class/net/enp1s0f0np0/mtu")
            .trim(),
        "9000"
    );

    let (code, out, err) = run(&["destroy", "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
}

/// Removes the logind drop-in the RemoveIPC test writes on node2, however the test ends.
struct LogindDropIn<'a>(&'a Testbed);

impl Drop for LogindDropIn<'_> {
    fn drop(&mut self) {
        self.0.ssh(
            "sf-node2",
            "rm -f /etc/systemd/logind.conf.d/50-sparkform-test.conf",
        );
    }
}

/// systemd-logind's `RemoveIPC=yes` on node2 (read from the node's own configuration files)
/// refuses a plan whose container there shares the host's IPC namespace as a user other than
/// root, naming the node, the user and the fix; with `RemoveIPC=no` the same plan goes through.
#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn remove_ipc_on_a_node_refuses_a_host_ipc_container_of_a_user_with_the_fix() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    let dir = tempfile::tempdir().unwrap();
    let mut s = common::testbed::cluster_hcl(&tb, 43, 44);
    s.push_str(
        r#"
container "worker" {
  node     = node.node2
  name     = "sparkform-ipc-worker"
  image    = "sparkform-testbed/ray:latest"
  ipc_mode = "host"
  user     = "nobody"
  command  = ["sleep", "600"]
}
"#,
    );
    std::fs::write(dir.path().join("main.hcl"), s).unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let _undo = LogindDropIn(&tb);
    let logind = |value: &str| {
        tb.ssh(
            "sf-node2",
            &format!("mkdir -p /etc/systemd/logind.conf.d && printf '[Login]\\nRemoveIPC={value}\\n' > /etc/systemd/logind.conf.d/50-sparkform-test.conf"),
        );
    };

    logind("yes");
    let (code, out, err) = sparkform(&["plan", &d]);
    assert_eq!(code, 1, "{out}\n{err}");
    let words = err
        .replace('│', " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        words.contains(
            "node.node2: systemd-logind removes the semaphores and shared memory of user nobody"
        ),
        "{err}"
    );
    assert!(words.contains("(RemoveIPC=yes)"), "{err}");
    assert!(words.contains("RemoveIPC=no"), "the fix: {err}");
    assert!(
        words.contains("loginctl enable-linger nobody"),
        "the other fix: {err}"
    );

    logind("no");
    let (code, out, err) = sparkform(&["plan", &d, "-detailed-exitcode"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(!err.contains("RemoveIPC"), "{err}");
}

//! The multi-host testbed (tests/testbed/testbed) as the integration tests see it.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// The model cache of examples/testbed and examples/testbed-mp on the nodes.
pub const EXAMPLE_MODELS: &str = "/tmp/sparkform-models";

pub struct Testbed {
    pub dir: PathBuf,
    _turn: Turn,
}

/// The file whose tests hold the testbed now, and how many of them do.
static TURN: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
static TURN_ENDED: Condvar = Condvar::new();

/// A test's part in its file's turn on the testbed, given back when it drops (when the test
/// ends, failed or not).
struct Turn;

impl Turn {
    fn take(file: &'static str) -> Turn {
        let mut turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        while turn.0.is_some_and(|holder| holder != file) {
            turn = TURN_ENDED.wait(turn).unwrap_or_else(|e| e.into_inner());
        }
        *turn = (Some(file), turn.1 + 1);
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        turn.1 -= 1;
        if turn.1 == 0 {
            turn.0 = None;
            TURN_ENDED.notify_all();
        }
    }
}

/// The running testbed. Tests that need it are `#[ignore = "needs the testbed: …"]`, so a
/// plain `cargo test` lists them as ignored instead of passing them silently; `.ci/test` runs
/// them with `--include-ignored` and fails when any is still skipped. Run without a testbed,
/// such a test fails and says how to start one.
///
/// One testbed serves every test, a file at a time: the tests of the caller's file (hence
/// `track_caller`) hold it together and may run beside each other (a file whose tests must not
/// has a lock of its own, as testbed_model's); a test of another file waits here until they have
/// all ended. So the tests of two files never meet on the testbed, as when each file was its own
/// test binary and cargo ran the binaries one after the other, whatever `--test-threads`. Call it
/// first in the test, from the test's own file, and keep the `Testbed` until the test ends.
#[track_caller]
pub fn testbed() -> Testbed {
    // The turn before anything else: a test of another file may be taking the testbed down and
    // up again (tests/on_testbed/terminal.rs).
    let turn = Turn::take(std::panic::Location::caller().file());
    let dir = std::env::var_os("SPARKFORM_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/sparkform-testbed"));
    assert!(
        dir.join("known_hosts").is_file(),
        "this test needs the testbed, which is not up ({} has no known_hosts): run \
         `tests/testbed/testbed images && tests/testbed/testbed up -n 2 && tests/testbed/testbed ray`, \
         or `bash .ci/test` for everything",
        dir.display()
    );
    Testbed { dir, _turn: turn }
}

impl Testbed {
    /// The full id of the running container called `name` on `node`, if one runs.
    pub fn running_id(&self, node: &str, name: &str) -> Option<String> {
        self.ssh(
            node,
            &format!("docker ps -q --no-trunc --filter name=^{name}$"),
        )
        .lines()
        .next()
        .map(str::to_string)
    }

    /// Remove what other runs (another state) left on the nodes: containers that would hold
    /// the examples' container names (the model's helpers among them), addresses on the
    /// examples' fabric, and the examples' model cache.
    pub fn clear_leftovers(&self) {
        for node in ["sf-node1", "sf-node2"] {
            self.ssh(node, &format!("docker ps -aq --filter name=sparkform- | xargs -r docker rm -f >/dev/null; ip addr flush dev enp1s0f0np0 to 192.168.200.0/24; rm -rf {EXAMPLE_MODELS}"));
        }
    }

    /// What the examples' model cache holds on `node` that a destroy must have removed: the
    /// snapshot folders and blobs (huggingface_hub's lock files and the folder skeleton stay),
    /// and the model's helper containers. Empty when nothing is left.
    pub fn example_model_left(&self, node: &str) -> String {
        self.ssh(
            node,
            &format!(
                "ls -A {EXAMPLE_MODELS}/models--testbed--standin-qwen3/snapshots {EXAMPLE_MODELS}/models--testbed--standin-qwen3/blobs 2>/dev/null | grep -v -e '^$' -e ':$'; \
                 docker ps -a --filter label=sparkform.model-helper --format '{{{{.Names}}}}'"
            ),
        )
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("id_ed25519")
    }
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// A `jump` block and one `node` block per (name, address), with the node's known_hosts.
    pub fn hcl(&self, nodes: &[(&str, &str)], node_known_hosts: &Path, jump_port: u16) -> String {
        let mut s = format!(
            "jump \"testbed\" {{\n  address     = \"127.0.0.1\"\n  user        = \"root\"\n  port        = {jump_port}\n  known_hosts = \"{}\"\n  identity_file = \"{}\"\n}}\n",
            self.known_hosts().display(),
            self.key().display()
        );
        for (name, address) in nodes {
            s.push_str(&format!(
                "node \"{name}\" {{\n  address       = \"{address}\"\n  user          = \"root\"\n  jump          = jump.testbed\n  identity_file = \"{}\"\n  known_hosts   = \"{}\"\n}}\n",
                self.key().display(),
                node_known_hosts.display()
            ));
        }
        s
    }

    /// Run a command on a testbed node through plain ssh (independent of sparkform).
    pub fn ssh(&self, node: &str, command: &str) -> String {
        let out = std::process::Command::new("ssh")
            .arg("-F")
            .arg(self.dir.join("ssh_config"))
            .arg(node)
            .arg(command)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("ssh");
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

/// The jump host, both nodes and a fabric network whose attachments use `192.168.201.{a1,a2}`.
pub fn cluster_hcl(tb: &Testbed, a1: u8, a2: u8) -> String {
    let mut s = tb.hcl(
        &[("node1", "sf-node1"), ("node2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    );
    s.push_str(&format!(
        r#"
network "fabric" {{
  subnet = "192.168.201.0/24"
  mtu    = 9000
  attach "node1" {{
    node      = node.node1
    interface = "enp1s0f0np0"
    address   = "192.168.201.{a1}"
  }}
  attach "node2" {{
    node      = node.node2
    interface = "enp1s0f0np0"
    address   = "192.168.201.{a2}"
  }}
}}
"#
    ));
    s
}

/// Run the sparkform binary; (exit code, stdout, stderr).
pub fn sparkform(args: &[&str]) -> (i32, String, String) {
    sparkform_env(&[], args)
}

/// [`sparkform`] with environment variables set (`Some`) or removed (`None`).
pub fn sparkform_env(env: &[(&str, Option<&str>)], args: &[&str]) -> (i32, String, String) {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"));
    c.env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(args)
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let o = c.output().expect("run sparkform");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

impl Testbed {
    /// `docker ps -a` on a node: (name, id, status, address label) of containers with a label.
    pub fn containers(&self, node: &str, label: &str) -> Vec<(String, String, String, String)> {
        self.ssh(
            node,
            &format!("docker ps -a --no-trunc --filter label={label} --format '{{{{.Names}}}}|{{{{.ID}}}}|{{{{.Status}}}}|{{{{.Label \"sparkform.address\"}}}}'"),
        )
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split('|').collect();
            (p.len() == 4).then(|| (p[0].to_string(), p[1].to_string(), p[2].to_string(), p[3].to_string()))
        })
        .collect()
    }

    /// The IPv4 addresses on the fabric interface of a node.
    pub fn fabric_addresses(&self, node: &str) -> String {
        self.ssh(node, "ip -4 -br addr show dev enp1s0f0np0")
    }
}

/// Run `tests/testbed/testbed ARGS…` (a node-level fake: `rdma`, `gpu`); its stdout. A failure
/// fails the test with what the script said.
pub fn script(args: &[&str]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testbed/testbed");
    let o = std::process::Command::new(path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run tests/testbed/testbed");
    assert!(
        o.status.success(),
        "testbed {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

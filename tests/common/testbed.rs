//! The multi-host testbed (tests/testbed/testbed) as the integration tests see it.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// The model cache of examples/testbed-standin and examples/testbed-mp on the nodes.
pub const EXAMPLE_MODELS: &str = "/tmp/sparkform-models";

pub struct Testbed {
    pub dir: PathBuf,
    /// The pair of nodes this test holds, in their order (rank 0's first).
    pub nodes: [&'static str; 2],
    /// The pair's own fabric addresses, in the order of `nodes`: what the examples' `nodes` and
    /// `fabric_addresses` variables get through [`Testbed::placement`]. The first pair's are the
    /// examples' defaults; another pair's differ, as the pairs share the fabric's subnet.
    pub fabric: [&'static str; 2],
    _turn: Turn,
    /// The lock of a pair other than the first, shared with another process (bench/chaos
    /// --pair N), held until the test ends: the file closed releases it.
    _pair_lock: Option<std::fs::File>,
    /// The folder of this test's ssh control sockets ([`Testbed::ssh`]): one connection per
    /// node for all of the test's commands there, closed when the test ends.
    mux: tempfile::TempDir,
}

/// The lock file of pair `pair` (0 the first): bench/chaos --pair N takes the Nth's for each of
/// its tries there.
fn pair_lock_file(pair: usize) -> String {
    format!("/tmp/sparkform-testbed-pair{}.lock", pair + 1)
}

/// Wait for and take an exclusive flock on `path` (created if missing).
fn flock(path: &str) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {path}: {}", std::io::Error::last_os_error());
    f
}

/// The testbed's pairs of nodes. The tests of a file hold one pair; a file that holds the
/// second or the third runs beside the files that take turns on the first (`.ci/test` starts
/// six nodes).
const PAIRS: [[&str; 2]; 3] = [
    ["sf-node1", "sf-node2"],
    ["sf-node3", "sf-node4"],
    ["sf-node5", "sf-node6"],
];

/// The first pair's lock file, held by a test process while one of its files has its turn there:
/// the other test binaries' testbed tests (`.ci/test` runs them beside the testbed's own) wait
/// for it as a file of this one waits for another's turn.
const FIRST_PAIR_LOCK: &str = "/tmp/sparkform-testbed-pair1.lock";

/// For each pair: the file whose tests hold it now, how many of them do, and (the first pair)
/// this process's hold on [`FIRST_PAIR_LOCK`] while they do.
type Turns = [(Option<&'static str>, usize, Option<std::fs::File>); 3];
static TURNS: Mutex<Turns> = Mutex::new([(None, 0, None), (None, 0, None), (None, 0, None)]);
static TURN_ENDED: Condvar = Condvar::new();

/// A test's part in its file's turn on a pair of nodes, given back when it drops (when the test
/// ends, failed or not).
struct Turn {
    pair: usize,
}

impl Turn {
    fn take(file: &'static str, pair: usize) -> Turn {
        let mut turns = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        while turns[pair].0.is_some_and(|holder| holder != file) {
            turns = TURN_ENDED.wait(turns).unwrap_or_else(|e| e.into_inner());
        }
        if turns[pair].1 == 0 && pair == 0 {
            // Another process's turn ends first; this process's other files wait on TURNS.
            turns[pair].2 = Some(flock(FIRST_PAIR_LOCK));
        }
        turns[pair].0 = Some(file);
        turns[pair].1 += 1;
        Turn { pair }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut turns = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        let turn = &mut turns[self.pair];
        turn.1 -= 1;
        if turn.1 == 0 {
            turn.0 = None;
            turn.2 = None;
            TURN_ENDED.notify_all();
        }
    }
}

/// The running testbed's first pair of nodes, sf-node1 and sf-node2. Tests that need it are
/// `#[ignore = "needs the testbed: …"]`, so a plain `cargo test` lists them as ignored instead
/// of passing them silently; `.ci/test` runs them with `--include-ignored` and fails when any is
/// still skipped. Run without a testbed, such a test fails and says how to start one.
///
/// One pair serves many files, a file at a time: the tests of the caller's file (hence
/// `track_caller`) hold it together and may run beside each other (a file whose tests must not
/// has a lock of its own, as testbed_model's); a test of another file waits here until they have
/// all ended. So the tests of two files never meet on a pair, as when each file was its own
/// test binary and cargo ran the binaries one after the other, whatever `--test-threads`. Call it
/// first in the test, from the test's own file, and keep the `Testbed` until the test ends.
#[track_caller]
pub fn testbed() -> Testbed {
    take_pair(std::panic::Location::caller().file(), 0)
}

/// The testbed's second pair of nodes, sf-node3 and sf-node4 (`testbed up -n 4`): for a file
/// whose tests touch no other node and place their examples with [`Testbed::placement`] (the
/// real engine's first, whose image `.ci/test` loads there only), so that they run beside the
/// files that share the first pair. What a test of the first pair does to the shared parts (the
/// fabric's 192.168.200.0/24 addresses of sf-node1 and sf-node2, the hub's fetch log of its own
/// repositories) is not what a test of the second reads. `.ci/test` runs the files that take
/// it (`= testbed_second_pair();`) in a process of their own, a test at a time.
#[track_caller]
pub fn testbed_second_pair() -> Testbed {
    take_pair(std::panic::Location::caller().file(), 1)
}

/// The testbed's third pair of nodes, sf-node5 and sf-node6 (`testbed up -n 6`), which
/// bench/chaos --pair 3 shares in `.ci/test`, a try or a test at a time (the pair's lock): for
/// a file whose fabric addresses, hub repository and cache folder no file of the first pair
/// uses at the same time (testbed_model's), or whose tests place their examples with
/// [`Testbed::placement`] and touch no other node (the multiprocessing launcher's files), so
/// that the second pair runs the real engine alone. `.ci/test` runs the files
/// that take it (`= testbed_third_pair();`) in a process of their own, a test at a time.
#[track_caller]
pub fn testbed_third_pair() -> Testbed {
    take_pair(std::panic::Location::caller().file(), 2)
}

/// Each pair's fabric addresses ([`Testbed::fabric`]). No file of any pair uses them for
/// anything else (the first pair's files that build their own networks use .41–.68, the third
/// pair's testbed_model .161–.172).
const PAIR_FABRIC: [[&str; 2]; 3] = [
    ["192.168.200.1", "192.168.200.2"],
    ["192.168.200.103", "192.168.200.104"],
    ["192.168.200.105", "192.168.200.106"],
];

fn take_pair(file: &'static str, pair: usize) -> Testbed {
    // The turn before anything else: a test of another file may be taking the testbed down and
    // up again (tests/on_testbed/terminal.rs).
    let waited = std::time::Instant::now();
    let turn = Turn::take(file, pair);
    let pair_lock = (pair > 0).then(|| flock(&pair_lock_file(pair)));
    suite_log("wait for the testbed", waited.elapsed());
    let dir = std::env::var_os("SPARKFORM_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/sparkform-testbed"));
    let nodes = PAIRS[pair];
    let known = std::fs::read_to_string(dir.join("known_hosts")).unwrap_or_default();
    let missing: Vec<&str> = nodes
        .iter()
        .copied()
        .filter(|n| !known.lines().any(|l| l.starts_with(&format!("{n},"))))
        .collect();
    assert!(
        missing.is_empty(),
        "this test needs the testbed's nodes {nodes:?}, and {missing:?} not up ({} lists no \
         such host): run `tests/testbed/testbed images && tests/testbed/testbed up -n {} && \
         tests/testbed/testbed ray`, or `bash .ci/test` for everything",
        dir.join("known_hosts").display(),
        2 * (pair + 1),
    );
    Testbed {
        dir,
        nodes,
        fabric: PAIR_FABRIC[pair],
        _turn: turn,
        _pair_lock: pair_lock,
        mux: tempfile::Builder::new()
            .prefix("sf-tb-mux")
            .tempdir()
            .expect("a folder for the test's ssh control sockets"),
    }
}

impl Drop for Testbed {
    /// Each node's connection of [`Testbed::ssh`] closed before the pair goes to the next test:
    /// nothing of the test outlives it (a test process killed outright leaves a master that
    /// exits once idle for `ControlPersist`).
    fn drop(&mut self) {
        for node in self.nodes {
            let _ = std::process::Command::new("ssh")
                .args(self.ssh_options())
                .args(["-O", "exit", node])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// How many nodes the running testbed has (sf-node1 to sf-nodeN in its known_hosts).
pub fn node_count(tb: &Testbed) -> usize {
    std::fs::read_to_string(tb.known_hosts())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("sf-node"))
        .count()
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
        for node in self.nodes {
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

    /// `-var nodes=[…] -var fabric_addresses=[…]`: the examples that take them (examples/testbed,
    /// examples/testbed-mp) placed on this test's pair.
    pub fn placement(&self) -> [String; 4] {
        [
            "-var".to_string(),
            format!("nodes=[\"{}\",\"{}\"]", self.nodes[0], self.nodes[1]),
            "-var".to_string(),
            format!(
                "fabric_addresses=[\"{}\",\"{}\"]",
                self.fabric[0], self.fabric[1]
            ),
        ]
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

    /// The testbed's ssh_config, with this test's connection per node: a test's checks are
    /// hundreds of commands in a suite on two cores, and a new connection through the jump host
    /// (two key exchanges) cost about a second each under that load.
    fn ssh_options(&self) -> Vec<std::ffi::OsString> {
        let mut control = std::ffi::OsString::from("ControlPath=");
        control.push(self.mux.path().join("%C"));
        vec![
            "-F".into(),
            self.dir.join("ssh_config").into(),
            "-o".into(),
            "ControlMaster=auto".into(),
            "-o".into(),
            control,
            "-o".into(),
            "ControlPersist=30".into(),
        ]
    }

    /// Run a command on a testbed node through plain ssh (independent of sparkform), over the
    /// test's connection to that node.
    pub fn ssh(&self, node: &str, command: &str) -> String {
        let started = std::time::Instant::now();
        let out = std::process::Command::new("ssh")
            .args(self.ssh_options())
            .arg(node)
            .arg(command)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("ssh");
        suite_log("ssh to a node", started.elapsed());
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

/// A copy of the example folder `example` (its `.hcl` files) in a folder of the test's own, its
/// modules' sources made absolute: the copy has a lock file of its own. Files on different pairs
/// that apply one example at the same time would otherwise share its `sparkform.lock.hcl` (a
/// revision one pins, the other's plan reads).
pub fn example_copy(example: &str) -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("a folder for the example");
    for entry in std::fs::read_dir(root.join(example)).expect("the example's folder") {
        let path = entry.expect("an entry of the example's folder").path();
        if path.extension().is_some_and(|e| e == "hcl")
            && path.file_name().is_some_and(|n| n != "sparkform.lock.hcl")
        {
            let text = std::fs::read_to_string(&path)
                .expect("an example file")
                .replace(
                    "\"../../modules/",
                    &format!("\"{}/modules/", root.display()),
                );
            std::fs::write(dir.path().join(path.file_name().unwrap_or_default()), text)
                .expect("write the copy");
        }
    }
    dir
}

/// The jump host, the test's pair of nodes (as node1 and node2) and a fabric network whose
/// attachments use `192.168.201.{a1,a2}`.
pub fn cluster_hcl(tb: &Testbed, a1: u8, a2: u8) -> String {
    let mut s = tb.hcl(
        &[("node1", tb.nodes[0]), ("node2", tb.nodes[1])],
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
    let started = std::time::Instant::now();
    let o = c.output().expect("run sparkform");
    suite_log(
        &format!("sparkform {}", args.first().copied().unwrap_or("")),
        started.elapsed(),
    );
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

/// With SPARKFORM_SUITE_LOG set (bench/suite-time sets it), one line per timed step of a test
/// appended to that file: the test (libtest names a test's thread after it), what it did, and
/// seconds. bench/suite-time sums them per test: what the slowest tests spend their time on.
pub fn suite_log(what: &str, took: std::time::Duration) {
    use std::io::Write;
    let Some(path) = std::env::var_os("SPARKFORM_SUITE_LOG") else {
        return;
    };
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        // One write per line: the tests of a binary append from several threads.
        let line = format!("{test}\t{what}\t{:.3}\n", took.as_secs_f64());
        let _ = f.write_all(line.as_bytes());
    }
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

//! The README's commands behave the same in a terminal: the testbed commands and a `sparkform
//! apply` and `destroy` run under a pseudo-terminal (`script`), where they are the terminal's
//! foreground job and their stdin is the terminal. Nothing may stop (state `T`: a process of a
//! background group touching the terminal gets SIGTTIN/SIGTTOU), everything ends in bounded
//! time, and nothing is written into the checkout but `target/` and `state/`.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::procs;
use common::testbed::{testbed, Testbed};

const TINY: &str = "sparkform-testbed/tiny:latest";

fn checkout() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file and folder of the checkout, without `.git`, `target/`, any `state/` and the
/// testbed examples' lock files (git ignores them: the real engine's test, on the second pair of
/// nodes, may write examples/testbed's while this test runs).
fn files(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if d == root && (name == ".git" || name == "target") || name == "state" {
                continue;
            }
            if name == "sparkform.lock.hcl" && d.starts_with(root.join("examples")) {
                continue;
            }
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                todo.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Run a shell command line under a pseudo-terminal, from the checkout, within `limit`.
/// Fails if any process of its session stops, or if it does not end in time; returns what it
/// printed.
fn under_terminal(line: &str, limit: Duration) -> String {
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = Command::new("script")
        .args(["-qec", line, "/dev/null"])
        .current_dir(checkout())
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("reopen"))
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs commands under a pseudo-terminal");
    let t0 = Instant::now();
    let printed = || std::fs::read_to_string(out.path()).unwrap_or_default();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for script") {
            break s;
        }
        let family = procs::family(child.id(), &procs::all());
        let stopped: Vec<&procs::Proc> = family.iter().filter(|p| p.state == 'T').collect();
        if !stopped.is_empty() || t0.elapsed() > limit {
            // Stopped processes ignore TERM until continued: KILL, then CONT for good measure.
            for p in &family {
                let _ = Command::new("kill")
                    .args(["-s", "KILL", &p.pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = child.wait();
            let listing = |ps: &[&procs::Proc]| {
                ps.iter()
                    .map(|p| format!("  {} {} {}", p.pid, p.state, p.cmdline))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            if !stopped.is_empty() {
                panic!(
                    "`{line}` under a terminal: processes stopped after {:?}:\n{}\noutput:\n{}",
                    t0.elapsed(),
                    listing(&stopped),
                    printed()
                );
            }
            panic!(
                "`{line}` under a terminal did not end within {limit:?}; its processes:\n{}\noutput:\n{}",
                listing(&family.iter().collect::<Vec<_>>()),
                printed()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = printed();
    assert!(
        status.success(),
        "`{line}` under a terminal failed ({status}):\n{text}"
    );
    text
}

fn config(tb: &Testbed) -> String {
    let mut s = tb.hcl(
        &[("node1", "sf-node1"), ("node2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    );
    s.push_str(&format!(
        r#"
container "tty" {{
  for_each     = {{ node1 = node.node1, node2 = node.node2 }}
  node         = each.value
  name         = "tt-tty-${{each.key}}"
  image        = "{TINY}"
  network_mode = "host"
  stop_timeout = "1s"
  command      = ["sh", "-c", "mkdir -p /www && echo up > /www/index.html && exec httpd -f -p 127.0.0.1:8177 -h /www"]
  ready {{
    http     = "http://127.0.0.1:8177/"
    timeout  = "30s"
    interval = "1s"
  }}
}}
"#
    ));
    s
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn testbed_commands_apply_and_destroy_work_under_a_terminal() {
    let tb = testbed();
    let before = files(&checkout());
    let script = checkout().join("tests/testbed/testbed");
    let script = quote(&script.to_string_lossy());
    // `images` only checks its cache once built (the first build takes minutes: .ci/test
    // builds it before the tests).
    under_terminal(&format!("{script} images"), Duration::from_secs(300));
    // as many nodes as are up: `up` removes the nodes beyond its count, and a test on the
    // second pair may be running on them
    let n = common::testbed::node_count(&tb);
    under_terminal(&format!("{script} up -n {n}"), Duration::from_secs(300));
    under_terminal(&format!("{script} ray"), Duration::from_secs(300));

    let cfg = common::write_config(&[("main.hcl", &config(&tb))]);
    let bin = quote(env!("CARGO_BIN_EXE_sparkform"));
    let dir = quote(&cfg.path().to_string_lossy());
    let out = under_terminal(
        &format!("{bin} apply {dir} -auto-approve"),
        Duration::from_secs(180),
    );
    assert!(out.contains("Apply complete: 2 added"), "{out}");
    let out = under_terminal(
        &format!("{bin} destroy {dir} -auto-approve"),
        Duration::from_secs(120),
    );
    assert!(out.contains("2 destroyed"), "{out}");

    let new: Vec<PathBuf> = files(&checkout()).difference(&before).cloned().collect();
    assert!(
        new.is_empty(),
        "written into the checkout (only target/ and state/ may be): {new:?}"
    );
}

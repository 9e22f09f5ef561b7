//! The warm mode (`--persist`, `SPARKFORM_PERSIST`) on the real ssh path: connections kept after
//! a command are reused by the next, end by themselves once idle for the bound, a killed one is
//! reaped by the next command, one whose machine went quiet is replaced, `connections -close`
//! ends them, and without the setting nothing is kept. Each test has a warm folder of its own
//! (`XDG_RUNTIME_DIR`), so its connections are told apart from any other test's by the folder
//! in their arguments.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::procs;
use common::testbed::{sparkform_env, testbed};

/// Run sparkform with the warm folder under `runtime` and `persist` (None: unset).
fn sparkform_in(runtime: &Path, persist: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let runtime = runtime.to_str().expect("a UTF-8 temp path");
    sparkform_env(
        &[
            ("XDG_RUNTIME_DIR", Some(runtime)),
            ("SPARKFORM_PERSIST", persist),
        ],
        args,
    )
}

/// The ssh masters of this test's warm folder: (pid, the address in their arguments).
fn masters(runtime: &Path) -> Vec<(u32, String)> {
    let root = runtime.join("sparkform-warm").display().to_string();
    let mut out: Vec<(u32, String)> = procs::all()
        .into_iter()
        .filter(|p| p.cmdline.starts_with("ssh ") && p.cmdline.contains(&root))
        .filter(|p| p.cmdline.contains(" -M "))
        .map(|p| {
            let alias = p.cmdline.rsplit(' ').next().unwrap_or_default().to_string();
            (p.pid, alias)
        })
        .collect();
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

/// Run a shell script in a testbed node's container (not over ssh: its sessions are the subject).
fn in_node(container: &str, script: &str) {
    let o = Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .output()
        .expect("docker exec");
    assert!(
        o.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn pid_of(masters: &[(u32, String)], alias: &str) -> u32 {
    masters
        .iter()
        .find(|(_, a)| a == alias)
        .map(|(p, _)| *p)
        .unwrap_or_else(|| panic!("no master for {alias} in {masters:?}"))
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn kept_connections_are_reused_reaped_closed_and_end_when_idle() {
    let tb = testbed();
    let runtime = tempfile::tempdir().unwrap();
    let dir = common::write_config(&[(
        "main.hcl",
        &tb.hcl(
            &[("node1", "sf-node1"), ("node2", "sf-node2")],
            &tb.known_hosts(),
            2222,
        ),
    )]);
    let d = dir.path().to_str().unwrap();
    let rt = runtime.path();

    // Without the setting nothing is kept, and no warm folder is made.
    let (code, out, err) = sparkform_in(rt, None, &["plan", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(masters(rt).is_empty(), "{:?}", masters(rt));
    assert!(!rt.join("sparkform-warm").exists());

    // Kept: one master per node and one for the jump host, listed.
    let (code, out, err) = sparkform_in(rt, Some("10s"), &["plan", d]);
    assert_eq!(code, 0, "{out}{err}");
    let first = masters(rt);
    assert_eq!(
        first.iter().map(|(_, a)| a.as_str()).collect::<Vec<_>>(),
        ["sf.jump.testbed", "sf.node.node1", "sf.node.node2"],
        "{first:?}"
    );
    let (code, listed, err) = sparkform_in(rt, None, &["connections"]);
    assert_eq!(code, 0, "{err}");
    for want in ["node.node1", "node.node2", "jump.testbed", "10 s"] {
        assert!(listed.contains(want), "{want} not in:\n{listed}");
    }

    // Reused: the next command starts no master.
    let (code, out, err) = sparkform_in(rt, Some("10s"), &["plan", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(masters(rt), first, "the second plan made new connections");

    // A master killed: the next command reaps it and connects again; the others are reused.
    procs::signal(pid_of(&first, "sf.node.node1"), "KILL");
    let (code, out, err) = sparkform_in(rt, Some("10s"), &["plan", d]);
    assert_eq!(code, 0, "{out}{err}");
    let after_kill = masters(rt);
    assert_ne!(
        pid_of(&after_kill, "sf.node.node1"),
        pid_of(&first, "sf.node.node1")
    );
    assert_eq!(
        pid_of(&after_kill, "sf.node.node2"),
        pid_of(&first, "sf.node.node2")
    );

    // A machine gone quiet behind a master that still answers here (the node's sshd session of
    // that master stopped): the next command gets no answer through it, ends it and connects
    // anew, instead of failing on its first command.
    let sessions = "ps -eo pid,stat,args | grep '[s]shd: root' | awk '{print $1}'";
    in_node("sf-node1", &format!("kill -STOP $({sessions})"));
    let (code, out, err) = sparkform_in(rt, Some("10s"), &["plan", d]);
    // Only the stopped session goes: the new master's is running.
    let stopped = "ps -eo pid,stat,args | awk '$2 ~ /^T/ && /sshd: root/ {print $1}'";
    in_node(
        "sf-node1",
        &format!("kill -KILL $({stopped}) 2>/dev/null; true"),
    );
    assert_eq!(code, 0, "{out}{err}");
    let after_stop = masters(rt);
    assert_ne!(
        pid_of(&after_stop, "sf.node.node1"),
        pid_of(&after_kill, "sf.node.node1"),
        "the quiet machine's master was reused"
    );

    // -close ends them all now and leaves no folder of theirs.
    let (code, out, err) = sparkform_in(rt, None, &["connections", "-close"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Closed 3 connection(s)."), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !masters(rt).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(masters(rt).is_empty(), "{:?}", masters(rt));
    let left: Vec<_> = std::fs::read_dir(rt.join("sparkform-warm"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Idle: kept past the command, gone once idle for the bound (the jump host's master counts
    // its own bound from when the node masters through it end).
    let (code, out, err) = sparkform_in(rt, Some("10s"), &["plan", d]);
    assert_eq!(code, 0, "{out}{err}");
    let ended = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(masters(rt).len(), 3, "ended before the bound");
    let deadline = ended + Duration::from_secs(40);
    while !masters(rt).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        masters(rt).is_empty(),
        "not ended when idle: {:?}",
        masters(rt)
    );
    let (code, listed, _) = sparkform_in(rt, None, &["connections"]);
    assert_eq!(code, 0);
    assert!(listed.contains("No kept connections"), "{listed}");
}

//! `sparkform watch` on the testbed (examples/testbed-mp with the vLLM stand-in's wedge mode:
//! after N chat completions rank 0 stops answering them while /health stays 200, and its log
//! prints what a wedged vLLM prints). Without --restart the watch exits 1 naming the cause;
//! with it, every rank is replaced (new container IDs, the weights untouched), the canary
//! passes again and `status` shows the restart; a crash loop stops after --max-restarts; a
//! SIGTERM in the middle of a restart leaves the engine whole (restarted or rolled back) and no
//! ssh process or control folder on the operator's machine.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::{control_dirs_of, ssh_of};
use common::testbed::{sparkform, testbed, Testbed};

const EXAMPLE: &str = "examples/testbed-mp";
const RANKS: [(&str, &str); 2] = [
    ("sf-node1", "sparkform-vllm-node1"),
    ("sf-node2", "sparkform-vllm-node2"),
];

fn rank_ids(tb: &Testbed) -> Vec<Option<String>> {
    RANKS.iter().map(|(n, c)| tb.running_id(n, c)).collect()
}

/// The snapshot folders of the example's model on a node, with their modification times: a
/// restart must not touch them.
fn weights(tb: &Testbed, node: &str) -> String {
    tb.ssh(
        node,
        "find /tmp/sparkform-models -path '*/snapshots/*' -maxdepth 4 -printf '%p %T@\\n' | sort",
    )
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_wedged_engine_is_found_and_restarted_as_a_whole() {
    let tb = testbed();
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("state.json");
    let st = st.to_str().unwrap().to_string();
    // The apply's probe is the first completion; the watch's checks are the next ones.
    let wedge = |n: u32| format!("standin_wedge_after={n}");
    let with = |args: &[&str], n: u32| -> (i32, String, String) {
        let w = wedge(n);
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["-state", st.as_str(), "-var", w.as_str()]);
        sparkform(&a)
    };
    let (code, out, err) = with(&["apply", EXAMPLE, "-auto-approve", "-upgrade"], 3);
    assert_eq!(code, 0, "{out}\n{err}");
    let before = rank_ids(&tb);
    let weights_before = (weights(&tb, "sf-node1"), weights(&tb, "sf-node2"));

    // Without --restart: the third completion wedges; the watch names the cause and exits 1.
    let watch = [
        "watch",
        EXAMPLE,
        "--interval",
        "2s",
        "--probe-timeout",
        "6s",
    ];
    let mut args = watch.to_vec();
    args.extend(["--ticks", "6"]);
    let (code, out, err) = with(&args, 3);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("✓ check 1") && out.contains("✓ check 2"),
        "{out}"
    );
    assert!(
        out.contains("✗ check 3"),
        "found within two intervals: {out}"
    );
    assert!(
        err.contains("Error: watch: module.qwen.container.rank0:")
            && err.contains("No available shared memory broadcast block found"),
        "{err}"
    );
    assert_eq!(
        rank_ids(&tb),
        before,
        "the watch restarted without --restart"
    );

    // With --restart: every rank is replaced and the canary passes again.
    let mut args = watch.to_vec();
    args.extend(["--restart", "--ticks", "2"]);
    let (code, out, err) = with(&args, 3);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("✗ check 1"),
        "the engine was still wedged: {out}"
    );
    assert!(
        out.contains(
            "replacing module.qwen.container.rank0, module.qwen.container.rank[\"node2\"]"
        ),
        "{out}"
    );
    assert!(
        out.contains("✓ restart: 2 replaced, 2 probes passed"),
        "{out}"
    );
    assert!(out.contains("✓ check 2"), "the canary passes again: {out}");
    let after = rank_ids(&tb);
    for (b, a) in before.iter().zip(&after) {
        assert!(
            a.is_some() && a != b,
            "a rank was not replaced: {before:?} → {after:?}"
        );
    }
    assert_eq!(
        (weights(&tb, "sf-node1"), weights(&tb, "sf-node2")),
        weights_before,
        "the restart touched the weights"
    );
    let (code, out, err) = with(&["status", EXAMPLE], 3);
    assert!(code == 0 || code == 2, "{out}\n{err}");
    assert!(
        out.contains("Restarts by sparkform watch")
            && out.contains("restarted: module.qwen.container.rank0"),
        "{out}"
    );
    let (code, out, err) = with(&["plan", EXAMPLE, "-detailed-exitcode"], 3);
    assert_eq!(code, 0, "the restart left the state true: {out}\n{err}");

    // A crash loop: every engine wedges at its first watched completion; after one restart
    // the next failure stops the watch with the cause.
    let (code, out, err) = with(&["apply", EXAMPLE, "-auto-approve"], 1);
    assert_eq!(code, 0, "{out}\n{err}");
    let mut args = watch.to_vec();
    args.extend([
        "--restart",
        "--max-restarts",
        "1",
        "--window",
        "1h",
        "--ticks",
        "10",
    ]);
    let (code, out, err) = with(&args, 1);
    assert_eq!(code, 1, "{out}\n{err}");
    assert_eq!(out.matches("↻ restart").count(), 1, "{out}");
    assert!(
        err.contains("the engine failed again after 1 restart within 1h"),
        "{err}"
    );

    // SIGTERM while a restart runs: the watch stops the restart (rolled back, as an apply is),
    // the engine is whole, and nothing of the watch is left on this machine.
    let (code, out, err) = with(&["apply", EXAMPLE, "-auto-approve"], 1);
    assert_eq!(code, 0, "{out}\n{err}");
    let w = wedge(1);
    let child = Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(watch)
        .args(["--restart", "--ticks", "10", "-state", &st, "-var", &w])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sparkform watch");
    // The restart starts after the first check finds the wedge (a probe timeout of 6 s); the
    // signal lands while rank 1 waits for rank 0 (about 7 s of each restart).
    let t0 = Instant::now();
    let mut sent = false;
    let mut dirs = std::collections::BTreeSet::new();
    while t0.elapsed() < Duration::from_secs(60) {
        dirs.extend(control_dirs_of(child.id()));
        let restarting = tb.ssh(
            "sf-node1",
            "docker ps -a --format '{{.Names}}' | grep -c sparkform-old || true",
        );
        if restarting.trim() != "0" {
            std::thread::sleep(Duration::from_millis(500));
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            sent = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(sent, "no restart began within a minute");
    let out = child.wait_with_output().expect("wait for watch");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(stderr.contains("watch: stopped"), "{stderr}");
    // The engine is whole: the plan agrees with what runs (a rollback restored the previous
    // ranks or the restart finished), and both ranks run.
    let (code, out, err) = with(&["plan", EXAMPLE, "-detailed-exitcode"], 1);
    assert_eq!(code, 0, "half a restart was left: {out}\n{err}");
    assert!(
        rank_ids(&tb).iter().all(Option::is_some),
        "a rank is not running"
    );
    assert!(
        !dirs.is_empty(),
        "the watch's control folder was never seen"
    );
    for d in &dirs {
        assert!(!d.exists(), "control folder {} left", d.display());
        assert!(ssh_of(d).is_empty(), "ssh processes left: {:?}", ssh_of(d));
    }

    let (code, out, err) = with(&["destroy", EXAMPLE, "-auto-approve"], 1);
    assert_eq!(code, 0, "{out}\n{err}");
}

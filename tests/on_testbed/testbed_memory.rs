//! Unified memory on the testbed, through a fake GB10 on both nodes (`testbed gpu NODE on`:
//! nvidia-smi names a GB10 without memory of its own, /proc/meminfo follows what the vLLM
//! stand-in holds and the page cache of the model cache, and `dd` records the drops it is asked
//! for). examples/testbed-mp: the page cache of the weights is dropped before a rank loads them;
//! a replacement waits for the old engine's memory (released after a delay) and starts after it;
//! an engine that never releases fails the start naming the process, and the rollback does not
//! start the previous engine into memory that is not there. On the third pair of nodes, beside
//! the first pair's files and the real engine's, in turns with testbed_model's.

use crate::common;

use common::testbed::{sparkform, testbed_third_pair, Testbed};

const EXAMPLE: &str = "examples/testbed-mp";

/// `testbed gpu NODE ARGS…`: its output.
fn gpu(node: &str, args: &[&str]) -> String {
    let mut a = vec!["gpu", node];
    a.extend(args);
    common::testbed::script(&a)
}

/// Takes the fake GPUs off both nodes however the test ends.
struct FakeGpus([&'static str; 2]);

impl Drop for FakeGpus {
    fn drop(&mut self) {
        for node in self.0 {
            gpu(node, &["off"]);
        }
    }
}

/// The fake's log on a node: (time, what).
fn events(node: &str) -> Vec<(f64, String)> {
    gpu(node, &["log"])
        .lines()
        .filter_map(|l| {
            let (t, what) = l.split_once(' ')?;
            Some((t.parse().ok()?, what.to_string()))
        })
        .collect()
}

fn last(events: &[(f64, String)], prefix: &str) -> Option<f64> {
    events
        .iter()
        .rev()
        .find(|(_, w)| w.starts_with(prefix))
        .map(|(t, _)| *t)
}

/// When the drops of the snapshot's files were recorded on a node, and how many.
fn drops(tb: &Testbed, node: &str) -> Vec<f64> {
    tb.ssh(node, "cat /run/sparkform-fakegpu/dropped 2>/dev/null")
        .lines()
        .filter(|l| l.contains("/snapshots/"))
        .filter_map(|l| l.split('\t').next()?.parse().ok())
        .collect()
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn unified_memory_is_waited_for_and_the_page_cache_dropped_before_a_load() {
    let tb = testbed_third_pair();
    // A copy of the example, whose lock file is this test's (tests/common/testbed.rs).
    let copy = common::testbed::example_copy(EXAMPLE);
    let example = copy.path().to_str().unwrap();
    tb.clear_leftovers();
    let _gpus = FakeGpus(tb.nodes);
    let [node1, _] = tb.nodes;
    for node in tb.nodes {
        gpu(node, &["off"]);
        gpu(node, &["on", "--release-delay", "4", "--hold", "release"]);
    }
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("state.json");
    let st = st.to_str().unwrap().to_string();
    let placement = tb.placement();
    let on_the_pair = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-state", st.as_str()]);
        a.extend(placement.iter().map(String::as_str));
        sparkform(&a)
    };
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-var", "memory_release_timeout=30"]);
        on_the_pair(&a)
    };

    // The plan reads the fake: unified memory of 128 GiB, so each rank needs 0.80 of it free.
    let (code, out, err) = run(&["plan", example]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("min_free_gib"), "{out}");

    // From empty: the weights land in the page cache (60 MiB counted ×1024), and each rank's
    // start drops it first, so the load finds its memory.
    let (code, out, err) = run(&["apply", example, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    for node in tb.nodes {
        let ev = events(node);
        assert!(
            ev.iter().any(|(_, w)| w.contains("cached 60.")),
            "{node}: the copied weights were never in the page cache: {ev:?}"
        );
        let dropped = drops(&tb, node);
        assert!(!dropped.is_empty(), "{node}: nothing was dropped");
        let held = last(&ev, "holds sparkform-vllm-").expect("an engine held memory");
        let max_drop = dropped.iter().cloned().fold(0.0, f64::max);
        assert!(max_drop < held, "{node}: the engine loaded before the drop");
    }

    // A new flag replaces both ranks: each new engine starts only after the old one released
    // its memory (4 s after it stopped).
    let (code, out, err) = run(&[
        "apply",
        example,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let ev = events(node1);
    let released = last(&ev, "released sparkform-vllm-node1").expect("the old engine released");
    let stopped = last(&ev, "stopped sparkform-vllm-node1").unwrap();
    let held = last(&ev, "holds sparkform-vllm-node1").unwrap();
    assert!(released - stopped >= 3.5, "{ev:?}");
    assert!(
        held > released,
        "the new engine started before the old one's memory came back: {ev:?}"
    );

    // An engine that never releases its memory: the start fails naming what holds the GPU, and
    // the previous engine is not started into memory that is not there.
    gpu(node1, &["on", "--release-delay", "4", "--hold", "never"]);
    let (code, out, err) = on_the_pair(&[
        "apply",
        example,
        "-auto-approve",
        "-var",
        "memory_release_timeout=6",
        "-var",
        "max_model_len=2048",
    ]);
    assert_ne!(code, 0, "{out}\n{err}");
    let all = format!("{out}\n{err}");
    assert!(
        all.contains("needs 102.4 GiB; the GPU's memory is held by: ")
            && all.contains("VLLM::EngineCore"),
        "{all}"
    );
    assert!(
        tb.running_id(node1, "sparkform-vllm-node1").is_none(),
        "the previous engine was started without its memory"
    );

    // Once the memory comes back, the next apply brings the deployment back.
    gpu(node1, &["on", "--release-delay", "4", "--hold", "release"]);
    let (code, out, err) = run(&[
        "apply",
        example,
        "-auto-approve",
        "-var",
        "max_model_len=2048",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = run(&["destroy", example, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
}

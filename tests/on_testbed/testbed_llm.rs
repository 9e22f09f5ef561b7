//! The LLM stack end to end on the testbed: examples/testbed-standin with real Ray, the vLLM stand-in
//! (`tests/testbed/testbed ray` loads its image into the nodes) and the weights from the stand-in
//! hub (`testbed hub`).

use crate::common;

use std::time::{Duration, Instant};

use common::testbed::{sparkform, testbed};

const EXAMPLE: &str = "examples/testbed-standin";

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn qwen_on_the_testbed() {
    let tb = testbed();
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let st = state.to_str().unwrap();
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        v.extend(["-state".to_string(), st.to_string()]);
        v
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        sparkform(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // From empty: the weights are copied over the fabric and pass the architecture check
    // before Ray starts; the hello probe's answer names both fabric addresses.
    let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("copied from node.node1 over 192.168.200.1"),
        "{out}"
    );
    assert!(
        out.contains("sparkform-testbed/ray:latest serves Qwen3ForCausalLM"),
        "{out}"
    );
    assert!(out.contains("ray-members-ok 2 nodes, 2 GPUs"), "{out}");
    assert!(
        out.contains("Ray workers run on 192.168.200.1, 192.168.200.2"),
        "{out}"
    );
    let (code, out, _) = run(&["plan", EXAMPLE, "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}");

    // A vLLM flag changes: exactly one container is replaced, Ray keeps running.
    let head = tb
        .running_id("sf-node1", "sparkform-ray-head")
        .expect("ray head");
    let worker = tb
        .running_id("sf-node2", "sparkform-ray-worker-node2")
        .expect("ray worker");
    let vllm = tb.running_id("sf-node1", "sparkform-vllm").expect("vllm");
    let (code, out, _) = run(&[
        "plan",
        EXAMPLE,
        "-var",
        "max_model_len=4096",
        "-detailed-exitcode",
    ]);
    assert_eq!(code, 2);
    assert!(
        out.contains("Plan: 0 to add, 0 to change, 1 to replace, 0 to destroy; 1 probe to run."),
        "{out}"
    );
    assert!(out.contains("module.qwen.container.vllm (container on node.node1) must be replaced (`command` changes)"), "{out}");
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        tb.running_id("sf-node1", "sparkform-ray-head").as_deref(),
        Some(head.as_str()),
        "the Ray head restarted"
    );
    assert_eq!(
        tb.running_id("sf-node2", "sparkform-ray-worker-node2")
            .as_deref(),
        Some(worker.as_str()),
        "the Ray worker restarted"
    );
    let vllm2 = tb
        .running_id("sf-node1", "sparkform-vllm")
        .expect("new vllm");
    assert_ne!(vllm2, vllm);

    // A probe that expects another model: the apply fails and rolls back; the previous vLLM answers.
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "max_model_len=2048",
        "-var",
        "expect_model=Llama",
        "-var",
        "probe_timeout=8s",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("does not match /(?i)Llama/") && err.contains("Rolled back"),
        "{err}"
    );
    assert_eq!(
        tb.running_id("sf-node1", "sparkform-vllm").as_deref(),
        Some(vllm2.as_str())
    );
    let (code, out, _) = run(&["verify", EXAMPLE, "-var", "max_model_len=4096"]);
    assert_eq!(code, 0, "the previous vLLM does not answer:\n{out}");

    // An image whose vLLM lacks the model's architecture is refused by the architecture check
    // right after the weights, before any container is replaced: Ray and vLLM keep running.
    let start = Instant::now();
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
        "-var",
        "image=sparkform-testbed/ray:noarch",
    ]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        start.elapsed() < Duration::from_secs(90),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        err.contains("does not list the architecture Qwen3ForCausalLM")
            && err.contains("nothing that uses the model was started"),
        "{err}"
    );
    assert_eq!(
        tb.running_id("sf-node1", "sparkform-ray-head").as_deref(),
        Some(head.as_str()),
        "the Ray head was replaced"
    );
    assert_eq!(
        tb.running_id("sf-node1", "sparkform-vllm").as_deref(),
        Some(vllm2.as_str()),
        "vLLM was replaced"
    );
    let (code, out, _) = run(&["verify", EXAMPLE, "-var", "max_model_len=4096"]);
    assert_eq!(code, 0, "{out}");

    // Destroy leaves nothing.
    let (code, out, err) = run(&[
        "destroy",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    for node in ["sf-node1", "sf-node2"] {
        assert!(
            tb.containers(node, "sparkform.lineage")
                .iter()
                .all(|c| !c.0.starts_with("sparkform-")),
            "containers left on {node}"
        );
        assert!(
            !tb.fabric_addresses(node).contains("192.168.200."),
            "address left on {node}"
        );
        let left = tb.example_model_left(node);
        assert!(left.trim().is_empty(), "model files left on {node}: {left}");
    }
    tb.clear_leftovers();
}

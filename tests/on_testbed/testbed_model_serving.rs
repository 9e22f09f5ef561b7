//! examples/testbed-standin with its model block, end to end: from empty the weights come from the
//! stand-in hub (`testbed hub`) and vLLM serves the local snapshot offline from the read-only
//! cache; a new revision replaces the weights on both nodes and vLLM, never Ray; destroy leaves
//! no weights, helper container, container or address.

use crate::common;

use std::path::Path;

use common::testbed::{sparkform, testbed, Testbed, EXAMPLE_MODELS};

const EXAMPLE: &str = "examples/testbed-standin";
const SNAPSHOTS: &str = "models--testbed--standin-qwen3/snapshots";
const HEAD: (&str, &str) = ("sf-node1", "sparkform-ray-head");
const WORKER: (&str, &str) = ("sf-node2", "sparkform-ray-worker-node2");
const VLLM: (&str, &str) = ("sf-node1", "sparkform-vllm");

fn recorded_commit(state: &Path, node: &str) -> String {
    let text = std::fs::read_to_string(state).expect("state");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("state json");
    doc["resources"][format!("model.qwen[\"{node}\"]")]["config"]["commit"]
        .as_str()
        .unwrap_or_else(|| panic!("no commit recorded for {node}: {text}"))
        .to_string()
}

fn snapshots(tb: &Testbed, node: &str) -> String {
    tb.ssh(
        node,
        &format!("ls {EXAMPLE_MODELS}/{SNAPSHOTS} 2>/dev/null"),
    )
    .trim()
    .to_string()
}

fn inspect(tb: &Testbed, (node, name): (&str, &str), format: &str) -> serde_json::Value {
    let out = tb.ssh(node, &format!("docker inspect -f '{format}' {name}"));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{name}: {e}: {out}"))
}

/// vLLM's container serves `commit`'s snapshot offline, and every container of the example
/// mounts the cache read-only.
fn assert_serves(tb: &Testbed, commit: &str) {
    let cmd = inspect(tb, VLLM, "{{json .Config.Cmd}}");
    let snapshot = format!("{EXAMPLE_MODELS}/{SNAPSHOTS}/{commit}");
    let args: Vec<&str> = cmd
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    let serve = args.iter().position(|a| *a == "serve").expect("vllm serve");
    assert_eq!(args.get(serve + 1), Some(&snapshot.as_str()), "{cmd}");
    let named = args
        .iter()
        .position(|a| *a == "--served-model-name")
        .expect("--served-model-name");
    assert_eq!(args.get(named + 1), Some(&"testbed/standin-qwen3"), "{cmd}");
    for c in [VLLM, HEAD, WORKER] {
        let env = inspect(tb, c, "{{json .Config.Env}}");
        assert!(
            env.as_array()
                .is_some_and(|e| e.iter().any(|x| x == "HF_HUB_OFFLINE=1")),
            "{}: {env}",
            c.1
        );
        let mounts = inspect(tb, c, "{{json .Mounts}}");
        let cache = mounts
            .as_array()
            .and_then(|m| m.iter().find(|m| m["Destination"] == EXAMPLE_MODELS))
            .unwrap_or_else(|| panic!("{}: no {EXAMPLE_MODELS} mount: {mounts}", c.1));
        assert_eq!(cache["Source"], EXAMPLE_MODELS, "{}: {cache}", c.1);
        assert_eq!(
            cache["RW"], false,
            "{}: the cache is writable: {cache}",
            c.1
        );
    }
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn the_example_serves_its_snapshot_and_a_new_revision_replaces_vllm_not_ray() {
    let tb = testbed();
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let st = state.to_str().unwrap().to_string();
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-state", st.as_str()]);
        sparkform(&a)
    };

    // From empty: both nodes hold the resolved commit, vLLM serves it, the probe passes.
    let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("200: Hello! I am testbed/standin-qwen3"),
        "{out}"
    );
    let first = recorded_commit(&state, "node1");
    assert_eq!(first.len(), 40, "{first}");
    assert_eq!(recorded_commit(&state, "node2"), first);
    for n in ["sf-node1", "sf-node2"] {
        assert_eq!(snapshots(&tb, n), first, "{n}");
    }
    assert_serves(&tb, &first);

    // Revision v2: the weights on both nodes and vLLM are replaced, Ray keeps running.
    let (code, out, err) = run(&["plan", EXAMPLE, "-var", "rev=v2", "-detailed-exitcode"]);
    assert_eq!(code, 2, "{out}\n{err}");
    for n in ["node1", "node2"] {
        assert!(
            out.contains(&format!(
                "model.qwen[\"{n}\"] (model on node.{n}) must be replaced (the revision changes from main to v2, commit "
            )),
            "{out}"
        );
    }
    assert!(
        out.contains(
            "module.qwen.container.vllm (container on node.node1) must be replaced (`command` changes)"
        ),
        "{out}"
    );
    assert!(
        out.contains("Plan: 0 to add, 0 to change, 3 to replace, 0 to destroy; 2 probes to run."),
        "{out}"
    );
    assert!(
        !out.contains("ray_head (container on node.node1) must"),
        "{out}"
    );
    assert!(
        !out.contains("ray_worker[\"node2\"] (container on node.node2) must"),
        "{out}"
    );
    let keeps = out
        .split("Keeps running:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Keeps running: {out}"));
    assert!(
        keeps.contains("module.qwen.module.ray.container.ray_head on node.node1")
            && keeps
                .contains("module.qwen.module.ray.container.ray_worker[\"node2\"] on node.node2"),
        "{out}"
    );

    let head = tb.running_id(HEAD.0, HEAD.1).expect("ray head");
    let worker = tb.running_id(WORKER.0, WORKER.1).expect("ray worker");
    let vllm = tb.running_id(VLLM.0, VLLM.1).expect("vllm");
    let (code, out, err) = run(&["apply", EXAMPLE, "-var", "rev=v2", "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("200: Hello! I am testbed/standin-qwen3"),
        "{out}"
    );
    assert_eq!(
        tb.running_id(HEAD.0, HEAD.1).as_deref(),
        Some(head.as_str()),
        "the Ray head was replaced"
    );
    assert_eq!(
        tb.running_id(WORKER.0, WORKER.1).as_deref(),
        Some(worker.as_str()),
        "the Ray worker was replaced"
    );
    let vllm2 = tb.running_id(VLLM.0, VLLM.1).expect("new vllm");
    assert_ne!(vllm2, vllm, "vLLM still runs the old commit");
    let second = recorded_commit(&state, "node1");
    assert_ne!(second, first);
    assert_eq!(recorded_commit(&state, "node2"), second);
    // The old commit's snapshot stays beside the new one for a rollback (keep_revisions).
    for n in ["sf-node1", "sf-node2"] {
        let mut listed: Vec<String> = snapshots(&tb, n)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        listed.sort();
        let mut both = vec![first.clone(), second.clone()];
        both.sort();
        assert_eq!(listed, both, "{n}");
    }
    assert_serves(&tb, &second);
    let (code, out, _) = run(&["plan", EXAMPLE, "-var", "rev=v2", "-detailed-exitcode"]);
    assert_eq!(code, 0, "a re-plan is not a no-op:\n{out}");
    let (code, out, _) = run(&["verify", EXAMPLE, "-var", "rev=v2"]);
    assert_eq!(code, 0, "{out}");

    // Destroy: no weights, no helper, no container, no address.
    let (code, out, err) = run(&["destroy", EXAMPLE, "-var", "rev=v2", "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    for node in ["sf-node1", "sf-node2"] {
        let left = tb.example_model_left(node);
        assert!(left.trim().is_empty(), "model files left on {node}: {left}");
        let ours: Vec<String> = tb
            .containers(node, "sparkform.lineage")
            .into_iter()
            .map(|c| c.0)
            .filter(|n| n.starts_with("sparkform-"))
            .collect();
        assert!(ours.is_empty(), "containers left on {node}: {ours:?}");
        assert!(
            !tb.fabric_addresses(node).contains("192.168.200."),
            "address left on {node}"
        );
    }
    tb.clear_leftovers();
}

//! What `sparkform watch` restarts for a failure, on the examples' graphs: the whole engine and
//! nothing under it — every rank of a process group, the vLLM driver a replaced Ray member
//! triggers, not the Ray cluster under a vLLM that stopped answering — and the probes after it.

use std::path::Path;

use crate::common;

use sparkform::ops::watch::{restart_set, Failure};

fn failure(containers: &[&str], probe: Option<&str>) -> Failure {
    Failure {
        cause: "test".into(),
        containers: containers.iter().map(|s| s.to_string()).collect(),
        probe: probe.map(str::to_string),
        restartable: true,
    }
}

fn example(name: &str) -> (sparkform::config::Config, sparkform::graph::Graph) {
    common::load_resolved(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name),
    )
}

#[test]
fn a_wedged_rank_restarts_every_rank_and_the_probes_after_them() {
    let (c, g) = example("testbed-mp");
    let (replace, targets) =
        restart_set(&c, &g, &[failure(&["module.qwen.container.rank0"], None)]);
    assert_eq!(
        replace,
        [
            "module.qwen.container.rank0",
            "module.qwen.container.rank[\"node2\"]"
        ]
    );
    for probe in ["probe.hello", "module.qwen.probe.rendezvous"] {
        assert!(targets.iter().any(|t| t == probe), "{targets:?}");
    }
    // The weights are under the engine, not after it: a restart never touches them.
    assert!(
        !targets.iter().any(|t| t.starts_with("model.")),
        "{targets:?}"
    );
    // A failed canary finds the same engine.
    let (by_probe, _) = restart_set(&c, &g, &[failure(&[], Some("probe.hello"))]);
    assert_eq!(by_probe, replace);
}

#[test]
fn with_ray_a_failed_canary_restarts_vllm_and_a_failed_ray_member_restarts_both() {
    let (c, g) = example("testbed-standin");
    let (replace, _) = restart_set(&c, &g, &[failure(&[], Some("probe.hello"))]);
    assert_eq!(replace, ["module.qwen.container.vllm"], "Ray keeps running");
    let worker = c
        .resources
        .iter()
        .find(|r| r.address.contains("ray_worker"))
        .map(|r| r.address.clone())
        .expect("a Ray worker");
    let (replace, _) = restart_set(&c, &g, &[failure(&[&worker], None)]);
    assert!(replace.contains(&worker), "{replace:?}");
    assert!(
        replace.iter().any(|a| a == "module.qwen.container.vllm"),
        "a replaced Ray worker replaces the driver that lost it: {replace:?}"
    );
}

#[test]
fn an_unreachable_node_restarts_nothing() {
    let (c, g) = example("testbed-mp");
    let mut f = failure(&["module.qwen.container.rank0"], None);
    f.restartable = false;
    let (replace, targets) = restart_set(&c, &g, &[f]);
    assert!(replace.is_empty() && targets.is_empty());
}

#[test]
fn behind_a_router_a_wedged_replica_restarts_alone() {
    let (c, g) = example("testbed-replicas");
    // Its own probe failed: that replica's engine, nothing of the other one or the router.
    let (replace, targets) = restart_set(
        &c,
        &g,
        &[failure(&[], Some("module.qwen.probe.direct[\"node1\"]"))],
    );
    assert_eq!(replace, ["module.qwen.container.engine[\"node1\"]"]);
    assert!(
        !targets.iter().any(|t| t.contains("\"node2\"")),
        "{targets:?}"
    );
    // A wedge in its log: the same.
    let (replace, _) = restart_set(
        &c,
        &g,
        &[failure(&["module.qwen.container.engine[\"node2\"]"], None)],
    );
    assert_eq!(replace, ["module.qwen.container.engine[\"node2\"]"]);
}

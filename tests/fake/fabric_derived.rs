//! The fabric's facts, derived and not pinned (pure): the RDMA ports on the fabric and the RoCE
//! v2 GID index of each node's fabric address, as the attachment kind's plan-time read hands
//! them to the evaluation (`Readings.kinds`), reach NCCL through the modules (`NCCL_IB_HCA`,
//! `NCCL_IB_GID_INDEX`) per node; a moved index replaces what runs on that node only, showing
//! the old and the new index; a declared value that differs from the facts is a warning naming
//! both.

use sparkform::vocabulary::KindId;
use std::path::Path;

use sparkform::config::{self, Config, Readings};
use sparkform::graph::Graph;
use sparkform::plan::{self, Action};
use sparkform::state::State;

const SEED: &str = "examples/qwen35-two-sparks";
const LAUNCHERS: &str = "tests/fixtures/launchers/both";

/// What the attachment kind's read gives: by node, (GID index, ports).
fn fabric(nodes: &[(&str, Option<u32>, &[&str])]) -> Readings {
    let mut o = Readings::default();
    for (node, gid, ports) in nodes {
        let mut v = serde_json::json!({ "ports": ports });
        if let Some(g) = gid {
            v["gid_index"] = serde_json::json!(g);
        }
        o.kinds.insert(format!("network.roce.attach.{node}"), v);
    }
    o
}

fn load(dir: &str, vars: &[(&str, &str)], seen: &Readings) -> Config {
    match config::load_with_readings(Path::new(dir), &crate::common::var_inputs(vars), seen) {
        Ok(c) => c,
        Err(d) => panic!("{}", sparkform::diag::render_plain(&d.0)),
    }
}

/// Every container's environment, by address, with its node.
fn envs(c: &Config) -> Vec<(String, String, serde_json::Value)> {
    c.resources
        .iter()
        .filter(|r| r.kind == KindId::Container)
        .map(|r| {
            (
                r.address.clone(),
                r.node.clone().unwrap_or_default(),
                r.config["env"].clone(),
            )
        })
        .collect()
}

const TWINS: &[&str] = &["roceP2p1s0f0:1", "rocep1s0f0:1"];
/// The seed example's vLLM driver, on spark1 beside the Ray head.
const RAY_DRIVER: &str = "module.qwen.container.vllm";

#[test]
fn each_node_tells_nccl_its_own_gid_index_and_every_port_on_the_fabric() {
    let c = load(
        SEED,
        &[],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", Some(5), TWINS)]),
    );
    let all = envs(&c);
    assert!(all.len() >= 3, "{all:?}");
    for (address, node, env) in &all {
        if address == RAY_DRIVER {
            // vLLM copies every NCCL_ variable of the driver to every Ray worker: a node's own
            // index there would overwrite the other node's.
            assert!(env.get("NCCL_IB_GID_INDEX").is_none(), "{env}");
            assert!(env.get("NCCL_IB_HCA").is_none(), "{env}");
            continue;
        }
        let gid = if node == "node.spark1" { "3" } else { "5" };
        assert_eq!(env["NCCL_IB_GID_INDEX"], gid, "{address} on {node}");
        assert_eq!(
            env["NCCL_IB_HCA"], "=roceP2p1s0f0:1,rocep1s0f0:1",
            "{address}"
        );
    }
    // Not read (no RDMA device on the fabric, or -refresh=false without a record): NCCL finds
    // them itself, as before.
    for (address, _, env) in envs(&load(SEED, &[], &Readings::default())) {
        assert!(env.get("NCCL_IB_GID_INDEX").is_none(), "{address}: {env}");
        assert!(env.get("NCCL_IB_HCA").is_none(), "{address}: {env}");
    }
    // A GID not known yet leaves the index to NCCL on that node only.
    let c = load(
        SEED,
        &[],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", None, TWINS)]),
    );
    for (address, node, env) in envs(&c) {
        assert_eq!(
            env.get("NCCL_IB_GID_INDEX").is_some(),
            node == "node.spark1" && address != RAY_DRIVER,
            "{address}: {env}"
        );
    }
    // Without rdma nothing of it is set.
    let c = load(
        LAUNCHERS,
        &[("rdma", "false")],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", Some(3), TWINS)]),
    );
    for (address, _, env) in envs(&c) {
        assert!(env.get("NCCL_IB_GID_INDEX").is_none(), "{address}: {env}");
    }
}

/// The state an apply of `c` would leave: every change recorded as planned.
fn applied(c: &Config) -> State {
    let mut state = State::new();
    plan::record(&plan_of(c, &state), &mut state);
    state
}

fn plan_of(c: &Config, state: &State) -> plan::Plan {
    crate::common::plan(c, &Graph::build(c).unwrap(), state)
}

#[test]
fn a_moved_gid_index_replaces_what_runs_on_that_node_only_and_shows_both_indexes() {
    let before = load(
        SEED,
        &[],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", Some(3), TWINS)]),
    );
    let state = applied(&before);
    let again = plan_of(&before, &state);
    assert!(
        again.changes.iter().all(|c| c.action == Action::NoOp),
        "{}",
        plan::render::render(&again)
    );

    // spark2 rebooted and its fabric address's GID is at 4 now.
    let after = load(
        SEED,
        &[],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", Some(4), TWINS)]),
    );
    let p = plan_of(&after, &state);
    let action = |address: &str| {
        p.changes
            .iter()
            .find(|c| c.address == address)
            .map(|c| c.action)
            .unwrap_or_else(|| panic!("no {address}"))
    };
    let on = |node: &str| -> Vec<String> {
        envs(&after)
            .into_iter()
            .filter(|(_, n, _)| n == node)
            .map(|(a, _, _)| a)
            .collect()
    };
    for address in on("node.spark2") {
        assert_eq!(action(&address), Action::Replace, "{address}");
    }
    assert_eq!(action("network.roce.attach.spark2"), Action::Update);
    assert_eq!(action("network.roce.attach.spark1"), Action::NoOp);
    // The Ray head on spark1 keeps running (what it runs did not change).
    assert_eq!(
        action("module.qwen.module.ray.container.ray_head"),
        Action::NoOp
    );
    let text = plan::render::render(&p);
    assert!(
        text.contains("NCCL_IB_GID_INDEX") && text.contains("\"3\"") && text.contains("\"4\""),
        "{text}"
    );
}

fn warnings(c: &Config) -> Vec<String> {
    c.warnings.iter().map(|w| w.message.clone()).collect()
}

#[test]
fn a_declared_value_that_differs_from_the_facts_is_a_warning_naming_both() {
    // The fixture declares nccl_ib_hca = "rocep1s0f0,roceP2p1s0f0" for both launchers.
    let agree = load(
        LAUNCHERS,
        &[],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", Some(3), TWINS)]),
    );
    assert!(
        !warnings(&agree).iter().any(|m| m.contains("nccl_ib_hca")),
        "{:?}",
        warnings(&agree)
    );
    let one_port = load(
        LAUNCHERS,
        &[],
        &fabric(&[
            ("spark1", Some(3), TWINS),
            ("spark2", Some(3), &["rocep1s0f0:1"]),
        ]),
    );
    let w: Vec<String> = warnings(&one_port)
        .into_iter()
        .filter(|m| m.contains("nccl_ib_hca"))
        .collect();
    // One from each launcher's fabric.
    assert_eq!(w.len(), 2, "{:?}", warnings(&one_port));
    assert!(
        w[0].contains("nccl_ib_hca = \"rocep1s0f0,roceP2p1s0f0\"")
            && w[0].contains("spark2 has rocep1s0f0")
            && !w[0].contains("spark1 has"),
        "{}",
        w[0]
    );
    // The declared value stands.
    for (address, _, env) in envs(&one_port) {
        assert_eq!(env["NCCL_IB_HCA"], "rocep1s0f0,roceP2p1s0f0", "{address}");
    }

    let pinned = load(
        LAUNCHERS,
        &[("extra_env", "{ NCCL_IB_GID_INDEX = \"3\" }")],
        &fabric(&[("spark1", Some(3), TWINS), ("spark2", Some(4), TWINS)]),
    );
    let w: Vec<String> = warnings(&pinned)
        .into_iter()
        .filter(|m| m.contains("this plan read the RoCE v2 GID"))
        .collect();
    assert_eq!(w.len(), 2, "{:?}", warnings(&pinned));
    assert!(
        w[0].contains("pins NCCL_IB_GID_INDEX=3") && w[0].contains("as 4 on spark2"),
        "{}",
        w[0]
    );
    assert!(!w[0].contains("on spark1"), "{}", w[0]);
    for (address, _, env) in envs(&pinned) {
        assert_eq!(env["NCCL_IB_GID_INDEX"], "3", "{address}: extra_env wins");
    }
}

//! Property tests: re-planning after recording a plan finds nothing to do, whatever the
//! configuration and whatever state came before; the loader never panics on any input.

use crate::common;

use proptest::prelude::*;
use sparkform::config::{self, VarInputs};
use sparkform::graph::Graph;
use sparkform::plan::{self, PlanOptions};
use sparkform::state::State;

/// A container: its node, image, env pairs, and whether it reads its node's fabric address.
type ContainerSpec = (usize, String, Vec<(String, String)>, bool);

#[derive(Debug, Clone)]
struct Spec {
    nodes: usize,
    mtu: u32,
    containers: Vec<ContainerSpec>,
    probe: bool,
    secret: Option<String>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (1usize..5, prop_oneof![Just(1500u32), Just(9000u32)])
        .prop_flat_map(|(nodes, mtu)| {
            let container = (
                0..nodes,
                "[a-z]{1,6}:[0-9]{1,2}",
                proptest::collection::vec(("[A-Z]{1,4}", "[ -~]{0,12}"), 0..3),
                any::<bool>(),
            );
            (
                Just(nodes),
                Just(mtu),
                proptest::collection::vec(container, 0..6),
                any::<bool>(),
                proptest::option::of("[a-z0-9]{4,10}"),
            )
        })
        .prop_map(|(nodes, mtu, containers, probe, secret)| Spec {
            nodes,
            mtu,
            containers,
            probe,
            secret,
        })
}

fn hcl_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '$' => out.push_str("$$"),
            '%' => out.push_str("%%"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn render(spec: &Spec) -> String {
    let mut s = String::new();
    if let Some(secret) = &spec.secret {
        s.push_str(&format!(
            "variable \"token\" {{\n  type = string\n  default = {}\n  sensitive = true\n}}\n",
            hcl_string(secret)
        ));
    }
    for n in 0..spec.nodes {
        s.push_str(&format!(
            "node \"n{n}\" {{\n  address = \"10.0.0.{}\"\n}}\n",
            n + 1
        ));
    }
    s.push_str(&format!(
        "network \"fab\" {{\n  subnet = \"192.168.9.0/24\"\n  mtu = {}\n",
        spec.mtu
    ));
    for n in 0..spec.nodes {
        s.push_str(&format!(
            "  attach \"n{n}\" {{\n    node = node.n{n}\n    interface = \"eth1\"\n    address = \"192.168.9.{}\"\n  }}\n",
            n + 1
        ));
    }
    s.push_str("}\n");
    for (i, (node, image, env, with_ip)) in spec.containers.iter().enumerate() {
        // Object keys must be unique in HCL: keep the first of each.
        let mut seen = std::collections::BTreeSet::new();
        let mut env_items: Vec<String> = env
            .iter()
            .filter(|(k, _)| seen.insert(k.clone()) && k != "IP" && k != "TOKEN")
            .map(|(k, v)| format!("{k} = {}", hcl_string(v)))
            .collect();
        if *with_ip {
            env_items.push(format!("IP = network.fab.attach.n{node}.address"));
        }
        if spec.secret.is_some() && i == 0 {
            env_items.push("TOKEN = var.token".into());
        }
        s.push_str(&format!(
            "container \"c{i}\" {{\n  node = node.n{node}\n  image = {}\n  env = {{ {} }}\n}}\n",
            hcl_string(image),
            env_items.join(", ")
        ));
    }
    if spec.probe {
        s.push_str(
            "probe \"p\" {\n  tcp {\n    via = node.n0\n    address = \"127.0.0.1:80\"\n  }\n}\n",
        );
    }
    s
}

fn load(text: &str) -> (sparkform::config::Config, Graph, tempfile::TempDir) {
    let dir = common::write_config(&[("main.hcl", text)]);
    let c = config::load(dir.path(), &VarInputs::default())
        .unwrap_or_else(|d| panic!("{}\n{}", text, sparkform::diag::render_plain(&d.0)));
    let g = Graph::build(&c).expect("graph");
    (c, g, dir)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn recorded_plan_replans_to_no_changes(before in spec(), after in spec()) {
        let mut state = State::new();
        let (c1, g1, _d1) = load(&render(&before));
        plan::record(&plan::plan(&c1, &g1, &state, &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))).unwrap(), &mut state);
        let (c2, g2, _d2) = load(&render(&after));
        let p = plan::plan(&c2, &g2, &state, &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))).unwrap();
        plan::record(&p, &mut state);
        let again = plan::plan(&c2, &g2, &state, &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))).unwrap();
        prop_assert!(!again.has_changes(), "{}", plan::render::render(&again));
        // Every resource of the configuration is recorded, and nothing else.
        let recorded: Vec<&String> = state.resources.keys().collect();
        let mut desired: Vec<&String> = c2.resources.iter().map(|r| &r.address).collect();
        desired.sort();
        prop_assert_eq!(recorded, desired);
        if let Some(secret) = &after.secret {
            let text = serde_json::to_string(&state).unwrap();
            let quoted = format!("\"{}\"", secret);
            prop_assert!(!text.contains(&quoted), "secret stored in clear");
        }
    }

    #[test]
    fn loader_never_panics_on_random_text(text in "[ -~\\n\\t{}\\[\\]()\"$%=]{0,300}") {
        let dir = common::write_config(&[("main.hcl", &text)]);
        let _ = config::load(dir.path(), &VarInputs::default());
    }

    #[test]
    fn loader_never_panics_on_mutated_config(
        seed in spec(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..4, "[ -~]{0,3}"), 1..6),
    ) {
        let mut text = render(&seed).into_bytes();
        for (at, op, insert) in edits {
            if text.is_empty() { break; }
            let i = at.index(text.len());
            match op {
                0 => { text.remove(i); }
                1 => { text.splice(i..i, insert.bytes()); }
                2 => { text.truncate(i); }
                _ => { let j = (i + 7).min(text.len()); text.drain(i..j); }
            }
        }
        let text = String::from_utf8_lossy(&text).to_string();
        let dir = common::write_config(&[("main.hcl", &text)]);
        match config::load(dir.path(), &VarInputs::default()) {
            Ok(c) => { let _ = Graph::build(&c); }
            Err(d) => prop_assert!(d.has_errors()),
        }
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let text = format!(
        "locals {{\n  x = {}1{}\n}}\n",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let dir = common::write_config(&[("main.hcl", &text)]);
    let err = config::load(dir.path(), &VarInputs::default()).unwrap_err();
    assert!(err.0[0].message.contains("nested"), "{}", err.0[0].message);
}

#[test]
fn binary_and_empty_input_are_errors() {
    let dir = common::write_config(&[("main.hcl", "")]);
    // An empty file is a valid, empty configuration.
    assert!(config::load(dir.path(), &VarInputs::default()).is_ok());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), [0xff, 0xfe, 0x00, 0x41]).unwrap();
    let err = config::load(dir.path(), &VarInputs::default()).unwrap_err();
    assert!(err.0[0].message.contains("not UTF-8"));
    let empty = tempfile::tempdir().unwrap();
    let err = config::load(empty.path(), &VarInputs::default()).unwrap_err();
    assert!(err.0[0].message.contains("no .hcl files"));
}

//! Plan output for create, update, replace, delete and no-op, against snapshots.

use crate::common;

use sparkform::config::VarInputs;
use sparkform::plan::{self, render, Action, PlanOptions};

fn vars(pairs: &[(&str, &str)]) -> VarInputs {
    VarInputs {
        cli: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..VarInputs::default()
    }
}

/// Apply the fixture with `before` vars, then plan with `after` vars.
fn plan_change(before: &[(&str, &str)], after: &[(&str, &str)]) -> plan::Plan {
    let dir = common::fixture("plan/cluster");
    let (c, g) = common::load_with(&dir, &vars(before));
    let mut state = sparkform::state::State::new();
    let p = common::plan(&c, &g, &state);
    plan::record(&p, &mut state);
    let (c2, g2) = common::load_with(&dir, &vars(after));
    common::plan(&c2, &g2, &state)
}

fn actions(p: &plan::Plan) -> Vec<(String, Action)> {
    p.changes
        .iter()
        .filter(|c| c.action.is_change())
        .map(|c| (c.address.clone(), c.action))
        .collect()
}

#[test]
fn create_from_empty() {
    let p = plan_change(&[], &[]);
    let p = {
        let dir = common::fixture("plan/cluster");
        let (c, g) = common::load(&dir);
        let _ = p;
        common::plan(&c, &g, &sparkform::state::State::new())
    };
    let out = render::render(&p);
    assert!(
        !out.contains("hf_plan_fixture_secret"),
        "secret printed:\n{out}"
    );
    assert_eq!(p.summary.create, 7);
    assert_eq!(p.summary.run, 2);
    insta::assert_snapshot!("plan_create", out);
}

#[test]
fn no_op_after_apply() {
    let p = plan_change(&[], &[]);
    assert!(!p.has_changes(), "{}", render::render(&p));
    insta::assert_snapshot!("plan_noop", render::render(&p));
}

#[test]
fn update_in_place() {
    let p = plan_change(&[], &[("restart", "always"), ("mtu", "8000")]);
    let a = actions(&p);
    assert!(
        a.contains(&("container.head".into(), Action::Update)),
        "{a:?}"
    );
    assert!(
        a.contains(&("network.fabric.attach.n2".into(), Action::Update)),
        "{a:?}"
    );
    assert!(!a.iter().any(|(_, act)| *act == Action::Replace), "{a:?}");
    insta::assert_snapshot!("plan_update", render::render(&p));
}

#[test]
fn replace_names_the_forcing_attribute_and_triggers() {
    let p = plan_change(&[], &[("ray_image", "ray:2.61")]);
    let head = p.change("container.head").expect("head");
    assert_eq!(head.action, Action::Replace);
    assert_eq!(head.replace_reasons, vec!["`image` changes".to_string()]);
    // vLLM did not change, but replace_triggered_by the head replaces it too.
    let vllm = p.change("container.vllm").expect("vllm");
    assert_eq!(vllm.action, Action::Replace);
    assert!(
        vllm.replace_reasons[0].contains("replace_triggered_by"),
        "{:?}",
        vllm.replace_reasons
    );
    assert_eq!(p.change("probe.hello").map(|c| c.action), Some(Action::Run));
    insta::assert_snapshot!("plan_replace", render::render(&p));
}

#[test]
fn changing_one_vllm_flag_replaces_only_vllm() {
    let p = plan_change(&[], &[("vllm_flags", r#"["--max-model-len", "4096"]"#)]);
    let changed: Vec<_> = actions(&p)
        .into_iter()
        .filter(|(_, a)| *a != Action::Run)
        .collect();
    assert_eq!(
        changed,
        vec![("container.vllm".to_string(), Action::Replace)]
    );
    assert_eq!(p.change("probe.hello").map(|c| c.action), Some(Action::Run));
    assert_eq!(
        p.change("probe.members").map(|c| c.action),
        Some(Action::NoOp)
    );
}

#[test]
fn delete_a_worker() {
    let p = plan_change(&[], &[("workers", r#"["n2"]"#)]);
    let a = actions(&p);
    assert_eq!(
        a[0],
        ("container.worker[\"n3\"]".into(), Action::Delete),
        "{a:?}"
    );
    assert_eq!(p.summary.delete, 1);
    insta::assert_snapshot!("plan_delete", render::render(&p));
}

#[test]
fn sensitive_change_shows_no_value() {
    let dir = common::fixture("plan/cluster");
    let mut before = VarInputs::default();
    before
        .cli
        .push(("hf_token".into(), "hf_first_secret".into()));
    let (c, g) = common::load_with(&dir, &before);
    let mut state = sparkform::state::State::new();
    plan::record(&common::plan(&c, &g, &state), &mut state);
    let stored = serde_json::to_string(&state).unwrap();
    assert!(
        !stored.contains("hf_first_secret"),
        "secret in state: {stored}"
    );
    let mut after = VarInputs::default();
    after
        .cli
        .push(("hf_token".into(), "hf_second_secret".into()));
    let (c2, g2) = common::load_with(&dir, &after);
    let p = common::plan(&c2, &g2, &state);
    let out = render::render(&p);
    assert!(
        out.contains("~ HF_TOKEN = (sensitive) → (sensitive)"),
        "{out}"
    );
    assert!(
        !out.contains("hf_second_secret") && !out.contains("hf_first_secret"),
        "{out}"
    );
    let json = serde_json::to_string(&p).unwrap();
    assert!(!json.contains("hf_second_secret"), "secret in JSON plan");
}

#[test]
fn replace_option_and_unknown_address() {
    let dir = common::fixture("plan/cluster");
    let (c, g) = common::load(&dir);
    let state = common::applied(&dir);
    let opts = PlanOptions {
        replace: vec!["container.worker[\"n2\"]".into()],
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let p = plan::plan(&c, &g, &state, &opts).unwrap();
    assert_eq!(
        p.change("container.worker[\"n2\"]").unwrap().action,
        Action::Replace
    );
    assert_eq!(
        p.change("container.worker[\"n3\"]").unwrap().action,
        Action::NoOp
    );
    let bad = PlanOptions {
        replace: vec!["container.wroker".into()],
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let err = plan::plan(&c, &g, &state, &bad).unwrap_err();
    assert!(err.message.contains("no such resource"), "{}", err.message);
}

#[test]
fn seed_example_plans_in_dependency_order() {
    let (c, g) = common::load_resolved(std::path::Path::new("examples/qwen35-two-sparks"));
    let p = common::plan(&c, &g, &sparkform::state::State::new());
    let order: Vec<&str> = p.changes.iter().map(|c| c.address.as_str()).collect();
    assert_eq!(
        order,
        [
            "network.roce.attach.spark1",
            "network.roce.attach.spark2",
            "model.qwen[\"spark1\"]",
            "model.qwen[\"spark2\"]",
            "module.qwen.module.ray.container.ray_head",
            "module.qwen.module.ray.container.ray_worker[\"spark2\"]",
            "module.qwen.module.ray.probe.ray_members",
            "module.qwen.container.vllm",
            "probe.hello",
        ]
    );
}

//! How plans read: expanded values, what changed inside lists, maps and objects, heredocs,
//! secrets, the impact section with durations from the state, and `-exclude`.

use crate::common;

use sparkform::config::VarInputs;
use sparkform::plan::impact::Impact;
use sparkform::plan::{self, render, Action, Plan, PlanOptions};
use sparkform::state::State;

fn vars(pairs: &[(&str, &str)]) -> VarInputs {
    VarInputs {
        cli: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..VarInputs::default()
    }
}

const STACK: &str = "render/stack";

fn impact(p: &Plan) -> &Impact {
    p.impact.as_ref().expect("a fresh plan has an impact")
}

/// The state an apply of `dir` with `before` leaves, each step having taken the given seconds.
fn applied(dir: &std::path::Path, before: &[(&str, &str)], secs: &[(&str, f64)]) -> State {
    let (c, g) = common::load_with(dir, &vars(before));
    let mut state = State::new();
    plan::record(&common::plan(&c, &g, &state), &mut state);
    for (address, s) in secs {
        state
            .resources
            .get_mut(*address)
            .unwrap_or_else(|| panic!("{address} not in the state"))
            .last_apply_secs = Some(*s);
    }
    state
}

fn plan_with(
    dir: &std::path::Path,
    after: &[(&str, &str)],
    state: &State,
    opts: &PlanOptions,
) -> Plan {
    let (c, g) = common::load_with(dir, &vars(after));
    plan::plan(&c, &g, state, opts).expect("plan")
}

/// Apply the stack with `before`, then plan it with `after`.
fn stack_change(before: &[(&str, &str)], after: &[(&str, &str)], secs: &[(&str, f64)]) -> Plan {
    let dir = common::fixture(STACK);
    let state = applied(&dir, before, secs);
    plan_with(
        &dir,
        after,
        &state,
        &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
    )
}

/// Apply examples/testbed-standin with `before`, then plan it with `after`.
fn testbed_change(before: &[(&str, &str)], after: &[(&str, &str)]) -> Plan {
    let dir = std::path::Path::new("examples/testbed-standin");
    let state = applied(dir, before, &[]);
    plan_with(
        dir,
        after,
        &state,
        &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
    )
}

#[test]
fn a_changed_argument_in_a_long_command_list() {
    let p = stack_change(&[], &[("max_model_len", "4096")], &[]);
    let out = render::render(&p);
    assert!(
        out.contains(
            "            \"--max-model-len\",\n          - \"8192\",\n          + \"4096\",\n"
        ),
        "{out}"
    );
    assert!(out.contains("# (17 unchanged elements hidden)"), "{out}");
    assert!(
        out.contains("~ command = [   # forces replacement"),
        "{out}"
    );
    assert!(!out.contains('…'), "{out}");
    insta::assert_snapshot!("render_long_command_list", out);
}

#[test]
fn a_changed_env_entry_shows_only_that_key() {
    let p = stack_change(&[], &[("nccl_debug", "INFO")], &[]);
    let out = render::render(&p);
    let vllm = p.change("container.vllm").expect("vllm");
    assert_eq!(vllm.action, Action::Replace);
    assert!(out.contains("~ NCCL_DEBUG = \"WARN\" → \"INFO\""), "{out}");
    // The vLLM container's env has 7 entries: 6 shown as a count.
    assert!(out.contains("# (6 unchanged elements hidden)"), "{out}");
    assert!(!out.contains("GLOO_SOCKET_IFNAME"), "{out}");
    insta::assert_snapshot!("render_env_entry", out);
}

#[test]
fn a_replaced_head_restarts_its_dependents_and_says_for_how_long() {
    let secs = [
        ("container.ray_head", 4.0),
        ("container.ray_worker[\"n2\"]", 3.0),
        ("probe.ray_members", 5.5),
        ("container.vllm", 40.0),
        ("probe.hello", 1.5),
    ];
    let p = stack_change(&[], &[("ray_image", "ray:2.61")], &secs);
    let replaced: Vec<&str> = impact(&p)
        .stopped
        .iter()
        .map(|s| s.address.as_str())
        .collect();
    assert_eq!(
        replaced,
        [
            "container.ray_head",
            "container.ray_worker[\"n2\"]",
            "container.vllm"
        ]
    );
    assert_eq!(impact(&p).stopped[0].expected_secs, Some(4.0));
    let hello = impact(&p)
        .unavailable
        .iter()
        .find(|o| o.until.as_deref() == Some("probe.hello"))
        .expect("an outage ended by probe.hello");
    assert_eq!(hello.endpoints, ["output.endpoint", "probe.hello"]);
    assert_eq!(hello.from_step, 1);
    // head 4 → worker 3 → members 5.5 → vllm 40 → hello 1.5.
    assert_eq!(hello.expected_secs, Some(54.0));
    assert_eq!(impact(&p).outage_secs, Some(54.0));
    // warmup only waits for vLLM (no replace_triggered_by): it keeps running.
    assert_eq!(impact(&p).keeps_running.len(), 1);
    assert_eq!(impact(&p).keeps_running[0].address, "container.warmup");
    insta::assert_snapshot!("render_replaced_head", render::render(&p));
}

#[test]
fn a_vllm_flag_change_keeps_ray_running_and_takes_the_recorded_time() {
    let secs = [("container.vllm", 42.0), ("probe.hello", 1.5)];
    let p = stack_change(&[], &[("max_model_len", "4096")], &secs);
    let running: Vec<&str> = impact(&p)
        .keeps_running
        .iter()
        .map(|r| r.address.as_str())
        .collect();
    assert_eq!(
        running,
        [
            "container.ray_head",
            "container.ray_worker[\"n2\"]",
            "container.warmup"
        ]
    );
    assert_eq!(impact(&p).outage_secs, Some(43.5));
    assert_eq!(impact(&p).apply_secs, Some(43.5));
    let out = render::render(&p);
    assert!(
        out.contains("is stopped and replaced (expected 42.0 s)"),
        "{out}"
    );
    assert!(out.contains("Expected outage: 43.5 s"), "{out}");
    insta::assert_snapshot!("render_impact_vllm_flag", out);
}

#[test]
fn without_recorded_durations_the_outage_is_unknown() {
    let p = stack_change(
        &[],
        &[("max_model_len", "4096")],
        &[("container.vllm", 42.0)],
    );
    assert_eq!(impact(&p).outage_secs, None);
    assert_eq!(impact(&p).apply_secs, None);
    let out = render::render(&p);
    assert!(
        out.contains("Expected outage: unknown") && !out.contains("Expected apply"),
        "{out}"
    );
}

#[test]
fn new_things_and_probe_runs_are_no_disruption() {
    let p = stack_change(&[], &[("workers", r#"["n2", "n3"]"#)], &[]);
    assert_eq!(
        p.change("container.ray_worker[\"n3\"]").map(|c| c.action),
        Some(Action::Create)
    );
    assert_eq!(
        p.change("probe.ray_members").map(|c| c.action),
        Some(Action::Run)
    );
    assert!(!impact(&p).is_disruptive(), "{:?}", p.impact);
    let out = render::render(&p);
    assert!(out.contains("Impact: no disruption"), "{out}");
    insta::assert_snapshot!("render_no_disruption", out);
}

#[test]
fn strings_with_newlines_are_heredocs_and_change_line_by_line() {
    let dir = common::fixture(STACK);
    let (c, g) = common::load(&dir);
    let created = render::render(&common::plan(&c, &g, &State::new()));
    assert!(
        created.contains(
            "          + <<-EOT\n                set -e\n                echo warming up\n"
        ),
        "{created}"
    );
    let p = stack_change(
        &[],
        &[(
            "warmup",
            "set -e\necho warming up twice\ncurl -sf http://127.0.0.1:8000/health\n",
        )],
        &[],
    );
    let out = render::render(&p);
    assert!(out.contains("- echo warming up\n"), "{out}");
    assert!(out.contains("+ echo warming up twice\n"), "{out}");
    insta::assert_snapshot!("render_heredoc", out);
}

#[test]
fn a_secret_inside_a_map_hides_only_that_entry() {
    let dir = common::fixture(STACK);
    let (c, g) = common::load(&dir);
    let created = render::render(&common::plan(&c, &g, &State::new()));
    assert!(!created.contains("hf_render_fixture_secret"), "{created}");
    assert!(
        created.contains("+ HF_TOKEN           = (sensitive)"),
        "{created}"
    );
    assert!(
        created.contains("+ NCCL_SOCKET_IFNAME = \"enp1s0f0np0\""),
        "{created}"
    );
    let p = stack_change(&[], &[("hf_token", "hf_other_secret")], &[]);
    let out = render::render(&p);
    assert!(!out.contains("hf_other_secret") && !out.contains("hf_render_fixture_secret"));
    assert!(
        out.contains("~ HF_TOKEN = (sensitive) → (sensitive)"),
        "{out}"
    );
    insta::assert_snapshot!("render_sensitive_in_map", out);
}

#[test]
fn a_created_resource_shows_its_nested_values_in_full() {
    let dir = common::fixture(STACK);
    let (c, g) = common::load(&dir);
    let p = common::plan(&c, &g, &State::new());
    let out = render::render(&p);
    for line in [
        "          + json   = {",
        "              + messages   = [",
        "                  + {",
        "                      + content = \"hi\"",
        "      + ready        = [",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    insta::assert_snapshot!("render_create_nested", out);
}

#[test]
fn a_ready_block_change_shows_the_changed_attribute_only() {
    let p = stack_change(&[], &[("ready_timeout", "30m")], &[]);
    assert_eq!(
        p.change("container.vllm").map(|c| c.action),
        Some(Action::Update)
    );
    let out = render::render(&p);
    assert!(out.contains("~ timeout = 900 → 1800"), "{out}");
    assert!(out.contains("# (2 unchanged attributes hidden)"), "{out}");
    assert!(out.contains("Impact: no disruption"), "{out}");
}

#[test]
fn the_testbed_example_shows_the_vllm_flag() {
    let p = testbed_change(&[], &[("max_model_len", "4096")]);
    let out = render::render(&p);
    assert!(
        out.contains("- \"8192\",\n") && out.contains("+ \"4096\",\n"),
        "{out}"
    );
    let running: Vec<&str> = impact(&p)
        .keeps_running
        .iter()
        .map(|r| r.address.as_str())
        .collect();
    assert_eq!(
        running,
        [
            "module.qwen.module.ray.container.ray_head",
            "module.qwen.module.ray.container.ray_worker[\"node2\"]"
        ]
    );
    insta::assert_snapshot!("render_testbed_vllm_flag", out);
}

#[test]
fn exclude_leaves_out_the_resource_and_its_dependents() {
    let dir = common::fixture(STACK);
    let state = applied(&dir, &[], &[]);
    let opts = PlanOptions {
        exclude: vec!["container.vllm".into()],
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let p = plan_with(
        &dir,
        &[("ray_image", "ray:2.61"), ("max_model_len", "4096")],
        &state,
        &opts,
    );
    assert_eq!(
        p.excluded,
        ["container.vllm", "container.warmup", "probe.hello"]
    );
    for a in &p.excluded {
        assert!(p.change(a).is_none(), "{a} planned although excluded");
    }
    // The output shows vLLM: it keeps its recorded value.
    assert!(
        p.outputs.iter().all(|o| o.name != "endpoint"),
        "{:?}",
        p.outputs
    );
    assert_eq!(
        p.change("container.ray_head").map(|c| c.action),
        Some(Action::Replace)
    );
    let out = render::render(&p);
    assert!(
        out.contains("Excluded with -exclude (and what depends on it), left as they are:\n    container.vllm\n"),
        "{out}"
    );
    // Excluding a resource the configuration dropped keeps it, and what the state says
    // depends on it, out of the deletions.
    let (c, g) = common::load_with(&dir, &vars(&[("workers", "[]")]));
    let opts = PlanOptions {
        exclude: vec!["container.ray_worker[\"n2\"]".into()],
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let p = plan::plan(&c, &g, &state, &opts).expect("plan");
    assert!(p.change("container.ray_worker[\"n2\"]").is_none());
    assert_eq!(p.summary.delete, 0);
    let bad = PlanOptions {
        exclude: vec!["container.vlm".into()],
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let err = plan::plan(&c, &g, &state, &bad).unwrap_err();
    assert!(
        err.message.contains("-exclude container.vlm"),
        "{}",
        err.message
    );
    assert_eq!(err.help.as_deref(), Some("did you mean container.vllm?"));
}

#[test]
fn plans_and_states_written_before_impact_and_durations_still_load() {
    let dir = common::fixture(STACK);
    let state = applied(&dir, &[], &[("container.vllm", 42.0)]);
    let p = plan_with(
        &dir,
        &[("max_model_len", "4096")],
        &state,
        &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
    );
    let mut doc = serde_json::to_value(&p).expect("plan to JSON");
    assert!(doc["impact"]["stopped"].is_array(), "{doc}");
    doc.as_object_mut().expect("object").remove("impact");
    let old: Plan = serde_json::from_value(doc).expect("a plan without impact loads");
    assert!(old.impact.is_none(), "an old plan claims an impact");
    assert!(!render::render(&old).contains("Impact"));
    let mut doc = serde_json::to_value(&state).expect("state to JSON");
    assert_eq!(doc["resources"]["container.vllm"]["last_apply_secs"], 42.0);
    for r in doc["resources"]
        .as_object_mut()
        .expect("resources")
        .values_mut()
    {
        r.as_object_mut()
            .expect("resource")
            .remove("last_apply_secs");
    }
    let old: State = serde_json::from_value(doc).expect("a state without durations loads");
    assert!(old.resources.values().all(|r| r.last_apply_secs.is_none()));
}

#[test]
fn plan_and_show_print_the_same_expanded_plan_with_exclude_and_json_impact() {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let plan_file = out_dir.path().join("stack.plan");
    let dir = common::fixture(STACK);
    let run = |args: &[&str]| {
        let o = assert_cmd::Command::cargo_bin("sparkform")
            .expect("binary")
            .args(args)
            .output()
            .expect("run");
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let dir_arg = dir.to_str().expect("utf-8 path");
    let file_arg = plan_file.to_str().expect("utf-8 path");
    let text = run(&[
        "plan",
        dir_arg,
        "-refresh=false",
        "-exclude",
        "container.warmup",
        "-out",
        file_arg,
    ]);
    assert!(text.contains("Excluded with -exclude (and what depends on it), left as they are:\n    container.warmup\n"), "{text}");
    assert!(!text.contains("+ container.warmup"), "{text}");
    assert!(
        text.contains("          + \"--max-model-len\",\n"),
        "{text}"
    );
    let shown = run(&["show", file_arg]);
    let plan_text = text.split("\nSaved the plan").next().unwrap_or_default();
    assert!(
        shown.ends_with(plan_text),
        "show:\n{shown}\nplan:\n{plan_text}"
    );
    let json = run(&[
        "plan",
        dir_arg,
        "-refresh=false",
        "-exclude",
        "container.warmup",
        "--json",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&json).expect("JSON plan");
    assert_eq!(
        doc["plan"]["excluded"],
        serde_json::json!(["container.warmup"])
    );
    assert_eq!(doc["plan"]["impact"]["stopped"], serde_json::json!([]));
}

#[test]
fn a_moved_fabric_address_and_an_untracked_container_are_disruptions() {
    let dir = common::fixture(STACK);
    let state = applied(&dir, &[], &[]);
    let opts = PlanOptions {
        observations: Some(plan::Observations {
            orphans: vec![plan::Orphan {
                kind: sparkform::vocabulary::KindId::Container,
                address: "container.old_vllm".into(),
                node: "node.n1".into(),
                name: "sparkform-old-vllm".into(),
                id: "0123456789abcdef".into(),
                running: true,
            }],
            ..plan::Observations::default()
        }),
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let p = plan_with(&dir, &[("n2_interface", "enp1s0f1np1")], &state, &opts);
    let stopped: Vec<(&str, Action)> = impact(&p)
        .stopped
        .iter()
        .map(|s| (s.address.as_str(), s.action))
        .collect();
    assert_eq!(
        stopped,
        [
            ("container.old_vllm", Action::Delete),
            ("network.fabric.attach.n2", Action::Replace)
        ]
    );
    let out = render::render(&p);
    assert!(
        out.contains("step 1: container.old_vllm on node.n1 is stopped and removed\n"),
        "{out}"
    );
    assert!(
        out.contains("step 2: network.fabric.attach.n2 on node.n2 is replaced: its fabric address is removed and added again"),
        "{out}"
    );
    // The worker on n2 uses that address: its probes are down until they pass again, and no
    // duration is known while a deletion runs first.
    assert!(
        out.contains("probe.ray_members: from step 2 (network.fabric.attach.n2) until probe.ray_members passes"),
        "{out}"
    );
    assert_eq!(impact(&p).outage_secs, None);
    assert!(
        out.contains("no apply has recorded how long container.old_vllm"),
        "{out}"
    );
}

/// The stand-in hub's commits of `main` and `v2` (the same on every start of `testbed hub`).
const MAIN: &str = "ad8e4dd7462353a884a81d46803a03b7a8230b75";
const V2: &str = "5088b93f3b455f1582aa9cd65a4ecf7f6ccd415a";

#[test]
fn the_testbed_example_shows_a_new_revision_replacing_the_weights_and_vllm_not_ray() {
    let p = testbed_change(&[("rev", MAIN)], &[("rev", V2)]);
    let action = |a: &str| p.change(a).map(|c| c.action);
    for a in [
        "model.qwen[\"node1\"]",
        "model.qwen[\"node2\"]",
        "module.qwen.container.vllm",
    ] {
        assert_eq!(action(a), Some(Action::Replace), "{a}");
    }
    let running: Vec<&str> = impact(&p)
        .keeps_running
        .iter()
        .map(|r| r.address.as_str())
        .collect();
    assert_eq!(
        running,
        [
            "module.qwen.module.ray.container.ray_head",
            "module.qwen.module.ray.container.ray_worker[\"node2\"]"
        ]
    );
    let out = render::render(&p);
    assert!(
        out.contains(&format!("/snapshots/{MAIN}\",\n"))
            && out.contains(&format!("/snapshots/{V2}\",\n")),
        "{out}"
    );
    insta::assert_snapshot!("render_testbed_new_revision", out);
}

/// A probe declared in a module (`module.qwen.module.ray.probe.ray_members`) is a probe: the
/// endpoints behind what a new image replaces are back when it passes, not when the last
/// replaced container passes its ready check (what reading `probe.` off the address said).
#[test]
fn an_endpoint_behind_a_probe_in_a_module_is_back_when_that_probe_passes() {
    let p = testbed_change(&[], &[("image", "sparkform-testbed/ray:next")]);
    let members = "module.qwen.module.ray.probe.ray_members";
    let step = p
        .change(members)
        .map(|c| c.action)
        .expect("the membership probe is planned");
    assert_eq!(step, Action::Run);
    let outage = impact(&p)
        .unavailable
        .iter()
        .find(|o| o.endpoints.iter().any(|e| e == members))
        .expect("the membership probe waits for the replaced Ray containers");
    assert_eq!(outage.until.as_deref(), Some(members), "{outage:?}");
    let out = render::render(&p);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{members}: from step")))
        .unwrap_or_else(|| panic!("no line for {members}:\n{out}"));
    assert!(
        line.contains(&format!("until {members} passes (step")) && !line.contains("ready check"),
        "{line}"
    );
}

/// Every address the examples' configurations lower to reads back into its kind and prints
/// back byte for byte: the typed address and the lowering agree.
#[test]
fn every_resource_address_of_the_examples_reads_back_into_its_kind() {
    use sparkform::kind::address::Address;
    for dir in [
        "examples/testbed",
        "examples/testbed-standin",
        "examples/testbed-mp",
        "examples/qwen35-two-sparks",
        "examples/qwen35-two-sparks-mp",
        "examples/qwen35-two-sparks-sglang",
        "examples/testbed-sglang",
    ] {
        let (config, _) = common::load_with(std::path::Path::new(dir), &vars(&[]));
        assert!(!config.resources.is_empty(), "{dir}");
        for r in &config.resources {
            let a = Address::parse(&r.address)
                .unwrap_or_else(|| panic!("{dir}: {} does not parse", r.address));
            assert_eq!(a.kind, r.kind, "{dir}: {}", r.address);
            assert_eq!(a.to_string(), r.address, "{dir}");
        }
    }
}

/// After an apply killed while it removed the previous container it had set aside, a plan finds
/// that stopped copy under the resource's labels: it says the copy goes and nothing running
/// stops, and the impact counts no outage for it (the resource itself keeps running).
#[test]
fn a_stopped_set_aside_copy_is_removed_without_an_outage() {
    let dir = common::fixture(STACK);
    let state = applied(&dir, &[], &[]);
    let address = "container.vllm";
    assert!(
        state.resources.contains_key(address),
        "{:?}",
        state.resources.keys()
    );
    let opts = PlanOptions {
        observations: Some(plan::Observations {
            orphans: vec![plan::Orphan {
                kind: sparkform::vocabulary::KindId::Container,
                address: address.into(),
                node: "node.n1".into(),
                name: "vllm-sparkform-old-0123456789ab".into(),
                id: "0123456789abcdef".into(),
                running: false,
            }],
            ..plan::Observations::default()
        }),
        ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    let p = plan_with(&dir, &[], &state, &opts);
    let c = p
        .changes
        .iter()
        .find(|c| c.address == address && c.action == Action::Delete)
        .unwrap_or_else(|| panic!("no removal of the copy: {}", render::render(&p)));
    assert!(c.orphan.is_some());
    assert!(impact(&p).stopped.is_empty(), "{:?}", impact(&p).stopped);
    assert!(
        impact(&p).unavailable.is_empty(),
        "{:?}",
        impact(&p).unavailable
    );
    let out = render::render(&p);
    assert!(
        out.contains("container.vllm (container on node.n1) has an untracked copy that does not run (vllm-sparkform-old-0123456789ab): it will be removed; nothing running stops"),
        "{out}"
    );
    assert!(!out.contains("will be destroyed"), "{out}");
    assert!(out.contains("Impact: no disruption"), "{out}");
}

//! An apply a person can watch, on the testbed: the phases of a vLLM start (the stand-in prints
//! vLLM's lines) arrive as `--json` events in order, and the plan's impact section takes its
//! expected durations from what the previous apply recorded.

use crate::common;

use std::sync::Mutex;

use common::testbed::{sparkform, testbed, Testbed};

const EXAMPLE: &str = "examples/testbed-standin";
const VLLM: &str = "module.qwen.container.vllm";
/// Both tests deploy the same example: one at a time.
static EXAMPLE_IN_USE: Mutex<()> = Mutex::new(());

fn clear(tb: &Testbed) {
    tb.clear_leftovers();
}

fn run(state: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let mut a = args.to_vec();
    a.extend(["-state", state.to_str().unwrap()]);
    sparkform(&a)
}

fn destroy(state: &std::path::Path, vars: &[&str]) {
    let mut a = vec!["destroy", EXAMPLE, "-auto-approve"];
    a.extend(vars);
    let (code, out, err) = run(state, &a);
    assert_eq!(code, 0, "{out}\n{err}");
    let tb = testbed();
    for node in ["sf-node1", "sf-node2"] {
        let left = tb.example_model_left(node);
        assert!(left.trim().is_empty(), "model files left on {node}: {left}");
    }
    clear(&tb);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn the_phases_of_a_vllm_start_arrive_in_order() {
    let _one = EXAMPLE_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    clear(&tb);
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let (code, out, err) = run(&state, &["apply", EXAMPLE, "-auto-approve", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let of_vllm = |kind: &str| -> Vec<(usize, &serde_json::Value)> {
        events
            .iter()
            .enumerate()
            .filter(|(_, e)| e["event"] == kind && e["address"] == VLLM)
            .collect()
    };
    let phases = of_vllm("phase");
    let mut labels: Vec<&str> = phases
        .iter()
        .map(|(_, e)| e["phase"].as_str().unwrap())
        .collect();
    labels.dedup();
    // "API server up" is the line of the moment /health starts answering: the check may pass
    // before it is read.
    if labels.last() == Some(&"API server up") {
        labels.pop();
    }
    assert_eq!(
        labels,
        [
            "loading the model",
            "loading weights",
            "weights loaded",
            "compiling",
            "memory profiled",
            "capturing CUDA graphs",
            "CUDA graphs captured",
            "starting the API server",
        ],
        "{out}"
    );
    // The weight bar's percentages, as the stand-in prints them over the snapshot's 3 shards.
    let weights: Vec<f64> = phases
        .iter()
        .filter(|(_, e)| e["phase"] == "loading weights")
        .map(|(_, e)| e["percent"].as_f64().unwrap())
        .collect();
    assert_eq!(weights, [0.0, 33.0, 66.0, 100.0], "{out}");
    for (_, e) in &phases {
        assert!(!e["line"].as_str().unwrap().is_empty());
    }
    // All of them while the step runs: after its start, before it is done.
    let started = of_vllm("step_started")[0].0;
    let done = of_vllm("step_done")[0].0;
    assert!(
        phases.iter().all(|(i, _)| *i > started && *i < done),
        "{out}"
    );
    destroy(&state, &[]);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn the_impact_expects_what_the_last_apply_took() {
    let _one = EXAMPLE_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    let tb = testbed();
    clear(&tb);
    // A cold first start (an earlier test of this file left its compile cache warm): the plan
    // takes a warm start's time as it was recorded, and a cold one's less what it compiled.
    for node in ["sf-node1", "sf-node2"] {
        tb.ssh(node, "rm -rf /var/cache/sparkform-jit");
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let (code, out, err) = run(&state, &["apply", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(
        doc["resources"][VLLM]["attributes"]["cache_warm"], false,
        "the first start found its cache folder cold: {doc}"
    );
    let recorded = doc["resources"][VLLM]["last_apply_secs"]
        .as_f64()
        .unwrap_or_else(|| panic!("no duration recorded for {VLLM}: {doc}"));
    // The stand-in's start alone takes its phases' pauses (about 4 s).
    assert!(recorded > 3.0, "{recorded}");
    // Its compile cache is warm now (the start left its artefacts): the next start is expected
    // to take what this one took but its compile phase.
    let compiling = doc["resources"][VLLM]["attributes"]["phase_secs"]["compiling"]
        .as_f64()
        .unwrap_or_else(|| panic!("no compile phase recorded for {VLLM}: {doc}"));
    let expected = recorded - compiling;

    let change = ["-var", "max_model_len=4096"];
    let mut a = vec!["plan", EXAMPLE, "--json"];
    a.extend(change);
    let (code, out, err) = run(&state, &a);
    assert_eq!(code, 0, "{out}\n{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stopped = plan["plan"]["impact"]["stopped"].as_array().unwrap();
    let vllm = stopped
        .iter()
        .find(|s| s["address"] == VLLM)
        .unwrap_or_else(|| panic!("{VLLM} is not among the stopped: {out}"));
    assert_eq!(vllm["expected_secs"].as_f64(), Some(expected), "{out}");
    let cache = plan["plan"]["impact"]["caches"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["address"] == VLLM))
        .unwrap_or_else(|| panic!("no cache read for {VLLM}: {out}"));
    assert_eq!(cache["warm"], true, "{out}");

    let mut a = vec!["plan", EXAMPLE];
    a.extend(change);
    let (code, out, err) = run(&state, &a);
    assert_eq!(code, 0, "{out}\n{err}");
    let step = out
        .lines()
        .find(|l| l.contains(&format!("{VLLM} on ")) && l.contains("step "))
        .unwrap_or_else(|| panic!("no impact line for {VLLM}: {out}"));
    assert!(
        step.contains(&format!(
            "(expected {})",
            sparkform::plan::render::duration(expected)
        )),
        "{step}\n{out}"
    );
    destroy(&state, &change);
}

//! Two replicas of the real vLLM (its CPU build, one engine per node of the second pair, one
//! core each) behind HAProxy, and a vLLM flag change rolled through them while a steady load
//! goes through the router: every request is answered, the endpoint stays the same, and each
//! replica is replaced one after the other (the load's p50 and p99 latencies before and during
//! the roll are printed).
//!
//! It runs on the testbed's second pair of nodes (sf-node3 and sf-node4, where `.ci/test`
//! loads the engine's image), after real_engine.rs's tests.

use crate::common;
use crate::testbed_replicas::{counts, under_load};

use common::testbed::{example_copy, sparkform, testbed_second_pair};

const EXAMPLE: &str = "examples/testbed-replicas";
const MODEL: &str = "testbed/tiny-qwen3";

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_flag_change_rolls_through_two_real_engines_under_load_with_no_failed_request() {
    let tb = testbed_second_pair();
    tb.clear_leftovers();
    let copy = example_copy(EXAMPLE);
    let example = copy.path().to_str().unwrap().to_string();
    let state = copy.path().join("state.json");
    let st = state.to_str().unwrap().to_string();
    let placement = tb.placement();
    let engine = [
        "-var",
        "image=sparkform-testbed/vllm-cpu:latest",
        "-var",
        "repo=testbed/tiny-qwen3",
        "-var",
        "executor=uni",
    ];
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(engine);
        a.extend(["-state", st.as_str()]);
        a.extend(placement.iter().map(String::as_str));
        sparkform(&a)
    };

    // Eager engines (no compile of the model's graph: what a start costs here is loading it),
    // as the roll is what this test is about.
    let eager = ["-var", "extra_args=[\"--enforce-eager\"]"];
    let (code, out, err) = run(&[&["apply", &example, "-auto-approve"][..], &eager].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    let endpoint = format!("http://{}:8000", tb.fabric[0]);
    assert!(out.contains(&format!("endpoint = \"{endpoint}\"")), "{out}");
    let ids = || {
        ["sparkform-vllm-node1", "sparkform-vllm-node2"]
            .iter()
            .zip(tb.nodes)
            .map(|(name, node)| tb.running_id(node, name))
            .collect::<Vec<_>>()
    };
    let before = ids();
    assert!(before.iter().all(Option::is_some), "{before:?}");

    // A flag every engine restarts for, under a load of about four requests a second (the
    // engines share two cores with the one that starts).
    let flag = [
        "-var",
        "extra_args=[\"--enforce-eager\",\"--enable-auto-tool-choice\",\"--tool-call-parser\",\"hermes\"]",
    ];
    let ((code, out, err), said) = under_load(&tb, &endpoint, MODEL, 0.5, || {
        run(&[&["apply", &example, "-auto-approve"][..], &flag].concat())
    });
    eprintln!("the load during the roll: {said}");
    assert_eq!(code, 0, "{out}\n{err}");
    eprintln!("{}", roll_time(&out));
    let drained = |k: &str| out.find(&format!("(drain {k}): check done"));
    let admitted = |k: &str| out.find(&format!("(admit {k}): check done"));
    assert!(
        drained("node1") < admitted("node1")
            && admitted("node1") < drained("node2")
            && drained("node2") < admitted("node2")
            && admitted("node2").is_some(),
        "not one replica after the other: {out}"
    );
    assert!(out.contains(&format!("endpoint = \"{endpoint}\"")), "{out}");
    let (answered, failed) = counts(&said);
    assert_eq!(failed, 0, "requests failed during the roll: {said}");
    assert!(
        answered >= 40,
        "the load did not run through the roll: {said}"
    );
    for (b, a) in before.iter().zip(ids()) {
        assert!(
            a.is_some() && &a != b,
            "a replica was not replaced: {b:?} {a:?}"
        );
    }

    let (code, out, err) = run(&[&["destroy", &example, "-auto-approve"][..], &flag].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    crate::testbed_mp::assert_nothing_running(&tb);
    tb.clear_leftovers();
}

/// The roll's time against its replicas' own replacements, from the apply's progress lines: the
/// last line's clock, and each engine's `replace done in S s` (its stop, start and readiness).
/// A figure printed, not asserted (the target: the apply at most their sum plus 10 %).
fn roll_time(out: &str) -> String {
    let seconds = |l: &str, after: &str| -> Option<f64> {
        l.split_once(after)?
            .1
            .split_whitespace()
            .next()?
            .trim_end_matches('s')
            .parse()
            .ok()
    };
    let total = out
        .lines()
        .filter_map(|l| {
            l.strip_prefix('[')?
                .split_once("s]")?
                .0
                .trim()
                .parse::<f64>()
                .ok()
        })
        .fold(0.0, f64::max);
    let starts: Vec<f64> = out
        .lines()
        .filter(|l| l.contains("container.engine[") && l.contains(": replace done in "))
        .filter_map(|l| seconds(l, "replace done in "))
        .collect();
    let sum: f64 = starts.iter().sum();
    format!(
        "the roll: apply {total:.1} s; the replicas' own replacements {starts:?} s, {sum:.1} s together; apply / their sum {:.2}",
        if sum > 0.0 { total / sum } else { f64::NAN }
    )
}

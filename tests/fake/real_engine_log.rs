//! The modules' log patterns against the real vLLM's own lines: the logs of a real start of
//! examples/testbed (vLLM 0.32.0's CPU build, tensor parallel 2 over the testbed's fabric, one
//! rank per node), kept in tests/fixtures/real-engine as `docker logs` printed them. The
//! progress patterns find the start's phases in order, no fail-fast pattern trips on a start
//! that served, and after the server is up no wedge pattern matches (bench/compat checks the
//! same patterns against each release's source; these are lines the engine printed).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use sparkform::kinds::container::progress::PhaseWatch;
use sparkform::vocabulary::KindId;

const RANK0: &str = include_str!("../fixtures/real-engine/vllm-0.32.0-cpu-rank0.log");
const RANK1: &str = include_str!("../fixtures/real-engine/vllm-0.32.0-cpu-rank1.log");
/// Rank 0's real log when the CPU build served a model whose heads have dimension 16 (the
/// stand-in hub's `testbed/tiny-qwen3-hd16`): healthy, then dead on the first request.
const HD16_RANK0: &str = include_str!("../fixtures/real-engine/vllm-0.32.0-cpu-hd16-rank0.log");

/// A map attribute of a container's first ready block (`progress`, `fail_on_log`), or its own
/// `watch_on_log`, of examples/testbed.
fn patterns(address: &str, key: &str) -> BTreeMap<String, String> {
    let (config, _) = common::load(Path::new("examples/testbed"));
    let r = config
        .resources
        .iter()
        .find(|r| r.kind == KindId::Container && r.address == address)
        .unwrap_or_else(|| panic!("no {address} in examples/testbed"));
    let v = if key == "watch_on_log" {
        &r.config[key]
    } else {
        &r.config["ready"][0][key]
    };
    v.as_object()
        .unwrap_or_else(|| panic!("{address}: no {key}: {v}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The phases a log goes through, in order, each once.
fn phases(progress: &BTreeMap<String, String>, log: &str) -> Vec<String> {
    let mut watch = PhaseWatch::new(progress);
    let mut seen: Vec<String> = Vec::new();
    for p in watch.feed(log) {
        if seen.last() != Some(&p.label) {
            seen.push(p.label);
        }
    }
    seen
}

#[test]
fn the_progress_patterns_find_a_real_starts_phases_in_order() {
    let progress = patterns("module.qwen.container.rank[\"node2\"]", "progress");
    // The headless rank loads its share, compiles (the CPU build's warm-up) and sizes its KV
    // cache; the API server is rank 0's.
    assert_eq!(
        phases(&progress, RANK1),
        [
            "loading the model",
            "weights loaded",
            "compiling",
            "KV cache allocated"
        ],
        "rank 1's real log"
    );
    let rank0 = phases(&progress, RANK0);
    assert_eq!(
        rank0,
        [
            "loading the model",
            "loading weights",
            "weights loaded",
            "compiling",
            "KV cache allocated",
            "starting the API server",
            "API server up"
        ],
        "rank 0's real log"
    );
}

#[test]
fn no_fail_fast_pattern_trips_on_a_real_start_that_served() {
    for address in [
        "module.qwen.container.rank0",
        "module.qwen.container.rank[\"node2\"]",
    ] {
        let fail = patterns(address, "fail_on_log");
        assert!(fail.len() > 5, "{address}: {fail:?}");
        for (pattern, why) in &fail {
            let re = regex::Regex::new(pattern).unwrap();
            for line in RANK0.lines().chain(RANK1.lines()) {
                assert!(
                    !re.is_match(line),
                    "{address}: `{pattern}` ({why}) matches a line of a start that served: {line}"
                );
            }
        }
    }
}

/// A cold start on two cores compiles for about a minute, and vLLM's shared-memory broadcast
/// says it waited 60 s: a wedge pattern matches a real line of a start that served. The watch
/// reads a container's log only from when it first checks it, after its ready check passed;
/// once the server is up, no wedge pattern matches.
#[test]
fn no_wedge_pattern_matches_once_the_real_server_is_up() {
    let wedge = patterns("module.qwen.container.rank0", "watch_on_log");
    assert!(!wedge.is_empty());
    let up = RANK0
        .lines()
        .position(|l| l.contains("Application startup complete"))
        .expect("the real log has the server's start");
    let during_start: Vec<&str> = RANK0
        .lines()
        .take(up)
        .filter(|l| {
            wedge
                .keys()
                .any(|p| regex::Regex::new(p).unwrap().is_match(l))
        })
        .collect();
    assert!(
        during_start
            .iter()
            .all(|l| l.contains("No available shared memory broadcast block found")),
        "{during_start:?}"
    );
    for line in RANK0.lines().skip(up) {
        for pattern in wedge.keys() {
            assert!(
                !regex::Regex::new(pattern).unwrap().is_match(line),
                "`{pattern}` matches a line after the server was up: {line}"
            );
        }
    }
}

/// A real failure: the fail-fast signatures of rank 0 find in its real log exactly the one
/// failure it had, vLLM's own line about the head dimension, with the module's fix; what the
/// apply reports when the probe's upstream is down (`on_testbed/real_engine.rs`).
#[test]
fn the_fail_fast_signatures_name_a_real_failure_by_vllms_own_line() {
    let fail = patterns("module.qwen.container.rank0", "fail_on_log");
    let hits: Vec<(&String, &String, &str)> = fail
        .iter()
        .filter_map(|(pattern, fix)| {
            let re = regex::Regex::new(pattern).unwrap();
            HD16_RANK0
                .lines()
                .find(|l| re.is_match(l))
                .map(|l| (pattern, fix, l))
        })
        .collect();
    assert_eq!(hits.len(), 1, "{hits:?}");
    let (_, fix, line) = hits[0];
    assert!(
        line.contains("RuntimeError: Unsupported CPU attention configuration: head_dim=16"),
        "{line}"
    );
    assert!(fix.contains("head dimension"), "{fix}");
    // The engine's death is a wedge line too, for a deployment that already served.
    let wedge = patterns("module.qwen.container.rank0", "watch_on_log");
    assert!(
        HD16_RANK0.lines().any(|l| wedge
            .keys()
            .any(|p| regex::Regex::new(p).unwrap().is_match(l))),
        "no watch_on_log pattern matches the real EngineDeadError"
    );
}

//! vLLM across nodes without Ray, end to end on the testbed: examples/testbed-mp with the vLLM
//! stand-in in its multiprocessing mode (`tests/testbed/testbed ray` loads its image into the
//! nodes) and the weights from the stand-in hub (`testbed hub`). On the third pair of nodes,
//! beside the first pair's files and the real engine's, in turns with testbed_model's.

use crate::common;

use common::testbed::{sparkform, testbed_third_pair, Testbed};

const EXAMPLE: &str = "examples/testbed-mp";
/// An address on the fabric that no pair's files plan (tests/common/testbed.rs).
const INTRUDER: &str = "192.168.200.112";

/// Each rank's (node, container name) on the test's pair.
fn ranks(tb: &Testbed) -> [(&'static str, &'static str); 2] {
    [
        (tb.nodes[0], "sparkform-vllm-node1"),
        (tb.nodes[1], "sparkform-vllm-node2"),
    ]
}

/// The running container of each (node, name), by ID; every one must run.
pub(crate) fn rank_ids(tb: &Testbed, ranks: &[(&str, &str)]) -> Vec<String> {
    ranks
        .iter()
        .map(|(node, name)| {
            tb.running_id(node, name)
                .unwrap_or_else(|| panic!("{name} is not running"))
        })
        .collect()
}

pub(crate) fn assert_nothing_left(tb: &Testbed) {
    assert_nothing_running(tb);
    for node in tb.nodes {
        let left = tb.example_model_left(node);
        assert!(left.trim().is_empty(), "model files left on {node}: {left}");
    }
}

/// No container and no fabric address left; the weights may stay (a rollback keeps the copies
/// it verified, for the next apply).
pub(crate) fn assert_nothing_running(tb: &Testbed) {
    for node in tb.nodes {
        assert!(
            tb.containers(node, "sparkform.lineage")
                .iter()
                .all(|c| !c.0.starts_with("sparkform-")),
            "containers left on {node}"
        );
        assert!(
            !tb.fabric_addresses(node).contains("192.168.200."),
            "address left on {node}: {}",
            tb.fabric_addresses(node)
        );
        let helpers = tb.ssh(
            node,
            "docker ps -a --filter label=sparkform.model-helper --format '{{.Names}}'",
        );
        assert!(
            helpers.trim().is_empty(),
            "helpers left on {node}: {helpers}"
        );
    }
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn vllm_mp_on_the_testbed() {
    let tb = testbed_third_pair();
    // A copy of the example, whose lock file is this test's (tests/common/testbed.rs).
    let copy = common::testbed::example_copy(EXAMPLE);
    let example = copy.path().to_str().unwrap();
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let st = state.to_str().unwrap().to_string();
    let placement = tb.placement();
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-state", st.as_str()]);
        a.extend(placement.iter().map(String::as_str));
        sparkform(&a)
    };
    let [a1, a2] = tb.fabric;
    let ranks_run_on = format!("ranks run on {a1}, {a2}");

    // From empty: the gate sees both ranks, the answer names both fabric addresses.
    let (code, out, err) = run(&["apply", example, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!("rendezvous-ok 2 nodes: {a1} (rank 0), {a2}")),
        "{out}"
    );
    assert!(out.contains(&ranks_run_on), "{out}");
    let (code, out, _) = run(&["plan", example, "-detailed-exitcode"]);
    assert_eq!(code, 0, "a re-plan is not a no-op:\n{out}");

    // A vLLM flag changes: every rank is replaced (one process group), and it answers again.
    let before = rank_ids(&tb, &ranks(&tb));
    let (code, out, _) = run(&[
        "plan",
        example,
        "-var",
        "max_model_len=4096",
        "-detailed-exitcode",
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("Plan: 0 to add, 0 to change, 2 to replace, 0 to destroy"),
        "{out}"
    );
    let (code, out, err) = run(&[
        "apply",
        example,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let after = rank_ids(&tb, &ranks(&tb));
    for (b, a) in before.iter().zip(&after) {
        assert_ne!(b, a, "a rank kept running through a flag change");
    }
    assert!(out.contains(&ranks_run_on), "{out}");
    let (code, out, _) = run(&["verify", example, "-var", "max_model_len=4096"]);
    assert_eq!(code, 0, "{out}");
    let (code, out, err) = run(&[
        "destroy",
        example,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_nothing_left(&tb);

    // node2's fabric interface already holds another address when sparkform adds its own: the
    // kernel keeps the first as the source of node2's connections, so its rank joins rank 0
    // from that address. The gate names it and the apply rolls back.
    tb.ssh(
        tb.nodes[1],
        &format!("ip addr add {INTRUDER}/24 dev enp1s0f0np0"),
    );
    let (code, out, err) = run(&[
        "apply",
        example,
        "-auto-approve",
        "-var",
        "rendezvous_timeout=10s",
    ]);
    tb.ssh(
        tb.nodes[1],
        "ip addr flush dev enp1s0f0np0 to 192.168.200.0/24",
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("rendezvous")
            && err.contains(&format!(
                "joined the master port from {INTRUDER}, which is not a planned fabric address"
            )),
        "{err}"
    );
    assert!(err.contains("Rolled back"), "{err}");
    assert_nothing_running(&tb);
    // The rollback kept the verified weights, outside the state: the next apply reuses them.
    for node in tb.nodes {
        assert!(
            !tb.example_model_left(node).trim().is_empty(),
            "the rollback removed the verified copy on {node}"
        );
    }
    tb.clear_leftovers();
}

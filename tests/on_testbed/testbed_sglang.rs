//! SGLang across nodes, end to end on the testbed: examples/testbed-sglang (modules/sglang-mp)
//! with the testbed image's stand-in `sglang` package, which prints SGLang's lines, and the
//! weights from the stand-in hub. As `testbed_mp` does for vLLM: the plan applies, the probe's
//! real completion passes, a changed SGLang setting replaces every rank, and a rank that joins
//! from an unplanned address is refused and rolled back.

use crate::common;

use super::testbed_mp::{assert_nothing_left, assert_nothing_running, rank_ids};
use common::testbed::{sparkform, testbed};

const EXAMPLE: &str = "examples/testbed-sglang";
const RANKS: [(&str, &str); 2] = [
    ("sf-node1", "sparkform-sglang-node1"),
    ("sf-node2", "sparkform-sglang-node2"),
];

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn sglang_on_the_testbed() {
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

    // From empty: SGLang's phases shown, the gate sees both ranks, the answer names both
    // fabric addresses (the API key read from SGLang's config file, not its command line).
    let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve", "-upgrade"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("rendezvous-ok 2 nodes: 192.168.200.1 (rank 0), 192.168.200.2"),
        "{out}"
    );
    assert!(
        out.contains("an SGLang stand-in whose ranks run on 192.168.200.1, 192.168.200.2"),
        "{out}"
    );
    let rank0 = tb.ssh(
        "sf-node1",
        "docker inspect -f '{{json .Config.Cmd}} {{json .Config.Entrypoint}}' sparkform-sglang-node1",
    );
    assert!(
        rank0.contains("\"--dist-init-addr\",\"192.168.200.1:20000\"")
            && rank0.contains("--config")
            && !rank0.contains("sparkform-testbed-key"),
        "{rank0}"
    );
    let log = tb.ssh("sf-node1", "docker logs sparkform-sglang-node1 2>&1");
    assert!(
        log.contains("Load weight end.")
            && log.contains("The server is fired up and ready to roll!"),
        "{log}"
    );
    let (code, out, _) = run(&["plan", EXAMPLE, "-detailed-exitcode"]);
    assert_eq!(code, 0, "a re-plan is not a no-op:\n{out}");

    // An SGLang setting changes: every rank is replaced (one process group), and it answers.
    let before = rank_ids(&tb, &RANKS);
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "context_length=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("0 added, 0 changed, 2 replaced, 0 destroyed; 2 probes passed"),
        "{out}"
    );
    for (b, a) in before.iter().zip(&rank_ids(&tb, &RANKS)) {
        assert_ne!(b, a, "a rank kept running through a setting change");
    }
    let (code, out, _) = run(&["verify", EXAMPLE, "-var", "context_length=4096"]);
    assert_eq!(code, 0, "{out}");
    let (code, out, err) = run(&[
        "destroy",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "context_length=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_nothing_left(&tb);

    // node2's fabric interface holds another address first: its rank joins rank 0 from it, the
    // gate names it and the apply rolls back.
    tb.ssh("sf-node2", "ip addr add 192.168.200.12/24 dev enp1s0f0np0");
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "rendezvous_timeout=10s",
    ]);
    tb.ssh(
        "sf-node2",
        "ip addr flush dev enp1s0f0np0 to 192.168.200.0/24",
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("rendezvous")
            && err.contains("from 192.168.200.12, which is not a planned fabric address"),
        "{err}"
    );
    assert!(err.contains("Rolled back"), "{err}");
    assert_nothing_running(&tb);
    tb.clear_leftovers();
}

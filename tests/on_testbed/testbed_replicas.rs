//! Replicas behind a router, end to end on the testbed: examples/testbed-replicas with the vLLM
//! stand-in, one engine on each node of the third pair and HAProxy (the testbed's router image,
//! Debian's package) in front of them on the first. A flag change rolls through the replicas
//! while a steady load goes through the router: every request is answered, and the endpoint
//! stays the same; then, under the same load, a replica is removed and added again by changing
//! their number, HAProxy never restarted. On the third pair, a test at a time with its other
//! files.

use crate::common;

use common::testbed::{example_copy, sparkform, testbed_third_pair, Testbed};

const EXAMPLE: &str = "examples/testbed-replicas";

/// Requests through the router from the router's node, two at a time with `pause` seconds
/// between two of one worker, until `stop` exists (at most `max_secs`): prints `ok N failed M`,
/// the first few failures and the latencies' p50 and p99 in ms, before the first replica went
/// out (`before`: the first `settle` seconds) and after.
const LOAD: &str = r#"
import json, sys, threading, time, urllib.request, os
url, key, stop, max_secs, model, settle, pause = sys.argv[1:8]
max_secs, settle, pause = float(max_secs), float(settle), float(pause)
body = json.dumps({"model": model, "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
ok, bad, lock, lat = [0], [], threading.Lock(), {"before": [], "during": []}
start = time.time()
def worker():
    end = start + max_secs
    while time.time() < end and not os.path.exists(stop):
        t = time.time()
        try:
            req = urllib.request.Request(url, data=body, headers={
                "Authorization": "Bearer " + key, "Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=60).read()
            with lock:
                ok[0] += 1
                lat["before" if t - start < settle else "during"].append((time.time() - t) * 1000)
        except Exception as e:
            with lock: bad.append(str(e)[:100])
        time.sleep(pause)
ts = [threading.Thread(target=worker) for _ in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
q = lambda l, p: sorted(l)[min(len(l) - 1, int(len(l) * p))] if l else -1
print("ok %d failed %d %s" % (ok[0], len(bad), bad[:3]))
for k in ("before", "during"):
    print("%s: n %d p50 %.0f ms p99 %.0f ms" % (k, len(lat[k]), q(lat[k], 0.5), q(lat[k], 0.99)))
"#;

/// The load's command line on the router's node.
pub(crate) fn load_command(
    endpoint: &str,
    stop: &str,
    model: &str,
    settle_secs: u32,
    pause_secs: f64,
) -> String {
    format!(
        "python3 -c '{}' {endpoint}/v1/chat/completions sparkform-testbed-key {stop} 900 {model} {settle_secs} {pause_secs}",
        LOAD.replace('\'', "\"")
    )
}

/// (answered, failed) from the load's last line.
pub(crate) fn counts(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("ok "))
        .unwrap_or("");
    let words: Vec<&str> = line.split_whitespace().collect();
    let n = |i: usize| {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .unwrap_or(u64::MAX)
    };
    (n(1), n(3))
}

/// `apply` run while the load goes through `endpoint` from the router's node (the first of the
/// pair), from two seconds before it to two after: its result and what the load printed.
pub(crate) fn under_load<T: Send>(
    tb: &Testbed,
    endpoint: &str,
    model: &str,
    pause_secs: f64,
    apply: impl FnOnce() -> T + Send,
) -> (T, String) {
    let stop = "/tmp/sparkform-replicas-load.stop";
    tb.ssh(tb.nodes[0], &format!("rm -f {stop}"));
    let command = load_command(endpoint, stop, model, 2, pause_secs);
    std::thread::scope(|s| {
        let load = s.spawn(|| tb.ssh(tb.nodes[0], &command));
        std::thread::sleep(std::time::Duration::from_secs(2));
        let applied = apply();
        std::thread::sleep(std::time::Duration::from_secs(2));
        tb.ssh(tb.nodes[0], &format!("touch {stop}"));
        (applied, load.join().expect("the load's thread"))
    })
}

fn engines(tb: &Testbed) -> Vec<String> {
    [
        (tb.nodes[0], "sparkform-vllm-node1"),
        (tb.nodes[1], "sparkform-vllm-node2"),
    ]
    .iter()
    .map(|(node, name)| {
        tb.running_id(node, name)
            .unwrap_or_else(|| panic!("{name} is not running"))
    })
    .collect()
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_flag_change_rolls_through_two_replicas_under_load_with_no_failed_request() {
    let tb = testbed_third_pair();
    tb.clear_leftovers();
    let copy = example_copy(EXAMPLE);
    let example = copy.path().to_str().unwrap().to_string();
    let state = copy.path().join("state.json");
    let st = state.to_str().unwrap().to_string();
    let placement = tb.placement();
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-state", st.as_str()]);
        a.extend(placement.iter().map(String::as_str));
        sparkform(&a)
    };

    let (code, out, err) = run(&["apply", &example, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("2 replica(s) in the router: node1 added, node2 added"),
        "{out}"
    );
    let endpoint = format!("http://{}:8000", tb.fabric[0]);
    assert!(out.contains(&format!("endpoint = \"{endpoint}\"")), "{out}");
    let before = engines(&tb);

    // The plan says the endpoint stays up, and how many replicas serve at each step.
    let flag = ["-var", "extra_args=[\"--enable-auto-tool-choice\"]"];
    let (code, out, _) = run(&[&["plan", &example][..], &flag].concat());
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("one replica at a time: the endpoint stays up")
            && out.contains("2 of 2 → 1 of 2 (node1 replaced")
            && !out.contains("Expected outage"),
        "{out}"
    );

    // A steady load through the router during the roll.
    let under_load =
        |args: &[&str]| under_load(&tb, &endpoint, "testbed/standin-qwen3", 0.05, || run(args));
    let ((code, out, err), said) =
        under_load(&[&["apply", &example, "-auto-approve"][..], &flag].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("(drain node1): check done") && out.contains("(admit node2): check done"),
        "{out}"
    );
    assert!(out.contains(&format!("endpoint = \"{endpoint}\"")), "{out}");
    let (answered, failed) = counts(&said);
    assert_eq!(failed, 0, "requests failed during the roll: {said}");
    assert!(
        answered >= 20,
        "the load did not run through the roll: {said}"
    );
    let rolled = engines(&tb);
    for (b, a) in before.iter().zip(&rolled) {
        assert_ne!(b, a, "a replica kept running through a flag change");
    }

    // Scaling by the number, under the same load: node2's replica is drained, then removed;
    // then added again once its probe passes. HAProxy is never restarted.
    let router = || tb.running_id(tb.nodes[0], "sparkform-router");
    let router_before = router();
    assert!(router_before.is_some(), "the router is not running");
    let one = ["-var", "replicas=1"];
    let ((code, out, err), said) =
        under_load(&[&["apply", &example, "-auto-approve"][..], &flag, &one].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("(drain node2, removed): check done") && out.contains("node2 removed"),
        "{out}"
    );
    assert_eq!(
        counts(&said).1,
        0,
        "requests failed as a replica went: {said}"
    );
    assert_eq!(tb.running_id(tb.nodes[1], "sparkform-vllm-node2"), None);
    let ((code, out, err), said) =
        under_load(&[&["apply", &example, "-auto-approve"][..], &flag].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("node2 added"), "{out}");
    assert_eq!(
        counts(&said).1,
        0,
        "requests failed as a replica came: {said}"
    );
    assert_eq!(router(), router_before, "the router was restarted");

    let (code, out, err) = run(&[&["destroy", &example, "-auto-approve"][..], &flag].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    super::testbed_mp::assert_nothing_running(&tb);
    tb.clear_leftovers();
}

//! An ephemeral hub token on the testbed (examples/testbed-mp's `hf_token`): against a stand-in
//! hub that answers only with the token, the plan resolves the revision and the apply downloads
//! the weights with it, while neither the state nor the saved plan holds it, in clear or hashed;
//! without it the plan fails at the hub; a new token plans no change. On the third pair of
//! nodes, beside the first pair's files and the real engine's, in turns with testbed_model's.

use crate::common;

use common::testbed::{sparkform_env, testbed_third_pair};

const EXAMPLE: &str = "examples/testbed-mp";
const TOKEN: &str = "hf_testbed_ephemeral_token_one";
const OTHER_TOKEN: &str = "hf_testbed_ephemeral_token_two";
/// The testbed's hub container, where a second stand-in runs on its own port and data.
const HUB: &str = "sf-hub";
const GATED_PORT: u16 = 8081;
const GATED_HUB: &str = "http://10.199.0.3:8081";

fn in_hub(command: &str) -> std::process::Output {
    std::process::Command::new("docker")
        .args(["exec", HUB, "sh", "-c", command])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("docker exec")
}

/// A stand-in hub that refuses every request without the bearer token (401), beside the
/// testbed's own in its container; stopped when dropped, however the test ends.
struct GatedHub;

impl GatedHub {
    fn start() -> GatedHub {
        let hub = GatedHub;
        let started = in_hub(&format!(
            "rm -rf /tmp/gated && mkdir -p /tmp/gated && printf '%s\\n' {TOKEN} > /tmp/gated/token && \
             (setsid /opt/hub/hub-standin.py --address 0.0.0.0 --port {GATED_PORT} --data /tmp/gated \
              --token-file /tmp/gated/token > /tmp/gated/log 2>&1 &)"
        ));
        assert!(started.status.success(), "{started:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !in_hub(&format!(
            "curl -sf --max-time 5 http://127.0.0.1:{GATED_PORT}/_standin/health"
        ))
        .status
        .success()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the gated hub did not answer in 120 s: {}",
                String::from_utf8_lossy(&in_hub("cat /tmp/gated/log").stdout)
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        hub
    }

    /// The requests it answered (its fetch log).
    fn log(&self) -> String {
        String::from_utf8_lossy(
            &in_hub(&format!(
                "curl -s --max-time 10 http://127.0.0.1:{GATED_PORT}/_standin/log"
            ))
            .stdout,
        )
        .to_string()
    }
}

impl Drop for GatedHub {
    fn drop(&mut self) {
        in_hub(&format!(
            "pkill -f 'hub-standin.py --address 0.0.0.0 --port {GATED_PORT}'; rm -rf /tmp/gated"
        ));
    }
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn an_ephemeral_token_downloads_the_weights_and_is_in_neither_the_state_nor_the_plan_file() {
    let tb = testbed_third_pair();
    // A copy of the example, whose lock file is this test's (tests/common/testbed.rs).
    let copy = common::testbed::example_copy(EXAMPLE);
    let example = copy.path().to_str().unwrap();
    tb.clear_leftovers();
    let hub = GatedHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let saved = tmp.path().join("saved.plan");
    let (st, saved_path) = (state.to_str().unwrap(), saved.to_str().unwrap());
    let placement = tb.placement();
    let hub_var = format!("hub={GATED_HUB}");
    let run = |token: Option<&str>, args: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["-state", st, "-var", hub_var.as_str()]);
        a.extend(placement.iter().map(String::as_str));
        sparkform_env(&[("SPARKFORM_VAR_hf_token", token)], &a)
    };

    // Without the token the hub refuses: the plan cannot resolve the revision, and says why.
    let (code, out, err) = run(None, &["plan", example]);
    assert_ne!(code, 0, "a plan without the token passed:\n{out}\n{err}");
    assert!(
        err.contains("token"),
        "the failure does not name the token:\n{err}"
    );

    // With it: a saved plan, then its apply (which takes the variable again).
    let (code, out, err) = run(Some(TOKEN), &["plan", example, "-out", saved_path]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = run(Some(TOKEN), &["apply", saved_path]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        hub.log().lines().any(|l| l.contains("standin-qwen3")),
        "the weights did not come from the gated hub: {}",
        hub.log()
    );

    // Recorded nowhere: not in clear, and the model's records have no `token` at all.
    for (what, path) in [("the state", &state), ("the saved plan", &saved)] {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(!text.contains(TOKEN), "{what} holds the token");
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut models = 0;
        walk(&doc, &mut |v| {
            if v.get("repo").is_some_and(|r| r == "testbed/standin-qwen3") {
                models += 1;
                assert!(v.get("token").is_none(), "{what}: {v}");
            }
        });
        assert!(models > 0, "{what} records no model: {text}");
    }

    // A new token is no change.
    let (code, out, err) = run(Some(OTHER_TOKEN), &["plan", example, "-detailed-exitcode"]);
    assert_eq!(
        code, 0,
        "a new ephemeral token planned a change:\n{out}\n{err}"
    );
    let (code, out, err) = run(Some(TOKEN), &["destroy", example, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    crate::testbed_mp::assert_nothing_left(&tb);
}

/// Every object inside `v`, depth first.
fn walk(v: &serde_json::Value, f: &mut dyn FnMut(&serde_json::Value)) {
    match v {
        serde_json::Value::Object(m) => {
            f(v);
            m.values().for_each(|x| walk(x, f));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
        _ => {}
    }
}

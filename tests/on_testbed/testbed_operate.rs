//! Operating a deployment on the testbed: `tunnel`, `logs -f` across a replacement, `status`.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::testbed::{sparkform, testbed};

const EXAMPLE: &str = "examples/testbed-standin";

/// Lines of a child's stream, as they come.
fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Collect lines until one satisfies `done` or the time is up; all the lines seen.
fn until(
    rx: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    limit: Duration,
    done: impl Fn(&[String]) -> bool,
) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done(seen) {
            return true;
        }
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(l);
        }
    }
    done(seen)
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn tunnel_logs_and_status_on_the_testbed() {
    let tb = testbed();
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let st = state.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-state", st]);
        sparkform(&a)
    };
    let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");

    // The probe's endpoint through the jump host: the command gets the probe's answer.
    let (code, out, err) = run(&[
        "tunnel",
        EXAMPLE,
        "probe.hello",
        "--exec",
        r#"curl -sf -H "Authorization: $SPARKFORM_TUNNEL_AUTHORIZATION" -H 'Content-Type: application/json' -d '{"model":"testbed/standin-qwen3","messages":[{"role":"user","content":"Hello! What model are you?"}]}' "$SPARKFORM_TUNNEL_URL" && test "{url}" = "$SPARKFORM_TUNNEL_URL""#,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Hello! I am testbed/standin-qwen3"), "{out}");
    // The output's URL, and the command's exit code comes back.
    let (code, out, err) = run(&[
        "tunnel",
        EXAMPLE,
        "endpoint",
        "--exec",
        "curl -sf -H \"Authorization: Bearer $OPENAI_API_KEY\" {url}/v1/models; exit 7",
    ]);
    assert_eq!(code, 7, "{out}\n{err}");
    assert!(out.contains("\"id\": \"testbed/standin-qwen3\""), "{out}");

    // All running: status says so.
    let (code, out, err) = run(&["status", EXAMPLE]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("node.node2  reachable"), "{out}");
    assert!(out.contains("module.qwen.container.vllm"), "{out}");

    // logs -f on vLLM, then a flag change replaces it: the new container's lines follow.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args([
            "logs",
            EXAMPLE,
            "module.qwen.container.vllm",
            "-f",
            "-state",
            st,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out_rx = lines_of(child.stdout.take().unwrap());
    let err_rx = lines_of(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    let connected = |s: &[String]| s.iter().filter(|l| l.contains("connected to Ray")).count();
    assert!(
        until(&out_rx, &mut seen, Duration::from_secs(60), |s| connected(
            s
        ) >= 1),
        "{seen:#?}"
    );
    assert!(
        seen.iter()
            .all(|l| l.starts_with("module.qwen.container.vllm │ ")),
        "{seen:#?}"
    );
    let vllm = tb.running_id("sf-node1", "sparkform-vllm").expect("vllm");
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let vllm2 = tb
        .running_id("sf-node1", "sparkform-vllm")
        .expect("new vllm");
    assert_ne!(vllm, vllm2);
    assert!(
        until(&out_rx, &mut seen, Duration::from_secs(60), |s| connected(
            s
        ) >= 2),
        "the new container's log did not follow: {seen:#?}"
    );
    let mut notes = Vec::new();
    assert!(
        until(&err_rx, &mut notes, Duration::from_secs(10), |s| s
            .iter()
            .any(|l| l.contains(&format!(
                "now following the new container {}",
                &vllm2[..12]
            )))),
        "{notes:#?}"
    );
    // Ctrl-C ends it, and promptly.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "logs -f did not end on Ctrl-C"
    );

    // A container killed by hand: status says it exited, with its code.
    tb.ssh(
        "sf-node2",
        "docker kill --signal KILL sparkform-ray-worker-node2 >/dev/null",
    );
    let (code, out, _) = run(&["status", EXAMPLE, "-var", "max_model_len=4096"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("EXITED with code 137"), "{out}");
    let (_, json, _) = run(&["status", EXAMPLE, "-var", "max_model_len=4096", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    let worker = j["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["address"] == "module.qwen.module.ray.container.ray_worker[\"node2\"]")
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(worker["observed"]["state"], "exited");
    assert_eq!(worker["observed"]["code"], 137);

    let (code, out, err) = run(&[
        "destroy",
        EXAMPLE,
        "-auto-approve",
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    for node in ["sf-node1", "sf-node2"] {
        let left = tb.example_model_left(node);
        assert!(left.trim().is_empty(), "model files left on {node}: {left}");
    }
    tb.clear_leftovers();
}

//! Adopting a deployment started by hand on the testbed: the fabric addresses set with `ip`,
//! the Ray head, the worker and the vLLM stand-in started with `docker run` and the very flags
//! the modules would use; `import` blocks; a plan that shows the imports and nothing else to
//! change; an apply that restarts nothing; then a vLLM flag change that replaces only vLLM. And a
//! hand-started container one env var away from its definition plans exactly that difference.

use crate::common;

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::testbed::{sparkform, testbed, Testbed};
use serde_json::Value;

/// Quoted for the node's shell.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The `docker run` line for a container's desired configuration (as the plan shows it), the
/// way a person or a seed script writes it: written here, not through sparkform's Docker calls.
fn docker_run(c: &Value) -> String {
    let mut a = vec!["docker".to_string(), "run".into(), "-d".into()];
    let mut flag = |f: &str, v: String| {
        a.push(f.to_string());
        a.push(q(&v));
    };
    let s = |k: &str| c.get(k).and_then(|v| v.as_str()).map(str::to_string);
    if let Some(n) = s("name") {
        flag("--name", n);
    }
    for (k, f) in [
        ("network_mode", "--network"),
        ("ipc_mode", "--ipc"),
        ("pid_mode", "--pid"),
        ("user", "--user"),
        ("working_dir", "--workdir"),
        ("restart", "--restart"),
    ] {
        if let Some(v) = s(k) {
            flag(f, v);
        }
    }
    if let Some(n) = c.get("shm_size").and_then(|v| v.as_i64()) {
        flag("--shm-size", format!("{n}b"));
    }
    match c.get("gpus") {
        Some(Value::String(g)) => flag("--gpus", g.clone()),
        Some(Value::Number(n)) => flag("--gpus", n.to_string()),
        _ => {}
    }
    for d in strs(&c["devices"]) {
        flag("--device", d);
    }
    for v in strs(&c["volumes"]) {
        flag("-v", v);
    }
    for cap in strs(&c["cap_add"]) {
        flag("--cap-add", cap);
    }
    if let Some(u) = c.get("ulimits").and_then(|u| u.as_object()) {
        for (k, v) in u {
            flag(
                "--ulimit",
                format!("{k}={}", v.as_str().unwrap_or_default()),
            );
        }
    }
    if let Some(e) = c.get("env").and_then(|e| e.as_object()) {
        for (k, v) in e {
            flag("-e", format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    let mut command = strs(&c["command"]);
    let entry = strs(&c["entrypoint"]);
    if let Some((first, rest)) = entry.split_first() {
        flag("--entrypoint", first.clone());
        command.splice(0..0, rest.iter().cloned());
    }
    a.push(q(c["image"].as_str().unwrap_or_default()));
    a.extend(command.iter().map(|x| q(x)));
    a.join(" ")
}

/// `docker inspect` of a running container: (full ID, StartedAt).
fn started(tb: &Testbed, node: &str, name: &str) -> (String, String) {
    let out = tb.ssh(
        node,
        &format!(
            "docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {}",
            q(name)
        ),
    );
    let mut parts = out.split_whitespace();
    let id = parts.next().unwrap_or_default().to_string();
    let at = parts.next().unwrap_or_default().to_string();
    assert!(!id.is_empty(), "{name} does not run on {node}");
    (id, at)
}

/// Wait (bounded) until `cmd` on `node` exits 0.
fn wait_for(tb: &Testbed, node: &str, cmd: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tb
            .ssh(node, &format!("{cmd} >/dev/null 2>&1 && echo ok"))
            .trim()
            == "ok"
        {
            return true;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    false
}

/// The testbed example in a folder of its own (its modules by absolute path), so import
/// blocks can be added beside it. The seed's script predates the model block (a model has no
/// import): the hand-started vLLM serves a hub id, so the copy does too.
fn example_copy(dir: &Path) {
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("modules");
    let main = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/testbed-standin/main.hcl"),
    )
    .unwrap()
    .replace("../../modules", modules.to_str().unwrap());
    let start = main
        .find("model \"qwen\" {")
        .expect("the example's model block");
    let end = start + main[start..].find("\n}\n").expect("its end") + 3;
    let main = format!("{}{}", &main[..start], &main[end..]).replace(
        "  weights                = model.qwen\n",
        "  model                  = \"Qwen/Qwen3-0.6B\"\n",
    );
    assert!(!main.contains("= model.qwen"), "{main}");
    std::fs::write(dir.join("main.hcl"), main).unwrap();
}

fn plan_json(dir: &str, st: &str, extra: &[&str]) -> Value {
    let mut a = vec!["plan", dir, "--json", "-state", st];
    a.extend(extra);
    let (code, out, err) = sparkform(&a);
    assert_eq!(code, 0, "{out}\n{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn actions(plan: &Value, action: &str) -> Vec<String> {
    plan["plan"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["action"] == action)
        .map(|c| c["address"].as_str().unwrap_or_default().to_string())
        .collect()
}

const HEAD: &str = "module.qwen.module.ray.container.ray_head";
const WORKER: &str = "module.qwen.module.ray.container.ray_worker[\"node2\"]";
const VLLM: &str = "module.qwen.container.vllm";
/// One test at a time (the file's tests run two at once): two deploy the testbed example under
/// the same container names, and each begins by removing every `sparkform-` container.
static EXAMPLE_IN_USE: Mutex<()> = Mutex::new(());
/// examples/testbed-standin's `api_key` default.
const TESTBED_API_KEY: &str = "sparkform-testbed-key";

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_deployment_started_by_hand_is_imported_without_a_restart() {
    let tb = testbed();
    let _one = EXAMPLE_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    example_copy(tmp.path());
    let dir = tmp.path().to_str().unwrap().to_string();
    let state = tmp.path().join("state.json");
    let st = state.to_str().unwrap().to_string();

    // What the definitions want, from a plan against nothing.
    let fresh = plan_json(&dir, &st, &["-refresh=false"]);
    let after = |address: &str| -> Value {
        fresh["plan"]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["address"] == address)
            .unwrap_or_else(|| panic!("no {address} in the plan"))["after"]
            .clone()
    };
    // The seed's script, by hand: the fabric, then Ray, then vLLM.
    for (node, ip) in [("sf-node1", "192.168.200.1"), ("sf-node2", "192.168.200.2")] {
        tb.ssh(node, &format!("ip addr replace {ip}/24 dev enp1s0f0np0 && ip link set dev enp1s0f0np0 mtu 9000 up"));
    }
    let head = after(HEAD);
    tb.ssh("sf-node1", &docker_run(&head));
    assert!(
        wait_for(
            &tb,
            "sf-node1",
            "docker exec sparkform-ray-head ray status --address=192.168.200.1:6379",
            Duration::from_secs(120)
        ),
        "the hand-started Ray head did not come up"
    );
    tb.ssh("sf-node2", &docker_run(&after(WORKER)));
    // The plan shows the endpoint's key as sensitive; the person who starts vLLM by hand has
    // it (the testbed example's throwaway key).
    let mut vllm = after(VLLM);
    vllm["env"]["VLLM_API_KEY"] = Value::from(TESTBED_API_KEY);
    tb.ssh("sf-node1", &docker_run(&vllm));
    assert!(
        wait_for(
            &tb,
            "sf-node1",
            "curl -sf http://192.168.200.1:30000/health",
            Duration::from_secs(240)
        ),
        "the hand-started vLLM did not come up: {}",
        tb.ssh("sf-node1", "docker logs --tail 30 sparkform-vllm 2>&1")
    );
    let before = [
        ("sf-node1", "sparkform-ray-head"),
        ("sf-node2", "sparkform-ray-worker-node2"),
        ("sf-node1", "sparkform-vllm"),
    ]
    .map(|(n, c)| started(&tb, n, c));

    std::fs::write(
        tmp.path().join("imports.hcl"),
        format!(
            r#"
import {{
  to = network.roce.attach.node1
  id = "node1:192.168.200.1/24"
}}
import {{
  to = network.roce.attach.node2
  id = "node2:192.168.200.2/24"
}}
import {{
  to = {HEAD}
  id = "node1:sparkform-ray-head"
}}
import {{
  to = {WORKER}
  id = "node2:sparkform-ray-worker-node2"
}}
import {{
  to = {VLLM}
  id = "node1:sparkform-vllm"
}}
"#
        ),
    )
    .unwrap();

    // The plan: five imports, nothing to create, change, replace or destroy.
    let p = plan_json(&dir, &st, &[]);
    assert_eq!(
        p["plan"]["imports"].as_array().map(Vec::len),
        Some(5),
        "{p:#}"
    );
    for a in ["create", "update", "replace", "delete"] {
        assert_eq!(actions(&p, a), Vec::<String>::new(), "{a}: {p:#}");
    }
    let (code, text, err) = sparkform(&["plan", &dir, "-state", &st]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains(&format!("<= {VLLM} will be imported")),
        "{text}"
    );
    assert!(
        text.contains("the labels come with its next replacement"),
        "{text}"
    );
    assert!(
        text.contains("Plan: 5 to import, 0 to add, 0 to change, 0 to replace, 0 to destroy"),
        "{text}"
    );

    // Apply: recorded, nothing restarted.
    let (code, out, err) = sparkform(&["apply", &dir, "-auto-approve", "-state", &st]);
    assert_eq!(code, 0, "{out}\n{err}");
    let now = [
        ("sf-node1", "sparkform-ray-head"),
        ("sf-node2", "sparkform-ray-worker-node2"),
        ("sf-node1", "sparkform-vllm"),
    ]
    .map(|(n, c)| started(&tb, n, c));
    assert_eq!(before, now, "a container was restarted");
    // The next plan: nothing to do (the blocks stay and are no-ops).
    let (code, out, err) = sparkform(&["plan", &dir, "-state", &st, "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("No changes."), "{out}");

    // A vLLM flag changes: only vLLM is replaced.
    let p = plan_json(&dir, &st, &["-var", "max_model_len=4096"]);
    assert_eq!(actions(&p, "replace"), [VLLM], "{p:#}");
    for a in ["create", "update", "delete"] {
        assert_eq!(actions(&p, a), Vec::<String>::new(), "{a}: {p:#}");
    }
    let (code, out, err) = sparkform(&[
        "apply",
        &dir,
        "-auto-approve",
        "-state",
        &st,
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(started(&tb, "sf-node1", "sparkform-ray-head"), before[0]);
    assert_eq!(
        started(&tb, "sf-node2", "sparkform-ray-worker-node2"),
        before[1]
    );
    let vllm = started(&tb, "sf-node1", "sparkform-vllm");
    assert_ne!(vllm.0, before[2].0, "vLLM was replaced");
    let labels = tb.ssh(
        "sf-node1",
        "docker inspect -f '{{index .Config.Labels \"sparkform.address\"}}' sparkform-vllm",
    );
    assert_eq!(labels.trim(), VLLM, "the labels came with the replacement");

    let (code, out, err) = sparkform(&[
        "destroy",
        &dir,
        "-auto-approve",
        "-state",
        &st,
        "-var",
        "max_model_len=4096",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    tb.clear_leftovers();
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_hand_started_container_one_env_var_away_plans_exactly_that() {
    let tb = testbed();
    let _one = EXAMPLE_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let mut hcl = tb.hcl(&[("node1", "sf-node1")], &tb.known_hosts(), 2222);
    hcl.push_str(
        r#"
container "sleeper" {
  node    = node.node1
  name    = "sparkform-import-sleeper"
  image   = "sparkform-testbed/ray:latest"
  command = ["sleep", "infinity"]
  env     = { MODE = "served", SHARED = "yes" }
}

import {
  to = container.sleeper
  id = "node1:sparkform-import-sleeper"
}
"#,
    );
    std::fs::write(tmp.path().join("main.hcl"), hcl).unwrap();
    let dir = tmp.path().to_str().unwrap().to_string();
    let st = tmp.path().join("state.json").to_str().unwrap().to_string();
    tb.ssh("sf-node1", "docker rm -f sparkform-import-sleeper >/dev/null 2>&1; docker run -d --name sparkform-import-sleeper -e MODE=debug -e SHARED=yes sparkform-testbed/ray:latest sleep infinity >/dev/null");
    let p = plan_json(&dir, &st, &[]);
    let c = p["plan"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["address"] == "container.sleeper")
        .cloned()
        .unwrap();
    assert_eq!(c["action"], "replace", "{c:#}");
    let attrs = c["attributes"].as_array().unwrap();
    let paths: Vec<&str> = attrs.iter().filter_map(|a| a["path"].as_str()).collect();
    assert_eq!(paths, ["env.MODE"], "{c:#}");
    assert_eq!(attrs[0]["before"], "debug");
    assert_eq!(attrs[0]["after"], "served");
    // A wrong id is an error with the block's place, before anything is recorded.
    std::fs::write(
        tmp.path().join("main.hcl"),
        std::fs::read_to_string(tmp.path().join("main.hcl"))
            .unwrap()
            .replace(
                "node1:sparkform-import-sleeper",
                "node1:sparkform-import-nobody",
            ),
    )
    .unwrap();
    let (code, out, err) = sparkform(&["plan", &dir, "-state", &st]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("there is no container sparkform-import-nobody on node.node1"),
        "{err}"
    );
    assert!(err.contains("main.hcl"), "{err}");
    assert!(!tmp.path().join("state.json").exists(), "nothing recorded");
    tb.ssh(
        "sf-node1",
        "docker rm -f sparkform-import-sleeper >/dev/null 2>&1",
    );
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_lost_state_is_adopted_back_with_generated_import_blocks_without_a_restart() {
    let tb = testbed();
    let _one = EXAMPLE_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    tb.clear_leftovers();
    let tmp = tempfile::tempdir().unwrap();
    example_copy(tmp.path());
    let dir = tmp.path().to_str().unwrap().to_string();
    let state = tmp.path().join("state.json");
    let st = state.to_str().unwrap().to_string();
    let (code, out, err) = sparkform(&["apply", &dir, "-auto-approve", "-state", &st]);
    assert_eq!(code, 0, "{out}\n{err}");
    let containers = [
        ("sf-node1", "sparkform-ray-head"),
        ("sf-node2", "sparkform-ray-worker-node2"),
        ("sf-node1", "sparkform-vllm"),
    ];
    let before = containers.map(|(n, c)| started(&tb, n, c));
    let lineage: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    let lineage = lineage["lineage"].as_str().unwrap().to_string();

    // The state is lost: the plan names what runs under its lineage.
    std::fs::remove_file(&state).unwrap();
    let _ = std::fs::remove_file(tmp.path().join("state.json.backup"));
    let p = plan_json(&dir, &st, &[]);
    let mut listed: Vec<(String, String)> = p["plan"]["foreign"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["address"].as_str().unwrap_or_default().to_string(),
                        f["lineage"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    listed.sort();
    let mut wanted = [HEAD, VLLM, WORKER]
        .map(|a| (a.to_string(), lineage.clone()))
        .to_vec();
    wanted.sort();
    assert_eq!(listed, wanted, "{p:#}");
    let (code, text, err) = sparkform(&["plan", &dir, "-state", &st]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains(&format!("! {VLLM} on node.node1: container sparkform-vllm")),
        "{text}"
    );
    assert!(text.contains("-generate-import-out=FILE"), "{text}");

    // One command writes the blocks; the apply adopts, restarting nothing.
    let imports = tmp.path().join("imports.hcl");
    let out_arg = format!("-generate-import-out={}", imports.display());
    let (code, out, err) = sparkform(&["plan", &dir, "-state", &st, &out_arg]);
    assert_eq!(code, 0, "{out}\n{err}");
    let written = std::fs::read_to_string(&imports).unwrap();
    assert_eq!(written.matches("import {").count(), 3, "{written}");
    let p = plan_json(&dir, &st, &[]);
    assert_eq!(
        p["plan"]["imports"].as_array().map(Vec::len),
        Some(3),
        "{p:#}"
    );
    for a in ["update", "replace", "delete"] {
        assert_eq!(actions(&p, a), Vec::<String>::new(), "{a}: {p:#}");
    }
    let (code, out, err) = sparkform(&["apply", &dir, "-auto-approve", "-state", &st]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        before,
        containers.map(|(n, c)| started(&tb, n, c)),
        "a container was restarted"
    );
    let (code, out, err) = sparkform(&["plan", &dir, "-state", &st, "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}\n{err}");

    let (code, out, err) = sparkform(&["destroy", &dir, "-auto-approve", "-state", &st]);
    assert_eq!(code, 0, "{out}\n{err}");
    tb.clear_leftovers();
}

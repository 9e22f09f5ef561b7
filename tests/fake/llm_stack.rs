//! The Ray/vLLM modules at plan time: checks that refuse known-bad deployments, and the exact
//! container configuration the seed example creates.

use crate::common;
use sparkform::kind::DesiredConfig;
use sparkform::vocabulary::KindId;

use std::path::Path;

use sparkform::config::{self, VarInputs};
use sparkform::kinds::container::machine::create_body;

fn load_err(text: &str) -> String {
    let dir = common::write_config(&[("main.hcl", text)]);
    match config::load(dir.path(), &VarInputs::default()) {
        Ok(_) => panic!("loaded without errors"),
        // Messages, not the rendered report: miette wraps long lines.
        Err(d) => {
            d.0.iter()
                .map(|x| x.message.clone())
                .collect::<Vec<_>>()
                .join("\n")
        }
    }
}

/// The testbed example, with its module source made absolute so it loads from a temp dir.
/// An example's main.hcl with its module source made absolute, so it loads from a temp dir.
fn example(name: &str) -> String {
    let modules = std::fs::canonicalize("modules/vllm-ray").unwrap();
    std::fs::read_to_string(format!("examples/{name}/main.hcl"))
        .unwrap()
        .replace(
            "\"../../modules/vllm-ray\"",
            &format!("{:?}", modules.display().to_string()),
        )
}

fn testbed_example() -> String {
    example("testbed-standin")
}

#[test]
fn a_ray_head_on_the_management_network_is_refused_naming_the_fabric_subnet() {
    let text = testbed_example().replace(
        "  health_timeout",
        "  head_address = \"10.199.0.11\"\n  health_timeout",
    );
    let err = load_err(&text);
    assert!(err.contains("check `head_on_fabric` failed"), "{err}");
    assert!(
        err.contains("10.199.0.11 is not in the fabric subnet 192.168.200.0/24"),
        "{err}"
    );
}

#[test]
fn parallelism_must_match_the_gpus() {
    let text =
        testbed_example().replace("tensor_parallel_size   = 2", "tensor_parallel_size   = 4");
    let err = load_err(&text);
    assert!(err.contains("tensor_parallel_size × pipeline_parallel_size = 4, but the head and workers declare 2 GPUs"), "{err}");
}

#[test]
fn interfaces_must_match_and_the_model_must_fit() {
    let text = example("qwen35-two-sparks")
        .replacen(
            "interface = \"enp1s0f0np0\"",
            "interface = \"enp1s0f1np1\"",
            1,
        )
        .replace(
            "model_size_gib         = 111",
            "model_size_gib         = 240",
        );
    let err = load_err(&text);
    assert!(
        err.contains("same_interface_everywhere") && err.contains("enp1s0f1np1, enp1s0f0np0"),
        "{err}"
    );
    assert!(
        err.contains("model_fits") && err.contains("more than 120 GiB × 0.8"),
        "{err}"
    );
}

#[test]
fn high_utilization_on_unified_memory_is_a_warning() {
    let text = example("qwen35-two-sparks")
        .replace(
            "memory_gib = 120",
            "memory_gib = 120\n  unified_memory = true",
        )
        .replace(
            "gpu_memory_utilization = 0.80",
            "gpu_memory_utilization = 0.90",
        );
    let dir = common::write_config(&[("main.hcl", &text)]);
    let c = config::load(dir.path(), &VarInputs::default()).expect("a warning is not an error");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.message.contains("above 0.85 on unified-memory nodes")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn golden_container_configuration_of_the_seed_example() {
    let (c, _) = common::load_resolved(Path::new("examples/qwen35-two-sparks"));
    let mut out = String::new();
    for r in c.resources.iter().filter(|r| r.kind == KindId::Container) {
        let desired = sparkform::kinds::container::Desired::from_config(&r.config).unwrap();
        let body = create_body(&desired, "LINEAGE", &r.address, "sha256:CONFIG");
        let mut v = serde_json::to_value(&body).unwrap();
        if let Some(env) = v.get_mut("Env").and_then(|e| e.as_array_mut()) {
            env.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
        }
        out.push_str(&format!(
            "# {} on {}\n{}\n\n",
            r.address,
            r.node.as_deref().unwrap_or("?"),
            serde_json::to_string_pretty(&v).unwrap()
        ));
    }
    insta::assert_snapshot!("seed_containers", out);
}

#[test]
fn the_projects_own_hcl_is_formatted() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args(["fmt", "--check", "--recursive", "examples", "modules"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn vllm_fail_fast_patterns_catch_each_known_failure() {
    let (c, _) = common::load(Path::new("examples/qwen35-two-sparks"));
    let vllm = c.resource("module.qwen.container.vllm").expect("vllm");
    let patterns = vllm.config["ready"][0]["fail_on_log"]
        .as_object()
        .expect("fail_on_log");
    // Log lines as vLLM and Ray print them when each of these happens.
    let samples = [
        ("Waiting for creating a placement group of specs for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]", "RAY_ADDRESS"),
        ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", "RAY_memory_monitor_refresh_ms=0"),
        ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144]", "GLOO_SOCKET_IFNAME"),
        ("ValueError: Model architectures ['Qwen3_5MoeForCausalLM'] are not supported for now.", "architecture"),
        ("ValueError: Free memory on device (101.2/119.7 GiB) on startup is less than desired GPU memory utilization (0.9, 107.7 GiB).", "gpu_memory_utilization"),
    ];
    for (line, fix_mentions) in samples {
        let hits: Vec<&str> = patterns
            .iter()
            .filter(|(re, _)| regex::Regex::new(re).unwrap().is_match(line))
            .map(|(_, fix)| fix.as_str().unwrap())
            .collect();
        assert_eq!(hits.len(), 1, "{line}: {hits:?}");
        assert!(hits[0].contains(fix_mentions), "{line}: {}", hits[0]);
    }
    let healthy = "INFO: Application startup complete.";
    assert!(!patterns
        .keys()
        .any(|re| regex::Regex::new(re).unwrap().is_match(healthy)));
}

/// Every example serves its model block's verified snapshot offline: the snapshot path as the
/// model, the repository as the served name, the cache mounted read-only with HF_HUB_OFFLINE=1 in
/// every container, and every container waiting for the weights of every node.
#[test]
fn every_example_serves_its_model_blocks_snapshot_offline() {
    let examples = [
        (
            "qwen35-two-sparks",
            "Qwen/Qwen3.5-122B-A10B-FP8",
            "/home/nvidia/.cache/huggingface/hub",
            "spark",
        ),
        (
            "qwen35-two-sparks-mp",
            "Qwen/Qwen3.5-122B-A10B-FP8",
            "/home/nvidia/.cache/huggingface/hub",
            "spark",
        ),
        (
            "qwen35-two-sparks-sglang",
            "Qwen/Qwen3.5-122B-A10B-FP8",
            "/home/nvidia/.cache/huggingface/hub",
            "spark",
        ),
        (
            "testbed",
            "testbed/tiny-qwen3",
            "/tmp/sparkform-models",
            "node",
        ),
        (
            "testbed-standin",
            "testbed/standin-qwen3",
            "/tmp/sparkform-models",
            "node",
        ),
        (
            "testbed-mp",
            "testbed/standin-qwen3",
            "/tmp/sparkform-models",
            "node",
        ),
        (
            "testbed-sglang",
            "testbed/standin-qwen3",
            "/tmp/sparkform-models",
            "node",
        ),
    ];
    for (name, repo, cache, node) in examples {
        let (c, _) = common::load_resolved(Path::new(&format!("examples/{name}")));
        let snapshot = format!(
            "{cache}/models--{}/snapshots/{}",
            repo.replace('/', "--"),
            common::RESOLVED_COMMIT
        );
        let containers: Vec<_> = c
            .resources
            .iter()
            .filter(|r| r.kind == KindId::Container)
            .collect();
        assert!(containers.len() >= 2, "{name}");
        let mut serving = 0;
        for r in containers {
            let at = format!("{name}: {}", r.address);
            assert_eq!(r.config["env"]["HF_HUB_OFFLINE"], "1", "{at}");
            let ro = format!("{cache}:{cache}:ro");
            assert!(
                r.config["volumes"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == ro.as_str())),
                "{at}: {}",
                r.config["volumes"]
            );
            for n in [format!("{node}1"), format!("{node}2")] {
                assert!(
                    r.deps.contains(&format!("model.qwen[\"{n}\"]")),
                    "{at} waits for {n}'s weights: {:?}",
                    r.deps
                );
            }
            let cmd: Vec<&str> = r.config["command"]
                .as_array()
                .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            // `vllm serve MODEL`, or SGLang's `--model-path MODEL`.
            if let Some(i) = cmd
                .iter()
                .position(|a| *a == "serve" || *a == "--model-path")
            {
                serving += 1;
                assert_eq!(cmd.get(i + 1), Some(&snapshot.as_str()), "{at}: {cmd:?}");
                let named = cmd.iter().position(|a| *a == "--served-model-name");
                if let Some(j) = named {
                    assert_eq!(cmd.get(j + 1), Some(&repo), "{at}");
                }
            }
        }
        assert!(serving >= 1, "{name}: no container serves the model");
        // The architecture check asks vLLM's registry in the image that serves (not for an
        // SGLang image).
        let download = c
            .resource(&format!("model.qwen[\"{node}1\"]"))
            .expect("the download node's resource");
        assert_eq!(download.config["role"], "download", "{name}");
        if name.contains("sglang") {
            assert!(download.config["serve_image"].is_null(), "{name}");
        } else {
            // The image the architecture check asks is the one that serves (the download may
            // run in a smaller one that carries the hub's client: examples/testbed).
            let serving_image = c
                .resources
                .iter()
                .find(|r| {
                    r.kind == KindId::Container
                        && r.config["command"]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|x| x == "serve"))
                })
                .map(|r| r.config["image"].clone())
                .expect("a serving container");
            assert_eq!(download.config["serve_image"], serving_image, "{name}");
        }
    }
}

/// The seed examples' hub token is an ephemeral variable: a plan never shows the token and
/// records nothing of it, not even its keyed hash (the download node's model has no `token`).
#[test]
fn the_seed_examples_token_never_shows() {
    for name in [
        "qwen35-two-sparks",
        "qwen35-two-sparks-mp",
        "qwen35-two-sparks-sglang",
        "qwen35-four-sparks-replicas",
    ] {
        let dir = Path::new("examples").join(name);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
            .args([
                "plan",
                dir.to_str().unwrap_or_default(),
                "-refresh=false",
                "--json",
            ])
            .args(["-var", &format!("rev={}", common::RESOLVED_COMMIT)])
            .env("SPARKFORM_VAR_hf_token", "hf_seed_example_secret")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(
            !stdout.contains("hf_seed_example_secret")
                && !stderr.contains("hf_seed_example_secret"),
            "{name}"
        );
        let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let after = plan["plan"]["changes"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["address"] == "model.qwen[\"spark1\"]"))
            .map(|c| c["after"].clone())
            .unwrap_or_default();
        assert_eq!(after["role"], "download", "{name}: {after}");
        assert!(after.get("token").is_none(), "{name}: {after}");
    }
}

#[test]
fn the_api_key_reaches_vllm_by_its_environment_and_the_probe_sends_it_never_shown() {
    const KEY: &str = "sparkform-testbed-key";
    let (c, g) = common::load_resolved(Path::new("examples/testbed-standin"));
    let vllm = c.resource("module.qwen.container.vllm").unwrap();
    assert_eq!(vllm.config["env"]["VLLM_API_KEY"], KEY);
    assert!(
        !vllm.config["command"].to_string().contains(KEY),
        "never on its command line"
    );
    let probe = c.resource("probe.hello").unwrap();
    assert_eq!(
        probe.config["http"]["headers"]["Authorization"],
        format!("Bearer {KEY}")
    );
    assert!(
        !c.warnings
            .iter()
            .any(|w| w.message.contains("without an api_key")),
        "a key: no warning"
    );
    // `tunnel --exec` hands the probes' header to its command, for the endpoint and the probe.
    for what in ["endpoint", "probe.hello"] {
        let t = sparkform::ops::tunnel::resolve(&c, Some(what)).unwrap();
        assert_eq!(
            t.authorization.as_deref(),
            Some("Bearer sparkform-testbed-key"),
            "{what}"
        );
    }
    let p = common::plan(&c, &g, &sparkform::state::State::new());
    let text = sparkform::plan::render::render(&p);
    let json = serde_json::to_string(&p).unwrap();
    assert!(!text.contains(KEY) && !json.contains(KEY), "{text}");

    // Without a key, an endpoint on every network of the node is a warning; on loopback not.
    let warns = |text: &str| {
        let dir = common::write_config(&[("main.hcl", text)]);
        let c = config::load(dir.path(), &VarInputs::default()).unwrap();
        c.warnings
            .iter()
            .any(|w| w.message.contains("without an api_key"))
    };
    let keyless = example("testbed-standin").replace("= var.api_key", "= null");
    assert!(warns(&keyless), "no key, listening on 0.0.0.0");
    let local = keyless.replace(
        "api_key                = null",
        "api_key                = null\n  listen                 = \"127.0.0.1\"",
    );
    assert_ne!(local, keyless);
    assert!(!warns(&local), "no key, listening on the node alone");
}

/// Two tensor-parallel pairs (modules/vllm-mp, twice) behind one HAProxy: the router's replicas
/// are each pair's ranks, its rendezvous gate and its own completion, so a change rolls one
/// pair at a time (tests/fake/rolling.rs shows the order with process groups).
#[test]
fn the_four_spark_example_puts_two_tensor_parallel_pairs_behind_one_router() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args([
            "plan",
            "examples/qwen35-four-sparks-replicas",
            "-refresh=false",
            "--json",
        ])
        .args(["-var", &format!("rev={}", common::RESOLVED_COMMIT)])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
    let router = plan["plan"]["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["address"] == "module.router.router.endpoint")
        .unwrap_or_else(|| panic!("no router in {stdout}"));
    let replicas = &router["after"]["replicas"];
    for (k, head) in [("a", "192.168.200.1"), ("b", "192.168.200.3")] {
        assert_eq!(replicas[k]["address"], format!("{head}:30000"), "{router}");
        let members: Vec<&str> = replicas[k]["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str())
            .collect();
        assert_eq!(
            members,
            [
                format!("module.pair_{k}.container.rank0"),
                format!(
                    "module.pair_{k}.container.rank[\"spark{}\"]",
                    if k == "a" { 2 } else { 4 }
                ),
                format!("module.pair_{k}.probe.rendezvous"),
                format!("probe.direct_{k}"),
            ],
            "{router}"
        );
    }
}

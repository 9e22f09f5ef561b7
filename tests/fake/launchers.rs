//! The launcher modules at plan time: vllm-ray and vllm-mp loaded together
//! (tests/fixtures/launchers/both), their fail-fast log signatures against the lines vLLM,
//! torch.distributed, NCCL, Ray and Docker print, the lines that are benign on DGX Spark, the
//! multiprocessing flags of every rank, and the plan-time warnings.

use crate::common;

use std::path::Path;

use sparkform::config::{self, Config, Resource, VarInputs};

const FIXTURE: &str = "tests/fixtures/launchers/both";

fn load_with(vars: &[(&str, &str)]) -> Config {
    common::load_with(Path::new(FIXTURE), &common::var_inputs(vars)).0
}

fn load() -> Config {
    load_with(&[])
}

fn resource<'a>(c: &'a Config, address: &str) -> &'a Resource {
    c.resource(address)
        .unwrap_or_else(|| panic!("{address} is not in the configuration"))
}

/// The `fail_on_log` patterns of a container's ready checks, with their fixes.
fn patterns(c: &Config, address: &str) -> Vec<(regex::Regex, String)> {
    log_patterns(c, address, "fail_on_log")
}

/// The `fail_on_log` or `warn_on_log` patterns of a container's ready checks, with their fixes.
fn log_patterns(c: &Config, address: &str, attr: &str) -> Vec<(regex::Regex, String)> {
    resource(c, address).config["ready"]
        .as_array()
        .expect("ready checks")
        .iter()
        .filter_map(|r| r[attr].as_object())
        .flat_map(|m| m.iter())
        .map(|(re, fix)| {
            (
                regex::Regex::new(re).unwrap_or_else(|e| panic!("{re}: {e}")),
                fix.as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn hits<'a>(patterns: &'a [(regex::Regex, String)], line: &str) -> Vec<&'a str> {
    patterns
        .iter()
        .filter(|(re, _)| re.is_match(line))
        .map(|(_, fix)| fix.as_str())
        .collect()
}

const MP_RANKS: [&str; 2] = [
    "module.mp.container.rank0",
    "module.mp.container.rank[\"spark2\"]",
];
const RAY_VLLM: &str = "module.ray.container.vllm";
const RAY_HEAD: &str = "module.ray.module.ray.container.ray_head";

/// Failures of any vLLM container, as printed: (line, a word its fix must contain).
const GPU_AND_VLLM: [(&str, &str); 12] = [
    ("[rank1]:[E714 10:31:02.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=34521, OpType=_ALLGATHER_BASE, NumelIn=4096, NumelOut=8192, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.", "one NCCL"),
    ("RuntimeError: CUDA error: the provided PTX was compiled with an unsupported toolchain. (cudaErrorUnsupportedPtxVersion)", "driver"),
    ("torch.AcceleratorError: CUDA error: the provided PTX was compiled with an unsupported toolchain.", "driver"),
    ("docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy' nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.", "kernel modules"),
    ("(RayWorkerWrapper pid=2211, ip=192.168.200.2) spark2:2211:2290 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.200.2<0>", "RoCE"),
    ("spark1:812:901 [0] NCCL INFO Using network Socket", "IPC_LOCK"),
    ("INFO 07-14 10:12:44 [gpu_worker.py:298] Available KV cache memory: -2.26 GiB", "KV cache"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 119.70 GiB of which 1.03 GiB is free.", "VLLM::EngineCore"),
    ("torch.AcceleratorError: CUDA error: out of memory", "available memory"),
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error", "GLOO_SOCKET_IFNAME"),
    ("ValueError: Model architectures ['Qwen3_5MoeForCausalLM'] are not supported for now.", "architecture"),
    ("ValueError: Free memory on device (101.2/119.7 GiB) on startup is less than desired GPU memory utilization (0.9, 107.7 GiB).", "gpu_memory_utilization"),
];

/// Failures of vLLM's multiprocessing ranks (torch.distributed's lines).
const MP_ONLY: [(&str, &str); 3] = [
    ("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to connect to (192.168.200.1, 29501).", "master port"),
    ("torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients joined.", "not every rank joined"),
    ("[rank1]:[W714 10:40:01.000000000 ProcessGroupNCCL.cpp:1385] [PG ID 0 PG GUID 0 Rank 1] Failed to check the \"should dump\" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: Connection reset by peer", "rank 0 went away"),
];

/// Failures of the Ray path.
const RAY_ONLY: [(&str, &str); 5] = [
    ("RuntimeError: Version mismatch: The cluster was started with:", "same image"),
    ("/bin/bash: line 1: ray: command not found", "vllm-mp"),
    ("/opt/nvidia/nvidia_entrypoint.sh: line 67: exec: ray: not found", "vllm-mp"),
    ("Waiting for creating a placement group of specs for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]", "RAY_ADDRESS"),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", "RAY_memory_monitor_refresh_ms=0"),
];

/// Lines that look alarming but are normal on DGX Spark, and lines of a healthy start.
const HARMLESS: [&str; 11] = [
    "WARNING 07-14 10:05:31 [fused_moe.py:727] Using default MoE config. Performance might be sub-optimal! Config file not found at /usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/fused_moe/configs/E=256,N=512,device_name=NVIDIA_GB10.json",
    "[2026-07-14 10:05:02] [cufile] GDS is not supported in this platform",
    "spark1:812:901 [0] NCCL INFO GPU Direct RDMA Disabled for HCA 0 'rocep1s0f0'",
    "WARNING 07-14 10:02:11 [custom_all_reduce.py:87] CustomAllreduce is disabled because this process group spans across nodes.",
    "INFO 07-14 10:03:00 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
    "spark1:812:901 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.200.1<0>",
    "spark1:812:901 [0] NCCL INFO Using network IB",
    "[W714 10:39:00.000000000 socket.cpp:759] [c10d] The client socket has failed to connect to [192.168.200.1]:29501 (errno: 111 - Connection refused).",
    "INFO 07-14 10:20:00 [gpu_worker.py:298] Available KV cache memory: 41.37 GiB",
    "INFO:     Application startup complete.",
    // Ray 2.60's raylet, at every start (its format string, bench/compat found it).
    "Event memory monitor successfully initialized with memory events path: %s",
];

fn assert_each_line_has_one_fix(c: &Config, address: &str, lines: &[(&str, &str)]) {
    let p = patterns(c, address);
    for (line, fix_mentions) in lines {
        let h = hits(&p, line);
        assert_eq!(h.len(), 1, "{address}: {line}\nmatched {h:?}");
        assert!(
            h[0].contains(fix_mentions),
            "{address}: {line}\nfix: {}",
            h[0]
        );
    }
}

#[test]
fn every_failure_line_matches_exactly_one_signature_with_its_fix() {
    let c = load();
    for rank in MP_RANKS {
        assert_each_line_has_one_fix(&c, rank, &GPU_AND_VLLM);
        assert_each_line_has_one_fix(&c, rank, &MP_ONLY);
    }
    assert_each_line_has_one_fix(&c, RAY_VLLM, &GPU_AND_VLLM);
    assert_each_line_has_one_fix(&c, RAY_VLLM, &RAY_ONLY);
    // The Ray head runs no GPU work itself, but a Ray it cannot start shows there.
    assert_each_line_has_one_fix(&c, RAY_HEAD, &RAY_ONLY[..3]);
}

#[test]
fn signatures_apply_only_where_their_software_runs() {
    let c = load();
    for rank in MP_RANKS {
        let p = patterns(&c, rank);
        for (line, _) in RAY_ONLY {
            assert!(
                hits(&p, line).is_empty(),
                "{rank} has a Ray pattern for {line}"
            );
        }
    }
    let p = patterns(&c, RAY_VLLM);
    for (line, _) in MP_ONLY {
        assert!(
            hits(&p, line).is_empty(),
            "the Ray driver has an mp pattern for {line}"
        );
    }
}

#[test]
fn no_signature_matches_a_benign_or_healthy_line() {
    let c = load();
    let watched = c
        .resources
        .iter()
        .filter(|r| r.config["ready"].is_array())
        .map(|r| r.address.clone())
        .collect::<Vec<_>>();
    assert_eq!(watched.len(), 4, "{watched:?}");
    for address in &watched {
        let p = patterns(&c, address);
        for line in HARMLESS {
            assert!(
                hits(&p, line).is_empty(),
                "{address} fails on a harmless line: {line}"
            );
        }
    }
}

#[test]
fn the_benign_list_of_the_modules_names_the_lines_the_notes_list() {
    let text = std::fs::read_to_string("modules/fabric-env/main.hcl").unwrap();
    for fragment in [
        "Using default MoE config",
        "GDS is not supported in this platform",
        "GPU Direct RDMA Disabled for HCA",
        "CustomAllreduce is disabled",
    ] {
        assert!(text.contains(fragment), "{fragment}");
    }
}

#[test]
fn socket_fallback_fails_or_warns_only_with_rdma_and_when_asked() {
    let line = GPU_AND_VLLM[4].0;
    // (inputs, fails, warns)
    for (vars, fails, warns) in [
        (vec![], true, false),
        (vec![("nccl_socket_fallback", "warn")], false, true),
        (vec![("nccl_socket_fallback", "allow")], false, false),
        (vec![("rdma", "false")], false, false),
        (
            vec![("rdma", "false"), ("nccl_socket_fallback", "warn")],
            false,
            false,
        ),
    ] {
        let c = load_with(&vars);
        for address in [MP_RANKS[0], MP_RANKS[1], RAY_VLLM] {
            let p = patterns(&c, address);
            assert_eq!(!hits(&p, line).is_empty(), fails, "{vars:?} {address}");
            let w = log_patterns(&c, address, "warn_on_log");
            assert_eq!(!hits(&w, line).is_empty(), warns, "{vars:?} {address}");
            if warns {
                assert!(hits(&w, line)[0].contains("RoCE"), "{vars:?} {address}");
            }
            let debug = &resource(&c, address).config["env"]["NCCL_DEBUG"];
            assert_eq!(
                debug.as_str() == Some("INFO"),
                fails || warns,
                "{vars:?} {address}"
            );
        }
    }
}

fn command(c: &Config, address: &str) -> Vec<String> {
    resource(c, address).config["command"]
        .as_array()
        .expect("command")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect()
}

/// The value after `flag` in a command line.
fn flag<'a>(cmd: &'a [String], name: &str) -> Option<&'a str> {
    cmd.iter()
        .position(|a| a == name)
        .and_then(|i| cmd.get(i + 1))
        .map(String::as_str)
}

#[test]
fn every_rank_gets_the_multiprocessing_flags_and_only_rank_0_serves() {
    let c = load();
    let rank0 = command(&c, MP_RANKS[0]);
    let rank1 = command(&c, MP_RANKS[1]);
    for cmd in [&rank0, &rank1] {
        assert_eq!(&cmd[..3], ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8"]);
        assert_eq!(flag(cmd, "--distributed-executor-backend"), Some("mp"));
        assert_eq!(flag(cmd, "--nnodes"), Some("2"));
        assert_eq!(flag(cmd, "--master-addr"), Some("192.168.200.1"));
        assert_eq!(flag(cmd, "--master-port"), Some("29501"));
        assert_eq!(flag(cmd, "--tensor-parallel-size"), Some("2"));
    }
    assert_eq!(flag(&rank0, "--node-rank"), Some("0"));
    assert_eq!(flag(&rank1, "--node-rank"), Some("1"));
    assert!(!rank0.contains(&"--headless".to_string()), "{rank0:?}");
    assert!(rank1.contains(&"--headless".to_string()), "{rank1:?}");
    // The Ray launcher keeps its own backend.
    assert_eq!(
        flag(&command(&c, RAY_VLLM), "--distributed-executor-backend"),
        Some("ray")
    );
}

#[test]
fn each_rank_runs_on_its_node_with_its_fabric_address_and_rdma() {
    let c = load();
    for (address, node, ip) in [
        (MP_RANKS[0], "node.spark1", "192.168.200.1"),
        (MP_RANKS[1], "node.spark2", "192.168.200.2"),
    ] {
        let r = resource(&c, address);
        assert_eq!(r.node.as_deref(), Some(node));
        let cfg = &r.config;
        assert_eq!(cfg["env"]["VLLM_HOST_IP"], ip, "{address}");
        assert_eq!(cfg["env"]["NCCL_SOCKET_IFNAME"], "enp1s0f0np0");
        assert_eq!(cfg["env"]["NCCL_IB_HCA"], "rocep1s0f0,roceP2p1s0f0");
        assert_eq!(cfg["network_mode"], "host");
        assert_eq!(cfg["ipc_mode"], "host");
        assert_eq!(cfg["devices"], serde_json::json!(["/dev/infiniband"]));
        assert_eq!(cfg["cap_add"], serde_json::json!(["IPC_LOCK"]));
        assert_eq!(cfg["ulimits"]["memlock"], "-1");
        assert_eq!(cfg["gpus"], "all");
    }
    let c = load_with(&[("rdma", "false")]);
    let cfg = &resource(&c, MP_RANKS[1]).config;
    for key in ["devices", "cap_add", "ulimits"] {
        assert!(cfg.get(key).is_none_or(|v| v.is_null()), "{key}: {cfg}");
    }
}

#[test]
fn the_ranks_start_together_and_each_is_ready_at_rank_0s_health() {
    let c = load();
    let rank0 = resource(&c, MP_RANKS[0]);
    let rank1 = resource(&c, MP_RANKS[1]);
    // A headless rank waits for rank 0's master port itself: no rank waits for another, and
    // every rank is ready when rank 0 answers /health (once all have joined).
    for r in [rank0, rank1] {
        assert_eq!(
            r.config["ready"][0]["http"],
            "http://192.168.200.1:30001/health"
        );
        assert!(r.config["ready"][0].get("tcp").is_none());
    }
    assert!(!rank1.deps.contains(MP_RANKS[0]), "{:?}", rank1.deps);
    assert_eq!(
        rank0.group, rank1.group,
        "one process group: one start gate"
    );
    // Not even through replace_triggered_by (an edge too): the process group replaces them
    // as one.
    assert!(rank1.replace_triggered_by.is_empty());
    assert!(!rank0.deps.contains(MP_RANKS[1]), "{:?}", rank0.deps);
    let gate = resource(&c, "module.mp.probe.rendezvous");
    assert!(gate.deps.contains(MP_RANKS[1]), "{:?}", gate.deps);
}

#[test]
fn a_changed_vllm_flag_is_in_every_rank() {
    let before = load();
    let after = load_with(&[("extra_args", "[\"--max-num-seqs\", \"8\"]")]);
    for rank in MP_RANKS {
        let (a, b) = (command(&before, rank), command(&after, rank));
        assert_ne!(a, b, "{rank}");
        assert_eq!(flag(&b, "--max-num-seqs"), Some("8"), "{rank}");
    }
}

#[test]
fn a_master_off_the_fabric_is_refused() {
    let dir = Path::new(FIXTURE);
    let inputs = VarInputs {
        cli: vec![("head_address".into(), "10.199.0.11".into())],
        ..VarInputs::default()
    };
    let err = match config::load(dir, &inputs) {
        Ok(_) => panic!("loaded without errors"),
        Err(d) => d.0.iter().map(|x| x.message.clone()).collect::<Vec<_>>(),
    };
    assert!(
        err.iter()
            .any(|m| m.contains("check `head_on_fabric` failed")
                && m.contains("10.199.0.11 is not in the fabric subnet 192.168.200.0/24")),
        "{err:?}"
    );
}

fn warnings(c: &Config) -> Vec<String> {
    c.warnings.iter().map(|w| w.message.clone()).collect()
}

#[test]
fn a_pinned_gid_index_is_a_warning_for_both_launchers() {
    let c = load_with(&[("extra_env", "{ NCCL_IB_GID_INDEX = \"3\" }")]);
    let w: Vec<String> = warnings(&c)
        .into_iter()
        .filter(|m| m.contains("NCCL_IB_GID_INDEX=3") && m.contains("ibv_modify_qp failed"))
        .collect();
    // One from each launcher's fabric.
    assert_eq!(w.len(), 2, "{:?}", warnings(&c));
    assert!(!warnings(&load())
        .iter()
        .any(|m| m.contains("NCCL_IB_GID_INDEX")));
}

#[test]
fn enforce_eager_on_a_large_model_is_a_warning() {
    let eager = [("extra_args", "[\"--enforce-eager\"]")];
    let c = load_with(&eager);
    let w = warnings(&c);
    assert_eq!(
        w.iter().filter(|m| m.contains("--enforce-eager")).count(),
        2,
        "{w:?}"
    );
    let small = load_with(&[eager[0], ("model_size_gib", "8")]);
    assert!(
        !warnings(&small)
            .iter()
            .any(|m| m.contains("--enforce-eager")),
        "{:?}",
        warnings(&small)
    );
    assert!(!warnings(&load())
        .iter()
        .any(|m| m.contains("--enforce-eager")));
}

#[test]
fn the_mp_examples_load_and_name_a_ray_less_image() {
    for example in ["examples/testbed-mp", "examples/qwen35-two-sparks-mp"] {
        let (c, _) = common::load(Path::new(example));
        let rank0 = resource(&c, "module.qwen.container.rank0");
        assert_eq!(
            flag(&command(&c, "module.qwen.container.rank0"), "--nnodes"),
            Some("2"),
            "{example}"
        );
        assert!(rank0.config["image"].is_string());
    }
    let (c, _) = common::load(Path::new("examples/qwen35-two-sparks-mp"));
    assert_eq!(
        resource(&c, "module.qwen.container.rank0").config["image"],
        "vllm/vllm-openai:v0.21.0"
    );
}

/// The ranks of vllm-mp are one process group: a rank replaced, or created while another
/// runs, replaces every rank, and the plan says why; from nothing, every rank is just created.
#[test]
fn the_ranks_of_one_process_group_are_replaced_as_one() {
    use sparkform::plan::{self, Action, PlanOptions};
    use sparkform::state::{HashKey, State};
    let (c, g) = common::load(Path::new(FIXTURE));
    let key = || PlanOptions::with_key(HashKey::from_bytes([7; 32]));
    let plan_for = |state: &State, replace: &[&str]| {
        plan::plan(
            &c,
            &g,
            state,
            &PlanOptions {
                replace: replace.iter().map(|s| s.to_string()).collect(),
                ..key()
            },
        )
        .expect("plan")
    };
    let action = |p: &plan::Plan, a: &str| p.change(a).map(|c| c.action);
    let [rank0, rank1] = MP_RANKS;

    let fresh = plan_for(&State::new(), &[]);
    assert_eq!(action(&fresh, rank0), Some(Action::Create));
    assert_eq!(action(&fresh, rank1), Some(Action::Create));
    let mut applied = State::new();
    plan::record(&fresh, &mut applied);

    // Rank 1 alone must go (here by -replace; a drift or a failed start plans the same).
    let p = plan_for(&applied, &[rank1]);
    assert_eq!(action(&p, rank1), Some(Action::Replace));
    assert_eq!(
        action(&p, rank0),
        Some(Action::Replace),
        "rank 0 stays alone"
    );
    let reasons = &p.change(rank0).unwrap().replace_reasons;
    assert!(
        reasons
            .iter()
            .any(|r| r
                == &format!("{rank1} is replaced, so this restarts with it: one process group")),
        "{reasons:?}"
    );
    // No other launcher's containers move.
    assert_eq!(action(&p, RAY_VLLM), Some(Action::NoOp));
    assert_eq!(action(&p, RAY_HEAD), Some(Action::NoOp));

    // Rank 1 lost from the state (an apply killed before it recorded it): it is created, and
    // rank 0, which runs without it, restarts with it.
    let mut lost = applied.clone();
    lost.resources.remove(rank1);
    let p = plan_for(&lost, &[]);
    assert_eq!(action(&p, rank1), Some(Action::Create));
    assert_eq!(action(&p, rank0), Some(Action::Replace));
    assert!(
        p.change(rank0)
            .unwrap()
            .replace_reasons
            .iter()
            .any(|r| r
                == &format!("{rank1} is created, so this restarts with it: one process group")),
        "{:?}",
        p.change(rank0).unwrap().replace_reasons
    );
    // And nothing to do stays nothing to do.
    assert!(!plan_for(&applied, &[]).has_changes());
}

/// The transport NCCL chose, per rank, recorded from each vLLM container's log once it is
/// ready: the vLLM driver of the Ray launcher (which gets every worker's lines) and the
/// headless ranks of the mp launcher; the patterns take the host and the transport from the
/// lines NCCL prints on real two-node RoCE runs. Without NCCL_DEBUG (no rdma) nothing is asked.
#[test]
fn the_vllm_containers_record_the_transport_nccl_chose_per_rank() {
    let c = load();
    for address in [RAY_VLLM, MP_RANKS[1]] {
        let ready = resource(&c, address).config["ready"].clone();
        let named: std::collections::BTreeMap<String, String> =
            serde_json::from_value(ready[0]["record_from_log"].clone())
                .unwrap_or_else(|e| panic!("{address}: {e}: {ready}"));
        let net = regex::Regex::new(&named["nccl_net"]).unwrap();
        let path = regex::Regex::new(&named["nccl_path"]).unwrap();
        let caps = |re: &regex::Regex, line: &str| -> Vec<String> {
            re.captures(line)
                .map(|c| {
                    c.iter()
                        .skip(1)
                        .flatten()
                        .map(|m| m.as_str().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(
            caps(&net, "(RayWorkerWrapper pid=2211, ip=192.168.200.2) spark2:2211:2290 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.200.2<0>"),
            ["spark2", "NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]"]
        );
        assert_eq!(
            caps(
                &net,
                "spark1:812:901 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.200.1<0>"
            ),
            [
                "spark1",
                "NET/Socket : Using [0]enp1s0f0np0:192.168.200.1<0>"
            ]
        );
        assert_eq!(
            caps(&path, "spark-153d:7:19 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA"),
            ["spark-153d", "NET/IB/0/GDRDMA"]
        );
        assert!(caps(
            &net,
            "INFO 07-14 10:12:44 [gpu_worker.py:298] Available KV cache memory: 2.26 GiB"
        )
        .is_empty());
    }
    let c = load_with(&[("rdma", "false")]);
    let ready = &resource(&c, RAY_VLLM).config["ready"][0];
    assert!(
        ready
            .get("record_from_log")
            .is_none_or(|v| v.as_object().is_none_or(|m| m.is_empty())),
        "{ready}"
    );
}

/// On unified-memory nodes a vLLM start waits for gpu_memory_utilization of each node's memory
/// to be free, after dropping the weights' page cache: the Ray launcher's driver (whose start
/// loads the model on every node) for both nodes, each mp rank for its own; nothing where the
/// nodes have memory of their own.
#[test]
fn vllm_starts_on_unified_memory_wait_for_their_memory_after_dropping_the_weights_cache() {
    let (c, _) = common::load(Path::new("examples/qwen35-two-sparks"));
    let vllm = resource(&c, "module.qwen.container.vllm");
    let needs = vllm.config["memory"].as_array().expect("memory needs");
    let nodes: Vec<&str> = needs.iter().filter_map(|n| n["node"].as_str()).collect();
    assert_eq!(nodes, ["node.spark1", "node.spark2"]);
    for n in needs {
        // 0.80 of the 120 GiB each Spark declares.
        assert!(
            (n["min_free_gib"].as_f64().unwrap() - 96.0).abs() < 1e-9,
            "{n}"
        );
        let path = n["drop_page_cache"][0].as_str().unwrap_or_default();
        assert!(path.starts_with("/home/nvidia/.cache/huggingface/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/snapshots/"), "{n}");
        assert_eq!(n["timeout"], 120);
    }
    let ray_head = resource(&c, "module.qwen.module.ray.container.ray_head");
    assert!(
        ray_head.config.get("memory").is_none(),
        "{}",
        ray_head.config
    );

    let (c, _) = common::load(Path::new("examples/qwen35-two-sparks-mp"));
    let mut ranks = 0;
    for r in c.resources.iter().filter(|r| {
        r.kind == sparkform::vocabulary::KindId::Container && r.address.contains("rank")
    }) {
        let needs = r.config["memory"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: {}", r.address, r.config));
        let nodes: Vec<&str> = needs.iter().filter_map(|n| n["node"].as_str()).collect();
        assert_eq!(nodes, [r.node.as_deref().unwrap()], "{}", r.address);
        ranks += 1;
    }
    assert_eq!(ranks, 2);
    // The launchers' fixture declares no unified memory.
    assert!(resource(&load(), RAY_VLLM).config.get("memory").is_none());
}

/// A `memory` that is not what a container's start can wait for is refused at its line.
#[test]
fn a_bad_memory_need_is_refused_with_the_shape_it_takes() {
    for (bad, says) in [
        ("\"16g\"", "memory is not a list"),
        (
            "[{ node = \"spark1\", min_free_gib = 90 }]",
            "node is not a node",
        ),
        (
            "[{ node = node.n1, min_free_gib = -1 }]",
            "min_free_gib is not a number of GiB",
        ),
        (
            "[{ node = node.n1, min_free_gib = 9, drop_page_cache = [\"relative\"] }]",
            "drop_page_cache is not a list of absolute paths",
        ),
        (
            "[{ node = node.n1, min_free_gib = 9, swap = 1 }]",
            "memory has no attribute \"swap\"",
        ),
    ] {
        let text = format!(
            "node \"n1\" {{\n  address = \"10.0.0.1\"\n}}\ncontainer \"c\" {{\n  node   = node.n1\n  image  = \"x:1\"\n  memory = {bad}\n}}\n"
        );
        let dir = common::write_config(&[("main.hcl", &text)]);
        let err = match config::load(dir.path(), &VarInputs::default()) {
            Ok(_) => panic!("{bad} loaded"),
            Err(d) => sparkform::diag::render_plain(&d.0),
        };
        assert!(err.contains(says), "{bad}: {err}");
        assert!(err.contains("main.hcl:7"), "located: {err}");
    }
}

/// Every vLLM and Ray container of every example mounts its image's cache folder where the
/// environment points vLLM's, Triton's, TorchInductor's and FlashInfer's caches, and each phase
/// its `cache.skips` names is a phase its `progress` patterns show.
#[test]
fn every_engine_container_keeps_its_compile_caches_and_skips_only_phases_it_shows() {
    for example in [
        "examples/qwen35-two-sparks",
        "examples/qwen35-two-sparks-mp",
        "examples/testbed",
        "examples/testbed-standin",
        "examples/testbed-mp",
        "examples/qwen35-two-sparks-sglang",
        "examples/testbed-sglang",
    ] {
        let (c, _) = common::load(Path::new(example));
        let containers: Vec<_> = c
            .resources
            .iter()
            .filter(|r| r.kind == sparkform::vocabulary::KindId::Container)
            .collect();
        assert!(!containers.is_empty(), "{example}");
        for r in containers {
            let cache = &r.config["cache"];
            let path = cache["path"]
                .as_str()
                .unwrap_or_else(|| panic!("{example}: {} mounts no cache: {cache}", r.address));
            let env = &r.config["env"];
            for (var, under) in [
                ("VLLM_CACHE_ROOT", "vllm"),
                ("TRITON_CACHE_DIR", "triton"),
                ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
            ] {
                assert_eq!(
                    env[var].as_str(),
                    Some(format!("{path}/{under}").as_str()),
                    "{example}: {} {var}",
                    r.address
                );
            }
            let labels: Vec<&str> = r.config["ready"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["progress"].as_object())
                .flat_map(|m| m.values().filter_map(|v| v.as_str()))
                .collect();
            for skip in cache["skips"].as_array().into_iter().flatten() {
                let skip = skip.as_str().unwrap();
                // Ray's containers show no vLLM phases: their workers' lines are the driver's.
                if r.address.contains("ray_") {
                    continue;
                }
                assert!(
                    labels.contains(&skip),
                    "{example}: {} skips {skip:?}, which none of its progress patterns shows ({labels:?})",
                    r.address
                );
            }
        }
    }
}

/// vLLM's torch.compile line, as its releases print it, starts the phase a warm cache skips.
#[test]
fn the_compile_phase_starts_at_vllms_cache_directory_line() {
    let c = load();
    let line = "(EngineCore_DP0 pid=187) INFO 05-01 19:16:14 [backends.py:1069] Using cache directory: /root/.cache/vllm/torch_compile_cache/7c10152ca9/rank_0_0/backbone for vLLM's torch.compile";
    let vllm = c
        .resources
        .iter()
        .find(|r| r.address.ends_with("container.vllm"))
        .unwrap();
    let progress = vllm.config["ready"][0]["progress"].as_object().unwrap();
    let hits: Vec<&str> = progress
        .iter()
        .filter(|(p, _)| regex::Regex::new(p).unwrap().is_match(line))
        .filter_map(|(_, l)| l.as_str())
        .collect();
    assert_eq!(hits, ["compiling"]);
}

/// SGLang's ranks: one process group on the head's fabric address, every rank the same settings
/// but its node rank, and the API key only in rank 0's environment, read by the wrapper into
/// SGLang's config file: never on a command line.
#[test]
fn sglang_ranks_join_the_heads_dist_init_address_and_the_key_stays_off_the_command_line() {
    let inputs = common::var_inputs(&[("api_key", "sglang-secret-key")]);
    let (c, _) = common::load_with(Path::new("examples/testbed-sglang"), &inputs);
    let rank0 = resource(&c, "module.qwen.container.rank0");
    let rank1 = resource(&c, "module.qwen.container.rank[\"node2\"]");
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(String::from))
            .collect()
    };
    let (c0, c1) = (
        strings(&rank0.config["command"]),
        strings(&rank1.config["command"]),
    );
    assert_eq!(flag(&c0, "--dist-init-addr"), Some("192.168.200.1:20000"));
    assert_eq!(flag(&c1, "--dist-init-addr"), Some("192.168.200.1:20000"));
    assert_eq!(flag(&c0, "--node-rank"), Some("0"));
    assert_eq!(flag(&c1, "--node-rank"), Some("1"));
    assert_eq!(flag(&c0, "--nnodes"), Some("2"));
    assert_eq!(
        &c0[..c0.len() - 2],
        &c1[..c1.len() - 2],
        "the same settings on every rank"
    );
    for (r, cmd) in [(rank0, &c0), (rank1, &c1)] {
        assert!(
            !cmd.iter().any(|a| a.contains("sglang-secret-key"))
                && flag(cmd, "--api-key").is_none(),
            "{}: {cmd:?}",
            r.address
        );
        assert!(
            !strings(&r.config["entrypoint"])
                .iter()
                .any(|a| a.contains("sglang-secret-key")),
            "{}",
            r.address
        );
    }
    assert_eq!(rank0.config["env"]["SGLANG_API_KEY"], "sglang-secret-key");
    assert!(
        rank1.config["env"]["SGLANG_API_KEY"].is_null(),
        "only rank 0 serves"
    );
    let wrapper = strings(&rank0.config["entrypoint"]);
    assert_eq!(wrapper[..2], ["sh", "-c"]);
    assert!(wrapper[2].contains("--config"), "{wrapper:?}");
    // The same process group: a new rank 0 replaces the other ranks.
    assert_eq!(rank0.group.as_deref(), Some("module.qwen.sglang"));
    assert_eq!(rank0.group, rank1.group);
}

/// A start must not need the internet: a launcher given a hub id without `weights` is a
/// warning (every start fetches the model), and one given a model block's weights runs every
/// container offline (the hub's library, transformers) with vLLM's usage report off.
#[test]
fn a_model_fetched_at_start_is_a_warning_and_local_weights_run_offline() {
    let c = load();
    let w: Vec<String> = warnings(&c)
        .into_iter()
        .filter(|m| m.contains("without `weights`: every start of vLLM fetches the model"))
        .collect();
    assert_eq!(w.len(), 2, "one for each launcher: {:?}", warnings(&c));
    assert!(w[0].contains("Qwen/Qwen3.5-122B-A10B-FP8"), "{w:?}");
    for rank in MP_RANKS {
        let env = &resource(&c, rank).config["env"];
        assert_eq!(env["VLLM_NO_USAGE_STATS"], "1", "{rank}: {env}");
        assert_eq!(env["DO_NOT_TRACK"], "1", "{rank}: {env}");
        assert!(
            env.get("HF_HUB_OFFLINE").is_none(),
            "no local weights: {env}"
        );
    }
    let (c, _) = common::load(Path::new("examples/testbed"));
    assert!(
        !warnings(&c).iter().any(|m| m.contains("without `weights`")),
        "{:?}",
        warnings(&c)
    );
    let env = &resource(&c, "module.qwen.container.rank0").config["env"];
    for key in [
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "VLLM_NO_USAGE_STATS",
    ] {
        assert_eq!(env[key], "1", "{key}: {env}");
    }
}

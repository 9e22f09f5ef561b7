//! Node facts fill what a definition leaves unset: `gpus`, `memory_gib` and `unified_memory`
//! taken from what the plan reads on the node (pure, with a hand-made `Readings`, and as the
//! plan operation does it on fake nodes, on this machine and on an unreachable one), and a
//! warning where the definition sets a value the node contradicts. The first plan (no state)
//! reads them too; a plan file records them and `apply FILE` evaluates with them. Also: a
//! `-var-file` that fails to parse does not show a secret.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use sparkform::config::{self, Config, NodeReadings, Readings, VarInputs};
use sparkform::diag::Diag;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::ops::node_facts::nodes_needing_facts;
use sparkform::ops::prepare::{prepare, PrepareRequest};
use sparkform::ops::ReadMode;
use sparkform::plan::PlanOptions;
use sparkform::state::{HashKey, State};
use sparkform_testkit::fake::{Answer, FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::FakeDocker;

/// A DGX Spark as the node shows it: 119.6 GiB in `MemTotal`, one GB10 with no memory of its own.
fn spark() -> NodeReadings {
    NodeReadings {
        unified_memory: Some(true),
        memory_gib: Some(119.6),
        gpus: Some(1),
    }
}

fn readings(nodes: &[(&str, NodeReadings)]) -> Readings {
    Readings {
        nodes: nodes
            .iter()
            .map(|(n, o)| (n.to_string(), o.clone()))
            .collect(),
        ..Readings::default()
    }
}

fn load_with_readings(dir: &Path, seen: &Readings) -> Config {
    match config::load_with_readings(dir, &VarInputs::default(), seen) {
        Ok(c) => c,
        Err(d) => panic!("{}", sparkform::diag::render_plain(&d.0)),
    }
}

fn output(c: &Config, name: &str) -> serde_json::Value {
    c.outputs
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("no output {name}"))
        .value
        .clone()
}

fn messages(warnings: &[Diag]) -> Vec<String> {
    warnings
        .iter()
        .map(|w| format!("{} | {}", w.message, w.help.clone().unwrap_or_default()))
        .collect()
}

const TWO_NODES: &str = r#"
node "n1" { address = "10.0.0.1" }

node "n2" {
  address        = "10.0.0.2"
  gpus           = 2
  memory_gib     = 128
  unified_memory = false
}

output "n1" {
  value = [node.n1.gpus, node.n1.memory_gib, node.n1.unified_memory]
}

output "n2" {
  value = [node.n2.gpus, node.n2.memory_gib, node.n2.unified_memory]
}

check "n1_unified" {
  condition     = node.n1.unified_memory != true
  error_message = "n1 shares its memory with its GPU"
  severity      = "warning"
}
"#;

#[test]
fn unset_attributes_take_the_node_facts_and_the_definitions_see_them() {
    let dir = common::write_config(&[("main.hcl", TWO_NODES)]);
    let before = load_with_readings(dir.path(), &Readings::default());
    assert_eq!(output(&before, "n1"), serde_json::json!([null, null, null]));
    assert_eq!(before.nodes["node.n1"].unified_memory, None);
    assert!(
        before.warnings.is_empty(),
        "{:?}",
        messages(&before.warnings)
    );

    let after = load_with_readings(dir.path(), &readings(&[("n1", spark())]));
    assert_eq!(output(&after, "n1"), serde_json::json!([1, 119.6, true]));
    let n1 = &after.nodes["node.n1"];
    assert_eq!(
        (n1.gpus, n1.memory_gib, n1.unified_memory),
        (Some(1), Some(119.6), Some(true))
    );
    // What the definition sets stays; nothing was observed on n2.
    assert_eq!(output(&after, "n2"), serde_json::json!([2, 128, false]));
    let w = messages(&after.warnings);
    assert!(
        w.iter().any(|m| m.contains("n1 shares its memory")),
        "the check sees the filled value: {w:?}"
    );
}

#[test]
fn a_set_value_the_node_contradicts_is_a_warning_with_both_values_and_the_fix() {
    let dir = common::write_config(&[("main.hcl", TWO_NODES)]);
    let c = load_with_readings(dir.path(), &readings(&[("n2", spark())]));
    // The definition wins: the plan uses what it says.
    assert_eq!(output(&c, "n2"), serde_json::json!([2, 128, false]));
    let facts: Vec<&Diag> = c
        .warnings
        .iter()
        .filter(|w| w.code == "config::node_facts")
        .collect();
    let text = messages(&c.warnings).join("\n");
    assert_eq!(facts.len(), 3, "{text}");
    for (attribute, declared, shows, fix, line) in [
        ("gpus", "2", "the machine shows 1 GPU", "set `gpus = 1`", 6),
        (
            "memory_gib",
            "128",
            "the machine has 119.6 GiB",
            "set `memory_gib = 119.6`",
            7,
        ),
        (
            "unified_memory",
            "false",
            "uses the node's (unified memory)",
            "set `unified_memory = true`",
            8,
        ),
    ] {
        let w = facts
            .iter()
            .find(|w| {
                w.message
                    .contains(&format!("sets {attribute} = {declared}"))
            })
            .unwrap_or_else(|| panic!("no warning on {attribute}: {text}"));
        assert!(w.message.starts_with("node \"n2\" sets"), "{}", w.message);
        assert!(w.message.contains(shows), "{}", w.message);
        let help = w.help.clone().unwrap_or_default();
        assert!(
            help.contains(fix) && help.contains("remove the attribute"),
            "{help}"
        );
        // Labelled at the attribute that says it.
        let at = w.location().unwrap_or_default();
        assert!(
            at.ends_with(&format!("main.hcl:{line}:20")),
            "{attribute}: {at}"
        );
    }
}

#[test]
fn memory_close_to_what_the_kernel_reports_or_below_it_is_no_disagreement() {
    for declared in ["120", "100"] {
        let text =
            format!("node \"n\" {{\n  address    = \"10.0.0.1\"\n  memory_gib = {declared}\n}}\n");
        let dir = common::write_config(&[("main.hcl", &text)]);
        let c = load_with_readings(dir.path(), &readings(&[("n", spark())]));
        assert!(
            c.warnings.is_empty(),
            "{declared}: {:?}",
            messages(&c.warnings)
        );
        assert_eq!(
            c.nodes["node.n"].memory_gib,
            Some(declared.parse().unwrap())
        );
    }
}

#[test]
fn logical_gpus_are_neither_filled_nor_contradicted() {
    let text = r#"
node "tb" {
  address     = "10.0.0.1"
  gpu_devices = false
}
node "tb2" {
  address     = "10.0.0.2"
  gpus        = 1
  gpu_devices = false
}
"#;
    let dir = common::write_config(&[("main.hcl", text)]);
    let none = NodeReadings {
        gpus: Some(0),
        unified_memory: None,
        memory_gib: Some(23.4),
    };
    let c = load_with_readings(
        dir.path(),
        &readings(&[("tb", none.clone()), ("tb2", none)]),
    );
    assert_eq!(c.nodes["node.tb"].gpus, None);
    assert_eq!(c.nodes["node.tb"].memory_gib, Some(23.4));
    assert_eq!(c.nodes["node.tb2"].gpus, Some(1));
    assert!(c.warnings.is_empty(), "{:?}", messages(&c.warnings));
}

/// The seed example with its module source made absolute, so it loads from a temp dir.
fn seed_example() -> String {
    let modules = std::fs::canonicalize("modules/vllm-ray").unwrap();
    std::fs::read_to_string("examples/qwen35-two-sparks/main.hcl")
        .unwrap()
        .replace(
            "\"../../modules/vllm-ray\"",
            &format!("{:?}", modules.display().to_string()),
        )
}

const UNIFIED_CHECK: &str = "above 0.85 on unified-memory nodes";

#[test]
fn the_seed_example_states_that_the_sparks_are_unified_memory_nodes() {
    let (c, _) = common::load(Path::new("examples/qwen35-two-sparks"));
    for n in ["node.spark1", "node.spark2"] {
        assert_eq!(c.nodes[n].unified_memory, Some(true), "{n}");
    }
    // What a Spark shows agrees with what the example says.
    let c = load_with_readings(
        Path::new("examples/qwen35-two-sparks"),
        &readings(&[("spark1", spark()), ("spark2", spark())]),
    );
    let facts: Vec<String> = messages(&c.warnings)
        .into_iter()
        .filter(|m| m.contains("node \""))
        .collect();
    assert!(facts.is_empty(), "{facts:?}");
}

#[test]
fn high_utilization_on_sparks_left_unset_but_observed_as_unified_fails_the_check() {
    let text = seed_example()
        .replace("  unified_memory = true\n", "")
        .replace(
            "gpu_memory_utilization = 0.80",
            "gpu_memory_utilization = 0.95",
        );
    assert!(!text.contains("unified_memory"), "{text}");
    let dir = common::write_config(&[("main.hcl", &text)]);
    // Without facts (plan -refresh=false) nothing says the nodes are unified: silence.
    let blind = load_with_readings(dir.path(), &Readings::default());
    assert!(
        !messages(&blind.warnings)
            .iter()
            .any(|m| m.contains(UNIFIED_CHECK)),
        "{:?}",
        messages(&blind.warnings)
    );
    let seen = load_with_readings(
        dir.path(),
        &readings(&[("spark1", spark()), ("spark2", spark())]),
    );
    let w = messages(&seen.warnings);
    assert!(
        w.iter()
            .any(|m| m.contains("gpu_memory_utilization 0.95") && m.contains(UNIFIED_CHECK)),
        "{w:?}"
    );
}

// ----- the plan operation on fake nodes -----

const MEMINFO: &str = "MemTotal:       125410000 kB\nMemFree:        100000000 kB\n";
const SMI: [&str; 3] = [
    "nvidia-smi",
    "--query-gpu=name,memory.total",
    "--format=csv,noheader,nounits",
];

fn fake_spark(name: &str, world: &Arc<FakeWorld>) -> FakeHost {
    let h = FakeHost::new(name, world);
    h.on(
        &["cat", "/proc/meminfo"],
        Answer::Exit(0, MEMINFO.into(), String::new()),
    );
    h.on(
        &SMI,
        Answer::Exit(0, "NVIDIA GB10, [N/A]\n".into(), String::new()),
    );
    h
}

/// The fake nodes as the plan "connects" them.
fn pool(hosts: Vec<FakeHost>) -> FakeNodes {
    FakeNodes::new(
        hosts
            .into_iter()
            .map(|h| (h.node().to_string(), Arc::new(h) as Arc<dyn Host>))
            .collect(),
    )
}

/// A fake node with an engine of its own (what a refresh of containers asks).
fn with_engine(h: FakeHost) -> FakeHost {
    h.docker_engine(Arc::new(FakeDocker::start().unwrap()))
}

/// What `ops::prepare` made, as these tests look at it: `reloaded` when the definitions were
/// evaluated again.
struct Planned {
    plan: sparkform::plan::Plan,
    pool: Option<HostPool>,
    reloaded: Option<Box<(Config, sparkform::graph::Graph)>>,
    warnings: Vec<Diag>,
    readings: Readings,
}

/// `ops::prepare` on the definitions of `config`'s folder, as written.
async fn prepare_on(
    config: &Config,
    recorded: Option<&State>,
    refresh: ReadMode,
    hosts: HostOptions,
    events: &sparkform::events::Sender,
) -> Planned {
    let ws = sparkform::workspace::Workspace::new(&config.dir, None);
    let evaluated = sparkform::ops::definitions::load(&ws, &VarInputs::default())
        .unwrap_or_else(|e| panic!("{e:?}"));
    let before = config::evaluations::of(&config.dir);
    let req = PrepareRequest {
        evaluated,
        recorded,
        refresh,
        options: PlanOptions::with_key(HashKey::from_bytes([7; 32])),
        hosts,
    };
    let p = match prepare(req, events).await {
        Ok(p) => p,
        Err(e) => panic!("{e:?}"),
    };
    let again = config::evaluations::of(&config.dir) > before;
    Planned {
        plan: p.plan,
        pool: p.pool,
        reloaded: again.then(|| Box::new((p.config, p.graph))),
        warnings: p.warnings,
        readings: p.readings,
    }
}

/// A plan after a refresh of the nodes of `refreshed` (the state records a container on each,
/// gone since), or without one.
async fn plan_after_refresh(
    config: &Config,
    _graph: &sparkform::graph::Graph,
    refreshed: Option<FakeNodes>,
) -> Planned {
    // Nodes that leave a fact unset are connected for it anyway; the others are refreshed.
    let needing = nodes_needing_facts(config);
    let mut state = State::new();
    for node in refreshed
        .iter()
        .flat_map(FakeNodes::nodes)
        .filter(|n| !needing.contains(n))
    {
        state.resources.insert(
            format!("container.on_{}", node.trim_start_matches("node.")),
            sparkform::state::ResourceState {
                kind: sparkform::vocabulary::KindId::Container,
                node: Some(node),
                config_hash: String::new(),
                config: serde_json::json!({"name": "gone"}).into(),
                attributes: Default::default(),
                depends_on: Vec::new(),
                last_apply_secs: None,
                schema_version: 1,
            },
        );
    }
    let hosts = HostOptions {
        opener: refreshed.as_ref().and_then(FakeNodes::opener),
        ..HostOptions::default()
    };
    let refresh = ReadMode::refresh(refreshed.is_some());
    let events = tokio::sync::mpsc::unbounded_channel().0;
    prepare_on(config, Some(&state), refresh, hosts, &events).await
}

/// The first plan of a deployment: no state, nothing refreshed, the nodes of `pool` connected
/// for their facts.
async fn first_plan(config: &Config, _graph: &sparkform::graph::Graph, pool: FakeNodes) -> Planned {
    let hosts = HostOptions {
        opener: pool.opener(),
        ..HostOptions::default()
    };
    let events = tokio::sync::mpsc::unbounded_channel().0;
    prepare_on(config, None, ReadMode::Normal, hosts, &events).await
}

fn output_after(plan: &sparkform::plan::Plan, name: &str) -> serde_json::Value {
    plan.outputs
        .iter()
        .find(|o| o.name == name)
        .and_then(|o| o.after.clone())
        .unwrap_or_else(|| panic!("no output {name}"))
}

#[tokio::test]
async fn plan_reads_the_facts_on_the_refreshed_nodes_and_evaluates_again_with_them() {
    let dir = common::write_config(&[("main.hcl", TWO_NODES)]);
    let (config, graph) = common::load(dir.path());
    let world = FakeWorld::new();
    let hosts = vec![
        fake_spark("node.n1", &world),
        with_engine(fake_spark("node.n2", &world)),
    ];
    let planned = plan_after_refresh(&config, &graph, Some(pool(hosts))).await;
    if let Some(p) = planned.pool {
        p.close().await;
    }
    // The second evaluation is the plan's.
    let (again, _) = *planned.reloaded.expect("evaluated again with the facts");
    assert_eq!(again.nodes["node.n1"].unified_memory, Some(true));
    assert_eq!(
        output_after(&planned.plan, "n1"),
        serde_json::json!([1, 119.6, true])
    );
    assert_eq!(
        output_after(&planned.plan, "n2"),
        serde_json::json!([2, 128, false])
    );
    // The warnings the first evaluation did not have: three disagreements on n2 and the check
    // that the facts make fail.
    let w = messages(&planned.warnings);
    assert_eq!(w.len(), 4, "{w:#?}");
    assert!(
        w.iter().any(|m| m.contains("n1 shares its memory")),
        "{w:?}"
    );
    for a in ["gpus = 2", "memory_gib = 128", "unified_memory = false"] {
        assert!(
            w.iter()
                .any(|m| m.contains(&format!("node \"n2\" sets {a}"))),
            "{a}: {w:?}"
        );
    }
    // One command per node (its glance: meminfo and nvidia-smi among its sections), and
    // nothing else.
    let mut log = world.log();
    log.sort();
    let glance = sparkform::inspect::glance::command().display();
    assert_eq!(
        log,
        vec![format!("node.n1: {glance}"), format!("node.n2: {glance}")]
    );
    assert!(glance.contains(&SMI.join(" ")), "{glance}");
}

#[tokio::test]
async fn without_a_refresh_nothing_is_read_and_nothing_filled() {
    let dir = common::write_config(&[("main.hcl", TWO_NODES)]);
    let (config, graph) = common::load(dir.path());
    let planned = plan_after_refresh(&config, &graph, None).await;
    assert!(planned.reloaded.is_none());
    assert!(planned.warnings.is_empty());
    assert_eq!(
        output_after(&planned.plan, "n1"),
        serde_json::json!([null, null, null])
    );
}

#[tokio::test]
async fn a_node_whose_facts_cannot_be_read_is_a_warning_and_stays_unset() {
    let text = r#"
node "n1" { address = "10.0.0.1" }
node "n3" { address = "10.0.0.3" }
output "facts" {
  value = [node.n1.memory_gib, node.n3.memory_gib, node.n3.gpus, node.n3.unified_memory]
}
"#;
    let dir = common::write_config(&[("main.hcl", text)]);
    let (config, graph) = common::load(dir.path());
    let world = FakeWorld::new();
    let broken = FakeHost::new("node.n1", &world);
    broken.on(&["cat", "/proc/meminfo"], Answer::Disappear);
    // A node without a driver: its memory is known, its GPUs are not.
    let no_driver = FakeHost::new("node.n3", &world);
    no_driver.on(
        &["cat", "/proc/meminfo"],
        Answer::Exit(0, MEMINFO.into(), String::new()),
    );
    let planned = plan_after_refresh(&config, &graph, Some(pool(vec![broken, no_driver]))).await;
    assert_eq!(
        output_after(&planned.plan, "facts"),
        serde_json::json!([null, 119.6, null, null])
    );
    let w = messages(&planned.warnings);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("cannot read the facts of node \"n1\"") && w[0].contains("stay unset"),
        "{w:?}"
    );
}

#[tokio::test]
async fn definitions_that_set_what_the_nodes_show_are_evaluated_once() {
    let text = r#"
node "n1" {
  address        = "10.0.0.1"
  gpus           = 1
  memory_gib     = 120
  unified_memory = true
}
"#;
    let dir = common::write_config(&[("main.hcl", text)]);
    let (config, graph) = common::load(dir.path());
    let world = FakeWorld::new();
    let planned = plan_after_refresh(
        &config,
        &graph,
        Some(pool(vec![with_engine(fake_spark("node.n1", &world))])),
    )
    .await;
    assert!(planned.reloaded.is_none());
    assert!(
        planned.warnings.is_empty(),
        "{:?}",
        messages(&planned.warnings)
    );
    assert_eq!(world.log().len(), 1, "{:?}", world.log());
}

// ----- the first plan: no state, the nodes that leave a fact unset are connected -----

#[test]
fn the_nodes_to_connect_for_facts_are_those_that_leave_one_unset() {
    let text = r#"
node "bare" { address = "10.0.0.1" }
node "no_memory" {
  address        = "10.0.0.2"
  gpus           = 1
  unified_memory = true
}
node "all_set" {
  address        = "10.0.0.3"
  gpus           = 1
  memory_gib     = 128
  unified_memory = true
}
node "logical" {
  address        = "10.0.0.4"
  gpu_devices    = false
  memory_gib     = 24
  unified_memory = false
}
node "no_gpus" {
  address        = "10.0.0.5"
  memory_gib     = 24
  unified_memory = false
}
"#;
    let dir = common::write_config(&[("main.hcl", text)]);
    let (config, _) = common::load(dir.path());
    // Logical GPUs are never filled, so a node that sets the rest needs nothing.
    assert_eq!(
        nodes_needing_facts(&config),
        ["node.bare", "node.no_gpus", "node.no_memory"]
    );
}

#[tokio::test]
async fn the_first_plan_reads_the_facts_and_the_unified_memory_check_sees_them() {
    let text = seed_example()
        .replace("  unified_memory = true\n", "")
        .replace(
            "gpu_memory_utilization = 0.80",
            "gpu_memory_utilization = 0.95",
        );
    let dir = common::write_config(&[("main.hcl", &text)]);
    let (config, graph) = common::load(dir.path());
    assert!(
        !messages(&config.warnings)
            .iter()
            .any(|m| m.contains(UNIFIED_CHECK)),
        "the first evaluation cannot know: {:?}",
        messages(&config.warnings)
    );
    let mut needing = nodes_needing_facts(&config);
    needing.sort();
    assert_eq!(needing, ["node.spark1", "node.spark2"]);
    let world = FakeWorld::new();
    // spark1 resolves the model's revision at plan time, in the same read phase.
    let resolving = Arc::new(FakeDocker::start().unwrap());
    resolving.fault(
        "sparkform-model.qwen-spark1-resolve",
        sparkform_testkit::fake_docker::Fault::ExitsAfterStart(
            0,
            vec![serde_json::json!({
                "event": "result", "mode": "resolve", "commit": "a".repeat(40),
                "total_bytes": 3000, "files": [{"path": "model.safetensors"}],
                "config": {"architectures": ["Qwen3ForCausalLM"]},
            })
            .to_string()],
        ),
    );
    let hosts = vec![
        fake_spark("node.spark1", &world).docker_engine(resolving),
        fake_spark("node.spark2", &world),
    ];
    let planned = first_plan(&config, &graph, pool(hosts)).await;
    // The plan keeps the connections for the apply.
    let kept = planned.pool.expect("the pool is handed on");
    assert!(kept.get("node.spark1").is_ok() && kept.get("node.spark2").is_ok());
    kept.close().await;
    let w = messages(&planned.warnings);
    assert!(
        w.iter()
            .any(|m| m.contains("gpu_memory_utilization 0.95") && m.contains(UNIFIED_CHECK)),
        "{w:?}"
    );
    let (again, _) = *planned.reloaded.expect("evaluated again with the facts");
    assert_eq!(again.nodes["node.spark1"].unified_memory, Some(true));
    assert_eq!(
        planned.readings.nodes,
        readings(&[("spark1", spark()), ("spark2", spark())]).nodes
    );
    // Nothing was recorded, so everything is created.
    assert!(planned.plan.has_changes());
    assert_eq!(
        planned.plan.summary.update + planned.plan.summary.replace,
        0
    );
    // Per node one command, its glance: the facts and the fabric's sysfs (the attachment
    // kind's read) at once.
    assert_eq!(world.log().len(), 2, "{:?}", world.log());
}

/// This machine (read without ssh), a node nobody listens for (ssh to a closed port on
/// loopback) and a node that sets its facts.
const HERE_AND_GONE: &str = r#"
node "here" { address = "local" }

node "gone" {
  address     = "127.0.0.1"
  port        = 1
  known_hosts = "known_hosts"
}

node "set" {
  address        = "127.0.0.1"
  port           = 1
  known_hosts    = "known_hosts"
  gpus           = 1
  memory_gib     = 8
  unified_memory = false
}

output "memory" {
  value = [node.here.memory_gib, node.gone.memory_gib, node.gone.unified_memory]
}
"#;

/// `MemTotal` of this machine in GiB, to a tenth, read here and not by sparkform.
fn memory_here() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let kib: f64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("MemTotal");
    (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0
}

async fn plan_here_and_gone(
    refresh: bool,
) -> (tempfile::TempDir, Planned, Vec<sparkform::events::Event>) {
    let dir = common::write_config(&[("main.hcl", HERE_AND_GONE), ("known_hosts", "")]);
    let (config, _) = common::load(dir.path());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let hosts = HostOptions {
        use_user_config: false,
        connect_timeout: std::time::Duration::from_secs(5),
        ..HostOptions::default()
    };
    let planned = prepare_on(&config, None, ReadMode::refresh(refresh), hosts, &tx).await;
    drop(tx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    (dir, planned, events)
}

#[tokio::test]
async fn with_no_state_the_plan_connects_the_nodes_that_leave_facts_unset_and_warns_on_the_unreachable(
) {
    let (_dir, planned, events) = plan_here_and_gone(true).await;
    let pool = planned.pool.expect("connections for the apply");
    assert!(pool.get("node.here").is_ok());
    let gone = pool.get("node.gone").err().map(|e| e.to_string());
    // `set` needs nothing: it was not even tried.
    let set = pool.get("node.set").err().map(|e| e.to_string());
    pool.close().await;
    assert!(gone.is_some(), "node.gone connected?");
    assert!(
        set.as_deref()
            .is_some_and(|e| e.contains("no connection was opened")),
        "{set:?}"
    );
    assert!(
        matches!(
            events.as_slice(),
            [sparkform::events::Event::Refreshing { nodes: 2 }]
        ),
        "{events:?}"
    );
    assert_eq!(
        output_after(&planned.plan, "memory"),
        serde_json::json!([memory_here(), null, null])
    );
    let w = messages(&planned.warnings);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("cannot read the facts of node \"gone\"") && w[0].contains("stay unset"),
        "{w:?}"
    );
}

#[tokio::test]
async fn with_refresh_off_the_first_plan_connects_nothing_and_reads_nothing() {
    let (_dir, planned, events) = plan_here_and_gone(false).await;
    assert!(planned.pool.is_none());
    assert!(planned.reloaded.is_none());
    assert!(events.is_empty(), "{events:?}");
    assert!(
        planned.warnings.is_empty(),
        "{:?}",
        messages(&planned.warnings)
    );
    assert!(planned.readings.nodes.is_empty());
    assert_eq!(
        output_after(&planned.plan, "memory"),
        serde_json::json!([null, null, null])
    );
}

// ----- a plan file records the facts; apply FILE evaluates with them -----

/// A container whose configuration depends on a filled value, and a check that fails once the
/// facts are in.
const FILLED_CONTAINER: &str = r#"
node "n1" { address = "10.0.0.1" }

container "web" {
  node    = node.n1
  name    = "web"
  image   = "busybox:1"
  command = ["sh", "-c", "echo ${node.n1.memory_gib}"]
}

check "n1_unified" {
  condition     = node.n1.unified_memory != true
  error_message = "n1 shares its memory with its GPU"
  severity      = "warning"
}
"#;

#[tokio::test]
async fn a_plan_file_records_the_node_facts_and_apply_file_evaluates_with_them() {
    use sparkform::ops::apply::{lock_and_plan, PlanRequest, PlanSource};
    use sparkform::ops::OpError;
    use sparkform::plan::planfile::{NodeFacts, PlanFile};
    use sparkform::state::StateStore;

    let dir = common::write_config(&[("main.hcl", FILLED_CONTAINER)]);
    let (config, graph) = common::load(dir.path());
    let world = FakeWorld::new();
    let planned = first_plan(&config, &graph, pool(vec![fake_spark("node.n1", &world)])).await;
    if let Some(p) = planned.pool {
        p.close().await;
    }
    let store = || StateStore::new(dir.path().join("state/sparkform.json"));
    let path = dir.path().join("first.plan");
    PlanFile::new(planned.plan.clone(), dir.path(), store().path(), None)
        .with_readings(&planned.readings)
        .write(&path)
        .expect("write");
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
    assert_eq!(raw["format_version"], 3);
    assert!(
        raw.get("destroy").is_none(),
        "an apply's plan says nothing of a destroy"
    );
    assert_eq!(
        raw["node_facts"],
        serde_json::json!({"n1": {"gpus": 1, "memory_gib": 119.6, "unified_memory": true}})
    );
    let file = PlanFile::read(&path).expect("read back");
    assert_eq!(
        file.node_facts["n1"],
        NodeFacts {
            gpus: Some(1),
            memory_gib: Some(119.6),
            unified_memory: Some(true),
        }
    );
    assert_eq!(file.readings().nodes, planned.readings.nodes);

    // `apply FILE` loads the definitions without facts, as the command does, and the plan is
    // accepted: prepare evaluates them again with the recorded facts.
    let ws = sparkform::workspace::Workspace::new(dir.path(), None);
    let request = |file| PlanRequest {
        evaluated: sparkform::ops::definitions::load(&ws, &VarInputs::default()).unwrap(),
        lockfile_readonly: false,
        store: store(),
        source: PlanSource::PlanFile { file, path: &path },
        hosts: HostOptions::default(),
    };
    let prepared =
        match lock_and_plan(request(&file), &tokio::sync::mpsc::unbounded_channel().0).await {
            Ok(p) => p,
            Err(e) => panic!("{e:?}"),
        };
    assert_eq!(prepared.plan, file.plan);
    let w = messages(&prepared.warnings);
    assert!(
        w.iter().any(|m| m.contains("n1 shares its memory")),
        "{w:?}"
    );
    drop(prepared);

    // The same plan without the facts (what an older plan file says) is refused: the container
    // the facts filled differs.
    let mut blind = file.clone();
    blind.node_facts.clear();
    match lock_and_plan(request(&blind), &tokio::sync::mpsc::unbounded_channel().0).await {
        Err(OpError::DefinitionsChanged(a)) => assert_eq!(a, "container.web"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("the plan was accepted without the facts it was made with"),
    }
}

#[test]
fn a_plan_file_of_an_older_format_is_refused_with_the_fix() {
    use sparkform::plan::planfile::{PlanFile, PlanFileError, FORMAT_VERSION};

    let dir = common::write_config(&[("main.hcl", FILLED_CONTAINER)]);
    let (config, graph) = common::load(dir.path());
    let plan = common::plan(&config, &graph, &State::new());
    let path = dir.path().join("old.plan");
    PlanFile::new(
        plan,
        dir.path(),
        &dir.path().join("state/sparkform.json"),
        None,
    )
    .write(&path)
    .expect("write");
    let mut raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
    assert!(raw.get("node_facts").is_none(), "no facts, no field");
    assert!(PlanFile::read(&path).is_ok(), "this version's file is read");
    // The configurations a plan carries are in the shape of the sparkform that made it: one
    // made by an older one is refused, saying how to make it again.
    for older in 1..FORMAT_VERSION {
        raw["format_version"] = serde_json::json!(older);
        std::fs::write(&path, serde_json::to_vec(&raw).expect("JSON")).expect("write");
        match PlanFile::read(&path) {
            Err(e @ PlanFileError::Older { .. }) => {
                let help = miette::Diagnostic::help(&e).map(|h| h.to_string());
                let text = e.to_string();
                assert!(text.contains(&format!("plan format {older}")), "{text}");
                assert!(
                    help.as_deref()
                        .is_some_and(|h| h.contains("sparkform plan -out")),
                    "{help:?}"
                );
            }
            other => panic!("a version {older} file was not refused: {other:?}"),
        }
    }
}

// ----- as the commands do it, on this machine -----

fn sparkform_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .current_dir(dir)
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run sparkform");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn plan_out_on_a_first_plan_records_this_machines_facts_and_apply_file_uses_them() {
    // The check fails only in an evaluation that has the facts.
    let text = r#"
node "here" { address = "local" }

output "memory" {
  value = node.here.memory_gib
}

check "memory_known" {
  condition     = node.here.memory_gib == null
  error_message = "the memory of this machine is known"
  severity      = "warning"
}
"#;
    let dir = common::write_config(&[("main.hcl", text)]);
    let d = dir.path().to_str().expect("utf-8 path");
    let (ok, all) = sparkform_in(
        dir.path(),
        &["plan", d, "-refresh=false", "-out", "blind.plan"],
    );
    assert!(ok, "{all}");
    assert!(
        !all.contains("the memory of this machine is known"),
        "{all}"
    );
    let blind = std::fs::read_to_string(dir.path().join("blind.plan")).expect("plan file");
    assert!(!blind.contains("node_facts"), "{blind}");

    let (ok, all) = sparkform_in(dir.path(), &["plan", d, "-out", "first.plan"]);
    assert!(ok, "{all}");
    let raw: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("first.plan")).expect("plan file"),
    )
    .expect("JSON");
    assert_eq!(
        raw["node_facts"]["here"]["memory_gib"],
        serde_json::json!(memory_here())
    );
    let (ok, all) = sparkform_in(dir.path(), &["apply", "first.plan"]);
    assert!(ok, "{all}");
    assert!(all.contains("the memory of this machine is known"), "{all}");
    let (ok, all) = sparkform_in(dir.path(), &["output", "memory", d]);
    assert!(ok, "{all}");
    assert_eq!(all.trim(), memory_here().to_string(), "{all}");
}

// ----- a -var-file that does not parse -----

const SECRET: &str = "hf_SuperSecretToken123";

fn var_file_folder(var_file: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = common::write_config(&[
        (
            "main.hcl",
            "variable \"token\" {\n  type      = string\n  sensitive = true\n}\nvariable \"port\" {\n  type    = number\n  default = 1\n}\n",
        ),
        ("secrets.tfvars", var_file),
    ]);
    let file = dir.path().join("secrets.tfvars");
    (dir, file)
}

#[test]
fn a_var_file_that_does_not_parse_shows_where_but_not_its_lines() {
    for text in [
        format!("token = \"{SECRET}\"\nport = = 3\n"),
        // The mistake on the secret's own line: an unterminated string.
        format!("port  = 3\ntoken = \"{SECRET}\n"),
    ] {
        let (dir, file) = var_file_folder(&text);
        let vars = VarInputs {
            files: vec![file.clone()],
            ..VarInputs::default()
        };
        let err = match config::load(dir.path(), &vars) {
            Ok(_) => panic!("loaded"),
            Err(d) => sparkform::diag::render_plain(&d.0),
        };
        assert!(!err.contains(SECRET) && !err.contains("hf_Super"), "{err}");
        assert!(err.contains("secrets.tfvars:"), "located: {err}");
        assert!(err.contains("`token`"), "says why: {err}");
        // And as the command prints it.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
            .arg("validate")
            .arg(dir.path())
            .arg("-var-file")
            .arg(&file)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains(SECRET) && !all.contains("hf_Super"), "{all}");
        assert!(all.contains("secrets.tfvars"), "{all}");
    }
}

#[test]
fn an_error_beside_a_secret_in_a_var_file_masks_the_secret_in_the_excerpt() {
    let (dir, file) = var_file_folder(&format!("token = \"{SECRET}\"\nport  = 1 / 0\n"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .arg("validate")
        .arg(dir.path())
        .arg("-var-file")
        .arg(&file)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("secrets.tfvars"), "{all}");
    assert!(!all.contains(SECRET) && !all.contains("hf_Super"), "{all}");
}

// ----- over ssh, on the testbed -----

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn the_first_plan_on_the_testbed_connects_its_nodes_and_their_facts_fill_it() {
    let tb = common::testbed::testbed();
    let text = tb.hcl(
        &[("n1", "sf-node1"), ("n2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    ) + "output \"facts\" {\n  value = [node.n1.memory_gib, node.n2.memory_gib, node.n1.gpus, node.n1.unified_memory]\n}\n";
    let dir = common::write_config(&[("main.hcl", &text)]);
    let (config, _) = common::load(dir.path());
    // No state: nothing to refresh, so this is the plan's own connecting and reading.
    let hosts = HostOptions {
        use_user_config: false,
        ..HostOptions::default()
    };
    let started = std::time::Instant::now();
    let events = tokio::sync::mpsc::unbounded_channel().0;
    let planned = prepare_on(&config, None, ReadMode::Normal, hosts, &events).await;
    eprintln!(
        "first plan: connecting two nodes through the jump host, their facts, the second evaluation: {:.0} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let pool = planned.pool.expect("the connections, for the apply");
    let connected = (pool.get("node.n1").is_ok(), pool.get("node.n2").is_ok());
    pool.close().await;
    assert_eq!(connected, (true, true));
    assert!(
        planned.warnings.is_empty(),
        "{:?}",
        messages(&planned.warnings)
    );
    // What the node's kernel says, read independently of sparkform.
    let kib: f64 = tb
        .ssh("sf-node1", "grep MemTotal /proc/meminfo")
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("MemTotal");
    let gib = (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0;
    // No driver on the testbed: the GPUs and unified memory stay unknown.
    assert_eq!(
        output_after(&planned.plan, "facts"),
        serde_json::json!([gib, gib, null, null])
    );
}

//! The model's speed as a probe (`probe { bench { … } regression { … } }`): the engine's
//! benchmark client runs in a one-shot container of the deployment's image on its node, its
//! figures are recorded with the generation and shown by `status`, and a later run slower than
//! the rules allow fails the apply, which rolls back. On the generations' serving fixture, the
//! client's report played by the fake Docker Engine of the head node.

use std::path::Path;

use sparkform::config::VarInputs;
use sparkform::ops::OpError;
use sparkform::workspace::Workspace;
use sparkform_testkit::fake_docker::Fault;

use crate::generations::{write, Deployment};

const KEY: &str = "sk-bench-secret-4711";

/// A bench probe after the serving one, with the engine's limits and a regression block.
fn bench_hcl(concurrency: u32) -> String {
    format!(
        r#"
variable "key" {{
  type      = string
  default   = "{KEY}"
  sensitive = true
}}

probe "speed" {{
  timeout    = "20s"
  depends_on = [probe.serving]
  bench {{
    node          = node.n1
    image         = "vllm:1"
    url           = "http://127.0.0.1:8000"
    model         = "tiny"
    tokenizer     = "/models/tiny"
    api_key       = var.key
    requests      = 8
    concurrency   = {concurrency}
    input_tokens  = 32
    output_tokens = 16
    max_num_seqs  = 4
    max_model_len = 64
  }}
  regression {{
    throughput = "-10%"
    ttft_p99   = "+25%"
  }}
}}
"#
    )
}

/// The client's report with this throughput and TTFT p99.
fn report(throughput: f64, ttft_p99: f64) -> Vec<String> {
    format!(
        "============ Serving Benchmark Result ============
Successful requests:                     8
Failed requests:                         0
Output token throughput (tok/s):         {throughput:.2}
Median TTFT (ms):                        110.25
P99 TTFT (ms):                           {ttft_p99:.2}
Median ITL (ms):                         43.50
P99 ITL (ms):                            80.25
=================================================="
    )
    .lines()
    .map(str::to_string)
    .collect()
}

fn the_client_reports(d: &Deployment, throughput: f64, ttft_p99: f64) {
    let name = sparkform::kinds::machine::docker_name("sparkform-probe.speed-bench");
    d.head.fault(
        &name,
        Fault::ExitsAfterStart(0, report(throughput, ttft_p99)),
    );
}

fn write_bench(dir: &Path, concurrency: u32) {
    std::fs::write(dir.join("bench.hcl"), bench_hcl(concurrency)).unwrap();
}

#[tokio::test]
async fn the_figures_are_recorded_shown_and_a_slower_run_is_rolled_back() {
    let d = Deployment::new();
    write_bench(d.dir.path(), 2);
    the_client_reports(&d, 39.88, 240.75);
    let first = d.apply().await;
    assert!(first.ok, "{:?}", first.failures);

    // The client ran in the deployment's image on the head node, the key as a file only.
    let created = d.head.created();
    let (_, body) = created
        .iter()
        .find(|(n, _)| n.contains("bench"))
        .expect("the benchmark's container was created");
    assert_eq!(body["Image"], "vllm:1");
    let cmd = body.to_string();
    assert!(cmd.contains("--max-concurrency") && cmd.contains("/models/tiny:/models/tiny:ro"));
    // With the tokenizer on the node, nothing is looked up on the hub.
    assert!(
        body["Env"]
            .as_array()
            .is_some_and(|e| e.iter().any(|v| v == "HF_HUB_OFFLINE=1")),
        "{}",
        body["Env"]
    );
    assert!(
        !cmd.contains(KEY),
        "the key is in the container's body: {cmd}"
    );
    let uploads = d.head.uploads();
    let tar = uploads
        .iter()
        .map(|(_, tar)| String::from_utf8_lossy(tar).into_owned())
        .find(|t| t.contains(KEY))
        .expect("the key was not put in as a file");
    // Where the runner reads it: /sparkform/api_key.
    assert!(
        tar.contains("sparkform/api_key\0") && !tar.contains("sparkform/sparkform"),
        "{tar:?}"
    );
    assert!(
        d.head.container(&body["name"].to_string()).is_none()
            && !d.head.containers().iter().any(|c| c.name.contains("bench")),
        "the benchmark's container was left"
    );

    // Recorded with the generation, and shown by status.
    let state = d.state();
    let g = state.generations.last().expect("a generation");
    assert_eq!(
        g.resources["probe.speed"].attributes["bench"]["figures"]["throughput_tok_s"],
        39.88
    );
    assert!(!serde_json::to_string(&state).unwrap().contains(KEY));
    let probes = sparkform::ops::status::probes(&state);
    let speed = probes.iter().find(|p| p.address == "probe.speed").unwrap();
    assert_eq!(speed.measured["throughput"], 39.88);
    assert_eq!(speed.measured["ttft_p99"], 240.75);
    assert!(
        speed
            .last_run
            .as_deref()
            .is_some_and(|s| s.contains("39.9 output tok/s")),
        "{speed:?}"
    );

    // `verify` without -target leaves it out: it loads the engine.
    let evaluated = sparkform::ops::definitions::load(
        &Workspace::new(d.dir.path(), None),
        &VarInputs::default(),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        sparkform::ops::verify::not_run_by_default(evaluated.config(), &[]),
        ["probe.speed"]
    );

    // A no-op plan runs nothing, so no benchmark.
    let again = d.apply().await;
    assert!(again.ok && again.ran.run == 0, "{again:?}");

    // What it measures is replaced and the model got slower: the apply fails naming the
    // figures and rolls back; no new generation.
    the_client_reports(&d, 30.0, 400.0);
    write(d.dir.path(), "ray:2");
    let slower = d.apply().await;
    assert!(!slower.ok && slower.rolled_back, "{slower:?}");
    let why = format!("{:?}", slower.failures);
    assert!(
        why.contains("slower than in the last good generation")
            && why.contains("throughput 30.0 against 39.9")
            && why.contains("ttft_p99 400.0 against 240.8"),
        "{why}"
    );
    let state = d.state();
    assert_eq!(
        state.generations.len(),
        1,
        "a failed apply made a generation"
    );
    assert_eq!(state.resources["container.worker"].config["image"], "ray:1");

    // Within the rules: it passes, and the new figures are the next baseline.
    the_client_reports(&d, 37.0, 250.0);
    let within = d.apply().await;
    assert!(within.ok, "{:?}", within.failures);
    let state = d.state();
    assert_eq!(state.generations.len(), 2);
    assert_eq!(
        state.resources["probe.speed"].attributes["bench"]["figures"]["throughput_tok_s"],
        37.0
    );
}

#[test]
fn a_workload_beyond_the_engines_limits_is_refused_at_plan_with_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ray:1");
    write_bench(dir.path(), 5);
    let err = match sparkform::ops::definitions::load(
        &Workspace::new(dir.path(), None),
        &VarInputs::default(),
    ) {
        Err(OpError::Config(d)) => format!("{d:?}"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a concurrency of 5 against max_num_seqs 4 was accepted"),
    };
    assert!(
        err.contains("concurrency of 5") && err.contains("max_num_seqs (4)"),
        "{err}"
    );
    assert!(
        err.contains("bench.hcl"),
        "the diagnostic names the file: {err}"
    );
}

/// The plan's expected outage ends when the serving probe passes, not after the benchmark that
/// follows it (which measures an endpoint that already answers), and says how much of it is
/// the replaced container's own start, as its last start recorded it.
#[tokio::test]
async fn the_expected_outage_ends_at_readiness_and_names_the_engines_own_start() {
    let d = Deployment::new();
    write_bench(d.dir.path(), 2);
    the_client_reports(&d, 39.88, 240.75);
    let first = d.apply().await;
    assert!(first.ok, "{:?}", first.failures);
    let mut state = d.state();
    // What the last apply measured: the worker's step, its own start, and each probe.
    for (address, secs) in [
        ("container.worker", 30.0),
        ("probe.serving", 2.0),
        ("probe.speed", 12.0),
    ] {
        state.resources.get_mut(address).unwrap().last_apply_secs = Some(secs);
    }
    state
        .resources
        .get_mut("container.worker")
        .unwrap()
        .attributes
        .edit()
        .insert("start_secs".into(), serde_json::json!(25.0));
    d.store().write(&mut state).unwrap();
    write(d.dir.path(), "ray:2");
    let plan = d.plan_recorded().await;
    let impact = plan.impact.clone().expect("an impact");
    assert!(
        impact
            .unavailable
            .iter()
            .all(|o| o.until.as_deref() != Some("probe.speed")),
        "{:?}",
        impact.unavailable
    );
    assert_eq!(impact.outage_secs, Some(32.0), "{impact:?}");
    assert_eq!(impact.engine_start_secs, Some(25.0));
    // The whole apply runs the benchmark after the endpoint is back: 12 s past the outage.
    assert_eq!(impact.apply_secs, Some(44.0), "{impact:?}");
    let text = sparkform::plan::render::render(&plan);
    assert!(
        text.contains("Expected outage: 32.0 s")
            && text.contains("of which 25.0 s is the engine's own start")
            && text.contains("Expected apply: 44.0 s"),
        "{text}"
    );
}

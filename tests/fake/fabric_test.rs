//! The `fabric_test` kind on fake nodes and fake Docker Engines: one rank per node in a one-shot
//! container (the program uploaded as a file, the rank's environment, rank 0's fabric address as
//! the rendezvous), rank 0's nccl-tests table judged against the floor before what depends on
//! the test starts, every container removed however the test ends; and in plans, a test that
//! runs when it is new or changed and never on a no-op plan.

use std::sync::Arc;

use crate::common;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::plan::Action;
use sparkform::state::State;
use sparkform_testkit::fake::{FakeHost, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

const DEFS: &str = r#"
node "a" {
  address = "10.0.0.1"
}
node "b" {
  address = "10.0.0.2"
}
network "roce" {
  subnet = "192.168.200.0/24"
  attach "a" {
    node      = node.a
    interface = "eth1"
    address   = "192.168.200.1"
  }
  attach "b" {
    node      = node.b
    interface = "eth1"
    address   = "192.168.200.2"
  }
}
fabric_test "bw" {
  image          = "img:1"
  nodes          = [node.a, node.b]
  network        = network.roce
  min_busbw_gbps = FLOOR
  size           = "64m"
  env = {
    a = { NCCL_IB_HCA = "=rocep1s0f1:1,roceP2p1s0f1:1", NCCL_DEBUG = "INFO" }
    b = { NCCL_IB_HCA = "=rocep1s0f0:1", NCCL_DEBUG = "INFO" }
  }
  devices = ["/dev/infiniband"]
  ulimits = { memlock = "-1" }
}
container "engine" {
  node       = node.a
  image      = "img:1"
  depends_on = [fabric_test.bw]
}
"#;

fn defs(floor: &str) -> String {
    DEFS.replace("FLOOR", floor)
}

/// Rank 0's output: NCCL's INFO line and nccl-tests' table, with `busbw` at 64 MiB.
fn table(busbw: f64, transport: &str) -> Vec<String> {
    let mut lines = vec![
        format!("a:1:1 [0] NCCL INFO {transport} : Using [0]rocep1s0f1:1/RoCE"),
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong".to_string(),
    ];
    for (size, bw) in [(4194304u64, busbw / 3.0), (67108864, busbw)] {
        lines.push(format!(
            "{size:12}  {:12}     float     sum      -1      N/A     N/A     N/A     N/A    100.0  {bw:6.2}  {bw:6.2}       0",
            size / 4
        ));
    }
    lines.push("# Out of bounds values : 0 OK".into());
    lines
}

struct Run {
    outcome: ApplyOutcome,
    a: Arc<FakeDocker>,
    b: Arc<FakeDocker>,
    state: State,
    dir: tempfile::TempDir,
}

async fn run(floor: &str, rank0: Fault, rank1: Fault) -> Run {
    let dir = common::write_config(&[("main.hcl", &defs(floor))]);
    let (c, g) = common::load(dir.path());
    let a = Arc::new(FakeDocker::start().unwrap());
    let b = Arc::new(FakeDocker::start().unwrap());
    a.image("img:1", "sha256:1111");
    b.image("img:1", "sha256:1111");
    a.fault("sparkform-fabric_test.bw-a", rank0);
    b.fault("sparkform-fabric_test.bw-b", rank1);
    let world = FakeWorld::new();
    let host = |name: &str, d: &Arc<FakeDocker>| {
        let h = FakeHost::new(name, &world)
            .interface("eth1", 9000, &[])
            .docker_engine(d.clone());
        (name.to_string(), Arc::new(h) as Arc<dyn Host>)
    };
    let hosts = [host("node.a", &a), host("node.b", &b)];
    let store = sparkform::state::StateStore::new(dir.path().join("state/sparkform.json"));
    let p = common::plan(&c, &g, &State::new());
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let outcome = apply(ApplyRequest {
        config: &c,
        graph: &g,
        plan: &p,
        store: &store,
        state: State::new(),
        parallelism: 4,
        rollback: true,
        hosts: HostOptions::default(),
        pool: Some(HostPool::from_hosts(hosts.into_iter().collect())),
        events: tx,
        cancel: tokio_util::sync::CancellationToken::new(),
    })
    .await;
    let state = store.load().ok().flatten().unwrap_or_default();
    Run {
        outcome,
        a,
        b,
        state,
        dir,
    }
}

fn rank_done() -> Fault {
    Fault::ExitsAfterStart(
        0,
        vec!["b:2:2 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE".into()],
    )
}

fn env_of(body: &serde_json::Value) -> Vec<String> {
    body["Env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_bandwidth_over_the_floor_passes_and_each_rank_gets_its_node_s_environment() {
    let r = run(
        "20",
        Fault::ExitsAfterStart(0, table(23.74, "NET/IB")),
        rank_done(),
    )
    .await;
    assert!(
        r.outcome.ok,
        "{:?} {:?}",
        r.outcome.failures, r.outcome.not_run
    );
    // What depends on the test ran after it.
    assert!(r.a.created().iter().any(|(n, _)| n == "engine"));
    for (d, node, rank, hca) in [
        (&r.a, "a", "0", "=rocep1s0f1:1,roceP2p1s0f1:1"),
        (&r.b, "b", "1", "=rocep1s0f0:1"),
    ] {
        let name = format!("sparkform-fabric_test.bw-{node}");
        let (_, body) = d
            .created()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no {name} created"));
        let cmd: Vec<String> = body["Cmd"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let arg = |k: &str| cmd.iter().position(|c| c == k).map(|i| cmd[i + 1].clone());
        assert_eq!(arg("--rank").as_deref(), Some(rank), "{cmd:?}");
        assert_eq!(arg("--world-size").as_deref(), Some("2"));
        // Every rank meets at rank 0's fabric address, never the management network.
        assert_eq!(arg("--master-addr").as_deref(), Some("192.168.200.1"));
        assert_eq!(arg("--size").as_deref(), Some("67108864"));
        assert!(
            env_of(&body).contains(&format!("NCCL_IB_HCA={hca}")),
            "{body}"
        );
        assert_eq!(body["HostConfig"]["NetworkMode"], "host");
        assert_eq!(
            body["HostConfig"]["Devices"][0]["PathOnHost"],
            "/dev/infiniband"
        );
        // A helper, not a resource: refresh never takes it for one of the deployment's.
        let labels = body["Labels"].as_object().unwrap();
        assert!(labels.contains_key("sparkform.fabric-test"), "{labels:?}");
        assert!(!labels
            .keys()
            .any(|k| k == "sparkform.lineage" || k == "sparkform.address"));
        // The program is a file put into the container, not a command line.
        let uploads = d.uploads();
        assert!(
            uploads.iter().any(|(n, _)| *n == name),
            "nothing put into {name}"
        );
        assert!(!body.to_string().contains("init_process_group"));
        // And nothing is left.
        assert!(d.container(&name).is_none(), "{name} was left on {node}");
    }
    let recorded = &r.state.resources["fabric_test.bw"];
    assert_eq!(recorded.attributes["busbw_gbps"], serde_json::json!(23.74));
}

#[tokio::test]
async fn a_bandwidth_under_the_floor_fails_before_what_depends_on_it_starts() {
    let r = run(
        "20",
        Fault::ExitsAfterStart(0, table(3.1, "NET/Socket")),
        rank_done(),
    )
    .await;
    assert!(!r.outcome.ok);
    let (address, err) = &r.outcome.failures[0];
    assert_eq!(address, "fabric_test.bw");
    let text = err.render();
    assert!(
        text.contains("bus bandwidth 3.10 GB/s at 64 MiB is below the floor of 20 GB/s"),
        "{text}"
    );
    assert!(text.contains("over NET/Socket"), "{text}");
    assert!(text.contains("NCCL used TCP sockets"), "{text}");
    assert!(
        !r.a.created().iter().any(|(n, _)| n == "engine"),
        "the engine started"
    );
    assert!(r
        .outcome
        .not_run
        .iter()
        .any(|(a, _)| a == "container.engine"));
    for (d, node) in [(&r.a, "a"), (&r.b, "b")] {
        assert!(
            d.container(&format!("sparkform-fabric_test.bw-{node}"))
                .is_none(),
            "a rank's container was left on {node}"
        );
    }
    assert!(!r.state.resources.contains_key("fabric_test.bw"));
    drop(r.dir);
}

#[tokio::test]
async fn a_rank_that_fails_is_named_with_its_node_and_the_fix() {
    let r = run(
        "20",
        Fault::ExitsAfterStart(4, vec!["fabric_test: rank 0 timed out".into()]),
        Fault::ExitsAfterStart(
            6,
            vec!["fabric_test: this image has no torch (No module named 'torch')".into()],
        ),
    )
    .await;
    assert!(!r.outcome.ok);
    let text = r.outcome.failures[0].1.render();
    assert!(
        text.contains("the fabric test's rank on a exited 4")
            || text.contains("the fabric test's rank on b exited 6"),
        "{text}"
    );
    // Rank 0's table never came: no figure is made up.
    assert!(!text.contains("GB/s"), "{text}");
    assert!(r.b.container("sparkform-fabric_test.bw-b").is_none());
}

#[test]
fn it_runs_when_new_or_changed_and_never_on_a_no_op_plan() {
    let dir = common::write_config(&[("main.hcl", &defs("20"))]);
    let state = common::applied(dir.path());
    let (c, g) = common::load(dir.path());
    let p = common::plan(&c, &g, &state);
    assert!(
        p.changes.iter().all(|ch| ch.action == Action::NoOp),
        "a no-op plan runs nothing: {:?}",
        p.changes
            .iter()
            .map(|c| (&c.address, c.action))
            .collect::<Vec<_>>()
    );
    let dir2 = common::write_config(&[("main.hcl", &defs("22"))]);
    let (c2, g2) = common::load(dir2.path());
    let p2 = common::plan(&c2, &g2, &state);
    let test = p2
        .changes
        .iter()
        .find(|ch| ch.address == "fabric_test.bw")
        .unwrap();
    assert_eq!(test.action, Action::Run);
    // The engine keeps running: a test that runs again replaces nothing.
    let engine = p2
        .changes
        .iter()
        .find(|ch| ch.address == "container.engine")
        .unwrap();
    assert_eq!(engine.action, Action::NoOp);
}

#[test]
fn a_bad_block_is_named_with_the_attribute_and_a_hint() {
    let text = defs("0").replace("[node.a, node.b]", "[node.a]");
    let dir = common::write_config(&[("main.hcl", &text)]);
    let d = common::diagnostics(dir.path());
    assert!(d.contains("a fabric test needs two or more"), "{d}");
    let dir = common::write_config(&[("main.hcl", &defs("0"))]);
    let d = common::diagnostics(dir.path());
    assert!(d.contains("min_busbw_gbps"), "{d}");
    assert!(d.contains("main.hcl"), "{d}");
}

//! One prepare pipeline (`ops::prepare`): a plan evaluates the definitions, reads what they
//! leave to the world (the kinds' plan-time reads and the node facts) on one connection per
//! node, evaluates them at most once more, refreshes on the same connections and plans. Counted
//! on fake nodes ("connected" through `HostOptions::fake`) and by `config::evaluations`.

use std::collections::BTreeMap;
use std::sync::Arc;

use sparkform::apply::ApplyOutcome;
use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::ops::prepare::{prepare, PrepareRequest};
use sparkform::ops::ReadMode;
use sparkform::plan::PlanOptions;
use sparkform::state::{State, StateStore};
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{Answer, FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

const COMMIT: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Two nodes that leave their memory to the machines (one logical GPU each) and a fabric
/// attachment on each: what both definitions here start with.
macro_rules! nodes_and_fabric {
    () => {
        r#"
node "n1" {
  address     = "10.0.0.1"
  gpus        = 1
  gpu_devices = false
}
node "n2" {
  address     = "10.0.0.2"
  gpus        = 1
  gpu_devices = false
}

network "a" {
  subnet = "192.168.10.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.10.1"
  }
  attach "n2" {
    node      = node.n2
    interface = "eth1"
    address   = "192.168.10.2"
  }
}
"#
    };
}

/// A worker on n2 joining the head (the container both definitions put on n1) and a probe
/// in the head after it: what both definitions end with.
macro_rules! worker_and_probe {
    () => {
        r#"
container "worker" {
  node       = node.n2
  image      = "ray:1"
  command    = ["ray", "start", "--address", "${network.a.attach.n1.address}:6379"]
  depends_on = [container.head]
  ready {
    exec     = ["ray", "status"]
    timeout  = "2s"
    interval = "1s"
  }
}

probe "serving" {
  timeout    = "5s"
  interval   = "1s"
  depends_on = [container.worker]
  exec {
    container = container.head
    command   = ["curl", "-sf", "localhost:8000/v1/models"]
  }
}
"#
    };
}

/// The shape of examples/testbed-standin: two nodes that leave their memory to the machines, a fabric,
/// a model block whose revision is a branch (resolved on its download node at plan time), a
/// head serving its snapshot, a worker, and a probe.
const TESTBED_LIKE: &str = concat!(
    nodes_and_fabric!(),
    r#"
model "m" {
  repo     = "org/name"
  revision = "main"
  nodes    = [node.n1]
  cache    = "/data/hf"
  network  = network.a
  endpoint = "http://10.255.255.1:9"
  image    = "img:1"
}

container "head" {
  node       = node.n1
  image      = "ray:1"
  command    = ["serve", model.m.path, "--memory", "${node.n1.memory_gib}"]
  depends_on = [network.a]
  ready {
    exec     = ["ray", "status"]
    timeout  = "2s"
    interval = "1s"
  }
}
"#,
    worker_and_probe!(),
    r#"
output "memory" {
  value = [node.n1.memory_gib, node.n2.memory_gib]
}
"#
);

const MEMINFO: &str = "MemTotal:       125410000 kB\nMemFree:        100000000 kB\n";

struct Bed {
    dir: tempfile::TempDir,
    fakes: FakeNodes,
    dockers: BTreeMap<String, Arc<FakeDocker>>,
    hosts: BTreeMap<String, Arc<FakeHost>>,
    /// The round trips per node of the last plan.
    trips: std::sync::Mutex<BTreeMap<String, sparkform::hosts::RoundTrips>>,
}

impl Bed {
    /// The definitions in a folder of their own, and two fake nodes with fake Docker Engines
    /// that answer the node facts, the model's resolve, download and observe (one command).
    fn new() -> Bed {
        Bed::with(TESTBED_LIKE)
    }

    /// [`Bed::new`] with other definitions.
    fn with(definitions: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), definitions).unwrap();
        let world = FakeWorld::new();
        let node = |name: &str, docker: Arc<FakeDocker>| {
            let short = name.trim_start_matches("node.");
            let line = |json: serde_json::Value| vec![json.to_string()];
            docker.fault(
                &format!("sparkform-model.m-{short}-resolve"),
                Fault::ExitsAfterStart(
                    0,
                    line(serde_json::json!({
                        "event": "result", "mode": "resolve", "repo": "org/name",
                        "revision": "main", "commit": COMMIT, "total_bytes": 3000,
                        "files": [{"path": "model.safetensors", "size": 3000}],
                        "config": {"architectures": ["Qwen3ForCausalLM"]},
                    })),
                ),
            );
            docker.fault(
                &format!("sparkform-model.m-{short}-download"),
                Fault::ExitsAfterStart(
                    0,
                    line(serde_json::json!({
                        "event": "result", "mode": "download", "repo": "org/name",
                        "commit": COMMIT, "snapshot": format!("/data/hf/snapshots/{COMMIT}"),
                        "bytes_total": 3000, "bytes_downloaded": 3000, "files_downloaded": 1,
                    })),
                ),
            );
            let h = FakeHost::new(name, &world)
                .interface("eth1", 1500, &[])
                .docker_engine(docker);
            // The model's copy, as the one command of its observe lists it: verified, and
            // unchanged since.
            let sha = "ab".repeat(32);
            let file = serde_json::json!({"path": "model.safetensors", "size": 3000,
                                          "blob": sha, "sha256": sha});
            let mut verified = file.clone();
            verified["mtime_ns"] = serde_json::json!(5_000_000_000u64);
            let record = serde_json::json!({
                "format": "sparkform-verified-manifest/1", "repo": "org/name", "commit": COMMIT,
                "files": [verified], "expected": [file], "total_bytes": 3000,
            });
            h.on(
                &["sh", "-c", sparkform::kinds::model::machine::observe::SCRIPT],
                Answer::Exit(
                    0,
                    format!("== record 1 {COMMIT}.json\n{record}\n== snapshot 1 {COMMIT}\n3000 5.0 model.safetensors\n"),
                    String::new(),
                ),
            );
            h.on(
                &["cat", "/proc/meminfo"],
                Answer::Exit(0, MEMINFO.into(), String::new()),
            );
            h.on(
                &[
                    "nvidia-smi",
                    "--query-gpu=name,memory.total",
                    "--format=csv,noheader,nounits",
                ],
                Answer::Exit(0, "NVIDIA GB10, [N/A]\n".into(), String::new()),
            );
            Arc::new(h)
        };
        let mut dockers = BTreeMap::new();
        let mut hosts = BTreeMap::new();
        let fake: BTreeMap<String, Arc<dyn Host>> = ["node.n1", "node.n2"]
            .into_iter()
            .map(|name| {
                let docker = Arc::new(FakeDocker::start().unwrap());
                dockers.insert(name.to_string(), docker.clone());
                let host = node(name, docker);
                hosts.insert(name.to_string(), host.clone());
                (name.to_string(), host as Arc<dyn Host>)
            })
            .collect();
        Bed {
            dir,
            fakes: FakeNodes::new(fake),
            dockers,
            hosts,
            trips: Default::default(),
        }
    }

    fn workspace(&self) -> Workspace {
        Workspace::new(self.dir.path(), None)
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn hosts(&self) -> HostOptions {
        HostOptions {
            opener: self.fakes.opener(),
            ..HostOptions::default()
        }
    }

    /// Connections opened and evaluations made by `f`.
    async fn counted<T>(
        &self,
        f: impl std::future::Future<Output = T>,
    ) -> (T, BTreeMap<String, usize>, usize) {
        let (opened, evaluated) = (
            self.fakes.opened(),
            sparkform::config::evaluations::of(self.dir.path()),
        );
        let out = f.await;
        let mut now = self.fakes.opened();
        for (node, n) in &mut now {
            *n -= opened.get(node).copied().unwrap_or(0);
        }
        now.retain(|_, n| *n > 0);
        let evaluations = sparkform::config::evaluations::of(self.dir.path()) - evaluated;
        (out, now, evaluations)
    }

    /// `sparkform apply DIR -auto-approve`, on the fakes.
    async fn apply(&self) -> ApplyOutcome {
        self.apply_with(false, false)
            .await
            .unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// [`Self::apply`] with `-upgrade` and `-lockfile=readonly` as given.
    async fn apply_with(
        &self,
        upgrade: bool,
        lockfile_readonly: bool,
    ) -> Result<ApplyOutcome, sparkform::ops::OpError> {
        let evaluated = sparkform::ops::definitions::load(&self.workspace(), &VarInputs::default())
            .unwrap_or_else(|e| panic!("{e:?}"))
            .upgrading(upgrade);
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = sparkform::ops::apply::lock_and_plan(
            sparkform::ops::apply::PlanRequest {
                evaluated,
                lockfile_readonly,
                store: self.store(),
                source: sparkform::ops::apply::PlanSource::Definitions {
                    refresh: ReadMode::Normal,
                    options: PlanOptions::default(),
                },
                hosts: self.hosts(),
            },
            &tx,
        )
        .await?;
        if !prepared.plan.has_changes() {
            // As `sparkform apply` does: nothing to run, the lock file may still change.
            prepared.write_lock()?;
        }
        Ok(prepared
            .apply(
                sparkform::ops::apply::RunOptions {
                    parallelism: 4,
                    rollback: true,
                    hosts: self.hosts(),
                },
                tx,
                tokio_util::sync::CancellationToken::new(),
            )
            .await)
    }

    /// `sparkform plan DIR`, on the fakes: evaluate, one read phase, refresh, plan; then the
    /// connections closed.
    async fn plan(&self) -> sparkform::plan::Plan {
        self.plan_as(ReadMode::Normal).await
    }

    /// [`Self::plan`] with `-refresh` as `refresh` says.
    async fn plan_as(&self, refresh: ReadMode) -> sparkform::plan::Plan {
        self.plan_with(refresh, false).await.0
    }

    /// The plan, the lock file's changes and the plan's warnings, with `-refresh` and
    /// `-upgrade` as given.
    async fn plan_with(
        &self,
        refresh: ReadMode,
        upgrade: bool,
    ) -> (
        sparkform::plan::Plan,
        Vec<String>,
        Vec<sparkform::diag::Diag>,
    ) {
        let recorded = self.store().load().unwrap();
        let evaluated = sparkform::ops::definitions::load(&self.workspace(), &VarInputs::default())
            .unwrap_or_else(|e| panic!("{e:?}"))
            .upgrading(upgrade);
        let lock_before = evaluated.lock().cloned();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut prepared = prepare(
            PrepareRequest {
                evaluated,
                recorded: recorded.as_ref(),
                refresh,
                options: PlanOptions {
                    key: Some(self.store().key_or_create().unwrap()),
                    ..PlanOptions::default()
                },
                hosts: self.hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        prepared.close().await;
        let changes = sparkform::ops::lock_file::LockUpdate::new(
            &prepared.config,
            lock_before.as_ref(),
            upgrade,
            &prepared.images,
            recorded.as_ref(),
        )
        .changes();
        *self.trips.lock().unwrap() = prepared.round_trips.clone();
        (prepared.plan, changes, prepared.warnings)
    }
}

fn both_nodes_once() -> BTreeMap<String, usize> {
    [("node.n1".to_string(), 1), ("node.n2".to_string(), 1)]
        .into_iter()
        .collect()
}

/// Before `ops::prepare` (the reads on connections of their own, then a refresh on new ones,
/// then the node facts' evaluation), this plan opened two connections to n1 and one to n2 and
/// evaluated the definitions three times.
#[tokio::test]
async fn a_no_op_plan_connects_once_per_node_and_evaluates_at_most_twice() {
    let bed = Bed::new();
    // The first apply too: its plan's connections are the apply's.
    let (outcome, opened, _) = bed.counted(bed.apply()).await;
    assert_eq!(opened, both_nodes_once(), "connections opened by the apply");
    assert!(outcome.ok, "{:?} {:?}", outcome.failures, outcome.not_run);
    let state: State = bed.store().load().unwrap().expect("a state");
    assert!(
        state.resources.contains_key("model.m[\"n1\"]"),
        "{:?}",
        state.resources.keys()
    );

    let (plan, opened, evaluations) = bed.counted(bed.plan()).await;
    assert!(
        !plan.has_changes(),
        "{}",
        sparkform::plan::render::render(&plan)
    );
    assert_eq!(opened, both_nodes_once(), "connections opened by the plan");
    assert!(evaluations <= 2, "{evaluations} evaluations");
    // Per node, as `a_no_op_plan_makes_the_recorded_round_trips_per_node` holds them: the glance, the Docker version, the
    // containers by label and one inspect per image; on n1, which holds the weights, also the
    // model's listing of its copies (one command, no container: the lock pins the commit, so
    // nothing is resolved) and the inspect of the model's image (the lock's digest). Before
    // the one-command listing, n1's observation ran a one-shot container (about 6 requests).
    let trips = bed.trips.lock().unwrap().clone();
    println!(
        "round trips per node: {}",
        serde_json::to_string(&trips).unwrap()
    );
    let want = |exec, docker| sparkform::hosts::RoundTrips {
        exec,
        docker,
        total: exec + docker,
    };
    assert_eq!(trips["node.n1"], want(2, 4), "{trips:?}");
    assert_eq!(trips["node.n2"], want(1, 3), "{trips:?}");

    // -refresh=false: the state pins the commit, nothing is connected (and no fact is read,
    // so the head's memory is unset now).
    let (plan, opened, evaluations) = bed.counted(bed.plan_as(ReadMode::Recorded)).await;
    let head = plan
        .change("container.head")
        .and_then(|c| c.after.as_ref())
        .map(|a| a["command"].to_string())
        .unwrap_or_default();
    assert!(head.contains(COMMIT), "{head}");
    assert!(opened.is_empty(), "{opened:?}");
    assert!(evaluations <= 2, "{evaluations} evaluations");
}

/// No state: the download node and the nodes that leave their memory unset, each once (before
/// `ops::prepare`: n1 twice, three evaluations).
#[tokio::test]
async fn a_first_plan_connects_once_per_node() {
    let bed = Bed::new();
    let (plan, opened, evaluations) = bed.counted(bed.plan()).await;
    assert_eq!(
        plan.summary.create,
        5,
        "{}",
        sparkform::plan::render::render(&plan)
    );
    // One evaluation again, with both what the download node resolved and the node facts: the
    // head serves the resolved snapshot with the memory n1 showed.
    let head = plan
        .change("container.head")
        .and_then(|c| c.after.as_ref())
        .map(|a| a["command"].to_string())
        .unwrap_or_default();
    assert!(head.contains(COMMIT) && head.contains("119.6"), "{head}");
    assert_eq!(opened, both_nodes_once(), "connections opened by the plan");
    assert!(evaluations <= 2, "{evaluations} evaluations");
}

const OTHER: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn head_command(plan: &sparkform::plan::Plan) -> String {
    plan.change("container.head")
        .and_then(|c| c.after.as_ref())
        .map(|a| a["command"].to_string())
        .unwrap_or_default()
}

/// `sparkform.lock.hcl`: written by the first apply, left alone by a no-op one; what it pins
/// stands against what the hub says until `-upgrade`; `-lockfile=readonly` refuses a change;
/// a fresh clone plans from it with `-refresh=false`.
#[tokio::test]
async fn the_lock_file_pins_the_commit_until_upgrade() {
    let bed = Bed::new();
    let path = bed.dir.path().join(sparkform::ops::lock_file::FILE);
    assert!(bed.apply().await.ok);
    let text = std::fs::read_to_string(&path).expect("the first apply writes the lock");
    assert!(
        text.contains("model \"model.m\" {") && text.contains(COMMIT) && text.contains("\"main\""),
        "{text}"
    );
    assert_eq!(
        sparkform::fmt::format_source(&text).unwrap(),
        text,
        "fmt-clean"
    );
    assert!(bed.apply().await.ok);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "a no-op apply"
    );

    // The lock pins another commit of `main` (as when it was written, before the branch
    // moved to what the hub says now): plans take the lock's.
    std::fs::write(&path, text.replace(COMMIT, OTHER)).unwrap();
    let (plan, changes, _) = bed.plan_with(ReadMode::Normal, false).await;
    assert!(
        head_command(&plan).contains(OTHER),
        "{}",
        head_command(&plan)
    );
    assert!(changes.is_empty(), "{changes:?}");
    // -upgrade asks the hub again, and says how the lock moves.
    let (plan, changes, _) = bed.plan_with(ReadMode::Normal, true).await;
    assert!(
        head_command(&plan).contains(COMMIT),
        "{}",
        head_command(&plan)
    );
    assert_eq!(
        changes,
        ["model.m: main at aaaaaaaaaaaa (was main at bbbbbbbbbbbb)"],
        "{changes:?}"
    );
    // -lockfile=readonly: the apply that would move the lock stops before anything runs.
    let refused = bed.apply_with(true, true).await;
    assert!(
        matches!(&refused, Err(sparkform::ops::OpError::Config(d)) if d.0[0].code == "lock::readonly"),
        "{:?}",
        refused.err()
    );
    assert!(
        std::fs::read_to_string(&path).unwrap().contains(OTHER),
        "unchanged"
    );

    // A fresh clone (the definitions and the lock, no state): -refresh=false plans the locked
    // commit, connecting to nothing.
    let clone = Bed::new();
    std::fs::copy(
        &path,
        clone.dir.path().join(sparkform::ops::lock_file::FILE),
    )
    .unwrap();
    let (plan, opened, _) = clone.counted(clone.plan_as(ReadMode::Recorded)).await;
    assert!(
        head_command(&plan).contains(OTHER),
        "{}",
        head_command(&plan)
    );
    assert!(opened.is_empty(), "{opened:?}");
}

/// The lock pins each node's image digest: a node whose reference names another image since
/// (pulled or retagged) is drift naming both, an apply refuses it until `-upgrade`, which
/// replaces what runs it and moves the lock.
#[tokio::test]
async fn a_retagged_image_is_drift_until_upgrade() {
    let bed = Bed::new();
    let path = bed.dir.path().join(sparkform::ops::lock_file::FILE);
    assert!(bed.apply().await.ok);
    let text = std::fs::read_to_string(&path).unwrap();
    // The fake engine's image IDs are `sha256:NAME`.
    assert!(
        text.contains("image \"ray:1\" {\n  n1 = \"sha256:ray:1\"\n  n2 = \"sha256:ray:1\"\n}"),
        "{text}"
    );
    let (plan, changes, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    assert!(!plan.has_changes() && changes.is_empty(), "{changes:?}");
    assert!(warnings.iter().all(|w| w.code != "lock::image_drift"));

    let rebuilt = format!("sha256:{}", "c".repeat(64));
    bed.dockers["node.n2"].image("ray:1", &rebuilt);
    let (_, changes, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    let drift: Vec<&str> = warnings
        .iter()
        .filter(|w| w.code == "lock::image_drift")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        drift,
        ["image ray:1 on node.n2 is sha256:cccccccccccc (pulled or retagged since it was locked); sparkform.lock.hcl pins sha256:ray:1"],
        "{warnings:?}"
    );
    assert!(changes.is_empty(), "the lock stands: {changes:?}");
    let refused = bed.apply_with(false, false).await;
    assert!(
        matches!(&refused, Err(sparkform::ops::OpError::Config(d)) if d.0[0].code == "lock::image_drift"),
        "{:?}",
        refused.err()
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "unchanged");

    // The new build on both nodes (one alone would fail the apply's node parity check).
    bed.dockers["node.n1"].image("ray:1", &rebuilt);
    let (_, changes, warnings) = bed.plan_with(ReadMode::Normal, true).await;
    assert!(warnings.iter().all(|w| w.code != "lock::image_drift"));
    assert_eq!(
        changes,
        ["image ray:1: n1 = sha256:cccccccccccc, n2 = sha256:cccccccccccc (was n1 = sha256:ray:1, n2 = sha256:ray:1)"]
    );
    let outcome = bed.apply_with(true, false).await.unwrap();
    assert!(outcome.ok, "{:?}", outcome.failures);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("n1 = \"{rebuilt}\"\n  n2 = \"{rebuilt}\"")),
        "{text}"
    );
    let (plan, changes, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    assert!(
        !plan.has_changes() && changes.is_empty(),
        "{changes:?} {}",
        sparkform::plan::render::render(&plan)
    );
    assert!(warnings.iter().all(|w| w.code != "lock::image_drift"));
}

/// A node's sysfs as the fabric read prints it: one RDMA device driving `eth1` (the fabric's
/// interface), its port in `state`, its PCIe link `width` wide of 4.
fn sysfs(state: &str, width: u32) -> String {
    let c = "/sys/class/infiniband/rocep1s0f1";
    format!(
        "net:rocep1s0f1:eth1\n{c}/ports/1/state:{state}\n{c}/ports/1/link_layer:Ethernet\n\
         {c}/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:c0a8:0a02\n{c}/ports/1/gid_attrs/types/3:RoCE v2\n\
         {c}/device/current_link_width:{width}\n{c}/device/max_link_width:4\n"
    )
}

/// The fabric read at plan time: an RDMA port that is down behind the fabric's interface
/// refuses the plan naming the node, the port and the fix; a PCIe link narrower than its
/// device's maximum is a warning; a node without RDMA devices (as n1 here) is not judged.
#[tokio::test]
async fn a_fabric_port_down_refuses_the_plan_and_a_narrow_pcie_link_is_a_warning() {
    let bed = Bed::new();
    let sysfs_of = |node: &str, text: String| {
        bed.hosts[node].on(&["sh", "-c"], Answer::Exit(0, text, String::new()));
    };
    sysfs_of("node.n2", sysfs("1: DOWN", 4));
    let recorded = bed.store().load().unwrap();
    let evaluated = sparkform::ops::definitions::load(&bed.workspace(), &VarInputs::default())
        .unwrap_or_else(|e| panic!("{e:?}"));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let request = |evaluated| PrepareRequest {
        evaluated,
        recorded: recorded.as_ref(),
        refresh: ReadMode::Normal,
        options: PlanOptions::default(),
        hosts: bed.hosts(),
    };
    match prepare(request(evaluated), &tx).await {
        Err(sparkform::ops::OpError::Config(d)) => {
            assert_eq!(d.0.len(), 1, "{:?}", d.0);
            assert_eq!(d.0[0].code, "fabric::port_down");
            assert_eq!(
                d.0[0].message,
                "node.n2: RDMA port rocep1s0f1/1 behind eth1 is 1: DOWN"
            );
            assert!(d.0[0].help.as_deref().unwrap_or_default().contains("cable"));
        }
        Err(other) => panic!("{other:?}"),
        Ok(p) => panic!("planned with a port down: {:?}", p.warnings),
    }

    sysfs_of("node.n2", sysfs("4: ACTIVE", 1));
    let evaluated = sparkform::ops::definitions::load(&bed.workspace(), &VarInputs::default())
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut prepared = prepare(request(evaluated), &tx)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    prepared.close().await;
    let pcie: Vec<&str> = prepared
        .warnings
        .iter()
        .filter(|w| w.code == "fabric::pcie_width")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        pcie,
        ["node.n2: RDMA device rocep1s0f1 runs its PCIe link at x1 of x4"]
    );
}

/// A lock file that does not parse stops every command that reads the definitions, at its line.
#[tokio::test]
async fn a_malformed_lock_file_is_a_located_error() {
    let bed = Bed::new();
    std::fs::write(
        bed.dir.path().join(sparkform::ops::lock_file::FILE),
        "model \"model.m\" {\n  commit = var.x\n}\n",
    )
    .unwrap();
    match sparkform::ops::definitions::load(&bed.workspace(), &VarInputs::default()) {
        Err(sparkform::ops::OpError::Config(d)) => {
            assert_eq!(d.0[0].code, "lock::invalid");
            assert!(!d.0[0].labels.is_empty());
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a malformed lock loaded"),
    }
}

/// systemd-logind's `RemoveIPC` read at plan time for a container in the node's IPC namespace
/// running as a user other than root: unset (systemd's default, yes) or yes refuses the plan
/// naming the node, the user and the fix; `RemoveIPC=no`, or the user lingering, plans; a user
/// named by number (not matched against the lingering users) is a warning.
#[tokio::test]
async fn remove_ipc_for_a_host_ipc_container_user_refuses_the_plan_with_the_fix() {
    let bed = Bed::new();
    let main = bed.dir.path().join("main.hcl");
    let worker_as = |user: &str| {
        let text = TESTBED_LIKE.replace(
            "  command    = [\"ray\", \"start\",",
            &format!("  ipc_mode   = \"host\"\n  user       = \"{user}\"\n  command    = [\"ray\", \"start\","),
        );
        assert_ne!(text, TESTBED_LIKE);
        std::fs::write(&main, text).unwrap();
    };
    let logind_of = |text: &str| {
        bed.hosts["node.n2"].on(&["sh", "-c"], Answer::Exit(0, text.into(), String::new()));
    };
    let recorded = bed.store().load().unwrap();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let plan = || async {
        let evaluated = sparkform::ops::definitions::load(&bed.workspace(), &VarInputs::default())
            .unwrap_or_else(|e| panic!("{e:?}"));
        let request = PrepareRequest {
            evaluated,
            recorded: recorded.as_ref(),
            refresh: ReadMode::Normal,
            options: PlanOptions::default(),
            hosts: bed.hosts(),
        };
        let mut out = prepare(request, &tx).await;
        if let Ok(p) = out.as_mut() {
            p.close().await;
        }
        out
    };

    worker_as("spark:spark");
    logind_of("");
    match plan().await {
        Err(sparkform::ops::OpError::Config(d)) => {
            assert_eq!(d.0.len(), 1, "{:?}", d.0);
            assert_eq!(d.0[0].code, "host::remove_ipc");
            assert!(
                d.0[0].message.starts_with("node.n2: systemd-logind removes the semaphores and shared memory of user spark when its last session ends (RemoveIPC is unset"),
                "{}",
                d.0[0].message
            );
            assert!(d.0[0].message.contains("container.worker"));
            let help = d.0[0].help.as_deref().unwrap_or_default();
            assert!(help.contains("RemoveIPC=no"), "{help}");
            assert!(help.contains("loginctl enable-linger spark"), "{help}");
            assert!(!d.0[0].labels.is_empty(), "located");
        }
        Err(other) => panic!("{other:?}"),
        Ok(p) => panic!("planned with RemoveIPC unset: {:?}", p.warnings),
    }
    logind_of("/etc/systemd/logind.conf:RemoveIPC=yes\n");
    match plan().await {
        Err(sparkform::ops::OpError::Config(d)) => {
            assert!(d.0[0].message.contains("(RemoveIPC=yes)"), "{:?}", d.0)
        }
        other => panic!("{:?}", other.map(|p| p.warnings)),
    }

    logind_of("/etc/systemd/logind.conf:RemoveIPC=yes\n/etc/systemd/logind.conf.d/90-ipc.conf:RemoveIPC=no\n");
    let p = plan().await.unwrap_or_else(|e| panic!("{e:?}"));
    assert!(!p.warnings.iter().any(|w| w.code == "host::remove_ipc"));
    logind_of("linger:spark\n");
    let p = plan().await.unwrap_or_else(|e| panic!("{e:?}"));
    assert!(!p.warnings.iter().any(|w| w.code == "host::remove_ipc"));

    worker_as("1000");
    logind_of("linger:spark\n");
    let p = plan().await.unwrap_or_else(|e| panic!("{e:?}"));
    let w: Vec<&str> = p
        .warnings
        .iter()
        .filter(|w| w.code == "host::remove_ipc")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(w.len(), 1, "{:?}", p.warnings);
    assert!(w[0].contains("user 1000"), "{}", w[0]);

    // Root is out of logind's reach: the same logind plans.
    worker_as("root");
    logind_of("");
    plan().await.unwrap_or_else(|e| panic!("{e:?}"));
}

/// n2's sysfs with the fabric address's RoCE v2 GID at `index` on rocep1s0f1 (which drives
/// eth1), and the port's twin device roceP2p1s0f1 driving eth2 with a RoCE v2 GID in the
/// subnet too, as on a DGX Spark with one cable; a third device, off the fabric, is not on it.
fn sysfs_with_gid(index: u32) -> String {
    let c = "/sys/class/infiniband";
    format!(
        "net:rocep1s0f1:eth1\nnet:roceP2p1s0f1:eth2\nnet:mlx5_9:eth9\n\
         {c}/rocep1s0f1/ports/1/state:4: ACTIVE\n\
         {c}/rocep1s0f1/ports/1/gids/{index}:0000:0000:0000:0000:0000:ffff:c0a8:0a02\n\
         {c}/rocep1s0f1/ports/1/gid_attrs/types/{index}:RoCE v2\n\
         {c}/roceP2p1s0f1/ports/1/state:4: ACTIVE\n\
         {c}/roceP2p1s0f1/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:c0a8:0a0c\n\
         {c}/roceP2p1s0f1/ports/1/gid_attrs/types/3:RoCE v2\n\
         {c}/mlx5_9/ports/1/state:4: ACTIVE\n\
         {c}/mlx5_9/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:0a00:0001\n\
         {c}/mlx5_9/ports/1/gid_attrs/types/3:RoCE v2\n"
    )
}

fn roce_of(plan: &sparkform::plan::Plan, address: &str) -> serde_json::Value {
    let c = plan
        .changes
        .iter()
        .find(|c| c.address == address)
        .unwrap_or_else(|| panic!("no change for {address}"));
    c.after
        .as_ref()
        .map(|a| a["roce"].clone())
        .unwrap_or_default()
}

/// The attachment kind's plan-time read gives each attachment the RDMA ports on its fabric and
/// the index of its address's RoCE v2 GID (what the modules hand NCCL), the apply records
/// them, a moved index is an in-place change of the attachment naming both, and `-refresh=false`
/// plans with what the last apply recorded and says so. A node without RDMA devices has none.
#[tokio::test]
async fn the_fabric_read_gives_each_attachment_its_rdma_ports_and_gid_index_and_records_them() {
    let bed = Bed::new();
    bed.hosts["node.n2"].on(
        &["sh", "-c"],
        Answer::Exit(0, sysfs_with_gid(3), String::new()),
    );
    let (plan, _, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    let want = serde_json::json!({"gid_index": 3, "ports": ["roceP2p1s0f1:1", "rocep1s0f1:1"]});
    assert_eq!(roce_of(&plan, "network.a.attach.n2"), want);
    assert!(
        roce_of(&plan, "network.a.attach.n1").is_null(),
        "no RDMA on n1"
    );
    assert!(
        warnings.iter().all(|w| !w.code.starts_with("fabric::")),
        "{warnings:?}"
    );
    assert!(bed.apply().await.ok);
    let state = bed.store().load().unwrap().unwrap();
    assert_eq!(state.resources["network.a.attach.n2"].config["roce"], want);

    // A reboot moved the index: the next plan updates the attachment in place, old and new.
    bed.hosts["node.n2"].on(
        &["sh", "-c"],
        Answer::Exit(0, sysfs_with_gid(4), String::new()),
    );
    let plan = bed.plan().await;
    let change = plan
        .changes
        .iter()
        .find(|c| c.address == "network.a.attach.n2")
        .unwrap();
    assert_eq!(change.action, sparkform::plan::Action::Update, "{change:?}");
    let text = sparkform::plan::render::render(&plan);
    assert!(
        text.contains("gid_index") && text.contains('3') && text.contains('4'),
        "{text}"
    );
    assert_eq!(roce_of(&plan, "network.a.attach.n2")["gid_index"], 4);

    // -refresh=false reads no sysfs: the recorded index stands, and the plan says so.
    let (plan, _, warnings) = bed.plan_with(ReadMode::Recorded, false).await;
    assert_eq!(roce_of(&plan, "network.a.attach.n2"), want);
    let recorded: Vec<&str> = warnings
        .iter()
        .filter(|w| w.code == "fabric::recorded")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        recorded,
        ["-refresh=false: the fabric is not read; the RDMA ports and GID indexes are those the last apply recorded: node.n2 GID 3, ports roceP2p1s0f1:1, rocep1s0f1:1"],
        "{warnings:?}"
    );
    let change = plan
        .changes
        .iter()
        .find(|c| c.address == "network.a.attach.n2")
        .unwrap();
    assert_eq!(change.action, sparkform::plan::Action::NoOp, "{change:?}");
}

/// An attachment whose address is not on its node yet has no GID: the index is left to NCCL
/// and the plan warns, naming the node, the address and the ports.
#[tokio::test]
async fn an_address_without_a_gid_yet_leaves_the_index_to_nccl_with_a_warning() {
    let bed = Bed::new();
    let other = sysfs_with_gid(3).replace("c0a8:0a02", "c0a8:0a63");
    bed.hosts["node.n2"].on(&["sh", "-c"], Answer::Exit(0, other, String::new()));
    let (plan, _, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    assert_eq!(
        roce_of(&plan, "network.a.attach.n2"),
        serde_json::json!({"ports": ["roceP2p1s0f1:1", "rocep1s0f1:1"]})
    );
    let unknown: Vec<&str> = warnings
        .iter()
        .filter(|w| w.code == "fabric::gid_unknown")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(
        unknown,
        ["node.n2: no RoCE v2 GID carries 192.168.10.2 yet (ports roceP2p1s0f1:1, rocep1s0f1:1), so NCCL_IB_GID_INDEX is left to NCCL"]
    );
}

/// Ends of one fabric at different MTUs (one fell back to 1500 after a firmware reboot): by
/// default the plan is refused, naming every end, the network's MTU and the command that sets
/// the end back; with `on_mtu_mismatch = "fix"` it is a warning (the testbed's `testbed_fabric`
/// shows the apply setting it on both); at one MTU again there is neither.
#[tokio::test]
async fn ends_of_a_fabric_at_different_mtus_refuse_the_plan_or_with_fix_are_named() {
    let bed = Bed::new();
    let mtu_of = |node: &str, mtu: u32| {
        let text = format!("/sys/class/net/eth1/mtu:{mtu}\n/sys/class/net/lo/mtu:65536\n");
        bed.hosts[node].on(&["sh", "-c"], Answer::Exit(0, text, String::new()));
    };
    mtu_of("node.n1", 9000);
    mtu_of("node.n2", 1500);
    let both = "network.a: the MTU differs between the ends of the fabric: node.n1 eth1 9000, node.n2 eth1 1500 (the network sets 9000)";
    let recorded = bed.store().load().unwrap();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let evaluated = sparkform::ops::definitions::load(&bed.workspace(), &VarInputs::default())
        .unwrap_or_else(|e| panic!("{e:?}"));
    let refused = prepare(
        PrepareRequest {
            evaluated,
            recorded: recorded.as_ref(),
            refresh: ReadMode::Normal,
            options: PlanOptions::default(),
            hosts: bed.hosts(),
        },
        &tx,
    )
    .await;
    match refused {
        Err(sparkform::ops::OpError::Config(d)) => {
            let d =
                d.0.iter()
                    .find(|d| d.code == "fabric::mtu_differs")
                    .expect("the refusal");
            assert_eq!(d.message, both);
            let help = d.help.as_deref().unwrap_or_default();
            assert!(
                help.contains("on node.n2: ip link set dev eth1 mtu 9000"),
                "{help}"
            );
            assert!(help.contains("on_mtu_mismatch = \"fix\""), "{help}");
        }
        Err(other) => panic!("{other:?}"),
        Ok(mut p) => {
            p.close().await;
            panic!("planned with ends at 9000 and 1500: {:?}", p.warnings);
        }
    }
    let main = bed.dir.path().join("main.hcl");
    let text = std::fs::read_to_string(&main).unwrap();
    let fixed = text.replacen(
        "mtu    = 9000",
        "mtu    = 9000\n  on_mtu_mismatch = \"fix\"",
        1,
    );
    assert_ne!(text, fixed);
    std::fs::write(&main, fixed).unwrap();
    let (_, _, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    let differs: Vec<&str> = warnings
        .iter()
        .filter(|w| w.code == "fabric::mtu_differs")
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(differs, [both], "{warnings:?}");
    mtu_of("node.n2", 9000);
    let (_, _, warnings) = bed.plan_with(ReadMode::Normal, false).await;
    assert!(
        warnings.iter().all(|w| w.code != "fabric::mtu_differs"),
        "{warnings:?}"
    );
}

// ------------------------------------------------------------------ round trips
//
// Round trips of a no-op plan, per node, after the connection is up: every `Host::exec` and
// every Docker API request, as `plan --json` reports them (`round_trips`), counted on fake
// nodes and checked against what their fake Docker Engines received. The figure is recorded
// exactly, so a round trip someone adds fails here: batch it into the node's glance
// (`hosts::glance`), share it while the pool remembers (`hosts::pooled`), or record the new
// figure with why. `a_no_op_plan_connects_once_per_node_and_evaluates_at_most_twice` holds a
// model block's share.

/// Two nodes that leave their memory to the machines, a fabric attachment on each, a
/// container on each (one image), and a probe.
const NO_MODEL: &str = concat!(
    nodes_and_fabric!(),
    r#"
container "head" {
  node       = node.n1
  image      = "ray:1"
  command    = ["ray", "start", "--head", "--memory", "${node.n1.memory_gib}"]
  depends_on = [network.a]
  ready {
    exec     = ["ray", "status"]
    timeout  = "2s"
    interval = "1s"
  }
}
"#,
    worker_and_probe!()
);

/// What a no-op plan of [`NO_MODEL`] makes on each node: one command (the node's glance: the
/// fabric's sysfs, meminfo, nvidia-smi, `ip -j addr`) and three Docker requests (the version
/// negotiation, the containers by label, the image inspect shared by the lock file's read and
/// the container's observation). Before the glance and the shared reads: 4 commands and 4
/// Docker requests (the image inspected twice).
const NO_OP_PLAN: sparkform::hosts::RoundTrips = sparkform::hosts::RoundTrips {
    exec: 1,
    docker: 3,
    total: 4,
};

#[tokio::test]
async fn a_no_op_plan_makes_the_recorded_round_trips_per_node() {
    let bed = Bed::with(NO_MODEL);
    let outcome = bed.apply().await;
    assert!(outcome.ok, "{:?} {:?}", outcome.failures, outcome.not_run);
    let before: BTreeMap<String, usize> = bed
        .dockers
        .iter()
        .map(|(n, d)| (n.clone(), d.requests().len()))
        .collect();
    let plan = bed.plan().await;
    assert!(!plan.has_changes(), "a no-op plan");
    let received: BTreeMap<String, u64> = bed
        .dockers
        .iter()
        .map(|(n, d)| (n.clone(), (d.requests().len() - before[n]) as u64))
        .collect();
    let trips = bed.trips.lock().unwrap().clone();
    // What `plan --json` prints under "round_trips".
    println!(
        "round trips per node: {}",
        serde_json::to_string(&trips).unwrap()
    );
    assert_eq!(
        trips.keys().collect::<Vec<_>>(),
        ["node.n1", "node.n2"],
        "{trips:?}"
    );
    for (node, t) in &trips {
        assert_eq!(
            t.docker, received[node],
            "{node}: the pool counts each request the engine received"
        );
        assert_eq!(*t, NO_OP_PLAN, "{node}: {trips:?}");
    }
}

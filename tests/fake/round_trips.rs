//! Round trips of a no-op plan, per node, after the connection is up: every `Host::exec` and
//! every Docker API request, as `plan --json` reports them (`round_trips`), counted on fake
//! nodes and checked against what their fake Docker Engines received. The figure is recorded
//! exactly, so a round trip someone adds fails here: batch it into the node's glance
//! (`hosts::glance`), share it while the pool remembers (`hosts::pooled`), or record the new
//! figure with why.
//!
//! The definition has no `model` block: `tests/fake/prepare.rs`'s no-op plan holds a model's
//! share (one command on the node holding the weights, and its image's inspect).

use std::collections::BTreeMap;
use std::sync::Arc;

use sparkform::config::VarInputs;
use sparkform::hosts::fake::{Answer, FakeHost, FakeNodes, FakeWorld};
use sparkform::hosts::fake_docker::FakeDocker;
use sparkform::hosts::{Host, HostOptions, RoundTrips};
use sparkform::ops::prepare::{prepare, PrepareRequest};
use sparkform::ops::ReadMode;
use sparkform::plan::PlanOptions;
use sparkform::state::StateStore;
use sparkform::workspace::Workspace;

/// Two nodes that leave their memory to the machines, a fabric attachment on each, a
/// container on each (one image), and a probe.
const NO_MODEL: &str = r#"
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
"#;

/// What a no-op plan of [`NO_MODEL`] makes on each node: one command (the node's glance: the
/// fabric's sysfs, meminfo, nvidia-smi, `ip -j addr`) and three Docker requests (the version
/// negotiation, the containers by label, the image inspect shared by the lock file's read and
/// the container's observation). Before the glance and the shared reads: 4 commands and 4
/// Docker requests (the image inspected twice).
const NO_OP_PLAN: RoundTrips = RoundTrips {
    exec: 1,
    docker: 3,
    total: 4,
};

const MEMINFO: &str = "MemTotal:       125410000 kB\nMemFree:        100000000 kB\n";

struct Bed {
    dir: tempfile::TempDir,
    fakes: FakeNodes,
    dockers: BTreeMap<String, Arc<FakeDocker>>,
}

impl Bed {
    fn new(definitions: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), definitions).unwrap();
        let world = FakeWorld::new();
        let mut dockers = BTreeMap::new();
        let hosts: BTreeMap<String, Arc<dyn Host>> = ["node.n1", "node.n2"]
            .into_iter()
            .map(|name| {
                let docker = Arc::new(FakeDocker::start().unwrap());
                dockers.insert(name.to_string(), docker.clone());
                let h = FakeHost::new(name, &world)
                    .interface("eth1", 1500, &[])
                    .docker_engine(docker);
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
                (name.to_string(), Arc::new(h) as Arc<dyn Host>)
            })
            .collect();
        Bed {
            dir,
            fakes: FakeNodes::new(hosts),
            dockers,
        }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn hosts(&self) -> HostOptions {
        HostOptions {
            fake: Some(self.fakes.clone()),
            ..HostOptions::default()
        }
    }

    fn evaluated(&self) -> sparkform::ops::definitions::Evaluated {
        sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// `sparkform apply DIR -auto-approve`.
    async fn apply(&self) {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = sparkform::ops::apply::prepare(
            sparkform::ops::apply::PrepareRequest {
                evaluated: self.evaluated(),
                lockfile_readonly: false,
                store: self.store(),
                source: sparkform::ops::apply::Source::Definitions {
                    refresh: ReadMode::Normal,
                    options: PlanOptions::default(),
                },
                hosts: self.hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        let outcome = prepared
            .apply(
                sparkform::ops::apply::RunOptions {
                    parallelism: 4,
                    rollback: true,
                    hosts: self.hosts(),
                },
                tx,
                tokio_util::sync::CancellationToken::new(),
            )
            .await;
        assert!(outcome.ok, "{:?} {:?}", outcome.failures, outcome.not_run);
    }

    /// `sparkform plan DIR --json`: the plan's round trips per node, and the Docker requests
    /// each fake engine received meanwhile.
    async fn plan(&self) -> (bool, BTreeMap<String, RoundTrips>, BTreeMap<String, u64>) {
        let before: BTreeMap<String, usize> = self
            .dockers
            .iter()
            .map(|(n, d)| (n.clone(), d.requests().len()))
            .collect();
        let recorded = self.store().load().unwrap();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut prepared = prepare(
            PrepareRequest {
                evaluated: self.evaluated(),
                recorded: recorded.as_ref(),
                refresh: ReadMode::Normal,
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
        let received = self
            .dockers
            .iter()
            .map(|(n, d)| (n.clone(), (d.requests().len() - before[n]) as u64))
            .collect();
        (prepared.plan.has_changes(), prepared.round_trips, received)
    }
}

#[tokio::test]
async fn a_no_op_plan_makes_the_recorded_round_trips_per_node() {
    let bed = Bed::new(NO_MODEL);
    bed.apply().await;
    let (changes, trips, received) = bed.plan().await;
    assert!(!changes, "a no-op plan");
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

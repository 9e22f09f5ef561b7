//! The start gate of a process group (`kinds::machine::StartGate`): the members of one group
//! that an apply replaces stop nothing until every member's image is on its node, and start
//! nothing new until every previous member has stopped; then they start together, whatever the
//! parallelism. On fake nodes with fake Docker Engines.

use std::path::Path;
use std::sync::Arc;

use sparkform::apply::ApplyOutcome;
use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::kinds::machine::ReadMode;
use sparkform::ops::apply::{lock_and_plan, PlanRequest, PlanSource, RunOptions};
use sparkform::plan::{Action, PlanOptions};
use sparkform::state::StateStore;
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{node_with_engine, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::FakeDocker;

/// Two ranks of one process group, on `nodes` (the second on the first's node when both name
/// `n1`), running `image`; neither waits for the other.
fn write(dir: &Path, image: &str, second_node: &str) {
    let rank = |name: &str, node: &str| {
        format!(
            r#"
container "{name}" {{
  node          = node.{node}
  image         = "{image}"
  process_group = "engine"
  ready {{
    exec     = ["true"]
    timeout  = "2s"
    interval = "1s"
  }}
}}
"#
        )
    };
    let hcl = format!(
        "node \"n1\" {{ address = \"10.0.0.1\" }}\nnode \"n2\" {{ address = \"10.0.0.2\" }}\n{}{}",
        rank("rank0", "n1"),
        rank("rank1", second_node)
    );
    std::fs::write(dir.join("main.hcl"), hcl).unwrap();
}

struct Bed {
    dir: tempfile::TempDir,
    hosts: Vec<(String, Arc<dyn Host>)>,
    n1: Arc<FakeDocker>,
    n2: Arc<FakeDocker>,
}

impl Bed {
    fn new(second_node: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "eng:1", second_node);
        let world = FakeWorld::new();
        let (h1, n1) = node_with_engine("node.n1", &world).unwrap();
        let (h2, n2) = node_with_engine("node.n2", &world).unwrap();
        Bed {
            dir,
            hosts: vec![h1, h2],
            n1,
            n2,
        }
    }

    /// `sparkform apply -auto-approve -parallelism=1`: one step at a time, except the members
    /// of a process group, which start together.
    async fn apply(&self) -> (sparkform::plan::Plan, ApplyOutcome) {
        let hosts = || HostOptions {
            opener: FakeNodes::new(self.hosts.iter().cloned().collect()).opener(),
            ..HostOptions::default()
        };
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = lock_and_plan(
            PlanRequest {
                evaluated,
                lockfile_readonly: false,
                store: StateStore::new(self.dir.path().join("state/sparkform.json")),
                source: PlanSource::Definitions {
                    refresh: ReadMode::Normal,
                    options: PlanOptions::default(),
                },
                hosts: hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        let plan = prepared.plan.clone();
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            prepared.apply(
                RunOptions {
                    parallelism: 1,
                    rollback: true,
                    hosts: hosts(),
                },
                tx,
                tokio_util::sync::CancellationToken::new(),
            ),
        )
        .await
        .expect("the members of a group waited on each other forever");
        (plan, outcome)
    }
}

/// The requests a fake engine got that stop or create a container, in order.
fn stops_and_creates(d: &FakeDocker) -> Vec<String> {
    d.requests()
        .into_iter()
        .filter(|r| r.starts_with("POST /containers/create") || r.ends_with("/stop"))
        .collect()
}

#[tokio::test]
async fn the_ranks_stop_together_and_start_together_even_one_step_at_a_time() {
    let bed = Bed::new("n1");
    let (_, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let before = stops_and_creates(&bed.n1).len();
    write(bed.dir.path(), "eng:2", "n1");
    let (plan, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    for a in ["container.rank0", "container.rank1"] {
        assert_eq!(plan.change(a).map(|c| c.action), Some(Action::Replace));
    }
    // Both on one engine: one order of requests. Every previous rank stopped before any new
    // rank was created, with -parallelism=1.
    let seen = stops_and_creates(&bed.n1)[before..].to_vec();
    let kinds: Vec<&str> = seen
        .iter()
        .map(|r| {
            if r.ends_with("/stop") {
                "stop"
            } else {
                "create"
            }
        })
        .collect();
    assert_eq!(kinds, ["stop", "stop", "create", "create"], "{seen:?}");
}

#[tokio::test]
async fn an_image_missing_on_one_node_stops_nothing_on_the_other() {
    let bed = Bed::new("n2");
    let (_, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let (n1_before, n2_before) = (
        stops_and_creates(&bed.n1).len(),
        stops_and_creates(&bed.n2).len(),
    );
    bed.n2.image_error("eng:2", 404, "No such image: eng:2");
    write(bed.dir.path(), "eng:2", "n2");
    let (_, outcome) = bed.apply().await;
    assert!(!outcome.ok, "an image that is not there cannot start");
    let failures: Vec<String> = outcome
        .failures
        .iter()
        .map(|(a, e)| format!("{a}: {}", e.message))
        .collect();
    assert!(
        failures.iter().any(|f| f.starts_with("container.rank1: ")),
        "{failures:?}"
    );
    // Rank 0's image was there, but its previous container was never stopped: the group
    // gave up before anything stopped.
    assert_eq!(stops_and_creates(&bed.n1)[n1_before..], [] as [String; 0]);
    assert_eq!(stops_and_creates(&bed.n2)[n2_before..], [] as [String; 0]);
    let rank0 = bed.n1.container("rank0").expect("rank 0 keeps its name");
    assert!(rank0.running && rank0.image == "eng:1", "{rank0:?}");
}

//! A lost state, on a fake node: the containers an apply started run on with its lineage, the
//! state file is gone, and `plan` (through `ops::prepare`, as the command runs it) lists them
//! with their lineage and the `import` blocks that adopt them; those blocks, written with the
//! definitions, make an apply that records them without creating anything (the same container
//! IDs); without them, an apply stops at the first name it finds taken and names the block.

use std::collections::BTreeMap;
use std::sync::Arc;

use sparkform::apply::ApplyOutcome;
use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::ops::prepare::{prepare, PrepareRequest};
use sparkform::ops::ReadMode;
use sparkform::plan::{render, Plan, PlanOptions};
use sparkform::state::StateStore;
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::FakeDocker;

const DEFS: &str = r#"
node "n1" {
  address    = "10.0.0.1"
  gpus       = 1
  memory_gib = 128
}

container "head" {
  node  = node.n1
  name  = "ray-head"
  image = "ray:1"
  command = ["ray", "start", "--head", "--block"]
}

container "worker" {
  node       = node.n1
  name       = "ray-worker"
  image      = "ray:1"
  command    = ["ray", "start", "--address", "10.0.0.1:6379", "--block"]
  depends_on = [container.head]
}
"#;

struct Bed {
    dir: tempfile::TempDir,
    engine: Arc<FakeDocker>,
    fakes: FakeNodes,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), DEFS).unwrap();
        let engine = Arc::new(FakeDocker::start().unwrap());
        let host = FakeHost::new("node.n1", &FakeWorld::new()).docker_engine(engine.clone());
        let hosts: BTreeMap<String, Arc<dyn Host>> =
            [("node.n1".to_string(), Arc::new(host) as Arc<dyn Host>)]
                .into_iter()
                .collect();
        Bed {
            dir,
            engine,
            fakes: FakeNodes::new(hosts),
        }
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

    /// `sparkform plan DIR`, on the fake node.
    async fn plan(&self) -> Plan {
        let recorded = self.store().load().unwrap();
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut prepared = prepare(
            PrepareRequest {
                evaluated,
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
        prepared.plan
    }

    /// `sparkform apply DIR -auto-approve`, on the fake node.
    async fn apply(&self) -> ApplyOutcome {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = sparkform::ops::apply::lock_and_plan(
            sparkform::ops::apply::PlanRequest {
                evaluated,
                lockfile_readonly: false,
                store: self.store(),
                source: sparkform::ops::apply::PlanSource::Definitions {
                    refresh: ReadMode::Normal,
                    options: PlanOptions::default(),
                },
                hosts: self.hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        prepared
            .apply(
                sparkform::ops::apply::RunOptions {
                    parallelism: 4,
                    rollback: true,
                    hosts: self.hosts(),
                },
                tx,
                tokio_util::sync::CancellationToken::new(),
            )
            .await
    }

    fn creates(&self) -> usize {
        self.engine
            .requests()
            .iter()
            .filter(|r| r.starts_with("POST /containers/create"))
            .count()
    }

    fn id_of(&self, name: &str) -> String {
        self.engine
            .container(name)
            .unwrap_or_else(|| panic!("{name} is gone"))
            .id
    }

    /// Applied, then the state (file, backup, key) deleted: the old lineage.
    async fn applied_then_lost(&self) -> String {
        let outcome = self.apply().await;
        assert!(outcome.ok, "{:?}", outcome.failures);
        let lineage = self.store().load().unwrap().unwrap().lineage;
        std::fs::remove_dir_all(self.dir.path().join("state")).unwrap();
        lineage
    }
}

#[tokio::test]
async fn a_lost_state_plan_lists_what_runs_under_another_lineage_and_its_import_blocks_adopt_it() {
    let bed = Bed::new();
    let old = bed.applied_then_lost().await;
    let (head, worker) = (bed.id_of("ray-head"), bed.id_of("ray-worker"));
    let created = bed.creates();

    let plan = bed.plan().await;
    let listed: Vec<(&str, &str, &str, Option<&str>)> = plan
        .foreign
        .iter()
        .map(|f| {
            (
                f.address.as_str(),
                f.node.as_str(),
                f.name.as_str(),
                f.lineage.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("container.head", "node.n1", "ray-head", Some(old.as_str())),
            (
                "container.worker",
                "node.n1",
                "ray-worker",
                Some(old.as_str())
            ),
        ]
    );
    let text = render::render(&plan);
    assert!(
        text.contains("Warning: these run already with sparkform's labels"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "! container.head on node.n1: container ray-head ({}), lineage {old}",
            &head[..12]
        )),
        "{text}"
    );
    assert!(text.contains("-generate-import-out=FILE"), "{text}");
    assert!(text.contains("to = container.worker"), "{text}");

    // What `plan -generate-import-out=imports.hcl` writes, beside the definitions.
    let blocks = sparkform::plan::import_blocks(&plan.foreign);
    std::fs::write(bed.dir.path().join("imports.hcl"), &blocks).unwrap();
    let adopting = bed.plan().await;
    assert!(adopting.foreign.is_empty(), "{}", render::render(&adopting));
    assert_eq!(adopting.summary.import, 2, "{}", render::render(&adopting));
    assert_eq!(
        (
            adopting.summary.create,
            adopting.summary.replace,
            adopting.summary.update
        ),
        (0, 0, 0),
        "{}",
        render::render(&adopting)
    );

    let outcome = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(bed.creates(), created, "nothing created again");
    assert_eq!(
        (bed.id_of("ray-head"), bed.id_of("ray-worker")),
        (head.clone(), worker.clone())
    );
    assert!(bed.engine.container("ray-head").unwrap().running);
    let state = bed.store().load().unwrap().unwrap();
    assert_ne!(state.lineage, old, "a new state");
    assert_eq!(
        state.resources["container.head"].attributes["container_id"],
        head
    );
    assert_eq!(
        state.resources["container.worker"].attributes["container_id"],
        worker
    );
    let after = bed.plan().await;
    assert!(!after.has_changes(), "{}", render::render(&after));
    assert!(after.foreign.is_empty());
}

#[tokio::test]
async fn only_the_definitions_addresses_under_another_or_no_lineage_are_listed() {
    let bed = Bed::new();
    let outcome = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let lineage = bed.store().load().unwrap().unwrap().lineage;
    // The state records head and worker; these it does not.
    bed.engine.add(
        "stray",
        "ray:1",
        &[("sparkform.address", "container.gone")],
        true,
    );
    bed.engine.add(
        "worker-by-hand",
        "ray:1",
        &[("sparkform.address", "container.worker")],
        true,
    );
    assert!(
        bed.plan().await.foreign.is_empty(),
        "the state has both addresses"
    );
    // Worker's record lost: the unlabelled-lineage one and the state's own are told apart.
    let mut state = bed.store().load().unwrap().unwrap();
    state.resources.remove("container.worker");
    bed.store().write(&mut state).unwrap();
    let plan = bed.plan().await;
    let listed: Vec<(&str, &str, Option<&str>)> = plan
        .foreign
        .iter()
        .map(|f| (f.address.as_str(), f.name.as_str(), f.lineage.as_deref()))
        .collect();
    assert_eq!(listed, [("container.worker", "worker-by-hand", None)]);
    // The one of the state's own lineage is this deployment's untracked container, as before.
    assert!(
        plan.changes
            .iter()
            .any(|c| c.orphan.as_ref().is_some_and(|o| o.name == "ray-worker")),
        "{}",
        render::render(&plan)
    );
    assert_ne!(lineage, "");
}

#[tokio::test]
async fn an_apply_that_finds_the_name_taken_names_the_import_block() {
    let bed = Bed::new();
    bed.applied_then_lost().await;
    let outcome = bed.apply().await;
    assert!(!outcome.ok, "the names are taken");
    let (address, error) = outcome.failures.first().expect("the first create fails");
    assert_eq!(address, "container.head");
    let text = error.render();
    assert!(
        text.contains("a container named ray-head already exists on node.n1"),
        "{text}"
    );
    assert!(
        text.contains("import {\n  to = container.head\n  id = \"n1:ray-head\"\n}"),
        "{text}"
    );
    assert!(text.contains("-generate-import-out"), "{text}");
}

//! `keep_revisions`: a model's node keeps the verified snapshots of its last revisions (two by
//! default, the one in use included) for a rollback, records them (refresh does not take them
//! for untracked copies), says in the plan what they hold, removes the oldest once a third
//! revision is in use, and destroy removes them all. On one fake node whose Docker Engine plays
//! the transfer program's results.

use std::sync::Arc;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::config::{self, ModelReadings, Readings, VarInputs};
use sparkform::graph::Graph;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::plan::{self, Plan, PlanOptions};
use sparkform::state::{State, StateStore};
use sparkform_testkit::fake::{FakeHost, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "cccccccccccccccccccccccccccccccccccccccc";

const DEFINITIONS: &str = r#"
node "a" {
  address = "10.0.0.1"
}
model "m" {
  repo     = "org/name"
  revision = "main"
  nodes    = [node.a]
  cache    = "/data/hf"
  image    = "img:1"
}
"#;

struct Node {
    dir: tempfile::TempDir,
    docker: Arc<FakeDocker>,
    host: Arc<dyn Host>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), DEFINITIONS).unwrap();
        let docker = Arc::new(FakeDocker::start().unwrap());
        docker.fault(
            "sparkform-model.m-a-remove",
            Fault::ExitsAfterStart(
                0,
                vec![
                    serde_json::json!({"event": "result", "mode": "remove", "bytes_freed": 3000})
                        .to_string(),
                ],
            ),
        );
        let world = FakeWorld::new();
        let host: Arc<dyn Host> =
            Arc::new(FakeHost::new("node.a", &world).docker_engine(docker.clone()));
        Node { dir, docker, host }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    /// The definitions with `main` resolved to `commit`.
    fn definitions(&self, commit: &str) -> (config::Config, Graph) {
        let mut readings = Readings::default();
        readings.models.insert(
            "model.m".into(),
            ModelReadings {
                revision: "main".into(),
                commit: commit.into(),
                manifest: serde_json::json!({"total_bytes": 3000, "files": [{"path": "a"}]}),
                config: serde_json::json!({"architectures": ["Qwen3ForCausalLM"]}),
            },
        );
        let c = config::load_with_readings(self.dir.path(), &VarInputs::default(), &readings)
            .unwrap_or_else(|d| panic!("{}", sparkform::diag::render_plain(&d.0)));
        let g = Graph::build(&c).unwrap();
        (c, g)
    }

    /// Plan and apply `main` at `commit` (the download's result plays it).
    async fn apply(&self, commit: &str) -> (Plan, ApplyOutcome) {
        self.docker.fault(
            "sparkform-model.m-a-download",
            Fault::ExitsAfterStart(
                0,
                vec![
                    serde_json::json!({"event": "result", "mode": "download", "commit": commit,
                     "bytes_total": 3000, "bytes_downloaded": 3000, "files_downloaded": 1})
                    .to_string(),
                ],
            ),
        );
        let (c, g) = self.definitions(commit);
        let state = self.state();
        let p = plan::plan(&c, &g, &state, &PlanOptions::default()).unwrap();
        self.run(&c, &g, &p, state).await
    }

    async fn run(
        &self,
        c: &config::Config,
        g: &Graph,
        p: &Plan,
        state: State,
    ) -> (Plan, ApplyOutcome) {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let outcome = apply(ApplyRequest {
            config: c,
            graph: g,
            plan: p,
            store: &self.store(),
            state,
            parallelism: 2,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(HostPool::from_hosts(
                [("node.a".to_string(), self.host.clone())].into(),
            )),
            events: tx,
            cancel: tokio_util::sync::CancellationToken::new(),
        })
        .await;
        (p.clone(), outcome)
    }

    /// The commits the removals were asked to remove, in order.
    fn removed(&self) -> Vec<String> {
        self.docker
            .created()
            .iter()
            .filter(|(n, _)| n.ends_with("-remove"))
            .filter_map(|(_, body)| {
                let cmd = body["Entrypoint"].to_string();
                [A, B, C]
                    .into_iter()
                    .find(|c| cmd.contains(c))
                    .map(str::to_string)
            })
            .collect()
    }

    fn kept(&self) -> serde_json::Value {
        let state = self.state();
        let r = state
            .resources
            .get("model.m[\"a\"]")
            .unwrap_or_else(|| panic!("{:?}", state.resources.keys().collect::<Vec<_>>()));
        r.attributes.get("kept").cloned().unwrap_or_default()
    }
}

#[tokio::test]
async fn two_revisions_are_kept_the_third_removed_and_destroy_removes_them_all() {
    let node = Node::new();
    let (_, first) = node.apply(A).await;
    assert!(first.ok, "{:?}", first.failures);
    assert!(
        node.kept().is_null(),
        "nothing earlier to keep: {}",
        node.kept()
    );

    // B in use: A is kept (keep_revisions = 2 by default), nothing removed.
    let (p, second) = node.apply(B).await;
    assert!(second.ok, "{:?}", second.failures);
    assert!(
        p.notes.iter().any(|n| n
            .contains("model.m[\"a\"]: 1 earlier revision (2.9 KiB, aaaaaaaaaaaa)")
            && !n.contains(", and removes")),
        "{:?}",
        p.notes
    );
    assert_eq!(
        node.kept(),
        serde_json::json!([{"commit": A, "bytes": 3000}])
    );
    assert!(node.removed().is_empty(), "{:?}", node.removed());

    // C in use: B is kept, A goes; the plan says what stays behind once it ran, what that
    // holds, and what goes.
    let (p, third) = node.apply(C).await;
    assert!(third.ok, "{:?}", third.failures);
    assert!(
        p.notes.iter().any(|n| {
            n.contains(
            "Kept on the nodes for a rollback once this apply succeeds"
        ) && n.contains(
            "model.m[\"a\"]: 1 earlier revision (2.9 KiB, bbbbbbbbbbbb), and removes aaaaaaaaaaaa"
        )
        }),
        "{:?}",
        p.notes
    );
    assert_eq!(
        node.kept(),
        serde_json::json!([{"commit": B, "bytes": 3000}])
    );
    assert_eq!(node.removed(), [A]);

    // Destroy: the copy in use and the kept one.
    let (c, g) = node.definitions(C);
    let state = node.state();
    let destroy =
        sparkform::ops::apply::plan_destroy(&c, &state, Vec::new(), Vec::new(), None).unwrap();
    let (_, gone) = node.run(&c, &g, &destroy, state).await;
    assert!(gone.ok, "{:?}", gone.failures);
    assert_eq!(node.removed(), [A, C, B]);
}

/// A rollback to weights its node no longer keeps: with the hub unreachable from the download
/// node, the model kind refuses it at plan (`Machine::restorable`), naming the revision, the
/// node and `keep_revisions`; with the hub answering, the plan says the weights come from it.
#[tokio::test]
async fn a_rollback_to_weights_no_node_keeps_is_refused_at_plan_while_the_hub_is_down() {
    use sparkform::kinds::machine::{machine, Restorable};
    use sparkform::vocabulary::KindId;
    use sparkform_testkit::fake::Answer;
    let node = Node::new();
    let (_, first) = node.apply(A).await;
    assert!(first.ok, "{:?}", first.failures);
    let record = node.state().resources["model.m[\"a\"]"].clone();
    let world = FakeWorld::new();
    let host = FakeHost::new("node.a", &world).docker_engine(node.docker.clone());
    // The node's caches list nothing: no verified copy of A is kept there.
    host.on(&["sh", "-c"], Answer::Exit(0, String::new(), String::new()));
    let unreachable = serde_json::json!({"event": "error", "code": 4, "message":
        "repository org/name revision aaaa: the hub at 10.9.9.9:8080 cannot be reached: [Errno 113] No route to host"});
    node.docker.fault(
        "sparkform-model.m-a-resolve",
        Fault::ExitsAfterStart(4, vec![unreachable.to_string()]),
    );
    let model = machine(KindId::Model);
    let got = model.restorable(&host, "model.m[\"a\"]", &record, 1).await;
    let [Restorable::Refused { message, help }] = got.as_slice() else {
        panic!("not refused: {got:?}")
    };
    assert!(
        message.contains("generation 1 ran org/name at aaaaaaaaaaaa")
            && message.contains("which a does not keep")
            && message.contains("cannot be reached"),
        "{message}"
    );
    assert!(help.contains("keep_revisions"), "{help}");
    // The hub answers: the rollback fetches the weights again, said in the plan.
    let resolved = serde_json::json!({"event": "result", "mode": "resolve", "repo": "org/name",
        "commit": A, "files": [], "total_bytes": 0});
    node.docker.fault(
        "sparkform-model.m-a-resolve",
        Fault::ExitsAfterStart(0, vec![resolved.to_string()]),
    );
    let got = model.restorable(&host, "model.m[\"a\"]", &record, 1).await;
    assert!(
        matches!(got.as_slice(), [Restorable::Note(n)] if n.contains("fetches it again from the hub")),
        "{got:?}"
    );
}

//! `moved` and `removed` blocks, and `state mv` / `state rm`'s operations, on the fake Docker
//! Engine: a module renamed with a `moved` block plans no change on the node and keeps its
//! running container (its derived name too); a `removed` block forgets a container and leaves
//! it running, and later plans neither destroy it nor take it for a lost record's leftover;
//! the blocks' mistakes are refused at validate, a move onto a recorded address at plan.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use sparkform::apply::{apply, ApplyRequest};
use sparkform::config::{Config, VarInputs};
use sparkform::graph::Graph;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::plan::{self, render, Action, Plan, PlanOptions};
use sparkform::state::{HashKey, State, StateStore};
use sparkform_testkit::fake::{FakeHost, FakeWorld};
use sparkform_testkit::fake_docker::FakeDocker;
use tokio_util::sync::CancellationToken;

/// A module with one container that has no `name`: its Docker name is derived from its
/// address (`MODULE-engine`).
const MODULE: &str = r#"
variable "node" {}
container "engine" {
  node    = var.node
  image   = "engine:1"
  command = ["serve"]
}
"#;

fn root(module_name: &str, extra: &str) -> String {
    format!(
        r#"
node "n1" {{ address = "10.0.0.1" }}

module "{module_name}" {{
  source = "./engine"
  node   = node.n1
}}

container "side" {{
  node    = node.n1
  name    = "side"
  image   = "engine:1"
  command = ["sleep"]
}}
{extra}
"#
    )
}

struct Bed {
    dir: tempfile::TempDir,
    engine: Arc<FakeDocker>,
    host: Arc<FakeHost>,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("engine")).unwrap();
        std::fs::write(dir.path().join("engine/main.hcl"), MODULE).unwrap();
        let engine = Arc::new(FakeDocker::start().unwrap());
        let host =
            Arc::new(FakeHost::new("node.n1", &FakeWorld::new()).docker_engine(engine.clone()));
        Bed { dir, engine, host }
    }

    fn write(&self, hcl: &str) -> (Config, Graph) {
        std::fs::write(self.dir.path().join("main.hcl"), hcl).unwrap();
        common::load(self.dir.path())
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    async fn refreshed(&self) -> plan::Observations {
        sparkform::observe::observe_hosts(
            &self.state(),
            vec![("node.n1".to_string(), self.host.clone() as Arc<dyn Host>)],
        )
        .await
        .unwrap()
    }

    /// The plan of `config` against the state, with what the node runs observed.
    async fn plan(&self, config: &Config, graph: &Graph) -> Plan {
        plan::plan(
            config,
            graph,
            &self.state(),
            &PlanOptions {
                key: Some(HashKey::from_bytes([7; 32])),
                observations: Some(self.refreshed().await),
                ..PlanOptions::default()
            },
        )
        .unwrap_or_else(|d| panic!("{}", d.message))
    }

    async fn apply(&self, config: &Config, graph: &Graph, plan: &Plan) {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let pool = HostPool::from_hosts(
            [("node.n1".to_string(), self.host.clone() as Arc<dyn Host>)]
                .into_iter()
                .collect(),
        );
        let outcome = apply(ApplyRequest {
            config,
            graph,
            plan,
            store: &self.store(),
            state: self.state(),
            parallelism: 4,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(pool),
            events: tx,
            cancel: CancellationToken::new(),
        })
        .await;
        assert!(outcome.ok, "{:?}", outcome.failures);
    }

    /// The containers the fake engine runs: (name, id).
    async fn running(&self) -> Vec<(String, String)> {
        let docker = self.host.docker().await.unwrap();
        let list = docker
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                ..Default::default()
            }))
            .await
            .unwrap();
        let mut out: Vec<(String, String)> = list
            .into_iter()
            .map(|c| {
                let name = c.names.unwrap_or_default().join(",");
                (
                    name.trim_start_matches('/').to_string(),
                    c.id.unwrap_or_default(),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn creates_and_removes(&self) -> usize {
        self.engine
            .requests()
            .iter()
            .filter(|r| {
                r.starts_with("POST /containers/create") || r.starts_with("DELETE /containers/")
            })
            .count()
    }
}

fn changes(plan: &Plan) -> Vec<(String, Action)> {
    plan.changes
        .iter()
        .filter(|c| c.action.is_change())
        .map(|c| (c.address.clone(), c.action))
        .collect()
}

#[tokio::test]
async fn a_module_renamed_with_a_moved_block_keeps_its_running_container() {
    let bed = Bed::new();
    let (config, graph) = bed.write(&root("qwen", ""));
    let first = bed.plan(&config, &graph).await;
    bed.apply(&config, &graph, &first).await;
    let before = bed.running().await;
    assert!(
        before.iter().any(|(n, _)| n == "qwen-engine"),
        "the derived name: {before:?}"
    );
    let touched = bed.creates_and_removes();

    // Renamed without a move: the container at the old address goes, a new one comes.
    let (config, graph) = bed.write(&root("qwen35", ""));
    let plan = bed.plan(&config, &graph).await;
    assert!(
        changes(&plan).contains(&("module.qwen.container.engine".into(), Action::Delete)),
        "{}",
        render::render(&plan)
    );

    // With the move: the state's record is re-addressed, nothing on the node changes.
    let (config, graph) = bed.write(&root(
        "qwen35",
        "moved {\n  from = module.qwen\n  to   = module.qwen35\n}\n",
    ));
    assert_eq!(
        config
            .resource("module.qwen35.container.engine")
            .and_then(|r| r.config.get("name").cloned()),
        Some(serde_json::json!("qwen-engine")),
        "the moved container keeps the name derived from its old address"
    );
    let plan = bed.plan(&config, &graph).await;
    let text = render::render(&plan);
    assert_eq!(changes(&plan), Vec::new(), "{text}");
    assert!(
        plan.has_changes(),
        "a move is a change of the state: {text}"
    );
    assert!(
        text.contains("# module.qwen.container.engine has moved to module.qwen35.container.engine"),
        "{text}"
    );
    assert!(
        text.contains("Plan: 1 to move, 0 to add, 0 to change, 0 to replace, 0 to destroy"),
        "{text}"
    );
    bed.apply(&config, &graph, &plan).await;
    let state = bed.state();
    assert!(state
        .resources
        .contains_key("module.qwen35.container.engine"));
    assert!(!state.resources.contains_key("module.qwen.container.engine"));
    assert_eq!(bed.running().await, before, "the container was touched");
    assert_eq!(bed.creates_and_removes(), touched);

    // The next plan finds the container by its recorded ID (its label still names the old
    // address): no change, nothing taken for a leftover.
    let again = bed.plan(&config, &graph).await;
    assert!(!again.has_changes(), "{}", render::render(&again));
}

#[tokio::test]
async fn a_removed_block_forgets_a_container_and_leaves_it_running() {
    let bed = Bed::new();
    let (config, graph) = bed.write(&root("qwen", ""));
    let first = bed.plan(&config, &graph).await;
    bed.apply(&config, &graph, &first).await;
    let before = bed.running().await;
    let touched = bed.creates_and_removes();

    let without_side = root("qwen", "").replace(
        "container \"side\" {\n  node    = node.n1\n  name    = \"side\"\n  image   = \"engine:1\"\n  command = [\"sleep\"]\n}\n",
        "removed {\n  from = container.side\n  lifecycle {\n    destroy = false\n  }\n}\n",
    );
    let (config, graph) = bed.write(&without_side);
    let plan = bed.plan(&config, &graph).await;
    let text = render::render(&plan);
    assert_eq!(changes(&plan), Vec::new(), "{text}");
    assert!(
        text.contains("# container.side will no longer be managed: it stays as it runs on node.n1"),
        "{text}"
    );
    bed.apply(&config, &graph, &plan).await;
    assert!(!bed.state().resources.contains_key("container.side"));
    assert_eq!(bed.running().await, before, "the container was touched");
    assert_eq!(bed.creates_and_removes(), touched);

    // Later plans, with the `removed` block gone too, leave it alone: it carries sparkform's
    // labels for an address the state forgot, not one it lost.
    let only_module = root("qwen", "").replace(
        "container \"side\" {\n  node    = node.n1\n  name    = \"side\"\n  image   = \"engine:1\"\n  command = [\"sleep\"]\n}\n",
        "",
    );
    let (config, graph) = bed.write(&only_module);
    let later = bed.plan(&config, &graph).await;
    assert!(!later.has_changes(), "{}", render::render(&later));

    // Without the `removed` block (deleted with the resource), the same container is a
    // destroy: what the block prevents.
    let bed2 = Bed::new();
    let (config, graph) = bed2.write(&root("qwen", ""));
    let first = bed2.plan(&config, &graph).await;
    bed2.apply(&config, &graph, &first).await;
    let (config, graph) = bed2.write(&only_module);
    let plan = bed2.plan(&config, &graph).await;
    assert!(
        changes(&plan).contains(&("container.side".into(), Action::Delete)),
        "{}",
        render::render(&plan)
    );
}

#[tokio::test]
async fn a_move_onto_a_recorded_address_is_refused_at_plan_naming_both() {
    let bed = Bed::new();
    let (config, graph) = bed.write(&root("qwen", ""));
    let first = bed.plan(&config, &graph).await;
    bed.apply(&config, &graph, &first).await;
    // `side` moved onto the module's container, which the state records.
    let hcl = root("qwen", "").replace("container \"side\"", "container \"side2\"")
        + "moved {\n  from = container.side\n  to   = module.qwen.container.engine\n}\n";
    std::fs::write(bed.dir.path().join("main.hcl"), hcl).unwrap();
    let config = sparkform::config::load(bed.dir.path(), &VarInputs::default())
        .unwrap_or_else(|d| panic!("{}", sparkform::diag::render_plain(&d.0)));
    let graph = Graph::build(&config).unwrap();
    let err = plan::plan(&config, &graph, &bed.state(), &PlanOptions::default()).unwrap_err();
    assert_eq!(err.code, "plan::moved_onto_recorded");
    assert!(
        err.message
            .contains("moves container.side to module.qwen.container.engine, but the state already records module.qwen.container.engine"),
        "{}",
        err.message
    );
}

fn validate_errors(dir: &Path, hcl: &str) -> String {
    std::fs::write(dir.join("main.hcl"), hcl).unwrap();
    match sparkform::config::load(dir, &VarInputs::default()) {
        Ok(_) => panic!("validated:\n{hcl}"),
        Err(d) => sparkform::diag::render_plain(&d.0),
    }
}

#[test]
fn the_blocks_mistakes_are_refused_at_validate_with_file_line_and_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("engine")).unwrap();
    std::fs::write(dir.join("engine/main.hcl"), MODULE).unwrap();
    let cases = [
        (
            "moved {\n  from = module.qwen\n  to   = module.qwen\n}\n",
            "moves module.qwen to itself",
        ),
        (
            "moved {\n  from = module.qwen\n  to   = module.other\n}\n",
            "`moved` from module.qwen, which the definitions still declare",
        ),
        (
            "moved {\n  from = module.a\n  to   = module.b\n}\nmoved {\n  from = module.b\n  to   = module.a\n}\n",
            "these `moved` blocks go round in a loop: module.a → module.b → module.a",
        ),
        (
            "moved {\n  from = module.a\n  to   = module.c\n}\nmoved {\n  from = module.b\n  to   = module.c\n}\n",
            "two `moved` blocks move to module.c",
        ),
        (
            "removed {\n  from = container.side\n  lifecycle {\n    destroy = false\n  }\n}\n",
            "`removed` names container.side, which the definitions still declare",
        ),
        (
            "moved {\n  from = \"module.a\"\n  to   = module.b\n}\n",
            "`from` is not a resource address: it is quoted",
        ),
    ];
    for (extra, want) in cases {
        let text = validate_errors(dir, &root("qwen", extra));
        assert!(text.contains(want), "want {want:?} in:\n{text}");
        assert!(text.contains("main.hcl:"), "no file and line:\n{text}");
        assert!(text.contains("help"), "no fix:\n{text}");
    }
    // In a module: refused, naming the root module.
    std::fs::write(
        dir.join("engine/main.hcl"),
        format!("{MODULE}\nmoved {{\n  from = container.a\n  to   = container.engine\n}}\n"),
    )
    .unwrap();
    let text = validate_errors(dir, &root("qwen", ""));
    assert!(
        text.contains("`moved` blocks belong in the root module"),
        "{text}"
    );
}

#[test]
fn state_mv_and_rm_re_address_and_forget_records_holding_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), "").unwrap();
    let ws = sparkform::workspace::Workspace::new(dir.path(), None);
    let mut state = State::new();
    let rec = |deps: Vec<String>| sparkform::state::ResourceState {
        kind: sparkform::vocabulary::KindId::Container,
        node: Some("node.n1".into()),
        config_hash: "sha256:0".into(),
        config: serde_json::json!({}).into(),
        attributes: Default::default(),
        depends_on: deps,
        last_apply_secs: None,
        schema_version: 1,
    };
    state
        .resources
        .insert("module.qwen.container.rank[\"a\"]".into(), rec(vec![]));
    state.resources.insert(
        "module.qwen.container.rank[\"b\"]".into(),
        rec(vec!["module.qwen.container.rank[\"a\"]".into()]),
    );
    state.resources.insert("container.side".into(), rec(vec![]));
    ws.store().write(&mut state).unwrap();

    let moves = sparkform::ops::state::move_records(&ws, "module.qwen", "module.qwen35").unwrap();
    assert_eq!(moves.len(), 2, "{moves:?}");
    let now = ws.store().load().unwrap().unwrap();
    assert_eq!(
        now.resources["module.qwen35.container.rank[\"b\"]"].depends_on,
        vec!["module.qwen35.container.rank[\"a\"]".to_string()],
        "what depends on a moved record follows it"
    );
    assert!(now.serial > state.serial);
    // Onto a recorded address, or from nothing: refused, the state untouched.
    let err = sparkform::ops::state::move_records(
        &ws,
        "container.side",
        "module.qwen35.container.rank[\"a\"]",
    )
    .err()
    .map(|e| format!("{e:?}"))
    .unwrap_or_default();
    assert!(err.contains("already records"), "{err}");
    let err = sparkform::ops::state::move_records(&ws, "container.sid", "container.x")
        .err()
        .map(|e| format!("{e:?}"))
        .unwrap_or_default();
    assert!(err.contains("did you mean container.side"), "{err}");

    let gone = sparkform::ops::state::forget(&ws, &["container.side".to_string()]).unwrap();
    assert_eq!(gone, vec!["container.side".to_string()]);
    let now = ws.store().load().unwrap().unwrap();
    assert!(!now.resources.contains_key("container.side"));
    assert_eq!(now.forgotten.len(), 1);
    assert_eq!(now.forgotten[0].address, "container.side");
    // Held lock: refused.
    let _held = ws.store().lock("test").unwrap();
    let err = sparkform::ops::state::forget(&ws, &["module.qwen35".to_string()])
        .err()
        .map(|e| format!("{e:?}"))
        .unwrap_or_default();
    assert!(err.to_lowercase().contains("lock"), "{err}");
}

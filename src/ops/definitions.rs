//! The definitions as the commands use them, in one place. [`load`] evaluates them as written
//! (the first evaluation: a command shows its warnings before anything connects); then the
//! values they leave to the world are filled by evaluating them again with what every kind's
//! plan-time read (`Machine::read`) says, as a [`ReadMode`] asks: `ops::prepare` looks on its
//! pool (a model's revision on its download node, beside the node facts: `plan`, `apply DIR`;
//! the state's record with `-refresh=false`), [`Evaluated::pin`] never connects (the state's
//! record, or what a saved plan was made with, its node facts too). No kind is named here.

use std::collections::BTreeMap;

use futures_util::FutureExt;

use crate::config::{Config, Readings, VarInputs};
use crate::diag::Diag;
use crate::graph::Graph;
use crate::hosts::HostPool;
use crate::kinds::machine::{machine, ReadCx, ReadError, ReadMode};
use crate::plan::planfile::PlanFile;
use crate::state::State;
use crate::vocabulary::KindId;
use crate::workspace::Workspace;

use super::OpError;
use crate::diag::Diagnostics;
use crate::lock_file::LockFile;

/// The definitions evaluated as written: a model's commit only where its revision is one, the
/// node facts as declared. A command evaluates them once; what runs long (`watch`) pins a
/// copy again when the state changes.
#[derive(Clone)]
pub struct Evaluated {
    config: Config,
    graph: Graph,
    /// `sparkform.lock.hcl` beside them, when there is one.
    lock: Option<LockFile>,
    /// `-upgrade`: the plan-time reads ignore the lock.
    upgrade: bool,
}

/// What the definitions are evaluated with when nothing is asked of the machines.
pub enum Pins<'a> {
    /// Nothing: as written (commands that use the nodes, addresses and ports, which no read
    /// value changes: validate, graph, nodes, status, logs, tunnel, destroy).
    Unresolved,
    /// What the state records, where the definitions still ask for it (a model's commit for an
    /// unchanged revision); the rest stays unread, never an error (commands about what is
    /// deployed: verify, import).
    Recorded(Option<&'a State>),
    /// What a saved plan was made with: what its changes carry and the node facts it records
    /// (`apply PLANFILE`); never read again.
    Planned(&'a PlanFile),
}

/// The definitions a command works with.
pub struct Definitions {
    pub config: Config,
    pub graph: Graph,
    /// Warnings of the evaluation with the filled values that the first did not have (the
    /// command showed the first's).
    pub warnings: Vec<Diag>,
}

/// The definitions of `ws` evaluated as written, and their graph; every error at once.
pub fn load(ws: &Workspace, vars: &VarInputs) -> Result<Evaluated, OpError> {
    let (config, graph) = ws.load(vars).map_err(OpError::Config)?;
    // What the debug log writes from here on is scrubbed of the definitions' secrets.
    crate::log::hide(&config.secrets);
    let lock = LockFile::load(&config.dir).map_err(|d| OpError::Config(Diagnostics(vec![*d])))?;
    Ok(Evaluated {
        config,
        graph,
        lock,
        upgrade: false,
    })
}

/// The nodes the kinds' plan-time reads work on, each once.
pub fn read_nodes(config: &Config) -> Vec<String> {
    let mut nodes: Vec<String> = KindId::ALL
        .iter()
        .flat_map(|&k| machine(k).read_nodes(config))
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// Every kind's plan-time read, merged: a definitions error stops at once, nodes that could
/// not be reached are reported together.
pub async fn read(cx: &ReadCx<'_>) -> Result<Readings, OpError> {
    let mut all = Readings::default();
    let mut unreachable = Vec::new();
    for &kind in KindId::ALL {
        match machine(kind).read(cx).await {
            Ok(seen) => all.extend(seen),
            Err(ReadError::Config(d)) => return Err(OpError::Config(d)),
            Err(ReadError::Hosts(e)) => unreachable.extend(e),
        }
    }
    if !unreachable.is_empty() {
        return Err(OpError::Refresh(unreachable));
    }
    Ok(all)
}

/// Every kind's read of `config` as `mode` looks, on `pool` (tests hand it fake nodes).
pub async fn read_on(
    evaluated: &Evaluated,
    pool: &HostPool,
    mode: ReadMode,
    state: Option<&State>,
) -> Result<Readings, OpError> {
    read(&ReadCx {
        config: &evaluated.config,
        mode,
        pool,
        state,
        plan: None,
        complete: true,
        lock: evaluated.lock.as_ref(),
        upgrade: evaluated.upgrade,
    })
    .await
}

/// A read that does not look: it never waits on anything, so it is polled once, here.
fn read_without_looking(cx: &ReadCx<'_>) -> Result<Readings, OpError> {
    read(cx).now_or_never().unwrap_or_else(|| {
        Err(OpError::Local(
            "a plan-time read waited on something without looking at the machines".into(),
        ))
    })
}

impl Evaluated {
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The lock file read beside the definitions.
    pub fn lock(&self) -> Option<&LockFile> {
        self.lock.as_ref()
    }

    /// Whether this reads again what the lock pins (`-upgrade`).
    pub fn upgrade(&self) -> bool {
        self.upgrade
    }

    /// `-upgrade`: read again what the lock pins.
    pub fn upgrading(mut self, upgrade: bool) -> Self {
        self.upgrade = upgrade;
        self
    }

    /// The first evaluation's warnings.
    pub fn warnings(&self) -> &[Diag] {
        &self.config.warnings
    }

    /// As written, when nothing fills a value.
    fn unchanged(self) -> Definitions {
        Definitions {
            config: self.config,
            graph: self.graph,
            warnings: Vec::new(),
        }
    }

    /// Evaluated again with `readings` (kept as written when it is empty).
    pub(super) fn again(self, readings: &Readings) -> Result<Definitions, OpError> {
        if readings.is_empty() {
            return Ok(self.unchanged());
        }
        let config =
            crate::config::load_with_readings(&self.config.dir, &self.config.vars, readings)
                .map_err(OpError::Config)?;
        let graph = Graph::build(&config)?;
        let warnings = new_warnings(&self.config, &config);
        Ok(Definitions {
            config,
            graph,
            warnings,
        })
    }

    /// Filled without connecting to anything.
    pub fn pin(self, pins: Pins<'_>) -> Result<Definitions, OpError> {
        match self.readings(pins)? {
            None => Ok(self.unchanged()),
            Some(readings) => self.again(&readings),
        }
    }

    /// What `pins` fill the definitions with, read without connecting to anything; `None`:
    /// nothing (`Pins::Unresolved`).
    pub fn readings(&self, pins: Pins<'_>) -> Result<Option<Readings>, OpError> {
        let empty = HostPool::from_hosts(BTreeMap::new());
        let cx = |mode, state, plan| ReadCx {
            config: &self.config,
            mode,
            pool: &empty,
            state,
            plan,
            complete: false,
            lock: self.lock.as_ref(),
            upgrade: false,
        };
        Ok(Some(match pins {
            Pins::Unresolved => return Ok(None),
            Pins::Recorded(state) => read_without_looking(&cx(ReadMode::Recorded, state, None))?,
            Pins::Planned(file) => {
                let mut readings = file.readings();
                if !facts_matter(&self.config, &readings) {
                    readings.nodes.clear();
                }
                readings.extend(read_without_looking(&cx(
                    ReadMode::Planned,
                    None,
                    Some(&file.plan),
                ))?);
                readings
            }
        }))
    }
}

/// The warnings of the evaluation `again` that the first, `first`, did not have (the caller
/// showed those).
pub(super) fn new_warnings(first: &Config, again: &Config) -> Vec<Diag> {
    let shown = &first.warnings;
    again
        .warnings
        .iter()
        .filter(|w| !shown.iter().any(|s| s.message == w.message))
        .cloned()
        .collect()
}

/// Whether the node facts of `readings` fill a value `config` leaves unset or contradict one
/// it sets.
pub(super) fn facts_matter(config: &Config, readings: &Readings) -> bool {
    config.nodes.values().any(|n| {
        readings.nodes.get(&n.name).is_some_and(|seen| {
            let declared = n.declared_facts();
            seen.fill(&declared, n.gpu_devices) != declared
                || !seen.disagreements(&declared, n.gpu_devices).is_empty()
        })
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{ModelReadings, NodeReadings};
    use crate::fake::{Answer, FakeHost, FakeWorld};
    use crate::fake_docker::{FakeDocker, Fault};
    use crate::hosts::{Host, HostOptions};
    use crate::kind::Registered;

    const COMMIT_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    /// A model on two nodes whose hub is on an address nothing answers; node `b` leaves its
    /// memory to the machines.
    const DEFINITIONS: &str = r#"
node "a" {
  address        = "10.0.0.1"
  memory_gib     = 128
  unified_memory = true
  gpus           = 1
}
node "b" {
  address        = "10.0.0.2"
  unified_memory = true
  gpus           = 1
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

model "m" {
  repo     = "org/name"
  revision = "main"
  nodes    = [node.a, node.b]
  cache    = "/data/hf"
  network  = network.roce
  endpoint = "http://10.255.255.1:9"
  image    = "img:1"
}
output "path" {
  value = model.m.path
}
"#;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), DEFINITIONS).unwrap();
        let ws = Workspace::new(dir.path(), None);
        (dir, ws)
    }

    fn commits(config: &Config) -> Vec<Option<String>> {
        config
            .resources
            .iter()
            .filter(|r| r.config.get("block").is_some())
            .map(|r| {
                r.config
                    .get("commit")
                    .and_then(|c| c.as_str())
                    .map(str::to_string)
            })
            .collect()
    }

    /// A plan file made with `main` resolved to COMMIT_A and node `b`'s memory read as 96 GiB.
    fn plan_file(ws: &Workspace) -> PlanFile {
        let mut readings = Readings::default();
        readings.models.insert(
            "model.m".into(),
            ModelReadings {
                revision: "main".into(),
                commit: COMMIT_A.into(),
                manifest: serde_json::json!({"total_bytes": 3000, "files": [{"path": "a"}]}),
                config: serde_json::json!({"architectures": ["Qwen3ForCausalLM"]}),
            },
        );
        readings.nodes.insert(
            "b".into(),
            NodeReadings {
                memory_gib: Some(96.0),
                ..NodeReadings::default()
            },
        );
        let config =
            crate::config::load_with_readings(&ws.dir, &VarInputs::default(), &readings).unwrap();
        let graph = Graph::build(&config).unwrap();
        let plan = crate::plan::plan(
            &config,
            &graph,
            &State::new(),
            &crate::plan::PlanOptions::default(),
        )
        .unwrap();
        PlanFile::new(plan, &ws.dir, &ws.state_path, None).with_readings(&readings)
    }

    #[test]
    fn a_saved_plan_gives_its_commits_and_node_facts_without_asking_the_hub() {
        let (_dir, ws) = workspace();
        let file = plan_file(&ws);
        let first = load(&ws, &VarInputs::default()).unwrap();
        assert!(
            commits(first.config()).iter().all(Option::is_none),
            "as written, `main` is unresolved: {:?}",
            commits(first.config())
        );
        // Without the plan, these definitions need the hub (there is no state to pin them).
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let unpinned = rt.block_on(crate::ops::prepare::prepare(
            crate::ops::prepare::PrepareRequest {
                evaluated: load(&ws, &VarInputs::default()).unwrap(),
                recorded: None,
                refresh: ReadMode::Recorded,
                options: crate::plan::PlanOptions::default(),
                hosts: HostOptions::default(),
            },
            &tx,
        ));
        match unpinned {
            Err(OpError::Config(d)) => assert!(
                d.0[0]
                    .message
                    .contains("cannot be resolved without a refresh"),
                "{:?}",
                d.0[0].message
            ),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("`main` was resolved without the hub or a pin"),
        }
        let defs = first.pin(Pins::Planned(&file)).unwrap();
        assert_eq!(
            commits(&defs.config),
            vec![Some(COMMIT_A.to_string()); 2],
            "both copies at the plan's commit"
        );
        let path = defs.config.outputs.iter().find(|o| o.name == "path");
        assert!(
            path.is_some_and(|o| o.value.to_string().contains(COMMIT_A)),
            "{path:?}"
        );
        let b = defs.config.nodes.values().find(|n| n.name == "b").unwrap();
        assert_eq!(
            b.memory_gib,
            Some(96.0),
            "the node facts the plan was made with"
        );
        // What the plan shows is what the definitions evaluate to now: `prepare` accepts it.
        let graph = &defs.graph;
        let now = crate::plan::plan(
            &defs.config,
            graph,
            &State::new(),
            &crate::plan::PlanOptions::default(),
        )
        .unwrap();
        for c in file.plan.changes.iter().filter(|c| c.after_hash.is_some()) {
            assert_eq!(
                now.change(&c.address).and_then(|n| n.after_hash.as_ref()),
                c.after_hash.as_ref(),
                "{}",
                c.address
            );
        }
    }

    #[test]
    fn the_state_pins_what_is_deployed_and_a_changed_revision_stays_unresolved() {
        let (_dir, ws) = workspace();
        let file = plan_file(&ws);
        let mut state = State::new();
        for c in &file.plan.changes {
            let r = crate::state::ResourceState {
                kind: c.kind,
                node: None,
                config_hash: String::new(),
                config: c.after.clone().unwrap_or_default(),
                attributes: Default::default(),
                depends_on: Vec::new(),
                last_apply_secs: None,
                schema_version: c.kind.kind().recorded_version(),
            };
            state.resources.insert(c.address.clone(), r);
        }
        let defs = load(&ws, &VarInputs::default())
            .unwrap()
            .pin(Pins::Recorded(Some(&state)))
            .unwrap();
        assert_eq!(commits(&defs.config), vec![Some(COMMIT_A.to_string()); 2]);
        // Another revision in the definitions: nothing pins it, and that is no error.
        let text = DEFINITIONS.replace("revision = \"main\"", "revision = \"v2\"");
        std::fs::write(ws.dir.join("main.hcl"), text).unwrap();
        let defs = load(&ws, &VarInputs::default())
            .unwrap()
            .pin(Pins::Recorded(Some(&state)))
            .unwrap();
        assert_eq!(commits(&defs.config), vec![None, None]);
    }

    /// A folder declaring one toy on node `a`, and the fake world its node lives in.
    fn toy_workspace() -> (tempfile::TempDir, Workspace, Arc<FakeWorld>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("main.hcl"),
            "node \"a\" {\n  address = \"10.0.0.1\"\n}\ntoy \"t\" {\n  node = node.a\n}\n",
        )
        .unwrap();
        let ws = Workspace::new(dir.path(), None);
        (dir, ws, FakeWorld::new())
    }

    /// The toy kind (`kinds/toy/`, registered for these tests only): its folder and its line in
    /// `for_each_kind!` are all it takes for its plan-time read to run and its value to reach
    /// the plan; nothing here or in `ops` names it.
    #[tokio::test]
    async fn a_kind_with_a_read_phase_is_read_and_planned_through_the_seam_alone() {
        let (_dir, ws, world) = toy_workspace();
        let a = FakeHost::new("node.a", &world);
        a.on(
            &["cat", "/etc/toy-greeting"],
            Answer::Exit(0, "hello from a\n".into(), String::new()),
        );
        let hosts = HostOptions {
            opener: crate::fake::FakeNodes::new(crate::fake::hosts(vec![a])).opener(),
            ..HostOptions::default()
        };
        let first = load(&ws, &VarInputs::default()).unwrap();
        assert_eq!(read_nodes(first.config()), ["node.a"]);
        let greeting = |config: &Config, graph: &Graph| {
            let plan = crate::plan::plan(
                config,
                graph,
                &State::new(),
                &crate::plan::PlanOptions::default(),
            )
            .unwrap();
            let change = plan.change("toy.t").expect("the toy is planned");
            assert_eq!(change.action, crate::plan::Action::Create);
            change.after.as_ref().map(|a| a["greeting"].clone())
        };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = crate::ops::prepare::prepare(
            crate::ops::prepare::PrepareRequest {
                evaluated: first,
                recorded: None,
                refresh: ReadMode::Normal,
                options: crate::plan::PlanOptions::default(),
                hosts,
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            greeting(&prepared.config, &prepared.graph),
            Some(serde_json::json!("hello from a")),
            "read on the node at plan time, evaluated again with it"
        );
        assert!(
            world
                .log()
                .iter()
                .any(|l| l.contains("cat /etc/toy-greeting")),
            "{:?}",
            world.log()
        );
        // Without looking nothing is read, and nothing is an error.
        let first = load(&ws, &VarInputs::default()).unwrap();
        let defs = first.pin(Pins::Recorded(None)).unwrap();
        assert_eq!(
            greeting(&defs.config, &defs.graph),
            Some(serde_json::Value::Null)
        );
    }

    /// The toy kind end to end on a fake node, through the same operations the commands call:
    /// its read phase, an apply that records its typed facts, status from its `look`, logs
    /// from its `read_log`; and nothing outside its folder names it.
    #[tokio::test]
    async fn a_kind_is_applied_looked_at_and_its_log_read_through_the_seam_alone() {
        let (_dir, ws, world) = toy_workspace();
        let a = Arc::new(FakeHost::new("node.a", &world));
        let says = |text: &str| {
            a.on(
                &["cat", "/etc/toy-greeting"],
                Answer::Exit(0, format!("{text}\n"), String::new()),
            )
        };
        says("hello");
        a.on(
            &["cat", "/var/log/toy.log"],
            Answer::Exit(0, "line one\nline two\n".into(), String::new()),
        );
        let hosts = || HostOptions {
            opener: crate::fake::FakeNodes::new(
                [("node.a".to_string(), a.clone() as Arc<dyn Host>)].into(),
            )
            .opener(),
            ..HostOptions::default()
        };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let locked = crate::ops::apply::lock_and_plan(
            crate::ops::apply::PlanRequest {
                evaluated: load(&ws, &VarInputs::default()).unwrap(),
                lockfile_readonly: false,
                store: ws.store(),
                source: crate::ops::apply::PlanSource::Definitions {
                    refresh: ReadMode::Normal,
                    options: crate::plan::PlanOptions::default(),
                },
                hosts: hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        let outcome = locked
            .apply(
                crate::ops::apply::RunOptions {
                    parallelism: 2,
                    rollback: true,
                    hosts: hosts(),
                },
                tx.clone(),
                tokio_util::sync::CancellationToken::new(),
            )
            .await;
        assert!(outcome.ok, "{:?}", outcome.failures);
        let state = ws.state().unwrap().unwrap();
        let record = &state.resources["toy.t"];
        assert_eq!(record.schema_version, 2);
        let facts: crate::kinds::toy::Recorded = crate::kind::facts_of(&record.attributes).unwrap();
        assert_eq!(facts.said.as_deref(), Some("hello"));

        let config = load(&ws, &VarInputs::default())
            .unwrap()
            .pin(Pins::Recorded(Some(&state)))
            .unwrap()
            .config;
        let seen = |status: &crate::ops::status::Status| {
            status
                .resources
                .iter()
                .find(|r| r.address == "toy.t")
                .map(|r| r.observed.clone())
        };
        let status = crate::ops::status::status(&config, &state, &hosts()).await;
        assert_eq!(seen(&status), Some(crate::ops::status::Seen::InSync));
        says("bonjour");
        let status = crate::ops::status::status(&config, &state, &hosts()).await;
        assert!(
            matches!(seen(&status), Some(crate::ops::status::Seen::Drifted { notes }) if notes[0].contains("bonjour")),
            "{status:?}"
        );

        let targets = crate::ops::logs::select(&config, &[]).unwrap();
        assert_eq!(targets.len(), 1, "{targets:?}");
        let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let req = crate::ops::logs::LogsRequest {
            addresses: Vec::new(),
            follow: false,
            since_secs: None,
            tail: None,
        };
        crate::ops::logs::logs(
            &config,
            Some(state.lineage.clone()),
            targets,
            &req,
            &hosts(),
            events,
            tokio_util::sync::CancellationToken::new(),
        )
        .await;
        let mut lines = Vec::new();
        while let Ok(e) = rx.try_recv() {
            if let crate::ops::logs::LogEvent::Line(l) = e {
                lines.push(format!("{} {}", l.address, l.text));
            }
        }
        assert_eq!(lines, ["toy.t line one", "toy.t line two"]);
    }

    #[tokio::test]
    async fn an_unreachable_hub_names_the_model_block_and_says_what_to_check() {
        let (_dir, ws) = workspace();
        let first = load(&ws, &VarInputs::default()).unwrap();
        let docker = Arc::new(FakeDocker::start().unwrap());
        // transfer.py's last line when the hub does not answer (exit 4).
        docker.fault(
            "sparkform-model.m-a-resolve",
            Fault::ExitsAfterStart(
                4,
                vec![r#"{"event": "error", "code": 4, "message": "repository org/name revision main: the hub at 10.255.255.1:9 cannot be reached: [Errno 111] Connection refused (the model block's `endpoint` sets where it is; without it, the image's HF_ENDPOINT or the public hub)"}"#.into()],
            ),
        );
        let world = FakeWorld::new();
        let a: Arc<dyn Host> =
            Arc::new(FakeHost::new("node.a", &world).docker_engine(docker.clone()));
        let pool = HostPool::from_hosts([("node.a".to_string(), a)].into_iter().collect());
        let err = read_on(&first, &pool, ReadMode::Normal, None).await;
        let Err(OpError::Config(d)) = err else {
            panic!("resolved without a hub: {:?}", err.map(|o| o.models));
        };
        let text = crate::diag::render_plain(&d.0);
        assert!(
            d.0[0].message.starts_with("model.m: node.a: resolving org/name at \"main\" failed: repository org/name revision main: the hub at 10.255.255.1:9 cannot be reached"),
            "{text}"
        );
        let line = DEFINITIONS
            .lines()
            .position(|l| l.starts_with("model \"m\""))
            .unwrap()
            + 1;
        assert!(text.contains(&format!("main.hcl:{line}:")), "{text}");
        assert!(text.contains("check the endpoint, the token"), "{text}");
        assert!(
            docker.containers().is_empty(),
            "the one-shot container is removed: {:?}",
            docker.containers()
        );
    }
}

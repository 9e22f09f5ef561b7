//! Known-good generations (`state::generations`, `sparkform history`): an apply whose steps and
//! probes all pass records one, with every resource as the state recorded it; an apply that
//! fails and is rolled back records none; `history` lists them newest first, each with what
//! changed from the one before and which one runs now. On fake nodes with fake Docker Engines,
//! the serving fixture (a network, a head, a worker, a probe in the head).

use std::path::Path;
use std::sync::Arc;

use sparkform::apply::ApplyOutcome;
use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::kinds::machine::ReadMode;
use sparkform::ops::apply::{lock_and_plan, PlanRequest, PlanSource, RunOptions};
use sparkform::ops::history::entries;
use sparkform::ops::OpError;
use sparkform::plan::{Action, Plan, PlanOptions};
use sparkform::state::{State, StateStore};
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{node_with_engine, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

/// The serving fixture with the worker's image `image`, in `dir`.
pub(crate) fn write(dir: &Path, image: &str) {
    let hcl = include_str!("../fixtures/serving/main.hcl")
        .replace("PROBE_TIMEOUT", "3s")
        .replace(
            "container \"worker\" {\n  node       = node.n2\n  image      = \"ray:1\"",
            &format!("container \"worker\" {{\n  node       = node.n2\n  image      = \"{image}\""),
        );
    assert!(hcl.contains(image), "the fixture's worker moved");
    std::fs::write(dir.join("main.hcl"), hcl).unwrap();
}

pub(crate) struct Deployment {
    pub(crate) dir: tempfile::TempDir,
    hosts: Vec<(String, Arc<dyn Host>)>,
    pub(crate) head: Arc<FakeDocker>,
    pub(crate) worker: Arc<FakeDocker>,
}

impl Deployment {
    pub(crate) fn new() -> Deployment {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ray:1");
        let world = FakeWorld::new();
        let (n1, head) = node_with_engine("node.n1", &world).unwrap();
        let (n2, worker) = node_with_engine("node.n2", &world).unwrap();
        let hosts = vec![n1, n2];
        Deployment {
            dir,
            hosts,
            head,
            worker,
        }
    }

    pub(crate) fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    pub(crate) fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    pub(crate) fn hosts(&self) -> HostOptions {
        HostOptions {
            opener: FakeNodes::new(self.hosts.iter().cloned().collect()).opener(),
            ..HostOptions::default()
        }
    }

    /// `sparkform rollback DIR [N] -auto-approve`: the plan, and the apply's outcome.
    pub(crate) async fn rollback(
        &self,
        number: Option<u64>,
    ) -> Result<(Plan, ApplyOutcome), OpError> {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )?;
        self.run(PlanSource::Generation { number }, evaluated).await
    }

    /// `sparkform plan DIR -refresh=false`'s notes.
    pub(crate) async fn plan_notes(&self) -> Vec<String> {
        self.plan_recorded().await.notes
    }

    /// `sparkform plan DIR -refresh=false`: the plan against the state on disk.
    pub(crate) async fn plan_recorded(&self) -> Plan {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap();
        let state = self.state();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = sparkform::ops::prepare::prepare(
            sparkform::ops::prepare::PrepareRequest {
                evaluated,
                recorded: Some(&state),
                refresh: ReadMode::Recorded,
                options: PlanOptions::default(),
                hosts: self.hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        prepared.plan
    }

    /// `sparkform apply DIR -auto-approve`, on the fake nodes.
    pub(crate) async fn apply(&self) -> ApplyOutcome {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        self.run(
            PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions::default(),
            },
            evaluated,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"))
        .1
    }

    /// Plan from `source` as `apply` does, and apply the plan.
    pub(crate) async fn run(
        &self,
        source: PlanSource<'_>,
        evaluated: sparkform::ops::definitions::Evaluated,
    ) -> Result<(Plan, ApplyOutcome), OpError> {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = lock_and_plan(
            PlanRequest {
                evaluated,
                lockfile_readonly: false,
                store: self.store(),
                source,
                hosts: self.hosts(),
            },
            &tx,
        )
        .await?;
        let plan = prepared.plan.clone();
        let outcome = prepared
            .apply(
                RunOptions {
                    parallelism: 4,
                    rollback: true,
                    hosts: self.hosts(),
                },
                tx,
                tokio_util::sync::CancellationToken::new(),
            )
            .await;
        Ok((plan, outcome))
    }
}

/// The worker moved to ray:3 while the head's probe fails: the apply fails and rolls back.
async fn apply_ray3_with_a_failing_probe(d: &Deployment) {
    d.head.fault(
        "head",
        Fault::ExecExits("curl".into(), 7, "curl: (7) Failed to connect".into()),
    );
    write(d.dir.path(), "ray:3");
    let failed = d.apply().await;
    assert!(!failed.ok && failed.rolled_back, "{failed:?}");
}

#[tokio::test]
async fn a_passing_apply_records_a_generation_and_a_failed_one_none() {
    let d = Deployment::new();
    let first = d.apply().await;
    assert!(first.ok, "{:?}", first.failures);
    let state = d.state();
    assert_eq!(state.generations.len(), 1);
    let g1 = &state.generations[0];
    assert_eq!(g1.number, 1);
    assert_eq!(g1.resources, state.resources, "every resource as recorded");
    assert!(
        g1.applied.iter().any(|a| a == "probe.serving")
            && g1.applied.iter().any(|a| a == "container.worker"),
        "{:?}",
        g1.applied
    );
    assert!(g1.definitions.starts_with("sha256:"), "{}", g1.definitions);
    assert!(
        g1.by.contains('@') && g1.at.ends_with('Z'),
        "{} {}",
        g1.by,
        g1.at
    );

    // Nothing to do: no apply runs a step, so no generation.
    let again = d.apply().await;
    assert!(again.ok, "{:?}", again.failures);
    assert_eq!(d.state().generations.len(), 1, "a no-op made a generation");

    // Another image for the worker: generation 2, naming what changed.
    write(d.dir.path(), "ray:2");
    let second = d.apply().await;
    assert!(second.ok, "{:?}", second.failures);
    let state = d.state();
    assert_eq!(
        state
            .generations
            .iter()
            .map(|g| g.number)
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert_ne!(state.generations[1].definitions, g1.definitions);

    // A third image whose probe fails: rolled back, and no generation 3.
    apply_ray3_with_a_failing_probe(&d).await;
    let state = d.state();
    assert_eq!(
        state.generations.len(),
        2,
        "a failed apply made a generation"
    );

    // history: newest first, what changed, and which one runs (the rollback put 2 back).
    let listed = entries(&state);
    let numbers: Vec<u64> = listed.iter().map(|e| e.number).collect();
    assert_eq!(numbers, [2, 1]);
    let lines: Vec<String> = listed[0].changes.iter().map(|c| c.line()).collect();
    assert_eq!(lines, ["~ container.worker (image)"], "{lines:?}");
    assert!(
        listed[1]
            .changes
            .iter()
            .any(|c| c.line() == "+ container.head"),
        "{:?}",
        listed[1].changes
    );
    assert_eq!(
        listed.iter().map(|e| e.current).collect::<Vec<_>>(),
        [true, false],
        "the state runs generation 2 after the rollback"
    );

    // The command prints the same, from the state beside the definitions.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args(["history"])
        .arg(d.dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let two = text.find("#2  ").expect("generation 2 listed");
    let one = text.find("#1  ").expect("generation 1 listed");
    assert!(two < one, "newest first: {text}");
    assert!(
        text[two..one].contains("(current)")
            && text[two..one].contains("~ container.worker (image)"),
        "{text}"
    );
}

#[test]
fn history_without_a_state_says_nothing_was_applied() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ray:1");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args(["history"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing has been applied, so there is no generation"),
        "{err}"
    );
}

/// The worker's image on its node's engine, as the running container was created.
fn worker_image(d: &Deployment) -> String {
    let running: Vec<_> = d
        .worker
        .containers()
        .into_iter()
        .filter(|c| c.running && c.labels.values().any(|v| v == "container.worker"))
        .collect();
    assert_eq!(running.len(), 1, "{running:?}");
    running[0].image.clone()
}

#[tokio::test]
async fn rollback_puts_the_generation_before_back_from_the_state_alone() {
    let d = Deployment::new();
    assert!(d.apply().await.ok);
    write(d.dir.path(), "ray:2");
    assert!(d.apply().await.ok);
    assert_eq!(worker_image(&d), "ray:2");
    // The definitions move on to ray:3; without N the rollback takes the generation before the
    // one running now (2): generation 1, ray:1, which the definitions no longer say anywhere.
    write(d.dir.path(), "ray:3");
    let (plan, outcome) = d.rollback(None).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("Rolling back to generation 1 ")),
        "{:?}",
        plan.notes
    );
    let worker = plan
        .change("container.worker")
        .expect("the worker is planned");
    assert_eq!(worker.action, Action::Replace);
    assert_eq!(
        plan.change("container.head").map(|c| c.action),
        Some(Action::NoOp),
        "what generation 1 ran as it runs now is left alone"
    );
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(worker_image(&d), "ray:1");
    let state = d.state();
    let last = state.generations.last().unwrap();
    assert_eq!((last.number, last.rollback_to), (3, Some(1)));
    assert_eq!(last.definitions, state.generations[0].definitions);
    let listed = entries(&state);
    assert!(listed[0].current);
    assert_eq!(
        listed[0]
            .changes
            .iter()
            .map(|c| c.line())
            .collect::<Vec<_>>(),
        ["~ container.worker (image)"]
    );
    // The definitions on disk (ray:3) are not what runs: the next plan says so.
    let notes = d.plan_notes().await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("a rollback to generation 1") && n.contains("not what it put back")),
        "{notes:?}"
    );
    // Definitions that say what runs (generation 1's image) plan no change, and no note.
    write(d.dir.path(), "ray:1");
    let notes = d.plan_notes().await;
    assert!(
        !notes.iter().any(|n| n.contains("a rollback to")),
        "{notes:?}"
    );
    // Named: generation 2 again.
    let (_, outcome) = d
        .rollback(Some(2))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(worker_image(&d), "ray:2");
}

/// A restart (what `watch --restart` runs: `-replace` of what runs) records a generation
/// identical to the one before it. `history` marks only the newest of the two current, and a
/// rollback without N skips the identical one: it puts back what ran before, not what runs.
#[tokio::test]
async fn a_restart_is_not_a_change_history_marks_one_current_and_rollback_goes_past_it() {
    let d = Deployment::new();
    assert!(d.apply().await.ok);
    write(d.dir.path(), "ray:2");
    assert!(d.apply().await.ok);
    let evaluated = sparkform::ops::definitions::load(
        &Workspace::new(d.dir.path(), None),
        &VarInputs::default(),
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let (plan, outcome) = d
        .run(
            PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions {
                    replace: vec!["container.worker".into()],
                    ..PlanOptions::default()
                },
            },
            evaluated,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        plan.change("container.worker").map(|c| c.action),
        Some(Action::Replace)
    );
    assert!(outcome.ok, "{:?}", outcome.failures);
    let state = d.state();
    assert_eq!(state.generations.len(), 3);
    let listed = entries(&state);
    assert_eq!(
        listed
            .iter()
            .map(|e| (e.number, e.current))
            .collect::<Vec<_>>(),
        [(3, true), (2, false), (1, false)],
        "one generation is current, the newest of those that run now"
    );
    assert!(listed[1].runs_now, "generation 2 is what runs too");
    let (plan, outcome) = d.rollback(None).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("Rolling back to generation 1 ")),
        "{:?}",
        plan.notes
    );
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(worker_image(&d), "ray:1");
}

#[tokio::test]
async fn rollback_refuses_a_generation_it_does_not_keep_and_a_state_without_any() {
    let d = Deployment::new();
    let Err(OpError::Config(diags)) = d.rollback(None).await else {
        panic!("a rollback without a state went ahead")
    };
    assert!(
        diags.0[0].message.contains("no generation to roll back to"),
        "{:?}",
        diags.0[0].message
    );
    assert!(d.apply().await.ok);
    let Err(OpError::Config(diags)) = d.rollback(None).await else {
        panic!("a rollback from the only generation went ahead")
    };
    assert!(
        diags.0[0].message.contains("there is none before it"),
        "{:?}",
        diags.0[0].message
    );
    let Err(OpError::Config(diags)) = d.rollback(Some(7)).await else {
        panic!("a rollback to generation 7 went ahead")
    };
    assert!(
        diags.0[0]
            .message
            .contains("keeps no generation 7 (it keeps 1)"),
        "{:?}",
        diags.0[0].message
    );
}

/// One container whose environment holds a sensitive variable.
fn with_key(key: &str, image: &str) -> String {
    format!(
        r#"
variable "key" {{
  type      = string
  sensitive = true
  default   = "{key}"
}}
node "n1" {{ address = "10.0.0.1" }}
container "app" {{
  node  = node.n1
  image = "{image}"
  env   = {{ API_KEY = var.key }}
}}
"#
    )
}

#[tokio::test]
async fn a_rollback_takes_sensitive_values_from_the_definitions_only_when_they_hash_as_recorded() {
    let d = Deployment::new();
    let vars = |key: &str, image: &str| {
        std::fs::write(d.dir.path().join("main.hcl"), with_key(key, image)).unwrap();
    };
    vars("k1", "app:1");
    assert!(d.apply().await.ok);
    vars("k1", "app:2");
    assert!(d.apply().await.ok);
    // The key changed since: the state has only generation 1's hash, so the rollback refuses.
    vars("k2", "app:2");
    let Err(OpError::Config(diags)) = d.rollback(Some(1)).await else {
        panic!("a rollback went ahead with a key generation 1 did not run with")
    };
    let text = sparkform::diag::render_plain(&diags.0);
    assert!(
        diags.0[0].message.contains("container.app: env.API_KEY"),
        "{text}"
    );
    assert!(!text.contains("k1") && !text.contains("k2"), "{text}");
    // The same key as then: generation 1 runs again, the key in its environment.
    vars("k1", "app:2");
    let (_, outcome) = d
        .rollback(Some(1))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(outcome.ok, "{:?}", outcome.failures);
    let app = d
        .head
        .containers()
        .into_iter()
        .find(|c| c.running && c.image == "app:1")
        .expect("generation 1's container runs");
    assert!(
        app.created["Env"]
            .as_array()
            .is_some_and(|e| e.iter().any(|v| v == "API_KEY=k1")),
        "{}",
        app.created["Env"]
    );
}

/// The image a generation ran, gone from its node (removed, or its tag moved on), is named in
/// the rollback's plan with the fix, before anything runs.
#[tokio::test]
async fn a_rollback_plan_names_an_image_the_node_no_longer_has() {
    let d = Deployment::new();
    assert!(d.apply().await.ok);
    write(d.dir.path(), "ray:2");
    assert!(d.apply().await.ok);
    // ray:1 removed from the worker's node since generation 1 ran it: its name and its ID.
    d.worker.image_error("ray:1", 404, "No such image: ray:1");
    d.worker
        .image_error("sha256:ray:1", 404, "No such image: sha256:ray:1");
    let (plan, _) = d
        .rollback(Some(1))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let named: Vec<&String> = plan
        .notes
        .iter()
        .filter(|n| n.contains("no longer has ray:1"))
        .collect();
    assert_eq!(named.len(), 1, "{:?}", plan.notes);
    assert!(
        named[0].starts_with("container.worker ran ray:1 (sha256:ray:1) in generation 1")
            && named[0].contains("and not sha256:ray:1 either")
            && named[0].contains("`image_archive`")
            && named[0].contains("`pull = true`"),
        "{named:?}"
    );
    // The head's image is still there: nothing said of it.
    assert!(
        !plan
            .notes
            .iter()
            .any(|n| n.starts_with("container.head ran")),
        "{:?}",
        plan.notes
    );
}

/// The tag generation 1 ran moved on (a pull, a `docker tag`) while the image it named is
/// still on the node: the plan says the rollback runs that image by its ID, and it does.
#[tokio::test]
async fn a_rollback_runs_the_image_by_its_recorded_id_where_the_tag_moved_on() {
    let d = Deployment::new();
    assert!(d.apply().await.ok);
    write(d.dir.path(), "ray:2");
    assert!(d.apply().await.ok);
    d.worker.image("ray:1", "sha256:rebuilt");
    let (plan, outcome) = d
        .rollback(Some(1))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let said: Vec<&String> = plan
        .notes
        .iter()
        .filter(|n| n.starts_with("container.worker ran ray:1 (sha256:ray:1) in generation 1"))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", plan.notes);
    assert!(
        said[0].contains("ray:1 on n2 now names sha256:rebuilt")
            && said[0].contains("the rollback runs sha256:ray:1 by its ID")
            && !said[0].contains("`pull = true`"),
        "{said:?}"
    );
    assert!(outcome.ok, "{:?}", outcome.failures);
    let from: Vec<String> = d
        .worker
        .created()
        .iter()
        .filter(|(_, body)| body.to_string().contains("container.worker"))
        .filter_map(|(_, body)| body["Image"].as_str().map(str::to_string))
        .collect();
    assert_eq!(from, ["ray:1", "ray:2", "sha256:ray:1"]);
    let state = d.state();
    assert_eq!(
        state.resources["container.worker"].attributes["image_id"],
        "sha256:ray:1"
    );
}

/// The engine carries configurations and records typed: each is decoded by its kind where it is
/// made (the lowering, a state's load, a plan's recorded form, a generation made whole, a step
/// that completed), so a plan, an apply, a failed apply's rollback and `sparkform rollback`
/// read no configuration's JSON and no record's facts late.
/// The runtime of `#[tokio::test]` runs every step on this thread, whose count this is.
#[tokio::test]
async fn a_plan_apply_and_rollback_decode_every_configuration_where_it_enters() {
    let d = Deployment::new();
    let before = sparkform::kind::late_decodes();
    assert!(d.apply().await.ok);
    write(d.dir.path(), "ray:2");
    assert!(d.apply().await.ok);
    let (_, outcome) = d
        .rollback(Some(1))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(worker_image(&d), "ray:1");
    apply_ray3_with_a_failing_probe(&d).await;
    assert_eq!(sparkform::kind::late_decodes() - before, 0, "late decodes");
    // The guard itself: a configuration that no kind decoded is read late, and counted.
    let untyped = sparkform::kind::Configuration::untyped(serde_json::json!({"name": "c"}));
    let read = untyped.typed::<sparkform::kinds::container::Desired>();
    assert!(read.is_ok_and(|d| d.name == "c"));
    assert_eq!(sparkform::kind::late_decodes() - before, 1);
    // And a record's facts that no kind decoded (the journal's marks alone are no facts).
    let mut facts = sparkform::kind::Attributes::default();
    facts.mark(sparkform::plan::MARK_PENDING, serde_json::json!("now"));
    assert!(facts
        .typed::<sparkform::kinds::container::Recorded>()
        .is_ok_and(|r| r.container_id.is_none()));
    assert_eq!(sparkform::kind::late_decodes() - before, 1);
    facts
        .edit()
        .insert("container_id".into(), serde_json::json!("abc"));
    let read = facts.typed::<sparkform::kinds::container::Recorded>();
    assert!(read.is_ok_and(|r| r.container_id.as_deref() == Some("abc")));
    assert_eq!(sparkform::kind::late_decodes() - before, 2);
}

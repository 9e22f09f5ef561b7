//! A container's `cache`: the node's folder for its image ID mounted at the path, recorded with
//! the container; the plan's read of it (warm or cold) and what a warm one takes off the
//! expected durations; a new image ID gets its own folder; `destroy` keeps the folder unless
//! `-purge-caches`, which removes it with a one-shot container.

use std::sync::Arc;

use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::ops::apply::{lock_and_plan, PlanRequest, PlanSource, RunOptions};
use sparkform::ops::ReadMode;
use sparkform::plan::{Action, Plan, PlanOptions};
use sparkform::state::StateStore;
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{Answer, FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

const DEFS: &str = r#"
node "n1" {
  address = "10.0.0.1"
}
container "engine" {
  node    = node.n1
  image   = "engine:1"
  command = ["serve"]
  cache = {
    host  = "/var/cache/jit"
    path  = "/root/.cache/jit"
    skips = ["compiling"]
  }
}
"#;

const OLD: &str = "sha256:aaaa000000000000000000000000000000000000000000000000000000000001";
const NEW: &str = "sha256:bbbb000000000000000000000000000000000000000000000000000000000002";

fn folder(id: &str) -> String {
    format!("/var/cache/jit/{}", id.trim_start_matches("sha256:"))
}

fn find(id: &str) -> Vec<String> {
    [
        "find",
        &folder(id),
        "-mindepth",
        "1",
        "-maxdepth",
        "1",
        "-print",
        "-quit",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

struct Bed {
    dir: tempfile::TempDir,
    host: Arc<FakeHost>,
    docker: Arc<FakeDocker>,
    fakes: FakeNodes,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), DEFS).unwrap();
        let docker = Arc::new(FakeDocker::start().unwrap());
        docker.image("engine:1", OLD);
        let world = FakeWorld::new();
        let host = Arc::new(FakeHost::new("node.n1", &world).docker_engine(docker.clone()));
        let fakes = FakeNodes::new(
            [("node.n1".to_string(), host.clone() as Arc<dyn Host>)]
                .into_iter()
                .collect(),
        );
        Bed {
            dir,
            host,
            docker,
            fakes,
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

    /// Whether the node's folder for `id` holds anything, as `find` answers.
    fn warm(&self, id: &str, warm: bool) {
        let args = find(id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.host.on(
            &args,
            if warm {
                Answer::Exit(0, format!("{}/vllm\n", folder(id)), String::new())
            } else {
                Answer::Exit(1, String::new(), "No such file or directory".into())
            },
        );
    }

    async fn prepared(&self, source: PlanSource<'_>) -> sparkform::ops::apply::LockedPlan {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        lock_and_plan(
            PlanRequest {
                evaluated,
                lockfile_readonly: false,
                store: self.store(),
                source,
                hosts: self.hosts(),
            },
            &tx,
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"))
    }

    async fn plan(&self, replace: &[&str]) -> Plan {
        let mut p = self
            .prepared(PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions {
                    replace: replace.iter().map(|s| s.to_string()).collect(),
                    ..PlanOptions::default()
                },
            })
            .await;
        p.drop_connections().await;
        p.plan.clone()
    }

    async fn run(&self, source: PlanSource<'_>) -> sparkform::apply::ApplyOutcome {
        let prepared = self.prepared(source).await;
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
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
        assert!(outcome.ok, "{:?}", outcome.failures);
        outcome
    }

    async fn apply(&self, replace: &[&str]) -> sparkform::apply::ApplyOutcome {
        self.run(PlanSource::Definitions {
            refresh: ReadMode::Normal,
            options: PlanOptions {
                replace: replace.iter().map(|s| s.to_string()).collect(),
                ..PlanOptions::default()
            },
        })
        .await
    }

    /// The binds of the last container created under `name`.
    fn binds(&self, name: &str) -> Vec<String> {
        let created = self.docker.created();
        let (_, body) = created
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} was never created: {created:?}"));
        body["HostConfig"]["Binds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b.as_str().map(String::from))
            .collect()
    }

    /// Record what the last apply took and what its phases took, as a real start records them.
    fn record_times(&self, total: f64, compiling: f64) {
        let store = self.store();
        let mut state = store.load().unwrap().unwrap();
        let r = state.resources.get_mut("container.engine").unwrap();
        r.last_apply_secs = Some(total);
        r.attributes.edit().insert(
            "phase_secs".into(),
            serde_json::json!({ "loading weights": 5.0, "compiling": compiling }),
        );
        store.write(&mut state).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_ids_folder_is_mounted_recorded_and_judged_warm_or_cold_by_the_plan() {
    let bed = Bed::new();
    bed.warm(OLD, false);
    let first = bed.plan(&[]).await;
    let impact = first.impact.clone().unwrap();
    assert_eq!(impact.caches.len(), 1, "{impact:?}");
    assert!(!impact.caches[0].warm);
    let text = sparkform::plan::render::render(&first);
    assert!(
        text.contains("Cache: container.engine on node.n1: cold: nothing for image sha256:aaaa00000000 yet, so compiling runs."),
        "{text}"
    );

    let outcome = bed.apply(&[]).await;
    assert!(
        bed.binds("engine")
            .contains(&format!("{}:/root/.cache/jit", folder(OLD))),
        "{:?}",
        bed.binds("engine")
    );
    let recorded = &outcome.state.resources["container.engine"];
    assert_eq!(recorded.attributes["cache_folder"], folder(OLD));

    // What the last start took, of which 30 s compiling: a warm folder leaves them out.
    bed.record_times(40.0, 30.0);
    bed.warm(OLD, true);
    let warm = bed.plan(&["container.engine"]).await;
    let impact = warm.impact.clone().unwrap();
    assert!(impact.caches[0].warm, "{impact:?}");
    assert_eq!(impact.stopped[0].expected_secs, Some(10.0), "{impact:?}");
    let text = sparkform::plan::render::render(&warm);
    assert!(
        text.contains("Cache: container.engine on node.n1: warm for image sha256:aaaa00000000: skips compiling (30.0 s the last apply, left out of the expected time until a warm start is recorded)."),
        "{text}"
    );
    // Cold, the same replacement is expected to take what the last start took.
    bed.warm(OLD, false);
    let cold = bed.plan(&["container.engine"]).await.impact.unwrap();
    assert!(!cold.caches[0].warm);
    assert_eq!(cold.stopped[0].expected_secs, Some(40.0), "{cold:?}");

    // The tag now names another build: a new container, in that image's own folder.
    bed.warm(OLD, true);
    bed.warm(NEW, false);
    bed.docker.image("engine:1", NEW);
    // As `-upgrade` takes the new build: the lock file pinned the old one.
    std::fs::remove_file(bed.dir.path().join("sparkform.lock.hcl")).unwrap();
    let moved = bed.plan(&[]).await;
    let c = moved
        .changes
        .iter()
        .find(|c| c.address == "container.engine")
        .unwrap();
    assert_eq!(c.action, Action::Replace, "{c:?}");
    let impact = moved.impact.unwrap();
    assert!(
        !impact.caches[0].warm,
        "another image never reads the old folder: {impact:?}"
    );
    assert_eq!(impact.caches[0].image_id.as_deref(), Some(NEW));
    let outcome = bed.apply(&[]).await;
    assert!(bed
        .binds("engine")
        .contains(&format!("{}:/root/.cache/jit", folder(NEW))));
    assert_eq!(
        outcome.state.resources["container.engine"].attributes["cache_folder"],
        folder(NEW)
    );
}

/// A CPU build of vLLM compiles again on a warm cache, only faster: once a warm start is
/// recorded, a warm replacement is expected to take what the cold start took less what the warm
/// one saved (not less the whole phase), a warm replacement after a warm start what that start
/// took, and a cold one after a warm start that much more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_warm_start_sets_the_expected_time_of_the_next_one() {
    let bed = Bed::new();
    // The start finds the folder cold, then warm: each is recorded as such.
    bed.warm(OLD, false);
    let outcome = bed.apply(&[]).await;
    let attributes = &outcome.state.resources["container.engine"].attributes;
    assert_eq!(attributes["cache_warm"], false, "{attributes:?}");
    bed.warm(OLD, true);
    let outcome = bed.apply(&["container.engine"]).await;
    let attributes = &outcome.state.resources["container.engine"].attributes;
    assert_eq!(attributes["cache_warm"], true, "{attributes:?}");
    assert!(
        attributes["phase_secs_by_cache"]["warm"].is_object()
            && attributes["phase_secs_by_cache"]["cold"].is_object(),
        "both starts kept: {attributes:?}"
    );

    // As a real start records them: cold 40 s (compiling 30 s), a warm start's compile 12 s.
    let record = |total: f64, last_warm: bool| {
        let store = bed.store();
        let mut state = store.load().unwrap().unwrap();
        let r = state.resources.get_mut("container.engine").unwrap();
        r.last_apply_secs = Some(total);
        let compiling = if last_warm { 12.0 } else { 30.0 };
        r.attributes.edit().insert(
            "phase_secs".into(),
            serde_json::json!({ "loading weights": 5.0, "compiling": compiling }),
        );
        r.attributes
            .edit()
            .insert("cache_warm".into(), serde_json::json!(last_warm));
        r.attributes.edit().insert(
            "phase_secs_by_cache".into(),
            serde_json::json!({
                "cold": { "loading weights": 5.0, "compiling": 30.0 },
                "warm": { "loading weights": 5.0, "compiling": 12.0 },
            }),
        );
        store.write(&mut state).unwrap();
    };
    let bed = &bed;
    let expected = |warm: bool| async move {
        bed.warm(OLD, warm);
        let plan = bed.plan(&["container.engine"]).await;
        let text = sparkform::plan::render::render(&plan);
        (plan.impact.unwrap().stopped[0].expected_secs, text)
    };

    record(40.0, false);
    let (secs, text) = expected(true).await;
    assert_eq!(
        secs,
        Some(22.0),
        "40 s less the 18 s a warm compile saves:\n{text}"
    );
    assert!(
        text.contains("warm for image sha256:aaaa00000000: compiling 30.0 s cold, 12.0 s warm (18.0 s less than the last apply)."),
        "{text}"
    );
    let (secs, _) = expected(false).await;
    assert_eq!(secs, Some(40.0));

    record(22.0, true);
    let (secs, text) = expected(true).await;
    assert_eq!(secs, Some(22.0), "the warm start's own time:\n{text}");
    assert!(
        text.contains("warm for image sha256:aaaa00000000, as the recorded start was: compiling (12.0 s warm, the last apply)."),
        "{text}"
    );
    let (secs, text) = expected(false).await;
    assert_eq!(
        secs,
        Some(40.0),
        "the warm start's time and the 18 s it saved:\n{text}"
    );
    assert!(
        text.contains("cold: nothing for image sha256:aaaa00000000 yet, so compiling runs (30.0 s cold, 12.0 s warm: 18.0 s more than the last apply)."),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_keeps_the_cache_folder_and_purge_caches_removes_it_with_a_one_shot_container() {
    let bed = Bed::new();
    bed.warm(OLD, false);
    bed.apply(&[]).await;
    let destroy = |purge_caches| PlanSource::Destroy {
        targets: Vec::new(),
        exclude: Vec::new(),
        refresh: ReadMode::Recorded,
        purge_caches,
    };

    let mut kept = bed.prepared(destroy(false)).await;
    kept.drop_connections().await;
    let notes = kept.plan.notes.join("\n");
    assert!(
        notes.contains(&format!(
            "Kept for a later apply of the same image (`destroy -purge-caches` removes them): container.engine: the cache folder {} on node.n1",
            folder(OLD)
        )),
        "{notes}"
    );
    assert!(kept.plan.changes.iter().all(|c| !c.purge));
    drop(kept);

    let purge_name = format!("sparkform-purge-{}", &OLD[7..19]);
    bed.docker
        .fault(&purge_name, Fault::ExitsAfterStart(0, Vec::new()));
    let planned = bed.prepared(destroy(true)).await;
    assert!(planned
        .plan
        .changes
        .iter()
        .any(|c| c.address == "container.engine" && c.purge));
    drop(planned);
    bed.run(destroy(true)).await;
    let created = bed.docker.created();
    let (_, body) = created
        .iter()
        .find(|(n, _)| *n == purge_name)
        .unwrap_or_else(|| panic!("no purge container: {created:?}"));
    assert_eq!(
        body["Cmd"],
        serde_json::json!([
            "-rf",
            "--",
            format!("/purge/{}", OLD.trim_start_matches("sha256:"))
        ])
    );
    assert_eq!(
        body["HostConfig"]["Binds"],
        serde_json::json!(["/var/cache/jit:/purge"])
    );
    assert!(
        bed.docker.container(&purge_name).is_none(),
        "the one-shot container is removed"
    );
}

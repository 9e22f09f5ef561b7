//! What a machine does wrong, seen by the container machine on a fake node with a fake Docker
//! Engine (no Docker, no ssh): a container that crash-loops under `restart = "always"` fails
//! its step at once with its log lines instead of waiting for the ready timeout; an image
//! inspect that fails with anything but a 404 is reported as the engine failing, not as a
//! missing image to `docker load`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::config::Config;
use sparkform::graph::Graph;
use sparkform::hosts::{HostOptions, HostPool};
use sparkform::plan::{self, PlanOptions};
use sparkform::state::{State, StateStore};
use sparkform_testkit::fake::{FakeHost, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};
use tokio_util::sync::CancellationToken;

/// One container that Docker restarts whenever it exits, with a ready timeout far longer
/// than any test may wait.
const ALWAYS: &str = r#"
node "n1" { address = "10.0.0.1" }

container "vllm" {
  node    = node.n1
  image   = "vllm:1"
  restart = "always"
  ready {
    exec     = ["curl", "-sf", "localhost:8000/health"]
    timeout  = "300s"
    interval = "1s"
  }
}
"#;

struct Bed {
    dir: tempfile::TempDir,
    config: Config,
    graph: Graph,
    docker: Arc<FakeDocker>,
    node: Arc<FakeHost>,
}

impl Bed {
    fn new(hcl: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), hcl).unwrap();
        let (config, graph) = common::load(dir.path());
        let docker = Arc::new(FakeDocker::start().unwrap());
        let node =
            Arc::new(FakeHost::new("node.n1", &FakeWorld::new()).docker_engine(docker.clone()));
        Bed {
            dir,
            config,
            graph,
            docker,
            node,
        }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    async fn apply(&self) -> ApplyOutcome {
        let plan = plan::plan(
            &self.config,
            &self.graph,
            &self.state(),
            &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
        )
        .unwrap();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let node = self.node.clone() as Arc<dyn sparkform::hosts::Host>;
        let pool = HostPool::from_hosts([("node.n1".to_string(), node)].into_iter().collect());
        let store = self.store();
        let run = apply(ApplyRequest {
            config: &self.config,
            graph: &self.graph,
            plan: &plan,
            store: &store,
            state: self.state(),
            parallelism: 2,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(pool),
            events: tx,
            cancel: CancellationToken::new(),
        });
        // The ready timeout is 300 s: a run that waits for it fails here instead of hanging.
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the apply gave up on the crash-looping container within 60 s")
    }
}

#[tokio::test]
async fn a_crash_looping_container_fails_its_step_at_once_with_its_last_log_lines() {
    let bed = Bed::new(ALWAYS);
    bed.docker.fault(
        "vllm",
        Fault::CrashLoop(vec![
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB".into(),
        ]),
    );
    let started = Instant::now();
    let outcome = bed.apply().await;
    let took = started.elapsed();
    assert!(!outcome.ok && outcome.rolled_back, "{:?}", outcome.failures);
    let (failed, e) = &outcome.failures[0];
    assert_eq!(failed, "container.vllm");
    assert!(
        e.message
            .contains("container vllm is crash-looping: Docker restarted it"),
        "{}",
        e.message
    );
    assert!(e.message.contains("before it was ready"), "{}", e.message);
    assert!(
        e.details
            .iter()
            .any(|l| l.contains("torch.OutOfMemoryError: CUDA out of memory")),
        "{:?}",
        e.details
    );
    // Failed at the first look that saw a restart, not at the 300 s timeout.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    // Rolled back: nothing of it is left, and the state records nothing.
    assert!(
        bed.docker.containers().is_empty(),
        "{:?}",
        bed.docker.containers()
    );
    assert!(bed.state().resources.is_empty());
}

#[tokio::test]
async fn a_container_that_runs_without_restarting_is_still_waited_for() {
    // The same definition without the fault becomes ready: the crash-loop check does not
    // fire on a healthy start (RestartCount stays 0).
    let bed = Bed::new(ALWAYS);
    let outcome = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let c = bed.docker.container("vllm").expect("created");
    assert!(
        c.running && c.restart == "always" && c.restart_count == 0,
        "{c:?}"
    );
}

#[tokio::test]
async fn an_image_inspect_error_is_the_engine_failing_not_a_missing_image() {
    let bed = Bed::new(ALWAYS);
    bed.docker.image_error(
        "vllm:1",
        500,
        "open /var/lib/docker/image/overlay2/repositories.json: input/output error",
    );
    let outcome = bed.apply().await;
    let (failed, e) = &outcome.failures[0];
    assert_eq!(failed, "container.vllm");
    assert!(
        e.message
            .contains("node.n1: the Docker Engine failed to inspect image vllm:1")
            && e.message.contains("input/output error"),
        "{}",
        e.message
    );
    assert!(!e.message.contains("is not on"), "{}", e.message);
    let help = e.help.clone().unwrap_or_default();
    assert!(!help.contains("docker load"), "{help}");
    assert!(help.contains("not a missing image"), "{help}");

    // A 404 is a missing image: then loading it is the advice.
    let bed = Bed::new(ALWAYS);
    bed.docker
        .image_error("vllm:1", 404, "No such image: vllm:1");
    let outcome = bed.apply().await;
    let (_, e) = &outcome.failures[0];
    assert!(
        e.message.contains("image vllm:1 is not on node.n1"),
        "{}",
        e.message
    );
    assert!(e.help.clone().unwrap_or_default().contains("docker load"));
}

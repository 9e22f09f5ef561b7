//! `verify` and `watch` answer fast on a deployment that passed once: a probe looks at what it
//! depends on first, so a container that is not running fails it at once, naming the container,
//! its state and its exit code, with no attempt; a running engine that does not answer is tried
//! again only for `--retry-for`, never for the probe's `timeout` (the load-time wait of an
//! apply, which an apply still waits). On fake nodes with fake Docker Engines: attempts are
//! counted as the exec requests the head's engine got.

use std::sync::Arc;
use std::time::Duration;

use crate::common;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::events::Event;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::kinds::machine::StepError;
use sparkform::state::{State, StateStore};
use sparkform_testkit::fake::{node_with_engine, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

/// The probe's own timeout: what an apply waits for a loading engine, and what `verify` retried
/// for before it had a bound of its own.
const PROBE_TIMEOUT: &str = "20s";

/// The serving fixture (a head and a worker container on two nodes, a probe that runs `curl`
/// in the head and depends on the worker), applied or about to be, on two fake nodes.
struct Deployment {
    dir: tempfile::TempDir,
    config: sparkform::config::Config,
    graph: sparkform::graph::Graph,
    hosts: Vec<(String, Arc<dyn Host>)>,
    head: Arc<FakeDocker>,
    worker: Arc<FakeDocker>,
}

impl Deployment {
    fn new(probe_timeout: &str) -> Deployment {
        let hcl =
            include_str!("../fixtures/serving/main.hcl").replace("PROBE_TIMEOUT", probe_timeout);
        let dir = common::write_config(&[("main.hcl", &hcl)]);
        let (config, graph) = common::load(dir.path());
        let world = FakeWorld::new();
        let (n1, head) = node_with_engine("node.n1", &world).unwrap();
        let (n2, worker) = node_with_engine("node.n2", &world).unwrap();
        let hosts = vec![n1, n2];
        Deployment {
            dir,
            config,
            graph,
            hosts,
            head,
            worker,
        }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    fn options(&self) -> HostOptions {
        HostOptions {
            opener: FakeNodes::new(self.hosts.iter().cloned().collect()).opener(),
            ..HostOptions::default()
        }
    }

    async fn apply(&self) -> ApplyOutcome {
        let p = common::plan(&self.config, &self.graph, &State::new());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        apply(ApplyRequest {
            config: &self.config,
            graph: &self.graph,
            plan: &p,
            store: &self.store(),
            state: State::new(),
            parallelism: 4,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(HostPool::from_hosts(self.hosts.iter().cloned().collect())),
            events: tx,
            cancel: tokio_util::sync::CancellationToken::new(),
        })
        .await
    }

    /// `verify` with `retry_for`: the probe's result, and how many attempts it made (the
    /// commands the head's engine was asked to run in it meanwhile).
    async fn verify(&self, retry_for: Duration) -> (Result<(Duration, String), StepError>, usize) {
        let before = execs(&self.head);
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut results = sparkform::ops::verify::verify(
            &self.config,
            &self.graph,
            &self.state(),
            &[],
            retry_for,
            &self.options(),
            &tx,
        )
        .await;
        assert_eq!(results.len(), 1, "one probe");
        let (address, r) = results.remove(0);
        assert_eq!(address, "probe.serving");
        (r, execs(&self.head) - before)
    }
}

/// Commands the engine was asked to run in a container (exec creates): a probe's attempts.
fn execs(d: &FakeDocker) -> usize {
    d.requests()
        .iter()
        .filter(|r| r.starts_with("POST /containers/") && r.ends_with("/exec"))
        .count()
}

/// The number of attempts a probe's error reports ("failed after N attempts").
fn attempts_reported(e: &StepError) -> usize {
    let after = e
        .message
        .split("failed after ")
        .nth(1)
        .unwrap_or_else(|| panic!("no attempt count: {}", e.message));
    after
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no attempt count: {}", e.message))
}

#[tokio::test]
async fn a_stopped_container_fails_verify_at_once_naming_its_state_and_exit_code() {
    let d = Deployment::new(PROBE_TIMEOUT);
    let outcome = d.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let (passed, tries) = d.verify(Duration::from_secs(10)).await;
    assert!(passed.is_ok(), "{passed:?}");
    assert_eq!(tries, 1, "a passing probe runs once");

    // The engine is killed (the OOM killer, a `docker kill`): the probe's container is exited.
    d.head.exit("head", 137);
    let (r, tries) = d.verify(Duration::from_secs(10)).await;
    let e = r.expect_err("the probe fails");
    let shown = e.render();
    assert!(
        e.message
            .contains("container.head, which it depends on, is down: container head is exited (exit code 137) on node.n1"),
        "{shown}"
    );
    assert!(e.message.starts_with("not tried"), "{shown}");
    assert_eq!(
        tries, 0,
        "no attempt against a stopped container, no retry loop: {shown}"
    );
    assert!(shown.contains("sparkform logs"), "{shown}");

    // What it depends on only through `depends_on`, on another node, is looked at too: both
    // are named.
    d.worker.exit("worker", 1);
    let (r, tries) = d.verify(Duration::from_secs(10)).await;
    let shown = r.expect_err("the probe fails").render();
    assert_eq!(tries, 0, "{shown}");
    assert!(
        shown.contains("container.worker: container worker is exited (exit code 1) on node.n2"),
        "{shown}"
    );
    assert!(
        shown.contains("container head is exited (exit code 137)"),
        "{shown}"
    );
}

#[tokio::test]
async fn a_running_engine_that_does_not_answer_is_tried_again_only_for_retry_for() {
    let d = Deployment::new(PROBE_TIMEOUT);
    let outcome = d.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    // The container runs; what the probe asks of it does not answer.
    d.head.fault(
        "head",
        Fault::ExecExits(
            "curl".into(),
            7,
            "curl: (7) Failed to connect to localhost port 8000".into(),
        ),
    );

    // No retry at all: one attempt.
    let (r, tries) = d.verify(Duration::ZERO).await;
    let e = r.expect_err("the probe fails");
    assert_eq!((tries, attempts_reported(&e)), (1, 1), "{}", e.render());
    assert!(e.message.contains("Failed to connect"), "{}", e.render());
    assert!(
        e.help.as_deref().is_some_and(|h| h.contains("--retry-for")),
        "{}",
        e.render()
    );

    // 2 s: the waits between attempts start at 100 ms and double (100, 200, 400, 800 ms, then
    // the probe's 1 s interval), so at most 5 attempts fit — where the probe's 20 s timeout
    // would have made some 20.
    let (r, tries) = d.verify(Duration::from_secs(2)).await;
    let e = r.expect_err("the probe fails");
    assert_eq!(attempts_reported(&e), tries, "{}", e.render());
    assert!(
        (2..=5).contains(&tries),
        "{tries} attempts within a 2 s --retry-for: {}",
        e.render()
    );
}

#[tokio::test]
async fn apply_still_waits_the_probes_own_timeout() {
    let d = Deployment::new("3s");
    // The probe never passes: the apply tries it for its 3 s timeout, not for a --retry-for.
    d.head.fault(
        "head",
        Fault::ExecExits(
            "curl".into(),
            7,
            "curl: (7) Failed to connect to localhost port 8000".into(),
        ),
    );
    let outcome = d.apply().await;
    assert!(!outcome.ok);
    let (address, e) = &outcome.failures[0];
    assert_eq!(address, "probe.serving");
    // Waits of 100, 200, 400, 800 ms and 1 s fit in 3 s: 6 attempts (a 1 s bound allows 4).
    let n = attempts_reported(e);
    assert!(n >= 5, "{n} attempts in a 3 s timeout: {}", e.render());
    assert!(
        e.help.is_none(),
        "no --retry-for advice in an apply: {}",
        e.render()
    );
}

#[tokio::test]
async fn watch_fails_a_probe_whose_container_stopped_at_once() {
    let d = Deployment::new(PROBE_TIMEOUT);
    let outcome = d.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    d.head.exit("head", 137);
    let before = execs(&d.head);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let workspace = sparkform::workspace::Workspace::new(d.dir.path(), None);
    let evaluated = sparkform::ops::definitions::load(&workspace, &Default::default()).unwrap();
    let end = sparkform::ops::watch::watch(
        sparkform::ops::watch::WatchRequest {
            workspace,
            evaluated,
            interval: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(60),
            retry_for: Duration::from_secs(10),
            restart: false,
            max_restarts: 1,
            window: Duration::from_secs(3600),
            ticks: Some(1),
            hosts: d.options(),
            parallelism: 4,
        },
        &tx,
        tokio_util::sync::CancellationToken::new(),
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    drop(tx);
    assert!(
        matches!(&end, sparkform::ops::watch::WatchEnd::Failed(c) if c.contains("exit code 137")),
        "{end:?}"
    );
    let mut summary = String::new();
    while let Some(e) = rx.recv().await {
        if let Event::WatchCheck { summary: s, .. } = e {
            summary = s;
        }
    }
    assert!(
        summary.contains(
            "probe.serving failed: not tried: container.head, which it depends on, is down: container head is exited (exit code 137) on node.n1"
        ),
        "{summary}"
    );
    assert_eq!(execs(&d.head), before, "no attempt: {summary}");
}

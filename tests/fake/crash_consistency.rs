//! What a kill, a failed probe or a rollback leaves, on fake nodes and fake Docker Engines
//! (`sparkform_testkit::fake`, `sparkform_testkit::fake_docker`): the journal keys untracked objects apart from the
//! tracked resources at their addresses; dependents wait for the resource's own step; a run
//! killed midway is run again; an address a kill left on a node is adopted and destroyed; a
//! rollback says what it did not restore; a probe whose last run failed is not hidden behind
//! "No changes."; destroy removes what the machines hold with the deployment's labels; a
//! replaced Ray worker replaces vLLM.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::config::Config;
use sparkform::events::Event;
use sparkform::graph::Graph;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::plan::{self, Action, Observations, Plan, PlanOptions};
use sparkform::state::{HashKey, State, StateStore};
use sparkform_testkit::fake::{Answer, FakeHost, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};
use tokio_util::sync::CancellationToken;

/// A network on two nodes, a head after it, a worker after the head, a probe in the head after
/// the worker (the shape of a Ray cluster and its gate).
const SERVING: &str = include_str!("../fixtures/serving/main.hcl");

fn serving(probe_timeout: &str) -> String {
    SERVING.replace("PROBE_TIMEOUT", probe_timeout)
}

struct Bed {
    dir: tempfile::TempDir,
    config: Config,
    graph: Graph,
    n1: Arc<FakeHost>,
    n2: Arc<FakeHost>,
    d1: Arc<FakeDocker>,
    d2: Arc<FakeDocker>,
}

fn key() -> HashKey {
    HashKey::from_bytes([7; 32])
}

impl Bed {
    /// The definitions, and two fake nodes (each with a fake Docker Engine) whose `eth1` is
    /// at MTU 1500 without an address. `tweak` scripts the nodes before they are shared.
    fn new(hcl: &str, tweak: impl Fn(&FakeHost)) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), hcl).unwrap();
        let (config, graph) = common::load(dir.path());
        let world = FakeWorld::new();
        let d1 = Arc::new(FakeDocker::start().unwrap());
        let d2 = Arc::new(FakeDocker::start().unwrap());
        let node = |name: &str, d: &Arc<FakeDocker>| {
            let h = FakeHost::new(name, &world)
                .interface("eth1", 1500, &[])
                .docker_engine(d.clone());
            tweak(&h);
            Arc::new(h)
        };
        let n1 = node("node.n1", &d1);
        let n2 = node("node.n2", &d2);
        Bed {
            dir,
            config,
            graph,
            n1,
            n2,
            d1,
            d2,
        }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    /// The state on disk: what a killed process leaves.
    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    fn hosts(&self) -> Vec<(String, Arc<dyn Host>)> {
        vec![
            ("node.n1".to_string(), self.n1.clone() as Arc<dyn Host>),
            ("node.n2".to_string(), self.n2.clone() as Arc<dyn Host>),
        ]
    }

    fn pool(&self) -> HostPool {
        HostPool::from_hosts(self.hosts().into_iter().collect())
    }

    async fn observe(&self) -> Observations {
        sparkform::observe::observe_hosts(&self.state(), self.hosts())
            .await
            .unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn plan_with(&self, replace: &[&str], observations: Option<Observations>) -> Plan {
        plan::plan(
            &self.config,
            &self.graph,
            &self.state(),
            &PlanOptions {
                replace: replace.iter().map(|s| s.to_string()).collect(),
                observations,
                ..PlanOptions::with_key(key())
            },
        )
        .unwrap()
    }

    /// What `destroy` plans after its refresh, and the empty definitions it applies.
    fn destroy_plan(&self, observations: Option<Observations>) -> (Plan, Config, Graph) {
        let p = sparkform::ops::apply::plan_destroy(
            &self.config,
            &self.state(),
            Vec::new(),
            Vec::new(),
            observations,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let empty = Config {
            resources: Vec::new(),
            outputs: Vec::new(),
            ..self.config.clone()
        };
        let graph = Graph::build(&empty).unwrap();
        (p, empty, graph)
    }

    fn request<'a>(
        &'a self,
        config: &'a Config,
        graph: &'a Graph,
        plan: &'a Plan,
        store: &'a StateStore,
        events: sparkform::events::Sender,
    ) -> ApplyRequest<'a> {
        ApplyRequest {
            config,
            graph,
            plan,
            store,
            state: self.state(),
            parallelism: 4,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(self.pool()),
            events,
            cancel: CancellationToken::new(),
        }
    }

    async fn run_plan(&self, config: &Config, graph: &Graph, plan: &Plan) -> Run {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let store = self.store();
        let outcome = apply(self.request(config, graph, plan, &store, tx)).await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        Run { outcome, events }
    }

    async fn apply(&self, replace: &[&str], observations: Option<Observations>) -> Run {
        let p = self.plan_with(replace, observations);
        self.run_plan(&self.config, &self.graph, &p).await
    }

    /// Start an apply and kill it (drop it: nothing of it runs any more, as after SIGKILL) once
    /// `until` says so of an event, or of the nodes (`None`: asked every 10 ms).
    async fn apply_killed(&self, replace: &[&str], until: impl Fn(Option<&Event>, &Bed) -> bool) {
        let p = self.plan_with(replace, None);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let store = self.store();
        let run = apply(self.request(&self.config, &self.graph, &p, &store, tx));
        tokio::pin!(run);
        let deadline = tokio::time::sleep(Duration::from_secs(30));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                outcome = &mut run => panic!("the apply finished before the kill: {:?}", outcome.failures),
                Some(e) = rx.recv() => if until(Some(&e), self) { return },
                _ = tokio::time::sleep(Duration::from_millis(10)) => if until(None, self) { return },
                _ = &mut deadline => panic!("the kill point never came"),
            }
        }
    }
}

struct Run {
    outcome: ApplyOutcome,
    events: Vec<Event>,
}

impl Run {
    fn position(&self, pick: impl Fn(&Event) -> bool) -> usize {
        self.events
            .iter()
            .position(pick)
            .unwrap_or_else(|| panic!("no such event in {:#?}", self.events))
    }
    fn started(&self, address: &str) -> usize {
        self.position(|e| matches!(e, Event::StepStarted { address: a, action } if a == address && action != "destroy"))
    }
    fn done(&self, address: &str) -> usize {
        self.position(|e| matches!(e, Event::StepDone { address: a, action, .. } if a == address && action != "destroy"))
    }
}

fn change<'a>(p: &'a Plan, address: &str) -> &'a plan::Change {
    p.changes
        .iter()
        .find(|c| c.address == address && c.orphan.is_none())
        .unwrap_or_else(|| panic!("no change for {address} in {:#?}", p.changes))
}

fn container_id(state: &State, address: &str) -> Option<String> {
    state
        .resources
        .get(address)?
        .attributes
        .get("container_id")?
        .as_str()
        .map(str::to_string)
}

fn running(d: &FakeDocker) -> Vec<String> {
    let mut v: Vec<String> = d
        .containers()
        .into_iter()
        .filter(|c| c.running)
        .map(|c| c.name)
        .collect();
    v.sort();
    v
}

/// What a kill between recording a new head and removing the old one (renamed aside) leaves:
/// the old head, labelled with the deployment's lineage and the head's address, stopped.
fn leave_an_old_head(bed: &Bed) -> String {
    let lineage = bed.state().lineage;
    bed.d1.add(
        "head-sparkform-old-0123456789ab",
        "ray:1",
        &[
            ("sparkform.lineage", lineage.as_str()),
            ("sparkform.address", "container.head"),
        ],
        false,
    )
}

#[tokio::test]
async fn deleting_an_untracked_container_keeps_the_tracked_resource_at_its_address() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let head_id = container_id(&bed.state(), "container.head").expect("head recorded");
    let old = leave_an_old_head(&bed);

    // The plan explains the old head as untracked and deletes it; nothing else changes.
    let seen = bed.observe().await;
    let p = bed.plan_with(&[], Some(seen));
    let untracked: Vec<_> = p.changes.iter().filter(|c| c.orphan.is_some()).collect();
    assert_eq!(untracked.len(), 1, "{:#?}", p.changes);
    assert_eq!(untracked[0].action, Action::Delete);
    assert_eq!(change(&p, "container.head").action, Action::NoOp);

    let r = bed.run_plan(&bed.config, &bed.graph, &p).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    // The old one is gone; the running head keeps its entry, by id.
    assert!(
        bed.d1.container(&old).is_none(),
        "{:?}",
        bed.d1.containers()
    );
    assert_eq!(running(&bed.d1), ["head"]);
    assert_eq!(
        container_id(&bed.state(), "container.head").as_deref(),
        Some(head_id.as_str()),
        "{:#?}",
        bed.state().resources.get("container.head")
    );
    // And so the next apply has nothing to do: no outage to recreate what was running.
    let seen = bed.observe().await;
    let p = bed.plan_with(&[], Some(seen));
    assert!(!p.has_changes(), "{}", plan::render::render(&p));
}

#[tokio::test]
async fn a_rolled_back_recovery_puts_the_untracked_container_back_under_its_own_name() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let before = bed.state();
    let old = leave_an_old_head(&bed);
    // The recovery apply deletes the untracked head and replaces the worker; the probe fails.
    bed.d1.fault(
        "head",
        Fault::ExecExits("curl".into(), 7, "curl: (7) Failed to connect".into()),
    );
    let seen = bed.observe().await;
    let r = bed
        .run_plan(
            &bed.config,
            &bed.graph,
            &bed.plan_with(&["container.worker"], Some(seen)),
        )
        .await;
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    assert!(
        r.outcome.undo_failures.is_empty(),
        "{:?}",
        r.outcome.undo_failures
    );
    // The tracked head running under its name with its entry, the untracked one back under
    // the name it had (not fighting the tracked one for its name).
    assert_eq!(
        bed.d1.container(&old).map(|c| c.name).as_deref(),
        Some("head-sparkform-old-0123456789ab")
    );
    assert!(
        running(&bed.d1).contains(&"head".to_string()),
        "{:?}",
        bed.d1.containers()
    );
    assert_eq!(
        bed.state().resources.get("container.head"),
        before.resources.get("container.head")
    );
}

#[tokio::test]
async fn dependents_wait_for_the_resource_step_not_for_an_untracked_delete_at_its_address() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    leave_an_old_head(&bed);

    // The recovery apply deletes the untracked old head and replaces the head; the probe runs
    // because the head (upstream of it) is replaced. It must start after the head is ready.
    let seen = bed.observe().await;
    let p = bed.plan_with(&["container.head"], Some(seen));
    assert_eq!(change(&p, "container.head").action, Action::Replace);
    assert_eq!(change(&p, "probe.serving").action, Action::Run);
    let r = bed.run_plan(&bed.config, &bed.graph, &p).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    assert!(
        r.started("probe.serving") > r.done("container.head"),
        "the probe started before the head it depends on was ready: {:#?}",
        r.events
    );
    // The new head is recorded (not dropped by the untracked delete).
    let id = container_id(&bed.state(), "container.head").expect("head recorded");
    assert_eq!(bed.d1.container("head").map(|c| c.id), Some(id));
}

#[tokio::test]
async fn a_probe_killed_while_it_ran_is_run_again_by_the_next_apply() {
    let bed = Bed::new(&serving("60s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    // The probe keeps failing, so it is still running when the process is killed.
    bed.d1.fault(
        "head",
        Fault::ExecExits("curl".into(), 7, "curl: (7) Failed to connect".into()),
    );
    bed.apply_killed(
        &["container.worker"],
        |e, _| matches!(e, Some(Event::StepProgress { address, .. }) if address == "probe.serving"),
    )
    .await;
    // The worker's replacement was recorded before the probe started: nothing upstream of the
    // probe changes any more, yet what it checks was never confirmed.
    let p = bed.plan_with(&[], None);
    let probe = change(&p, "probe.serving");
    assert_eq!(probe.action, Action::Run, "{}", plan::render::render(&p));
    assert!(
        probe
            .run_reason
            .as_deref()
            .is_some_and(|r| r.contains("interrupted")),
        "{probe:?}"
    );
    // Run again and passing, it is recorded as passed: the next plan has nothing to run.
    bed.d1.heal();
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    assert!(!bed.plan_with(&[], None).has_changes());
}

#[tokio::test]
async fn an_address_left_by_a_kill_during_its_create_is_adopted_and_destroyed() {
    // `ip link set` never answers: the kill comes after the address was added, before the MTU.
    let bed = Bed::new(&serving("2s"), |h| {
        h.on(&["ip", "link", "set"], Answer::Hang)
    });
    bed.apply_killed(&[], |_, bed| {
        bed.n1
            .interfaces()
            .iter()
            .any(|i| i.addresses.iter().any(|a| a == "192.168.10.1/24"))
    })
    .await;
    // Give the other node's create the same chance to have begun.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let address = "network.a.attach.n1";
    assert!(
        bed.state().resources.contains_key(address),
        "a create of an address is recorded before it starts: {:#?}",
        bed.state().resources
    );

    // Refresh sees it and the plan adopts it: no "will be created" of what exists.
    let seen = bed.observe().await;
    let p = bed.plan_with(&[], Some(seen));
    let c = change(&p, address);
    assert_eq!(c.action, Action::Update, "{}", plan::render::render(&p));
    assert!(
        c.drift
            .iter()
            .any(|d| d.contains("found on the node, will be adopted")),
        "{c:?}"
    );
    let text = plan::render::render(&p);
    assert!(text.contains("will be adopted"), "{text}");

    // Destroy removes it, with the addresses the node holds for the deployment.
    let (p, empty, graph) = bed.destroy_plan(Some(bed.observe().await));
    assert_eq!(change(&p, address).action, Action::Delete);
    let r = bed.run_plan(&empty, &graph, &p).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    for i in bed.n1.interfaces().iter().chain(bed.n2.interfaces().iter()) {
        assert!(i.addresses.is_empty(), "{i:?}");
    }
    assert!(
        bed.state().resources.is_empty(),
        "{:?}",
        bed.state().resources
    );
}

#[tokio::test]
async fn destroy_removes_labelled_containers_the_state_does_not_record() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let old = leave_an_old_head(&bed);
    // A vLLM the state lost (an apply killed between its create and its record).
    let lineage = bed.state().lineage;
    let lost = bed.d2.add(
        "vllm",
        "vllm:1",
        &[
            ("sparkform.lineage", lineage.as_str()),
            ("sparkform.address", "container.vllm"),
        ],
        true,
    );

    let (p, empty, graph) = bed.destroy_plan(Some(bed.observe().await));
    let untracked: Vec<&str> = p
        .changes
        .iter()
        .filter_map(|c| c.orphan.as_ref().map(|o| o.name.as_str()))
        .collect();
    assert_eq!(untracked.len(), 2, "{:#?}", p.changes);
    let text = plan::render::render(&p);
    assert!(
        text.contains("carries this deployment's labels but the state does not record it"),
        "{text}"
    );
    let r = bed.run_plan(&empty, &graph, &p).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    assert!(bed.d1.containers().is_empty(), "{:?}", bed.d1.containers());
    assert!(bed.d2.containers().is_empty(), "{:?}", bed.d2.containers());
    assert!(bed.d1.container(&old).is_none() && bed.d2.container(&lost).is_none());
    // Only now is there truly nothing: destroy planned again says no changes.
    let (p, _, _) = bed.destroy_plan(Some(bed.observe().await));
    assert!(!p.has_changes(), "{}", plan::render::render(&p));
}

#[tokio::test]
async fn a_rollback_names_what_it_could_not_restore_and_the_failed_probe_stays_visible() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    // The probe fails after the worker's replacement, and the previous worker, once put back,
    // exits at its start (its head no longer knows it).
    bed.d1.fault(
        "head",
        Fault::ExecExits(
            "curl".into(),
            22,
            "curl: (22) 503 Service Unavailable".into(),
        ),
    );
    let p = bed.plan_with(&["container.worker"], None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let store = bed.store();
    let req = bed.request(&bed.config, &bed.graph, &p, &store, tx);
    let run = apply(req);
    tokio::pin!(run);
    let outcome = loop {
        tokio::select! {
            o = &mut run => break o,
            Some(e) = rx.recv() => {
                if matches!(&e, Event::StepDone { address, .. } if address == "container.worker") {
                    bed.d2.fault("worker", Fault::ExitsAfterStart(1, vec!["raylet: lost the head".into()]));
                }
            }
        }
    };
    assert!(!outcome.ok && outcome.rolled_back);
    assert_eq!(outcome.failures[0].0, "probe.serving");
    // The worker's undo ran, but the worker it put back is not running: said, by address.
    let not: Vec<&str> = outcome
        .undo_failures
        .iter()
        .map(|(a, _)| a.as_str())
        .collect();
    assert_eq!(not, ["container.worker"], "{:?}", outcome.undo_failures);
    assert!(
        outcome.undo_failures[0].1.message.contains("not as it was"),
        "{:?}",
        outcome.undo_failures
    );
    assert!(outcome.undone < outcome.to_undo);

    // The next plan against the state has no change to make, but does not say "No changes.":
    // the last probe result failed, with when and why.
    let p = bed.plan_with(&[], None);
    assert!(!p.has_changes());
    assert_eq!(p.failing.len(), 1, "{:?}", p.failing);
    assert_eq!(p.failing[0].address, "probe.serving");
    assert!(p.failing[0].error.contains("503"), "{:?}", p.failing);
    assert!(!p.failing[0].at.is_empty());
    let text = plan::render::render(&p);
    assert!(!text.contains("No changes. The machines match"), "{text}");
    assert!(text.contains("probe.serving failed"), "{text}");
    assert!(text.contains("sparkform verify"), "{text}");
}

#[test]
fn replacing_a_ray_worker_replaces_vllm() {
    for example in ["examples/qwen35-two-sparks", "examples/testbed-standin"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(example);
        let (config, graph) = common::load(&dir);
        let state = common::applied(&dir);
        let workers: Vec<&str> = config
            .resources
            .iter()
            .map(|r| r.address.as_str())
            .filter(|a| a.contains("container.ray_worker"))
            .collect();
        let heads: Vec<&str> = config
            .resources
            .iter()
            .map(|r| r.address.as_str())
            .filter(|a| a.ends_with("container.ray_head"))
            .collect();
        assert!(!workers.is_empty() && heads.len() == 1, "{example}");
        let vllm = config
            .resources
            .iter()
            .map(|r| r.address.as_str())
            .find(|a| a.ends_with("container.vllm"))
            .unwrap_or_else(|| panic!("{example} has no vLLM"));
        for member in workers.iter().chain(heads.iter()) {
            let p = plan::plan(
                &config,
                &graph,
                &state,
                &PlanOptions {
                    replace: vec![member.to_string()],
                    ..PlanOptions::with_key(key())
                },
            )
            .unwrap();
            let c = change(&p, vllm);
            assert_eq!(c.action, Action::Replace, "{example}: -replace {member}");
            assert!(
                c.replace_reasons
                    .iter()
                    .any(|r| r.contains("replace_triggered_by") && r.contains(member)),
                "{example}: {:?}",
                c.replace_reasons
            );
        }
    }
}

/// On the testbed, through the real command: `destroy` refreshes first and removes a labelled
/// container the state does not record (a run killed between its create and its record), saying
/// so; destroy again finds nothing.
#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn testbed_destroy_removes_a_labelled_container_the_state_lost() {
    use common::testbed::{sparkform, testbed};
    let tb = testbed();
    let prefix = format!("sfcc{}", std::process::id());
    let mut hcl = tb.hcl(&[("node1", "sf-node1")], &tb.known_hosts(), 2222);
    hcl.push_str(&format!(
        r#"
container "keep" {{
  node         = node.node1
  name         = "{prefix}-keep"
  image        = "sparkform-testbed/tiny:latest"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
}}
"#
    ));
    let cfg = common::write_config(&[("main.hcl", &hcl)]);
    let d = cfg.path().to_str().unwrap_or_default().to_string();
    let clean = || {
        tb.ssh(
            "sf-node1",
            &format!("docker rm -f {prefix}-keep {prefix}-lost >/dev/null 2>&1; true"),
        );
    };
    let (code, out, err) = sparkform(&["apply", &d, "-auto-approve"]);
    if code != 0 {
        clean();
        panic!("apply:\n{out}\n{err}");
    }
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cfg.path().join("state/sparkform.json")).unwrap_or_default(),
    )
    .unwrap_or_default();
    let lineage = state["lineage"].as_str().unwrap_or_default().to_string();
    assert!(!lineage.is_empty(), "{state}");
    tb.ssh(
        "sf-node1",
        &format!(
            "docker run -d --name {prefix}-lost --label sparkform.lineage={lineage} \
             --label sparkform.address=container.lost sparkform-testbed/tiny:latest sleep 3600"
        ),
    );
    let (code, out, err) = sparkform(&["destroy", &d, "-auto-approve"]);
    let left = tb.ssh(
        "sf-node1",
        &format!("docker ps -a --filter name={prefix}- --format '{{{{.Names}}}}'"),
    );
    clean();
    assert_eq!(code, 0, "destroy:\n{out}\n{err}");
    assert!(
        out.contains("carries this deployment's labels but the state does not record it")
            && out.contains(&format!("{prefix}-lost")),
        "{out}"
    );
    assert!(left.trim().is_empty(), "left on node1: {left}");
    let (code, out, err) = sparkform(&["destroy", &d, "-auto-approve"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("No changes."), "{out}");
}

/// A state whose recorded dependencies loop (edited by hand, or written by a defect): the
/// deletes wait on each other and could never start. The apply refuses before it changes
/// anything and names the loop; it never reports the steps it did not run as done.
#[tokio::test]
async fn steps_that_wait_on_each_other_are_refused_before_anything_changes() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let mut state = bed.state();
    state
        .resources
        .get_mut("container.head")
        .expect("head recorded")
        .depends_on
        .push("container.worker".into());
    bed.store().write(&mut state).unwrap();
    let before = bed.state();
    let running_before = (running(&bed.d1), running(&bed.d2));

    let (p, empty, graph) = bed.destroy_plan(None);
    let r = bed.run_plan(&empty, &graph, &p).await;
    assert!(
        !r.outcome.ok,
        "a run that could not start its steps succeeded"
    );
    let (address, e) = &r.outcome.failures[0];
    assert_eq!(address, "(plan)");
    assert!(
        e.message.contains("container.head") && e.message.contains("container.worker"),
        "{}",
        e.message
    );
    // Nothing ran: every step is accounted for as not run, nothing was counted as done.
    let planned = p.changes.iter().filter(|c| c.action.is_change()).count();
    assert_eq!(r.outcome.not_run.len(), planned, "{:?}", r.outcome.not_run);
    assert_eq!(r.outcome.ran, plan::Summary::default());
    assert!(
        !r.events
            .iter()
            .any(|e| matches!(e, Event::StepStarted { .. } | Event::StepDone { .. })),
        "{:#?}",
        r.events
    );
    assert_eq!((running(&bed.d1), running(&bed.d2)), running_before);
    assert_eq!(bed.state().resources, before.resources);
}

/// A run that stops at a failure accounts for the steps it never started: each one is named
/// with the step that blocked it, and none is counted as done.
#[tokio::test]
async fn steps_after_a_failure_are_reported_as_not_run_with_what_blocked_them() {
    let bed = Bed::new(&serving("2s"), |_| {});
    bed.d1
        .fault("head", Fault::CreateFails("no space left on device".into()));
    let r = bed.apply(&[], None).await;
    assert!(!r.outcome.ok);
    let blocked: Vec<&(String, String)> = r
        .outcome
        .not_run
        .iter()
        .filter(|(a, _)| a == "container.worker")
        .collect();
    assert_eq!(blocked.len(), 1, "{:?}", r.outcome.not_run);
    assert!(
        blocked[0]
            .1
            .contains("blocked by container.head, which failed"),
        "{}",
        blocked[0].1
    );
    assert!(r.events.iter().any(|e| matches!(
        e,
        Event::StepNotRun { address, .. } if address == "container.worker"
    )));
    // What ran is what the StepDone events say, not what was planned.
    let created = r
        .events
        .iter()
        .filter(|e| matches!(e, Event::StepDone { action, .. } if action == "create"))
        .count();
    assert_eq!(r.outcome.ran.create, created, "{:?}", r.outcome.ran);
    assert!(!r.outcome.not_run.is_empty());
}

/// What a kill during a replacement leaves (the recorded head renamed aside and stopped, the
/// killed run's new head running under the name, unrecorded), then a recovery apply whose new
/// head fails: the failed step puts the recorded head back under its name, and the rollback
/// must not fight it for that name (Docker's 409) or rename a container to the name it has
/// (Docker's 400): the untracked one stays set aside, and everything is restored.
#[tokio::test]
async fn a_rolled_back_recovery_never_fights_the_tracked_container_for_its_name() {
    let bed = Bed::new(&serving("2s"), |_| {});
    let r = bed.apply(&[], None).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let before = bed.state();
    let head_id = container_id(&before, "container.head").expect("head recorded");
    // The kill: the recorded head set aside and stopped, a new labelled head running.
    let aside = format!("head-sparkform-old-{}", &head_id[..12]);
    bed.d1.rename("head", &aside);
    bed.d1.stop(&aside);
    let lineage = before.lineage.clone();
    let untracked = bed.d1.add(
        "head",
        "ray:1",
        &[
            ("sparkform.lineage", lineage.as_str()),
            ("sparkform.address", "container.head"),
        ],
        true,
    );
    // The recovery's new head does not start.
    bed.d1
        .fault("head", Fault::CreateFails("no space left on device".into()));
    let seen = bed.observe().await;
    let p = bed.plan_with(&[], Some(seen));
    assert!(
        p.changes
            .iter()
            .any(|c| c.orphan.is_some() && c.address == "container.head"),
        "{}",
        plan::render::render(&p)
    );
    let r = bed.run_plan(&bed.config, &bed.graph, &p).await;
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    assert!(
        r.outcome.undo_failures.is_empty(),
        "{:?}",
        r.outcome.undo_failures
    );
    // The recorded head runs under its name; the untracked one is set aside, stopped.
    let head = bed.d1.container("head").expect("a head");
    assert_eq!(head.id, head_id, "{:?}", bed.d1.containers());
    assert!(head.running, "{:?}", bed.d1.containers());
    let other = bed
        .d1
        .containers()
        .into_iter()
        .find(|c| c.id == untracked)
        .expect("the untracked head");
    assert!(!other.running, "{other:?}");
    assert_ne!(other.name, "head");
    assert_eq!(
        bed.state().resources.get("container.head"),
        before.resources.get("container.head")
    );
}

/// A probe whose command carries a token from a sensitive variable fails, and what it printed
/// echoes the token: neither the events (as the terminal and `--json` show them), nor the
/// errors, nor the state file hold it; they say "(sensitive value)" where it was.
#[tokio::test]
async fn a_failing_probe_never_shows_or_records_the_token_it_carries() {
    const TOKEN: &str = "sk-topsecret-4242";
    let hcl = format!(
        "variable \"api_key\" {{\n  type      = string\n  default   = \"{TOKEN}\"\n  sensitive = true\n}}\n{}",
        serving("2s").replace(
            r#"command   = ["curl", "-sf", "localhost:8000/v1/models"]"#,
            r#"command   = ["curl", "-sf", "-H", "Authorization: Bearer ${var.api_key}", "localhost:8000/v1/models"]"#,
        )
    );
    assert!(hcl.contains("var.api_key"), "the fixture changed");
    let bed = Bed::new(&hcl, |_| {});
    bed.d1.fault(
        "head",
        Fault::ExecExits(
            "curl".into(),
            22,
            format!("curl: (22) 401 for Authorization: Bearer {TOKEN}"),
        ),
    );
    let r = bed.apply(&[], None).await;
    assert!(!r.outcome.ok);
    let (address, e) = r
        .outcome
        .failures
        .iter()
        .find(|(a, _)| a == "probe.serving")
        .expect("the probe failed");
    let shown = e.render();
    assert!(!shown.contains(TOKEN), "{address}: {shown}");
    assert!(shown.contains("(sensitive value)"), "{shown}");
    for ev in &r.events {
        let json = serde_json::to_string(ev).unwrap();
        assert!(!json.contains(TOKEN), "{json}");
    }
    let state = std::fs::read_to_string(bed.dir.path().join("state/sparkform.json")).unwrap();
    assert!(!state.contains(TOKEN), "the state holds the token");
}

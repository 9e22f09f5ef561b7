//! The executor on fake nodes (`sparkform_testkit::fake`): dependency order, the parallelism limit, a
//! failure at every step of a 7-step apply (journal, next plan, rollback), a node that goes
//! away, cancel during a step, a panicking step. No Docker, no ssh.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::config::Config;
use sparkform::events::Event;
use sparkform::graph::Graph;
use sparkform::hosts::{HostOptions, HostPool};
use sparkform::plan::{self, Action, Plan, PlanOptions};
use sparkform::state::{State, StateStore};
use sparkform_testkit::fake::{Answer, FakeHost, FakeWorld};
use tokio_util::sync::CancellationToken;

/// Two networks of two attachments each (4 steps, 2 fabric checks) and a probe after both
/// networks: 7 steps.
const SEVEN: &str = r#"
node "n1" { address = "10.0.0.1" }
node "n2" { address = "10.0.0.2" }

network "a" {
  subnet = "192.168.10.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.10.1"
  }
  attach "n2" {
    node      = node.n2
    interface = "eth1"
    address   = "192.168.10.2"
  }
}

network "b" {
  subnet = "192.168.20.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth2"
    address   = "192.168.20.1"
  }
  attach "n2" {
    node      = node.n2
    interface = "eth2"
    address   = "192.168.20.2"
  }
}

probe "fabric_up" {
  timeout    = "2s"
  interval   = "1s"
  depends_on = [network.a, network.b]
  exec {
    node    = node.n1
    command = ["fabric-ready"]
  }
}
"#;

struct Bed {
    dir: tempfile::TempDir,
    config: Config,
    graph: Graph,
    world: Arc<FakeWorld>,
}

impl Bed {
    fn new(hcl: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), hcl).unwrap();
        let (config, graph) = common::load(dir.path());
        Bed {
            dir,
            config,
            graph,
            world: FakeWorld::new(),
        }
    }

    /// New definitions in the same folder (the state stays).
    fn rewrite(&mut self, hcl: &str) {
        std::fs::write(self.dir.path().join("main.hcl"), hcl).unwrap();
        (self.config, self.graph) = common::load(self.dir.path());
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    fn plan(&self) -> Plan {
        plan::plan(
            &self.config,
            &self.graph,
            &self.state(),
            &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
        )
        .unwrap()
    }

    /// A fresh node with the two fabric interfaces at MTU 1500, answering the probe's command.
    fn node(&self, name: &str) -> FakeHost {
        let h = FakeHost::new(name, &self.world)
            .interface("eth1", 1500, &[])
            .interface("eth2", 1500, &[]);
        h.on(
            &["fabric-ready"],
            Answer::Exit(0, "ok\n".into(), String::new()),
        );
        h
    }
}

struct Run {
    outcome: ApplyOutcome,
    events: Vec<Event>,
}

impl Run {
    /// The addresses of the events `pick` selects, in order.
    fn addresses(&self, pick: fn(&Event) -> Option<&String>) -> Vec<String> {
        self.events.iter().filter_map(pick).cloned().collect()
    }
    fn started(&self) -> Vec<String> {
        self.addresses(|e| match e {
            Event::StepStarted { address, .. } => Some(address),
            _ => None,
        })
    }
    fn done(&self) -> Vec<String> {
        self.addresses(|e| match e {
            Event::StepDone { address, .. } => Some(address),
            _ => None,
        })
    }
    fn undone(&self) -> Vec<String> {
        self.addresses(|e| match e {
            Event::UndoDone { address, .. } => Some(address),
            _ => None,
        })
    }
}

async fn run(
    bed: &Bed,
    nodes: Vec<Arc<FakeHost>>,
    parallelism: usize,
    rollback: bool,
    cancel: CancellationToken,
) -> Run {
    let plan = bed.plan();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pool = HostPool::from_hosts(
        nodes
            .into_iter()
            .map(|h| {
                let node = sparkform::hosts::Host::node(h.as_ref()).to_string();
                (node, h as Arc<dyn sparkform::hosts::Host>)
            })
            .collect(),
    );
    let outcome = apply(ApplyRequest {
        config: &bed.config,
        graph: &bed.graph,
        plan: &plan,
        store: &bed.store(),
        state: bed.state(),
        parallelism,
        rollback,
        hosts: HostOptions::default(),
        pool: Some(pool),
        events: tx,
        cancel,
    })
    .await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    Run { outcome, events }
}

fn two(bed: &Bed) -> (Arc<FakeHost>, Arc<FakeHost>) {
    (Arc::new(bed.node("node.n1")), Arc::new(bed.node("node.n2")))
}

fn position(log: &[String], needle: &str) -> usize {
    log.iter()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} in {log:#?}"))
}

#[tokio::test]
async fn steps_follow_the_dependencies_and_leave_the_machines_configured() {
    let bed = Bed::new(SEVEN);
    let (n1, n2) = two(&bed);
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        8,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    assert_eq!(r.done().len(), 7, "{:?}", r.done());
    let log = bed.world.log();
    // A network's fabric check after both its attachments; the probe after both checks.
    let ping_a = position(&log, "-I eth1 192.168.10.");
    assert!(position(&log, "node.n1: ip addr replace 192.168.10.1/24") < ping_a);
    assert!(position(&log, "node.n2: ip addr replace 192.168.10.2/24") < ping_a);
    let probe = position(&log, "fabric-ready");
    assert!(position(&log, "-I eth2 192.168.20.") < probe);
    assert!(ping_a < probe);
    for h in [&n1, &n2] {
        for i in h.interfaces() {
            assert_eq!((i.mtu, i.addresses.len()), (9000, 1), "{i:?}");
        }
    }
    // The journal holds the 5 resources (the checks record nothing); nothing is left to do.
    assert_eq!(bed.state().resources.len(), 5);
    assert!(!bed.plan().has_changes());
}

/// Six independent attachments on six nodes.
fn six() -> String {
    let mut s = String::new();
    for i in 1..=6 {
        s.push_str(&format!(
            "node \"n{i}\" {{ address = \"10.0.0.{i}\" }}\nnetwork \"net{i}\" {{\n  subnet = \"192.168.{i}.0/24\"\n  attach \"n{i}\" {{\n    node = node.n{i}\n    interface = \"eth1\"\n    address = \"192.168.{i}.1\"\n  }}\n}}\n"
        ));
    }
    s
}

#[tokio::test]
async fn no_more_steps_run_at_once_than_parallelism_allows() {
    for parallelism in [1, 2, 3] {
        let bed = Bed::new(&six());
        let nodes: Vec<Arc<FakeHost>> = (1..=6)
            .map(|i| {
                Arc::new(
                    FakeHost::new(&format!("node.n{i}"), &bed.world)
                        .latency(Duration::from_millis(15))
                        .interface("eth1", 1500, &[]),
                )
            })
            .collect();
        let r = run(&bed, nodes, parallelism, true, CancellationToken::new()).await;
        assert!(r.outcome.ok, "{:?}", r.outcome.failures);
        // Each attachment step runs its commands one after another: commands in flight are
        // steps in flight.
        assert_eq!(
            bed.world.max_running(),
            parallelism,
            "parallelism {parallelism}"
        );
    }
}

/// Make the step at `address` fail on its first command that changes something.
fn break_step(n1: &FakeHost, n2: &FakeHost, address: &str) {
    let fail = || {
        Answer::Exit(
            2,
            String::new(),
            "RTNETLINK answers: Operation not permitted".into(),
        )
    };
    match address {
        "probe.fabric_up" => n1.on(
            &["fabric-ready"],
            Answer::Exit(1, String::new(), "not yet".into()),
        ),
        "network.a (fabric check)" => n1.on(
            &[
                "ping", "-M", "do", "-s", "8972", "-c", "2", "-i", "0.2", "-W", "2", "-I", "eth1",
            ],
            Answer::Exit(1, "100% packet loss".into(), String::new()),
        ),
        "network.b (fabric check)" => n1.on(
            &[
                "ping", "-M", "do", "-s", "8972", "-c", "2", "-i", "0.2", "-W", "2", "-I", "eth2",
            ],
            Answer::Exit(1, "100% packet loss".into(), String::new()),
        ),
        a => {
            let (net, node) = match a {
                "network.a.attach.n1" => ("10", n1),
                "network.a.attach.n2" => ("10", n2),
                "network.b.attach.n1" => ("20", n1),
                "network.b.attach.n2" => ("20", n2),
                other => panic!("no such step {other}"),
            };
            let last = if std::ptr::eq(node, n1) { "1" } else { "2" };
            node.on(
                &["ip", "addr", "replace", &format!("192.168.{net}.{last}/24")],
                fail(),
            );
        }
    }
}

#[tokio::test]
async fn a_failure_at_every_step_rolls_back_in_reverse_or_leaves_a_journal_the_next_plan_explains()
{
    // The order the 7 steps take one at a time.
    let order = {
        let bed = Bed::new(SEVEN);
        let (n1, n2) = two(&bed);
        run(&bed, vec![n1, n2], 1, true, CancellationToken::new())
            .await
            .started()
    };
    assert_eq!(order.len(), 7, "{order:?}");
    for (k, failing) in order.iter().enumerate() {
        // With rollback: everything done is undone, latest first, and the state is as before.
        let bed = Bed::new(SEVEN);
        let (n1, n2) = two(&bed);
        break_step(&n1, &n2, failing);
        let r = run(
            &bed,
            vec![n1.clone(), n2.clone()],
            1,
            true,
            CancellationToken::new(),
        )
        .await;
        assert!(!r.outcome.ok && r.outcome.rolled_back);
        assert_eq!(r.outcome.failures[0].0, *failing, "step {k}");
        assert_eq!(r.started(), order[..=k], "step {k}");
        let mut expected_undos: Vec<String> = order[..k]
            .iter()
            .filter(|a| !a.ends_with("(fabric check)"))
            .cloned()
            .collect();
        expected_undos.reverse();
        assert_eq!(
            r.undone(),
            expected_undos,
            "failing at step {k} ({failing})"
        );
        assert!(
            r.outcome.undo_failures.is_empty(),
            "{:?}",
            r.outcome.undo_failures
        );
        assert!(
            bed.state().resources.is_empty(),
            "step {k}: {:?}",
            bed.state().resources.keys()
        );
        for h in [&n1, &n2] {
            for i in h.interfaces() {
                assert_eq!((i.mtu, i.addresses.len()), (1500, 0), "step {k}: {i:?}");
            }
        }

        // Without rollback: the journal records exactly the resource steps done, and the next
        // plan creates the rest and nothing else.
        let bed = Bed::new(SEVEN);
        let (n1, n2) = two(&bed);
        break_step(&n1, &n2, failing);
        let r = run(
            &bed,
            vec![n1.clone(), n2.clone()],
            1,
            false,
            CancellationToken::new(),
        )
        .await;
        assert!(!r.outcome.ok && !r.outcome.rolled_back);
        let recorded: Vec<String> = bed.state().resources.keys().cloned().collect();
        let mut done: Vec<String> = order[..k]
            .iter()
            .filter(|a| !a.ends_with("(fabric check)"))
            .cloned()
            .collect();
        done.sort();
        assert_eq!(recorded, done, "step {k}");
        let next = bed.plan();
        for c in &next.changes {
            let want = if done.contains(&c.address) {
                Action::NoOp
            } else if c.address.starts_with("probe.") {
                Action::Run
            } else {
                Action::Create
            };
            assert_eq!(c.action, want, "step {k}: {}", c.address);
        }
        // The next apply, on the same machines without the fault, does only the rest.
        let healed: Vec<Arc<FakeHost>> = [&n1, &n2]
            .iter()
            .map(|old| {
                let mut h = FakeHost::new(sparkform::hosts::Host::node(old.as_ref()), &bed.world);
                for i in old.interfaces() {
                    let addrs: Vec<&str> = i.addresses.iter().map(String::as_str).collect();
                    h = h.interface(&i.name, i.mtu, &addrs);
                }
                h.on(
                    &["fabric-ready"],
                    Answer::Exit(0, "ok\n".into(), String::new()),
                );
                Arc::new(h)
            })
            .collect();
        let r = run(&bed, healed.clone(), 1, false, CancellationToken::new()).await;
        assert!(r.outcome.ok, "step {k}: {:?}", r.outcome.failures);
        assert!(
            !r.started().iter().any(|a| done.contains(a)),
            "step {k}: {:?}",
            r.started()
        );
        for h in &healed {
            for i in h.interfaces() {
                assert_eq!((i.mtu, i.addresses.len()), (9000, 1), "step {k}: {i:?}");
            }
        }
    }
}

#[tokio::test]
async fn a_node_that_disappears_fails_its_step_and_keeps_what_could_not_be_undone() {
    let bed = Bed::new(SEVEN);
    let (n1, n2) = two(&bed);
    // n2's 4th command: after its first attachment (find, replace, mtu) is done.
    n2.disappear_at(4);
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        1,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(!r.outcome.ok);
    let (failed, e) = &r.outcome.failures[0];
    assert!(
        failed.ends_with("n2") || failed.contains("fabric check"),
        "{failed}"
    );
    assert!(
        e.render().contains("connection was lost") || e.render().contains("stopped answering"),
        "{}",
        e.render()
    );
    // n1's steps were undone; n2's done step could not be, and the state still says so.
    let kept: Vec<String> = bed.state().resources.keys().cloned().collect();
    let undo_failed: Vec<String> = r
        .outcome
        .undo_failures
        .iter()
        .map(|(a, _)| a.clone())
        .collect();
    assert!(!undo_failed.is_empty());
    assert_eq!(kept, undo_failed);
    assert!(kept.iter().all(|a| a.ends_with(".n2")), "{kept:?}");
    for i in n1.interfaces() {
        assert_eq!((i.mtu, i.addresses.len()), (1500, 0), "{i:?}");
    }
}

#[tokio::test]
async fn cancel_during_a_step_stops_it_and_rolls_back() {
    let bed = Bed::new(&SEVEN.replace("timeout    = \"2s\"", "timeout    = \"10m\""));
    let (n1, n2) = two(&bed);
    n1.on(
        &["fabric-ready"],
        Answer::Exit(1, String::new(), "not yet".into()),
    );
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let world = bed.world.clone();
    tokio::spawn(async move {
        // Once the probe is being retried, press Ctrl-C.
        while !world.log().iter().any(|l| l.contains("fabric-ready")) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        c.cancel();
    });
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        run(&bed, vec![n1.clone(), n2.clone()], 4, true, cancel),
    )
    .await
    .expect("a cancelled apply returns instead of waiting for the probe's 10 minutes");
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    assert!(r.events.iter().any(|e| matches!(e, Event::Stopping { .. })));
    assert_eq!(r.undone().len(), 4, "{:?}", r.undone());
    assert!(bed.state().resources.is_empty());
}

#[tokio::test]
async fn a_step_that_panics_is_a_failure_of_that_step_and_the_rest_is_rolled_back() {
    let bed = Bed::new(SEVEN);
    let (n1, n2) = two(&bed);
    n2.on(&["ip", "addr", "replace", "192.168.20.2/24"], Answer::Panic);
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    let (failed, e) = &r.outcome.failures[0];
    assert_eq!(failed, "network.b.attach.n2");
    assert!(e.message.contains("panicked"), "{}", e.message);
    assert!(r.events.iter().any(
        |e| matches!(e, Event::StepFailed { address, .. } if address == "network.b.attach.n2")
    ));
    assert!(bed.state().resources.is_empty());
}

#[tokio::test]
async fn rollback_puts_back_only_what_the_apply_took_off() {
    // Applied once: network.a.attach.n1 holds 192.168.10.1 on eth1, next to 192.168.10.50
    // that someone else put there.
    let mut bed = Bed::new(SEVEN);
    let n1 = Arc::new(
        FakeHost::new("node.n1", &bed.world)
            .interface("eth1", 1500, &["192.168.10.50/24"])
            .interface("eth2", 1500, &[]),
    );
    n1.on(
        &["fabric-ready"],
        Answer::Exit(0, "ok\n".into(), String::new()),
    );
    let n2 = Arc::new(bed.node("node.n2"));
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        4,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);

    // The address moves to .3 and the probe fails, so the move is rolled back; meanwhile the
    // owner of .50 takes it off.
    bed.rewrite(&SEVEN.replace("192.168.10.1\"", "192.168.10.3\""));
    n1.on(
        &["fabric-ready"],
        Answer::Exit(1, String::new(), "not yet".into()),
    );
    let world = bed.world.clone();
    let other = n1.clone();
    let owner = tokio::spawn(async move {
        while world
            .log()
            .iter()
            .filter(|l| l.contains("fabric-ready"))
            .count()
            < 2
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        other.remove_address("eth1", "192.168.10.50/24");
    });
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        4,
        true,
        CancellationToken::new(),
    )
    .await;
    owner.await.unwrap();
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    assert!(
        r.outcome.undo_failures.is_empty(),
        "{:?}",
        r.outcome.undo_failures
    );
    let eth1 = n1
        .interfaces()
        .into_iter()
        .find(|i| i.name == "eth1")
        .unwrap();
    // .1, which this apply took off, is back; .3 is gone; .50, which it did not touch, stays
    // off.
    assert_eq!(eth1.addresses, ["192.168.10.1/24"], "{eth1:?}");
    assert_eq!(eth1.mtu, 9000);
}

// ----- containers, on a fake Docker Engine (`sparkform_testkit::fake_docker`) -----

use sparkform_testkit::fake_docker::{FakeDocker, Fault};

/// A network on two nodes (2 attachments, its fabric check), the containers' node parity
/// check, a head container after the network, a worker after the head, and a probe in the
/// head after the worker: 7 steps.
fn serving() -> String {
    include_str!("../fixtures/serving/main.hcl").replace("PROBE_TIMEOUT", "2s")
}

/// Two fake nodes, each with its fake Docker Engine.
fn two_with_docker(
    bed: &Bed,
) -> (
    Arc<FakeHost>,
    Arc<FakeHost>,
    Arc<FakeDocker>,
    Arc<FakeDocker>,
) {
    let d1 = Arc::new(FakeDocker::start().unwrap());
    let d2 = Arc::new(FakeDocker::start().unwrap());
    (
        Arc::new(bed.node("node.n1").docker_engine(d1.clone())),
        Arc::new(bed.node("node.n2").docker_engine(d2.clone())),
        d1,
        d2,
    )
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

#[tokio::test]
async fn containers_start_on_the_fake_engine_labelled_and_ready() {
    let bed = Bed::new(&serving());
    let (n1, n2, d1, d2) = two_with_docker(&bed);
    let r = run(&bed, vec![n1, n2], 1, true, CancellationToken::new()).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    assert_eq!(r.done().len(), 7, "{:?}", r.done());
    assert_eq!(running(&d1), ["head"]);
    assert_eq!(running(&d2), ["worker"]);
    let head = d1.container("head").unwrap();
    assert_eq!(
        head.labels.get("sparkform.address").map(String::as_str),
        Some("container.head")
    );
    assert_eq!(
        head.labels.get("sparkform.lineage"),
        Some(&bed.state().lineage)
    );
    // The ready check and the probe ran in the head.
    assert!(
        d1.requests()
            .iter()
            .filter(|r| r.starts_with("POST /exec/"))
            .count()
            >= 2
    );
    assert!(!bed.plan().has_changes());
}

/// Make the step at `address` of [`serving`] fail.
fn break_serving(n1: &FakeHost, n2: &FakeHost, d1: &FakeDocker, d2: &FakeDocker, address: &str) {
    let fail = || {
        Answer::Exit(
            2,
            String::new(),
            "RTNETLINK answers: Operation not permitted".into(),
        )
    };
    match address {
        "network.a.attach.n1" => n1.on(&["ip", "addr", "replace", "192.168.10.1/24"], fail()),
        "network.a.attach.n2" => n2.on(&["ip", "addr", "replace", "192.168.10.2/24"], fail()),
        "network.a (fabric check)" => n1.on(
            &["ping", "-M", "do", "-s", "8972"],
            Answer::Exit(1, "100% packet loss".into(), String::new()),
        ),
        "container.head" => d1.fault("head", Fault::CreateFails("no space left on device".into())),
        "containers (node parity)" => d2.image("ray:1", "sha256:another-build"),
        "container.worker" => d2.fault(
            "worker",
            Fault::CreateFails("no space left on device".into()),
        ),
        "probe.serving" => d1.fault(
            "head",
            Fault::ExecExits(
                "curl".into(),
                7,
                "curl: (7) Failed to connect to localhost port 8000".into(),
            ),
        ),
        other => panic!("no such step {other}"),
    }
}

/// The checks (`network.a (fabric check)`, `containers (node parity)`) record and undo nothing.
fn is_check(address: &str) -> bool {
    address.ends_with(')')
}

fn names(d: &FakeDocker) -> Vec<String> {
    let mut v: Vec<String> = d.containers().into_iter().map(|c| c.name).collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_failure_at_every_step_with_containers_rolls_back_in_reverse_or_leaves_a_journal() {
    let order = {
        let bed = Bed::new(&serving());
        let (n1, n2, _d1, _d2) = two_with_docker(&bed);
        run(&bed, vec![n1, n2], 1, true, CancellationToken::new())
            .await
            .started()
    };
    assert_eq!(order.len(), 7, "{order:?}");
    let containers = ["container.head", "container.worker"];
    for (k, failing) in order.iter().enumerate() {
        // With rollback: what was done is undone, latest first; no container is left.
        let bed = Bed::new(&serving());
        let (n1, n2, d1, d2) = two_with_docker(&bed);
        break_serving(&n1, &n2, &d1, &d2, failing);
        let r = run(
            &bed,
            vec![n1.clone(), n2.clone()],
            1,
            true,
            CancellationToken::new(),
        )
        .await;
        assert!(!r.outcome.ok && r.outcome.rolled_back, "step {k}");
        assert_eq!(r.outcome.failures[0].0, *failing, "step {k}");
        assert_eq!(r.started(), order[..=k], "step {k}");
        let mut expected: Vec<String> = order[..k]
            .iter()
            .filter(|a| !is_check(a))
            .cloned()
            .collect();
        expected.reverse();
        assert_eq!(r.undone(), expected, "failing at step {k} ({failing})");
        assert!(
            r.outcome.undo_failures.is_empty(),
            "{:?}",
            r.outcome.undo_failures
        );
        assert!(bed.state().resources.is_empty(), "step {k}");
        assert!(
            names(&d1).is_empty() && names(&d2).is_empty(),
            "step {k}: {:?} {:?}",
            names(&d1),
            names(&d2)
        );
        for i in n1.interfaces().iter().chain(n2.interfaces().iter()) {
            assert_eq!((i.mtu, i.addresses.len()), (1500, 0), "step {k}: {i:?}");
        }

        // Without rollback: the journal records the resource steps done; the containers it
        // records run; the next plan creates the rest; the next apply does only the rest.
        let bed = Bed::new(&serving());
        let (n1, n2, d1, d2) = two_with_docker(&bed);
        break_serving(&n1, &n2, &d1, &d2, failing);
        let r = run(
            &bed,
            vec![n1.clone(), n2.clone()],
            1,
            false,
            CancellationToken::new(),
        )
        .await;
        assert!(!r.outcome.ok && !r.outcome.rolled_back);
        let recorded: Vec<String> = bed.state().resources.keys().cloned().collect();
        let mut done: Vec<String> = order[..k]
            .iter()
            .filter(|a| !is_check(a))
            .cloned()
            .collect();
        done.sort();
        assert_eq!(recorded, done, "step {k}");
        let up: Vec<String> = running(&d1)
            .into_iter()
            .chain(running(&d2))
            .map(|n| format!("container.{n}"))
            .collect();
        let mut want_up: Vec<String> = done
            .iter()
            .filter(|a| containers.contains(&a.as_str()))
            .cloned()
            .collect();
        want_up.sort();
        let mut up_sorted = up.clone();
        up_sorted.sort();
        assert_eq!(up_sorted, want_up, "step {k}");
        for c in &bed.plan().changes {
            let want = if done.contains(&c.address) {
                Action::NoOp
            } else if c.address.starts_with("probe.") {
                Action::Run
            } else {
                Action::Create
            };
            assert_eq!(c.action, want, "step {k}: {}", c.address);
        }
        d1.heal();
        d2.heal();
        let healed: Vec<Arc<FakeHost>> = [(&n1, &d1), (&n2, &d2)]
            .iter()
            .map(|(old, d)| {
                let mut h = FakeHost::new(sparkform::hosts::Host::node(old.as_ref()), &bed.world);
                for i in old.interfaces() {
                    let addrs: Vec<&str> = i.addresses.iter().map(String::as_str).collect();
                    h = h.interface(&i.name, i.mtu, &addrs);
                }
                Arc::new(h.docker_engine((*d).clone()))
            })
            .collect();
        let r = run(&bed, healed, 1, false, CancellationToken::new()).await;
        assert!(r.outcome.ok, "step {k}: {:?}", r.outcome.failures);
        assert!(
            !r.started().iter().any(|a| done.contains(a)),
            "step {k}: {:?}",
            r.started()
        );
        assert_eq!(running(&d1), ["head"], "step {k}");
        assert_eq!(running(&d2), ["worker"], "step {k}");
    }
}

#[tokio::test]
async fn a_failed_replacement_renames_the_previous_containers_back_and_starts_them() {
    let mut bed = Bed::new(&serving());
    let (n1, n2, d1, d2) = two_with_docker(&bed);
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let before: Vec<_> = d1.containers().into_iter().chain(d2.containers()).collect();

    // A new image for every container: head and worker are replaced, the probe runs after
    // them and fails.
    bed.rewrite(&serving().replace("ray:1", "ray:2"));
    d1.fault(
        "head",
        Fault::ExecExits("curl".into(), 7, "curl: (7) Failed to connect".into()),
    );
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    assert_eq!(r.outcome.failures[0].0, "probe.serving");
    // The head is undone last: the worker depends on it.
    assert_eq!(r.undone(), ["container.worker", "container.head"]);
    assert!(
        r.outcome.undo_failures.is_empty(),
        "{:?}",
        r.outcome.undo_failures
    );
    // The very containers of before, by id, under their names, running; nothing set aside.
    let after: Vec<_> = d1.containers().into_iter().chain(d2.containers()).collect();
    assert_eq!(after.len(), before.len(), "{after:#?}");
    for b in &before {
        let a = after
            .iter()
            .find(|a| a.id == b.id)
            .expect("the previous container is kept");
        assert_eq!((&a.name, &a.image, a.running), (&b.name, &b.image, true));
    }
    // The state still records them: nothing to do for the old definitions.
    bed.rewrite(&serving());
    assert!(!bed.plan().has_changes());
}

#[tokio::test]
async fn a_container_that_never_becomes_ready_fails_at_its_timeout_with_its_log_lines() {
    let bed = Bed::new(&serving());
    let (n1, n2, d1, _d2) = two_with_docker(&bed);
    d1.fault("head", Fault::NeverReady);
    let started = std::time::Instant::now();
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    let (failed, e) = &r.outcome.failures[0];
    assert_eq!(failed, "container.head");
    assert!(
        e.message.contains("was not ready after 2 s"),
        "{}",
        e.message
    );
    assert!(e.message.contains("exec ray status"), "{}", e.message);
    assert!(
        e.details.iter().any(|l| l.contains("head started")),
        "{:?}",
        e.details
    );
    assert!(names(&d1).is_empty(), "{:?}", names(&d1));
    assert!(bed.state().resources.is_empty());

    // One that exits right after it starts fails at once, with what it logged.
    let bed = Bed::new(&serving());
    let (n1, n2, d1, _d2) = two_with_docker(&bed);
    d1.fault(
        "head",
        Fault::ExitsAfterStart(1, vec!["ValueError: model not found".into()]),
    );
    let r = run(&bed, vec![n1, n2], 2, true, CancellationToken::new()).await;
    let (failed, e) = &r.outcome.failures[0];
    assert_eq!(failed, "container.head");
    assert!(
        e.message.contains("exited with code 1 before it was ready"),
        "{}",
        e.message
    );
    assert_eq!(e.details, ["ValueError: model not found"]);
    assert!(names(&d1).is_empty());
}

#[tokio::test]
async fn a_warn_on_log_line_is_reported_once_and_the_start_goes_on() {
    let hcl = serving().replacen(
        "    exec     = [\"ray\", \"status\"]\n    timeout  = \"2s\"",
        "    exec     = [\"ray\", \"status\"]\n    warn_on_log = { \"NET/Socket : Using\" = \"NCCL runs over TCP sockets, not RoCE\" }\n    timeout  = \"2s\"",
        1,
    );
    assert_ne!(hcl, serving());
    let bed = Bed::new(&hcl);
    let (n1, n2, d1, _d2) = two_with_docker(&bed);
    // NCCL's line when it falls back to sockets (NCCL_DEBUG=INFO).
    d1.fault(
        "head",
        Fault::Logs(vec![
            "spark1:812:901 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.10.1<0>".into(),
        ]),
    );
    let r = run(&bed, vec![n1, n2], 2, true, CancellationToken::new()).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let warnings: Vec<(&str, &str, &str)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StepWarning {
                address,
                message,
                help,
            } => Some((address.as_str(), message.as_str(), help.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "container.head");
    assert!(warnings[0].1.contains("NET/Socket : Using"), "{warnings:?}");
    assert_eq!(warnings[0].2, "NCCL runs over TCP sockets, not RoCE");
}

/// What NCCL chose, read from the log once the container is ready (`record_from_log`):
/// recorded with the container and shown by `status`, per host, each value once.
#[tokio::test]
async fn record_from_log_keeps_what_the_log_said_at_ready_and_status_shows_it() {
    let hcl = serving().replacen(
        "    exec     = [\"ray\", \"status\"]\n    timeout  = \"2s\"",
        "    exec     = [\"ray\", \"status\"]\n    record_from_log = { nccl_net = \"([\\\\w.-]+):\\\\d+:\\\\d+ \\\\[\\\\d+\\\\] NCCL INFO (NET/(?:IB|Socket) : Using [^;]*)\" }\n    timeout  = \"2s\"",
        1,
    );
    assert_ne!(hcl, serving());
    let bed = Bed::new(&hcl);
    let (n1, n2, d1, _d2) = two_with_docker(&bed);
    d1.fault(
        "head",
        Fault::Logs(vec![
            "spark1:812:901 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.10.1<0>".into(),
            "(RayWorkerWrapper pid=2211, ip=192.168.10.2) spark2:2211:2290 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.10.2<0>".into(),
            "spark1:812:901 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.10.1<0>".into(),
        ]),
    );
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let want = serde_json::json!({"nccl_net": [
        "spark1 NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]",
        "spark2 NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]",
    ]});
    let state = bed.state();
    assert_eq!(
        state.resources["container.head"].attributes["from_log"],
        want
    );
    assert!(!state.resources["container.worker"]
        .attributes
        .contains_key("from_log"));
    let fakes = sparkform_testkit::fake::FakeNodes::new(
        [n1, n2]
            .into_iter()
            .map(|h| {
                let node = sparkform::hosts::Host::node(h.as_ref()).to_string();
                (node, h as Arc<dyn sparkform::hosts::Host>)
            })
            .collect(),
    );
    let hosts = HostOptions {
        opener: fakes.opener(),
        ..HostOptions::default()
    };
    let status = sparkform::ops::status::status(&bed.config, &state, &hosts).await;
    let head = status
        .resources
        .iter()
        .find(|r| r.address == "container.head")
        .expect("the head's status");
    assert_eq!(serde_json::json!(head.from_log), want);
}

/// The serving fixture with the worker's start needing `gib` GiB free on both nodes, the
/// weights' page cache dropped on n2 first, waiting at most `timeout` s.
fn needing_memory(gib: u32, timeout: u32) -> String {
    let hcl = serving().replacen(
        "  depends_on = [container.head]\n",
        &format!("  depends_on = [container.head]\n  memory = [\n    {{ node = node.n1, min_free_gib = {gib}, timeout = {timeout} }},\n    {{ node = node.n2, min_free_gib = {gib}, drop_page_cache = [\"/data/hf/snapshots/abc\"], timeout = {timeout} }},\n  ]\n"),
        1,
    );
    assert_ne!(hcl, serving());
    hcl
}

fn meminfo(free_gib: u64) -> Answer {
    Answer::Exit(
        0,
        format!(
            "MemTotal:       125410000 kB\nMemFree:        {} kB\n",
            free_gib * 1024 * 1024
        ),
        String::new(),
    )
}

/// A start on unified memory waits until each node it needs has the memory free (an old engine
/// releasing it), after the weights' page cache was dropped there.
#[tokio::test]
async fn a_start_waits_for_the_memory_it_needs_on_each_node_after_dropping_the_page_cache() {
    let bed = Bed::new(&needing_memory(90, 30));
    let (n1, n2, _d1, d2) = two_with_docker(&bed);
    n1.on(&["cat", "/proc/meminfo"], meminfo(110));
    n2.on(&["cat", "/proc/meminfo"], meminfo(40));
    n2.on(&["find"], Answer::Exit(0, String::new(), String::new()));
    let releasing = n2.clone();
    let released = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        releasing.on(&["cat", "/proc/meminfo"], meminfo(100));
    });
    let r = run(&bed, vec![n1, n2], 2, true, CancellationToken::new()).await;
    released.await.unwrap();
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    assert_eq!(running(&d2), ["worker"]);
    let waited: Vec<&String> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::StepProgress {
                address, message, ..
            } if address == "container.worker" => Some(message),
            _ => None,
        })
        .filter(|m| m.starts_with("waiting for 90.0 GiB free on node.n2 (40.0 GiB free)"))
        .collect();
    assert!(!waited.is_empty(), "{:?}", r.events);
    let log = bed.world.log();
    let dropped = position(
        &log,
        "node.n2: find -L /data/hf/snapshots/abc -type f -exec dd 'if={}' iflag=nocache count=0 status=none ';'",
    );
    // The free memory is read again after the cache is dropped.
    assert!(
        log[dropped..]
            .iter()
            .any(|l| l == "node.n2: cat /proc/meminfo"),
        "{log:#?}"
    );
}

/// A destroyed container that needed nodes' memory reports what each node has free once it
/// stopped.
#[tokio::test]
async fn a_removed_container_that_needed_memory_reports_what_each_node_has_free() {
    let hcl = needing_memory(90, 30);
    let mut bed = Bed::new(&hcl);
    let (n1, n2, _d1, d2) = two_with_docker(&bed);
    n1.on(&["cat", "/proc/meminfo"], meminfo(110));
    n2.on(&["cat", "/proc/meminfo"], meminfo(100));
    n2.on(&["find"], Answer::Exit(0, String::new(), String::new()));
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let start = hcl.find("container \"worker\" {").expect("the worker");
    let end = start + hcl[start..].find("\n}\n").expect("its end") + 3;
    let without = format!("{}{}", &hcl[..start], &hcl[end..]).replace(
        "depends_on = [container.worker]",
        "depends_on = [container.head]",
    );
    bed.rewrite(&without);
    n2.on(&["cat", "/proc/meminfo"], meminfo(118));
    let r = run(&bed, vec![n1, n2], 2, true, CancellationToken::new()).await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let summary = r
        .events
        .iter()
        .find_map(|e| match e {
            Event::StepDone {
                address, summary, ..
            } if address == "container.worker" => Some(summary.clone()),
            _ => None,
        })
        .expect("the worker's delete");
    assert_eq!(
        summary,
        "stopped worker; removed once every step has succeeded; node.n1 has 110.0 GiB free; node.n2 has 118.0 GiB free"
    );
    assert!(d2.container("worker").is_none_or(|c| !c.running));
}

/// Memory that is never released fails the start in time, naming the figures and what the GPU
/// holds, and the apply rolls back.
#[tokio::test]
async fn memory_that_is_never_released_fails_the_start_naming_what_holds_it() {
    let bed = Bed::new(&needing_memory(90, 1));
    let (n1, n2, _d1, d2) = two_with_docker(&bed);
    n1.on(&["cat", "/proc/meminfo"], meminfo(110));
    n2.on(&["cat", "/proc/meminfo"], meminfo(40));
    n2.on(&["find"], Answer::Exit(0, String::new(), String::new()));
    n2.on(
        &[
            "nvidia-smi",
            "--query-compute-apps=pid,process_name,used_memory",
        ],
        Answer::Exit(
            0,
            "4242, VLLM::EngineCore, 61440 MiB\n".into(),
            String::new(),
        ),
    );
    let r = run(&bed, vec![n1, n2], 2, true, CancellationToken::new()).await;
    assert!(!r.outcome.ok);
    let (failed, e) = &r.outcome.failures[0];
    assert_eq!(failed, "container.worker");
    assert_eq!(
        e.message,
        "node.n2: 40.0 GiB of memory free after 1 s, worker needs 90.0 GiB; the GPU's memory is held by: 4242, VLLM::EngineCore, 61440 MiB"
    );
    assert!(running(&d2).is_empty(), "never created");
}

#[tokio::test]
async fn cancel_while_a_container_waits_to_be_ready_rolls_back() {
    let bed = Bed::new(&serving().replacen("timeout  = \"2s\"", "timeout  = \"10m\"", 1));
    let (n1, n2, d1, d2) = two_with_docker(&bed);
    d1.fault("head", Fault::NeverReady);
    let cancel = CancellationToken::new();
    let (c, engine) = (cancel.clone(), d1.clone());
    tokio::spawn(async move {
        // Once the head's ready check has failed, press Ctrl-C.
        while !engine
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /exec/"))
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        c.cancel();
    });
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        run(&bed, vec![n1, n2], 2, true, cancel),
    )
    .await
    .expect("a cancelled apply returns instead of waiting 10 minutes");
    assert!(!r.outcome.ok && r.outcome.rolled_back);
    assert!(r.events.iter().any(|e| matches!(e, Event::Stopping { .. })));
    // An interrupted step is stopped, not failed.
    assert!(r.outcome.interrupted && r.outcome.failures.is_empty());
    assert_eq!(r.outcome.stopped, ["container.head"]);
    assert!(names(&d1).is_empty() && names(&d2).is_empty());
    assert!(bed.state().resources.is_empty());
}

#[tokio::test]
async fn an_engine_that_disappears_fails_the_step_on_its_node() {
    let bed = Bed::new(&serving());
    let (n1, n2, _d1, d2) = two_with_docker(&bed);
    // The worker's engine answers the parity check (version, image) and the worker's step
    // (version, image), then goes away (at the lookup of a container by the worker's name,
    // which the machine takes as "none").
    d2.disappear_at(5);
    let r = run(&bed, vec![n1, n2], 1, true, CancellationToken::new()).await;
    assert!(!r.outcome.ok);
    let (failed, e) = &r.outcome.failures[0];
    assert_eq!(failed, "container.worker");
    assert!(
        e.render()
            .starts_with("node.n2: cannot create container worker: the node was lost: the connection to it broke"),
        "{}",
        e.render()
    );
    assert!(e.render().contains("run apply again"), "{}", e.render());
    assert!(
        r.undone().contains(&"container.head".to_string()),
        "{:?}",
        r.undone()
    );
}

#[tokio::test]
async fn refresh_on_fake_nodes_finds_an_untracked_container_and_a_drifted_one() {
    let bed = Bed::new(&serving());
    let (n1, n2, d1, d2) = two_with_docker(&bed);
    let r = run(
        &bed,
        vec![n1.clone(), n2.clone()],
        2,
        true,
        CancellationToken::new(),
    )
    .await;
    assert!(r.outcome.ok, "{:?}", r.outcome.failures);
    let state = bed.state();
    let hosts = || {
        vec![
            (
                "node.n1".to_string(),
                n1.clone() as Arc<dyn sparkform::hosts::Host>,
            ),
            (
                "node.n2".to_string(),
                n2.clone() as Arc<dyn sparkform::hosts::Host>,
            ),
        ]
    };
    let seen = sparkform::observe::observe_hosts(&state, hosts())
        .await
        .unwrap();
    assert!(seen.orphans.is_empty(), "{:?}", seen.orphans);
    assert!(
        seen.resources.values().all(|o| *o == plan::Drift::InSync),
        "{:?}",
        seen.resources
    );

    // An interrupted run left a labelled head on n1; someone stopped the worker on n2.
    d1.add(
        "head-sparkform-old-123456789abc",
        "ray:1",
        &[
            ("sparkform.lineage", &state.lineage),
            ("sparkform.address", "container.head"),
        ],
        false,
    );
    d2.stop("worker");
    let seen = sparkform::observe::observe_hosts(&state, hosts())
        .await
        .unwrap();
    assert_eq!(seen.orphans.len(), 1, "{:?}", seen.orphans);
    assert_eq!(
        (
            seen.orphans[0].node.as_str(),
            seen.orphans[0].address.as_str()
        ),
        ("node.n1", "container.head")
    );
    assert!(
        matches!(
            seen.resources.get("container.worker"),
            Some(plan::Drift::Drifted(_))
        ),
        "{:?}",
        seen.resources
    );
    assert_eq!(
        seen.resources.get("container.head"),
        Some(&plan::Drift::InSync)
    );
    // The plan with what refresh saw replaces the worker and explains the untracked one.
    let p = plan::plan(
        &bed.config,
        &bed.graph,
        &state,
        &PlanOptions {
            observations: Some(seen),
            ..PlanOptions::default()
        },
    )
    .unwrap();
    let worker = p
        .changes
        .iter()
        .find(|c| c.address == "container.worker")
        .unwrap();
    assert_eq!(worker.action, Action::Replace);
}

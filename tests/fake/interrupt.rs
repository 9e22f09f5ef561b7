//! How an apply ends when it is interrupted or fails, on fake nodes: a Ctrl-C (the cancel token)
//! is an interruption, not a failure of the step it stopped, and the counts the progress prints
//! (steps to roll back, steps rolled back) agree. No Docker, no ssh.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::events::Event;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::plan::{self, PlanOptions};
use sparkform::state::StateStore;
use sparkform_testkit::fake::{Answer, FakeHost, FakeWorld};
use tokio_util::sync::CancellationToken;

/// Two networks of one attachment each on two nodes (4 attachments, 2 fabric checks), then a
/// probe: the checks complete but have nothing to undo, which is what the counts got wrong.
fn config(probe_timeout: &str) -> String {
    let mut s = String::from(
        "node \"n1\" { address = \"10.0.0.1\" }\nnode \"n2\" { address = \"10.0.0.2\" }\n",
    );
    for (net, third, iface) in [("a", 10, "eth1"), ("b", 20, "eth2")] {
        s.push_str(&format!(
            "network \"{net}\" {{\n  subnet = \"192.168.{third}.0/24\"\n  mtu = 9000\n"
        ));
        for n in [1, 2] {
            s.push_str(&format!(
                "  attach \"n{n}\" {{\n    node = node.n{n}\n    interface = \"{iface}\"\n    address = \"192.168.{third}.{n}\"\n  }}\n"
            ));
        }
        s.push_str("}\n");
    }
    s.push_str(&format!(
        "probe \"up\" {{\n  timeout = \"{probe_timeout}\"\n  interval = \"1s\"\n  depends_on = [network.a, network.b]\n  exec {{\n    node = node.n1\n    command = [\"fabric-ready\"]\n  }}\n}}\n"
    ));
    s
}

struct Run {
    outcome: ApplyOutcome,
    events: Vec<Event>,
    world: Arc<FakeWorld>,
}

/// Apply `hcl` from nothing on two fake nodes whose probe command never succeeds; cancel the
/// run (as Ctrl-C does) once the probe has been tried, when `interrupt`.
async fn run(hcl: &str, interrupt: bool) -> Run {
    let dir = common::write_config(&[("main.hcl", hcl)]);
    let (config, graph) = common::load(dir.path());
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    let state = store.load().unwrap().unwrap_or_default();
    let plan = plan::plan(&config, &graph, &state, &PlanOptions::default()).unwrap();
    let world = FakeWorld::new();
    let hosts: std::collections::BTreeMap<String, Arc<dyn Host>> = ["node.n1", "node.n2"]
        .into_iter()
        .map(|n| {
            let h = FakeHost::new(n, &world)
                .interface("eth1", 1500, &[])
                .interface("eth2", 1500, &[]);
            h.on(
                &["fabric-ready"],
                Answer::Exit(1, String::new(), "No such container: ray-head".into()),
            );
            (n.to_string(), Arc::new(h) as Arc<dyn Host>)
        })
        .collect();
    let cancel = CancellationToken::new();
    if interrupt {
        let c = cancel.clone();
        let w = world.clone();
        tokio::spawn(async move {
            while !w.log().iter().any(|l| l.contains("fabric-ready")) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c.cancel();
        });
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        apply(ApplyRequest {
            config: &config,
            graph: &graph,
            plan: &plan,
            store: &store,
            state,
            parallelism: 4,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(HostPool::from_hosts(hosts)),
            events: tx,
            cancel,
        }),
    )
    .await
    .expect("the apply ends instead of waiting for the probe");
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    assert!(
        store
            .load()
            .unwrap()
            .unwrap_or_default()
            .resources
            .is_empty(),
        "everything was rolled back"
    );
    Run {
        outcome,
        events,
        world,
    }
}

impl Run {
    fn rollback_announced(&self) -> usize {
        self.events
            .iter()
            .find_map(|e| match e {
                Event::RollbackStarted { steps } => Some(*steps),
                _ => None,
            })
            .expect("a rollback")
    }
    fn undone(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::UndoDone { .. }))
            .count()
    }
    fn finished(&self) -> String {
        self.events
            .iter()
            .find_map(|e| match e {
                Event::Finished { summary, .. } => Some(summary.clone()),
                _ => None,
            })
            .expect("a last line")
    }
    fn completed_checks(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::StepDone { action, .. } if action == "check"))
            .count()
    }
}

#[tokio::test]
async fn ctrl_c_is_an_interruption_with_counts_that_agree() {
    let r = run(&config("10m"), true).await;
    let o = &r.outcome;
    assert!(!o.ok && o.interrupted && o.rolled_back);
    // The probe was stopped, not failed: nothing blames it.
    assert!(o.failures.is_empty(), "{:?}", o.failures);
    assert_eq!(o.stopped, ["probe.up"]);
    let probe_line = r
        .events
        .iter()
        .find_map(|e| match e {
            Event::StepStopped { address, at, .. } if address == "probe.up" => Some(at),
            _ => None,
        })
        .expect("the probe's last line");
    assert!(!probe_line.is_empty());
    assert!(
        !r.events
            .iter()
            .any(|e| matches!(e, Event::StepFailed { address, .. } if address == "probe.up")),
        "a stopped step is not reported as failed"
    );
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, Event::Stopping { reason } if reason == "interrupted")));
    // Six steps completed (four attachments, two fabric checks); the four attachments were
    // undone, and every count says four.
    assert_eq!(r.completed_checks(), 2);
    assert_eq!(r.rollback_announced(), 4);
    assert_eq!(r.undone(), 4);
    assert_eq!((o.undone, o.to_undo), (4, 4));
    assert_eq!(r.finished(), "interrupted; 4 steps rolled back");
    assert!(r.world.log().iter().any(|l| l.contains("fabric-ready")));
}

#[tokio::test]
async fn a_failing_probe_is_a_failure_and_counts_agree_too() {
    let r = run(&config("2s"), false).await;
    let o = &r.outcome;
    assert!(!o.ok && !o.interrupted && o.rolled_back);
    assert!(o.stopped.is_empty());
    assert_eq!(o.failures.len(), 1);
    assert_eq!(o.failures[0].0, "probe.up");
    assert!(
        o.failures[0].1.message.contains("No such container"),
        "{}",
        o.failures[0].1.message
    );
    assert_eq!(r.completed_checks(), 2);
    assert_eq!((r.rollback_announced(), r.undone()), (4, 4));
    assert_eq!(r.finished(), "failed; 4 steps rolled back");
}

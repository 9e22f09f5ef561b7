//! A probe's `soak`: once it passes it must keep passing for the duration, checked every
//! interval, or the apply fails and rolls back what it did; the plan's impact says how long.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common;

use sparkform::apply::{apply, ApplyOutcome, ApplyRequest};
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::state::State;
use sparkform_testkit::fake::{Answer, FakeHost, FakeWorld};

const DEFS: &str = r#"
node "n1" {
  address = "10.0.0.1"
}
network "a" {
  subnet = "192.168.10.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.10.1"
  }
}
probe "serving" {
  timeout    = "5s"
  interval   = "1s"
  depends_on = [network.a]
  exec {
    node    = node.n1
    command = ["serving"]
  }
  soak {
    duration = "4s"
    interval = "1s"
  }
}
"#;

/// Apply DEFS on a fake node whose check passes, then (after `fail_after`, if any) fails.
async fn run(fail_after: Option<Duration>) -> (ApplyOutcome, Duration) {
    let dir = common::write_config(&[("main.hcl", DEFS)]);
    let (c, g) = common::load(dir.path());
    let world = FakeWorld::new();
    let n1 = Arc::new(FakeHost::new("node.n1", &world).interface("eth1", 1500, &[]));
    n1.on(&["serving"], Answer::Exit(0, "ok\n".into(), String::new()));
    if let Some(after) = fail_after {
        let n = n1.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            n.on(
                &["serving"],
                Answer::Exit(1, String::new(), "EngineDeadError".into()),
            );
        });
    }
    let store = sparkform::state::StateStore::new(dir.path().join("state/sparkform.json"));
    let p = common::plan(&c, &g, &State::new());
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let hosts = [("node.n1".to_string(), n1.clone() as Arc<dyn Host>)];
    let start = Instant::now();
    let outcome = apply(ApplyRequest {
        config: &c,
        graph: &g,
        plan: &p,
        store: &store,
        state: State::new(),
        parallelism: 4,
        rollback: true,
        hosts: HostOptions::default(),
        pool: Some(HostPool::from_hosts(hosts.into_iter().collect())),
        events: tx,
        cancel: tokio_util::sync::CancellationToken::new(),
    })
    .await;
    (outcome, start.elapsed())
}

#[tokio::test]
async fn a_probe_that_keeps_passing_completes_the_apply_after_its_soak() {
    let (outcome, took) = run(None).await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert!(
        took >= Duration::from_secs(4),
        "the soak was not waited for: {took:?}"
    );
}

#[tokio::test]
async fn a_soak_that_fails_halfway_fails_the_apply_and_rolls_back() {
    let (outcome, _) = run(Some(Duration::from_millis(2200))).await;
    assert!(!outcome.ok);
    let (address, e) = &outcome.failures[0];
    assert_eq!(address, "probe.serving");
    assert!(
        e.message.contains("into its 4 s soak, after passing"),
        "{}",
        e.message
    );
    assert!(outcome.rolled_back, "the attachment was not rolled back");
    assert_eq!(outcome.undone, outcome.to_undo);
}

#[test]
fn the_plan_says_how_long_it_soaks() {
    let dir = common::write_config(&[("main.hcl", DEFS)]);
    let (c, g) = common::load(dir.path());
    let p = common::plan(&c, &g, &State::new());
    let impact = p.impact.clone().expect("an impact");
    assert_eq!(impact.soaks, [("probe.serving".to_string(), 4)]);
    let text = sparkform::plan::render::render(&p);
    assert!(
        text.contains("Soak: probe.serving must keep passing for 4.0 s after it passes"),
        "{text}"
    );
}

#[test]
fn a_soak_longer_than_its_interval_is_required() {
    let dir = common::write_config(&[(
        "main.hcl",
        &DEFS.replace("interval = \"1s\"\n  }", "interval = \"10s\"\n  }"),
    )]);
    let d = common::diagnostics(dir.path());
    assert!(d.contains("a soak of 4 s checked every 10 s"), "{d}");
}

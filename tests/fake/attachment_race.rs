//! Two attachments on one interface of a node (two fabric networks over one port) change at
//! once: each step reads the interface, changes its own address and puts back any other the
//! kernel dropped with it. Run in parallel, each would take the other's deletion for such a
//! loss and put it back; one change at a time per node, both addresses go.

use std::sync::Arc;
use std::time::Duration;

use crate::common;

use sparkform::apply::{apply, ApplyRequest};
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::state::State;
use sparkform_testkit::fake::{FakeHost, FakeWorld};

const DEFS: &str = r#"
node "n1" {
  address = "10.0.0.1"
}
network "a" {
  subnet = "192.168.10.0/24"
  mtu    = 1500
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.10.1"
  }
}
network "b" {
  subnet = "192.168.11.0/24"
  mtu    = 1500
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.11.1"
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_addresses_on_one_interface_are_both_removed_when_destroyed_at_once() {
    let dir = common::write_config(&[("main.hcl", DEFS)]);
    let (c, g) = common::load(dir.path());
    let world = FakeWorld::new();
    // Slow commands, so the two steps' reads and deletions interleave.
    let n1 = Arc::new(
        FakeHost::new("node.n1", &world)
            .interface("eth1", 1500, &[])
            .latency(Duration::from_millis(30)),
    );
    let store = sparkform::state::StateStore::new(dir.path().join("state/sparkform.json"));
    let run = |plan: sparkform::plan::Plan, state: State| {
        let (c, g, store, n1) = (&c, &g, &store, n1.clone());
        async move {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let hosts = [("node.n1".to_string(), n1 as Arc<dyn Host>)];
            apply(ApplyRequest {
                config: c,
                graph: g,
                plan: &plan,
                store,
                state,
                parallelism: 4,
                rollback: true,
                hosts: HostOptions::default(),
                pool: Some(HostPool::from_hosts(hosts.into_iter().collect())),
                events: tx,
                cancel: tokio_util::sync::CancellationToken::new(),
            })
            .await
        }
    };
    let created = run(common::plan(&c, &g, &State::new()), State::new()).await;
    assert!(created.ok, "{:?}", created.failures);
    let addresses = || {
        let mut a: Vec<String> = n1
            .interfaces()
            .into_iter()
            .flat_map(|i| i.addresses)
            .collect();
        a.sort();
        a
    };
    assert_eq!(addresses(), ["192.168.10.1/24", "192.168.11.1/24"]);
    let destroy =
        sparkform::ops::apply::plan_destroy(&c, &created.state, Vec::new(), Vec::new(), None)
            .unwrap();
    assert_eq!(destroy.summary.delete, 2);
    let destroyed = run(destroy, created.state.clone()).await;
    assert!(destroyed.ok, "{:?}", destroyed.failures);
    assert!(addresses().is_empty(), "{:?}", addresses());
}

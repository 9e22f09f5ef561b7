//! The operations as a library, without machines: preparing an apply from the definitions,
//! from a plan file, or a destroy; the lock it holds; why it refuses.

use crate::common;

use std::path::Path;

use sparkform::hosts::HostOptions;
use sparkform::ops::apply::{lock_and_plan, PlanRequest, PlanSource};
use sparkform::ops::{OpError, ReadMode};
use sparkform::plan::planfile::PlanFile;
use sparkform::plan::{self, Action, PlanOptions};
use sparkform::state::{State, StateStore};

fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("main.hcl"),
        r#"
node "n1" {
  address        = "10.0.0.1"
  gpus           = 1
  memory_gib     = 128
  unified_memory = true
}
node "n2" {
  address        = "10.0.0.2"
  gpus           = 1
  memory_gib     = 128
  unified_memory = true
}
network "fabric" {
  subnet = "192.168.1.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.1.1"
  }
  attach "n2" {
    node      = node.n2
    interface = "eth1"
    address   = "192.168.1.2"
  }
}
"#,
    )
    .unwrap();
    dir
}

fn store(dir: &Path) -> StateStore {
    StateStore::new(dir.join("state/sparkform.json"))
}

/// The definitions of `dir` as written, as a command loads them.
fn evaluated(dir: &Path) -> sparkform::ops::definitions::Evaluated {
    let ws = sparkform::workspace::Workspace::new(dir, None);
    sparkform::ops::definitions::load(&ws, &sparkform::config::VarInputs::default())
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn events() -> sparkform::events::Sender {
    tokio::sync::mpsc::unbounded_channel().0
}

#[tokio::test]
async fn prepare_plans_from_the_definitions_and_holds_the_lock_until_dropped() {
    let dir = folder();
    let prepared = lock_and_plan(
        PlanRequest {
            evaluated: evaluated(dir.path()),
            lockfile_readonly: false,
            store: store(dir.path()),
            source: PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
            },
            hosts: HostOptions::default(),
        },
        &events(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    // No state yet and the nodes set their facts: nothing to refresh or read, so no machine
    // was asked.
    assert_eq!(prepared.plan.summary.create, 2);
    let second = store(dir.path()).lock("apply");
    assert!(second.is_err(), "the prepared apply holds the lock");
    drop(prepared);
    assert!(store(dir.path()).lock("apply").is_ok());
}

#[tokio::test]
async fn a_plan_file_is_refused_when_the_definitions_changed_or_the_state_moved() {
    let dir = folder();
    let (config, graph) = common::load(dir.path());
    let p = plan::plan(
        &config,
        &graph,
        &State::new(),
        &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
    )
    .unwrap();
    let file = PlanFile::new(p, dir.path(), store(dir.path()).path(), None);
    let path = dir.path().join("tb.plan");

    // The definitions change: the attachment of n2 gets another address.
    let text = std::fs::read_to_string(dir.path().join("main.hcl")).unwrap();
    std::fs::write(
        dir.path().join("main.hcl"),
        text.replace("192.168.1.2\"", "192.168.1.3\""),
    )
    .unwrap();
    let request = |file| PlanRequest {
        evaluated: evaluated(dir.path()),
        lockfile_readonly: false,
        store: store(dir.path()),
        source: PlanSource::PlanFile { file, path: &path },
        hosts: HostOptions::default(),
    };
    match lock_and_plan(request(&file), &events()).await {
        Err(OpError::DefinitionsChanged(a)) => assert_eq!(a, "network.fabric.attach.n2"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("a stale plan file was accepted"),
    }

    // The state moves on after the plan was made (checked before the definitions).
    let mut s = State::new();
    store(dir.path()).write(&mut s).unwrap();
    match lock_and_plan(request(&file), &events()).await {
        Err(OpError::PlanFile(e)) => assert!(e.to_string().contains("tb.plan"), "{e}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("a plan made without a state was accepted over one"),
    }
}

#[tokio::test]
async fn destroy_plans_the_removal_of_what_the_state_records() {
    let dir = folder();
    let (config, graph) = common::load(dir.path());
    let mut state = State::new();
    let p = plan::plan(
        &config,
        &graph,
        &state,
        &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
    )
    .unwrap();
    plan::record(&p, &mut state);
    store(dir.path()).write(&mut state).unwrap();
    let prepared = lock_and_plan(
        PlanRequest {
            evaluated: evaluated(dir.path()),
            lockfile_readonly: false,
            store: store(dir.path()),
            source: PlanSource::Destroy {
                targets: vec!["network.fabric.attach.n1".into()],
                exclude: Vec::new(),
                refresh: ReadMode::Recorded,
                purge_caches: false,
            },
            hosts: HostOptions::default(),
        },
        &events(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    let deletes: Vec<(&str, Action)> = prepared
        .plan
        .changes
        .iter()
        .map(|c| (c.address.as_str(), c.action))
        .collect();
    assert_eq!(deletes, [("network.fabric.attach.n1", Action::Delete)]);
}

#[tokio::test]
async fn an_unknown_target_is_a_config_error_and_a_locked_state_a_state_error() {
    let dir = folder();
    let request = |targets: Vec<String>| PlanRequest {
        evaluated: evaluated(dir.path()),
        lockfile_readonly: false,
        store: store(dir.path()),
        source: PlanSource::Definitions {
            refresh: ReadMode::Recorded,
            options: PlanOptions {
                targets,
                ..PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
            },
        },
        hosts: HostOptions::default(),
    };
    match lock_and_plan(request(vec!["network.fabric.attach.n9".into()]), &events()).await {
        Err(OpError::Config(d)) => {
            let text = sparkform::diag::render_plain(&d.0);
            assert!(text.contains("did you mean"), "{text}");
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("an unknown target was accepted"),
    }
    let _held = store(dir.path()).lock("apply").unwrap();
    assert!(matches!(
        lock_and_plan(request(Vec::new()), &events()).await,
        Err(OpError::State(_))
    ));
}

/// `ops::verify` reports what a probe said scrubbed of the definitions' sensitive values at the
/// source (its events and its results), not only where the UI draws them: a probe whose
/// command carries `Bearer ${var.api_key}` and whose answer echoes the bare key.
#[tokio::test]
async fn verify_reports_a_probe_scrubbed_of_the_sensitive_values_it_carries() {
    use sparkform_testkit::fake::{Answer, FakeHost, FakeNodes, FakeWorld};
    use std::sync::Arc;
    const KEY: &str = "sk-verify-0123456789abcdef";
    let dir = common::write_config(&[(
        "main.hcl",
        &format!(
            r#"
variable "api_key" {{
  type      = string
  sensitive = true
  default   = "{KEY}"
}}
node "n1" {{ address = "10.0.0.1" }}
probe "p" {{
  timeout  = "1s"
  interval = "1s"
  exec {{
    node    = node.n1
    command = ["check", "Bearer ${{var.api_key}}"]
  }}
}}
"#
        ),
    )]);
    let (c, g) = common::load(dir.path());
    let world = FakeWorld::new();
    let h = FakeHost::new("node.n1", &world);
    h.on(
        &["check"],
        Answer::Exit(1, String::new(), format!("invalid key {KEY}\n")),
    );
    let fakes = FakeNodes::new(
        [(
            "node.n1".to_string(),
            Arc::new(h) as Arc<dyn sparkform::hosts::Host>,
        )]
        .into_iter()
        .collect(),
    );
    let hosts = HostOptions {
        opener: fakes.opener(),
        ..HostOptions::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let state = common::applied(dir.path());
    let results = sparkform::ops::verify::verify(
        &c,
        &g,
        &state,
        &[],
        std::time::Duration::from_secs(1),
        &hosts,
        &tx,
    )
    .await;
    let (_, r) = results.first().expect("the probe ran");
    let shown = r.as_ref().expect_err("the probe failed").render();
    assert!(shown.contains("invalid key (sensitive value)"), "{shown}");
    drop(tx);
    while let Some(e) = rx.recv().await {
        let json = serde_json::to_string(&e).unwrap();
        assert!(!json.contains(KEY), "{json}");
    }
}

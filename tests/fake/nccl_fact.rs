//! `sparkform nodes` reads the NCCL each image of the deployment carries, per node, with a
//! one-shot container of the image (scripted here by its Docker name on fake Docker Engines):
//! the version per node, a version that differs between nodes flagged, the container removed
//! (and one a killed run left), and an image a node does not have left alone (never pulled).

use std::sync::Arc;

use sparkform::hosts::{Host, HostOptions};
use sparkform::inspect::nccl::{probe_container_name, LABEL_PROBE};
use sparkform::ops::nodes::{differences, gather, Facts, NodeReport};
use sparkform_testkit::fake::{FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

use crate::common;

const IMAGE: &str = "vllm/vllm-openai:v0.21.0";
/// An image the definitions use that no node has.
const ABSENT: &str = "vllm/vllm-openai:nightly";

const TWO_SPARKS: &str = r#"
node "a" { address = "10.0.0.1" }
node "b" { address = "10.0.0.2" }

container "vllm_a" {
  node  = node.a
  image = "vllm/vllm-openai:v0.21.0"
}

container "vllm_b" {
  node  = node.b
  image = "vllm/vllm-openai:v0.21.0"
}

container "next" {
  node  = node.a
  image = "vllm/vllm-openai:nightly"
}
"#;

/// What the probe prints in an image whose torch runs the `nvidia-nccl-cu12` wheel `version`.
fn pip_wheel(version: &str) -> Vec<String> {
    let packages = "/usr/local/lib/python3.12/dist-packages";
    vec![
        "nccl-probe 1".into(),
        format!("nccl-lib\t{packages}/nvidia/nccl/lib/libnccl.so.2"),
        format!("nccl-wheel\t{packages}/nvidia_nccl_cu12-{version}.dist-info\t{version}"),
        format!("nccl-torch\t{version}"),
        "nccl-end".into(),
    ]
}

/// A fake node whose engine has `IMAGE` with the NCCL wheel `version` (and not `ABSENT`);
/// node.b's still has the probe container a killed run left.
fn node(name: &str, version: &str, world: &Arc<FakeWorld>) -> (Arc<FakeDocker>, Arc<dyn Host>) {
    let engine = Arc::new(FakeDocker::start().expect("a fake engine"));
    engine.fault(
        &probe_container_name(IMAGE),
        Fault::ExitsAfterStart(0, pip_wheel(version)),
    );
    engine.image_error(ABSENT, 404, &format!("No such image: {ABSENT}"));
    if name == "node.b" {
        // What a `nodes` killed mid-probe left: removed before the probe is created again.
        engine.add(
            &probe_container_name(IMAGE),
            IMAGE,
            &[(LABEL_PROBE, "nodes")],
            false,
        );
    }
    let host = FakeHost::new(name, world)
        .interface("eth0", 1500, &["10.0.0.1/24"])
        .docker_engine(engine.clone());
    (engine, Arc::new(host))
}

async fn nodes_with(versions: [&str; 2]) -> (Vec<Arc<FakeDocker>>, Vec<(String, Facts)>) {
    let dir = common::write_config(&[("main.hcl", TWO_SPARKS)]);
    let (config, _) = common::load(dir.path());
    let world = FakeWorld::new();
    let (a, host_a) = node("node.a", versions[0], &world);
    let (b, host_b) = node("node.b", versions[1], &world);
    let opts = HostOptions {
        opener: FakeNodes::new(
            [
                ("node.a".to_string(), host_a),
                ("node.b".to_string(), host_b),
            ]
            .into(),
        )
        .opener(),
        ..HostOptions::default()
    };
    let facts = gather(&config, &opts)
        .await
        .into_iter()
        .map(|(n, f)| match f {
            NodeReport::Facts(f) => (n, *f),
            NodeReport::Failed(e) => panic!("{n}: {e}"),
            NodeReport::Unreachable(e) => panic!("{n}: {e}"),
        })
        .collect();
    (vec![a, b], facts)
}

fn summary(facts: &Facts, image: &str) -> Option<String> {
    match facts.nccl.get(image)? {
        Ok(n) => n.summary(),
        Err(e) => panic!("{image} not read: {e}"),
    }
}

#[tokio::test]
async fn nodes_shows_each_nodes_nccl_and_flags_a_version_that_differs() {
    let (engines, facts) = nodes_with(["2.27.3", "2.26.2"]).await;
    let [(_, a), (_, b)] = facts.as_slice() else {
        panic!("two nodes expected: {facts:?}");
    };
    assert_eq!(
        summary(a, IMAGE).as_deref(),
        Some("2.27.3 (pip wheel nvidia-nccl-cu12)")
    );
    assert_eq!(
        summary(b, IMAGE).as_deref(),
        Some("2.26.2 (pip wheel nvidia-nccl-cu12)")
    );
    let differences = differences(&facts.iter().cloned().collect());
    assert!(
        differences.contains(&format!(
            "NCCL in image {IMAGE} differs: node.a 2.27.3 (pip wheel nvidia-nccl-cu12), node.b 2.26.2 (pip wheel nvidia-nccl-cu12)"
        )),
        "{differences:#?}"
    );
    // The image no node has is not inspected: no probe for it, and no NCCL read.
    assert!(!a.nccl.contains_key(ABSENT) && a.images.get(ABSENT) == Some(&None));
    let probe = probe_container_name(IMAGE);
    for engine in &engines {
        let created = engine.created();
        let names: Vec<&str> = created.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [probe.as_str()],
            "one probe, of the image the node has"
        );
        let body = &created[0].1;
        assert_eq!(body["Image"], IMAGE);
        assert_eq!(body["Entrypoint"][0], "sh");
        assert_eq!(body["HostConfig"]["NetworkMode"], "none");
        assert!(body["Labels"].get(LABEL_PROBE).is_some(), "{body}");
        assert!(
            engine.containers().is_empty(),
            "the probe's container is removed: {:?}",
            engine.containers()
        );
    }
}

#[tokio::test]
async fn the_same_nccl_on_every_node_is_no_difference() {
    let (_, facts) = nodes_with(["2.27.3", "2.27.3"]).await;
    let differences = differences(&facts.into_iter().collect());
    assert!(
        differences.iter().all(|d| !d.contains("NCCL")),
        "{differences:#?}"
    );
}

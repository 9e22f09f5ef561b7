//! Real machines differ from the testbed (issue 40, item 7): a GPU host without iproute2, or
//! one without the NVIDIA driver's tools. On fake nodes: `nodes` (its operation,
//! `ops::nodes::gather`) shows everything else the node has and names the missing program with
//! the package that brings it, never "unreachable"; the plan of a network attachment on a node
//! without `ip` is refused naming `ip` and iproute2.

use std::collections::BTreeMap;
use std::sync::Arc;

use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::ops::nodes::{disagreements, explanations, gather, Facts, NodeReport};
use sparkform::ops::prepare::{prepare, PrepareRequest};
use sparkform::ops::{OpError, ReadMode};
use sparkform::plan::PlanOptions;
use sparkform::state::StateStore;
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{Answer, FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::FakeDocker;

use crate::common;

const SMI_HEADER: &str = "\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------------------------------------------------------+
";

/// What a shell prints for a program that is not installed.
fn not_found(program: &str) -> Answer {
    Answer::Exit(127, String::new(), format!("sh: 1: {program}: not found"))
}

fn says(text: &str) -> Answer {
    Answer::Exit(0, text.to_string(), String::new())
}

/// A GPU host as the issue's was: Ubuntu, one H200 with driver 580.159.04 (CUDA 13.0), 2 TiB
/// of memory, an interface `eth1`, Docker Engine; `ip` and `nvidia-smi` answer unless the test
/// says otherwise.
fn h200(world: &Arc<FakeWorld>) -> FakeHost {
    let engine = Arc::new(FakeDocker::start().expect("a fake engine"));
    let h = FakeHost::new("node.h200", world)
        .interface("eth1", 1500, &["10.0.0.9/24"])
        .docker_engine(engine);
    // dockerd is not running as a process pidof sees (it answers through its socket).
    h.on(&["pidof"], Answer::Exit(1, String::new(), String::new()));
    h.on(
        &["cat", "/etc/os-release"],
        says("NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04.3 LTS\"\n"),
    );
    h.on(&["uname", "-m"], says("x86_64\n"));
    h.on(&["uname", "-r"], says("6.8.0-87-generic\n"));
    h.on(&["nproc"], says("96\n"));
    h.on(
        &["cat", "/proc/meminfo"],
        says("MemTotal:       2147483648 kB\nMemFree:        2000000000 kB\n"),
    );
    h.on(&["nvidia-smi"], says(SMI_HEADER));
    h.on(
        &[
            "nvidia-smi",
            "--query-gpu=name,memory.total",
            "--format=csv,noheader,nounits",
        ],
        says("NVIDIA H200, 143771\n"),
    );
    h
}

const ONE_NODE: &str = r#"
node "h200" {
  address = "10.0.0.9"
  gpus    = 1
}
"#;

/// `ONE_NODE` with a network attachment on the node's `eth1`.
const WITH_ATTACHMENT: &str = r#"
node "h200" {
  address = "10.0.0.9"
  gpus    = 1
}

network "fabric" {
  subnet = "192.168.10.0/24"
  mtu    = 9000
  attach "h200" {
    node      = node.h200
    interface = "eth1"
    address   = "192.168.10.1"
  }
}
"#;

fn options(host: FakeHost) -> HostOptions {
    let hosts: BTreeMap<String, Arc<dyn Host>> =
        [("node.h200".to_string(), Arc::new(host) as Arc<dyn Host>)].into();
    HostOptions {
        opener: FakeNodes::new(hosts).opener(),
        ..HostOptions::default()
    }
}

/// `nodes` on the one node of `definitions`: its facts, and the lines of the definitions'
/// comparison (disagreements, explanations).
async fn nodes(definitions: &str, host: FakeHost) -> (Facts, Vec<String>, Vec<String>) {
    let dir = common::write_config(&[("main.hcl", definitions)]);
    let (config, _) = common::load(dir.path());
    let mut all = gather(&config, &options(host)).await;
    let facts = match all.remove("node.h200") {
        Some(NodeReport::Facts(f)) => *f,
        Some(NodeReport::Failed(e)) => panic!("the node's facts were not read at all: {e}"),
        Some(NodeReport::Unreachable(e)) => panic!("the node was unreachable: {e}"),
        None => panic!("no answer for node.h200"),
    };
    let node = &config.nodes["node.h200"];
    (
        facts.clone(),
        disagreements(&config, node, &facts),
        explanations(node, &facts),
    )
}

/// The issue's node: no iproute2. Its GPU, driver, CUDA and memory are shown; the interfaces
/// are not read, naming `ip` and iproute2; nothing says it is unreachable.
#[tokio::test]
async fn a_node_without_ip_shows_its_gpu_driver_cuda_and_memory_and_names_iproute2() {
    let world = FakeWorld::new();
    let host = h200(&world);
    host.on(&["ip"], not_found("ip"));
    let (f, disagree, _) = nodes(ONE_NODE, host).await;
    assert_eq!(f.gpus.len(), 1, "{f:?}");
    assert_eq!(f.gpus[0].name, "NVIDIA H200");
    let nvidia = f.nvidia.as_ref().expect("the driver was read");
    assert_eq!(nvidia.driver, "580.159.04");
    assert_eq!(nvidia.cuda.as_deref(), Some("13.0"));
    assert_eq!(f.memory_gib, 2048.0);
    assert_eq!(
        (f.os.as_str(), f.kernel.as_str(), f.arch.as_str(), f.cpus),
        ("Ubuntu 24.04.3 LTS", "6.8.0-87-generic", "x86_64", 96)
    );
    assert!(f.docker.is_ok(), "{:?}", f.docker);
    assert!(f.interfaces.is_empty());
    assert_eq!(
        f.not_read,
        BTreeMap::from([(
            "interfaces".to_string(),
            "`ip` is missing on the node (install iproute2)".to_string()
        )])
    );
    // The machine agrees with the definitions: one GPU, and no attachment needs `ip`.
    assert!(disagree.is_empty(), "{disagree:?}");
}

/// A node without the NVIDIA driver's tools: no GPU and no driver, said with the package;
/// every other section (memory, interfaces) is shown.
#[tokio::test]
async fn a_node_without_nvidia_smi_says_no_driver_and_shows_the_rest() {
    let world = FakeWorld::new();
    let host = h200(&world);
    host.on(&["nvidia-smi"], not_found("nvidia-smi"));
    let (f, _, explained) = nodes(ONE_NODE, host).await;
    assert!(f.gpus.is_empty() && f.nvidia.is_none(), "{f:?}");
    assert_eq!(
        f.not_read,
        BTreeMap::from([(
            "gpus".to_string(),
            "`nvidia-smi` is missing on the node (install the NVIDIA driver: nvidia-utils-<version>)"
                .to_string()
        )])
    );
    assert!(
        explained.iter().any(|e| e.starts_with("no NVIDIA driver")),
        "{explained:?}"
    );
    assert_eq!(f.memory_gib, 2048.0);
    assert_eq!(f.interfaces.len(), 1, "{f:?}");
    assert_eq!(f.interfaces[0].addresses, ["10.0.0.9/24"]);
}

/// A driver that is installed but fails is not "no driver": the GPUs and the driver's version
/// are not read, with nvidia-smi's own words.
#[tokio::test]
async fn a_failing_driver_is_said_with_its_own_error() {
    let world = FakeWorld::new();
    let host = h200(&world);
    host.on(
        &["nvidia-smi"],
        Answer::Exit(
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
                .into(),
            String::new(),
        ),
    );
    let (f, _, explained) = nodes(ONE_NODE, host).await;
    assert!(f.nvidia.is_none());
    assert_eq!(
        f.not_read.get("nvidia").map(String::as_str),
        Some("`nvidia-smi` failed (exit code 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    );
    assert!(f.not_read.contains_key("gpus"), "{:?}", f.not_read);
    assert!(
        !explained.iter().any(|e| e.starts_with("no NVIDIA driver")),
        "{explained:?}"
    );
}

/// Where an attachment needs the interfaces, `nodes` flags that they could not be checked.
#[tokio::test]
async fn nodes_flags_an_attachment_whose_interfaces_cannot_be_read() {
    let world = FakeWorld::new();
    let host = h200(&world);
    host.on(&["ip"], not_found("ip"));
    let (_, disagree, _) = nodes(WITH_ATTACHMENT, host).await;
    assert_eq!(
        disagree,
        ["network.fabric.attach.h200 uses interface eth1, which cannot be checked: `ip` is missing on the node (install iproute2); plan and apply need it"]
    );
}

/// The plan of a network attachment on a node without `ip` is refused, naming `ip` and
/// iproute2 on the attachment (apply would need `ip` to set its address and MTU).
#[tokio::test]
async fn the_plan_of_an_attachment_on_a_node_without_ip_names_ip_and_iproute2() {
    let dir = common::write_config(&[("main.hcl", WITH_ATTACHMENT)]);
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    let plan = |host: FakeHost| {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let recorded = store.load().unwrap();
        async move {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            prepare(
                PrepareRequest {
                    evaluated,
                    recorded: recorded.as_ref(),
                    refresh: ReadMode::Normal,
                    options: PlanOptions::default(),
                    hosts: options(host),
                },
                &tx,
            )
            .await
        }
    };
    let world = FakeWorld::new();
    let host = h200(&world);
    host.on(&["ip"], not_found("ip"));
    match plan(host).await {
        Err(OpError::Config(d)) => {
            assert_eq!(d.0.len(), 1, "{:?}", d.0);
            assert_eq!(d.0[0].code, "attachment::ip_missing");
            assert_eq!(
                d.0[0].message,
                "node.h200: cannot read its interfaces: `ip` is missing on the node (install iproute2)"
            );
            let help = d.0[0].help.as_deref().unwrap_or_default();
            assert!(help.contains("apt-get install iproute2"), "{help}");
            assert!(
                !format!("{:?}", d.0).to_lowercase().contains("unreachable"),
                "{:?}",
                d.0
            );
        }
        Err(other) => panic!("{other:?}"),
        Ok(p) => panic!("planned without `ip` on the node: {:?}", p.warnings),
    }
    // With `ip` there, the same definitions plan.
    let mut prepared = plan(h200(&world)).await.unwrap_or_else(|e| panic!("{e:?}"));
    prepared.close().await;
    assert!(prepared.plan.has_changes());
}

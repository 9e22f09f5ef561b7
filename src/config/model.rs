//! The evaluated configuration: what the definitions ask for, with every expression resolved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::diag::{Diag, Span};

#[derive(Debug, Clone)]
pub struct Config {
    pub dir: PathBuf,
    pub jumps: BTreeMap<String, Jump>,
    pub nodes: BTreeMap<String, Node>,
    pub networks: BTreeMap<String, Network>,
    /// Attachments, containers and probes, in declaration order.
    pub resources: Vec<Resource>,
    /// The root module's outputs.
    pub outputs: Vec<Output>,
    pub warnings: Vec<Diag>,
    /// The root module's `import` blocks, in declaration order.
    pub imports: Vec<Import>,
}

impl Config {
    pub fn resource(&self, address: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.address == address)
    }
}

#[derive(Debug, Clone)]
pub struct Jump {
    /// `jump.bastion` or `module.m.jump.bastion`.
    pub address: String,
    pub name: String,
    pub host: String,
    pub user: Option<String>,
    pub port: Option<u16>,
    pub identity_file: Option<PathBuf>,
    pub known_hosts: Option<PathBuf>,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct Node {
    /// `node.spark1`; the key other blocks use to name this node.
    pub address: String,
    pub name: String,
    /// Host name or IP to reach it, or `local` for this machine.
    pub host: String,
    pub user: Option<String>,
    pub port: Option<u16>,
    /// Address of the jump host block it is reached through.
    pub jump: Option<String>,
    pub identity_file: Option<PathBuf>,
    pub known_hosts: Option<PathBuf>,
    pub gpus: Option<u32>,
    pub memory_gib: Option<f64>,
    pub unified_memory: bool,
    /// False when the declared GPUs are logical (a test bed): no device is expected.
    pub gpu_devices: bool,
    pub labels: BTreeMap<String, String>,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct Network {
    pub address: String,
    pub name: String,
    pub subnet: ipnet::IpNet,
    pub mtu: u32,
    /// Addresses of its attachment resources.
    pub attachments: Vec<String>,
    pub span: Span,
}

/// The kind of a resource; the kinds are listed in `kinds`.
pub use crate::kinds::KindId as ResourceKind;

/// A step of the deployment: something sparkform creates, changes, removes or runs.
#[derive(Debug, Clone)]
pub struct Resource {
    /// `network.roce.attach.spark1`, `module.qwen.container.ray_worker["spark2"]`, `probe.hello`.
    pub address: String,
    pub kind: ResourceKind,
    /// The node it lives on (`node.spark1`); probes over HTTP name their `via` node.
    pub node: Option<String>,
    /// Canonical desired configuration, real values included (sensitive ones too: never print it raw).
    pub config: serde_json::Value,
    /// Paths inside `config` that hold sensitive values.
    pub sensitive: Vec<Vec<String>>,
    /// Addresses of the resources this one depends on (directly, through expressions or `depends_on`).
    pub deps: BTreeSet<String>,
    /// Resources whose replacement replaces this one.
    pub replace_triggered_by: BTreeSet<String>,
    pub span: Span,
}

/// An `import` block: adopt the object `id` names as the resource `to`.
#[derive(Debug, Clone)]
pub struct Import {
    /// `module.qwen.container.vllm`, `network.roce.attach.node1`.
    pub to: String,
    /// The node's name, before the first `:` of the id.
    pub node: String,
    /// The rest of the id: what the kind looks for on the node (a container's name or ID).
    pub object: String,
    pub span: Span,
    pub to_span: Span,
    pub id_span: Span,
}

#[derive(Debug, Clone)]
pub struct Output {
    pub name: String,
    pub value: serde_json::Value,
    pub sensitive: bool,
    pub deps: BTreeSet<String>,
    pub span: Span,
}

/// What the machines said before an evaluation, for the values a definition leaves to them.
///
/// `config` stays pure: `ops` gathers these (node facts from a refresh, model revisions
/// resolved on a node) and passes them to `config::load_observed`; a load without them
/// (`config::load`) evaluates as if nothing had been observed.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// By node name (`spark1` for `node "spark1"`).
    pub nodes: BTreeMap<String, NodeObserved>,
    /// By the model block's address (`model.qwen`, `module.m.model.qwen`).
    pub models: BTreeMap<String, ModelObserved>,
}

/// Facts read on a node, for the node attributes a definition leaves unset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeObserved {
    pub unified_memory: Option<bool>,
    pub memory_gib: Option<f64>,
    pub gpus: Option<u32>,
}

/// A model revision resolved against the hub on a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelObserved {
    /// The revision asked for (a branch, tag or commit), as the definition spells it.
    pub revision: String,
    /// The commit it points at.
    pub commit: String,
    /// The resolved manifest (transfer.py's `sparkform-model-manifest/1` document).
    pub manifest: serde_json::Value,
    /// Facts of the model's `config.json` (architectures, sizes the modules' checks use).
    pub config: serde_json::Value,
}

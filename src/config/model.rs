//! The evaluated configuration: what the definitions ask for, with every expression resolved.

use crate::vocabulary::KindId;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::diag::{Diag, Span};

/// Values for the root module's variables, in increasing precedence.
#[derive(Debug, Default, Clone)]
pub struct VarInputs {
    /// `SPARKFORM_VAR_name` from the environment.
    pub env: Vec<(String, String)>,
    /// `-var-file FILE`, in command-line order.
    pub files: Vec<PathBuf>,
    /// `-var name=value`, in command-line order.
    pub cli: Vec<(String, String)>,
}

impl VarInputs {
    /// Pick up `SPARKFORM_VAR_*` from the process environment.
    pub fn from_env() -> Self {
        VarInputs {
            env: std::env::vars()
                .filter_map(|(k, v)| k.strip_prefix("SPARKFORM_VAR_").map(|n| (n.to_string(), v)))
                .collect(),
            ..VarInputs::default()
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub dir: PathBuf,
    /// The variable values it was evaluated with, so an operation can evaluate the same
    /// definitions again with what the machines said (`config::load_with_readings`).
    pub vars: VarInputs,
    /// What the machines said that it was evaluated with (model revisions, node facts), so a
    /// second evaluation adds to it instead of losing it.
    pub readings: Readings,
    pub jumps: BTreeMap<String, Jump>,
    pub nodes: BTreeMap<String, Node>,
    pub networks: BTreeMap<String, Network>,
    /// Attachments, containers and probes, in declaration order.
    pub resources: Vec<Resource>,
    /// The root module's outputs.
    pub outputs: Vec<OutputBlock>,
    pub warnings: Vec<Diag>,
    /// The root module's `import` blocks, in declaration order.
    pub imports: Vec<ImportBlock>,
    /// The root module's `moved` blocks, in declaration order.
    pub moves: Vec<Move>,
    /// The root module's `removed` blocks.
    pub removals: Vec<Removal>,
    /// The texts of every value derived from a sensitive input (the variables' values, what
    /// the evaluation and the lowering derived from them): the one scrubber of what a run shows
    /// and records (`secrets::Secrets`).
    pub secrets: crate::secrets::Secrets,
}

impl Config {
    pub fn resource(&self, address: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.address == address)
    }

    /// The texts of every value derived from a sensitive input (each resource's sensitive
    /// paths, every string inside them), for the scrubbers of what a run shows and records.
    pub fn secret_texts(&self) -> Vec<String> {
        fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::String(s) => out.push(s.clone()),
                serde_json::Value::Number(n) => out.push(n.to_string()),
                serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
                serde_json::Value::Object(m) => m.values().for_each(|x| strings(x, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        for r in &self.resources {
            for path in &r.sensitive {
                let mut cur = Some(r.config.json());
                for p in path {
                    cur = cur.and_then(|c| c.get(p));
                }
                if let Some(v) = cur {
                    strings(v, &mut out);
                }
            }
        }
        out
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
    /// Unset in the definition: what refresh read on the node, else `None`.
    pub gpus: Option<u32>,
    pub memory_gib: Option<f64>,
    /// `None`: neither the definition nor the node's facts say.
    pub unified_memory: Option<bool>,
    /// False when the declared GPUs are logical (a test bed): no device is expected.
    pub gpu_devices: bool,
    pub labels: BTreeMap<String, String>,
    pub span: Span,
}

impl Node {
    /// The three attributes refresh may fill, as this evaluation has them (declared, or filled
    /// when it was made with observed facts).
    pub fn declared_facts(&self) -> NodeReadings {
        NodeReadings {
            unified_memory: self.unified_memory,
            memory_gib: self.memory_gib,
            gpus: self.gpus,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Network {
    pub address: String,
    pub name: String,
    pub subnet: ipnet::IpNet,
    pub mtu: u32,
    /// `on_mtu_mismatch = "fix"`: ends of the fabric found at different MTUs are a warning and
    /// the apply sets the network's MTU on each; by default (`"refuse"`) the plan is refused.
    pub fix_mtu_mismatch: bool,
    /// Addresses of its attachment resources.
    pub attachments: Vec<String>,
    pub span: Span,
}

/// A step of the deployment: something sparkform creates, changes, removes or runs.
#[derive(Debug, Clone)]
pub struct Resource {
    /// `network.roce.attach.spark1`, `module.qwen.container.ray_worker["spark2"]`, `probe.hello`.
    pub address: String,
    pub kind: KindId,
    /// The node it lives on (`node.spark1`); probes over HTTP name their `via` node.
    pub node: Option<String>,
    /// Canonical desired configuration, typed by its kind's lowering, real values included
    /// (sensitive ones too: never print it raw).
    pub config: crate::kind::Configuration,
    /// Paths inside `config` that hold sensitive values.
    pub sensitive: Vec<Vec<String>>,
    /// Paths inside `config` that hold ephemeral values: used by the apply, recorded nowhere
    /// (not in the state, not in a plan, not even as a hash), and so never a change.
    pub ephemeral: Vec<Vec<String>>,
    /// Addresses of the resources this one depends on (directly, through expressions or `depends_on`).
    pub deps: BTreeSet<String>,
    /// Resources whose replacement replaces this one.
    pub replace_triggered_by: BTreeSet<String>,
    /// The process group it belongs to (`module.qwen.vllm`: the block's `process_group`,
    /// scoped by its module): members are replaced as one, a rollback restores all or none.
    pub group: Option<String>,
    pub span: Span,
}

/// An `import` block: adopt the object `id` names as the resource `to`.
#[derive(Debug, Clone)]
pub struct ImportBlock {
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

/// A `moved` block: the state's records at `from` (the address itself, or everything under it)
/// are re-addressed to `to`.
#[derive(Debug, Clone)]
pub struct Move {
    pub from: String,
    pub to: String,
    pub span: Span,
    pub from_span: Span,
    pub to_span: Span,
}

/// A `removed` block: the state's records at `from` (or under it) are forgotten, leaving what
/// runs in place (`destroy = false`), or destroyed as if the block were deleted.
#[derive(Debug, Clone)]
pub struct Removal {
    pub from: String,
    pub destroy: bool,
    pub span: Span,
    pub from_span: Span,
}

/// `address` with the moves undone, the latest first: where it was before the `moved` blocks
/// renamed it (itself when none did). A loop of moves is refused at validate; the bound keeps
/// an unvalidated one finite.
pub fn address_before_moves(moves: &[Move], address: &str) -> String {
    let mut at = address.to_string();
    for _ in 0..=moves.len() {
        let Some(m) = moves
            .iter()
            .rev()
            .find(|m| crate::vocabulary::address_within(&at, &m.to))
        else {
            break;
        };
        at = format!("{}{}", m.from, &at[m.to.len()..]);
    }
    at
}

#[derive(Debug, Clone)]
pub struct OutputBlock {
    pub name: String,
    pub value: serde_json::Value,
    pub sensitive: bool,
    pub deps: BTreeSet<String>,
    pub span: Span,
}

/// What the machines said before an evaluation, for the values a definition leaves to them.
///
/// `config` stays pure: `ops` gathers these (node facts from a refresh, model revisions
/// resolved on a node) and passes them to `config::load_with_readings`; a load without them
/// (`config::load`) evaluates as if nothing had been observed.
#[derive(Clone, Debug, Default)]
pub struct Readings {
    /// By node name (`spark1` for `node "spark1"`).
    pub nodes: BTreeMap<String, NodeReadings>,
    /// By the model block's address (`model.qwen`, `module.m.model.qwen`).
    pub models: BTreeMap<String, ModelReadings>,
    /// What a kind's plan-time read found that has no place of its own above, by the address of
    /// the block it is for (the toy kind of the tests).
    pub kinds: BTreeMap<String, serde_json::Value>,
    /// What a kind's plan-time read found worth a warning (a PCIe link below its width): the
    /// plan shows them; the evaluation does not read them.
    pub warnings: Vec<crate::diag::Diag>,
}

impl Readings {
    /// Nothing was observed: an evaluation with it is one without.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.models.is_empty() && self.kinds.is_empty()
    }

    /// `other`'s observations added to these (its own replace these where both have one).
    pub fn extend(&mut self, other: Readings) {
        self.nodes.extend(other.nodes);
        self.models.extend(other.models);
        self.kinds.extend(other.kinds);
        self.warnings.extend(other.warnings);
    }
}

/// Facts read on a node, for the node attributes a definition leaves unset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeReadings {
    pub unified_memory: Option<bool>,
    pub memory_gib: Option<f64>,
    pub gpus: Option<u32>,
}

impl NodeReadings {
    /// `declared` (what a node block sets) with what it leaves unset taken from these facts.
    /// GPUs are taken only where devices are expected: `gpu_devices = false` declares logical
    /// GPUs, which no machine shows.
    pub fn fill(&self, declared: &NodeReadings, gpu_devices: bool) -> NodeReadings {
        NodeReadings {
            unified_memory: declared.unified_memory.or(self.unified_memory),
            memory_gib: declared.memory_gib.or(self.memory_gib),
            gpus: declared.gpus.or(self.gpus.filter(|_| gpu_devices)),
        }
    }

    /// Where `declared` sets an attribute these facts contradict.
    pub fn disagreements(
        &self,
        declared: &NodeReadings,
        gpu_devices: bool,
    ) -> Vec<FactDisagreement> {
        let mut out = Vec::new();
        if let (Some(d), Some(o)) = (declared.gpus, self.gpus.filter(|_| gpu_devices)) {
            if d != o {
                out.push(FactDisagreement {
                    attribute: "gpus",
                    declared: d.to_string(),
                    observed: o.to_string(),
                });
            }
        }
        // Only more memory than the machine has is a mistake: the modules' checks take it as
        // what a model may fill, so declaring less keeps them on the safe side. The kernel
        // reports a little less than the installed size (firmware keeps some): a GiB or 2%.
        if let (Some(d), Some(o)) = (declared.memory_gib, self.memory_gib) {
            if d > o + (o * 0.02).max(1.0) {
                out.push(FactDisagreement {
                    attribute: "memory_gib",
                    declared: gib(d),
                    observed: gib(o),
                });
            }
        }
        if let (Some(d), Some(o)) = (declared.unified_memory, self.unified_memory) {
            if d != o {
                out.push(FactDisagreement {
                    attribute: "unified_memory",
                    declared: d.to_string(),
                    observed: o.to_string(),
                });
            }
        }
        out
    }
}

/// A node attribute the definition sets that the node's facts contradict.
#[derive(Clone, Debug, PartialEq)]
pub struct FactDisagreement {
    /// `gpus`, `memory_gib` or `unified_memory`.
    pub attribute: &'static str,
    /// Both as HCL would write them.
    pub declared: String,
    pub observed: String,
}

impl FactDisagreement {
    /// What the machine shows, in words.
    pub fn what_the_node_shows(&self) -> String {
        match self.attribute {
            "gpus" => format!(
                "the machine shows {} GPU{}",
                self.observed,
                plural(&self.observed)
            ),
            "memory_gib" => format!("the machine has {} GiB", self.observed),
            _ if self.observed == "true" => {
                "its GPU has no memory of its own: it uses the node's (unified memory)".into()
            }
            _ => "its GPU has memory of its own (not unified memory)".into(),
        }
    }

    /// The fix, naming the attribute and the value to write.
    pub fn fix(&self) -> String {
        format!(
            "set `{} = {}` (what the node shows), or remove the attribute and refresh fills it in from the node's facts",
            self.attribute, self.observed
        )
    }
}

fn plural(n: &str) -> &'static str {
    if n == "1" {
        ""
    } else {
        "s"
    }
}

/// GiB as a definition writes them: `120`, `119.6`.
pub fn gib(v: f64) -> String {
    let tenths = (v * 10.0).round() / 10.0;
    if tenths.fract() == 0.0 {
        format!("{tenths:.0}")
    } else {
        format!("{tenths:.1}")
    }
}

/// A model revision resolved against the hub on a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelReadings {
    /// The revision asked for (a branch, tag or commit), as the definition spells it.
    pub revision: String,
    /// The commit it points at.
    pub commit: String,
    /// The resolved manifest (transfer.py's `sparkform-model-manifest/1` document).
    pub manifest: serde_json::Value,
    /// Facts of the model's `config.json` (architectures, sizes the modules' checks use).
    pub config: serde_json::Value,
}

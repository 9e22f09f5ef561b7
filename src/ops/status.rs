//! Status: the recorded deployment against what runs, on one screen.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::Config;
use crate::hosts::{Host, HostOptions, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::machine;
use crate::state::{ResourceState, State};
use crate::vocabulary::{KindId, Lifecycle};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub nodes: Vec<NodeStatus>,
    pub resources: Vec<ResourceStatus>,
    pub probes: Vec<ProbeStatus>,
    /// Sensitive ones as `null`.
    pub outputs: BTreeMap<String, serde_json::Value>,
    /// What `sparkform watch` restarted, the newest last.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<crate::state::Restart>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeStatus {
    pub node: String,
    pub reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResourceStatus {
    pub address: String,
    pub kind: KindId,
    pub node: String,
    /// What the state records it by (a container's ID), if anything.
    pub recorded: Option<String>,
    pub observed: Seen,
    /// What its log said once it was ready, as its ready checks' `record_from_log` named it
    /// (the transport NCCL chose, per rank).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub from_log: BTreeMap<String, Vec<String>>,
}

/// What a resource looks like on its machine, as its kind says (`Machine::look`).
pub use crate::kinds::machine::Seen;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeStatus {
    pub address: String,
    pub last_run: Option<String>,
    /// How long its last run in an apply took.
    pub took_secs: Option<f64>,
    /// What its last run measured (a bench probe's figures), by name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub measured: BTreeMap<String, f64>,
}

/// Why there is no status to show.
#[derive(Debug)]
pub enum NoStatus {
    /// No state at this place: nothing is deployed from these definitions.
    NothingDeployed(std::path::PathBuf),
    State(crate::state::StateError),
}

/// `sparkform status`: the workspace's recorded deployment against what runs.
pub async fn deployed(
    ws: &crate::workspace::Workspace,
    config: &Config,
    hosts: &HostOptions,
) -> Result<Status, NoStatus> {
    let state = ws
        .state()
        .map_err(NoStatus::State)?
        .ok_or_else(|| NoStatus::NothingDeployed(ws.store().path().to_path_buf()))?;
    Ok(status(config, &state, hosts).await)
}

/// Look at every node the state records something on.
pub async fn status(config: &Config, state: &State, hosts: &HostOptions) -> Status {
    let mut nodes: Vec<String> = state
        .resources
        .values()
        .filter_map(|r| r.node.clone())
        .chain(config.nodes.keys().cloned())
        .filter(|n| config.nodes.contains_key(n))
        .collect();
    nodes.sort();
    nodes.dedup();
    let pool = HostPool::connect(config, &nodes, hosts).await;
    let looks = nodes.iter().map(|n| {
        let pool = &pool;
        async move {
            match pool.get(n) {
                Ok(h) => Some(look(h.as_ref(), state).await),
                Err(_) => None,
            }
        }
    });
    let seen: Vec<Option<Looked>> = futures_util::future::join_all(looks).await;
    let mut resources = Vec::new();
    let mut node_status = Vec::new();
    for (n, s) in nodes.iter().zip(seen) {
        node_status.push(NodeStatus {
            node: n.clone(),
            reachable: s.is_some(),
            error: pool.get(n).err().map(|e| e.to_string()),
        });
        for (addr, r) in &state.resources {
            if r.node.as_deref() != Some(n.as_str()) || runs(r) {
                continue;
            }
            let (recorded, observed) = s
                .as_ref()
                .and_then(|m| m.get(addr).cloned())
                .unwrap_or((recorded_id(r), Seen::Unknown));
            resources.push(ResourceStatus {
                address: addr.clone(),
                kind: r.kind,
                node: n.clone(),
                recorded,
                observed,
                from_log: from_log(r),
            });
        }
    }
    resources.sort_by(|a, b| a.address.cmp(&b.address));
    pool.close().await;
    Status {
        nodes: node_status,
        resources,
        probes: probes(state),
        outputs: outputs(state),
        restarts: state.restarts.clone(),
    }
}

/// What the apply recorded from the resource's log (a container's `record_from_log`).
fn from_log(r: &ResourceState) -> BTreeMap<String, Vec<String>> {
    r.kind.kind().holds(&r.attributes).from_log
}

/// What the state records it by on its node (a container's ID).
fn recorded_id(r: &ResourceState) -> Option<String> {
    r.kind.kind().holds(&r.attributes).id
}

/// A check (a probe, a fabric test): it runs rather than stands, and status lists its last run.
fn runs(r: &ResourceState) -> bool {
    r.kind.kind().description().lifecycle == Lifecycle::Runs
}

pub fn probes(state: &State) -> Vec<ProbeStatus> {
    state
        .resources
        .iter()
        .filter(|(_, r)| runs(r))
        .map(|(a, r)| ProbeStatus {
            address: a.clone(),
            last_run: r
                .attributes
                .get(crate::plan::MARK_LAST_RUN)
                .and_then(|v| v.as_str())
                .map(str::to_string),
            took_secs: r.last_apply_secs,
            measured: r.kind.kind().holds(&r.attributes).measured,
        })
        .collect()
}

pub fn outputs(state: &State) -> BTreeMap<String, serde_json::Value> {
    state
        .outputs
        .iter()
        .map(|(k, o)| {
            let v = if o.sensitive {
                serde_json::Value::Null
            } else {
                o.value.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// What one node shows, by address: (recorded ID, what is seen).
type Looked = BTreeMap<String, (Option<String>, Seen)>;

/// One node: each kind looks at its recorded resources there.
async fn look(host: &dyn Host, state: &State) -> Looked {
    let mine: Vec<(String, ResourceState)> = state
        .resources
        .iter()
        .filter(|(_, r)| r.node.as_deref() == Some(host.node()) && !runs(r))
        .map(|(a, r)| (a.clone(), r.clone()))
        .collect();
    let mut out = BTreeMap::new();
    for kind in KindId::ALL.iter().copied() {
        let of_kind: Vec<(String, ResourceState)> = mine
            .iter()
            .filter(|(_, r)| r.kind == kind)
            .cloned()
            .collect();
        if of_kind.is_empty() {
            continue;
        }
        let mut seen = machine(kind).look(host, &state.lineage, &of_kind).await;
        for (a, r) in &of_kind {
            let s = seen.remove(a).unwrap_or(Seen::Unknown);
            out.insert(a.clone(), (recorded_id(r), s));
        }
    }
    out
}

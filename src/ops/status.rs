//! Status: the recorded deployment against what runs, on one screen.

use std::collections::BTreeMap;

use bollard::query_parameters as q;
use serde::Serialize;

use crate::config::Config;
use crate::hosts::{Host, HostOptions, HostPool};
use crate::kinds::machine::{machine, ReadMode};
use crate::kinds::KindId;
use crate::plan::Observed;
use crate::state::{ResourceState, State};

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

/// What a resource looks like on its machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Seen {
    Running {
        uptime_secs: Option<u64>,
        restarts: i64,
        image_id: Option<String>,
    },
    Exited {
        code: i64,
        restarts: i64,
        image_id: Option<String>,
    },
    /// Created, paused, restarting…: Docker's word for it.
    Other {
        status: String,
    },
    InSync,
    Drifted {
        notes: Vec<String>,
    },
    Missing {
        reason: String,
    },
    /// Its node could not be reached.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeStatus {
    pub address: String,
    pub last_run: Option<String>,
    /// How long its last run in an apply took.
    pub took_secs: Option<f64>,
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
            if r.node.as_deref() != Some(n.as_str()) || r.kind == KindId::Probe {
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

/// What the apply recorded from the resource's log (`from_log`).
fn from_log(r: &ResourceState) -> BTreeMap<String, Vec<String>> {
    r.attributes
        .get("from_log")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

fn recorded_id(r: &ResourceState) -> Option<String> {
    r.attributes
        .get("container_id")
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

pub fn probes(state: &State) -> Vec<ProbeStatus> {
    state
        .resources
        .iter()
        .filter(|(_, r)| r.kind == KindId::Probe)
        .map(|(a, r)| ProbeStatus {
            address: a.clone(),
            last_run: r
                .attributes
                .get("last_run")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            took_secs: r.last_apply_secs,
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

/// One node: containers by inspecting their recorded IDs, everything else by its kind's observe.
async fn look(host: &dyn Host, state: &State) -> Looked {
    let mine: Vec<(String, ResourceState)> = state
        .resources
        .iter()
        .filter(|(_, r)| r.node.as_deref() == Some(host.node()) && r.kind != KindId::Probe)
        .map(|(a, r)| (a.clone(), r.clone()))
        .collect();
    let mut out = BTreeMap::new();
    let docker = host.docker().await.ok();
    for kind in KindId::ALL.iter().copied() {
        let of_kind: Vec<(String, ResourceState)> = mine
            .iter()
            .filter(|(_, r)| r.kind == kind)
            .cloned()
            .collect();
        if of_kind.is_empty() {
            continue;
        }
        if kind == KindId::Container {
            for (a, r) in &of_kind {
                let id = recorded_id(r).or_else(|| {
                    r.config
                        .get("name")
                        .and_then(|n| n.as_str())
                        .map(str::to_string)
                });
                let seen = match (&docker, &id) {
                    (Some(d), Some(id)) => inspect(d, id).await,
                    (None, _) => Seen::Unknown,
                    (_, None) => Seen::Missing {
                        reason: "the state records no container".into(),
                    },
                };
                out.insert(a.clone(), (recorded_id(r), seen));
            }
            continue;
        }
        let seen = match machine(kind)
            .observe(host, &state.lineage, &of_kind, ReadMode::Normal)
            .await
        {
            Ok((m, _)) => m,
            Err(_) => Default::default(),
        };
        for (a, _) in &of_kind {
            let s = match seen.get(a) {
                Some(Observed::InSync) => Seen::InSync,
                Some(Observed::Drifted(notes)) => Seen::Drifted {
                    notes: notes.clone(),
                },
                Some(Observed::Missing(reason)) => Seen::Missing {
                    reason: reason.clone(),
                },
                None => Seen::Unknown,
            };
            out.insert(a.clone(), (None, s));
        }
    }
    out
}

async fn inspect(docker: &bollard::Docker, id: &str) -> Seen {
    let i = match docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
    {
        Ok(i) => i,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            return Seen::Missing {
                reason: format!("no container {}", &id[..id.len().min(12)]),
            }
        }
        Err(_) => return Seen::Unknown,
    };
    let restarts = i.restart_count.unwrap_or(0);
    let image_id = i.image.clone();
    let st = i.state.unwrap_or_default();
    if st.running == Some(true) {
        let uptime_secs = st
            .started_at
            .as_deref()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .and_then(|t| u64::try_from((chrono::Utc::now() - t.to_utc()).num_seconds()).ok());
        return Seen::Running {
            uptime_secs,
            restarts,
            image_id,
        };
    }
    match st.status {
        Some(bollard::models::ContainerStateStatusEnum::EXITED)
        | Some(bollard::models::ContainerStateStatusEnum::DEAD) => Seen::Exited {
            code: st.exit_code.unwrap_or(-1),
            restarts,
            image_id,
        },
        other => Seen::Other {
            status: other
                .map(|s| s.to_string())
                .unwrap_or_else(|| "unknown".into()),
        },
    }
}

//! Refresh: look at the machines and say how they differ from the state. The result is data
//! that `plan` takes; all the looking goes through `Host`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::config::Config;
use crate::hosts::{facts, Cmd, HostError, HostPool};
use crate::plan::{Observations, Observed, Orphan};
use crate::resources::container::{LABEL_ADDRESS, LABEL_CONFIG_HASH, LABEL_LINEAGE};
use crate::state::State;

/// The nodes refresh must look at: those holding recorded resources, and those where the
/// configuration puts containers (untracked ones may be there).
pub fn nodes_to_refresh(config: &Config, state: &State) -> Vec<String> {
    let mut set: BTreeSet<String> = state
        .resources
        .values()
        .filter_map(|r| r.node.clone())
        .collect();
    for r in &config.resources {
        if r.kind == crate::config::ResourceKind::Container {
            if let Some(n) = &r.node {
                set.insert(n.clone());
            }
        }
    }
    set.into_iter()
        .filter(|n| config.nodes.contains_key(n))
        .collect()
}

/// Observe every recorded attachment and container, and find untracked containers: connect to
/// `nodes` and observe each one as soon as it is connected. Nodes that cannot be reached are
/// returned as errors. The pool is handed back for reuse (an apply after the refresh).
pub async fn connect_and_refresh(
    config: &Config,
    state: &State,
    nodes: &[String],
    opts: &crate::hosts::HostOptions,
) -> (
    HostPool,
    Result<Observations, Vec<std::sync::Arc<HostError>>>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (pool, observed) = tokio::join!(
        HostPool::connect_reporting(config, nodes, opts, Some(tx)),
        observe_as_connected(state, rx)
    );
    let result = finish(observed, &pool, nodes);
    (pool, result)
}

/// What the nodes said, plus an error for every node that could not be reached.
fn finish(
    observed: (Observations, Vec<std::sync::Arc<HostError>>),
    pool: &HostPool,
    nodes: &[String],
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    let (mut out, mut errors) = observed;
    for node in nodes {
        if let Err(e) = pool.get(node) {
            errors.push(e);
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    out.orphans
        .sort_by(|a, b| (&a.node, &a.address).cmp(&(&b.node, &b.address)));
    Ok(out)
}

/// Observe each node that arrives on `ready`, in parallel, until the channel closes.
async fn observe_as_connected(
    state: &State,
    mut ready: tokio::sync::mpsc::UnboundedReceiver<(
        String,
        std::sync::Arc<dyn crate::hosts::Host>,
    )>,
) -> (Observations, Vec<std::sync::Arc<HostError>>) {
    let mut by_node: HashMap<&str, Vec<(&String, &crate::state::ResourceState)>> = HashMap::new();
    for (addr, r) in &state.resources {
        if let Some(n) = &r.node {
            by_node.entry(n.as_str()).or_default().push((addr, r));
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut out = Observations::default();
    let mut errors = Vec::new();
    let collect = |joined: Result<Result<NodeObservations, HostError>, tokio::task::JoinError>,
                   out: &mut Observations,
                   errors: &mut Vec<std::sync::Arc<HostError>>| match joined {
        Ok(Ok((resources, orphans))) => {
            out.resources.extend(resources);
            out.orphans.extend(orphans);
        }
        Ok(Err(e)) => errors.push(std::sync::Arc::new(e)),
        Err(_) => {}
    };
    let mut open = true;
    while open || !tasks.is_empty() {
        tokio::select! {
            next = ready.recv(), if open => match next {
                Some((node, host)) => {
                    let recorded: Vec<(String, crate::state::ResourceState)> = by_node
                        .get(node.as_str())
                        .map(|v| v.iter().map(|(a, r)| ((*a).clone(), (*r).clone())).collect())
                        .unwrap_or_default();
                    let lineage = state.lineage.clone();
                    tasks.spawn(async move {
                        observe_node(&node, host.as_ref(), &lineage, &recorded).await
                    });
                }
                None => open = false,
            },
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                collect(joined, &mut out, &mut errors);
            }
        }
    }
    (out, errors)
}

type NodeObservations = (BTreeMap<String, Observed>, Vec<Orphan>);

async fn observe_node(
    node: &str,
    host: &dyn crate::hosts::Host,
    lineage: &str,
    recorded: &[(String, crate::state::ResourceState)],
) -> Result<NodeObservations, HostError> {
    let mut out = BTreeMap::new();
    let attachments: Vec<&(String, crate::state::ResourceState)> = recorded
        .iter()
        .filter(|(_, r)| r.kind == "attachment")
        .collect();
    // Addresses and containers are asked for at once: one round trip to the node, not two.
    let addresses = async {
        if attachments.is_empty() {
            return Ok(Vec::new());
        }
        let ip = host
            .exec(
                &Cmd::new("ip")
                    .args(["-j", "addr"])
                    .timeout(Duration::from_secs(30)),
            )
            .await?;
        if !ip.success() {
            return Err(HostError::Other {
                node: node.to_string(),
                message: format!("`ip -j addr` failed: {}", ip.stderr.trim()),
            });
        }
        facts::parse_ip_addr(&ip.stdout).map_err(|message| HostError::Other {
            node: node.to_string(),
            message,
        })
    };
    let containers = async {
        let docker = host.docker().await?;
        let mut filters = HashMap::new();
        filters.insert(
            "label".to_string(),
            vec![format!("{LABEL_LINEAGE}={lineage}")],
        );
        docker
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| HostError::Docker {
                node: node.to_string(),
                message: format!("cannot list containers: {e}"),
                help: None,
            })
    };
    let (interfaces, list) = tokio::try_join!(addresses, containers)?;
    for (addr, r) in attachments {
        out.insert(addr.clone(), observe_attachment(&r.config, &interfaces));
    }
    // The container the state records for an address is the one with the recorded id; others
    // with the same address (set aside by an interrupted apply) are untracked.
    let recorded_ids: HashMap<&str, &str> = recorded
        .iter()
        .filter_map(|(a, r)| Some((a.as_str(), r.attributes.get("container_id")?.as_str()?)))
        .collect();
    let mut found: HashMap<String, &bollard::models::ContainerSummary> = HashMap::new();
    let mut claimed: BTreeSet<String> = BTreeSet::new();
    for c in &list {
        let (Some(a), Some(id)) = (
            c.labels.as_ref().and_then(|l| l.get(LABEL_ADDRESS)),
            c.id.as_ref(),
        ) else {
            continue;
        };
        let claim = match recorded_ids.get(a.as_str()) {
            Some(rid) => *rid == id.as_str(),
            // A state without the id (written by an older sparkform): the first by address.
            None => recorded_addrs_has(recorded, a) && !found.contains_key(a),
        };
        if claim {
            found.insert(a.clone(), c);
            claimed.insert(id.clone());
        }
    }
    for (addr, r) in recorded.iter().filter(|(_, r)| r.kind == "container") {
        let obs = match found.get(addr) {
            None => Observed::Missing(format!(
                "container {} is gone from {node}",
                r.config
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or(addr)
            )),
            Some(c) => {
                let mut notes = Vec::new();
                let running = matches!(
                    c.state,
                    Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                );
                if !running {
                    notes.push(format!(
                        "container {} is {} ({})",
                        name_of(c),
                        c.state
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "in an unknown state".into()),
                        c.status.clone().unwrap_or_default()
                    ));
                }
                let hash = c.labels.as_ref().and_then(|l| l.get(LABEL_CONFIG_HASH));
                if hash.is_some_and(|h| *h != r.config_hash) {
                    notes.push(format!("container {} was created from another configuration than the state records", name_of(c)));
                }
                if notes.is_empty() {
                    Observed::InSync
                } else {
                    Observed::Drifted(notes)
                }
            }
        };
        out.insert(addr.clone(), obs);
    }
    let orphans = list
        .iter()
        .filter_map(|c| {
            let addr = c.labels.as_ref()?.get(LABEL_ADDRESS)?;
            (!claimed.contains(c.id.as_deref().unwrap_or_default())).then(|| Orphan {
                address: addr.clone(),
                node: node.to_string(),
                name: name_of(c),
                id: c.id.clone().unwrap_or_default(),
            })
        })
        .collect();
    Ok((out, orphans))
}

fn recorded_addrs_has(recorded: &[(String, crate::state::ResourceState)], address: &str) -> bool {
    recorded.iter().any(|(a, _)| a == address)
}

fn name_of(c: &bollard::models::ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_else(|| c.id.clone().unwrap_or_default())
}

/// An attachment as recorded, against the node's interfaces. Pure.
pub fn observe_attachment(config: &serde_json::Value, interfaces: &[facts::Interface]) -> Observed {
    let iface = config
        .get("interface")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let address = config
        .get("address")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let prefix = config
        .get("prefix_len")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    let mtu = config.get("mtu").and_then(|v| v.as_u64()).unwrap_or(0) as u32;
    let Some(i) = interfaces.iter().find(|i| i.name == iface) else {
        return Observed::Missing(format!("interface {iface} does not exist any more"));
    };
    let want = format!("{address}/{prefix}");
    let mut notes = Vec::new();
    if !i.addresses.contains(&want) {
        notes.push(format!(
            "{want} is not on {iface} (it has {})",
            if i.addresses.is_empty() {
                "no address".to_string()
            } else {
                i.addresses.join(", ")
            }
        ));
    }
    if i.mtu != mtu {
        notes.push(format!(
            "{iface} has MTU {}, the state records {mtu}",
            i.mtu
        ));
    }
    if i.state == "DOWN" {
        notes.push(format!("{iface} is down"));
    }
    if notes.is_empty() {
        Observed::InSync
    } else {
        Observed::Drifted(notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(addrs: &[&str], mtu: u32, state: &str) -> Vec<facts::Interface> {
        vec![facts::Interface {
            name: "enp1s0f0np0".into(),
            mtu,
            state: state.into(),
            addresses: addrs.iter().map(|s| s.to_string()).collect(),
        }]
    }

    #[test]
    fn attachment_drift() {
        let cfg = serde_json::json!({"interface": "enp1s0f0np0", "address": "192.168.200.1", "prefix_len": 24, "mtu": 9000});
        assert_eq!(
            observe_attachment(&cfg, &iface(&["192.168.200.1/24"], 9000, "UP")),
            Observed::InSync
        );
        match observe_attachment(&cfg, &iface(&[], 1500, "UP")) {
            Observed::Drifted(n) => {
                assert_eq!(n.len(), 2, "{n:?}");
                assert!(n[0].contains("192.168.200.1/24 is not on enp1s0f0np0"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            observe_attachment(&cfg, &[]),
            Observed::Missing(_)
        ));
    }
}

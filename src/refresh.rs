//! Refresh: look at the machines and say how they differ from the state. The result is data
//! that `plan` takes; all the looking goes through `Host`.

use std::collections::{BTreeSet, HashMap};

use crate::config::Config;
use crate::hosts::{Host, HostError, HostPool};
use crate::kinds::machine::{machine, NodeObservations, ReadMode};
use crate::kinds::KindId;
use crate::plan::Observations;
use crate::state::{ResourceState, State};

/// The nodes refresh must look at: those holding recorded resources, and those where the
/// configuration puts containers (untracked ones may be there).
pub fn nodes_to_refresh(config: &Config, state: &State) -> Vec<String> {
    let mut set: BTreeSet<String> = state
        .resources
        .values()
        .filter_map(|r| r.node.clone())
        .collect();
    for r in &config.resources {
        if r.kind.kind().found_untracked() {
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
/// returned as errors. The pool is handed back for reuse (an apply after the refresh). `mode`
/// says how far the kinds look (`-refresh=deep`).
pub async fn connect_and_refresh(
    config: &Config,
    state: &State,
    nodes: &[String],
    opts: &crate::hosts::HostOptions,
    mode: ReadMode,
) -> (
    HostPool,
    Result<Observations, Vec<std::sync::Arc<HostError>>>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (pool, observed) = tokio::join!(
        HostPool::connect_reporting(config, nodes, opts, Some(tx)),
        observe_as_connected(state, rx, true, mode)
    );
    let result = finish(observed, &pool, nodes);
    (pool, result)
}

/// Observe the recorded resources on hosts already connected (tests on fake nodes; an apply that
/// has its pool): the same observation as [`connect_and_refresh`].
pub async fn refresh_hosts(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    refresh_hosts_as(state, hosts, ReadMode::Normal).await
}

/// [`refresh_hosts`], looking as far as `mode` says.
pub async fn refresh_hosts_as(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
    mode: ReadMode,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    observe_hosts(state, hosts, true, mode).await
}

/// Observe only what `state` records on hosts already connected, looking for nothing untracked
/// (whether a rollback restored what it undid).
pub async fn observe_recorded(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    observe_hosts(state, hosts, false, ReadMode::Normal).await
}

async fn observe_hosts(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
    untracked: bool,
    mode: ReadMode,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for h in hosts {
        let _ = tx.send(h);
    }
    drop(tx);
    let (mut out, errors) = observe_as_connected(state, rx, untracked, mode).await;
    if !errors.is_empty() {
        return Err(errors);
    }
    out.orphans
        .sort_by(|a, b| (&a.node, &a.address).cmp(&(&b.node, &b.address)));
    Ok(out)
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
    mut ready: tokio::sync::mpsc::UnboundedReceiver<(String, std::sync::Arc<dyn Host>)>,
    untracked: bool,
    mode: ReadMode,
) -> (Observations, Vec<std::sync::Arc<HostError>>) {
    let mut by_node: HashMap<&str, Vec<(&String, &ResourceState)>> = HashMap::new();
    for (addr, r) in &state.resources {
        if let Some(n) = &r.node {
            by_node.entry(n.as_str()).or_default().push((addr, r));
        }
    }
    let mut tasks = crate::tasks::KeyedTasks::new();
    let mut out = Observations::default();
    let mut errors = Vec::new();
    let collect = |node: String,
                   joined: Result<Result<NodeObservations, HostError>, String>,
                   out: &mut Observations,
                   errors: &mut Vec<std::sync::Arc<HostError>>| match joined {
        Ok(Ok((resources, orphans))) => {
            out.resources.extend(resources);
            out.orphans.extend(orphans);
        }
        Ok(Err(e)) => errors.push(std::sync::Arc::new(e)),
        Err(message) => errors.push(std::sync::Arc::new(HostError::Other { node, message })),
    };
    let mut open = true;
    while open || !tasks.is_empty() {
        tokio::select! {
            next = ready.recv(), if open => match next {
                Some((node, host)) => {
                    let recorded: Vec<(String, ResourceState)> = by_node
                        .get(node.as_str())
                        .map(|v| v.iter().map(|(a, r)| ((*a).clone(), (*r).clone())).collect())
                        .unwrap_or_default();
                    let lineage = state.lineage.clone();
                    tasks.spawn(node, async move {
                        observe_node(host.as_ref(), &lineage, &recorded, untracked, mode).await
                    });
                }
                None => open = false,
            },
            Some((node, joined)) = tasks.next(), if !tasks.is_empty() => {
                collect(node, joined, &mut out, &mut errors);
            }
        }
    }
    (out, errors)
}

/// Every kind looks at the node at once: one round trip to it, not one per kind. With
/// `untracked`, also the kinds that find objects nobody recorded; otherwise only the kinds of
/// the recorded resources, and what they find untracked is dropped.
async fn observe_node(
    host: &dyn Host,
    lineage: &str,
    recorded: &[(String, ResourceState)],
    untracked: bool,
    mode: ReadMode,
) -> Result<NodeObservations, HostError> {
    let looks = KindId::ALL.iter().filter_map(|&kind| {
        let mine: Vec<(String, ResourceState)> = recorded
            .iter()
            .filter(|(_, r)| r.kind == kind)
            .cloned()
            .collect();
        (!mine.is_empty() || (untracked && kind.kind().found_untracked()))
            .then_some(async move { machine(kind).observe(host, lineage, &mine, mode).await })
    });
    let mut out = NodeObservations::default();
    for (resources, orphans) in futures_util::future::try_join_all(looks).await? {
        out.0.extend(resources);
        if untracked {
            out.1.extend(orphans);
        }
    }
    Ok(out)
}

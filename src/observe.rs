//! Observe: every kind looks at its recorded objects on every node (`Machine::observe`) and
//! says how they differ from the state, and finds its labelled objects the state lost. What a
//! `-refresh` asks for (`ops::refresh`, `ops::prepare`); the result is data that `plan`
//! takes, and all the looking goes through `Host`.

use std::collections::{BTreeSet, HashMap};

use crate::config::Config;
use crate::hosts::{Host, HostError, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::{machine, NodeObservations, ReadMode};
use crate::plan::{Foreign, Observations};
use crate::state::{ResourceState, State};
use crate::vocabulary::KindId;

/// The nodes refresh must look at: those holding recorded resources, and those where the
/// configuration puts containers (untracked ones may be there).
pub fn nodes_to_observe(config: &Config, state: &State) -> Vec<String> {
    let mut set: BTreeSet<String> = state
        .resources
        .values()
        .filter_map(|r| r.node.clone())
        .collect();
    for r in &config.resources {
        if r.kind.kind().description().found_untracked {
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
pub async fn connect_and_observe(
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
    let wanted = unrecorded_by_node(config, state);
    let (pool, observed) = tokio::join!(
        HostPool::connect_reporting(config, nodes, opts, Some(tx)),
        observe_as_connected(state, rx, true, mode, &wanted)
    );
    let result = finish(observed, &pool, nodes);
    (pool, result)
}

/// Observe the recorded resources on hosts already connected (tests on fake nodes; an apply that
/// has its pool): the same observation as [`connect_and_observe`].
pub async fn observe_hosts(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    observe_hosts_as(state, hosts, ReadMode::Normal).await
}

/// [`observe_hosts`], looking as far as `mode` says.
pub async fn observe_hosts_as(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
    mode: ReadMode,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    observe_each_host(state, hosts, true, mode).await
}

/// Observe only what `state` records on hosts already connected, looking for nothing untracked
/// (whether a rollback restored what it undid).
pub async fn observe_recorded(
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    observe_each_host(state, hosts, false, ReadMode::Normal).await
}

async fn observe_each_host(
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
    let (mut out, errors) =
        observe_as_connected(state, rx, untracked, mode, &Unrecorded::new()).await;
    if !errors.is_empty() {
        return Err(errors);
    }
    out.orphans
        .sort_by(|a, b| (&a.node, &a.address).cmp(&(&b.node, &b.address)));
    Ok(out)
}

/// The definitions' resources the state does not record, by node and kind: where refresh
/// looks for objects a lost or replaced state left (`Machine::find_foreign`).
type Unrecorded = HashMap<String, Vec<(KindId, String)>>;

fn unrecorded_by_node(config: &Config, state: &State) -> Unrecorded {
    let mut out = Unrecorded::new();
    for r in &config.resources {
        if let (Some(node), false) = (&r.node, state.resources.contains_key(&r.address)) {
            out.entry(node.clone())
                .or_default()
                .push((r.kind, r.address.clone()));
        }
    }
    out
}

/// [`observe_hosts_as`] that also looks for what the definitions declare and the state
/// lacks, under another lineage (as [`connect_and_observe`] does).
pub async fn observe_hosts_for(
    config: &Config,
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
    mode: ReadMode,
) -> Result<Observations, Vec<std::sync::Arc<HostError>>> {
    let (mut out, errors) = observe_listed(config, state, hosts, mode).await;
    if !errors.is_empty() {
        return Err(errors);
    }
    out.orphans
        .sort_by(|a, b| (&a.node, &a.address).cmp(&(&b.node, &b.address)));
    out.foreign.sort();
    Ok(out)
}

/// Where there is no state at all: what the definitions' addresses have running under a
/// lineage (a lost state), on the nodes that answer; a node that does not is left out (there
/// is nothing recorded to refresh, so it stops nothing).
pub async fn find_foreign_hosts(
    config: &Config,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
) -> Vec<Foreign> {
    let none = State::new();
    let (out, _unreachable) = observe_listed(config, &none, hosts, ReadMode::Normal).await;
    let mut foreign = out.foreign;
    foreign.sort();
    foreign
}

async fn observe_listed(
    config: &Config,
    state: &State,
    hosts: Vec<(String, std::sync::Arc<dyn Host>)>,
    mode: ReadMode,
) -> (Observations, Vec<std::sync::Arc<HostError>>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for h in hosts {
        let _ = tx.send(h);
    }
    drop(tx);
    let wanted = unrecorded_by_node(config, state);
    observe_as_connected(state, rx, true, mode, &wanted).await
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
    out.foreign.sort();
    Ok(out)
}

/// Observe each node that arrives on `ready`, in parallel, until the channel closes.
async fn observe_as_connected(
    state: &State,
    mut ready: tokio::sync::mpsc::UnboundedReceiver<(String, std::sync::Arc<dyn Host>)>,
    untracked: bool,
    mode: ReadMode,
    unrecorded: &Unrecorded,
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
                   joined: Result<Result<(NodeObservations, Vec<Foreign>), HostError>, String>,
                   out: &mut Observations,
                   errors: &mut Vec<std::sync::Arc<HostError>>| match joined {
        Ok(Ok(((resources, orphans), foreign))) => {
            out.resources.extend(resources);
            out.orphans.extend(orphans);
            out.foreign.extend(foreign);
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
                    let wanted = unrecorded.get(&node).cloned().unwrap_or_default();
                    tasks.spawn(node, async move {
                        let host = host.as_ref();
                        tokio::try_join!(
                            observe_node(host, &lineage, &recorded, untracked, mode),
                            find_foreign(host, &lineage, &wanted)
                        )
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

/// Every kind with resources in `wanted` looks at the node for them under another lineage.
async fn find_foreign(
    host: &dyn Host,
    lineage: &str,
    wanted: &[(KindId, String)],
) -> Result<Vec<Foreign>, HostError> {
    let looks = KindId::ALL.iter().filter_map(|&kind| {
        let addresses: Vec<String> = wanted
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, a)| a.clone())
            .collect();
        (!addresses.is_empty())
            .then_some(async move { machine(kind).find_foreign(host, lineage, &addresses).await })
    });
    let found = futures_util::future::try_join_all(looks).await?;
    Ok(found.into_iter().flatten().collect())
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
        (!mine.is_empty() || (untracked && kind.kind().description().found_untracked))
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

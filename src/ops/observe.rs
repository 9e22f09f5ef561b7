//! What the machines say about the values a definition leaves to them, for the second
//! evaluation of a plan (`config::load_observed`): read on the connections a refresh opened,
//! and on the nodes [`connect_for_facts`] adds so that the first plan of a deployment (no
//! state, nothing to refresh) has them too. Each source of observed values is one function
//! here, called from [`observe`]: the node facts now (what the kinds read at plan time is
//! `Machine::read`'s, through `ops::definitions`).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Config, Node, NodeObserved, Observed};
use crate::diag::Diag;
use crate::events::{emit, Event, Sender};
use crate::hosts::{facts, Host, HostOptions, HostPool};

/// Everything observed on the connected nodes, and a warning for each node whose facts could
/// not be read (what it leaves unset then stays unset): a connected node that failed to
/// answer, or a node that needs facts and could not be connected.
pub async fn observe(config: &Config, pool: &HostPool) -> (Observed, Vec<Diag>) {
    let mut warnings = Vec::new();
    let nodes = node_facts(config, pool, &mut warnings).await;
    let observed = Observed {
        nodes,
        ..Observed::default()
    };
    (observed, warnings)
}

/// The nodes (addresses) whose facts would fill something: they leave `unified_memory`,
/// `memory_gib` or (where GPU devices are expected) `gpus` unset, and their name is theirs
/// alone (facts are keyed by name).
pub fn nodes_needing_facts(config: &Config) -> Vec<String> {
    let names = name_counts(config);
    config
        .nodes
        .values()
        .filter(|n| names.get(n.name.as_str()) == Some(&1) && leaves_facts_unset(n))
        .map(|n| n.address.clone())
        .collect()
}

fn leaves_facts_unset(n: &Node) -> bool {
    n.unified_memory.is_none() || n.memory_gib.is_none() || (n.gpus.is_none() && n.gpu_devices)
}

/// `pool` (the refresh's connections, if it opened any) with connections added to the nodes
/// that need facts and are not in it yet; `None` when no node needs any and there was no pool.
/// The apply reuses the pool, so it makes no second handshake with these nodes. A node that
/// cannot be reached is kept as an error in the pool, which [`observe`] turns into a warning.
pub async fn connect_for_facts(
    config: &Config,
    pool: Option<HostPool>,
    hosts: &HostOptions,
    events: &Sender,
) -> Option<HostPool> {
    let missing: Vec<String> = nodes_needing_facts(config)
        .into_iter()
        .filter(|n| {
            pool.as_ref()
                .is_none_or(|p| p.get(n).is_err() && !p.errors().contains_key(n))
        })
        .collect();
    if missing.is_empty() {
        return pool;
    }
    match pool {
        Some(mut p) => {
            p.connect_more(config, &missing, hosts).await;
            Some(p)
        }
        None => {
            // Nothing was refreshed (no state yet): this is all the looking the plan does.
            emit(
                events,
                Event::Refreshing {
                    nodes: missing.len(),
                },
            );
            Some(HostPool::connect(config, &missing, hosts).await)
        }
    }
}

fn name_counts(config: &Config) -> BTreeMap<&str, usize> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for n in config.nodes.values() {
        *names.entry(n.name.as_str()).or_default() += 1;
    }
    names
}

/// `gpus`, `memory_gib` and `unified_memory` as each connected node shows them, by node name
/// (what `Observed` is keyed by). A name two nodes share (in different modules) is left out:
/// their facts could not be told apart.
async fn node_facts(
    config: &Config,
    pool: &HostPool,
    warnings: &mut Vec<Diag>,
) -> BTreeMap<String, NodeObserved> {
    let names = name_counts(config);
    let mut tasks = crate::tasks::KeyedTasks::new();
    for (address, host) in pool.connected() {
        let Some(node) = config.nodes.get(address) else {
            continue;
        };
        if names.get(node.name.as_str()) != Some(&1) {
            continue;
        }
        let host: Arc<dyn Host> = host.clone();
        tasks.spawn(node.name.clone(), async move {
            facts::observe_sizes(host.as_ref()).await
        });
    }
    let mut out = BTreeMap::new();
    while let Some((name, joined)) = tasks.next().await {
        let why = match joined {
            Ok(Ok(seen)) => {
                out.insert(name, seen);
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(panic) => panic,
        };
        warnings.push(cannot_read(&name, &why));
    }
    let needing = nodes_needing_facts(config);
    for (address, e) in pool.errors() {
        if let Some(node) = config
            .nodes
            .get(address)
            .filter(|_| needing.contains(address))
        {
            warnings.push(cannot_read(&node.name, &e.to_string()));
        }
    }
    out
}

fn cannot_read(name: &str, why: &str) -> Diag {
    Diag::warning(
        "plan::node_facts",
        format!("cannot read the facts of node \"{name}\": {why}"),
    )
    .help("the gpus, memory_gib and unified_memory it leaves unset stay unset in this plan")
}

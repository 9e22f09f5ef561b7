//! The node facts (`gpus`, `memory_gib`, `unified_memory`) a definition leaves to the
//! machines, read in `ops::prepare`'s read phase beside the kinds' plan-time reads, on its
//! pool: on the nodes refreshed and on those that leave a fact unset ([`nodes_needing_facts`]:
//! all of them on a first plan, with no state).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Config, Node, NodeReadings, Readings};
use crate::diag::Diag;
use crate::hosts::{Host, HostPool};
use crate::inspect::facts;

/// The facts of `nodes` (addresses) connected in `pool`, and a warning for each node whose
/// facts could not be read (what it leaves unset then stays unset): a connected node that
/// failed to answer, or a node that needs facts and could not be connected.
pub async fn read(config: &Config, pool: &HostPool, nodes: &[String]) -> (Readings, Vec<Diag>) {
    let mut warnings = Vec::new();
    let nodes = node_facts(config, pool, nodes, &mut warnings).await;
    let observed = Readings {
        nodes,
        ..Readings::default()
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

fn name_counts(config: &Config) -> BTreeMap<&str, usize> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for n in config.nodes.values() {
        *names.entry(n.name.as_str()).or_default() += 1;
    }
    names
}

/// `gpus`, `memory_gib` and `unified_memory` as each connected node shows them, by node name
/// (what `Readings` is keyed by). A name two nodes share (in different modules) is left out:
/// their facts could not be told apart.
async fn node_facts(
    config: &Config,
    pool: &HostPool,
    on: &[String],
    warnings: &mut Vec<Diag>,
) -> BTreeMap<String, NodeReadings> {
    let names = name_counts(config);
    let mut tasks = crate::tasks::KeyedTasks::new();
    for (address, host) in pool.connected().filter(|(a, _)| on.contains(*a)) {
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

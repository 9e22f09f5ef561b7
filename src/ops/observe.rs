//! What the machines say about the values a definition leaves to them, gathered on the
//! connections a refresh opened, for the second evaluation of a plan (`config::load_observed`).
//! Each source of observed values is one function here, called from [`observe`]: the node
//! facts now; model revisions resolved on a node go beside them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Config, NodeObserved, Observed};
use crate::diag::Diag;
use crate::hosts::{facts, Host, HostPool};

/// Everything observed on the connected nodes, and a warning for each node whose facts could
/// not be read (what it leaves unset then stays unset).
pub async fn observe(config: &Config, pool: &HostPool) -> (Observed, Vec<Diag>) {
    let mut warnings = Vec::new();
    let nodes = node_facts(config, pool, &mut warnings).await;
    let observed = Observed {
        nodes,
        ..Observed::default()
    };
    (observed, warnings)
}

/// `gpus`, `memory_gib` and `unified_memory` as each connected node shows them, by node name
/// (what `Observed` is keyed by). A name two nodes share (in different modules) is left out:
/// their facts could not be told apart.
async fn node_facts(
    config: &Config,
    pool: &HostPool,
    warnings: &mut Vec<Diag>,
) -> BTreeMap<String, NodeObserved> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for n in config.nodes.values() {
        *names.entry(n.name.as_str()).or_default() += 1;
    }
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
        warnings.push(
            Diag::warning(
                "plan::node_facts",
                format!("cannot read the facts of node \"{name}\": {why}"),
            )
            .help(
                "the gpus, memory_gib and unified_memory it leaves unset stay unset in this plan",
            ),
        );
    }
    out
}

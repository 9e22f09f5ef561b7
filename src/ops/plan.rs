//! The plan step of `ops::prepare`, once the definitions are evaluated with what was read and
//! the refresh looked: the `import` blocks' objects observed (even with `-refresh=false`: an
//! import is nothing without it), then the pure `plan::plan`. Also what decides whether node
//! facts call for an evaluation again, and which warnings of an evaluation are new.

use crate::config::{Config, Readings};
use crate::diag::Diag;
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::plan::{Plan, PlanOptions};
use crate::state::State;

use super::OpError;

/// Observe the `import` blocks' objects on `pool` (connecting the nodes it lacks), then plan
/// `config` against `state` with `options` (the refresh's observations in it).
pub(super) async fn plan_on(
    config: &Config,
    graph: &Graph,
    state: &State,
    mut options: PlanOptions,
    pool: &mut Option<HostPool>,
    hosts: &HostOptions,
) -> Result<Plan, OpError> {
    let imports =
        super::import::observe_blocks(config, state, options.generate_config, pool, hosts).await?;
    options.imports.extend(imports);
    Ok(crate::plan::plan(config, graph, state, &options)?)
}

/// The warnings of the evaluation `again` that the first, `first`, did not have (the caller
/// showed those).
pub(super) fn new_warnings(first: &Config, again: &Config) -> Vec<Diag> {
    let shown = &first.warnings;
    again
        .warnings
        .iter()
        .filter(|w| !shown.iter().any(|s| s.message == w.message))
        .cloned()
        .collect()
}

/// Whether the node facts of `observed` fill a value `config` leaves unset or contradict one
/// it sets.
pub(super) fn facts_matter(config: &Config, observed: &Readings) -> bool {
    config.nodes.values().any(|n| {
        observed.nodes.get(&n.name).is_some_and(|seen| {
            let declared = n.declared_facts();
            seen.fill(&declared, n.gpu_devices) != declared
                || !seen.disagreements(&declared, n.gpu_devices).is_empty()
        })
    })
}

//! Refresh as an operation: which nodes to look at, what they show, progress as an event.

use crate::config::Config;
use crate::events::{emit, Event, Sender};
use crate::hosts::{HostOptions, HostPool};
use crate::plan::Observations;
use crate::refresh::{connect_and_refresh, nodes_to_refresh};
use crate::state::State;

use super::OpError;

/// Observe the machines the state and the configuration put resources on. The connections are
/// handed back (`None` when no node needed looking at) so an apply can reuse them; on error
/// they are closed.
pub async fn refresh(
    config: &Config,
    state: &State,
    hosts: &HostOptions,
    events: &Sender,
) -> Result<(Observations, Option<HostPool>), OpError> {
    let nodes = nodes_to_refresh(config, state);
    if nodes.is_empty() {
        return Ok((Observations::default(), None));
    }
    emit(events, Event::Refreshing { nodes: nodes.len() });
    let (pool, observed) = connect_and_refresh(config, state, &nodes, hosts).await;
    match observed {
        Ok(o) => Ok((o, Some(pool))),
        Err(errors) => {
            pool.close().await;
            Err(OpError::Refresh(errors))
        }
    }
}

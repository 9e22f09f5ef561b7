//! Plan as an operation: refresh when asked (and when there is a state to compare), then the
//! pure `plan::plan`.

use crate::config::Config;
use crate::events::Sender;
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::plan::{Plan, PlanOptions};
use crate::state::State;

use super::OpError;

pub struct PlanRequest<'a> {
    pub config: &'a Config,
    pub graph: &'a Graph,
    /// The state on disk; `None` when nothing was applied yet (nothing to refresh).
    pub recorded: Option<&'a State>,
    /// Look at the machines first.
    pub refresh: bool,
    /// `-replace`, `-target`; observations are filled by the refresh.
    pub options: PlanOptions,
    pub hosts: HostOptions,
}

/// The plan, and the refresh's connections when it opened any (close them, or hand them to
/// an apply).
pub async fn plan(
    req: PlanRequest<'_>,
    events: &Sender,
) -> Result<(Plan, Option<HostPool>), OpError> {
    let empty = State::new();
    let state = req.recorded.unwrap_or(&empty);
    let mut options = req.options;
    let mut pool = None;
    if req.refresh && req.recorded.is_some() {
        let (observations, p) =
            super::refresh::refresh(req.config, state, &req.hosts, events).await?;
        options.observations = Some(observations);
        pool = p;
    }
    // `import` blocks: what runs is observed (even with -refresh=false: an import is nothing
    // without it).
    match super::import::observe_blocks(
        req.config,
        state,
        options.generate_config,
        &mut pool,
        &req.hosts,
    )
    .await
    {
        Ok(imports) => options.imports.extend(imports),
        Err(e) => {
            if let Some(p) = pool {
                p.close().await;
            }
            return Err(e);
        }
    }
    match crate::plan::plan(req.config, req.graph, state, &options) {
        Ok(plan) => Ok((plan, pool)),
        Err(d) => {
            if let Some(p) = pool {
                p.close().await;
            }
            Err(d.into())
        }
    }
}

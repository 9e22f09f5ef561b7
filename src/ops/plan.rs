//! Plan as an operation: refresh when asked (and when there is a state to compare), then the
//! pure `plan::plan`.
//!
//! Two evaluations when refreshing: the definitions as loaded say which nodes to connect to;
//! refresh looks at them, [`super::observe::observe`] reads what the definitions leave to the
//! machines (node facts) on the same connections, and when that fills or contradicts
//! something, the definitions are evaluated again with it (`config::load_observed`) and the
//! plan is made from that evaluation.

use crate::config::{Config, Observed};
use crate::diag::Diag;
use crate::events::Sender;
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::plan::{Observations, Plan, PlanOptions};
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

/// What [`plan`] made.
pub struct Planned {
    pub plan: Plan,
    /// The refresh's connections when it opened any (close them, or hand them to an apply).
    pub pool: Option<HostPool>,
    /// The definitions evaluated again with what the machines said, when it changed anything:
    /// the plan is this evaluation's, and an apply of the plan must use it.
    pub reloaded: Option<Box<(Config, Graph)>>,
    /// Warnings the caller has not shown with the first evaluation: where the node facts
    /// contradict the definitions, checks that fail once the facts are in, facts that could not
    /// be read.
    pub warnings: Vec<Diag>,
}

/// Refresh (when asked and there is a state), read the node facts there, evaluate again if they
/// matter, plan.
pub async fn plan(req: PlanRequest<'_>, events: &Sender) -> Result<Planned, OpError> {
    let refreshed = if req.refresh && req.recorded.is_some() {
        let empty = State::new();
        let state = req.recorded.unwrap_or(&empty);
        Some(super::refresh::refresh(req.config, state, &req.hosts, events).await?)
    } else {
        None
    };
    plan_refreshed(req, refreshed).await
}

/// The rest of [`plan`] once refresh has looked (`None`: it did not): the node facts on the
/// refresh's connections, the second evaluation, the plan. Tests hand it fake nodes.
pub async fn plan_refreshed(
    req: PlanRequest<'_>,
    refreshed: Option<(Observations, Option<HostPool>)>,
) -> Result<Planned, OpError> {
    let empty = State::new();
    let state = req.recorded.unwrap_or(&empty);
    let mut options = req.options;
    let mut pool = None;
    let mut warnings = Vec::new();
    let mut observed = Observed::default();
    if let Some((observations, p)) = refreshed {
        options.observations = Some(observations);
        if let Some(p) = &p {
            let (o, w) = super::observe::observe(req.config, p).await;
            observed = o;
            warnings = w;
        }
        pool = p;
    }
    let reloaded = match second_evaluation(req.config, &observed) {
        Ok(r) => r,
        Err(e) => {
            close(pool).await;
            return Err(e);
        }
    };
    if let Some(r) = &reloaded {
        let shown = &req.config.warnings;
        warnings.extend(
            r.0.warnings
                .iter()
                .filter(|w| !shown.iter().any(|s| s.message == w.message))
                .cloned(),
        );
    }
    let (config, graph) = match &reloaded {
        Some(r) => (&r.0, &r.1),
        None => (req.config, req.graph),
    };
    match crate::plan::plan(config, graph, state, &options) {
        Ok(plan) => Ok(Planned {
            plan,
            pool,
            reloaded,
            warnings,
        }),
        Err(d) => {
            close(pool).await;
            Err(d.into())
        }
    }
}

/// The definitions evaluated with `observed`, when it fills a value they leave unset or
/// contradicts one they set; `None` when the first evaluation stands.
fn second_evaluation(
    config: &Config,
    observed: &Observed,
) -> Result<Option<Box<(Config, Graph)>>, OpError> {
    let matters = config.nodes.values().any(|n| {
        observed.nodes.get(&n.name).is_some_and(|seen| {
            let declared = n.declared_facts();
            seen.fill(&declared, n.gpu_devices) != declared
                || !seen.disagreements(&declared, n.gpu_devices).is_empty()
        })
    });
    if !matters {
        return Ok(None);
    }
    let again = crate::config::load_observed(&config.dir, &config.vars, observed)
        .map_err(OpError::Config)?;
    let graph = Graph::build(&again)?;
    Ok(Some(Box::new((again, graph))))
}

async fn close(pool: Option<HostPool>) {
    if let Some(p) = pool {
        p.close().await;
    }
}

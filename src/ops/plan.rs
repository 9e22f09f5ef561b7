//! Plan as an operation: refresh when asked (and when there is a state to compare), then the
//! pure `plan::plan`.
//!
//! Two evaluations when refreshing: the definitions as loaded say which nodes to connect to;
//! refresh looks at them, [`super::observe::connect_for_facts`] adds the nodes whose facts
//! would fill something (all of them on the first plan, when there is nothing to refresh),
//! [`super::observe::observe`] reads what the definitions leave to the machines (node facts) on
//! those connections, and when that fills or contradicts something, the definitions are
//! evaluated again with it (`config::load_observed`) and the plan is made from that evaluation.

use crate::config::{Config, Observed};
use crate::diag::Diag;
use crate::events::Sender;
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kinds::machine::ReadMode;
use crate::plan::{Observations, Plan, PlanOptions};
use crate::state::State;

use super::OpError;

pub struct PlanRequest<'a> {
    pub config: &'a Config,
    pub graph: &'a Graph,
    /// The state on disk; `None` when nothing was applied yet (nothing to refresh).
    pub recorded: Option<&'a State>,
    /// Look at the machines first (`ReadMode::looks`), and how far; otherwise the state's
    /// record stands.
    pub refresh: ReadMode,
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
    /// What the machines said (empty without a refresh): a plan file records it, so that
    /// `apply FILE` evaluates the definitions as this plan did.
    pub observed: Observed,
}

/// Refresh (when asked and there is a state), connect the nodes whose facts would fill
/// something, read the node facts there, evaluate again if they matter, plan.
pub async fn plan(req: PlanRequest<'_>, events: &Sender) -> Result<Planned, OpError> {
    let (observations, mut pool) = match req.recorded {
        Some(state) if req.refresh.looks() => {
            let (o, p) =
                super::refresh::refresh(req.config, state, req.refresh, &req.hosts, events).await?;
            (Some(o), p)
        }
        _ => (None, None),
    };
    if req.refresh.looks() {
        pool = super::observe::connect_for_facts(req.config, pool, &req.hosts, events).await;
    }
    plan_connected(req, observations, pool).await
}

/// The rest of [`plan`] once refresh has looked (`observations`; `None`: it did not) and the
/// nodes are connected (`pool`; `None`: no node was): the node facts on those connections, the
/// second evaluation, the plan. Tests hand it fake nodes.
pub async fn plan_connected(
    req: PlanRequest<'_>,
    observations: Option<Observations>,
    pool: Option<HostPool>,
) -> Result<Planned, OpError> {
    let empty = State::new();
    let state = req.recorded.unwrap_or(&empty);
    let mut options = req.options;
    options.observations = observations;
    let (observed, mut warnings) = match &pool {
        Some(p) => super::observe::observe(req.config, p).await,
        None => (Observed::default(), Vec::new()),
    };
    let mut pool = pool;
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
            close(pool).await;
            return Err(e);
        }
    }
    let reloaded = match second_evaluation(req.config, &observed) {
        Ok(r) => r,
        Err(e) => {
            close(pool).await;
            return Err(e);
        }
    };
    if let Some(r) = &reloaded {
        warnings.extend(new_warnings(req.config, &r.0));
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
            observed,
        }),
        Err(d) => {
            close(pool).await;
            Err(d.into())
        }
    }
}

/// The warnings of the second evaluation `again` that the first, `first`, did not have (the
/// caller showed those).
pub(super) fn new_warnings(first: &Config, again: &Config) -> Vec<Diag> {
    let shown = &first.warnings;
    again
        .warnings
        .iter()
        .filter(|w| !shown.iter().any(|s| s.message == w.message))
        .cloned()
        .collect()
}

/// The definitions evaluated with `observed`, when it fills a value they leave unset or
/// contradicts one they set; `None` when the first evaluation stands.
pub fn second_evaluation(
    config: &Config,
    observed: &Observed,
) -> Result<Option<Box<(Config, Graph)>>, OpError> {
    if !facts_matter(config, observed) {
        return Ok(None);
    }
    // The first evaluation may already hold what the kinds read at plan time: keep it, add
    // the node facts.
    let mut all = config.observed.clone();
    all.nodes.clone_from(&observed.nodes);
    let again =
        crate::config::load_observed(&config.dir, &config.vars, &all).map_err(OpError::Config)?;
    let graph = Graph::build(&again)?;
    Ok(Some(Box::new((again, graph))))
}

/// Whether the node facts of `observed` fill a value `config` leaves unset or contradict one
/// it sets.
pub(super) fn facts_matter(config: &Config, observed: &Observed) -> bool {
    config.nodes.values().any(|n| {
        observed.nodes.get(&n.name).is_some_and(|seen| {
            let declared = n.declared_facts();
            seen.fill(&declared, n.gpu_devices) != declared
                || !seen.disagreements(&declared, n.gpu_devices).is_empty()
        })
    })
}

async fn close(pool: Option<HostPool>) {
    if let Some(p) = pool {
        p.close().await;
    }
}

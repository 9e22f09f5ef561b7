//! One prepare pipeline, for every command that plans from the definitions (`plan`,
//! `apply DIR`): the definitions evaluated as written (the caller's [`Evaluated`], whose
//! warnings it showed) → one read phase on one pool of connections (every kind's plan-time
//! `Machine::read` and the node facts, at once) → at most one evaluation again, with everything
//! read → the refresh (the recorded resources observed) on the same pool → the plan. The pool
//! is handed back for an apply, or to be closed; on an error it is closed here.
//!
//! With a [`ReadMode`] that does not look nothing is connected for the reads (the state's
//! record stands in: `-refresh=false`); `import` blocks are observed either way
//! (`ops::import::observe_blocks`, on the same pool).

use std::collections::BTreeMap;

use crate::config::{Config, Readings};
use crate::diag::Diag;
use crate::events::{emit, Event, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool, RoundTrips};
use crate::kinds::machine::ReadMode;
use crate::plan::{Plan, PlanOptions};
use crate::state::State;

use super::definitions::{Definitions, Evaluated};
use super::OpError;

pub struct PrepareRequest<'a> {
    /// The definitions as written (`ops::definitions::load`): the caller showed their warnings.
    pub evaluated: Evaluated,
    /// The state on disk; `None` when nothing was applied yet (nothing to refresh).
    pub recorded: Option<&'a State>,
    /// How the machines are read (`-refresh`): looked at (and how far), or the state's record.
    pub refresh: ReadMode,
    /// `-replace`, `-target`, the key; the observations are the refresh's.
    pub options: PlanOptions,
    pub hosts: HostOptions,
}

/// What [`prepare`] made.
pub struct Prepared {
    /// The definitions the plan was made from (evaluated with what was read): an apply of the
    /// plan uses them.
    pub config: Config,
    pub graph: Graph,
    pub plan: Plan,
    /// Warnings the caller has not shown with the first evaluation: node facts that could not
    /// be read, facts that contradict the definitions, checks that fail once the read values
    /// are in.
    pub warnings: Vec<Diag>,
    /// The node facts read (empty without looking): a plan file records them, so that
    /// `apply FILE` evaluates the definitions as this plan did.
    pub readings: Readings,
    /// What the definitions' image references name on their nodes (empty without looking),
    /// for the lock file.
    pub images: super::lock_file::ImagesSeen,
    /// The connections when any were opened (close them, or hand them to an apply).
    pub pool: Option<HostPool>,
    /// The round trips the plan made on each node it connected (`plan --json`).
    pub round_trips: BTreeMap<String, RoundTrips>,
}

impl Prepared {
    /// Close the connections (a plan that is not applied).
    pub async fn close(&mut self) {
        close(self.pool.take()).await;
    }
}

/// Evaluate, read, evaluate again, refresh, plan (module docs).
pub async fn prepare(req: PrepareRequest<'_>, events: &Sender) -> Result<Prepared, OpError> {
    let PrepareRequest {
        evaluated,
        recorded,
        refresh,
        options,
        hosts,
    } = req;
    let mut pool = connect(evaluated.config(), recorded, refresh, &hosts, events).await;
    // Nothing changes the nodes until the plan is made: its readers share what they read.
    remember(&mut pool, true);
    let made = phases(evaluated, recorded, refresh, options, &hosts, &mut pool).await;
    remember(&mut pool, false);
    let round_trips = pool.as_ref().map(HostPool::round_trips).unwrap_or_default();
    match made {
        Ok((defs, plan, warnings, readings, images)) => Ok(Prepared {
            config: defs.config,
            graph: defs.graph,
            plan,
            warnings,
            readings,
            images,
            pool,
            round_trips,
        }),
        Err(e) => {
            close(pool).await;
            Err(e)
        }
    }
}

/// Everything after connecting, on `pool`.
async fn phases(
    evaluated: Evaluated,
    recorded: Option<&State>,
    refresh: ReadMode,
    options: PlanOptions,
    hosts: &HostOptions,
    pool: &mut Option<HostPool>,
) -> Result<
    (
        Definitions,
        Plan,
        Vec<Diag>,
        Readings,
        super::lock_file::ImagesSeen,
    ),
    OpError,
> {
    let (read, facts, images, mut warnings) = read(&evaluated, recorded, refresh, pool).await?;
    // One evaluation with everything read: the node facts only where they fill or contradict
    // something.
    let mut all = read;
    warnings.append(&mut all.warnings);
    if super::definitions::facts_matter(evaluated.config(), &facts) {
        all.nodes.clone_from(&facts.nodes);
    }
    let lock = evaluated.lock().cloned();
    let upgrade = evaluated.upgrade();
    let defs = evaluated.again(&all)?;
    warnings.extend(defs.warnings.iter().cloned());
    if !upgrade {
        warnings.extend(super::lock_file::image_drift(
            &defs.config,
            lock.as_ref(),
            &images,
        ));
    }
    let observations = match recorded {
        Some(state) if refresh.looks() => {
            Some(super::refresh::refresh_on(&defs.config, state, refresh, pool, hosts).await?)
        }
        // No state: nothing to refresh, but what a lost one left running is worth a look.
        None if refresh.looks() => {
            Some(super::refresh::foreign_on(&defs.config, pool, hosts).await)
        }
        _ => None,
    };
    let empty = State::new();
    let state = recorded.unwrap_or(&empty);
    let mut plan = plan_on(
        &defs.config,
        &defs.graph,
        state,
        PlanOptions {
            observations,
            ..options
        },
        pool,
        hosts,
    )
    .await?;
    let rolled_back = super::rollback::rolled_back_note(state, &plan);
    plan.notes.extend(rolled_back);
    Ok((defs, plan, warnings, facts, images))
}

/// The nodes the read phase and the refresh work on: those the kinds read on, those holding
/// recorded resources or the definitions' containers, those that leave a fact unset.
fn nodes_to_connect(config: &Config, recorded: Option<&State>) -> Vec<String> {
    let mut nodes = super::definitions::read_nodes(config);
    if let Some(state) = recorded {
        nodes.extend(crate::observe::nodes_to_observe(config, state));
    }
    nodes.extend(super::node_facts::nodes_needing_facts(config));
    nodes.sort();
    nodes.dedup();
    nodes
}

/// One connection to each node of [`nodes_to_connect`] when `refresh` looks; `None` when it
/// does not or no node needs looking at.
async fn connect(
    config: &Config,
    recorded: Option<&State>,
    refresh: ReadMode,
    hosts: &HostOptions,
    events: &Sender,
) -> Option<HostPool> {
    if !refresh.looks() {
        return None;
    }
    let nodes = nodes_to_connect(config, recorded);
    if nodes.is_empty() {
        return None;
    }
    emit(events, Event::Refreshing { nodes: nodes.len() });
    Some(HostPool::connect(config, &nodes, hosts).await)
}

/// The read phase: every kind's plan-time read (as `refresh` says), the node facts of the
/// refreshed nodes and of those that leave one unset, and what the image references name on
/// the nodes, at once, on `pool`; with the warnings of the facts that could not be read.
async fn read(
    evaluated: &Evaluated,
    recorded: Option<&State>,
    refresh: ReadMode,
    pool: &Option<HostPool>,
) -> Result<(Readings, Readings, super::lock_file::ImagesSeen, Vec<Diag>), OpError> {
    let config = evaluated.config();
    let empty = HostPool::from_hosts(BTreeMap::new());
    let on = pool.as_ref().unwrap_or(&empty);
    let mut facts_on = super::node_facts::nodes_needing_facts(config);
    if let Some(state) = recorded {
        facts_on.extend(crate::observe::nodes_to_observe(config, state));
    }
    let facts = async {
        match pool {
            Some(p) => super::node_facts::read(config, p, &facts_on).await,
            None => (Readings::default(), Vec::new()),
        }
    };
    let images = async {
        match pool {
            Some(p) => super::lock_file::read_images(config, p).await,
            None => Default::default(),
        }
    };
    let (read, (facts, warnings), images) = tokio::join!(
        super::definitions::read_on(evaluated, on, refresh, recorded),
        facts,
        images
    );
    Ok((read?, facts, images, warnings))
}

fn remember(pool: &mut Option<HostPool>, on: bool) {
    if let Some(p) = pool {
        p.remember(on);
    }
}

async fn close(pool: Option<HostPool>) {
    if let Some(p) = pool {
        p.close().await;
    }
}

/// Observe the `import` blocks' objects on `pool` (connecting the nodes it lacks), then plan
/// `config` against `state` with `options` (the refresh's observations in it).
async fn plan_on(
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

//! Apply and destroy as operations: lock the state, load it, make the plan (from the
//! definitions through `ops::prepare`, from a plan file checked for freshness, or the destroy
//! plan), then, once the caller agreed, run the executor on the definitions the plan was made
//! from. Ctrl-C handling is offered to callers that own a terminal.

use std::path::Path;

use tokio_util::sync::CancellationToken;

use super::definitions::{Evaluated, Pins};
use crate::apply::{ApplyOutcome, ApplyRequest};
use crate::config::Config;
use crate::events::{emit, Event, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::ReadMode;
use crate::plan::planfile::PlanFile;
use crate::plan::{Observations, Plan, PlanOptions};
use crate::state::{State, StateLock, StateStore};

use super::lock_file::LockUpdate;
use super::OpError;

/// Where the plan comes from.
pub enum PlanSource<'a> {
    /// The definitions, read and refreshed as `refresh` says (`ops::prepare`).
    Definitions {
        refresh: ReadMode,
        options: PlanOptions,
    },
    /// A `plan -out` file read from `path`: refused when the state or the definitions changed.
    /// Evaluated with what the file records (`Pins::Planned`), connecting to nothing.
    PlanFile { file: &'a PlanFile, path: &'a Path },
    /// Remove what the deployment owns (only `targets` when given, none of `exclude`): what the
    /// state records and, after a refresh when `refresh` looks, what the machines hold carrying
    /// its labels that the state does not record.
    Destroy {
        targets: Vec<String>,
        exclude: Vec<String>,
        refresh: ReadMode,
        /// `-purge-caches`: remove also what the deleted resources keep by design (their cache
        /// folders), which a destroy otherwise keeps for a later apply.
        purge_caches: bool,
    },
    /// A known-good generation the state recorded (`sparkform rollback`): `number`, or the
    /// newest before the one running now. The definitions say how to reach the nodes and give
    /// the sensitive and ephemeral values; nothing is read at plan time.
    Generation { number: Option<u64> },
}

impl PlanSource<'_> {
    pub fn operation(&self) -> &'static str {
        match self {
            PlanSource::Destroy { .. } => "destroy",
            PlanSource::Generation { .. } => "rollback",
            _ => "apply",
        }
    }
}

pub struct PlanRequest<'a> {
    /// The definitions as written (`ops::definitions::load`; the caller showed their warnings).
    pub evaluated: Evaluated,
    /// `-lockfile=readonly`: a change to `sparkform.lock.hcl` is an error before anything runs.
    pub lockfile_readonly: bool,
    pub store: StateStore,
    pub source: PlanSource<'a>,
    pub hosts: HostOptions,
}

/// A plan ready to apply, holding the state lock until it is applied or dropped.
pub struct LockedPlan {
    pub plan: Plan,
    /// Warnings of the planning the caller has not shown (`ops::prepare::Prepared`'s).
    pub warnings: Vec<crate::diag::Diag>,
    /// The definitions as the plan evaluated them; the apply uses these.
    config: Config,
    graph: Graph,
    store: StateStore,
    state: State,
    pool: Option<HostPool>,
    _lock: StateLock,
    /// `sparkform.lock.hcl` before and after (none for destroy and rollback): written once the
    /// apply succeeded.
    pub lock_file: Option<LockUpdate>,
    /// A rollback's: the generation it puts back, and that generation's definitions digest.
    rollback_to: Option<(u64, String)>,
}

/// Lock, load the state, plan. A lock left by a process that is gone is taken over and said
/// so with [`Event::LockTakenOver`].
pub async fn lock_and_plan(req: PlanRequest<'_>, events: &Sender) -> Result<LockedPlan, OpError> {
    let lock = req.store.lock(req.source.operation())?;
    if let Some(old) = &lock.took_over {
        emit(
            events,
            Event::LockTakenOver {
                pid: old.pid,
                host: old.host.clone(),
                operation: old.operation.clone(),
                started: old.started.clone(),
            },
        );
    }
    let recorded = req.store.load()?;
    let lock_before = req.evaluated.lock().cloned();
    let upgrade = req.evaluated.upgrade();
    // A destroy and a rollback leave the lock file to the definitions.
    let keeps_lock_file = match &req.source {
        PlanSource::Destroy { .. } | PlanSource::Generation { .. } => true,
        PlanSource::PlanFile { file, .. } => file.destroy,
        PlanSource::Definitions { .. } => false,
    };
    let mut rollback_to = None;
    let state = recorded.clone().unwrap_or_default();
    // An apply records sensitive values under the deployment's key: the first one creates it.
    let key = Some(req.store.key_or_create()?);
    let mut images = super::lock_file::ImagesSeen::new();
    let (defs, plan, warnings, pool) = match req.source {
        PlanSource::PlanFile { file, path } if file.destroy => {
            // A destroy's plan was made from the state alone: its freshness is the state's.
            file.check_fresh(path, recorded.as_ref())?;
            let defs = req.evaluated.pin(Pins::Unresolved)?;
            let warnings = defs.warnings.clone();
            ((defs.config, defs.graph), file.plan.clone(), warnings, None)
        }
        PlanSource::PlanFile { file, path } => {
            file.check_fresh(path, recorded.as_ref())?;
            // Evaluated with what the plan was made with, the plan's configurations must still
            // be what the definitions say; the apply then runs that evaluation.
            let defs = req.evaluated.pin(Pins::Planned(file))?;
            check_planned(file, &defs.config, &defs.graph, &state, key)?;
            let warnings = defs.warnings.clone();
            ((defs.config, defs.graph), file.plan.clone(), warnings, None)
        }
        PlanSource::Definitions { refresh, options } => {
            let prepared = super::prepare::prepare(
                super::prepare::PrepareRequest {
                    evaluated: req.evaluated,
                    recorded: recorded.as_ref(),
                    refresh,
                    options: PlanOptions { key, ..options },
                    hosts: req.hosts.clone(),
                },
                events,
            )
            .await?;
            images = prepared.images;
            (
                (prepared.config, prepared.graph),
                prepared.plan,
                prepared.warnings,
                prepared.pool,
            )
        }
        PlanSource::Generation { number } => {
            let planned = super::rollback::plan(req.evaluated, &state, number, key.as_ref())?;
            let (config, graph) = planned.config;
            let mut plan = planned.plan;
            // The one look at the machines: is what the generation ran still there?
            let nodes: Vec<String> = plan
                .changes
                .iter()
                .filter_map(|c| c.node.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let pool = HostPool::connect(&config, &nodes, &req.hosts).await;
            let generation = super::rollback::chosen(&state, Some(planned.number))?;
            let images =
                super::rollback::restored_images(&config, &plan, generation, &pool).await?;
            plan.notes.extend(images);
            rollback_to = Some((planned.number, planned.definitions));
            ((config, graph), plan, planned.warnings, Some(pool))
        }
        PlanSource::Destroy {
            targets,
            exclude,
            refresh,
            purge_caches,
        } => {
            let scope = DestroyScope {
                targets,
                exclude,
                purge_caches,
            };
            let d = planned_destroy(
                req.evaluated,
                &state,
                recorded.is_some(),
                scope,
                refresh,
                &req.hosts,
                events,
            )
            .await?;
            ((d.config, d.graph), d.plan, d.warnings, d.pool)
        }
    };
    let (config, graph) = defs;
    let lock_file = (!keeps_lock_file).then(|| {
        LockUpdate::new(
            &config,
            lock_before.as_ref(),
            upgrade,
            &images,
            recorded.as_ref(),
        )
    });
    let refused = match &lock_file {
        // An image the lock pins that the node no longer has under its reference: running
        // what the node has would not be what the lock says (`-upgrade` takes it).
        Some(_) if !upgrade => super::lock_file::refuse_image_drift(&warnings),
        _ => Ok(()),
    }
    .and_then(|()| match (&lock_file, req.lockfile_readonly) {
        (Some(update), true) => update.refuse_changes(),
        _ => Ok(()),
    });
    if let Err(e) = refused {
        if let Some(p) = pool {
            p.close().await;
        }
        return Err(e);
    }
    Ok(LockedPlan {
        plan,
        warnings,
        config,
        graph,
        store: req.store,
        state,
        pool,
        _lock: lock,
        lock_file,
        rollback_to,
    })
}

/// A saved plan's changes against what the definitions, evaluated as it was made, plan now:
/// the first whose configuration differs refuses it.
fn check_planned(
    file: &PlanFile,
    config: &Config,
    graph: &Graph,
    state: &State,
    key: Option<crate::state::HashKey>,
) -> Result<(), OpError> {
    let opts = PlanOptions {
        key,
        ..PlanOptions::default()
    };
    let now = crate::plan::plan(config, graph, state, &opts)?;
    let stale = file
        .plan
        .changes
        .iter()
        .filter(|c| c.action.is_change() && c.after_hash.is_some())
        .find(|c| {
            now.change(&c.address).and_then(|n| n.after_hash.as_ref()) != c.after_hash.as_ref()
        });
    match stale {
        Some(c) => Err(OpError::DefinitionsChanged(c.address.clone())),
        None => Ok(()),
    }
}

/// What the deletes of a destroy keep by design (`Kind::kept_on_delete`), said in the plan's
/// notes; with `purge`, the deletes remove it too.
fn with_kept(mut plan: Plan, state: &State, purge: bool) -> Plan {
    let mut kept = Vec::new();
    for c in plan.changes.iter_mut() {
        if c.action != crate::plan::Action::Delete || c.orphan.is_some() {
            continue;
        }
        let Some(what) = state
            .resources
            .get(&c.address)
            .and_then(|r| c.kind.kind().holds(&r.attributes).kept_on_delete)
        else {
            continue;
        };
        c.purge = purge;
        let node = c
            .node
            .as_deref()
            .map(|n| format!(" on {n}"))
            .unwrap_or_default();
        kept.push(format!("{}: {what}{node}", c.address));
    }
    if !kept.is_empty() {
        plan.notes.push(if purge {
            format!(
                "-purge-caches: the deletes remove also {}",
                kept.join("; ")
            )
        } else {
            format!(
                "Kept for a later apply of the same image (`destroy -purge-caches` removes them): {}",
                kept.join("; ")
            )
        });
    }
    plan
}

/// What a destroy removes, as `destroy` and `plan -destroy` name it.
pub struct DestroyScope {
    /// Only these resources (and what depends on them) when given.
    pub targets: Vec<String>,
    /// None of these.
    pub exclude: Vec<String>,
    /// `-purge-caches`: also what the deleted resources keep by design.
    pub purge_caches: bool,
}

/// A destroy's plan and what it was made with.
pub struct PlannedDestroy {
    pub config: Config,
    pub graph: Graph,
    pub plan: Plan,
    pub warnings: Vec<crate::diag::Diag>,
    /// The connections, when the refresh opened any (close them, or hand them to an apply).
    pub pool: Option<HostPool>,
}

/// Plan the removal of what the deployment owns: what `state` records and, after a refresh
/// when `refresh` looks (and a state was `recorded`), what the machines hold with its labels
/// that the state does not record. The definitions only say how to reach the nodes: nothing is
/// read at plan time.
pub async fn planned_destroy(
    evaluated: Evaluated,
    state: &State,
    recorded: bool,
    scope: DestroyScope,
    refresh: ReadMode,
    hosts: &HostOptions,
    events: &Sender,
) -> Result<PlannedDestroy, OpError> {
    let defs = evaluated.pin(Pins::Unresolved)?;
    // Look first: a run killed between creating something and recording it, or a state that
    // lost an entry, leaves labelled containers only the machines show.
    let (observations, pool) = if refresh.looks() && recorded {
        let (o, p) = super::refresh::refresh(&defs.config, state, refresh, hosts, events).await?;
        (Some(o), p)
    } else {
        (None, None)
    };
    let planned = plan_destroy(
        &defs.config,
        state,
        scope.targets,
        scope.exclude,
        observations,
    )
    .map(|p| with_kept(p, state, scope.purge_caches));
    match planned {
        Ok(plan) => Ok(PlannedDestroy {
            config: defs.config,
            graph: defs.graph,
            plan,
            warnings: defs.warnings,
            pool,
        }),
        Err(e) => {
            if let Some(p) = pool {
                p.close().await;
            }
            Err(e)
        }
    }
}

/// What `destroy` removes: every resource the state records and, from `observations` (a
/// refresh), every object on the machines carrying the deployment's labels that the state does
/// not record (said so in the plan), only `targets` when given, none of `exclude`.
pub fn plan_destroy(
    config: &Config,
    state: &State,
    targets: Vec<String>,
    exclude: Vec<String>,
    observations: Option<Observations>,
) -> Result<Plan, OpError> {
    let empty = Config {
        resources: Vec::new(),
        outputs: Vec::new(),
        ..config.clone()
    };
    let graph = Graph::build(&empty)?;
    let options = PlanOptions {
        targets,
        exclude,
        observations,
        ..PlanOptions::default()
    };
    Ok(crate::plan::plan(&empty, &graph, state, &options)?)
}

pub struct RunOptions {
    pub parallelism: usize,
    pub rollback: bool,
    pub hosts: HostOptions,
}

impl LockedPlan {
    /// Close the refresh's connections: a prompt may keep a human for minutes, and an idle
    /// master connection is not worth keeping that long. The apply connects again.
    pub async fn drop_connections(&mut self) {
        if let Some(p) = self.pool.take() {
            p.close().await;
        }
    }

    /// The definitions the plan was made from (what the apply runs).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Write `sparkform.lock.hcl` when the plan changes it: lines saying what it wrote.
    pub fn write_lock(&self) -> Result<Vec<String>, OpError> {
        self.lock_file
            .as_ref()
            .map_or(Ok(Vec::new()), write_lock_file)
    }

    /// Run the plan, then write the lock file when it succeeded; the state lock is released
    /// when it returns.
    pub async fn apply(
        self,
        opts: RunOptions,
        events: Sender,
        cancel: CancellationToken,
    ) -> ApplyOutcome {
        let lock_file = self.lock_file.clone();
        let config = self.config.clone();
        let store = self.store.clone();
        let before = self.state.generations.last().map(|g| g.number);
        let mut outcome = crate::apply::apply(ApplyRequest {
            config: &self.config,
            graph: &self.graph,
            plan: &self.plan,
            store: &self.store,
            state: self.state,
            parallelism: opts.parallelism,
            rollback: opts.rollback,
            hosts: opts.hosts,
            pool: self.pool,
            events,
            cancel,
        })
        .await;
        if let (Some((number, definitions)), true) = (self.rollback_to, outcome.ok) {
            mark_rollback(&store, &mut outcome, before, number, definitions);
        }
        if let (Some(update), true) = (&lock_file, outcome.ok) {
            match write_lock_file(&update.applied(&config, &outcome.state)) {
                Ok(notes) => outcome.notes.extend(notes),
                Err(OpError::Local(message)) => outcome.warnings.push(message),
                Err(other) => outcome.warnings.push(format!("{other:?}")),
            }
        }
        outcome
    }
}

/// The generation a rollback's apply recorded says which one it put back, and carries that
/// one's definitions digest (what runs is what those definitions made).
fn mark_rollback(
    store: &StateStore,
    outcome: &mut ApplyOutcome,
    before: Option<u64>,
    number: u64,
    definitions: String,
) {
    let Some(g) = outcome.state.generations.last_mut() else {
        return;
    };
    if Some(g.number) == before {
        return; // nothing ran, so nothing was recorded
    }
    g.rollback_to = Some(number);
    g.definitions = definitions;
    if let Err(e) = store.write(&mut outcome.state) {
        outcome.warnings.push(format!(
            "the state could not record the rollback's generation: {e}"
        ));
    }
}

/// Write the lock file when it changes: the lines that say so.
fn write_lock_file(update: &LockUpdate) -> Result<Vec<String>, OpError> {
    if !update.write()? {
        return Ok(Vec::new());
    }
    let mut notes = vec![format!(
        "\nWrote {} (commit it with the definitions):",
        crate::lock_file::FILE
    )];
    notes.extend(update.changes().iter().map(|c| format!("  {c}")));
    Ok(notes)
}

/// What `sparkform apply`, `destroy` and `rollback` ask: a plan (`plan`), run as `run` says
/// once it is approved: by whoever runs the command when `ask`, else at once.
pub struct ApplyCommand<'a> {
    pub plan: PlanRequest<'a>,
    pub run: RunOptions,
    pub ask: bool,
}

/// How an apply talks to whoever runs it, between and during its phases.
pub trait ApplyUi {
    /// Where the plan's notes go (a state lock taken over, a refresh), and the task that draws
    /// them, done once the sender is dropped. Called inside the runtime.
    fn notes(&mut self) -> (Sender, tokio::task::JoinHandle<()>);
    /// The plan made, with the planning's warnings, before anything runs.
    fn show_plan(&mut self, warnings: &[crate::diag::Diag], plan: &Plan);
    /// Whether to run it (a human's answer).
    fn approve(&mut self, operation: &str) -> bool;
    /// Where the run's progress goes, with `secrets` kept out of what it shows, and the task
    /// that draws it. Called inside the runtime.
    fn progress(
        &mut self,
        secrets: &crate::events::Secrets,
    ) -> (Sender, tokio::task::JoinHandle<()>);
    /// What to say when Ctrl-C stops the run (`Interrupt::Exiting`: the process exits next).
    fn interrupted(&self) -> Box<dyn Fn(Interrupt) + Send>;
}

/// How an apply ended.
pub enum ApplyResult {
    /// The plan changes nothing; the lines say what was written to `sparkform.lock.hcl`.
    NothingToDo {
        lock_notes: Vec<String>,
    },
    /// The human said no.
    Declined,
    Ran(Box<ApplyOutcome>),
}

/// `sparkform apply` (destroy, rollback): lock, plan, show it, ask, run, and Ctrl-C stops the
/// run and rolls back. It waits on a human between its phases, so it drives the runtime
/// itself rather than being awaited.
pub fn apply(
    cmd: ApplyCommand<'_>,
    ui: &mut dyn ApplyUi,
    rt: &tokio::runtime::Runtime,
) -> Result<ApplyResult, OpError> {
    let operation = cmd.plan.source.operation();
    let locked = rt.block_on(async {
        let (events, drawn) = ui.notes();
        let locked = lock_and_plan(cmd.plan, &events).await;
        drop(events);
        let _ = drawn.await;
        locked
    });
    let mut locked = locked?;
    ui.show_plan(&locked.warnings, &locked.plan);
    let has_changes = locked.plan.has_changes();
    // The refresh's connections are reused only when no prompt waits on a human in between.
    if !has_changes || cmd.ask {
        rt.block_on(locked.drop_connections());
    }
    if !has_changes {
        // Nothing to apply, but the lock may still be new or out of date.
        return Ok(ApplyResult::NothingToDo {
            lock_notes: locked.write_lock()?,
        });
    }
    if cmd.ask && !ui.approve(operation) {
        return Ok(ApplyResult::Declined);
    }
    let outcome = rt.block_on(async {
        let (events, drawn) = ui.progress(&locked.config().secrets);
        let cancel = CancellationToken::new();
        let watcher = cancel_on_ctrl_c(cancel.clone(), ui.interrupted());
        let outcome = locked.apply(cmd.run, events, cancel).await;
        watcher.abort();
        let _ = drawn.await;
        outcome
    });
    Ok(ApplyResult::Ran(Box::new(outcome)))
}

/// End every master connection at once: the process exits next, and none may outlive it.
pub fn shutdown_connections() {
    crate::hosts::lifetime::shutdown();
}

/// What Ctrl-C did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// The first: running steps stop, then rollback.
    Stopping,
    /// The second: the process exits at once with 130 (the state on disk says what exists).
    Exiting,
}

/// Cancel `cancel` on the first Ctrl-C and exit on the second, telling `notify` first. Abort
/// the returned task when the work is done.
pub fn cancel_on_ctrl_c(
    cancel: CancellationToken,
    notify: impl Fn(Interrupt) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            notify(Interrupt::Stopping);
            cancel.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                notify(Interrupt::Exiting);
                std::process::exit(130);
            }
        }
    })
}

//! Apply a plan: steps in dependency order with as much parallelism as allowed, the state
//! written after every step, rollback of this apply's steps on the first failure, and the
//! leftovers of replaced containers removed only when everything succeeded.

/// What the work reports (it moved to `crate::events`; kept here for callers of the old path).
pub use crate::events;

pub mod chaos;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::events::{emit, Event, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kinds::machine::{
    container_index, machine, Applied, CheckRun, ContainerIndex, StepCx, StepError,
};
use crate::kinds::KindId;
use crate::plan::{Action, Change, Plan};
use crate::state::{ResourceState, State, StateStore};

pub struct ApplyRequest<'a> {
    pub config: &'a Config,
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub store: &'a StateStore,
    /// The state before the apply (a new one when nothing was applied yet).
    pub state: State,
    pub parallelism: usize,
    pub rollback: bool,
    pub hosts: HostOptions,
    /// Connections already open (the refresh's), reused; nodes it lacks are connected here.
    pub pool: Option<HostPool>,
    pub events: Sender,
    pub cancel: CancellationToken,
}

#[derive(Debug)]
pub struct ApplyOutcome {
    pub ok: bool,
    pub failures: Vec<(String, StepError)>,
    /// Cancelled from outside (Ctrl-C) before any step failed.
    pub interrupted: bool,
    /// Steps that were running when the run was interrupted and did not finish: stopped, not
    /// failed, so not in `failures`.
    pub stopped: Vec<String>,
    pub rolled_back: bool,
    /// Undos that succeeded, of how many completed steps had one to run.
    pub undone: usize,
    pub to_undo: usize,
    pub undo_failures: Vec<(String, StepError)>,
    /// Warnings from cleaning up after success (an old container that would not go away).
    pub warnings: Vec<String>,
    /// Planned steps that did not run, each with why (skipped after a failure, blocked by a
    /// step that did not finish). A run that leaves any is never a success.
    pub not_run: Vec<(String, String)>,
    /// What the completed steps did, counted like a plan's summary: the summary of a run comes
    /// from what ran, never from what was planned.
    pub ran: crate::plan::Summary,
    pub state: State,
    pub state_error: Option<String>,
}

#[derive(Clone)]
enum StepKind {
    Resource(KindId),
    /// A check a kind adds after a group of its steps (the fabric check of a network).
    Check {
        run: Arc<dyn CheckRun>,
        nodes: Vec<String>,
    },
}

#[derive(Clone)]
struct Step {
    address: String,
    kind: StepKind,
    change: Change,
    deps: BTreeSet<usize>,
}

/// The steps of a plan with their dependencies, plus the checks the kinds add after groups of
/// changed resources (a fabric check after each network whose attachments change).
fn build_steps(config: &Config, graph: &Graph, plan: &Plan) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for c in plan.changes.iter().filter(|c| c.action.is_change()) {
        // An untracked object shares its address with the tracked resource: the resource's
        // own step is the one its dependents wait for, never the untracked one's delete.
        if c.orphan.is_none() {
            index.insert(c.address.clone(), steps.len());
        }
        steps.push(Step {
            address: c.address.clone(),
            kind: StepKind::Resource(c.kind),
            change: c.clone(),
            deps: BTreeSet::new(),
        });
    }
    // Checks the kinds add after groups of changed resources (a network's fabric check).
    let changed = |a: &str| {
        index
            .get(a)
            .is_some_and(|&i| steps[i].change.action != Action::Delete)
    };
    let checks: Vec<_> = KindId::ALL
        .iter()
        .flat_map(|k| {
            machine(*k)
                .checks(config, &changed)
                .into_iter()
                .map(|c| (*k, c))
        })
        .collect();
    let mut check_of: HashMap<String, usize> = HashMap::new();
    let mut preflight_of: HashMap<String, Vec<usize>> = HashMap::new();
    for (owner, check) in checks {
        let at = steps.len();
        steps.push(Step {
            address: check.address.clone(),
            kind: StepKind::Check {
                run: check.run,
                nodes: check.nodes,
            },
            change: Change {
                address: check.address,
                // The kind that asked for the check; a check records nothing.
                kind: owner,
                node: None,
                action: Action::Run,
                attributes: Vec::new(),
                replace_reasons: Vec::new(),
                run_reason: None,
                depends_on: Vec::new(),
                after: None,
                after_hash: None,
                drift: Vec::new(),
                orphan: None,
            },
            deps: check
                .after
                .iter()
                .filter_map(|a| index.get(a).copied())
                .collect(),
        });
        for a in check.covers {
            check_of.insert(a, at);
        }
        for a in check.before {
            preflight_of.entry(a).or_default().push(at);
        }
    }
    let deletes: Vec<usize> = (0..steps.len())
        .filter(|&i| steps[i].change.action == Action::Delete)
        .collect();
    let n = steps.len();
    for i in 0..n {
        if matches!(steps[i].kind, StepKind::Check { .. }) {
            continue;
        }
        let mut deps = BTreeSet::new();
        if steps[i].change.action == Action::Delete {
            // A resource goes before what it depended on: wait for deletions of its dependents.
            for &j in &deletes {
                if j != i && steps[j].change.depends_on.contains(&steps[i].address) {
                    deps.insert(j);
                }
            }
        } else {
            // Deletions first: they free names and addresses the new steps may take.
            deps.extend(deletes.iter().copied());
            for d in &steps[i].change.depends_on {
                if let Some(&j) = index.get(d) {
                    deps.insert(j);
                }
                if let Some(&m) = check_of.get(d) {
                    deps.insert(m);
                }
            }
        }
        // A preflight guards what starts; a delete (an untracked copy's too, which shares the
        // address of what the check guards) starts nothing, and waiting would close a loop:
        // the check runs after changes that themselves wait for every delete.
        if steps[i].change.action != Action::Delete {
            if let Some(pre) = preflight_of.get(&steps[i].address) {
                deps.extend(pre.iter().copied());
            }
        }
        deps.remove(&i);
        steps[i].deps = deps;
    }
    // Dependencies through unchanged resources: a probe after an unchanged container still waits
    // for the changed container behind it.
    let transitive: Vec<BTreeSet<usize>> = (0..n)
        .map(|i| {
            let mut out = steps[i].deps.clone();
            if let StepKind::Resource(_) = steps[i].kind {
                if steps[i].change.action != Action::Delete {
                    for a in graph.ancestors(&steps[i].address) {
                        if let Some(&j) = index.get(&a) {
                            if j != i && steps[j].change.action != Action::Delete {
                                out.insert(j);
                            }
                        }
                        if let Some(&m) = check_of.get(&a) {
                            out.insert(m);
                        }
                    }
                }
            }
            out.remove(&i);
            out
        })
        .collect();
    for (i, d) in transitive.into_iter().enumerate() {
        steps[i].deps = d;
    }
    steps
}

/// The steps an apply of `plan` runs (the kinds' checks included), each with the addresses
/// of the steps it waits for, in plan order; or, when some of them wait on each other, that
/// loop (what `apply` refuses before it starts). Pure: for tests and diagnostics.
pub fn step_order(
    config: &Config,
    graph: &Graph,
    plan: &Plan,
) -> Result<Vec<(String, Vec<String>)>, Vec<String>> {
    let steps = build_steps(config, graph, plan);
    if let Some(cycle) = wait_cycle(&steps) {
        return Err(cycle);
    }
    Ok(steps
        .iter()
        .map(|s| {
            (
                s.address.clone(),
                s.deps.iter().map(|&d| steps[d].address.clone()).collect(),
            )
        })
        .collect())
}

/// Steps that wait on each other, so that none of them could ever start: one such loop, as
/// the addresses in waiting order with the first repeated at the end. Pure.
fn wait_cycle(steps: &[Step]) -> Option<Vec<String>> {
    let n = steps.len();
    let mut waiting: Vec<usize> = steps.iter().map(|s| s.deps.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in steps.iter().enumerate() {
        for &d in &s.deps {
            if d < n {
                dependents[d].push(i);
            }
        }
    }
    let mut queue: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut startable = vec![false; n];
    while let Some(i) = queue.pop() {
        startable[i] = true;
        for &j in &dependents[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                queue.push(j);
            }
        }
    }
    // Every step left waits for another one left: following those waits must come back.
    let first = (0..n).find(|&i| !startable[i])?;
    let mut path = vec![first];
    let mut seen: HashMap<usize, usize> = HashMap::from([(first, 0)]);
    loop {
        let at = *path.last()?;
        let next = steps[at]
            .deps
            .iter()
            .copied()
            .find(|&d| d < n && !startable[d])?;
        if let Some(&k) = seen.get(&next) {
            let mut cycle: Vec<String> = path[k..]
                .iter()
                .map(|&i| steps[i].address.clone())
                .collect();
            cycle.push(steps[next].address.clone());
            return Some(cycle);
        }
        seen.insert(next, path.len());
        path.push(next);
    }
}

/// Why a planned step did not run: the first of its prerequisites that did not finish, or
/// what stopped the run before it could start.
fn not_run_reason(
    step: &Step,
    steps: &[Step],
    settled: &[Settled],
    outcome: &ApplyOutcome,
) -> String {
    for &d in &step.deps {
        let why = match settled.get(d) {
            Some(Settled::Done) => continue,
            Some(Settled::Failed) => "which failed",
            Some(Settled::Stopped) => "which was interrupted",
            Some(Settled::NotRun) | None => "which did not run",
        };
        return format!("blocked by {}, {why}", steps[d].address);
    }
    if outcome.interrupted {
        "not started: the run was interrupted".into()
    } else if let Some((address, _)) = outcome.failures.first() {
        format!("not started: the run stopped when {address} failed")
    } else {
        "never became ready to start".into()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Settled {
    NotRun,
    Done,
    Failed,
    Stopped,
}

/// Nodes the steps touch, plus the nodes probes go through.
fn nodes_needed(config: &Config, steps: &[Step], containers: &ContainerIndex) -> Vec<String> {
    let mut set = BTreeSet::new();
    for s in steps {
        if let Some(n) = &s.change.node {
            set.insert(n.clone());
        }
        match &s.kind {
            StepKind::Check { nodes, .. } => set.extend(nodes.iter().cloned()),
            StepKind::Resource(kind) => {
                set.extend(machine(*kind).other_nodes(&s.change, containers))
            }
        }
    }
    set.into_iter()
        .filter(|n| config.nodes.contains_key(n))
        .collect()
}

/// Everything one step needs, owned, so it can run on its own task.
struct Job {
    idx: usize,
    step: Step,
    desired: Option<serde_json::Value>,
    recorded: Option<ResourceState>,
    pool: Arc<HostPool>,
    lineage: String,
    config_dir: PathBuf,
    events: Sender,
    cancel: CancellationToken,
    containers: Arc<ContainerIndex>,
}

impl Job {
    fn cx(&self) -> StepCx<'_> {
        StepCx {
            address: &self.step.address,
            change: &self.step.change,
            host: self
                .step
                .change
                .node
                .as_ref()
                .and_then(|n| self.pool.get(n).ok()),
            pool: &self.pool,
            lineage: &self.lineage,
            desired: self.desired.as_ref(),
            recorded: self.recorded.as_ref(),
            config_dir: &self.config_dir,
            events: &self.events,
            cancel: &self.cancel,
            containers: &self.containers,
        }
    }

    async fn run(self) -> (usize, Step, Result<Applied, StepError>, Duration) {
        let start = Instant::now();
        let result = match &self.step.kind {
            StepKind::Check { run, .. } => run.run(&self.pool).await.map(|summary| Applied {
                summary,
                ..Applied::default()
            }),
            StepKind::Resource(kind) => {
                let cx = self.cx();
                if let Some(node) = &self.step.change.node {
                    if let Err(e) = self.pool.get(node) {
                        let err: StepError = e.into();
                        return (self.idx, self.step.clone(), Err(err), start.elapsed());
                    }
                }
                machine(*kind).apply(&cx, self.step.change.action).await
            }
        };
        (self.idx, self.step, result, start.elapsed())
    }
}

/// Record a completed step in the state (the write-ahead journal).
/// `elapsed` is the step's whole wall time, which the next plan's impact section quotes.
/// An untracked object's step records nothing: the entry at its address is the tracked
/// resource's.
fn journal(state: &mut State, step: &Step, applied: &Applied, elapsed: Duration) {
    if !matches!(step.kind, StepKind::Resource(_)) || step.change.orphan.is_some() {
        return;
    }
    let mut attributes = applied.attributes.clone();
    if step.change.action == Action::Run {
        attributes.insert("last_run".into(), serde_json::json!(applied.summary));
    }
    crate::plan::record_change(state, &step.change, attributes, Some(elapsed.as_secs_f64()));
}

/// What the journal writes before a step starts, so a kill during it leaves a state that says
/// so: a create of a kind whose objects carry no label is recorded pending (what the kill left
/// is then this deployment's), a run of a recorded resource is marked started. Whether the
/// state changed.
fn journal_ahead(state: &mut State, step: &Step, now: &str) -> bool {
    let StepKind::Resource(kind) = step.kind else {
        return false;
    };
    if step.change.orphan.is_some() {
        return false;
    }
    match step.change.action {
        Action::Run => crate::plan::mark_run_started(state, &step.address, now),
        Action::Create
            if !kind.kind().found_untracked()
                && kind.kind().lifecycle() != crate::kinds::Lifecycle::Runs =>
        {
            crate::plan::record_intent(state, &step.change, now);
            true
        }
        _ => false,
    }
}

/// A step recorded ahead that returned an error (failed, or stopped) cleaned up after itself:
/// its entry goes back to what the state held before. Only a kill leaves it recorded ahead.
fn forget_intent(state: &mut State, before: &State, step: &Step) -> bool {
    let pending = state
        .resources
        .get(&step.address)
        .is_some_and(|r| r.attributes.contains_key(crate::plan::MARK_PENDING));
    if !pending || step.change.orphan.is_some() {
        return false;
    }
    match before.resources.get(&step.address) {
        Some(r) => {
            state.resources.insert(step.address.clone(), r.clone());
        }
        None => {
            state.resources.remove(&step.address);
        }
    }
    true
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub async fn apply(mut req: ApplyRequest<'_>) -> ApplyOutcome {
    let started = Instant::now();
    let steps = build_steps(req.config, req.graph, req.plan);
    let containers = Arc::new(container_index(req.config));
    // Imports change nothing on the machines: they are in the state before the first step, so
    // a step that then updates or replaces an imported object finds it recorded.
    for i in &req.plan.imports {
        if !req.state.resources.contains_key(&i.address) {
            let deps = req
                .config
                .resource(&i.address)
                .map(|r| r.deps.iter().cloned().collect())
                .unwrap_or_default();
            crate::plan::record_import(&mut req.state, i, deps);
        }
    }
    let before = req.state.clone();
    let mut state = req.state.clone();
    let mut outcome = ApplyOutcome {
        ok: true,
        failures: Vec::new(),
        interrupted: false,
        stopped: Vec::new(),
        rolled_back: false,
        undone: 0,
        to_undo: 0,
        undo_failures: Vec::new(),
        warnings: Vec::new(),
        not_run: Vec::new(),
        ran: crate::plan::Summary::default(),
        state: before.clone(),
        state_error: None,
    };
    // A step that can never start would end the run with it silently left out: refuse the
    // whole run before anything changes, naming the loop.
    if let Some(cycle) = wait_cycle(&steps) {
        outcome.ok = false;
        outcome.not_run = steps
            .iter()
            .map(|s| {
                (
                    s.address.clone(),
                    "the run was refused before it started".into(),
                )
            })
            .collect();
        outcome.failures.push((
            "(plan)".into(),
            StepError::new(format!(
                "these steps wait on each other, so none of them could ever start: {}",
                cycle.join(" → ")
            ))
            .help("nothing was changed; this is a defect of sparkform's planning or of a state file edited by hand: run `sparkform plan` and report the plan with this message"),
        ));
        emit(
            &req.events,
            Event::Finished {
                ok: false,
                elapsed: started.elapsed(),
                summary: "refused before the first step: the steps wait on each other".into(),
            },
        );
        return outcome;
    }
    emit(
        &req.events,
        Event::Started {
            steps: steps.len(),
            parallelism: req.parallelism,
        },
    );
    // The lineage is on disk before any container carries it, so a run killed during its first
    // step leaves a state that explains what that step created.
    if !req.store.path().exists() || !req.plan.imports.is_empty() {
        if let Err(e) = req.store.write(&mut state) {
            outcome.ok = false;
            outcome.state_error = Some(e.to_string());
            outcome.failures.push((
                "(state)".into(),
                StepError::new(format!("cannot write the state before the first step: {e}")),
            ));
            emit(
                &req.events,
                Event::Finished {
                    ok: false,
                    elapsed: started.elapsed(),
                    summary: "failed before the first step".into(),
                },
            );
            return outcome;
        }
    }
    let nodes = nodes_needed(req.config, &steps, &containers);
    let pool = match req.pool.take() {
        Some(mut pool) => {
            pool.connect_more(req.config, &nodes, &req.hosts).await;
            pool
        }
        None => HostPool::connect(req.config, &nodes, &req.hosts).await,
    };
    let pool = Arc::new(pool);
    let desired_map: HashMap<&str, &serde_json::Value> = req
        .config
        .resources
        .iter()
        .map(|r| (r.address.as_str(), &r.config))
        .collect();
    let jobs = Jobs {
        pool: pool.clone(),
        before: &before,
        desired: desired_map,
        config_dir: req.config.dir.clone(),
        events: req.events.clone(),
        cancel: req.cancel.clone(),
        containers: containers.clone(),
    };

    let n = steps.len();
    let mut waiting: Vec<usize> = steps.iter().map(|s| s.deps.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in steps.iter().enumerate() {
        for &d in &s.deps {
            dependents[d].push(i);
        }
    }
    let mut ready: std::collections::VecDeque<usize> =
        (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut running = crate::tasks::KeyedTasks::new();
    let mut completed: Vec<(usize, Step, Applied)> = Vec::new();
    let mut settled: Vec<Settled> = vec![Settled::NotRun; n];
    let mut stopping = false;
    let parallelism = req.parallelism.max(1);
    loop {
        // This loop cancels only once it is stopping: a cancel seen before is the caller's.
        if req.cancel.is_cancelled() && !stopping {
            stopping = true;
            outcome.ok = false;
            outcome.interrupted = true;
            emit(
                &req.events,
                Event::Stopping {
                    reason: "interrupted".into(),
                },
            );
        }
        while !stopping && running.len() < parallelism {
            let Some(i) = ready.pop_front() else { break };
            let step = steps[i].clone();
            if journal_ahead(&mut state, &step, &now()) {
                if let Err(e) = req.store.write(&mut state) {
                    outcome.state_error = Some(e.to_string());
                    stopping = true;
                    outcome.ok = false;
                    outcome.failures.push((
                        step.address.clone(),
                        StepError::new(format!(
                            "cannot record in the state that the step starts: {e}"
                        )),
                    ));
                    break;
                }
            }
            emit(
                &req.events,
                Event::StepStarted {
                    address: step.address.clone(),
                    action: action_word(&step),
                },
            );
            let mut job = jobs.job(&step);
            job.idx = i;
            running.spawn((i, Instant::now()), job.run());
        }
        if running.is_empty() {
            break;
        }
        let joined = tokio::select! {
            j = running.next() => j,
            _ = req.cancel.cancelled(), if !stopping => continue,
        };
        let Some(((i, started), joined)) = joined else {
            break;
        };
        // A step whose task panicked failed like any other: on its address, then rollback.
        let (i, step, result, elapsed) = joined.unwrap_or_else(|panic| {
            (
                i,
                steps[i].clone(),
                Err(StepError::new(panic)),
                started.elapsed(),
            )
        });
        if result.is_err() && forget_intent(&mut state, &before, &step) {
            if let Err(e) = req.store.write(&mut state) {
                outcome.state_error = Some(e.to_string());
            }
        }
        settled[i] = match &result {
            Ok(_) => Settled::Done,
            Err(_) if outcome.interrupted || (req.cancel.is_cancelled() && !stopping) => {
                Settled::Stopped
            }
            Err(_) => Settled::Failed,
        };
        match result {
            Ok(applied) => {
                emit(
                    &req.events,
                    Event::StepDone {
                        address: step.address.clone(),
                        action: action_word(&step),
                        elapsed,
                        summary: applied.summary.clone(),
                    },
                );
                journal(&mut state, &step, &applied, elapsed);
                if matches!(step.kind, StepKind::Resource(_)) {
                    if let Err(e) = req.store.write(&mut state) {
                        outcome.state_error = Some(e.to_string());
                        stopping = true;
                        outcome.ok = false;
                        outcome.failures.push((
                            step.address.clone(),
                            StepError::new(format!("cannot record the step in the state: {e}")),
                        ));
                    } else {
                        chaos::after_journal_write(step.change.action, &step.address);
                    }
                }
                completed.push((i, step, applied));
                for &d in &dependents[i] {
                    waiting[d] -= 1;
                    if waiting[d] == 0 {
                        ready.push_back(d);
                    }
                }
            }
            Err(e) if outcome.interrupted || (req.cancel.is_cancelled() && !stopping) => {
                // Cancelled from outside: the step was stopped, whatever it says went wrong
                // (a probe reports its last attempt).
                if !stopping {
                    stopping = true;
                    outcome.ok = false;
                    outcome.interrupted = true;
                    emit(
                        &req.events,
                        Event::Stopping {
                            reason: "interrupted".into(),
                        },
                    );
                }
                emit(
                    &req.events,
                    Event::StepStopped {
                        address: step.address.clone(),
                        elapsed,
                        at: e.message.clone(),
                    },
                );
                outcome.stopped.push(step.address.clone());
            }
            Err(e) => {
                emit(
                    &req.events,
                    Event::StepFailed {
                        address: step.address.clone(),
                        elapsed,
                        error: e.render(),
                    },
                );
                // A run that failed on its own (not stopped by another's failure): the next
                // plan says its last result failed. One stopped keeps its started mark.
                if !stopping
                    && step.change.action == Action::Run
                    && step.change.orphan.is_none()
                    && matches!(step.kind, StepKind::Resource(_))
                    && crate::plan::record_run_failed(&mut state, &step.address, &now(), &e.message)
                {
                    if let Err(w) = req.store.write(&mut state) {
                        outcome.state_error = Some(w.to_string());
                    }
                }
                outcome.failures.push((step.address.clone(), e));
                outcome.ok = false;
                if !stopping {
                    stopping = true;
                    emit(
                        &req.events,
                        Event::Stopping {
                            reason: format!("{} failed", step.address),
                        },
                    );
                    // Running steps stop waiting (ready checks, probes) and clean up after themselves.
                    req.cancel.cancel();
                }
            }
        }
    }

    // Every planned step is accounted for: what did not run says why, and a run that left
    // any step out is not a success, whatever else happened.
    for (i, step) in steps.iter().enumerate() {
        if settled[i] != Settled::NotRun {
            continue;
        }
        let reason = not_run_reason(step, &steps, &settled, &outcome);
        emit(
            &req.events,
            Event::StepNotRun {
                address: step.address.clone(),
                reason: reason.clone(),
            },
        );
        outcome.not_run.push((step.address.clone(), reason));
    }
    if outcome.ok && !outcome.not_run.is_empty() {
        outcome.ok = false;
        outcome.failures.push((
            "(executor)".into(),
            StepError::new(format!(
                "{} of {} planned steps never started: {}",
                outcome.not_run.len(),
                steps.len(),
                outcome
                    .not_run
                    .iter()
                    .map(|(a, _)| a.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .help("what ran is rolled back; this is a defect of sparkform: report the plan with this message"),
        ));
    }
    for (_, step, _) in &completed {
        if matches!(step.kind, StepKind::Resource(_)) {
            let r = &mut outcome.ran;
            match step.change.action {
                Action::Create => r.create += 1,
                Action::Update => r.update += 1,
                Action::Replace => r.replace += 1,
                Action::Delete => r.delete += 1,
                Action::Run => r.run += 1,
                Action::NoOp => {}
            }
        }
    }
    if outcome.ok {
        // Success: drop what was kept for rollback, record the outputs.
        for (_, step, applied) in &completed {
            if let StepKind::Resource(kind) = step.kind {
                let job = jobs.job(step);
                if let Err(e) = machine(kind)
                    .finalize(&job.cx(), step.change.action, applied)
                    .await
                {
                    outcome
                        .warnings
                        .push(format!("{}: {}", step.address, e.message));
                }
            }
        }
        crate::plan::record_outputs(req.plan, &mut state);
        if let Err(e) = req.store.write(&mut state) {
            outcome.state_error = Some(e.to_string());
        }
    } else if req.rollback {
        outcome.rolled_back = true;
        rollback(
            &req,
            &jobs,
            &steps,
            &dependents,
            &completed,
            &before,
            &mut state,
            &mut outcome,
        )
        .await;
        // A complete rollback puts the machines back as they were before this apply, which
        // is what the runs' earlier results describe: the failure of what it undid is not
        // theirs. After an incomplete one the failure stays for the next plan to show.
        if outcome.undo_failures.is_empty() && outcome.undone == outcome.to_undo {
            let mut reverted = false;
            for (address, _) in &outcome.failures {
                if let Some(r) = before.resources.get(address) {
                    if state.resources.get(address) != Some(r) {
                        state.resources.insert(address.clone(), r.clone());
                        reverted = true;
                    }
                }
            }
            if reverted {
                if let Err(e) = req.store.write(&mut state) {
                    outcome.state_error = Some(e.to_string());
                }
            }
        }
    }
    let summary = finished_summary(&outcome, completed.len());
    emit(
        &req.events,
        Event::Finished {
            ok: outcome.ok,
            elapsed: started.elapsed(),
            summary,
        },
    );
    // The last reference closes the master connections cleanly.
    drop(jobs);
    match Arc::try_unwrap(pool) {
        Ok(p) => p.close().await,
        Err(p) => drop(p),
    }
    outcome.state = state;
    outcome
}

/// The last line's words, counting what `RollbackStarted` counted.
fn finished_summary(outcome: &ApplyOutcome, completed: usize) -> String {
    let steps = |n: usize| format!("{n} step{}", if n == 1 { "" } else { "s" });
    if outcome.ok {
        return format!("{} done", steps(completed));
    }
    let how = if outcome.interrupted {
        "interrupted"
    } else {
        "failed"
    };
    if !outcome.rolled_back {
        return format!("{how}; nothing rolled back (--no-rollback)");
    }
    if outcome.undone == outcome.to_undo {
        format!("{how}; {} rolled back", steps(outcome.undone))
    } else {
        format!(
            "{how}; {} of {} rolled back, {} could not be undone",
            outcome.undone,
            steps(outcome.to_undo),
            outcome.to_undo - outcome.undone
        )
    }
}

/// Undo this apply's completed steps, each once every step that depended on it is undone
/// (reverse dependency order), independent ones in parallel up to `-parallelism`; then the
/// state holds what it held before the apply for every undone step.
#[allow(clippy::too_many_arguments)]
async fn rollback(
    req: &ApplyRequest<'_>,
    jobs: &Jobs<'_>,
    steps: &[Step],
    dependents: &[Vec<usize>],
    completed: &[(usize, Step, Applied)],
    before: &State,
    state: &mut State,
    outcome: &mut ApplyOutcome,
) {
    let undoable: Vec<&(usize, Step, Applied)> = completed
        .iter()
        .filter(|(_, s, _)| matches!(s.kind, StepKind::Resource(_)))
        .collect();
    outcome.to_undo = undoable.len();
    emit(
        &req.events,
        Event::RollbackStarted {
            steps: undoable.len(),
        },
    );
    let order: Vec<usize> = undoable.iter().map(|(i, _, _)| *i).collect();
    let (blocks, mut waiting) = undo_order(&order, dependents);
    // Undo never stops early: a second Ctrl-C exits the process, the journal has the truth.
    let undo_cancel = CancellationToken::new();
    // Latest first among the ready ones, as a sequential rollback would go.
    let mut ready: Vec<usize> = (0..undoable.len()).filter(|&k| waiting[k] == 0).collect();
    let mut running = crate::tasks::KeyedTasks::new();
    let parallelism = req.parallelism.max(1);
    let mut restored: Vec<String> = Vec::new();
    loop {
        while running.len() < parallelism {
            let Some(k) = ready.pop() else { break };
            let (_, step, applied) = undoable[k];
            let StepKind::Resource(kind) = step.kind else {
                continue;
            };
            let mut job = jobs.job(step);
            job.cancel = undo_cancel.clone();
            let applied = applied.clone();
            running.spawn((k, Instant::now()), async move {
                machine(kind)
                    .undo(&job.cx(), job.step.change.action, &applied)
                    .await
            });
        }
        let Some(((k, started), joined)) = running.next().await else {
            break;
        };
        let elapsed = started.elapsed();
        // A panicking undo is a failed undo of its step; what it held back may still go.
        let result = joined.unwrap_or_else(|panic| Err(StepError::new(panic)));
        let address = &undoable[k].1.address;
        match result {
            Ok(summary) => {
                outcome.undone += 1;
                if undoable[k].1.change.orphan.is_none() {
                    restored.push(address.clone());
                }
                emit(
                    &req.events,
                    Event::UndoDone {
                        address: address.clone(),
                        elapsed,
                        summary,
                    },
                );
                // Back to what the state said before this apply; an untracked object's undo
                // leaves the tracked resource's entry alone.
                if undoable[k].1.change.orphan.is_none() {
                    match before.resources.get(address) {
                        Some(r) => {
                            state.resources.insert(address.clone(), r.clone());
                        }
                        None => {
                            state.resources.remove(address);
                        }
                    }
                }
                if let Err(e) = req.store.write(state) {
                    outcome.state_error = Some(e.to_string());
                }
            }
            Err(e) => {
                emit(
                    &req.events,
                    Event::UndoFailed {
                        address: address.clone(),
                        elapsed,
                        error: e.render(),
                    },
                );
                outcome.undo_failures.push((address.clone(), e));
            }
        }
        // What it blocked may go now, failed or not: each undo restores its own step.
        for &b in &blocks[k] {
            waiting[b] -= 1;
            if waiting[b] == 0 {
                ready.push(b);
            }
        }
    }
    restart_process_groups(req, jobs, steps, completed, before, &mut restored, outcome).await;
    check_restored(&jobs.pool, before, &restored, outcome).await;
}

/// A process group (the ranks of one engine) comes back whole or not at all. After the undos,
/// every member the state recorded before the apply restarts, one after another in dependency
/// order, each waiting for its recorded ready check: a member that came back on its own (its
/// step failed and put its previous container back) may have joined a peer the rollback then
/// removed. When one does not come back, the others stop: half a group serves nothing and
/// holds the GPUs, and the next apply replaces the group.
async fn restart_process_groups(
    req: &ApplyRequest<'_>,
    jobs: &Jobs<'_>,
    steps: &[Step],
    completed: &[(usize, Step, Applied)],
    before: &State,
    restored: &mut Vec<String>,
    outcome: &mut ApplyOutcome,
) {
    let touched: BTreeSet<&str> = completed
        .iter()
        .map(|(_, s, _)| s.address.as_str())
        .chain(outcome.failures.iter().map(|(a, _)| a.as_str()))
        .collect();
    let mut groups: std::collections::BTreeMap<String, Vec<&Step>> = Default::default();
    let mut touched_groups: BTreeSet<String> = BTreeSet::new();
    for address in req.graph.order() {
        let Some(group) = req.config.resource(&address).and_then(|r| r.group.clone()) else {
            continue;
        };
        if touched.contains(address.as_str()) {
            touched_groups.insert(group.clone());
        }
        if !before.resources.contains_key(&address) {
            continue;
        }
        let step = steps.iter().find(|s| {
            s.address == address
                && s.change.orphan.is_none()
                && matches!(s.kind, StepKind::Resource(_))
        });
        if let Some(step) = step {
            groups.entry(group).or_default().push(step);
        }
    }
    for (group, members) in groups {
        if !touched_groups.contains(&group) || members.len() < 2 {
            continue;
        }
        let mut came_back = Vec::new();
        let mut failed: Option<(String, String)> = None;
        for step in &members {
            let StepKind::Resource(kind) = step.kind else {
                continue;
            };
            let mut job = jobs.job(step);
            job.cancel = CancellationToken::new();
            let started = Instant::now();
            match machine(kind).restart(&job.cx()).await {
                Ok(summary) => {
                    emit(
                        &req.events,
                        Event::UndoDone {
                            address: step.address.clone(),
                            elapsed: started.elapsed(),
                            summary,
                        },
                    );
                    came_back.push(step.address.clone());
                }
                Err(e) => {
                    emit(
                        &req.events,
                        Event::UndoFailed {
                            address: step.address.clone(),
                            elapsed: started.elapsed(),
                            error: e.render(),
                        },
                    );
                    failed = Some((step.address.clone(), e.message));
                    break;
                }
            }
        }
        let Some((bad, why)) = failed else {
            for a in came_back {
                if !restored.contains(&a) {
                    restored.push(a);
                }
            }
            continue;
        };
        // None, then: every member stops, and each is named as not restored.
        for step in &members {
            let StepKind::Resource(kind) = step.kind else {
                continue;
            };
            let job = jobs.job(step);
            let stopped = machine(kind).stop(&job.cx()).await;
            let was_undone = completed.iter().any(|(_, s, _)| s.address == step.address)
                && !outcome
                    .undo_failures
                    .iter()
                    .any(|(a, _)| *a == step.address);
            if was_undone {
                outcome.undone = outcome.undone.saturating_sub(1);
            }
            restored.retain(|a| *a != step.address);
            if outcome
                .undo_failures
                .iter()
                .any(|(a, _)| *a == step.address)
            {
                continue;
            }
            let message = if step.address == bad {
                format!("it did not come back ({why}), so its process group is stopped rather than run half of it; the next apply replaces the group")
            } else {
                format!(
                    "{}: its process group could not be restored whole ({bad} did not come back), so it was stopped rather than run half of it; the next apply replaces the group",
                    match stopped {
                        Ok(s) if !s.is_empty() => s,
                        Ok(_) => "left as it is".to_string(),
                        Err(e) => format!("and stopping it failed: {}", e.message),
                    }
                )
            };
            outcome
                .undo_failures
                .push((step.address.clone(), StepError::new(message)));
        }
    }
}

/// An undo that returned is not proof: look at what the undone steps restored, as refresh
/// would, and count each one that is not as the state recorded it before the apply (a previous
/// container that exited once started again, an address that did not come back) as not undone,
/// saying why.
async fn check_restored(
    pool: &HostPool,
    before: &State,
    restored: &[String],
    outcome: &mut ApplyOutcome,
) {
    let mut expected = State {
        resources: Default::default(),
        outputs: Default::default(),
        ..before.clone()
    };
    for a in restored {
        if let Some(r) = before.resources.get(a) {
            expected.resources.insert(a.clone(), r.clone());
        }
    }
    let nodes: BTreeSet<String> = expected
        .resources
        .values()
        .filter_map(|r| r.node.clone())
        .collect();
    let mut hosts = Vec::new();
    for node in nodes {
        match pool.get(&node) {
            Ok(h) => hosts.push((node, h)),
            Err(e) => not_restored(
                outcome,
                expected
                    .resources
                    .iter()
                    .filter(|(_, r)| r.node.as_deref() == Some(node.as_str()))
                    .map(|(a, _)| a.clone())
                    .collect(),
                &format!("it could not be checked: {e}"),
            ),
        }
    }
    let seen = match crate::refresh::observe_recorded(&expected, hosts).await {
        Ok(seen) => seen,
        Err(errors) => {
            let why: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            not_restored(
                outcome,
                expected.resources.keys().cloned().collect(),
                &format!("it could not be checked: {}", why.join("; ")),
            );
            return;
        }
    };
    for (address, observed) in seen.resources {
        let why = match observed {
            crate::plan::Observed::InSync => continue,
            crate::plan::Observed::Missing(why) => why,
            crate::plan::Observed::Drifted(notes) => notes.join("; "),
        };
        not_restored(outcome, vec![address], &why);
    }
}

fn not_restored(outcome: &mut ApplyOutcome, addresses: Vec<String>, why: &str) {
    for address in addresses {
        if outcome.undo_failures.iter().any(|(a, _)| *a == address) {
            continue;
        }
        outcome.undone = outcome.undone.saturating_sub(1);
        outcome.undo_failures.push((
            address,
            StepError::new(format!("undone, but not as it was before: {why}")),
        ));
    }
}

/// For the undoable steps (`undoable[k]` is a step index), which undos each one's undo holds
/// back (`blocks[k]`) and how many undos it waits for (`waiting[k]`): an undo waits for the
/// undos of every undoable step downstream of it, also through steps that need no undo (a
/// fabric check between attachments and containers). Pure.
fn undo_order(undoable: &[usize], dependents: &[Vec<usize>]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let position: HashMap<usize, usize> =
        undoable.iter().enumerate().map(|(k, i)| (*i, k)).collect();
    let mut blocks: Vec<Vec<usize>> = vec![Vec::new(); undoable.len()];
    let mut waiting: Vec<usize> = vec![0; undoable.len()];
    for (k, i) in undoable.iter().enumerate() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<usize> = dependents[*i].clone();
        while let Some(j) = stack.pop() {
            if !seen.insert(j) {
                continue;
            }
            if let Some(&kj) = position.get(&j) {
                blocks[kj].push(k);
                waiting[k] += 1;
            }
            stack.extend(dependents[j].iter().copied());
        }
    }
    (blocks, waiting)
}

/// Makes the owned `Job` for a step from what every step shares.
struct Jobs<'a> {
    pool: Arc<HostPool>,
    before: &'a State,
    desired: HashMap<&'a str, &'a serde_json::Value>,
    config_dir: PathBuf,
    events: Sender,
    cancel: CancellationToken,
    containers: Arc<ContainerIndex>,
}

impl Jobs<'_> {
    fn job(&self, step: &Step) -> Job {
        Job {
            idx: 0,
            step: step.clone(),
            desired: self
                .desired
                .get(step.address.as_str())
                .map(|v| (*v).clone()),
            recorded: self.before.resources.get(&step.address).cloned(),
            pool: self.pool.clone(),
            lineage: self.before.lineage.clone(),
            config_dir: self.config_dir.clone(),
            events: self.events.clone(),
            cancel: self.cancel.clone(),
            containers: self.containers.clone(),
        }
    }
}

fn action_word(step: &Step) -> String {
    match (&step.kind, step.change.action) {
        (StepKind::Check { .. }, _) => "check".into(),
        (_, Action::Create) => "create".into(),
        (_, Action::Update) => "update".into(),
        (_, Action::Replace) => "replace".into(),
        (_, Action::Delete) => "destroy".into(),
        (_, Action::Run) => "run".into(),
        (_, Action::NoOp) => "no-op".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::undo_order;

    #[test]
    fn undo_waits_for_everything_downstream_even_through_steps_without_undo() {
        // Steps: 0, 1 attachments -> 2 fabric check (no undo) -> 3, 4 containers; 5 on its own.
        let dependents = vec![vec![2], vec![2], vec![3, 4], vec![], vec![], vec![]];
        let undoable = [0, 1, 3, 4, 5];
        let (blocks, waiting) = undo_order(&undoable, &dependents);
        // The attachments wait for both containers; containers and 5 wait for nothing.
        assert_eq!(waiting, [2, 2, 0, 0, 0]);
        // Undoing container 3 (position 2) releases both attachments (positions 0 and 1).
        let mut b = blocks[2].clone();
        b.sort();
        assert_eq!(b, [0, 1]);
        assert!(blocks[4].is_empty());
    }

    #[test]
    fn a_step_that_was_not_completed_does_not_hold_back_an_undo() {
        // 0 -> 1 -> 2, but only 0 and 2 completed (1 needs no undo or never ran).
        let dependents = vec![vec![1], vec![2], vec![]];
        let (blocks, waiting) = undo_order(&[0, 2], &dependents);
        assert_eq!(waiting, [1, 0]);
        assert_eq!(blocks[1], [0]);
    }
}

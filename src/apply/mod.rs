//! Apply a plan: steps in dependency order with as much parallelism as allowed, the state
//! written after every step, rollback of this apply's steps on the first failure, and the
//! leftovers of replaced containers removed only when everything succeeded.

/// What the work reports (it moved to `crate::events`; kept here for callers of the old path).
pub use crate::events;

mod execute;
pub mod journal_hook;
mod rollback;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::events::{emit, Event, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::{
    container_index, machine, Applied, CheckRun, ContainerIndex, StartGates, StepCx, StepError,
};
use crate::plan::{Action, Change, Plan};
use crate::state::{ResourceState, State, StateStore};
use crate::vocabulary::KindId;
use execute::*;
use rollback::*;

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
    /// What the operation did besides the steps, for the closing lines (a lock file written).
    pub notes: Vec<String>,
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
    /// A check's [`Check::keeps`](crate::kinds::machine::Check): steps a later failure
    /// leaves done once it passed.
    keeps: Vec<String>,
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
            keeps: Vec::new(),
        });
    }
    // Checks the kinds add after groups of changed resources (a network's fabric check).
    let changed = crate::kinds::machine::Changed::new(index.values().map(|&i| &steps[i].change));
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
    // A check may run after another check a kind added before it (a replica's drain after
    // the previous replica's admit).
    let mut check_at: HashMap<String, usize> = HashMap::new();
    for (owner, check) in checks {
        let at = steps.len();
        check_at.insert(check.address.clone(), at);
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
                purge: false,
                restores: None,
            },
            deps: check
                .after
                .iter()
                .filter_map(|a| index.get(a).or_else(|| check_at.get(a)).copied())
                .filter(|&d| d != at)
                .collect(),
            keeps: check.keeps,
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
        // A preflight guards what starts. A delete (an untracked copy's too, which shares the
        // address of what the check guards) waits only for one that waits for nothing (a
        // replica drained before its engine goes): a check that runs after changes, which
        // themselves wait for every delete, would close a loop.
        if let Some(pre) = preflight_of.get(&steps[i].address) {
            let guards_delete = |&&c: &&usize| steps[c].deps.is_empty();
            if steps[i].change.action == Action::Delete {
                deps.extend(pre.iter().filter(guards_delete).copied());
            } else {
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

/// The start gates of the process groups whose members the apply creates or replaces: each
/// group's members start together ([`StartGate`]). A group one of whose members waits for
/// another (`depends_on`) starts in that order instead: a gate would wait on itself.
fn start_gates(config: &Config, steps: &[Step]) -> StartGates {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, s) in steps.iter().enumerate() {
        if !matches!(s.kind, StepKind::Resource(_))
            || !matches!(s.change.action, Action::Create | Action::Replace)
            || s.change.orphan.is_some()
        {
            continue;
        }
        if let Some(g) = config.resource(&s.address).and_then(|r| r.group.as_deref()) {
            groups.entry(g).or_default().push(i);
        }
    }
    StartGates::new(
        groups
            .into_iter()
            .filter(|(_, members)| {
                !members
                    .iter()
                    .any(|&m| members.iter().any(|o| steps[m].deps.contains(o)))
            })
            .map(|(g, members)| {
                (
                    g.to_string(),
                    members.iter().map(|&m| steps[m].address.clone()).collect(),
                )
            }),
    )
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
                let Some(after) = &s.change.after else {
                    continue;
                };
                let placement = kind.kind().placement(after);
                set.extend(placement.other_nodes);
                if placement.enters_containers {
                    set.extend(containers.values().map(|(n, _)| n.clone()));
                }
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
    desired: Option<crate::kind::Configuration>,
    recorded: Option<ResourceState>,
    pool: Arc<HostPool>,
    lineage: String,
    config_dir: PathBuf,
    events: Sender,
    cancel: CancellationToken,
    containers: Arc<ContainerIndex>,
    secrets: crate::events::Secrets,
    /// Its process group's start gate, when the apply starts several members of it.
    gate: Option<Arc<crate::kinds::machine::StartGate>>,
    /// For a check (a probe): what it depends on, as this apply recorded it, which
    /// [`Job::run`] watches while the check retries (see [`watch_upstream`]).
    upstream: Vec<(String, ResourceState)>,
}

/// How often a check's upstream is looked at while the check retries.
const UPSTREAM_EVERY: Duration = Duration::from_secs(5);

/// The first of `upstream` that is down (its kind says so, [`Machine::health`] now: a container that
/// exited, with what its log says it died of), looked at every [`UPSTREAM_EVERY`]; never
/// returns while all are up.
async fn watch_upstream(upstream: &[(String, ResourceState)], pool: &HostPool) -> StepError {
    loop {
        tokio::time::sleep(UPSTREAM_EVERY).await;
        for (address, recorded) in upstream {
            if let Some(why) = crate::kinds::machine::down(address, recorded, pool).await {
                return StepError::new(format!(
                    "stopped trying: {address}, which it depends on, is down: {why}"
                ));
            }
        }
    }
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
            secrets: &self.secrets,
            gate: self.gate.as_deref(),
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
                if self.upstream.is_empty() {
                    machine(*kind).apply(&cx, self.step.change.action).await
                } else {
                    // A check against an engine that died retries for its whole timeout
                    // (minutes, for a loading engine) unless what it depends on is watched.
                    let check = machine(*kind).apply(&cx, self.step.change.action);
                    tokio::select! {
                        result = check => result,
                        down = watch_upstream(&self.upstream, &self.pool) => Err(down),
                    }
                }
            }
        };
        // A member of a process group that failed never reaches its gate: the others waiting
        // there give up instead of waiting for it.
        if let (Err(e), Some(gate)) = (&result, &self.gate) {
            gate.abandon(format!(
                "not started: {} failed before its process group could start: {}",
                self.step.address, e.message
            ));
        }
        // What a step says (a probe's URL, its answer, what it expected) reaches events, the
        // journal and errors only scrubbed of the configuration's sensitive values.
        let result = match result {
            Ok(mut applied) => {
                applied.summary = self.secrets.scrub(&applied.summary).into_owned();
                Ok(applied)
            }
            Err(e) => Err(e.scrubbed(&self.secrets)),
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
        attributes.mark(
            crate::plan::MARK_LAST_RUN,
            serde_json::json!(applied.summary),
        );
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
            if !kind.kind().description().found_untracked
                && kind.kind().description().lifecycle != crate::vocabulary::Lifecycle::Runs =>
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
    record_imports(&mut req);
    let before = req.state.clone();
    let mut state = req.state.clone();
    let mut outcome = ApplyOutcome::nothing_done(&before);
    // A step that can never start would end the run with it silently left out: refuse the
    // whole run before anything changes, naming the loop.
    if let Some(cycle) = wait_cycle(&steps) {
        refuse_waiting_steps(&mut outcome, &steps, &cycle);
        finished_early(
            &req.events,
            started,
            "refused before the first step: the steps wait on each other",
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
    if !write_lineage_first(&req, &mut state, &mut outcome) {
        finished_early(&req.events, started, "failed before the first step");
        return outcome;
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
    let jobs = Jobs {
        pool: pool.clone(),
        before: &before,
        desired: req
            .config
            .resources
            .iter()
            .map(|r| (r.address.as_str(), &r.config))
            .collect(),
        config_dir: req.config.dir.clone(),
        events: req.events.clone(),
        cancel: req.cancel.clone(),
        containers: containers.clone(),
        secrets: req.config.secrets.clone(),
        gates: start_gates(req.config, &steps),
    };
    let mut run = Run::new(&req, &steps, &before, state, outcome);
    run.execute(&jobs).await;
    run.account_for_what_did_not_run();
    run.count_what_ran();
    if run.outcome.ok {
        run.finalize(&jobs).await;
    } else if req.rollback {
        run.roll_back(&jobs).await;
    }
    let Run {
        state,
        mut outcome,
        completed,
        ..
    } = run;
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

/// Imports, moves and forgets change nothing on the machines: they are in the state before the
/// first step, so a step that then updates or replaces an imported object finds it recorded.
fn record_imports(req: &mut ApplyRequest<'_>) {
    crate::plan::moves::record(&mut req.state, &req.plan.moved, &req.plan.forgotten);
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
}

impl ApplyOutcome {
    /// Before the first step: a success so far, with the state as it was.
    fn nothing_done(before: &State) -> ApplyOutcome {
        ApplyOutcome {
            ok: true,
            failures: Vec::new(),
            interrupted: false,
            stopped: Vec::new(),
            rolled_back: false,
            undone: 0,
            to_undo: 0,
            undo_failures: Vec::new(),
            warnings: Vec::new(),
            notes: Vec::new(),
            not_run: Vec::new(),
            ran: crate::plan::Summary::default(),
            state: before.clone(),
            state_error: None,
        }
    }
}

/// Steps that wait on each other: the whole run is refused, every step not run, naming the loop.
fn refuse_waiting_steps(outcome: &mut ApplyOutcome, steps: &[Step], cycle: &[String]) {
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
}

fn finished_early(events: &Sender, started: Instant, summary: &str) {
    emit(
        events,
        Event::Finished {
            ok: false,
            elapsed: started.elapsed(),
            summary: summary.into(),
        },
    );
}

/// The lineage is on disk before any container carries it, so a run killed during its first
/// step leaves a state that explains what that step created. False: it could not be written.
fn write_lineage_first(
    req: &ApplyRequest<'_>,
    state: &mut State,
    outcome: &mut ApplyOutcome,
) -> bool {
    if req.store.path().exists()
        && req.plan.imports.is_empty()
        && req.plan.moved.is_empty()
        && req.plan.forgotten.is_empty()
    {
        return true;
    }
    let Err(e) = req.store.write(state) else {
        journal_hook::after_journal_write(journal_hook::JournalWrite::Lineage, Action::NoOp, "");
        return true;
    };
    outcome.ok = false;
    outcome.state_error = Some(e.to_string());
    outcome.failures.push((
        "(state)".into(),
        StepError::new(format!("cannot write the state before the first step: {e}")),
    ));
    false
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

/// Makes the owned `Job` for a step from what every step shares.
struct Jobs<'a> {
    pool: Arc<HostPool>,
    before: &'a State,
    desired: HashMap<&'a str, &'a crate::kind::Configuration>,
    config_dir: PathBuf,
    events: Sender,
    cancel: CancellationToken,
    containers: Arc<ContainerIndex>,
    secrets: crate::events::Secrets,
    gates: StartGates,
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
            secrets: self.secrets.clone(),
            gate: self.gates.of(&step.address).cloned(),
            upstream: Vec::new(),
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

//! `sparkform watch`: check the live deployment every interval — each recorded container's
//! state and Docker restart count, the lines of its log that mean it no longer serves (its
//! `watch_on_log` and its ready checks' `fail_on_log`), and the probes `verify` runs, each
//! bounded by a timeout — and, when told to, restart the whole engine through the normal apply
//! (`-replace` of what failed with its process group, what its replacement triggers, and what
//! depends on it), bounded in count within a window, with backoff.
//!
//! One connection per node at a time: the checks' pool is closed before a restart's apply opens
//! its own, and opened again after. The state lock is held only by the restart's apply (and the
//! short write that records the restart), so `plan` and `status` work beside it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::apply::{PlanRequest, PlanSource, RunOptions};
use super::definitions::{self, Pins};
use super::OpError;
use crate::config::Config;
use crate::events::{emit, Event, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::{container_index, machine, HealthWindow, ReadMode};
use crate::plan::PlanOptions;
use crate::state::{Restart, State, StateStore, RESTARTS_KEPT};
use crate::vocabulary::Lifecycle;
use crate::workspace::Workspace;

pub struct WatchRequest {
    pub workspace: Workspace,
    /// The definitions as the command evaluated them, once: each check pins them to the state
    /// it reads, and a restart plans from them.
    pub evaluated: definitions::Evaluated,
    pub interval: Duration,
    /// The bound on each probe's run (the canary's completion included).
    pub probe_timeout: Duration,
    /// How long a probe's failed attempts are tried again within a check (not its timeout,
    /// which is the load-time wait of an apply).
    pub retry_for: Duration,
    pub restart: bool,
    /// Restarts allowed within `window`; one more stops the watch.
    pub max_restarts: usize,
    pub window: Duration,
    /// Stop after this many checks (`None`: until interrupted or failed).
    pub ticks: Option<u64>,
    pub hosts: HostOptions,
    pub parallelism: usize,
}

/// How a watch ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEnd {
    /// The checks it was asked for all ran.
    Done,
    /// Interrupted (a signal); a restart that was running finished or rolled back first.
    Interrupted,
    /// A check failed and restarting was not asked for: the cause.
    Failed(String),
    /// More restarts than allowed in the window were needed: the last cause.
    CrashLoop(String),
}

/// One thing a check found wrong, and what a restart replaces for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub cause: String,
    /// Containers that failed themselves.
    pub containers: Vec<String>,
    /// A probe that failed (its engine's containers are found in the graph).
    pub probe: Option<String>,
    /// Whether a restart can help (an unreachable node is no engine's fault).
    pub restartable: bool,
}

/// What one check saw.
#[derive(Debug, Default)]
pub struct WatchCheck {
    pub failures: Vec<Failure>,
    /// Each probe that passed: (address, seconds, summary).
    pub probes: Vec<(String, f64, String)>,
    pub containers: usize,
}

/// What the checks remember between ticks: each container's Docker restart count, and from
/// when its log is still to be read (Unix seconds).
#[derive(Default)]
struct Seen {
    restart_counts: BTreeMap<String, i64>,
    log_since: BTreeMap<String, i64>,
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Every recorded resource whose kind watches its health (a container: running, not
/// restarted by Docker since the last check, no line of its log that means it no longer
/// serves), at once, each on its node's connection.
async fn check_containers(state: &State, pool: &HostPool, seen: &mut Seen, check: &mut WatchCheck) {
    let now = now_unix();
    let mut checks = Vec::new();
    for (address, r) in &state.resources {
        // The memory of a check is kept by what runs (a replaced container starts afresh).
        let Some(id) = r.kind.kind().holds(&r.attributes).id else {
            continue;
        };
        let before = seen.restart_counts.get(&id).copied();
        let since = *seen.log_since.entry(id.clone()).or_insert(now);
        checks.push(async move {
            let health = machine(r.kind)
                .health(
                    address,
                    r,
                    pool,
                    HealthWindow::SinceLastCheck {
                        restarts_before: before,
                        log_since: since,
                    },
                )
                .await;
            (id, address, health)
        });
    }
    for (id, address, health) in futures_util::future::join_all(checks).await {
        let Some(health) = health else {
            continue;
        };
        check.containers += 1;
        if let Some(n) = health.restart_count {
            seen.restart_counts.insert(id.clone(), n);
        }
        if let Some(t) = health.log_until {
            seen.log_since.insert(id, t);
        }
        check.failures.extend(health.failure.map(|f| Failure {
            cause: f.cause,
            containers: if f.restartable {
                vec![address.to_string()]
            } else {
                Vec::new()
            },
            probe: None,
            restartable: f.restartable,
        }));
    }
}

/// The probes `verify` runs, as it runs them (`ops::verify::Deployed::check`: a probe whose
/// container is not running fails at once, a failed attempt is tried again for `retry_for`
/// only), each bounded by `--probe-timeout`.
async fn check_probes(
    req: &WatchRequest,
    config: &Config,
    graph: &Graph,
    state: &State,
    pool: &HostPool,
    cancel: &CancellationToken,
    check: &mut WatchCheck,
) {
    let containers = container_index(config);
    let deployed = super::verify::Deployed {
        graph,
        state,
        pool,
        containers: &containers,
        retry_for: req.retry_for,
        cancel,
    };
    for address in graph.order() {
        let Some(p) = config.resource(&address) else {
            continue;
        };
        let kind = p.kind.kind();
        if kind.description().lifecycle != Lifecycle::Runs || !kind.checking(&p.config).unnamed {
            continue;
        }
        // A probe whose resources are not all deployed would only retry against nothing.
        let undeployed = graph.ancestors(&address).into_iter().any(|a| {
            config
                .resource(&a)
                .is_some_and(|r| r.kind.kind().description().lifecycle != Lifecycle::Runs)
                && !state.resources.contains_key(&a)
        });
        if undeployed {
            continue;
        }
        let start = Instant::now();
        let quiet = |_: String, _: u64| {};
        let run = deployed.check(p, &quiet);
        let secrets = &config.secrets;
        match tokio::time::timeout(req.probe_timeout, run).await {
            Ok(Some(Ok((took, summary)))) => check.probes.push((
                address.clone(),
                took.as_secs_f64(),
                secrets.scrub(&summary).into_owned(),
            )),
            Ok(Some(Err(e))) => check.failures.push(Failure {
                cause: format!("{address} failed: {}", secrets.scrub(&e.message)),
                containers: Vec::new(),
                probe: Some(address.clone()),
                restartable: true,
            }),
            Ok(None) => {}
            Err(_) => check.failures.push(Failure {
                cause: format!(
                    "{address} did not pass within {:.0} s (the engine does not answer)",
                    start.elapsed().as_secs_f64()
                ),
                containers: Vec::new(),
                probe: Some(address.clone()),
                restartable: true,
            }),
        }
    }
}

/// What a restart replaces for `failures`: the containers that failed, and for a failed probe
/// the engine's containers nearest to it (those none of the probe's other container ancestors
/// depends on: vLLM, not the Ray cluster under it); then every member of their process groups
/// and every container whose `replace_triggered_by` names one of them, until nothing is added.
/// And what the apply targets: those and everything that depends on them (the probes run
/// again). Pure.
pub fn restart_set(
    config: &Config,
    graph: &Graph,
    failures: &[Failure],
) -> (Vec<String>, Vec<String>) {
    // What runs as a process (a container) is what a restart replaces.
    let is_container = |a: &str| {
        config
            .resource(a)
            .is_some_and(|r| r.kind.kind().description().service)
    };
    let mut set: BTreeSet<String> = BTreeSet::new();
    for f in failures.iter().filter(|f| f.restartable) {
        set.extend(f.containers.iter().filter(|a| is_container(a)).cloned());
        if let Some(p) = &f.probe {
            let engine: BTreeSet<String> = graph
                .ancestors(p)
                .into_iter()
                .filter(|a| is_container(a))
                .collect();
            let nearest = engine.iter().filter(|a| {
                !engine
                    .iter()
                    .any(|b| b != *a && graph.ancestors(b).contains(*a))
            });
            set.extend(nearest.cloned());
        }
    }
    loop {
        let before = set.len();
        let groups: BTreeSet<(Vec<String>, String)> = set
            .iter()
            .filter_map(|a| config.resource(a))
            .filter_map(|r| Some((module_of(&r.address), r.group.clone()?)))
            .collect();
        for r in &config.resources {
            let in_group = r
                .group
                .as_ref()
                .is_some_and(|g| groups.contains(&(module_of(&r.address), g.clone())));
            let triggered = r.replace_triggered_by.iter().any(|t| set.contains(t));
            if in_group || triggered {
                set.insert(r.address.clone());
            }
        }
        if set.len() == before {
            break;
        }
    }
    let mut targets = set.clone();
    for a in &set {
        targets.extend(graph.descendants(a));
    }
    (set.into_iter().collect(), targets.into_iter().collect())
}

/// The module path of an address (`module.qwen.` of `module.qwen.container.rank0`): process
/// groups are scoped by module.
fn module_of(address: &str) -> Vec<String> {
    let parts: Vec<&str> = address.split('.').collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < parts.len() && parts[i] == "module" {
        out.push(parts[i + 1].to_string());
        i += 2;
    }
    out
}

/// Replace `replace` (and apply `targets`) through the normal apply: the state lock, the
/// journal, rollback. Ok(summary) when it succeeded.
async fn restart(
    req: &WatchRequest,
    replace: Vec<String>,
    targets: Vec<String>,
    events: &Sender,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let prepared = super::apply::lock_and_plan(
        PlanRequest {
            evaluated: req.evaluated.clone(),
            lockfile_readonly: false,
            store: req.workspace.store(),
            source: PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions {
                    replace,
                    targets,
                    ..PlanOptions::default()
                },
            },
            hosts: req.hosts.clone(),
        },
        events,
    )
    .await
    .map_err(describe)?;
    let outcome = prepared
        .apply(
            RunOptions {
                parallelism: req.parallelism,
                rollback: true,
                hosts: req.hosts.clone(),
            },
            events.clone(),
            cancel.clone(),
        )
        .await;
    if outcome.ok {
        let r = &outcome.ran;
        Ok(format!(
            "{} replaced, {} probe{} passed",
            r.replace,
            r.run,
            if r.run == 1 { "" } else { "s" }
        ))
    } else if outcome.interrupted {
        Err("interrupted: the restart was stopped and rolled back".into())
    } else {
        let why = outcome
            .failures
            .first()
            .map(|(a, e)| format!("{a}: {}", e.message))
            .unwrap_or_else(|| "it did not complete".into());
        Err(format!("the restart failed ({why}); it was rolled back"))
    }
}

fn describe(e: OpError) -> String {
    match e {
        OpError::Config(d) => {
            d.0.first()
                .map(|d| d.message.clone())
                .unwrap_or_else(|| "the definitions have errors".into())
        }
        OpError::State(e) => e.to_string(),
        other => format!("{other:?}"),
    }
}

/// Record a restart in the state, under its lock (held only for this write).
fn record(store: &StateStore, restart: Restart) -> Result<(), String> {
    let _lock = store.lock("watch").map_err(|e| e.to_string())?;
    let Some(mut state) = store.load().map_err(|e| e.to_string())? else {
        return Ok(());
    };
    state.restarts.push(restart);
    let extra = state.restarts.len().saturating_sub(RESTARTS_KEPT);
    state.restarts.drain(..extra);
    store.write(&mut state).map_err(|e| e.to_string())
}

/// The nodes the recorded resources are on.
fn nodes_of(config: &Config, state: &State) -> Vec<String> {
    let nodes: BTreeSet<String> = state
        .resources
        .values()
        .filter_map(|r| r.node.clone())
        .chain(config.resources.iter().filter_map(|r| r.node.clone()))
        .filter(|n| config.nodes.contains_key(n))
        .collect();
    nodes.into_iter().collect()
}

/// Sleep `d` unless cancelled first; whether it was cancelled.
async fn pause(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = cancel.cancelled() => true,
    }
}

/// One line for a check: what runs and how long each probe took, or every failure's cause.
fn summary(check: &WatchCheck) -> String {
    if !check.failures.is_empty() {
        let causes: Vec<&str> = check.failures.iter().map(|f| f.cause.as_str()).collect();
        return causes.join("; ");
    }
    let probes: Vec<String> = check
        .probes
        .iter()
        .map(|(a, s, _)| format!("{a} {s:.2} s"))
        .collect();
    format!(
        "{} container{} running; {}",
        check.containers,
        if check.containers == 1 { "" } else { "s" },
        if probes.is_empty() {
            "no probe".to_string()
        } else {
            probes.join(", ")
        }
    )
}

/// One check: the probes first (what a wedged engine logs while a probe waits on it is then
/// read in the same check), then the containers, whose failures (the clearer causes) come first.
async fn check_once(
    req: &WatchRequest,
    defs: &definitions::Definitions,
    state: &State,
    pool: &HostPool,
    seen: &mut Seen,
    cancel: &CancellationToken,
) -> WatchCheck {
    let mut probed = WatchCheck::default();
    check_probes(
        req,
        &defs.config,
        &defs.graph,
        state,
        pool,
        cancel,
        &mut probed,
    )
    .await;
    let mut check = WatchCheck::default();
    check_containers(state, pool, seen, &mut check).await;
    check.failures.append(&mut probed.failures);
    check.probes = probed.probes;
    check
}

/// What a restart needs besides the request: the restarts made in the window, the checks'
/// pool (closed while the restart's apply runs), and where progress goes.
struct Restarts<'a> {
    made: VecDeque<Instant>,
    events: &'a Sender,
    cancel: &'a CancellationToken,
    metrics: Option<&'a super::watch_metrics::Metrics>,
}

/// What came of a failed check.
enum Handled {
    /// The watch ends here.
    End(WatchEnd),
    /// The engine was restarted: whether its apply succeeded.
    Restarted(bool),
    /// Nothing a restart can help (a node out of reach).
    Nothing,
}

impl Restarts<'_> {
    /// Restart the engine for `failures`, unless the window's restarts ran out.
    async fn after(
        &mut self,
        req: &WatchRequest,
        defs: &definitions::Definitions,
        failures: &[Failure],
        pool: &mut Option<HostPool>,
    ) -> Handled {
        let Some(cause) = failures.first().map(|f| f.cause.clone()) else {
            return Handled::Nothing;
        };
        let (replace, targets) = restart_set(&defs.config, &defs.graph, failures);
        if replace.is_empty() {
            return Handled::Nothing;
        }
        while self.made.front().is_some_and(|t| t.elapsed() > req.window) {
            self.made.pop_front();
        }
        if self.made.len() >= req.max_restarts {
            return Handled::End(WatchEnd::CrashLoop(cause));
        }
        // Backoff: each restart within the window waits twice as long as the one before.
        if !self.made.is_empty() {
            let wait = req.interval * 2u32.saturating_pow(self.made.len() as u32 - 1);
            if pause(wait.min(Duration::from_secs(600)), self.cancel).await {
                return Handled::End(WatchEnd::Interrupted);
            }
        }
        let shown = defs.config.secrets.scrub(&cause).into_owned();
        emit(
            self.events,
            Event::WatchRestart {
                attempt: self.made.len() + 1,
                cause: shown.clone(),
                resources: replace.clone(),
            },
        );
        // One connection per node: the apply opens its own.
        if let Some(p) = pool.take() {
            p.close().await;
        }
        self.made.push_back(Instant::now());
        let result = restart(req, replace.clone(), targets, self.events, self.cancel).await;
        if let Some(m) = self.metrics {
            m.restarted(&shown);
        }
        let ok = result.is_ok();
        let noted = record(
            &req.workspace.store(),
            Restart {
                at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                cause: shown,
                resources: replace,
                ok,
            },
        );
        let mut summary = result.unwrap_or_else(|e| e);
        if let Err(e) = noted {
            summary.push_str(&format!(" (the restart is not recorded in the state: {e})"));
        }
        emit(self.events, Event::WatchRestarted { ok, summary });
        if self.cancel.is_cancelled() {
            Handled::End(WatchEnd::Interrupted)
        } else {
            Handled::Restarted(ok)
        }
    }
}

/// `sparkform watch` as a whole: refused when nothing is deployed; the Prometheus text served
/// at `metrics` (when given) for as long as [`watch`] runs.
pub async fn watch_deployment(
    req: WatchRequest,
    metrics: Option<std::net::SocketAddr>,
    events: &Sender,
    cancel: CancellationToken,
) -> Result<WatchEnd, OpError> {
    let ws = &req.workspace;
    if ws.state()?.is_none_or(|s| s.resources.is_empty()) {
        return Err(OpError::Local(format!(
            "{}, so there is nothing to watch.\n  help: deploy it first with `sparkform apply {}`",
            ws.nothing_applied(),
            ws.dir.display()
        )));
    }
    let counters = std::sync::Arc::new(super::watch_metrics::Metrics::new());
    let server = match metrics {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                OpError::Local(format!("cannot listen on {addr} for --metrics: {e}"))
            })?;
            Some(tokio::spawn(super::watch_metrics::serve(
                listener,
                counters.clone(),
            )))
        }
        None => None,
    };
    let end = watch(req, events, cancel, metrics.map(|_| counters.as_ref())).await;
    if let Some(s) = server {
        s.abort();
    }
    end
}

/// Watch until the checks asked for ran, a check fails without `restart`, the restarts run out,
/// or `cancel` (a signal).
pub async fn watch(
    req: WatchRequest,
    events: &Sender,
    cancel: CancellationToken,
    metrics: Option<&super::watch_metrics::Metrics>,
) -> Result<WatchEnd, OpError> {
    let store = req.workspace.store();
    let mut pool: Option<HostPool> = None;
    let mut seen = Seen::default();
    let mut restarts = Restarts {
        made: VecDeque::new(),
        events,
        cancel: &cancel,
        metrics,
    };
    let mut tick = 0u64;
    let mut cached: Option<((u64, String), definitions::Definitions)> = None;
    let end = loop {
        if cancel.is_cancelled() {
            break WatchEnd::Interrupted;
        }
        tick += 1;
        let started = Instant::now();
        let state = store
            .load()?
            .ok_or_else(|| OpError::Local("nothing is deployed: the state is empty".into()))?;
        // The definitions as deployed: evaluated again only when the state changed (a restart,
        // an apply beside the watch), not at every check.
        let key = (state.serial, state.lineage.clone());
        if cached.as_ref().map(|(k, _)| k) != Some(&key) {
            let d = req.evaluated.clone().pin(Pins::Recorded(Some(&state)))?;
            cached = Some((key, d));
        }
        let Some((_, defs)) = cached.as_ref() else {
            continue;
        };
        if pool.is_none() {
            let nodes = nodes_of(&defs.config, &state);
            pool = Some(HostPool::connect(&defs.config, &nodes, &req.hosts).await);
        }
        let Some(p) = pool.as_ref() else {
            continue;
        };
        let check = check_once(&req, defs, &state, p, &mut seen, &cancel).await;
        if cancel.is_cancelled() {
            break WatchEnd::Interrupted;
        }
        emit(
            events,
            Event::WatchCheck {
                tick,
                ok: check.failures.is_empty(),
                elapsed: started.elapsed(),
                summary: defs.config.secrets.scrub(&summary(&check)).into_owned(),
            },
        );
        if let Some(m) = metrics {
            m.observe(
                &check.probes,
                check.failures.first().map(|f| f.cause.as_str()),
            );
        }
        // Whether the deployment serves after this check (and its restart, if any).
        let serving = match check.failures.first() {
            None => true,
            Some(f) if !req.restart => break WatchEnd::Failed(f.cause.clone()),
            Some(_) => match restarts.after(&req, defs, &check.failures, &mut pool).await {
                Handled::End(end) => break end,
                Handled::Restarted(ok) => ok,
                Handled::Nothing => false,
            },
        };
        if req.ticks.is_some_and(|n| tick >= n) {
            break match check.failures.first() {
                Some(f) if !serving => WatchEnd::Failed(f.cause.clone()),
                _ => WatchEnd::Done,
            };
        }
        if pause(req.interval, &cancel).await {
            break WatchEnd::Interrupted;
        }
    };
    if let Some(p) = pool {
        p.close().await;
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_scope_process_groups() {
        assert_eq!(module_of("module.qwen.container.rank0"), ["qwen"]);
        assert_eq!(
            module_of("module.a.module.b.container.x[\"n\"]"),
            ["a", "b"]
        );
        assert!(module_of("container.x").is_empty());
    }
}

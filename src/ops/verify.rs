//! Verify: run the probes against what is deployed, changing nothing.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Config, Resource};
use crate::events::{emit, Event, Secrets, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::{container_index, machine, ContainerIndex, StepError};
use crate::state::State;
use crate::vocabulary::Lifecycle;
use crate::workspace::Workspace;

use super::definitions::{Evaluated, Pins};
use super::OpError;

/// What `sparkform verify` asks: the probes (all, or `targets`) of the evaluated definitions,
/// run against what the workspace's state records.
pub struct VerifyCommand {
    pub workspace: Workspace,
    pub evaluated: Evaluated,
    pub targets: Vec<String>,
    pub retry_for: Duration,
    pub hosts: HostOptions,
}

/// A probe run: its address, and its latency and answer, or why it failed.
pub type ProbeResult = (String, Result<(Duration, String), StepError>);

/// What the probes said.
pub struct Verified {
    /// Each probe run, in dependency order.
    pub results: Vec<ProbeResult>,
    /// The checks left out because no `-target` named them.
    pub not_run: Vec<String>,
}

/// Why no probe ran.
pub enum NotVerified {
    /// A `-target` that is no probe of the definitions.
    UnknownTarget(String),
    /// Nothing is deployed: why, in words.
    NothingDeployed(String),
    /// Probes whose resources the state does not record, each with what it lacks.
    Undeployed(Vec<(String, Vec<String>)>),
    Op(OpError),
}

impl From<OpError> for NotVerified {
    fn from(e: OpError) -> Self {
        NotVerified::Op(e)
    }
}

/// `sparkform verify`: the definitions pinned to what the state records (never what the
/// machines say now), then every selected probe run against the deployment. `progress` is
/// handed the texts to keep out of what it shows, once they are known, and returns where the
/// probes' events go.
pub async fn run(
    cmd: VerifyCommand,
    progress: impl FnOnce(&Secrets) -> Sender,
) -> Result<Verified, NotVerified> {
    let ws = &cmd.workspace;
    if let Some(t) = unknown_targets(cmd.evaluated.config(), &cmd.targets).first() {
        return Err(NotVerified::UnknownTarget(t.clone()));
    }
    let state = match super::state::recorded(ws).map_err(OpError::from)? {
        Some(s) => s,
        None => return Err(NotVerified::NothingDeployed(ws.nothing_applied())),
    };
    if state.resources.is_empty() {
        return Err(NotVerified::NothingDeployed(format!(
            "the state at {} records nothing: nothing is deployed",
            ws.state_path.display()
        )));
    }
    let pinned = cmd.evaluated.pin(Pins::Recorded(Some(&state)))?;
    let (config, graph) = (pinned.config, pinned.graph);
    let undeployed = undeployed(&config, &graph, &state, &cmd.targets);
    if !undeployed.is_empty() {
        return Err(NotVerified::Undeployed(undeployed));
    }
    let events = progress(&config.secrets);
    let results = verify(
        &config,
        &graph,
        &state,
        &cmd.targets,
        cmd.retry_for,
        &cmd.hosts,
        &events,
    )
    .await;
    Ok(Verified {
        results,
        not_run: not_run_by_default(&config, &cmd.targets),
    })
}

/// The `-target`s that are not a probe of the configuration.
pub fn unknown_targets(config: &Config, targets: &[String]) -> Vec<String> {
    targets
        .iter()
        .filter(|t| {
            !config.resources.iter().any(|r| {
                &r.address == *t && r.kind.kind().description().lifecycle == Lifecycle::Runs
            })
        })
        .cloned()
        .collect()
}

/// The probes to verify (all, or the `targets`) whose deployed dependencies (containers,
/// attachments: everything but other probes) the state does not record, each with what it
/// lacks. A probe listed here would only retry against something that is not there.
pub fn undeployed(
    config: &Config,
    graph: &Graph,
    state: &State,
    targets: &[String],
) -> Vec<(String, Vec<String>)> {
    let deployed_kind: HashMap<&str, bool> = config
        .resources
        .iter()
        .map(|r| {
            (
                r.address.as_str(),
                r.kind.kind().description().lifecycle != Lifecycle::Runs,
            )
        })
        .collect();
    config
        .resources
        .iter()
        .filter(|r| r.kind.kind().description().lifecycle == Lifecycle::Runs)
        .filter(|r| selected(r, targets))
        .filter_map(|p| {
            let missing: Vec<String> = graph
                .ancestors(&p.address)
                .into_iter()
                .filter(|a| deployed_kind.get(a.as_str()).copied().unwrap_or(false))
                .filter(|a| !state.resources.contains_key(a))
                .collect();
            (!missing.is_empty()).then(|| (p.address.clone(), missing))
        })
        .collect()
}

/// Whether `verify` runs it: named by a `-target`, or, without targets, run by default.
fn selected(r: &Resource, targets: &[String]) -> bool {
    if targets.is_empty() {
        r.kind.kind().checking(&r.config).unnamed
    } else {
        targets.contains(&r.address)
    }
}

/// The checks a `verify` without `-target` leaves out (a fabric test loads the fabric and
/// the GPUs of a serving deployment): run only when named.
pub fn not_run_by_default(config: &Config, targets: &[String]) -> Vec<String> {
    config
        .resources
        .iter()
        .filter(|r| r.kind.kind().description().lifecycle == Lifecycle::Runs)
        .filter(|r| targets.is_empty() && !r.kind.kind().checking(&r.config).unnamed)
        .map(|r| r.address.clone())
        .collect()
}

/// The deployment the checks run against, connected: what the state records, and how long a
/// failed attempt is tried again.
pub struct Deployed<'a> {
    pub graph: &'a Graph,
    pub state: &'a State,
    pub pool: &'a HostPool,
    pub containers: &'a ContainerIndex,
    /// How long a check's failed attempts are tried again (`--retry-for`): the deployment passed
    /// once, so this is not the load-time wait of the definitions' `timeout`.
    pub retry_for: Duration,
    pub cancel: &'a CancellationToken,
}

impl Deployed<'_> {
    /// What `check` depends on (its ancestors the state records) that is down now, each with
    /// why, as its kind tells ([`down`](crate::kinds::machine::down)): a
    /// container that exited, with its exit code. Asked of all of them at once.
    pub async fn down(&self, check: &str) -> Vec<(String, String)> {
        let asks = self.graph.ancestors(check).into_iter().filter_map(|a| {
            let recorded = self.state.resources.get(&a)?;
            Some(async move {
                let why = crate::kinds::machine::down(&a, recorded, self.pool).await;
                why.map(|w| (a, w))
            })
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Run one check (a probe) against the deployment: first what it depends on — something
    /// down fails it at once, naming why, with no attempt — then the check itself, its failed
    /// attempts tried again for `retry_for` only. `None` for a resource that is no check.
    pub async fn check(
        &self,
        r: &Resource,
        progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(Duration, String), StepError>> {
        if r.kind.kind().description().lifecycle != Lifecycle::Runs {
            return None;
        }
        let down = self.down(&r.address).await;
        if let Some((first, why)) = down.first() {
            let more: Vec<String> = down
                .iter()
                .skip(1)
                .map(|(a, w)| format!("{a}: {w}"))
                .collect();
            return Some(Err(StepError::new(format!(
                "not tried: {first}, which it depends on, is down: {why}"
            ))
            .details(more)
            .help(format!(
                "it cannot pass until {} runs again: `sparkform logs` shows why it stopped, and `sparkform apply` replaces it",
                if down.len() == 1 { "that" } else { "each of them" }
            ))));
        }
        machine(r.kind)
            .verify(
                &r.config,
                self.pool,
                self.containers,
                self.retry_for,
                self.cancel,
                progress,
            )
            .await
    }
}

/// Run every probe of the configuration (or the targeted ones) against what is deployed (what
/// `state` records), in dependency order; returns (address, result). A probe whose dependency
/// is down fails at once; a failed attempt is tried again for `retry_for` only. Changes nothing.
pub async fn verify(
    config: &Config,
    graph: &Graph,
    state: &State,
    targets: &[String],
    retry_for: Duration,
    hosts: &HostOptions,
    events: &Sender,
) -> Vec<ProbeResult> {
    let containers = container_index(config);
    let by_address: HashMap<&str, &Resource> = config
        .resources
        .iter()
        .map(|r| (r.address.as_str(), r))
        .collect();
    let probes: Vec<&Resource> = graph
        .order()
        .iter()
        .filter_map(|a| by_address.get(a.as_str()).copied())
        .filter(|r| r.kind.kind().description().lifecycle == Lifecycle::Runs)
        .filter(|r| selected(r, targets))
        .collect();
    let mut nodes: BTreeSet<String> = containers.values().map(|(n, _)| n.clone()).collect();
    // Every node something runs on: a check may reach beyond its own (a fabric test's ranks).
    nodes.extend(config.resources.iter().filter_map(|r| r.node.clone()));
    let nodes: Vec<String> = nodes
        .into_iter()
        .filter(|n| config.nodes.contains_key(n))
        .collect();
    let pool = HostPool::connect(config, &nodes, hosts).await;
    let cancel = CancellationToken::new();
    let deployed = Deployed {
        graph,
        state,
        pool: &pool,
        containers: &containers,
        retry_for,
        cancel: &cancel,
    };
    let mut out = Vec::new();
    // What the probes report, scrubbed of the definitions' sensitive values at the source.
    let secrets = &config.secrets;
    let emit = |events: &Sender, e: Event| emit(events, e.scrubbed(secrets));
    for p in probes {
        emit(
            events,
            Event::StepStarted {
                address: p.address.clone(),
                action: "run".into(),
            },
        );
        let start = Instant::now();
        let address = p.address.clone();
        let progress = |m: String, t: u64| {
            emit(
                events,
                Event::StepProgress {
                    address: address.clone(),
                    message: m,
                    log: None,
                    timeout_secs: Some(t),
                },
            )
        };
        let r = deployed
            .check(p, &progress)
            .await
            .unwrap_or_else(|| Ok((Duration::ZERO, "nothing to verify".into())))
            .map(|(t, s)| (t, secrets.scrub(&s).into_owned()))
            .map_err(|e| e.scrubbed(secrets));
        match &r {
            Ok((_, s)) => emit(
                events,
                Event::StepDone {
                    address: p.address.clone(),
                    action: "run".into(),
                    elapsed: start.elapsed(),
                    summary: s.clone(),
                },
            ),
            Err(e) => emit(
                events,
                Event::StepFailed {
                    address: p.address.clone(),
                    elapsed: start.elapsed(),
                    error: e.render(),
                },
            ),
        }
        out.push((p.address.clone(), r));
    }
    pool.close().await;
    out
}

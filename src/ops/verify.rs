//! Verify: run the probes against what is deployed, changing nothing.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Config, Resource};
use crate::events::{emit, Event, Sender};
use crate::graph::Graph;
use crate::hosts::{HostOptions, HostPool};
use crate::kinds::machine::{container_index, machine, StepError};
use crate::kinds::Lifecycle;
use crate::state::State;

/// The `-target`s that are not a probe of the configuration.
pub fn unknown_targets(config: &Config, targets: &[String]) -> Vec<String> {
    targets
        .iter()
        .filter(|t| {
            !config
                .resources
                .iter()
                .any(|r| &r.address == *t && r.kind.kind().lifecycle() == Lifecycle::Runs)
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
                r.kind.kind().lifecycle() != Lifecycle::Runs,
            )
        })
        .collect();
    config
        .resources
        .iter()
        .filter(|r| r.kind.kind().lifecycle() == Lifecycle::Runs)
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
        r.kind.kind().verify_by_default()
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
        .filter(|r| r.kind.kind().lifecycle() == Lifecycle::Runs)
        .filter(|r| targets.is_empty() && !r.kind.kind().verify_by_default())
        .map(|r| r.address.clone())
        .collect()
}

/// Run every probe of the configuration (or the targeted ones) against what is deployed;
/// returns (address, result) in dependency order. Changes nothing.
pub async fn verify(
    config: &Config,
    order: &[String],
    targets: &[String],
    hosts: &HostOptions,
    events: &Sender,
) -> Vec<(String, Result<(Duration, String), StepError>)> {
    let containers = container_index(config);
    let by_address: HashMap<&str, &Resource> = config
        .resources
        .iter()
        .map(|r| (r.address.as_str(), r))
        .collect();
    let probes: Vec<&Resource> = order
        .iter()
        .filter_map(|a| by_address.get(a.as_str()).copied())
        .filter(|r| r.kind.kind().lifecycle() == Lifecycle::Runs)
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
        let r = machine(p.kind)
            .verify(&p.config, &pool, &containers, &cancel, &progress)
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

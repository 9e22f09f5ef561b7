//! Rollback: the undos in reverse dependency order (independent ones in parallel), the process
//! groups restarted, and a check of what was restored.

use super::*;
use crate::kinds::machine::Restore;

/// Undo this apply's completed steps, each once every step that depended on it is undone
/// (reverse dependency order), independent ones in parallel up to `-parallelism`; then the
/// state holds what it held before the apply for every undone step.
#[allow(clippy::too_many_arguments)]
pub(super) async fn rollback(
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
        .filter(|(_, s, _)| match &s.kind {
            StepKind::Resource(_) => true,
            StepKind::Check { run, .. } => run.undoes(),
        })
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
            let kind = match &step.kind {
                StepKind::Resource(kind) => *kind,
                StepKind::Check { run, .. } => {
                    let (run, pool) = (run.clone(), jobs.pool.clone());
                    running.spawn((k, Instant::now()), async move { run.undo(&pool).await });
                    continue;
                }
            };
            let mut job = jobs.job(step);
            job.cancel = undo_cancel.clone();
            let applied = applied.clone();
            running.spawn((k, Instant::now()), async move {
                machine(kind)
                    .undo(&job.cx(), job.step.change.action, &applied)
                    .await
                    .map(|s| job.secrets.scrub(&s).into_owned())
                    .map_err(|e| e.scrubbed(&job.secrets))
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
                let is_resource = matches!(undoable[k].1.kind, StepKind::Resource(_));
                if undoable[k].1.change.orphan.is_none() && is_resource {
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
                // leaves the tracked resource's entry alone, and a check records nothing.
                if undoable[k].1.change.orphan.is_none() && is_resource {
                    match before.resources.get(address) {
                        Some(r) => {
                            state.resources.insert(address.clone(), r.clone());
                        }
                        None => {
                            state.resources.remove(address);
                        }
                    }
                }
                match req.store.write(state) {
                    Ok(()) => super::journal_hook::after_journal_write(
                        super::journal_hook::JournalWrite::Undo,
                        undoable[k].1.change.action,
                        address,
                    ),
                    Err(e) => outcome.state_error = Some(e.to_string()),
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

/// The members of a group in the waves they restart in: each wave waits for no member of a
/// later one (`depends_on` between members, as the steps' dependencies say).
fn restart_waves<'s>(steps: &[Step], members: &[&'s Step]) -> Vec<Vec<&'s Step>> {
    let index_of = |a: &str| steps.iter().position(|s| s.address == a);
    let mut left: Vec<&Step> = members.to_vec();
    let mut waves = Vec::new();
    while !left.is_empty() {
        let waits = |m: &Step| {
            left.iter().any(|o| {
                o.address != m.address && index_of(&o.address).is_some_and(|i| m.deps.contains(&i))
            })
        };
        let (now, later): (Vec<&Step>, Vec<&Step>) = left.iter().partition(|m| !waits(m));
        if now.is_empty() {
            // Members that wait on each other (refused before an apply starts): one at a time.
            waves.extend(later.into_iter().map(|m| vec![m]));
            break;
        }
        waves.push(now);
        left = later;
    }
    waves
}

/// The process groups a rollback restarts, each with its members the state recorded before the
/// apply, in dependency order: those a step of this apply touched (done or failed), except a
/// group whose start gate never let a member stop its previous container.
fn groups_to_restart<'s>(
    req: &ApplyRequest<'_>,
    jobs: &Jobs<'_>,
    steps: &'s [Step],
    completed: &[(usize, Step, Applied)],
    before: &State,
    outcome: &ApplyOutcome,
) -> Vec<(String, Vec<&'s Step>)> {
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
    groups
        .into_iter()
        .filter(|(group, members)| touched_groups.contains(group) && members.len() >= 2)
        .filter(|(_, members)| {
            !members.iter().all(|m| {
                jobs.gates
                    .of(&m.address)
                    .is_some_and(|g| !g.passed(crate::kinds::machine::GatePhase::Prepared))
            })
        })
        .collect()
}

/// A process group (the ranks of one engine) comes back whole or not at all. After the undos,
/// every member the state recorded before the apply restarts, those that wait for no other
/// member together, then those that wait for them, each waiting for its recorded ready check
/// (which may need its peers: vLLM's ranks are all ready at rank 0's /health): a member that
/// came back on its own (its step failed and put its previous container back) may have joined
/// a peer the rollback then removed. When one does not come back, the others stop: half a group
/// serves nothing and holds the GPUs, and the next apply replaces the group. A group whose
/// start gate never let a member stop its previous container is left running as it is.
pub(super) async fn restart_process_groups(
    req: &ApplyRequest<'_>,
    jobs: &Jobs<'_>,
    steps: &[Step],
    completed: &[(usize, Step, Applied)],
    before: &State,
    restored: &mut Vec<String>,
    outcome: &mut ApplyOutcome,
) {
    for (_group, members) in groups_to_restart(req, jobs, steps, completed, before, outcome) {
        let mut came_back = Vec::new();
        let mut failed: Option<(String, String)> = None;
        // Every member stops first, the last in dependency order first: none of them may
        // still hold a connection to a peer of the group being undone (a rank the failed
        // step brought back joined the new rank 0 the rollback then removed).
        for step in members.iter().rev() {
            let StepKind::Resource(kind) = step.kind else {
                continue;
            };
            if let Err(e) = machine(kind)
                .restore(&jobs.job(step).cx(), Restore::Stopped)
                .await
            {
                failed = Some((step.address.clone(), e.message));
                break;
            }
        }
        for wave in restart_waves(steps, &members) {
            if failed.is_some() {
                break;
            }
            let restarts = wave.iter().filter_map(|step| {
                let StepKind::Resource(kind) = step.kind else {
                    return None;
                };
                let mut job = jobs.job(step);
                job.cancel = CancellationToken::new();
                Some(async move {
                    let started = Instant::now();
                    let result = machine(kind).restore(&job.cx(), Restore::Running).await;
                    (step, started.elapsed(), result)
                })
            });
            for (step, elapsed, result) in futures_util::future::join_all(restarts).await {
                match result {
                    Ok(summary) => {
                        emit(
                            &req.events,
                            Event::UndoDone {
                                address: step.address.clone(),
                                elapsed,
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
                                elapsed,
                                error: e.render(),
                            },
                        );
                        if failed.is_none() {
                            failed = Some((step.address.clone(), e.message));
                        }
                    }
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
            let stopped = machine(kind).restore(&job.cx(), Restore::Stopped).await;
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
pub(super) async fn check_restored(
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
    let seen = match crate::observe::observe_recorded(&expected, hosts).await {
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
            crate::plan::Drift::InSync => continue,
            crate::plan::Drift::Missing(why) => why,
            crate::plan::Drift::Drifted(notes) => notes.join("; "),
        };
        not_restored(outcome, vec![address], &why);
    }
}

pub(super) fn not_restored(outcome: &mut ApplyOutcome, addresses: Vec<String>, why: &str) {
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
pub(super) fn undo_order(
    undoable: &[usize],
    dependents: &[Vec<usize>],
) -> (Vec<Vec<usize>>, Vec<usize>) {
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

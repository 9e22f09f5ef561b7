//! The executor's loop: steps start when what they wait on is done, up to the parallelism,
//! and each is settled as it ends (done, stopped, failed); then what did not run is accounted
//! for, and the run is finalized or rolled back.

use super::*;
use crate::kind::Registered;
use crate::state::generations;
use journal_hook::JournalWrite;

type Running =
    crate::tasks::KeyedTasks<(usize, Instant), (usize, Step, Result<Applied, StepError>, Duration)>;

/// The executor's bookkeeping while the steps run: which wait on which, what each came to, and
/// the state and outcome they write.
pub(super) struct Run<'r, 'a> {
    req: &'r ApplyRequest<'a>,
    steps: &'r [Step],
    before: &'r State,
    pub(super) state: State,
    pub(super) outcome: ApplyOutcome,
    /// For each step, how many of its dependencies have not completed.
    waiting: Vec<usize>,
    dependents: Vec<Vec<usize>>,
    ready: std::collections::VecDeque<usize>,
    pub(super) completed: Vec<(usize, Step, Applied)>,
    settled: Vec<Settled>,
    /// A step failed or the run was interrupted: nothing new starts.
    stopping: bool,
}

impl<'r, 'a> Run<'r, 'a> {
    pub(super) fn new(
        req: &'r ApplyRequest<'a>,
        steps: &'r [Step],
        before: &'r State,
        state: State,
        outcome: ApplyOutcome,
    ) -> Self {
        let n = steps.len();
        let waiting: Vec<usize> = steps.iter().map(|s| s.deps.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, s) in steps.iter().enumerate() {
            for &d in &s.deps {
                dependents[d].push(i);
            }
        }
        let ready = (0..n).filter(|&i| waiting[i] == 0).collect();
        Run {
            req,
            steps,
            before,
            state,
            outcome,
            waiting,
            dependents,
            ready,
            completed: Vec::new(),
            settled: vec![Settled::NotRun; n],
            stopping: false,
        }
    }

    /// Start what is ready, up to the parallelism, and settle each step as it ends, until
    /// nothing runs.
    pub(super) async fn execute(&mut self, jobs: &Jobs<'_>) {
        let mut running: Running = crate::tasks::KeyedTasks::new();
        let cancel = self.req.cancel.clone();
        loop {
            // This loop cancels only once it is stopping: a cancel seen before is the caller's.
            if cancel.is_cancelled() && !self.stopping {
                self.stop_interrupted();
            }
            self.start_ready(jobs, &mut running);
            if running.is_empty() {
                break;
            }
            let joined = tokio::select! {
                j = running.next() => j,
                _ = cancel.cancelled(), if !self.stopping => continue,
            };
            let Some(((i, started), joined)) = joined else {
                break;
            };
            // A step whose task panicked failed like any other: on its address, then rollback.
            let (i, step, result, elapsed) = joined.unwrap_or_else(|panic| {
                (
                    i,
                    self.steps[i].clone(),
                    Err(StepError::new(panic)),
                    started.elapsed(),
                )
            });
            self.settle(i, step, result, elapsed);
        }
    }

    fn stop_interrupted(&mut self) {
        self.stopping = true;
        self.outcome.ok = false;
        self.outcome.interrupted = true;
        emit(
            &self.req.events,
            Event::Stopping {
                reason: "interrupted".into(),
            },
        );
    }

    fn start_ready(&mut self, jobs: &Jobs<'_>, running: &mut Running) {
        let parallelism = self.req.parallelism.max(1);
        if self.stopping {
            // What has not started never will: the members waiting at a gate for it give up.
            jobs.gates.abandon_all(
                "not started: the run stopped before its whole process group could start",
            );
        }
        while !self.stopping {
            // A member of a process group starts whatever the parallelism: its peers wait at the
            // gate for it, and holding them there would wait forever.
            let next = if running.len() < parallelism {
                0
            } else {
                match self
                    .ready
                    .iter()
                    .position(|&i| jobs.gates.of(&self.steps[i].address).is_some())
                {
                    Some(p) => p,
                    None => break,
                }
            };
            let Some(i) = self.ready.remove(next) else {
                break;
            };
            let step = self.steps[i].clone();
            let (action, address) = (step.change.action, step.address.as_str());
            if !journal_hook::skip_journal_record(JournalWrite::Ahead, action, address)
                && journal_ahead(&mut self.state, &step, &now())
            {
                if let Err(e) = self.req.store.write(&mut self.state) {
                    self.stop_unrecorded(
                        &step,
                        "cannot record in the state that the step starts",
                        e,
                    );
                    break;
                }
                journal_hook::after_journal_write(JournalWrite::Ahead, action, address);
            }
            emit(
                &self.req.events,
                Event::StepStarted {
                    address: step.address.clone(),
                    action: action_word(&step),
                },
            );
            let mut job = jobs.job(&step);
            job.idx = i;
            job.upstream = self.upstream_of(&step);
            running.spawn((i, Instant::now()), job.run());
        }
    }

    /// What a check (a resource whose kind runs rather than holds something) depends on, as
    /// this apply recorded it so far: its job watches them while it retries. Empty for the
    /// other steps.
    fn upstream_of(&self, step: &Step) -> Vec<(String, ResourceState)> {
        let StepKind::Resource(kind) = step.kind else {
            return Vec::new();
        };
        if kind.kind().description().lifecycle != crate::vocabulary::Lifecycle::Runs {
            return Vec::new();
        }
        self.req
            .graph
            .ancestors(&step.address)
            .into_iter()
            .filter_map(|a| Some((a.clone(), self.state.resources.get(&a)?.clone())))
            .collect()
    }

    /// What a step that ended came to: done, stopped (cancelled from outside) or failed.
    fn settle(
        &mut self,
        i: usize,
        step: Step,
        result: Result<Applied, StepError>,
        elapsed: Duration,
    ) {
        if result.is_err() && forget_intent(&mut self.state, self.before, &step) {
            if let Err(e) = self.req.store.write(&mut self.state) {
                self.outcome.state_error = Some(e.to_string());
            } else {
                journal_hook::after_journal_write(
                    JournalWrite::Forget,
                    step.change.action,
                    &step.address,
                );
            }
        }
        let cancelled =
            self.outcome.interrupted || (self.req.cancel.is_cancelled() && !self.stopping);
        self.settled[i] = match &result {
            Ok(_) => Settled::Done,
            Err(_) if cancelled => Settled::Stopped,
            Err(_) => Settled::Failed,
        };
        match result {
            Ok(applied) => self.done(i, step, applied, elapsed),
            Err(e) if cancelled => self.stopped(step, e, elapsed),
            Err(e) => self.failed(step, e, elapsed),
        }
    }

    /// Journal the step, and release what waited on it.
    fn done(&mut self, i: usize, step: Step, applied: Applied, elapsed: Duration) {
        emit(
            &self.req.events,
            Event::StepDone {
                address: step.address.clone(),
                action: action_word(&step),
                elapsed,
                summary: applied.summary.clone(),
            },
        );
        if !journal_hook::skip_journal_record(JournalWrite::Done, step.change.action, &step.address)
        {
            journal(&mut self.state, &step, &applied, elapsed);
        }
        if matches!(step.kind, StepKind::Resource(_)) {
            if let Err(e) = self.req.store.write(&mut self.state) {
                self.stop_unrecorded(&step, "cannot record the step in the state", e);
            } else {
                journal_hook::after_journal_write(
                    JournalWrite::Done,
                    step.change.action,
                    &step.address,
                );
            }
        }
        self.completed.push((i, step, applied));
        for &d in &self.dependents[i] {
            self.waiting[d] -= 1;
            if self.waiting[d] == 0 {
                self.ready.push_back(d);
            }
        }
    }

    /// The journal could not be written: the step fails with why, and the run stops.
    fn stop_unrecorded(&mut self, step: &Step, what: &str, e: impl std::fmt::Display) {
        self.outcome.state_error = Some(e.to_string());
        self.stopping = true;
        self.outcome.ok = false;
        self.outcome
            .failures
            .push((step.address.clone(), StepError::new(format!("{what}: {e}"))));
    }

    /// Cancelled from outside: the step was stopped, whatever it says went wrong (a probe
    /// reports its last attempt).
    fn stopped(&mut self, step: Step, e: StepError, elapsed: Duration) {
        if !self.stopping {
            self.stop_interrupted();
        }
        emit(
            &self.req.events,
            Event::StepStopped {
                address: step.address.clone(),
                elapsed,
                at: e.message.clone(),
            },
        );
        self.outcome.stopped.push(step.address.clone());
    }

    /// The first failure stops the run: nothing new starts and running steps are cancelled.
    fn failed(&mut self, step: Step, e: StepError, elapsed: Duration) {
        emit(
            &self.req.events,
            Event::StepFailed {
                address: step.address.clone(),
                elapsed,
                error: e.render(),
            },
        );
        // A run that failed on its own (not stopped by another's failure): the next
        // plan says its last result failed. One stopped keeps its started mark.
        if !self.stopping
            && step.change.action == Action::Run
            && step.change.orphan.is_none()
            && matches!(step.kind, StepKind::Resource(_))
            && crate::plan::record_run_failed(&mut self.state, &step.address, &now(), &e.message)
        {
            if let Err(w) = self.req.store.write(&mut self.state) {
                self.outcome.state_error = Some(w.to_string());
            } else {
                journal_hook::after_journal_write(
                    JournalWrite::Failed,
                    step.change.action,
                    &step.address,
                );
            }
        }
        self.outcome.failures.push((step.address.clone(), e));
        self.outcome.ok = false;
        if !self.stopping {
            self.stopping = true;
            emit(
                &self.req.events,
                Event::Stopping {
                    reason: format!("{} failed", step.address),
                },
            );
            // Running steps stop waiting (ready checks, probes) and clean up after themselves.
            self.req.cancel.cancel();
        }
    }

    /// Every planned step is accounted for: what did not run says why, and a run that left
    /// any step out is not a success, whatever else happened.
    pub(super) fn account_for_what_did_not_run(&mut self) {
        let steps = self.steps;
        for (i, step) in steps.iter().enumerate() {
            if self.settled[i] != Settled::NotRun {
                continue;
            }
            let reason = not_run_reason(step, steps, &self.settled, &self.outcome);
            emit(
                &self.req.events,
                Event::StepNotRun {
                    address: step.address.clone(),
                    reason: reason.clone(),
                },
            );
            self.outcome.not_run.push((step.address.clone(), reason));
        }
        let outcome = &mut self.outcome;
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
    }

    /// The run's summary counts what ran, not what was planned.
    pub(super) fn count_what_ran(&mut self) {
        for (_, step, _) in &self.completed {
            if matches!(step.kind, StepKind::Resource(_)) {
                let r = &mut self.outcome.ran;
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
    }

    /// Success: drop what was kept for rollback, record the outputs.
    pub(super) async fn finalize(&mut self, jobs: &Jobs<'_>) {
        for (_, step, applied) in &self.completed {
            if let StepKind::Resource(kind) = step.kind {
                let job = jobs.job(step);
                if let Err(e) = machine(kind)
                    .finalize(&job.cx(), step.change.action, applied)
                    .await
                {
                    self.outcome
                        .warnings
                        .push(format!("{}: {}", step.address, e.message));
                }
            }
        }
        crate::plan::record_outputs(self.req.plan, &mut self.state);
        self.record_generation();
        if let Err(e) = self.req.store.write(&mut self.state) {
            self.outcome.state_error = Some(e.to_string());
        } else {
            journal_hook::after_journal_write(JournalWrite::Finalize, Action::NoOp, "");
        }
    }

    /// Every step done and every probe passed: what runs now is a known-good generation, when
    /// the apply changed or ran anything.
    fn record_generation(&mut self) {
        let applied: Vec<String> = self
            .completed
            .iter()
            .filter(|(_, step, _)| {
                matches!(step.kind, StepKind::Resource(_)) && step.change.action != Action::NoOp
            })
            .map(|(_, step, _)| step.address.clone())
            .collect();
        if applied.is_empty() {
            return;
        }
        generations::record(
            &mut self.state,
            generations::Succeeded {
                at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                by: generations::who(),
                definitions: generations::definitions_digest(&self.req.config.dir),
                applied,
                shapes: self
                    .req
                    .config
                    .resources
                    .iter()
                    .map(|r| {
                        let shape = generations::Shape {
                            sensitive: r.sensitive.clone(),
                            ephemeral: r.ephemeral.clone(),
                            replace_triggered_by: r.replace_triggered_by.iter().cloned().collect(),
                            group: r.group.clone(),
                        };
                        (r.address.clone(), shape)
                    })
                    .collect(),
            },
        );
    }

    pub(super) async fn roll_back(&mut self, jobs: &Jobs<'_>) {
        self.outcome.rolled_back = true;
        let (kept, to_undo) = self.kept_by_passed_checks();
        if !kept.is_empty() {
            self.outcome.notes.push(format!(
                "kept as they are, having passed their checks before the failure: {}",
                kept.join(", ")
            ));
        }
        rollback(
            self.req,
            jobs,
            self.steps,
            &self.dependents,
            &to_undo,
            self.before,
            &mut self.state,
            &mut self.outcome,
        )
        .await;
        // A complete rollback puts the machines back as they were before this apply (but for
        // what a passed check kept), which
        // is what the runs' earlier results describe: the failure of what it undid is not
        // theirs. After an incomplete one the failure stays for the next plan to show.
        let outcome = &self.outcome;
        if outcome.undo_failures.is_empty() && outcome.undone == outcome.to_undo {
            let mut reverted = Vec::new();
            for (address, _) in &outcome.failures {
                if let Some(r) = self.before.resources.get(address) {
                    if self.state.resources.get(address) != Some(r) {
                        self.state.resources.insert(address.clone(), r.clone());
                        reverted.push(address.clone());
                    }
                }
            }
            if !reverted.is_empty() {
                if let Err(e) = self.req.store.write(&mut self.state) {
                    self.outcome.state_error = Some(e.to_string());
                } else {
                    let step = |a: &String| self.steps.iter().find(|s| &s.address == a);
                    for a in &reverted {
                        let action = step(a).map_or(Action::NoOp, |s| s.change.action);
                        journal_hook::after_journal_write(JournalWrite::Revert, action, a);
                    }
                }
            }
        }
    }

    /// The completed steps a passed check keeps ([`Step::keeps`]: a replica back behind its
    /// router stays on its new version when a later one fails), and the rest, which a rollback
    /// undoes.
    fn kept_by_passed_checks(&self) -> (Vec<String>, Vec<(usize, Step, Applied)>) {
        let keeps: BTreeSet<&str> = self
            .completed
            .iter()
            .flat_map(|(_, s, _)| s.keeps.iter().map(String::as_str))
            .collect();
        let mut kept = Vec::new();
        let mut to_undo = Vec::new();
        for c in &self.completed {
            if keeps.contains(c.1.address.as_str()) {
                kept.push(c.1.address.clone());
            } else {
                to_undo.push(c.clone());
            }
        }
        (kept, to_undo)
    }
}

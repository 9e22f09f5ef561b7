//! What the operations and the executor report while they work. The UI draws these; the
//! work never prints.

use std::time::Duration;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A lock left by a process that no longer runs was taken over.
    LockTakenOver {
        pid: u32,
        host: String,
        operation: String,
        started: String,
    },
    /// The state is locked by a run beside this one (an apply changes what a plan looks at), or
    /// a killed run left its lock (and work): what the lock says.
    StateLockHeld {
        note: String,
    },
    /// Refresh looks at this many nodes.
    Refreshing {
        nodes: usize,
    },
    /// The apply starts: how many steps, how many at once.
    Started {
        steps: usize,
        parallelism: usize,
    },
    StepStarted {
        address: String,
        action: String,
    },
    /// A running step says what it is doing (waiting for a ready check, pulling, …).
    StepProgress {
        address: String,
        message: String,
        /// The container's latest log line, while waiting on it.
        #[serde(skip_serializing_if = "Option::is_none")]
        log: Option<String>,
        /// The deadline of what it waits for, in seconds from the start of the wait.
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
    },
    /// A container waiting to be ready entered a phase of its start (a `progress` pattern
    /// matched its log), or its percentage moved.
    Phase {
        address: String,
        phase: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        percent: Option<f64>,
        /// The log line that showed it.
        line: String,
    },
    /// A log line that a `warn_on_log` pattern names: worth knowing, not a failure.
    StepWarning {
        address: String,
        message: String,
        help: String,
    },
    StepDone {
        address: String,
        action: String,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        summary: String,
    },
    StepFailed {
        address: String,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        error: String,
    },
    /// A step stopped by an interruption before it finished: not its failure.
    StepStopped {
        address: String,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        /// Where it was when it was stopped (its last progress or error).
        at: String,
    },
    /// A planned step that did not run, and why (skipped after a failure, blocked by a step
    /// that did not finish): an apply accounts for every step it planned.
    StepNotRun {
        address: String,
        reason: String,
    },
    /// Ctrl-C or a failure: nothing new starts.
    Stopping {
        reason: String,
    },
    RollbackStarted {
        steps: usize,
    },
    UndoDone {
        address: String,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        summary: String,
    },
    UndoFailed {
        address: String,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        error: String,
    },
    Finished {
        ok: bool,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        summary: String,
    },
    /// `sparkform watch` checked the deployment: what it saw (the failures' causes when not ok).
    WatchCheck {
        tick: u64,
        ok: bool,
        #[serde(serialize_with = "secs")]
        elapsed: Duration,
        summary: String,
    },
    /// `sparkform watch` restarts an engine: why, and what it replaces.
    WatchRestart {
        attempt: usize,
        cause: String,
        resources: Vec<String>,
    },
    /// The restart's apply ended.
    WatchRestarted {
        ok: bool,
        summary: String,
    },
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// A phase as a progress line shows it: `loading weights 45%`.
pub fn phase_text(label: &str, percent: Option<f64>) -> String {
    match percent {
        Some(p) => format!("{label} {p:.0}%"),
        None => label.to_string(),
    }
}

pub type Sender = tokio::sync::mpsc::UnboundedSender<Event>;

/// Send an event; a closed channel (the UI is gone) is not the work's problem.
pub fn emit(tx: &Sender, e: Event) {
    let _ = tx.send(e);
}

/// The one scrubber of sensitive values (`secrets`): the executor scrubs what each step returns
/// before it reaches an event, the journal or an error, and the UI scrubs every event it draws,
/// so a probe's URL, headers or expected answer that carry a token never reach the terminal,
/// `--json` or the state file.
pub use crate::secrets::{Secrets, HIDDEN};

impl Event {
    /// The event with every text it carries scrubbed of `secrets`.
    pub fn scrubbed(self, secrets: &Secrets) -> Event {
        if secrets.is_empty() {
            return self;
        }
        let s = |t: String| secrets.scrub(&t).into_owned();
        match self {
            Event::LockTakenOver {
                pid,
                host,
                operation,
                started,
            } => Event::LockTakenOver {
                pid,
                host,
                operation: s(operation),
                started,
            },
            Event::StepStarted { address, action } => Event::StepStarted {
                address: s(address),
                action,
            },
            Event::StepProgress {
                address,
                message,
                log,
                timeout_secs,
            } => Event::StepProgress {
                address: s(address),
                message: s(message),
                log: log.map(s),
                timeout_secs,
            },
            Event::Phase {
                address,
                phase,
                percent,
                line,
            } => Event::Phase {
                address: s(address),
                phase: s(phase),
                percent,
                line: s(line),
            },
            Event::StepWarning {
                address,
                message,
                help,
            } => Event::StepWarning {
                address: s(address),
                message: s(message),
                help: s(help),
            },
            Event::StepDone {
                address,
                action,
                elapsed,
                summary,
            } => Event::StepDone {
                address: s(address),
                action,
                elapsed,
                summary: s(summary),
            },
            Event::StepFailed {
                address,
                elapsed,
                error,
            } => Event::StepFailed {
                address: s(address),
                elapsed,
                error: s(error),
            },
            Event::StepStopped {
                address,
                elapsed,
                at,
            } => Event::StepStopped {
                address: s(address),
                elapsed,
                at: s(at),
            },
            Event::StepNotRun { address, reason } => Event::StepNotRun {
                address: s(address),
                reason: s(reason),
            },
            Event::Stopping { reason } => Event::Stopping { reason: s(reason) },
            Event::UndoDone {
                address,
                elapsed,
                summary,
            } => Event::UndoDone {
                address: s(address),
                elapsed,
                summary: s(summary),
            },
            Event::UndoFailed {
                address,
                elapsed,
                error,
            } => Event::UndoFailed {
                address: s(address),
                elapsed,
                error: s(error),
            },
            Event::Finished {
                ok,
                elapsed,
                summary,
            } => Event::Finished {
                ok,
                elapsed,
                summary: s(summary),
            },
            Event::WatchCheck {
                tick,
                ok,
                elapsed,
                summary,
            } => Event::WatchCheck {
                tick,
                ok,
                elapsed,
                summary: s(summary),
            },
            Event::WatchRestart {
                attempt,
                cause,
                resources,
            } => Event::WatchRestart {
                attempt,
                cause: s(cause),
                resources,
            },
            Event::WatchRestarted { ok, summary } => Event::WatchRestarted {
                ok,
                summary: s(summary),
            },
            e @ (Event::Refreshing { .. }
            | Event::StateLockHeld { .. }
            | Event::Started { .. }
            | Event::RollbackStarted { .. }) => e,
        }
    }
}

//! One file per resource kind: what its desired configuration looks like, which values are
//! valid, and which attribute changes can be applied in place rather than by replacement.

pub mod attachment;
pub mod container;
pub mod probe;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::apply::events::{emit, Event, Sender};
use crate::config::ResourceKind;
use crate::hosts::{Host, HostError, HostPool};
use crate::plan::{Action, Change};
use crate::state::ResourceState;

/// A problem with one attribute's value, found while building the desired configuration.
#[derive(Debug, Clone)]
pub struct Problem {
    pub block: &'static str,
    pub attribute: &'static str,
    pub message: String,
    pub help: String,
}

impl Problem {
    pub fn new(
        attribute: &'static str,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> Self {
        Problem {
            block: "",
            attribute,
            message: message.into(),
            help: help.into(),
        }
    }
}

/// Top-level attributes whose change the resource can apply without being replaced.
pub fn in_place_attributes(kind: ResourceKind) -> &'static [&'static str] {
    match kind {
        ResourceKind::Attachment => attachment::IN_PLACE,
        ResourceKind::Container => container::IN_PLACE,
        ResourceKind::Probe => probe::IN_PLACE,
    }
}

/// What a step works with. The executor fills it; handlers never look elsewhere.
pub struct StepCx<'a> {
    pub address: &'a str,
    pub change: &'a Change,
    /// The node's host, when the resource lives on a node.
    pub host: Option<Arc<dyn Host>>,
    /// Every connected node, for probes that go through another node.
    pub pool: &'a HostPool,
    pub lineage: &'a str,
    /// The desired configuration with its real values (sensitive ones included).
    pub desired: Option<&'a serde_json::Value>,
    /// What the state recorded before this apply.
    pub recorded: Option<&'a ResourceState>,
    /// Folder of the definitions, for relative paths (image archives).
    pub config_dir: &'a std::path::Path,
    pub events: &'a Sender,
    pub cancel: &'a tokio_util::sync::CancellationToken,
    /// Containers of the configuration by address: (node, Docker name), for exec probes.
    pub containers: &'a probe::ContainerIndex,
}

impl StepCx<'_> {
    pub fn progress(
        &self,
        message: impl Into<String>,
        log: Option<String>,
        timeout_secs: Option<u64>,
    ) {
        emit(
            self.events,
            Event::StepProgress {
                address: self.address.to_string(),
                message: message.into(),
                log,
                timeout_secs,
            },
        );
    }

    pub fn host(&self) -> Result<Arc<dyn Host>, StepError> {
        self.host
            .clone()
            .ok_or_else(|| StepError::new(format!("{}: no node to run on", self.address)))
    }

    pub fn desired_str(&self, key: &str) -> Option<&str> {
        self.desired
            .and_then(|d| d.get(key))
            .and_then(|v| v.as_str())
    }
}

/// A step that failed: what happened, the evidence (log lines), and what to do.
#[derive(Debug, Clone)]
pub struct StepError {
    pub message: String,
    pub details: Vec<String>,
    pub help: Option<String>,
}

impl StepError {
    pub fn new(message: impl Into<String>) -> Self {
        StepError {
            message: message.into(),
            details: Vec::new(),
            help: None,
        }
    }
    pub fn help(mut self, h: impl Into<String>) -> Self {
        self.help = Some(h.into());
        self
    }
    pub fn details(mut self, d: Vec<String>) -> Self {
        self.details = d;
        self
    }
    /// The whole error as text: message, evidence, hint.
    pub fn render(&self) -> String {
        let mut s = self.message.clone();
        if !self.details.is_empty() {
            s.push('\n');
            for d in &self.details {
                s.push_str("    │ ");
                s.push_str(d);
                s.push('\n');
            }
        }
        if let Some(h) = &self.help {
            s.push_str(&format!("\n  help: {h}"));
        }
        s
    }
}

impl From<HostError> for StepError {
    fn from(e: HostError) -> Self {
        use miette::Diagnostic;
        StepError {
            message: e.to_string(),
            details: Vec::new(),
            help: e.help().map(|h| h.to_string()),
        }
    }
}

impl From<Arc<HostError>> for StepError {
    fn from(e: Arc<HostError>) -> Self {
        use miette::Diagnostic;
        StepError {
            message: e.to_string(),
            details: Vec::new(),
            help: e.help().map(|h| h.to_string()),
        }
    }
}

/// What a completed step leaves: facts to record in the state, and what its undo needs.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub attributes: BTreeMap<String, serde_json::Value>,
    pub undo: serde_json::Value,
    /// One line for the progress output (a probe's latency and answer, a container's id).
    pub summary: String,
}

/// Everything the executor does to a resource of one kind.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Make the machine match the change (create, update, replace, delete, run).
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError>;
    /// Reverse a completed `apply` (rollback).
    async fn undo(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<String, StepError>;
    /// After the whole apply succeeded: drop what was kept for rollback.
    async fn finalize(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<(), StepError>;
}

/// The waits between the attempts of a ready check or a probe: 100 ms, doubling, up to the
/// configured interval. Something ready soon after a start is seen soon; something slow is not
/// polled more often than the interval asks.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: std::time::Duration,
    max: std::time::Duration,
}

impl Backoff {
    pub fn new(interval: std::time::Duration) -> Backoff {
        Backoff {
            next: std::time::Duration::from_millis(100).min(interval),
            max: interval,
        }
    }

    /// The wait before the next attempt.
    pub fn next_wait(&mut self) -> std::time::Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// The wait `next_wait` will return, without advancing.
    pub fn peek(&self) -> std::time::Duration {
        self.next
    }
}

pub fn handler(kind: ResourceKind) -> &'static dyn Handler {
    match kind {
        ResourceKind::Attachment => &attachment::AttachmentHandler,
        ResourceKind::Container => &container::ContainerHandler,
        ResourceKind::Probe => &probe::ProbeHandler,
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn backoff_starts_fast_and_doubles_up_to_the_interval() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let waits: Vec<u128> = (0..6).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        let mut short = Backoff::new(Duration::from_millis(50));
        assert_eq!(short.next_wait(), Duration::from_millis(50));
        assert_eq!(short.next_wait(), Duration::from_millis(50));
    }
}

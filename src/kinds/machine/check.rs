//! What a kind checks of the changed resources together, once they ran or before they start
//! (a network's fabric check, the containers' node parity, a model's architecture check): the
//! check itself, and what the apply it is made for changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::StepError;
use crate::hosts::HostPool;
use crate::plan::{Action, Change};

/// A step the executor adds that is no resource and records nothing.
pub struct Check {
    /// How it reads in progress lines (`network.roce (fabric check)`).
    pub address: String,
    /// The changed resources it runs after.
    pub after: Vec<String>,
    /// The resources whose dependents wait for it.
    pub covers: Vec<String>,
    /// The changed resources that themselves wait for it (a preflight before they start).
    pub before: Vec<String>,
    /// The nodes it uses.
    pub nodes: Vec<String>,
    /// Changed resources whose completed steps a later failure leaves as they are once this
    /// check passed (a replica put back behind its router: the roll stops at the next one).
    pub keeps: Vec<String>,
    pub run: Arc<dyn CheckRun>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("address", &self.address)
            .field("after", &self.after)
            .finish()
    }
}

#[async_trait]
pub trait CheckRun: Send + Sync {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError>;
    /// Whether a rollback undoes it once it passed ([`CheckRun::undo`]).
    fn undoes(&self) -> bool {
        false
    }
    /// What a rollback does once everything after it is undone (a drained replica put back).
    async fn undo(&self, _pool: &HostPool) -> Result<String, StepError> {
        Ok(String::new())
    }
}

/// What the apply that checks are made for changes: the resources it creates, replaces or
/// updates (a delete is no change here), each with its change (what a rollback restores of
/// it: `Change::restores`).
pub struct Changed<'a> {
    changes: BTreeMap<&'a str, &'a Change>,
}

impl<'a> Changed<'a> {
    /// Of `changes`, those that are no delete.
    pub fn new(changes: impl IntoIterator<Item = &'a Change>) -> Self {
        Changed {
            changes: changes
                .into_iter()
                .filter(|c| c.action != Action::Delete)
                .map(|c| (c.address.as_str(), c))
                .collect(),
        }
    }

    /// Whether the apply creates, replaces or updates `address`.
    pub fn is(&self, address: &str) -> bool {
        self.changes.contains_key(address)
    }

    /// The change the apply makes to `address`, when it makes one.
    pub fn change(&self, address: &str) -> Option<&'a Change> {
        self.changes.get(address).copied()
    }
}

//! `sparkform.lock.hcl` as the operations see it: the lock the definitions resolve to (from
//! every resource's `Kind::lock_entry`), what changes against the file, and `sparkform lock`.

use std::path::PathBuf;

use crate::config::Config;
use crate::diag::{Diag, Diagnostics};
use crate::events::Sender;
use crate::hosts::HostOptions;
use crate::kinds::machine::ReadMode;
use crate::lockfile::Lock;
use crate::plan::PlanOptions;

use super::OpError;

/// The lock file's name, beside the definitions.
pub use crate::lockfile::FILE;

/// The lock the definitions `config` resolved to: every entry a kind keeps.
pub fn of(config: &Config) -> Lock {
    let mut lock = Lock::default();
    for r in &config.resources {
        if let Some((kind, label, entry)) = r.kind.kind().lock_entry(&r.config) {
            lock.entries.insert((kind, label), entry);
        }
    }
    lock
}

/// The lock file before and after a plan: what the plan shows and an apply writes.
#[derive(Debug, Clone)]
pub struct LockUpdate {
    pub dir: PathBuf,
    pub before: Option<Lock>,
    pub after: Lock,
}

impl LockUpdate {
    pub fn new(config: &Config, before: Option<&Lock>) -> LockUpdate {
        LockUpdate {
            dir: config.dir.clone(),
            before: before.cloned(),
            after: of(config),
        }
    }

    /// Whether the file would be written (or created).
    pub fn changed(&self) -> bool {
        match &self.before {
            Some(b) => *b != self.after,
            None => !self.after.entries.is_empty(),
        }
    }

    /// What changes, in the plan's words (`model.qwen: main at 5088b93… (was main at ad8e4dd…)`).
    pub fn changes(&self) -> Vec<String> {
        self.before.clone().unwrap_or_default().changes(&self.after)
    }

    /// `-lockfile=readonly`: a change to the lock is an error, before anything is applied.
    pub fn refuse_changes(&self) -> Result<(), OpError> {
        if !self.changed() {
            return Ok(());
        }
        Err(OpError::Config(Diagnostics(vec![Diag::error(
            "lock::readonly",
            format!(
                "-lockfile=readonly: this apply would change {}: {}",
                crate::lockfile::FILE,
                self.changes().join("; ")
            ),
        )
        .help(
            "run `sparkform lock` (or apply without -lockfile=readonly) and commit the lock file",
        )])))
    }

    /// Write the file when it changes.
    pub fn write(&self) -> Result<bool, OpError> {
        if !self.changed() {
            return Ok(false);
        }
        self.after.write(&self.dir).map_err(|e| {
            OpError::Local(format!(
                "cannot write {}: {e}",
                Lock::path(&self.dir).display()
            ))
        })?;
        Ok(true)
    }
}

/// `sparkform lock DIR`: resolve every value a kind locks again (as `-upgrade` does), on the
/// nodes, and write the lock file; the state is neither read nor changed.
pub async fn lock(
    evaluated: super::definitions::Evaluated,
    hosts: &HostOptions,
    events: &Sender,
) -> Result<LockUpdate, OpError> {
    let evaluated = evaluated.upgrading(true);
    let before = evaluated.lock().cloned();
    let mut prepared = super::prepare::prepare(
        super::prepare::PrepareRequest {
            evaluated,
            recorded: None,
            refresh: ReadMode::Normal,
            options: PlanOptions::default(),
            hosts: hosts.clone(),
        },
        events,
    )
    .await?;
    prepared.close().await;
    let update = LockUpdate {
        dir: prepared.config.dir.clone(),
        before,
        after: of(&prepared.config),
    };
    update.write()?;
    Ok(update)
}

//! Where a state document is stored and locked: the [`Backend`] trait, with the local file
//! ([`LocalFile`]: atomic writes with `.backup`, the lock file) and PostgreSQL
//! (`super::pg::PgBackend`). `StateStore` holds one and does what is common to both (the
//! document's format, its encryption at rest), so every command works the same with either.

use std::fs;
use std::io;
use std::path::PathBuf;

use super::{io_err, lock, LockInfo, LockStatus, StateError, StateLock};

/// What the backend must hold for a write to go through (PostgreSQL's compare-and-swap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteCondition {
    /// No state yet: the first write of a new lineage.
    Absent,
    /// The document of this serial and lineage: what the writer read.
    Serial(u64, String),
    /// Whatever is there (`state push -force`).
    Any,
}

/// The row of a PostgreSQL state: `SCHEMA.states`, keyed by workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    pub schema: String,
    pub workspace: String,
}

pub(crate) trait Backend: Send + Sync + std::fmt::Debug {
    /// `local` or `pg`.
    fn name(&self) -> &'static str;
    /// Where the state is, in words, for messages.
    fn describe(&self) -> String;
    /// The same, as a path for the errors that carry one.
    fn place(&self) -> PathBuf {
        PathBuf::from(self.describe())
    }
    /// The stored bytes (maybe an encrypted envelope); `None` when there is no state.
    fn read(&self) -> Result<Option<Vec<u8>>, StateError>;
    /// Stores `doc`, the document of `serial` and `lineage`, if the backend holds what
    /// `expect` says (backends that do not compare, the local file, store it anyway: its lock
    /// is what excludes a second writer).
    fn write(
        &self,
        doc: &[u8],
        serial: u64,
        lineage: &str,
        expect: WriteCondition,
    ) -> Result<(), StateError>;
    /// Moves the state out of the way once it was migrated elsewhere (kept, never read).
    fn set_aside(&self) -> Result<(), StateError>;
    fn lock(&self, operation: &str) -> Result<StateLock, StateError>;
    fn force_unlock(&self, id: &str, force: bool) -> Result<LockInfo, StateError>;
    fn read_lock_info(&self) -> Result<Option<LockInfo>, StateError>;
    fn lock_status(&self) -> Result<LockStatus, StateError>;
    /// Whether the key of the hashes of sensitive values is kept with the state (shared by
    /// everyone who uses it), rather than in `sparkform.key` beside the local path.
    fn keeps_hash_key(&self) -> bool {
        false
    }
    /// The stored key of the hashes (sealed under the state key when one is set); `None` when
    /// none is stored yet.
    fn read_hash_key(&self) -> Result<Option<Vec<u8>>, StateError> {
        Ok(None)
    }
    /// Stores `stored` as the key of the hashes unless one is stored already, and returns the
    /// one stored: the first writer's.
    fn create_hash_key(&self, stored: &[u8]) -> Result<Vec<u8>, StateError> {
        Ok(stored.to_vec())
    }
    /// The workspaces that hold a state, by name, where the backend can list them (PostgreSQL's
    /// rows); `None` for the local file, whose workspaces are folders the caller lists.
    fn workspaces(&self) -> Result<Option<Vec<String>>, StateError> {
        Ok(None)
    }
}

/// The state file, `DIR/state/sparkform.json` by default, and its lock file beside it.
#[derive(Debug)]
pub(crate) struct LocalFile {
    path: PathBuf,
}

impl LocalFile {
    pub(crate) fn new(path: PathBuf) -> Self {
        LocalFile { path }
    }

    fn lock_path(&self) -> PathBuf {
        super::with_suffix(&self.path, ".lock")
    }
}

impl Backend for LocalFile {
    fn name(&self) -> &'static str {
        "local"
    }

    fn describe(&self) -> String {
        format!("the file {}", self.path.display())
    }

    fn place(&self) -> PathBuf {
        self.path.clone()
    }

    fn read(&self) -> Result<Option<Vec<u8>>, StateError> {
        match fs::read(&self.path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&self.path, e)),
        }
    }

    fn write(
        &self,
        doc: &[u8],
        _serial: u64,
        _lineage: &str,
        _expect: WriteCondition,
    ) -> Result<(), StateError> {
        super::write_file(&self.path, doc)
    }

    fn set_aside(&self) -> Result<(), StateError> {
        let aside = super::with_suffix(&self.path, ".migrated");
        fs::rename(&self.path, &aside).map_err(|e| io_err(&self.path, e))
    }

    fn lock(&self, operation: &str) -> Result<StateLock, StateError> {
        lock::lock_file(self.lock_path(), operation)
    }

    fn force_unlock(&self, id: &str, force: bool) -> Result<LockInfo, StateError> {
        lock::force_unlock_file(self.lock_path(), id, force)
    }

    fn read_lock_info(&self) -> Result<Option<LockInfo>, StateError> {
        lock::read_lock_info_file(&self.lock_path())
    }

    fn lock_status(&self) -> Result<LockStatus, StateError> {
        lock::lock_status_file(self.lock_path())
    }
}

/// A backend that cannot be used (its `state` block or the environment is wrong): every use
/// fails with why, so the commands that never touch the state still run.
#[derive(Debug)]
pub(crate) struct Unusable {
    pub message: String,
    pub help: String,
}

impl Unusable {
    fn error(&self) -> StateError {
        StateError::Backend {
            message: self.message.clone(),
            help: self.help.clone(),
        }
    }
}

impl Backend for Unusable {
    fn name(&self) -> &'static str {
        "unusable"
    }

    fn describe(&self) -> String {
        "a state backend that cannot be used".into()
    }

    fn read(&self) -> Result<Option<Vec<u8>>, StateError> {
        Err(self.error())
    }

    fn write(&self, _: &[u8], _: u64, _: &str, _: WriteCondition) -> Result<(), StateError> {
        Err(self.error())
    }

    fn set_aside(&self) -> Result<(), StateError> {
        Err(self.error())
    }

    fn lock(&self, _: &str) -> Result<StateLock, StateError> {
        Err(self.error())
    }

    fn force_unlock(&self, _: &str, _: bool) -> Result<LockInfo, StateError> {
        Err(self.error())
    }

    fn read_lock_info(&self) -> Result<Option<LockInfo>, StateError> {
        Err(self.error())
    }

    fn lock_status(&self) -> Result<LockStatus, StateError> {
        Err(self.error())
    }
}

//! Deployment state: one JSON document recording what sparkform created, with
//! atomic writes, a `.backup` of the previous version and an advisory lock
//! (see [`lock`]).

mod backend;
pub mod crypt;
pub mod generations;
mod hash_key;
mod lock;
mod pg;
mod relocate;
mod write;
pub(crate) use write::write_file;
mod upgrade;
#[cfg(test)]
pub(crate) use upgrade::tests::toy_state;

pub use backend::{PgTarget, WriteCondition};
pub use crypt::StateKey;
pub use hash_key::{
    hash_sensitive, is_sensitive_hash, sha256_hex, HashKey, KEYED_PREFIX, KEY_FILE, LEGACY_PREFIX,
    UNKEYED,
};
pub use lock::{holder_process, HolderProcess, LockInfo, LockStatus, StateLock};
pub use relocate::Relocated;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Version of the on-disk state document this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Version of sparkform recorded in the documents it writes.
pub(crate) const SPARKFORM_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The whole state of one deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub format_version: u32,
    /// Bumped on every write.
    pub serial: u64,
    /// UUID v4 fixed when the state is created.
    pub lineage: String,
    /// Version of the sparkform that wrote this document.
    #[serde(default)]
    pub sparkform_version: String,
    /// Keyed by full address, e.g. `module.qwen.container.ray_worker["spark2"]`.
    #[serde(default)]
    pub resources: BTreeMap<String, ResourceState>,
    #[serde(default)]
    pub outputs: BTreeMap<String, OutputState>,
    /// What `sparkform watch` restarted, the newest last (at most [`RESTARTS_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<Restart>,
    /// What a `removed` block or `state rm` forgot: its objects run on, carrying sparkform's
    /// labels for an address the state no longer records, and are not taken for what a lost
    /// record left behind (which a plan would destroy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgotten: Vec<Forgotten>,
    /// The known-good generations, the newest last (at most
    /// [`generations::GENERATIONS_KEPT`]): what each apply that passed left running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<generations::Generation>,
}

/// A resource the state stopped managing without destroying it: its address and node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forgotten {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl State {
    /// Record `from`'s resources (the address itself and everything under it) at `to`, and
    /// point what depends on them there too. The moves made, as (from, to) pairs; nothing when
    /// the state records nothing at `from`. The caller checked that nothing is recorded at the
    /// new addresses.
    pub fn move_records(&mut self, from: &str, to: &str) -> Vec<(String, String)> {
        let renamed = |a: &str| -> Option<String> {
            crate::vocabulary::address_within(a, from).then(|| format!("{to}{}", &a[from.len()..]))
        };
        let moves: Vec<(String, String)> = self
            .resources
            .keys()
            .filter_map(|a| Some((a.clone(), renamed(a)?)))
            .collect();
        for (old, new) in &moves {
            if let Some(r) = self.resources.remove(old) {
                self.resources.insert(new.clone(), r);
            }
        }
        for r in self.resources.values_mut() {
            for d in r.depends_on.iter_mut() {
                if let Some(new) = renamed(d) {
                    *d = new;
                }
            }
        }
        moves
    }

    /// Stop managing `address` without touching what runs: its record goes, and it is
    /// remembered as forgotten (see [`State::forgotten`]).
    pub fn forget(&mut self, address: &str) -> Option<ResourceState> {
        let r = self.resources.remove(address)?;
        let f = Forgotten {
            address: address.to_string(),
            node: r.node.clone(),
        };
        if !self.forgotten.contains(&f) {
            self.forgotten.push(f);
        }
        Some(r)
    }
}

/// How many of `sparkform watch`'s restarts the state keeps.
pub const RESTARTS_KEPT: usize = 20;

/// One restart of an engine by `sparkform watch`: when (RFC 3339), why, what was restarted,
/// and whether the restart's apply succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restart {
    pub at: String,
    pub cause: String,
    pub resources: Vec<String>,
    pub ok: bool,
}

/// What is recorded about one managed resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceState {
    /// Serialised as the kind's name (`"container"`); an unknown name fails the load.
    pub kind: crate::vocabulary::KindId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `"sha256:<hex>"` of the canonical desired config.
    pub config_hash: String,
    /// Desired config as recorded (sensitive leaves already replaced by
    /// hashes by the caller, see [`hash_sensitive`]).
    #[serde(default)]
    pub config: crate::kind::Configuration,
    /// Live facts: container id, addresses added, previous MTU... The kind's
    /// `RecordedFacts` (typed there), and beside them the journal's marks.
    #[serde(default)]
    pub attributes: crate::kind::Attributes,
    /// The version of the shape of `attributes` (the kind's `RecordedFacts::VERSION`); 0 for a
    /// record written before records had versions. Loading the state upgrades every record to
    /// the version this sparkform writes.
    #[serde(default)]
    pub schema_version: u32,
    /// Addresses this resource depends on, so orphans can be destroyed in
    /// reverse order.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Wall-clock seconds the last apply that ran this resource's step took, from the step's
    /// start until it completed (a container's ready check or a probe's pass included). Plans
    /// read it to tell how long the same step and the outage it causes will take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_apply_secs: Option<f64>,
}

/// A recorded output value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputState {
    pub value: serde_json::Value,
    #[serde(default)]
    pub sensitive: bool,
}

impl State {
    /// An empty state: serial 0, fresh lineage.
    pub fn new() -> Self {
        State {
            format_version: FORMAT_VERSION,
            serial: 0,
            lineage: uuid::Uuid::new_v4().to_string(),
            sparkform_version: SPARKFORM_VERSION.to_string(),
            resources: BTreeMap::new(),
            outputs: BTreeMap::new(),
            restarts: Vec::new(),
            forgotten: Vec::new(),
            generations: Vec::new(),
        }
    }
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

fn newer_writer_suffix(written_by: &Option<String>) -> String {
    match written_by {
        Some(v) => format!(" (version {v})"),
        None => String::new(),
    }
}

/// Errors from reading, writing and locking the state.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StateError {
    #[error("state file {} is not valid at line {line}, column {column}: {message}", path.display())]
    #[diagnostic(
        code(sparkform::state::corrupt),
        help(
            "the previous version is kept at {}.backup; inspect it or restore it with `cp`",
            path.display()
        )
    )]
    Corrupt {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    #[error(
        "state file {} has format version {found}, but this sparkform only understands up to {supported}",
        path.display()
    )]
    #[diagnostic(
        code(sparkform::state::newer_format),
        help(
            "this state was written by a newer sparkform{}; upgrade sparkform",
            newer_writer_suffix(written_by)
        )
    )]
    NewerFormat {
        path: PathBuf,
        found: u64,
        supported: u32,
        /// `sparkform_version` of the writer, when recorded.
        written_by: Option<String>,
    },

    #[error("state file {}: the record of {address} cannot be read: {why}", path.display())]
    #[diagnostic(
        code(sparkform::state::record),
        help(
            "a record's shape is upgraded when the state loads; one that is newer than this sparkform, or damaged, is not: upgrade sparkform, or restore {}.backup",
            path.display()
        )
    )]
    Record {
        path: PathBuf,
        address: String,
        why: String,
    },

    #[error("cannot access {}", path.display())]
    #[diagnostic(
        code(sparkform::state::io),
        help("check that the directory exists, is writable and the disk is not full")
    )]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "state is locked: `{}` started at {} by PID {} on host {} (lock ID {})",
        holder.operation, holder.started, holder.pid, holder.host, holder.id
    )]
    #[diagnostic(
        code(sparkform::state::locked),
        help(
            "wait for that operation to finish; if it is no longer running, run `sparkform force-unlock {}` to free {}",
            holder.id, path.display()
        )
    )]
    Locked {
        path: PathBuf,
        holder: Box<LockInfo>,
    },

    #[error("state lock {} is held by another process that has not recorded its details", path.display())]
    #[diagnostic(
        code(sparkform::state::lock_busy),
        help("another sparkform is just starting; retry in a moment")
    )]
    LockBusy { path: PathBuf },

    #[error("lock file {} is not valid: {message}", path.display())]
    #[diagnostic(
        code(sparkform::state::lock_corrupt),
        help("if no sparkform process is running, delete {} by hand", path.display())
    )]
    LockCorrupt { path: PathBuf, message: String },

    #[error("lock ID {expected} does not match the current lock {found}")]
    #[diagnostic(
        code(sparkform::state::lock_id_mismatch),
        help("the state is now locked by another operation; check `{}` and pass its ID", path.display())
    )]
    LockIdMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },

    #[error(
        "the lock {} is held by a running operation: `{}` started at {} by PID {} on host {} ({process})",
        holder.id, holder.operation, holder.started, holder.pid, holder.host
    )]
    #[diagnostic(
        code(sparkform::state::lock_live),
        help(
            "wait for it to finish, or stop it; removing a live lock lets a second writer in beside it. If you are sure, `sparkform force-unlock -force {}` removes it anyway",
            holder.id
        )
    )]
    LockLive {
        path: PathBuf,
        holder: Box<LockInfo>,
        process: String,
    },

    #[error("{message}")]
    #[diagnostic(code(sparkform::state::backend), help("{help}"))]
    Backend { message: String, help: String },

    #[error(
        "the state in {place} changed under this run: it is at serial {found_serial} (lineage {found_lineage}), and this run read serial {read_serial}; nothing was written"
    )]
    #[diagnostic(
        code(sparkform::state::stale),
        help("another sparkform wrote the state meanwhile (a run that did not hold the lock, or after a force-unlock): run `sparkform plan` again to see the state as it is now")
    )]
    Stale {
        place: String,
        read_serial: u64,
        found_serial: u64,
        found_lineage: String,
    },

    #[error(
        "the state in {place} has lineage {theirs}, not {ours}: it is another deployment's state"
    )]
    #[diagnostic(code(sparkform::state::lineage), help("{help}"))]
    OtherLineage {
        place: String,
        ours: String,
        theirs: String,
        help: String,
    },

    #[error("the document has serial {ours}, older than the serial {theirs} in {place}")]
    #[diagnostic(
        code(sparkform::state::older_serial),
        help("`sparkform state pull` prints the state as it is now; `-force` pushes the older document anyway")
    )]
    OlderSerial {
        place: String,
        ours: u64,
        theirs: u64,
    },

    #[error("the state in {place} is encrypted, and no key is set")]
    #[diagnostic(
        code(sparkform::state::no_key),
        help("set SPARKFORM_STATE_KEY (base64 of the 32-byte key) or SPARKFORM_STATE_KEY_FILE (a file holding it) to the key it was written with; nothing was read or written")
    )]
    EncryptedNoKey { place: String },

    #[error("the state in {place} does not open with the key set (SPARKFORM_STATE_KEY or SPARKFORM_STATE_KEY_FILE)")]
    #[diagnostic(
        code(sparkform::state::wrong_key),
        help("it was encrypted with another key, or altered; set the key it was written with. Nothing was written")
    )]
    WrongKey { place: String },

    #[error("the encrypted state in {place} is not as sparkform writes it: {why}")]
    #[diagnostic(
        code(sparkform::state::envelope),
        help("restore it from a backup (the local backend keeps the previous version as .backup, PostgreSQL in the row's `previous` column)")
    )]
    Envelope { place: String, why: String },

    #[error("the definitions keep the state in {place}, which has none, but the local file {} holds a state", file.display())]
    #[diagnostic(
        code(sparkform::state::still_local),
        help("run `sparkform state migrate --to pg` to move it there (it refuses a target that holds another deployment's state), or, if the state was moved back to the file, set `backend = \"local\"` in the `state` block")
    )]
    StillLocal { place: String, file: PathBuf },

    #[error("two keys for the hashes of sensitive values: {place} keeps one, and {} beside this checkout holds another", file.display())]
    #[diagnostic(
        code(sparkform::state::two_hash_keys),
        help("the state's hashes were recorded under the key kept with it, which everyone who uses this state shares; this checkout's file is from before (or from another state): move it away and plan again")
    )]
    TwoHashKeys { place: String, file: PathBuf },

    #[error("the key for the hashes of sensitive values kept in {place} is not a key: {why}")]
    #[diagnostic(
        code(sparkform::state::damaged_hash_key),
        help("it is shared by everyone who uses this state, so it is not replaced on its own: restore it, or delete it (every sensitive value then plans as changed once, and the next apply creates a new one)")
    )]
    DamagedHashKey { place: String, why: String },

    #[error("state is not locked ({} does not exist)", path.display())]
    #[diagnostic(code(sparkform::state::not_locked), help("nothing to unlock"))]
    NotLocked { path: PathBuf },
}

pub(crate) fn io_err(path: &Path, source: io::Error) -> StateError {
    StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Strips serde_json's trailing " at line L column C" (reported separately).
fn json_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    full.strip_suffix(&suffix).unwrap_or(&full).to_string()
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Directory containing `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Where the state lives: the local file (`path`), or another [`backend::Backend`]
/// (PostgreSQL), with the key of its encryption at rest when one is set. The key of the hashes
/// of sensitive values is kept by PostgreSQL with the state, and beside `path` for the local
/// file ([`StateStore::key_or_create`]).
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
    backend: Arc<dyn backend::Backend>,
    key: Option<StateKey>,
    /// `-lock-timeout`: how long [`StateStore::lock`] waits for a lock another process holds.
    lock_wait: Option<LockWait>,
}

/// How long to wait for the state lock while another process holds it, and whom to tell,
/// once, that the wait began (the command line prints who holds it and since when).
#[derive(Clone)]
pub struct LockWait {
    pub timeout: std::time::Duration,
    pub notify: LockWaitNotice,
}

/// Told who holds the lock and how long the wait may last, when a [`LockWait`] begins.
pub type LockWaitNotice = Arc<dyn Fn(&LockInfo, std::time::Duration) + Send + Sync>;

impl std::fmt::Debug for LockWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockWait")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// How often a waiting [`StateStore::lock`] tries again.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl PartialEq for StateStore {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.describe() == other.describe()
    }
}

impl StateStore {
    /// The local file `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        StateStore {
            backend: Arc::new(backend::LocalFile::new(path.clone())),
            path,
            key: None,
            lock_wait: None,
        }
    }

    /// The row `target` of PostgreSQL, reached with the libpq connection string `conn`
    /// (`host=/run/postgresql dbname=d user=u`, or a URL); never printed. `local_path` is where
    /// the local state would be: the key of the hashes lives beside it, and a state left there
    /// is refused rather than hidden.
    pub fn postgres(
        local_path: impl Into<PathBuf>,
        target: PgTarget,
        conn: &str,
    ) -> Result<Self, StateError> {
        let path = local_path.into();
        let pg = pg::PgBackend::new(target, conn, path.clone())?;
        Ok(StateStore {
            backend: Arc::new(pg),
            path,
            key: None,
            lock_wait: None,
        })
    }

    /// PostgreSQL, the connection from the environment (`SPARKFORM_PG_CONN`, else libpq's
    /// `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`).
    pub fn postgres_from_env(
        local_path: impl Into<PathBuf>,
        target: PgTarget,
    ) -> Result<Self, StateError> {
        let path = local_path.into();
        let pg = pg::PgBackend::from_env(target, path.clone())?;
        Ok(StateStore {
            backend: Arc::new(pg),
            path,
            key: None,
            lock_wait: None,
        })
    }

    /// A store whose every use fails with `why` (a `state` block or an environment that does
    /// not say where the state is): commands that never touch the state still run.
    pub fn unusable(local_path: impl Into<PathBuf>, why: StateError) -> Self {
        use miette::Diagnostic;
        let path = local_path.into();
        let help = why.help().map(|h| h.to_string()).unwrap_or_else(|| {
            "fix the `state` block or the environment it needs (docs/language.md#state)".into()
        });
        let message = match &why {
            StateError::Backend { message, .. } => message.clone(),
            other => other.to_string(),
        };
        StateStore {
            backend: Arc::new(backend::Unusable { message, help }),
            path,
            key: None,
            lock_wait: None,
        }
    }

    /// The same store, its documents encrypted with `key` (and read with it).
    pub fn with_key(mut self, key: Option<StateKey>) -> Self {
        self.key = key;
        self
    }

    /// Whether documents are encrypted when written.
    pub fn encrypts(&self) -> bool {
        self.key.is_some()
    }

    /// Where the state is, for messages: `the file X`, `PostgreSQL sparkform.states, workspace "w"`.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// `local` or `pg`.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The workspaces holding a state, where the backend lists them (PostgreSQL); `None`
    /// for the local file.
    pub fn workspaces(&self) -> Result<Option<Vec<String>>, StateError> {
        self.backend.workspaces()
    }

    /// The local path: the state file of the local backend; for the others, where the key of
    /// the hashes is kept (its folder).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the state lock for `operation` (e.g. `"apply"`). If another process holds it,
    /// fails with [`StateError::Locked`] naming the holder: at once, or after waiting up to the
    /// [`LockWait`] set with [`StateStore::with_lock_wait`], trying again twice a second.
    pub fn lock(&self, operation: &str) -> Result<StateLock, StateError> {
        let started = std::time::Instant::now();
        let mut told = false;
        loop {
            let taken = self.backend.lock(operation);
            let Some(wait) = &self.lock_wait else {
                return taken;
            };
            let left = wait.timeout.saturating_sub(started.elapsed());
            match &taken {
                Err(StateError::Locked { holder, .. }) if !left.is_zero() => {
                    if !told {
                        (wait.notify)(holder, wait.timeout);
                        told = true;
                    }
                }
                // another process is between taking the lock and writing who it is
                Err(StateError::LockBusy { .. }) if !left.is_zero() => {}
                _ => return taken,
            }
            std::thread::sleep(left.min(LOCK_RETRY));
        }
    }

    /// This store, its [`StateStore::lock`] waiting as `wait` says.
    pub fn with_lock_wait(mut self, wait: Option<LockWait>) -> Self {
        self.lock_wait = wait;
        self
    }

    /// Removes the lock whose ID is `id`; a live one only with `force`.
    pub fn force_unlock(&self, id: &str, force: bool) -> Result<LockInfo, StateError> {
        self.backend.force_unlock(id, force)
    }

    /// The current holder's record, `Ok(None)` if there is none.
    pub fn read_lock_info(&self) -> Result<Option<LockInfo>, StateError> {
        self.backend.read_lock_info()
    }

    /// Whether an operation holds the lock now, left a stale record, or neither.
    pub fn lock_status(&self) -> Result<LockStatus, StateError> {
        self.backend.lock_status()
    }

    /// `<path>.backup`: the previous version, kept by [`StateStore::write`].
    pub fn backup_path(&self) -> PathBuf {
        with_suffix(&self.path, ".backup")
    }

    /// `<path>.lock`: see [`StateStore::lock`].
    pub fn lock_path(&self) -> PathBuf {
        with_suffix(&self.path, ".lock")
    }

    /// Reads the state; `Ok(None)` if there is none yet.
    pub fn load(&self) -> Result<Option<State>, StateError> {
        let Some(plain) = self.read_document()? else {
            return Ok(None);
        };
        let place = self.backend.place();
        let text = String::from_utf8(plain).map_err(|e| StateError::Corrupt {
            path: place.clone(),
            line: 1,
            column: 1,
            message: format!("not UTF-8 text: {e}"),
        })?;
        parse_document(&place, &text).map(Some)
    }

    /// The stored document as plain text (opened with the key when it is encrypted); what
    /// `state pull` prints. `Ok(None)` if there is none yet.
    pub fn read_document(&self) -> Result<Option<Vec<u8>>, StateError> {
        let Some(stored) = self.backend.read()? else {
            return Ok(None);
        };
        crypt::open(stored, self.key.as_ref())
            .map(Some)
            .map_err(|p| self.crypt_error(p))
    }

    fn crypt_error(&self, problem: crypt::OpenFailure) -> StateError {
        let place = self.describe();
        match problem {
            crypt::OpenFailure::NoKey => StateError::EncryptedNoKey { place },
            crypt::OpenFailure::WrongKey => StateError::WrongKey { place },
            crypt::OpenFailure::Damaged(why) => StateError::Envelope { place, why },
        }
    }

    /// Writes `state` atomically, bumping its serial and recording this
    /// sparkform's version. The local file keeps the previous document at
    /// [`StateStore::backup_path`]; PostgreSQL keeps it in the row and writes only over the
    /// serial and lineage it read (a stale writer is refused with [`StateError::Stale`]). A
    /// crash at any point leaves either the old or the new complete document. On error `state`
    /// is left unchanged.
    pub fn write(&self, state: &mut State) -> Result<(), StateError> {
        let started = std::time::Instant::now();
        let result = self.write_document(state);
        tracing::debug!(
            target: "sparkform::state",
            at = %self.describe(),
            serial = state.serial,
            resources = state.resources.len(),
            ok = result.is_ok(),
            ms = started.elapsed().as_millis() as u64,
            "state written"
        );
        result
    }

    fn write_document(&self, state: &mut State) -> Result<(), StateError> {
        let saved = (
            state.format_version,
            state.serial,
            std::mem::take(&mut state.sparkform_version),
        );
        state.format_version = FORMAT_VERSION;
        state.serial = saved.1.saturating_add(1);
        state.sparkform_version = SPARKFORM_VERSION.to_string();
        let expect = if saved.1 == 0 {
            WriteCondition::Absent
        } else {
            WriteCondition::Serial(saved.1, state.lineage.clone())
        };
        let result = serde_json::to_vec_pretty(&*state)
            .map_err(|e| io_err(&self.path, io::Error::other(e)))
            .and_then(|mut doc| {
                doc.push(b'\n');
                self.store_document(&doc, state.serial, &state.lineage, expect)
            });
        if result.is_err() {
            (state.format_version, state.serial, state.sparkform_version) = saved;
        }
        result
    }

    /// Stores the plain document `doc` (of `serial` and `lineage`) as it is, encrypted when a
    /// key is set; `expect` is what the backend must hold now. An encrypted document this
    /// store cannot open is never written over.
    pub fn store_document(
        &self,
        doc: &[u8],
        serial: u64,
        lineage: &str,
        expect: WriteCondition,
    ) -> Result<(), StateError> {
        // A document sealed with another key (or sealed while no key is set now) stays as it
        // is, on every backend: the serial and lineage PostgreSQL compares are not secret.
        match self.backend.read() {
            Ok(Some(stored)) => {
                crypt::open(stored, self.key.as_ref()).map_err(|p| self.crypt_error(p))?;
            }
            Ok(None) | Err(StateError::StillLocal { .. }) => {}
            Err(e) => return Err(e),
        }
        let sealed;
        let bytes = match &self.key {
            Some(k) => {
                sealed = k.seal(doc).map_err(|why| StateError::Envelope {
                    place: self.describe(),
                    why,
                })?;
                &sealed[..]
            }
            None => doc,
        };
        self.backend.write(bytes, serial, lineage, expect)
    }
}

/// Parses a state document read from `place`: a newer format is reported as such, a damaged
/// one with its line and column.
pub fn parse_document(place: &Path, text: &str) -> Result<State, StateError> {
    let corrupt = |e: serde_json::Error| StateError::Corrupt {
        path: place.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: json_message(&e),
    };
    // Look at the version first so that a newer format with a different
    // shape is reported as such rather than as corruption.
    let value: serde_json::Value = serde_json::from_str(text).map_err(corrupt)?;
    if let Some(found) = value.get("format_version").and_then(|v| v.as_u64()) {
        if found > u64::from(FORMAT_VERSION) {
            let written_by = value
                .get("sparkform_version")
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_string);
            return Err(StateError::NewerFormat {
                path: place.to_path_buf(),
                found,
                supported: FORMAT_VERSION,
                written_by,
            });
        }
    }
    // Parse the text again (not the Value) so errors carry line/column.
    let mut state: State = serde_json::from_str(text).map_err(corrupt)?;
    state
        .upgrade_records()
        .map_err(|(address, why)| StateError::Record {
            path: place.to_path_buf(),
            address,
            why,
        })?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;

    fn sample_state() -> State {
        let mut s = State::new();
        s.resources.insert(
            "module.qwen.container.ray_worker[\"spark2\"]".to_string(),
            ResourceState {
                kind: crate::vocabulary::KindId::Container,
                node: Some("spark2".into()),
                config_hash: format!("sha256:{}", sha256_hex(b"cfg")),
                config: json!({"image": "vllm", "token": hash_sensitive(Some(&HashKey::from_bytes([1; 32])), &json!("secret"))}).into(),
                attributes: BTreeMap::from([("container_id".to_string(), json!("abc123"))]).into(),
                depends_on: vec!["attachment.fabric[\"spark2\"]".into()],
                last_apply_secs: Some(12.5),
                schema_version: 1,
            },
        );
        s.outputs.insert(
            "endpoint".into(),
            OutputState {
                value: json!("http://10.0.0.1:8000"),
                sensitive: false,
            },
        );
        s
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn sha256_known_vector_and_sensitive_hash_is_canonical() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":[true,null]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":[true,null],"b":1}"#).unwrap();
        let key = HashKey::from_bytes([7; 32]);
        assert_eq!(
            hash_sensitive(Some(&key), &a),
            hash_sensitive(Some(&key), &b)
        );
        // The HMAC-SHA256 of the canonical JSON under that key (checked with Python's hmac).
        let expected =
            "hmac-sha256:19970974617b810583f8dc593ebbd445e87138f49580a4a176f89b1687d6196f";
        assert_eq!(hash_sensitive(Some(&key), &a), json!(expected));
        // Another key gives another hash: the state alone cannot confirm a guess.
        let other = HashKey::from_bytes([8; 32]);
        assert_ne!(hash_sensitive(Some(&other), &a), json!(expected));
        assert_eq!(hash_sensitive(None, &a), json!(UNKEYED));
        assert!(is_sensitive_hash(expected) && is_sensitive_hash(UNKEYED));
    }

    #[test]
    fn the_key_is_created_once_private_and_ignored_by_git() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state/sparkform.json"));
        assert_eq!(store.read_key().unwrap(), None);
        let k = store.key_or_create().unwrap();
        assert_eq!(store.read_key().unwrap(), Some(k.clone()));
        assert_eq!(store.key_or_create().unwrap(), k);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(store.key_path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let ignore = fs::read_to_string(dir.path().join("state/.gitignore")).unwrap();
        assert_eq!(ignore.lines().filter(|l| *l == KEY_FILE).count(), 1);
        // Two deployments get two keys.
        let other = StateStore::new(dir.path().join("b/sparkform.json"));
        assert_ne!(other.key_or_create().unwrap(), k);
        // A damaged key reads as missing and is replaced.
        fs::write(store.key_path(), "not a key").unwrap();
        assert_eq!(store.read_key().unwrap(), None);
        assert_ne!(store.key_or_create().unwrap(), k);
    }

    #[test]
    fn new_state_is_empty() {
        let s = State::new();
        assert_eq!(s.serial, 0);
        assert_eq!(s.format_version, FORMAT_VERSION);
        assert!(uuid::Uuid::parse_str(&s.lineage).is_ok());
        assert_ne!(s.lineage, State::new().lineage);
        assert!(s.resources.is_empty() && s.outputs.is_empty());
    }

    #[test]
    fn load_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("sparkform.tfstate"));
        assert!(store.load().unwrap().is_none());
    }

    #[test]
    fn paths() {
        let store = StateStore::new("/x/s.json");
        assert_eq!(store.path(), Path::new("/x/s.json"));
        assert_eq!(store.backup_path(), PathBuf::from("/x/s.json.backup"));
        assert_eq!(store.lock_path(), PathBuf::from("/x/s.json.lock"));
    }

    #[test]
    fn write_load_roundtrip_and_serial_increments() {
        let dir = tempfile::tempdir().unwrap();
        // Parent directory is created on demand.
        let store = StateStore::new(dir.path().join("sub/state.json"));
        let mut s = sample_state();
        s.sparkform_version = String::new();
        store.write(&mut s).unwrap();
        assert_eq!(s.serial, 1);
        assert_eq!(s.sparkform_version, SPARKFORM_VERSION);
        assert_eq!(store.load().unwrap().as_ref(), Some(&s));

        store.write(&mut s).unwrap();
        assert_eq!(s.serial, 2);
        let loaded = store.load().unwrap().unwrap();
        assert_eq!(loaded, s);
        assert_eq!(loaded.lineage, s.lineage);
    }

    #[test]
    fn minimal_document_uses_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        fs::write(
            store.path(),
            r#"{"format_version":1,"serial":3,"lineage":"l","resources":{"a":{"kind":"probe","config_hash":"sha256:00"}}}"#,
        )
        .unwrap();
        let s = store.load().unwrap().unwrap();
        assert_eq!(s.serial, 3);
        let r = &s.resources["a"];
        assert_eq!(r.node, None);
        assert!(r.config.is_null() && r.attributes.is_empty() && r.depends_on.is_empty());
        assert!(s.outputs.is_empty());
    }

    #[test]
    fn a_state_written_before_the_kind_registry_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        let doc = r#"{"format_version":1,"serial":2,"lineage":"l","resources":{
            "network.roce.attach.spark1":{"kind":"attachment","node":"node.spark1","config_hash":"sha256:00","config":{"network":"network.roce","node":"node.spark1","interface":"eth1","address":"10.0.0.1","prefix_len":24,"mtu":9000}},
            "container.c":{"kind":"container","node":"node.spark1","config_hash":"sha256:01","attributes":{"container_id":"abc"}},
            "probe.p":{"kind":"probe","config_hash":"sha256:02"}}}"#;
        fs::write(store.path(), doc).unwrap();
        let s = store.load().unwrap().unwrap();
        let kinds: Vec<crate::vocabulary::KindId> = s.resources.values().map(|r| r.kind).collect();
        use crate::vocabulary::KindId::*;
        assert_eq!(kinds, [Container, Attachment, Probe]);
        // Written again, the kinds keep their names.
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains(r#""kind":"attachment""#), "{text}");
    }

    #[test]
    fn an_unknown_kind_in_the_state_is_an_error_naming_the_file_line_and_kind() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        fs::write(
            store.path(),
            "{\"format_version\":1,\"serial\":3,\"lineage\":\"l\",\"resources\":{\n\"a\":{\"kind\":\"volume\",\"config_hash\":\"sha256:00\"}}}",
        )
        .unwrap();
        let e = store.load().unwrap_err();
        let StateError::Corrupt {
            path,
            line,
            message,
            ..
        } = &e
        else {
            panic!("{e:?}");
        };
        assert_eq!(path, store.path());
        assert_eq!(*line, 2);
        assert!(
            message.contains("unknown resource kind `volume`"),
            "{message}"
        );
        assert!(e.to_string().contains("s.json"), "{e}");
    }

    #[test]
    fn backup_holds_previous_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        let mut s = sample_state();
        store.write(&mut s).unwrap();
        assert!(!store.backup_path().exists());
        let first = fs::read(store.path()).unwrap();

        s.outputs.clear();
        store.write(&mut s).unwrap();
        assert_eq!(fs::read(store.backup_path()).unwrap(), first);
        let backup = StateStore::new(store.backup_path())
            .load()
            .unwrap()
            .unwrap();
        assert_eq!(backup.serial, 1);
        assert_eq!(backup.outputs.len(), 1);

        store.write(&mut s).unwrap();
        let backup = StateStore::new(store.backup_path())
            .load()
            .unwrap()
            .unwrap();
        assert_eq!(backup.serial, 2);
        assert_eq!(store.load().unwrap().unwrap().serial, 3);
    }

    #[test]
    fn write_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        let mut s = sample_state();
        for _ in 0..3 {
            store.write(&mut s).unwrap();
        }
        assert_eq!(dir_entries(dir.path()), vec!["s.json", "s.json.backup"]);
    }

    #[test]
    fn failed_write_cleans_up_and_keeps_state_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        // The state path is a directory: the temp file gets written, but
        // backing up / renaming over it fails.
        let path = dir.path().join("s.json");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inner"), "x").unwrap();
        let store = StateStore::new(&path);
        let mut s = sample_state();
        let before = s.clone();
        let err = store.write(&mut s).unwrap_err();
        assert!(matches!(err, StateError::Io { .. }), "{err:?}");
        assert_eq!(s, before);
        assert_eq!(dir_entries(dir.path()), vec!["s.json"]);
    }

    #[test]
    fn corrupt_file_reports_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        fs::write(
            store.path(),
            "{\n  \"format_version\": 1,\n  \"serial\": ,\n}",
        )
        .unwrap();
        match store.load() {
            Err(StateError::Corrupt {
                line,
                column,
                message,
                path,
            }) => {
                assert_eq!(line, 3);
                assert_eq!(column, 13);
                assert!(!message.contains("at line"), "{message}");
                assert_eq!(path, store.path());
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }

        // Valid JSON with the wrong shape is corrupt too, with a position.
        fs::write(
            store.path(),
            "{\"format_version\": 1,\n\"serial\": \"x\", \"lineage\": \"l\"}",
        )
        .unwrap();
        let err = store.load().unwrap_err();
        assert!(
            matches!(err, StateError::Corrupt { line: 2, .. }),
            "{err:?}"
        );
        let help = miette::Diagnostic::help(&err).unwrap().to_string();
        assert!(help.contains("s.json.backup"), "{help}");
    }

    #[test]
    fn newer_format_is_reported_not_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"));
        fs::write(
            store.path(),
            r#"{"format_version": 7, "sparkform_version": "9.1.0", "things": [1]}"#,
        )
        .unwrap();
        let err = store.load().unwrap_err();
        match &err {
            StateError::NewerFormat {
                found,
                supported,
                written_by,
                ..
            } => {
                assert_eq!(*found, 7);
                assert_eq!(*supported, FORMAT_VERSION);
                assert_eq!(written_by.as_deref(), Some("9.1.0"));
            }
            other => panic!("expected NewerFormat, got {other:?}"),
        }
        let help = miette::Diagnostic::help(&err).unwrap().to_string();
        assert!(help.contains("version 9.1.0"), "{help}");
        assert!(help.contains("upgrade sparkform"), "{help}");

        fs::write(store.path(), r#"{"format_version": 2}"#).unwrap();
        let err = store.load().unwrap_err();
        let help = miette::Diagnostic::help(&err).unwrap().to_string();
        assert!(!help.contains("(version"), "{help}");
    }
}

//! Where a configuration's files and state live, and loading both. The only file I/O the
//! pure stages (config, graph, plan) depend on.

use std::path::{Path, PathBuf};

use crate::config::backend::{BackendKind, StateBlock};
use crate::config::{self, Config, VarInputs};
use crate::diag::Diagnostics;
use crate::graph::Graph;
use crate::state::{HashKey, LockWait, PgTarget, State, StateError, StateKey, StateStore};

pub const DEFAULT_STATE_FILE: &str = "state/sparkform.json";

#[derive(Debug, Clone)]
pub struct Workspace {
    pub dir: PathBuf,
    pub state_path: PathBuf,
    /// The definitions' `state` block (`None`: the local file), or why it cannot be used.
    pub backend: Result<Option<StateBlock>, String>,
    /// [`Workspace::store`], made once: every use in a run shares its backend (PostgreSQL's
    /// one connection for the lock, the reads and the writes).
    store: std::sync::Arc<std::sync::OnceLock<StateStore>>,
    /// `-lock-timeout`: how the store's lock waits for another process's.
    lock_wait: Option<LockWait>,
    /// `-workspace` (or `SPARKFORM_WORKSPACE`): the state's workspace, instead of the one
    /// the `state` block names.
    workspace: Option<String>,
    /// Whether `-state` named the file.
    state_given: bool,
}

/// Where the local backend keeps the state of workspace `name` of the definitions in `dir`:
/// `default`'s is `DIR/state/sparkform.json`, the others' `DIR/state/workspaces/NAME/sparkform.json`.
pub fn local_state_path(dir: &Path, name: &str) -> PathBuf {
    if name == config::backend::DEFAULT_WORKSPACE {
        dir.join(DEFAULT_STATE_FILE)
    } else {
        dir.join(LOCAL_WORKSPACES).join(name).join("sparkform.json")
    }
}

/// The folder of the local backend's workspaces other than `default`, in the definitions' folder.
pub const LOCAL_WORKSPACES: &str = "state/workspaces";

impl Workspace {
    /// `dir` holds the definitions; the state is where their `state` block says, by default
    /// the local file `dir/state/sparkform.json` (or `state`, with the local backend).
    pub fn new(dir: &Path, state: Option<&Path>) -> Self {
        let default = dir.join(DEFAULT_STATE_FILE);
        let backend = match config::backend::read(dir) {
            Ok(b) => Ok(b),
            Err(d) => Err(format!(
                "cannot tell where the state lives:\n{}",
                crate::diag::render_plain(&d.0)
            )),
        };
        let backend = match (backend, state) {
            (Ok(Some(b)), Some(p)) if b.backend == BackendKind::Pg && p != default => Err(format!(
                "-state {} names a local file, but the `state` block at {} keeps the state in PostgreSQL: drop -state, or move the state with `sparkform state migrate`",
                p.display(),
                b.at
            )),
            (b, _) => b,
        };
        Workspace {
            dir: dir.to_path_buf(),
            state_path: state.map(Path::to_path_buf).unwrap_or(default),
            backend,
            store: Default::default(),
            lock_wait: None,
            workspace: None,
            state_given: state.is_some(),
        }
    }

    /// This deployment's state in workspace `name` (`-workspace`), when given: PostgreSQL's
    /// row of that name, whatever the `state` block names; the local file
    /// [`local_state_path`]. A local workspace other than `default` and `-state` together
    /// are refused: each names the file.
    pub fn in_workspace(mut self, name: Option<&str>) -> Self {
        let Some(name) = name else {
            return self;
        };
        self.workspace = Some(name.to_string());
        self.store = Default::default();
        if self.backend_kind() == BackendKind::Local && name != config::backend::DEFAULT_WORKSPACE {
            if self.state_given && self.state_path != local_state_path(&self.dir, name) {
                self.backend = Err(format!(
                    "-state {} names the state file, and -workspace {name} names another (DIR/{LOCAL_WORKSPACES}/{name}/sparkform.json): give one of them",
                    self.state_path.display()
                ));
            } else {
                self.state_path = local_state_path(&self.dir, name);
            }
        }
        self
    }

    /// The state's workspace: `-workspace`'s, else the `state` block's (PostgreSQL), else
    /// `default`.
    pub fn workspace_name(&self) -> String {
        if let Some(name) = &self.workspace {
            return name.clone();
        }
        match &self.backend {
            Ok(Some(b)) if b.backend == BackendKind::Pg => b.workspace.clone(),
            _ => config::backend::DEFAULT_WORKSPACE.to_string(),
        }
    }

    /// This deployment, its state lock waiting as `wait` says (`-lock-timeout`) when another
    /// process holds it.
    pub fn with_lock_wait(mut self, wait: Option<LockWait>) -> Self {
        self.lock_wait = wait;
        self.store = Default::default();
        self
    }

    /// The backend the definitions choose: `local` (also without a `state` block) or `pg`.
    pub fn backend_kind(&self) -> BackendKind {
        match &self.backend {
            Ok(Some(b)) => b.backend,
            _ => BackendKind::Local,
        }
    }

    /// Whether the definitions folder can be this deployment's: it exists and is a folder.
    /// The error says what the path is instead and what to give.
    pub fn check_folder(&self) -> Result<(), String> {
        let dir = self.dir.display();
        match std::fs::metadata(&self.dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(format!(
                "{dir} is a file, not a folder: give the folder holding the deployment's .hcl files (its state is FOLDER/{DEFAULT_STATE_FILE})"
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "no folder {dir}: give the folder holding the deployment's .hcl files (its state is FOLDER/{DEFAULT_STATE_FILE}), or the state file with -state PATH"
            )),
            Err(e) => Err(format!("cannot read the folder {dir}: {e}")),
        }
    }

    /// What every command says when there is no state.
    pub fn nothing_applied(&self) -> String {
        match self.backend_kind() {
            BackendKind::Local => format!(
                "No state at {}: nothing has been applied",
                self.state_path.display()
            ),
            BackendKind::Pg => format!(
                "No state in {}: nothing has been applied",
                self.store().describe()
            ),
        }
    }

    /// Where the state is, as the `state` block says; encrypted with the key the environment
    /// gives (`SPARKFORM_STATE_KEY`, `SPARKFORM_STATE_KEY_FILE`). A store whose use fails
    /// with why when the block or the environment is wrong.
    pub fn store(&self) -> StateStore {
        self.store
            .get_or_init(|| self.store_on(self.backend_kind()))
            .clone()
    }

    /// The store of `kind`, whatever the block chooses (`state migrate`'s source and
    /// target): PostgreSQL takes the block's schema and workspace, or the defaults.
    pub fn store_on(&self, kind: BackendKind) -> StateStore {
        let block = match &self.backend {
            Ok(b) => b.as_ref(),
            Err(why) => {
                return StateStore::unusable(
                    self.state_path.clone(),
                    StateError::Backend {
                        message: why.clone(),
                        help: "fix the `state` block (docs/language.md#state)".into(),
                    },
                )
            }
        };
        let key = match StateKey::from_env() {
            Ok(k) => k,
            Err(why) => {
                return StateStore::unusable(
                    self.state_path.clone(),
                    StateError::Backend {
                        message: why,
                        help: "the state's encryption key comes from SPARKFORM_STATE_KEY (base64 of 32 bytes) or the file SPARKFORM_STATE_KEY_FILE names".into(),
                    },
                )
            }
        };
        let store = match kind {
            BackendKind::Local => Ok(StateStore::new(self.state_path.clone())),
            BackendKind::Pg => {
                let target = PgTarget {
                    schema: block
                        .map_or(config::backend::DEFAULT_SCHEMA.into(), |b| b.schema.clone()),
                    workspace: self.workspace.clone().unwrap_or_else(|| {
                        block.map_or(config::backend::DEFAULT_WORKSPACE.into(), |b| {
                            b.workspace.clone()
                        })
                    }),
                };
                StateStore::postgres_from_env(self.dir.join(DEFAULT_STATE_FILE), target)
            }
        };
        match store {
            Ok(s) => s.with_key(key).with_lock_wait(self.lock_wait.clone()),
            Err(e) => StateStore::unusable(self.state_path.clone(), e),
        }
    }

    /// The recorded state, or `None` when nothing was ever applied.
    pub fn state(&self) -> Result<Option<State>, StateError> {
        self.store().load()
    }

    /// The key of the hashes of sensitive values beside the state; created when `create`
    /// (a command that writes a state or a plan file), else `None` when there is none yet.
    pub fn key(&self, create: bool) -> Result<Option<HashKey>, StateError> {
        if create {
            self.store().key_or_create().map(Some)
        } else {
            self.store().read_key()
        }
    }

    /// Definitions evaluated and their graph built; every error found, at once.
    pub fn load(&self, vars: &VarInputs) -> Result<(Config, Graph), Diagnostics> {
        let config = config::load(&self.dir, vars)?;
        match Graph::build(&config) {
            Ok(g) => Ok((config, g)),
            Err(d) => Err(Diagnostics(vec![*d])),
        }
    }
}

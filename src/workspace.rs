//! Where a configuration's files and state live, and loading both. The only file I/O the
//! pure stages (config, graph, plan) depend on.

use std::path::{Path, PathBuf};

use crate::config::{self, Config, VarInputs};
use crate::diag::Diagnostics;
use crate::graph::Graph;
use crate::state::{HashKey, State, StateError, StateStore};

pub const DEFAULT_STATE_FILE: &str = "state/sparkform.json";

#[derive(Debug, Clone)]
pub struct Workspace {
    pub dir: PathBuf,
    pub state_path: PathBuf,
}

impl Workspace {
    /// `dir` holds the definitions; the state defaults to `dir/state/sparkform.json`.
    pub fn new(dir: &Path, state: Option<&Path>) -> Self {
        Workspace {
            dir: dir.to_path_buf(),
            state_path: state
                .map(Path::to_path_buf)
                .unwrap_or_else(|| dir.join(DEFAULT_STATE_FILE)),
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

    /// What every command says when the state file does not exist.
    pub fn nothing_applied(&self) -> String {
        format!(
            "No state at {}: nothing has been applied",
            self.state_path.display()
        )
    }

    pub fn store(&self) -> StateStore {
        StateStore::new(self.state_path.clone())
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

//! The operations behind the commands, as a library (as cargo's `ops::*`): typed inputs, typed
//! results, progress as events. A command in `cli` parses its arguments, asks, calls one of
//! these and renders what comes back; anything else can run an apply the same way.

pub mod apply;
pub mod connections;
pub mod console;
pub mod definitions;
pub mod fmt;
pub mod history;
pub mod import;
pub mod lock;
pub mod lock_file;
pub mod logs;
pub mod node_facts;
pub mod nodes;
pub mod plan;
pub mod prepare;
pub mod refresh;
pub mod rollback;
pub mod state;
pub mod status;
pub mod tunnel;
pub mod verify;
pub mod watch;
pub mod watch_metrics;
pub mod workspace;

use std::sync::Arc;

/// How and to what the commands connect: `cli` names these through `ops`, never `hosts`.
pub use crate::hosts::{HostError, HostOptions};
/// How a command reads the machines (`-refresh`): the commands pass it down explicitly.
pub use crate::kinds::machine::ReadMode;

use crate::diag::{Diag, Diagnostics};
use crate::plan::planfile::PlanFileError;
use crate::state::StateError;

/// Why an operation stopped before doing anything.
#[derive(Debug)]
pub enum OpError {
    /// The definitions or an option (`-target`, `-replace`) are wrong.
    Config(Diagnostics),
    /// The state cannot be read, or is locked.
    State(StateError),
    PlanFile(PlanFileError),
    /// Nodes that refresh could not look at.
    Refresh(Vec<Arc<HostError>>),
    /// A plan file's change no longer matches the definitions (the address).
    DefinitionsChanged(String),
    /// The async runtime or another part of this machine.
    Local(String),
}

impl From<Box<Diag>> for OpError {
    fn from(d: Box<Diag>) -> Self {
        OpError::Config(Diagnostics(vec![*d]))
    }
}

impl From<StateError> for OpError {
    fn from(e: StateError) -> Self {
        OpError::State(e)
    }
}

impl From<PlanFileError> for OpError {
    fn from(e: PlanFileError) -> Self {
        OpError::PlanFile(e)
    }
}

//! `sparkform state …` as operations: the recorded state read (its addresses, one resource, the
//! document), or moved as it is (push a document, migrate between backends). The cli renders
//! what these return.

use std::path::Path;

use crate::config::backend::BackendKind;
use crate::state::{Moved, ResourceState, State, StateError};
use crate::workspace::Workspace;

use super::OpError;

/// The recorded state; `None` when nothing was applied.
pub fn recorded(ws: &Workspace) -> Result<Option<State>, StateError> {
    ws.state()
}

/// One recorded resource, or what to say when there is none at `address`.
pub enum Lookup {
    Found(Box<ResourceState>),
    /// The state has no such address; a close one when there is.
    Missing {
        did_you_mean: Option<String>,
    },
}

/// The resource at `address` in `state`.
pub fn resource(state: &State, address: &str) -> Lookup {
    match state.resources.get(address) {
        Some(r) => Lookup::Found(Box::new(r.clone())),
        None => Lookup::Missing {
            did_you_mean: crate::diag::did_you_mean(
                address,
                state.resources.keys().map(String::as_str),
            ),
        },
    }
}

/// The state document as stored (decrypted); `None` when nothing was applied.
pub fn pull(ws: &Workspace) -> Result<Option<Vec<u8>>, StateError> {
    ws.store().read_document()
}

/// What a push or a migration wrote, and where.
pub struct Written {
    pub moved: Moved,
    /// The store written, as messages name it.
    pub to: String,
    /// The store read (a migration's source).
    pub from: Option<String>,
}

/// Replace the state with the document in `file` (`state push`).
pub fn push(ws: &Workspace, file: &Path, force: bool) -> Result<Written, OpError> {
    let doc = std::fs::read(file)
        .map_err(|e| OpError::Local(format!("cannot read {}: {e}", file.display())))?;
    let store = ws.store();
    let moved = store.push(&doc, file, force)?;
    Ok(Written {
        moved,
        to: store.describe(),
        from: None,
    })
}

/// Copy the state from the other backend to `to` (`state migrate`). Refused toward PostgreSQL
/// while the definitions' `state` block still keeps it in the local file.
pub fn migrate(ws: &Workspace, to: BackendKind) -> Result<Written, OpError> {
    if to == BackendKind::Pg && ws.backend_kind() != BackendKind::Pg {
        return Err(OpError::Local(
            "the definitions keep the state in the local file: set `backend = \"pg\"` in their `state` block first (docs/language.md#state), then migrate; until then the commands refuse to run beside a local state.".into(),
        ));
    }
    let from = match to {
        BackendKind::Pg => BackendKind::Local,
        BackendKind::Local => BackendKind::Pg,
    };
    let (source, dest) = (ws.store_on(from), ws.store_on(to));
    let moved = source.migrate_to(&dest)?;
    Ok(Written {
        moved,
        to: dest.describe(),
        from: Some(source.describe()),
    })
}

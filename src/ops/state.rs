//! `sparkform state …` as operations: the recorded state read (its addresses, one resource, the
//! document), or moved as it is (push a document, migrate between backends). The cli renders
//! what these return.

use std::path::Path;

use crate::config::backend::BackendKind;
use crate::state::{Relocated, ResourceState, State, StateError};
use crate::workspace::Workspace;

use super::OpError;

/// The recorded state; `None` when nothing was applied.
pub fn recorded(ws: &Workspace) -> Result<Option<State>, StateError> {
    ws.state()
}

/// `sparkform force-unlock`: remove the state lock `id`, left by a process that is gone (one
/// whose holder still holds it only with `force`); what it said of its holder.
pub fn force_unlock(
    ws: &Workspace,
    id: &str,
    force: bool,
) -> Result<crate::state::LockInfo, StateError> {
    ws.store().force_unlock(id, force)
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
    pub relocated: Relocated,
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
    let relocated = store.push(&doc, file, force)?;
    Ok(Written {
        relocated,
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
    let relocated = source.migrate_to(&dest)?;
    Ok(Written {
        relocated,
        to: dest.describe(),
        from: Some(source.describe()),
    })
}

/// Re-address what the state records at `from` (the address and everything under it: a
/// module, every instance of a resource) to `to`, holding the lock (`state mv`). Nothing on
/// the nodes changes. The moves made, as (from, to) pairs.
pub fn move_records(
    ws: &Workspace,
    from: &str,
    to: &str,
) -> Result<Vec<(String, String)>, OpError> {
    let store = ws.store();
    let _lock = store.lock("state mv")?;
    let mut state = store.load()?.ok_or_else(nothing_recorded)?;
    let within = |a: &str, p: &str| crate::vocabulary::address_within(a, p);
    if !state.resources.keys().any(|a| within(a, from)) {
        return Err(OpError::Local(missing(&state, from)));
    }
    if from == to {
        return Err(OpError::Local(format!(
            "{from} is already there: `state mv` needs two addresses"
        )));
    }
    if let Some(there) = state
        .resources
        .keys()
        .find(|a| within(a, to) && !within(a, from))
    {
        return Err(OpError::Local(format!(
            "the state already records {there}: two records cannot share an address (`sparkform state rm {there}` forgets that one, leaving it running)"
        )));
    }
    let moves = state.move_records(from, to);
    store.write(&mut state)?;
    Ok(moves)
}

/// Forget what the state records at each of `addresses` (and under it) without touching the
/// nodes, holding the lock (`state rm`). The addresses forgotten.
pub fn forget(ws: &Workspace, addresses: &[String]) -> Result<Vec<String>, OpError> {
    let store = ws.store();
    let _lock = store.lock("state rm")?;
    let mut state = store.load()?.ok_or_else(nothing_recorded)?;
    let mut gone = Vec::new();
    for address in addresses {
        let under: Vec<String> = state
            .resources
            .keys()
            .filter(|a| crate::vocabulary::address_within(a, address))
            .cloned()
            .collect();
        if under.is_empty() {
            return Err(OpError::Local(missing(&state, address)));
        }
        for a in under {
            state.forget(&a);
            gone.push(a);
        }
    }
    store.write(&mut state)?;
    Ok(gone)
}

fn nothing_recorded() -> OpError {
    OpError::Local("the state records nothing yet: nothing was applied here".into())
}

/// The error of an address the state does not record, with a close one when there is.
fn missing(state: &State, address: &str) -> String {
    let hint = crate::diag::did_you_mean(address, state.resources.keys().map(String::as_str))
        .map(|s| format!("; did you mean {s}?"))
        .unwrap_or_else(|| "; `sparkform state list` shows what it records".into());
    format!("the state records nothing at {address}{hint}")
}

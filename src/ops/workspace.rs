//! `sparkform workspace list`: the states kept for one set of definitions, by workspace.

use std::path::Path;

use crate::config::backend::DEFAULT_WORKSPACE;
use crate::state::StateError;
use crate::workspace::{local_state_path, Workspace, LOCAL_WORKSPACES};

/// One workspace: its name, whether it holds a state, whether this command uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceEntry {
    pub name: String,
    pub has_state: bool,
    pub current: bool,
}

/// The workspaces of `ws`'s backend, sorted, `default` always among them (as Terraform lists
/// it), and the one `ws` uses marked even when it holds no state yet.
pub fn list(ws: &Workspace) -> Result<Vec<WorkspaceEntry>, StateError> {
    let store = ws.store();
    let mut names: Vec<String> = match store.workspaces()? {
        Some(rows) => rows,
        None => local_workspaces(&ws.dir)?,
    };
    let with_state: Vec<String> = names.clone();
    let current = ws.workspace_name();
    for name in [DEFAULT_WORKSPACE.to_string(), current.clone()] {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names
        .into_iter()
        .map(|name| WorkspaceEntry {
            has_state: with_state.contains(&name),
            current: name == current,
            name,
        })
        .collect())
}

/// The local backend's workspaces that hold a state file: `default` (DIR/state/sparkform.json)
/// and each folder of DIR/state/workspaces with one.
fn local_workspaces(dir: &Path) -> Result<Vec<String>, StateError> {
    let mut out = Vec::new();
    if local_state_path(dir, DEFAULT_WORKSPACE).exists() {
        out.push(DEFAULT_WORKSPACE.to_string());
    }
    let folder = dir.join(LOCAL_WORKSPACES);
    let entries = match std::fs::read_dir(&folder) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(crate::state::io_err(&folder, e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::config::backend::is_workspace_name(&name) && local_state_path(dir, &name).exists()
        {
            out.push(name);
        }
    }
    Ok(out)
}

//! `sparkform history`: the known-good generations the state keeps, newest first, each with
//! what changed from the one before it.

use serde::Serialize;

use crate::state::generations::{differences, Difference, Generation};
use crate::state::{State, StateError};
use crate::workspace::Workspace;

/// One generation as `history` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryLine {
    pub number: u64,
    pub at: String,
    pub by: String,
    pub definitions: String,
    /// What the apply changed or ran.
    pub applied: Vec<String>,
    /// What differs from the generation before it (everything added, for the oldest kept).
    pub changes: Vec<Difference>,
    /// Whether this is the generation running now: the newest whose resources the state
    /// records at the same configuration (each by its hash). One at most: a restart records a
    /// generation identical to the one before it, and only the newer is current.
    pub current: bool,
    /// Whether the state records what this generation left running, resource by resource: the
    /// current one, and any older one identical to it (what a rollback skips, as no change).
    pub runs_now: bool,
}

/// The generations of the state, newest first; `None` when nothing was applied.
pub fn history(ws: &Workspace) -> Result<Option<Vec<HistoryLine>>, StateError> {
    Ok(ws.state()?.map(|state| entries(&state)))
}

/// The generations of `state`, newest first.
pub fn entries(state: &State) -> Vec<HistoryLine> {
    let empty = Default::default();
    let mut out: Vec<HistoryLine> = state
        .generations
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let before = i
                .checked_sub(1)
                .map_or(&empty, |p| &state.generations[p].resources);
            HistoryLine {
                number: g.number,
                at: g.at.clone(),
                by: g.by.clone(),
                definitions: g.definitions.clone(),
                applied: g.applied.clone(),
                changes: differences(before, &g.resources),
                current: false,
                runs_now: runs_now(state, g),
            }
        })
        .collect();
    out.reverse();
    if let Some(newest) = out.iter_mut().find(|e| e.runs_now) {
        newest.current = true;
    }
    out
}

/// Whether the state's resources are the generation's, each at the same configuration.
fn runs_now(state: &State, g: &Generation) -> bool {
    state.resources.len() == g.resources.len()
        && g.resources.iter().all(|(a, r)| {
            state
                .resources
                .get(a)
                .is_some_and(|now| now.config_hash == r.config_hash)
        })
}

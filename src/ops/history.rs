//! `sparkform history`: the known-good generations the state keeps, newest first, each with
//! what changed from the one before it.

use serde::Serialize;

use crate::state::generations::{differences, Difference, Generation};
use crate::state::{State, StateError};
use crate::workspace::Workspace;

/// One generation as `history` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub number: u64,
    pub at: String,
    pub by: String,
    pub definitions: String,
    /// What the apply changed or ran.
    pub applied: Vec<String>,
    /// What differs from the generation before it (everything added, for the oldest kept).
    pub changes: Vec<Difference>,
    /// Whether the state records what this generation left running, resource by resource
    /// (the configuration of each, by its hash).
    pub current: bool,
}

/// The generations of the state, newest first; `None` when nothing was applied.
pub fn history(ws: &Workspace) -> Result<Option<Vec<Entry>>, StateError> {
    Ok(ws.state()?.map(|state| entries(&state)))
}

/// The generations of `state`, newest first.
pub fn entries(state: &State) -> Vec<Entry> {
    let empty = Default::default();
    let mut out: Vec<Entry> = state
        .generations
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let before = i
                .checked_sub(1)
                .map_or(&empty, |p| &state.generations[p].resources);
            Entry {
                number: g.number,
                at: g.at.clone(),
                by: g.by.clone(),
                definitions: g.definitions.clone(),
                applied: g.applied.clone(),
                changes: differences(before, &g.resources),
                current: runs_now(state, g),
            }
        })
        .collect();
    out.reverse();
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

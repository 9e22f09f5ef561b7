//! What a plan says the changed resources keep on their nodes for a rollback.

use super::{note, Action, Change};
use crate::kind::Registered;
use crate::state::State;

/// What the changed resources keep on their nodes for a rollback once the apply succeeds (a
/// model's earlier revisions), with the disk it holds, and what it removes: a plan that moves
/// a revision says what stays behind.
pub(super) fn kept_for_rollback(ordered: &[Change], state: &State, notes: &mut Vec<String>) {
    let kept: Vec<String> = ordered
        .iter()
        .filter(|c| matches!(c.action, Action::Update | Action::Replace))
        .filter_map(|c| {
            let recorded = state.resources.get(&c.address)?;
            let what = c.kind.kind().kept_for_rollback(
                c.after.as_ref()?,
                &recorded.config,
                &recorded.attributes,
            )?;
            Some(format!("{}: {what}", c.address))
        })
        .collect();
    if !kept.is_empty() {
        note(
            notes,
            &format!(
                "Kept on the nodes for a rollback once this apply succeeds (keep_revisions; destroy removes them): {}",
                kept.join("; ")
            ),
        );
    }
}

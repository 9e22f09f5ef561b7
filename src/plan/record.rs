//! The journal's writers: a plan's changes recorded in the state (`record_change`, the one
//! writer of a resource's entry), imports, outputs, and the marks written around a step.

use super::*;
use crate::kind::Registered;

/// Record an import: the object as it runs, before any step changes it.
pub fn record_import(state: &mut State, i: &Import, depends_on: Vec<String>) {
    let change = Change {
        address: i.address.clone(),
        kind: i.kind,
        node: i.node.clone(),
        action: Action::Create,
        attributes: Vec::new(),
        replace_reasons: Vec::new(),
        run_reason: None,
        depends_on,
        after: Some(i.config.clone()),
        after_hash: Some(config_hash(&i.config)),
        drift: Vec::new(),
        orphan: None,
        purge: false,
        restores: None,
    };
    record_change(state, &change, i.attributes.clone(), None);
}

/// Record a plan's changes as done: what a fully successful apply leaves in the state.
/// `attributes` keep what the state had (the executor adds live facts such as container ids).
pub fn record(plan: &Plan, state: &mut State) {
    for c in &plan.changes {
        let attributes = state
            .resources
            .get(&c.address)
            .map(|r| r.attributes.clone())
            .unwrap_or_default();
        record_change(state, c, attributes, None);
    }
    record_outputs(plan, state);
}

/// The one writer of a resource's entry in the state: a change done, with the live facts its
/// step left (`attributes`). A delete removes the entry.
/// `last_apply_secs`: how long the step took; `None` keeps what the state had.
pub fn record_change(
    state: &mut State,
    c: &Change,
    attributes: crate::kind::Attributes,
    last_apply_secs: Option<f64>,
) {
    if c.action == Action::Delete {
        state.resources.remove(&c.address);
        return;
    }
    let (Some(after), Some(hash)) = (&c.after, &c.after_hash) else {
        return;
    };
    let last_apply_secs =
        last_apply_secs.or_else(|| state.resources.get(&c.address)?.last_apply_secs);
    state.resources.insert(
        c.address.clone(),
        ResourceState {
            kind: c.kind,
            node: c.node.clone(),
            config_hash: hash.clone(),
            config: after.clone(),
            attributes,
            depends_on: c.depends_on.clone(),
            last_apply_secs,
            schema_version: c.kind.kind().recorded_version(),
        },
    );
}

/// Journal marks in a recorded resource's attributes, written around a step so that a run
/// killed in the middle leaves a state that says what was under way.
///
pub use crate::vocabulary::{MARK_LAST_RUN, MARK_PENDING, MARK_RUN_FAILED, MARK_RUN_STARTED};

/// Before a create whose object nobody could find untracked: the entry, marked pending since `at`.
pub fn record_intent(state: &mut State, c: &Change, at: &str) {
    let mut marks = crate::kind::Attributes::default();
    marks.mark(MARK_PENDING, serde_json::json!(at));
    record_change(state, c, marks, None);
}

/// Before a run of a recorded resource: mark it started at `at` (a new one plans to run anyway).
pub fn mark_run_started(state: &mut State, address: &str, at: &str) -> bool {
    let Some(r) = state.resources.get_mut(address) else {
        return false;
    };
    r.attributes.mark(MARK_RUN_STARTED, serde_json::json!(at));
    true
}

/// A run of a recorded resource failed at `at` with `error`: what the next plan reports.
pub fn record_run_failed(state: &mut State, address: &str, at: &str, error: &str) -> bool {
    let Some(r) = state.resources.get_mut(address) else {
        return false;
    };
    r.attributes.unmark(MARK_RUN_STARTED);
    r.attributes.mark(
        MARK_RUN_FAILED,
        serde_json::json!({ "at": at, "error": error }),
    );
    true
}

pub(super) fn mark<'a>(
    state: &'a State,
    address: &str,
    key: &str,
) -> Option<&'a serde_json::Value> {
    state.resources.get(address)?.attributes.get(key)
}

/// Record a plan's output changes in the state.
pub fn record_outputs(plan: &Plan, state: &mut State) {
    for o in &plan.outputs {
        match (&o.action, &o.after) {
            (Action::Delete, _) => {
                state.outputs.remove(&o.name);
            }
            (_, Some(after)) => {
                state.outputs.insert(
                    o.name.clone(),
                    OutputState {
                        value: after.clone(),
                        sensitive: o.sensitive,
                    },
                );
            }
            _ => {}
        }
    }
}

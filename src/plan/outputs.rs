//! The outputs' changes: the configuration's outputs against the state's.

use super::*;

fn output_value_recorded(
    value: &serde_json::Value,
    sensitive: bool,
    key: Option<&HashKey>,
) -> serde_json::Value {
    if sensitive {
        hash_sensitive(key, value)
    } else {
        value.clone()
    }
}

pub(super) fn output_changes(
    config: &Config,
    state: &State,
    key: Option<&HashKey>,
    notes: &mut Vec<String>,
) -> Vec<OutputChange> {
    let mut out = Vec::new();
    for o in &config.outputs {
        let after = output_value_recorded(&o.value, o.sensitive, key);
        if o.sensitive && key.is_none() && state.outputs.contains_key(&o.name) {
            note(notes, NOTE_NO_KEY);
        }
        if let Some(b) = state.outputs.get(&o.name).filter(|_| o.sensitive) {
            if legacy_in(&b.value) {
                note(notes, NOTE_LEGACY);
            }
        }
        let before = state.outputs.get(&o.name);
        let action = match before {
            None => Action::Create,
            Some(b) if b.value != after || b.sensitive != o.sensitive => Action::Update,
            Some(_) => Action::NoOp,
        };
        out.push(OutputChange {
            name: o.name.clone(),
            action,
            before: before.map(|b| b.value.clone()),
            after: Some(after),
            sensitive: o.sensitive,
        });
    }
    for (name, b) in &state.outputs {
        if !config.outputs.iter().any(|o| &o.name == name) {
            out.push(OutputChange {
                name: name.clone(),
                action: Action::Delete,
                before: Some(b.value.clone()),
                after: None,
                sensitive: b.sensitive,
            });
        }
    }
    out
}

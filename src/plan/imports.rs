//! Imports in the plan: the objects to adopt as the state would record them (their sensitive
//! values hashed), in a copy of the state the rest of the plan diffs against.

use super::{hash_sensitive, pointer_mut, record_import, Import, PlanOptions};
use crate::config::{Config, Resource};
use crate::kind::Registered;
use crate::state::{HashKey, State};

/// An import with its sensitive values as the state records them.
fn recorded_import(i: &Import, r: &Resource, key: Option<&HashKey>) -> Import {
    let mut config = i.config.json().clone();
    for path in r.sensitive.iter().chain(&i.secret_paths) {
        if let Some(slot) = pointer_mut(&mut config, path) {
            *slot = hash_sensitive(key, slot);
        }
    }
    Import {
        config: r.kind.configuration(config),
        ..i.clone()
    }
}

/// The imports of resources the configuration has (recorded as they run, in a copy of the
/// state when there are any) and those it lacks (for which `-generate-config-out` writes a
/// block).
pub(super) fn as_recorded(
    config: &Config,
    state: &State,
    opts: &PlanOptions,
) -> (Vec<Import>, Vec<Import>, Option<State>) {
    let imports: Vec<Import> = opts
        .imports
        .iter()
        .filter(|i| !state.resources.contains_key(&i.address))
        .filter_map(|i| {
            Some(recorded_import(
                i,
                config.resource(&i.address)?,
                opts.key.as_ref(),
            ))
        })
        .collect();
    let generated: Vec<Import> = opts
        .imports
        .iter()
        .filter(|i| config.resource(&i.address).is_none())
        .cloned()
        .collect();
    let with_imports = (!imports.is_empty()).then(|| {
        let mut s = state.clone();
        for i in &imports {
            let deps = config
                .resource(&i.address)
                .map(|r| r.deps.iter().cloned().collect())
                .unwrap_or_default();
            record_import(&mut s, i, deps);
        }
        s
    });
    (imports, generated, with_imports)
}

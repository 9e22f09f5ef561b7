//! Records upgraded when a state loads: each kind's recorded facts carry the version of their
//! shape (`ResourceState::schema_version`), and a record of an older version is brought to the
//! current one by its kind (`RecordedFacts::upgrade`), as OpenTofu's `UpgradeResourceState`.
//! So a state written by an earlier sparkform loads, and no kind reads an old shape.

use super::{ResourceState, State};
use crate::kind::Registered;

impl ResourceState {
    /// Bring `attributes` to the shape its kind writes now, as OpenTofu's
    /// `UpgradeResourceState` does: `Err` says why it cannot be (recorded by a newer sparkform,
    /// or not of the kind's shape); and decode its configuration by its kind, once.
    pub fn upgrade(&mut self) -> Result<(), String> {
        let kind = self.kind.kind();
        let attributes = std::mem::take(&mut self.attributes).into_map();
        self.attributes = kind.upgrade_recorded(self.schema_version, attributes)?;
        self.schema_version = kind.recorded_version();
        // The configuration enters the engine here: decoded by its kind, once.
        let json = std::mem::take(&mut self.config).into_json();
        self.config = self.kind.configuration(json);
        Ok(())
    }
}

impl State {
    /// Every record, those of the kept generations too, brought to the shape its kind writes
    /// now; `Err` names the first that cannot be, with why.
    pub fn upgrade_records(&mut self) -> Result<(), (String, String)> {
        let generations = self
            .generations
            .iter_mut()
            .flat_map(|g| g.resources.iter_mut());
        for (address, r) in self.resources.iter_mut().chain(generations) {
            r.upgrade().map_err(|why| (address.clone(), why))?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use crate::state::{parse_document, StateError};

    /// A state with one toy record (the toy kind's facts are at version 2) as `attributes` at
    /// `version` (`None`: no version, as before records had them).
    pub(crate) fn toy_state(version: Option<u32>, attributes: serde_json::Value) -> String {
        let mut record = serde_json::json!({
            "kind": "toy",
            "node": "node.a",
            "config_hash": "sha256:00",
            "config": { "node": "node.a", "greeting": "hi" },
            "attributes": attributes,
        });
        if let Some(v) = version {
            record["schema_version"] = v.into();
        }
        serde_json::json!({
            "format_version": 1,
            "serial": 3,
            "lineage": "l",
            "sparkform_version": "0.1.0",
            "resources": { "toy.t": record },
        })
        .to_string()
    }

    #[test]
    fn an_older_record_is_upgraded_by_its_kind_when_the_state_loads() {
        let text = toy_state(
            Some(1),
            serde_json::json!({ "greeting": "hi", "last_run": "ok" }),
        );
        let state = parse_document(Path::new("s.json"), &text).unwrap();
        let r = &state.resources["toy.t"];
        assert_eq!(r.schema_version, 2);
        assert_eq!(r.attributes["said"], "hi", "{:?}", r.attributes);
        assert!(!r.attributes.contains_key("greeting"));
        assert_eq!(r.attributes["last_run"], "ok", "the journal's marks stay");
        // Written again, it is at version 2, and loads as it is.
        let again = serde_json::to_string(&state).unwrap();
        let state = parse_document(Path::new("s.json"), &again).unwrap();
        assert_eq!(state.resources["toy.t"].attributes["said"], "hi");
    }

    #[test]
    fn a_record_newer_than_this_sparkform_or_not_of_its_shape_is_refused_by_address() {
        let newer = toy_state(Some(3), serde_json::json!({ "said": "hi" }));
        match parse_document(Path::new("s.json"), &newer) {
            Err(StateError::Record { address, why, .. }) => {
                assert_eq!(address, "toy.t");
                assert!(
                    why.contains("version 3") && why.contains("up to 2"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        let damaged = toy_state(None, serde_json::json!({ "greeting": 5 }));
        match parse_document(Path::new("s.json"), &damaged) {
            Err(e @ StateError::Record { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("toy.t") && text.contains("invalid type"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

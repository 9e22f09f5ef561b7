//! Moving a state document as it is: `state push FILE` into a store, `state migrate` from one
//! backend to another. Both hold the locks of what they touch and refuse another deployment's
//! state (another lineage) or going back to an older serial.

use std::path::Path;

use super::{parse_document, State, StateError, StateStore, WriteCondition};

/// What a push or a migration wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocated {
    pub serial: u64,
    pub lineage: String,
    pub resources: usize,
    /// What the target held before (its serial), `None` when it was empty.
    pub replaced: Option<u64>,
}

fn relocated(state: &State, replaced: Option<u64>) -> Relocated {
    Relocated {
        serial: state.serial,
        lineage: state.lineage.clone(),
        resources: state.resources.len(),
        replaced,
    }
}

impl StateStore {
    /// Writes the plain document `doc` (read from `shown`) as the state, byte for byte (sealed
    /// when this store encrypts). Refused unless `force` when the state here has another
    /// lineage or a newer serial.
    pub fn push(&self, doc: &[u8], shown: &Path, force: bool) -> Result<Relocated, StateError> {
        let text = std::str::from_utf8(doc).map_err(|e| StateError::Corrupt {
            path: shown.to_path_buf(),
            line: 1,
            column: 1,
            message: format!("not UTF-8 text: {e}"),
        })?;
        let incoming = parse_document(shown, text)?;
        let _lock = self.lock("state push")?;
        let current = self.load()?;
        let expect = match &current {
            _ if force => WriteCondition::Any,
            None => WriteCondition::Absent,
            Some(cur) => {
                if cur.lineage != incoming.lineage {
                    return Err(StateError::OtherLineage {
                        place: self.describe(),
                        ours: incoming.lineage,
                        theirs: cur.lineage.clone(),
                        help: "a pushed document must be this deployment's; `-force` replaces the state anyway".into(),
                    });
                }
                if incoming.serial < cur.serial {
                    return Err(StateError::OlderSerial {
                        place: self.describe(),
                        ours: incoming.serial,
                        theirs: cur.serial,
                    });
                }
                WriteCondition::Serial(cur.serial, cur.lineage.clone())
            }
        };
        self.store_document(doc, incoming.serial, &incoming.lineage, expect)?;
        Ok(relocated(&incoming, current.map(|c| c.serial)))
    }

    /// Copies the state of `self` to `target` byte for byte (re-encrypted under `target`'s
    /// key when it has one), and the key of its hashes with it, holding both locks. Refused when `target` holds another
    /// deployment's state, or a newer serial of this one. The source is then set aside (a local
    /// file renamed `….migrated`, a PostgreSQL row renamed `WORKSPACE.migrated`), so nothing
    /// reads it by mistake.
    pub fn migrate_to(&self, target: &StateStore) -> Result<Relocated, StateError> {
        let _source_lock = self.lock("state migrate")?;
        let _target_lock = target.lock("state migrate")?;
        let Some(doc) = self.read_document()? else {
            return Err(StateError::Backend {
                message: format!("there is no state in {} to migrate", self.describe()),
                help: "nothing has been applied from there; the target is left as it is".into(),
            });
        };
        let place = self.backend.place();
        let text = std::str::from_utf8(&doc).map_err(|e| StateError::Corrupt {
            path: place.clone(),
            line: 1,
            column: 1,
            message: format!("not UTF-8 text: {e}"),
        })?;
        let state = parse_document(&place, text)?;
        let existing = match target.load() {
            Ok(s) => s,
            // A PostgreSQL target with no row, beside the local file this migration moves.
            Err(StateError::StillLocal { .. }) => None,
            Err(e) => return Err(e),
        };
        let expect = match &existing {
            None => WriteCondition::Absent,
            Some(t) if t.lineage != state.lineage => {
                return Err(StateError::OtherLineage {
                    place: target.describe(),
                    ours: state.lineage.clone(),
                    theirs: t.lineage.clone(),
                    help: "the target holds another deployment's state: choose another workspace (or schema) in the `state` block, or remove that state first".into(),
                });
            }
            Some(t) if t.serial > state.serial => {
                return Err(StateError::OlderSerial {
                    place: target.describe(),
                    ours: state.serial,
                    theirs: t.serial,
                });
            }
            Some(t) => WriteCondition::Serial(t.serial, t.lineage.clone()),
        };
        // The key of the hashes goes with the state, so the hashes still verify there; a
        // target that has another key is refused before anything is written.
        let key = self.read_key()?;
        if let (Some(ours), Some(theirs)) = (&key, target.read_key()?) {
            if *ours != theirs {
                return Err(StateError::TwoHashKeys {
                    place: target.describe(),
                    file: self.key_path(),
                });
            }
        }
        target.store_document(&doc, state.serial, &state.lineage, expect)?;
        if let Some(key) = &key {
            target.adopt_key(key)?;
        }
        self.backend.set_aside()?;
        Ok(relocated(&state, existing.map(|e| e.serial)))
    }
}

//! A record's attributes as the engine carries them: the kind's typed facts (`Kind::Recorded`),
//! decoded once where the record is made (a state's load, after its upgrade; a step that
//! completed; a plan file's load: [`super::AnyKind::decode_facts`]), beside the engine's journal
//! marks, all in the one map the state file keeps.

use std::any::Any;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::configuration::count_late_decode;
use super::{facts_of, facts_to_attributes, AttributeMap, RecordedFacts};

/// A record's attributes: its map and, once decoded, its kind's typed facts.
#[derive(Clone, Default)]
pub struct Attributes {
    map: AttributeMap,
    typed: Option<Arc<dyn Any + Send + Sync>>,
}

impl Attributes {
    /// A kind's typed facts, with their map.
    pub fn of<R: RecordedFacts>(facts: &R) -> Attributes {
        Attributes {
            map: facts_to_attributes(facts),
            typed: Some(Arc::new(facts.clone())),
        }
    }

    /// `map` with `facts`, what its kind read of it: the map stays exactly as it came.
    pub fn decoded<R: RecordedFacts>(map: AttributeMap, facts: R) -> Attributes {
        Attributes {
            map,
            typed: Some(Arc::new(facts)),
        }
    }

    /// A map no kind has read yet (what a file holds before its load decodes it, a record that
    /// holds only the journal's marks, a test's literal).
    pub fn untyped(map: AttributeMap) -> Attributes {
        Attributes { map, typed: None }
    }

    /// Its map: the facts and the journal's marks.
    pub fn map(&self) -> &AttributeMap {
        &self.map
    }

    pub fn into_map(self) -> AttributeMap {
        self.map
    }

    /// As the kind's `R`: the facts decoded where the record was made; a map never decoded is
    /// read now (a late decode, counted), and one that holds only the journal's marks reads as
    /// no facts (`R::default()`) without a decode. `Err`: the map is not an `R`.
    pub fn typed<R: RecordedFacts>(&self) -> Result<R, String> {
        if let Some(r) = self.typed.as_ref().and_then(|t| t.downcast_ref::<R>()) {
            return Ok(r.clone());
        }
        if self
            .map
            .keys()
            .all(|k| crate::vocabulary::is_journal_mark(k))
        {
            return Ok(R::default());
        }
        count_late_decode();
        facts_of(&self.map)
    }

    /// Write one of the engine's journal marks beside the facts (never a fact: the typed facts
    /// stay as they are).
    pub fn mark(&mut self, key: &str, value: serde_json::Value) {
        self.map.insert(key.to_string(), value);
    }

    /// The map to change by hand (a test's fixture): the typed facts are dropped, and read
    /// from the map again when next asked.
    pub fn edit(&mut self) -> &mut AttributeMap {
        self.typed = None;
        &mut self.map
    }

    /// Remove one of the engine's journal marks.
    pub fn unmark(&mut self, key: &str) {
        self.map.remove(key);
    }
}

impl From<AttributeMap> for Attributes {
    fn from(map: AttributeMap) -> Attributes {
        Attributes::untyped(map)
    }
}

impl std::ops::Deref for Attributes {
    type Target = AttributeMap;
    fn deref(&self) -> &AttributeMap {
        &self.map
    }
}

impl PartialEq for Attributes {
    fn eq(&self, other: &Attributes) -> bool {
        self.map == other.map
    }
}

impl std::fmt::Debug for Attributes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.map.fmt(f)
    }
}

impl Serialize for Attributes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.map.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Attributes {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Attributes, De::Error> {
        AttributeMap::deserialize(d).map(Attributes::untyped)
    }
}

//! A resource's configuration as the engine carries it: the kind's typed `Desired`, decoded
//! once where the value is made (a kind's lowering, a state's or a plan file's load, a plan's
//! recorded form: [`super::AnyKind::decode`]), beside its JSON, which plans diff and hash, the
//! state records and a plan file keeps. A hook reads the typed value ([`Configuration::typed`]);
//! no engine code and no kind reads a key of the JSON.

use std::any::Any;
use std::cell::Cell;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::DesiredConfig;

/// A configuration: its JSON and, once decoded, its kind's typed value.
#[derive(Clone)]
pub struct Configuration {
    json: serde_json::Value,
    typed: Option<Arc<dyn Any + Send + Sync>>,
}

thread_local! {
    /// How many times this thread read a configuration's JSON as its kind's type because no
    /// edge had decoded it: what `tests/fake/typed_engine.rs` checks is zero through a plan, an
    /// apply and a rollback.
    static LATE_DECODES: Cell<u64> = const { Cell::new(0) };
}

/// The late decodes this thread made so far ([`LATE_DECODES`]), of configurations and of
/// records' facts.
pub fn late_decodes() -> u64 {
    LATE_DECODES.with(Cell::get)
}

pub(super) fn count_late_decode() {
    LATE_DECODES.with(|n| n.set(n.get() + 1));
}

impl Configuration {
    /// A kind's typed configuration, with its JSON.
    pub fn of<D: DesiredConfig>(desired: D) -> Configuration {
        Configuration {
            json: desired.to_config(),
            typed: Some(Arc::new(desired)),
        }
    }

    /// `json` with `desired`, what its kind read of it: the JSON stays exactly as it came (a
    /// record's hashes, keys an older version wrote), so what is recorded and hashed is
    /// unchanged by the decode.
    pub fn decoded<D: DesiredConfig>(json: serde_json::Value, desired: D) -> Configuration {
        Configuration {
            json,
            typed: Some(Arc::new(desired)),
        }
    }

    /// JSON that no kind has read yet (what a file holds before its load decodes it, a test's
    /// literal); [`Configuration::typed`] reads it late.
    pub fn untyped(json: serde_json::Value) -> Configuration {
        Configuration { json, typed: None }
    }

    /// Its JSON.
    pub fn json(&self) -> &serde_json::Value {
        &self.json
    }

    pub fn into_json(self) -> serde_json::Value {
        self.json
    }

    /// Whether its kind has decoded it.
    pub fn is_typed(&self) -> bool {
        self.typed.is_some()
    }

    /// As the kind's `D`: the value decoded where it was made; one never decoded is read now
    /// (counted as a late decode). `Err`: the JSON is not a `D` (serde's message).
    pub fn typed<D: DesiredConfig + Clone>(&self) -> Result<D, String> {
        if let Some(d) = self.typed.as_ref().and_then(|t| t.downcast_ref::<D>()) {
            return Ok(d.clone());
        }
        count_late_decode();
        D::from_config(&self.json)
    }
}

impl From<serde_json::Value> for Configuration {
    fn from(json: serde_json::Value) -> Configuration {
        Configuration::untyped(json)
    }
}

impl std::ops::Deref for Configuration {
    type Target = serde_json::Value;
    fn deref(&self) -> &serde_json::Value {
        &self.json
    }
}

impl PartialEq for Configuration {
    fn eq(&self, other: &Configuration) -> bool {
        self.json == other.json
    }
}

impl PartialEq<serde_json::Value> for Configuration {
    fn eq(&self, other: &serde_json::Value) -> bool {
        &self.json == other
    }
}

impl std::fmt::Debug for Configuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.json.fmt(f)
    }
}

impl std::fmt::Display for Configuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.json.fmt(f)
    }
}

impl Default for Configuration {
    fn default() -> Configuration {
        Configuration::untyped(serde_json::Value::Null)
    }
}

impl Serialize for Configuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Configuration {
    fn deserialize<De: serde::Deserializer<'de>>(d: De) -> Result<Configuration, De::Error> {
        serde_json::Value::deserialize(d).map(Configuration::untyped)
    }
}

//! Known-good generations: what each apply that ended with every step done and every probe
//! passing left running, kept in the state so that `sparkform history` lists them (and a
//! rollback can put one back from what was recorded, without the old definitions).
//!
//! A generation holds the resources as the state recorded them after that apply: each one's
//! configuration (sensitive leaves as keyed hashes, ephemeral ones absent, as everywhere in the
//! state), its attributes (the objects it made: container and image IDs, the weights' commit)
//! and how long its step took. Nothing here knows a kind: what changed between two generations
//! is told by address and by the names of the configuration's top-level keys that differ.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{OutputState, ResourceState, State};

/// Generations a state keeps, the newest; an older one is forgotten when a new one is recorded.
pub const GENERATIONS_KEPT: usize = 10;

/// One known-good generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// 1 for a deployment's first; one more than the last for each next one, never reused.
    pub number: u64,
    /// When the apply ended, RFC 3339 in UTC.
    pub at: String,
    /// Who applied it: `user@host`.
    pub by: String,
    /// `sha256:<hex>` of the definitions the apply was made from (the folder's `.hcl` files and
    /// its lock file, by name and content).
    pub definitions: String,
    /// The addresses the apply created, replaced, updated, deleted or ran, in address order.
    pub applied: Vec<String>,
    /// Every resource as the state recorded it after the apply.
    pub resources: BTreeMap<String, ResourceState>,
    /// The outputs the apply recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, OutputState>,
    /// What a rollback needs of each resource beyond its record, by address.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shapes: BTreeMap<String, Shape>,
    /// Set when this generation is a rollback's: the generation it put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<u64>,
}

/// What a resource's record leaves out and a rollback plans with: which paths of its
/// configuration hold sensitive values (recorded as keyed hashes) and ephemeral ones (not
/// recorded), and how it is replaced along with others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sensitive: Vec<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ephemeral: Vec<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replace_triggered_by: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What an apply that succeeded tells the generation it records.
#[derive(Debug, Clone)]
pub struct Succeeded {
    pub at: String,
    pub by: String,
    pub definitions: String,
    pub applied: Vec<String>,
    pub shapes: BTreeMap<String, Shape>,
}

/// Records the state's resources and outputs as a new generation, the newest last, keeping
/// [`GENERATIONS_KEPT`].
pub fn record(state: &mut State, applied: Succeeded) {
    let number = state.generations.last().map_or(1, |g| g.number + 1);
    let mut addresses = applied.applied;
    addresses.sort();
    addresses.dedup();
    state.generations.push(Generation {
        number,
        at: applied.at,
        by: applied.by,
        definitions: applied.definitions,
        applied: addresses,
        resources: state.resources.clone(),
        outputs: state.outputs.clone(),
        shapes: applied
            .shapes
            .into_iter()
            .filter(|(a, _)| state.resources.contains_key(a))
            .collect(),
        rollback_to: None,
    });
    let over = state.generations.len().saturating_sub(GENERATIONS_KEPT);
    state.generations.drain(..over);
}

/// How one address differs from one generation to the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum Difference {
    Added {
        address: String,
    },
    Removed {
        address: String,
    },
    /// Its configuration differs in these top-level keys.
    Changed {
        address: String,
        keys: Vec<String>,
    },
}

impl Difference {
    /// `+ ADDRESS`, `- ADDRESS`, `~ ADDRESS (key, key)`.
    pub fn line(&self) -> String {
        match self {
            Difference::Added { address } => format!("+ {address}"),
            Difference::Removed { address } => format!("- {address}"),
            Difference::Changed { address, keys } => format!("~ {address} ({})", keys.join(", ")),
        }
    }
}

/// What differs from `before` to `after`, by address.
pub fn differences(
    before: &BTreeMap<String, ResourceState>,
    after: &BTreeMap<String, ResourceState>,
) -> Vec<Difference> {
    let mut out = Vec::new();
    for (address, now) in after {
        match before.get(address) {
            None => out.push(Difference::Added {
                address: address.clone(),
            }),
            Some(was) if was.config_hash != now.config_hash => out.push(Difference::Changed {
                address: address.clone(),
                keys: differing_keys(&was.config, &now.config),
            }),
            Some(_) => {}
        }
    }
    for address in before.keys().filter(|a| !after.contains_key(*a)) {
        out.push(Difference::Removed {
            address: address.clone(),
        });
    }
    out
}

/// The top-level keys whose values differ (present in one only, or unequal), sorted.
fn differing_keys(was: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let was = was.as_object().unwrap_or(&empty);
    let now = now.as_object().unwrap_or(&empty);
    let mut keys: Vec<String> = was
        .keys()
        .chain(now.keys())
        .filter(|k| was.get(*k) != now.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// `sha256:<hex>` of the definitions in `dir`: each `.hcl` file of the folder (the lock file
/// included), in name order, by name and content. A file that cannot be read counts by its
/// name alone.
pub fn definitions_digest(dir: &Path) -> String {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "hcl"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut hash = Sha256::new();
    for f in &files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        hash.update(name.as_bytes());
        hash.update([0]);
        hash.update(std::fs::read(f).unwrap_or_default());
        hash.update([0]);
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `user@host` of this process, from `$USER` (or `$LOGNAME`) and the host name; without
/// either variable (a service, a container), the user's ID (`root` for 0).
pub fn who() -> String {
    use std::os::unix::fs::MetadataExt;
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| match std::fs::metadata("/proc/self").map(|m| m.uid()) {
            Ok(0) => "root".into(),
            Ok(uid) => format!("uid {uid}"),
            Err(_) => "unknown".into(),
        });
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(config: serde_json::Value) -> ResourceState {
        ResourceState {
            kind: crate::vocabulary::KindId::Container,
            node: Some("node.a".into()),
            config_hash: format!("sha256:{}", config),
            config: config.into(),
            attributes: Default::default(),
            depends_on: Vec::new(),
            last_apply_secs: Some(1.5),
            schema_version: 1,
        }
    }

    fn applied(n: u64) -> Succeeded {
        Succeeded {
            at: format!("2026-12-04T00:00:{n:02}Z"),
            by: "root@box".into(),
            definitions: "sha256:0".into(),
            applied: vec![
                "container.b".into(),
                "container.a".into(),
                "container.a".into(),
            ],
            shapes: BTreeMap::new(),
        }
    }

    #[test]
    fn numbers_rise_and_only_the_newest_are_kept() {
        let mut state = State::new();
        state.resources.insert(
            "container.a".into(),
            resource(serde_json::json!({"image": "x:1"})),
        );
        for n in 1..=(GENERATIONS_KEPT as u64 + 3) {
            record(&mut state, applied(n));
        }
        let numbers: Vec<u64> = state.generations.iter().map(|g| g.number).collect();
        assert_eq!(numbers.len(), GENERATIONS_KEPT);
        assert_eq!(numbers.first(), Some(&4));
        assert_eq!(numbers.last(), Some(&(GENERATIONS_KEPT as u64 + 3)));
        let last = &state.generations[GENERATIONS_KEPT - 1];
        assert_eq!(last.applied, ["container.a", "container.b"]);
        assert_eq!(last.resources, state.resources);
        // Numbers go on from the last one kept, never from the count.
        state.generations.drain(..GENERATIONS_KEPT - 1);
        record(&mut state, applied(59));
        assert_eq!(
            state.generations.last().map(|g| g.number),
            Some(GENERATIONS_KEPT as u64 + 4)
        );
    }

    #[test]
    fn differences_name_addresses_and_the_keys_that_changed() {
        let before: BTreeMap<_, _> = [
            (
                "container.a".to_string(),
                resource(serde_json::json!({"image": "x:1", "args": ["--a"], "port": 1})),
            ),
            (
                "container.gone".to_string(),
                resource(serde_json::json!({})),
            ),
            (
                "container.same".to_string(),
                resource(serde_json::json!({"k": 1})),
            ),
        ]
        .into();
        let after: BTreeMap<_, _> = [
            (
                "container.a".to_string(),
                resource(
                    serde_json::json!({"image": "x:2", "args": ["--b"], "port": 1, "new": true}),
                ),
            ),
            ("container.new".to_string(), resource(serde_json::json!({}))),
            (
                "container.same".to_string(),
                resource(serde_json::json!({"k": 1})),
            ),
        ]
        .into();
        let lines: Vec<String> = differences(&before, &after)
            .iter()
            .map(Difference::line)
            .collect();
        assert_eq!(
            lines,
            [
                "~ container.a (args, image, new)",
                "+ container.new",
                "- container.gone"
            ]
        );
        assert!(differences(&after, &after).is_empty());
    }

    #[test]
    fn the_digest_follows_the_definitions_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), "node \"a\" {}\n").unwrap();
        let first = definitions_digest(dir.path());
        assert!(first.starts_with("sha256:") && first.len() == 71, "{first}");
        std::fs::write(dir.path().join("notes.txt"), "not a definition").unwrap();
        assert_eq!(definitions_digest(dir.path()), first);
        std::fs::write(dir.path().join("main.hcl"), "node \"b\" {}\n").unwrap();
        assert_ne!(definitions_digest(dir.path()), first);
    }
}

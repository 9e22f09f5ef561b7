//! A model resource's desired configuration (one per node of a `model` block), typed: what the
//! lowering produces and the machine half works on. Unknown values are written as `null`, as
//! the recorded configurations always had them; the fields only the download node has are
//! absent on the others.

use serde::{Deserialize, Serialize};

use crate::kind::DesiredConfig;

/// The download node fetches from the hub and serves its peers; a pull node copies from it.
pub const ROLE_DOWNLOAD: &str = "download";
pub const ROLE_PULL: &str = "pull";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    /// The block's address (`model.qwen`).
    #[serde(default)]
    pub block: String,
    #[serde(default)]
    pub repo: String,
    /// As written (`main`, a tag, a commit).
    #[serde(default)]
    pub revision: String,
    /// What the revision resolved to; `null` until the read phase resolved it.
    #[serde(default)]
    pub commit: Option<String>,
    /// The cache folder on the node.
    #[serde(default)]
    pub cache: String,
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The image the transfers run in.
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub node_name: String,
    /// [`ROLE_DOWNLOAD`] or [`ROLE_PULL`].
    #[serde(default)]
    pub role: String,
    /// `node.NAME` of the download node.
    #[serde(default)]
    pub download_node: String,
    /// This node's fabric address.
    #[serde(default)]
    pub address: Option<String>,
    /// The download node's fabric address, which pulls copy from.
    #[serde(default)]
    pub source_address: Option<String>,
    /// The download node's addresses on the block's further networks (`network = [a, b]`):
    /// a pull spreads its connections over these and `source_address`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_source_addresses: Vec<String>,
    /// The manifest's size and file count, once resolved.
    #[serde(default)]
    pub total_bytes: Option<u64>,
    #[serde(default)]
    pub files: Option<u64>,
    /// The model's `config.json` facts (architectures, …), once resolved.
    #[serde(default)]
    pub facts: serde_json::Value,
    /// The download node's own: written (maybe `null`) there, absent on pull nodes.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "present")]
    pub serve_image: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "present")]
    pub endpoint: Option<Option<String>>,
    /// The hub token (sensitive: hashed in plans and the state).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "present")]
    pub token: Option<Option<String>>,
    /// How many revisions' verified snapshots stay on the node, the one in use included
    /// ([`DEFAULT_KEEP_REVISIONS`] when unset): what a rollback takes up without fetching.
    /// Written only when the block sets it, so a state from before it plans no change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_revisions: Option<u64>,
}

/// Revisions kept on a node when the block says nothing: the one in use and the one before.
pub const DEFAULT_KEEP_REVISIONS: u64 = 2;

impl DesiredConfig for Desired {}

/// What the state keeps of a copy: the commit it verified, its size, what this apply fetched
/// (or copied) and how long that took; a pull's also where from and who served it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_fetched: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_fetched: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<serde_json::Number>,
    /// A pull's: bytes by the address that served them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_over: Option<std::collections::BTreeMap<String, u64>>,
    /// A pull's: `address:port` it copied from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A pull's: the peers the download node served while it copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers_served: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<serde_json::Number>,
    /// Earlier revisions' verified snapshots kept on the node for a rollback, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<Kept>,
}

/// An earlier revision's snapshot kept on a node: its commit and its size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    pub commit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl crate::kind::RecordedFacts for Recorded {}

impl Kept {
    /// The earlier revisions' snapshots a node keeps once `commit` is in use, from
    /// `candidates` (newest first: the one in use until now, then those kept), at most
    /// `keep - 1` (the one now in use leaves the list); and the commits that fall off it, to
    /// remove.
    pub fn after(
        candidates: impl Iterator<Item = Kept>,
        commit: &str,
        keep: u64,
    ) -> (Vec<Kept>, Vec<String>) {
        let mut kept: Vec<Kept> = Vec::new();
        for k in candidates {
            if k.commit != commit && !kept.iter().any(|x| x.commit == k.commit) {
                kept.push(k);
            }
        }
        let room = usize::try_from(keep.saturating_sub(1)).unwrap_or(usize::MAX);
        let evict = kept.split_off(room.min(kept.len()));
        (kept, evict.into_iter().map(|k| k.commit).collect())
    }
}

impl Desired {
    pub fn keep_revisions(&self) -> u64 {
        self.keep_revisions.unwrap_or(DEFAULT_KEEP_REVISIONS).max(1)
    }

    pub fn is_download(&self) -> bool {
        self.role == ROLE_DOWNLOAD
    }

    pub fn serve_image(&self) -> Option<&str> {
        self.serve_image.as_ref().and_then(|s| s.as_deref())
    }

    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_ref().and_then(|s| s.as_deref())
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_ref().and_then(|s| s.as_deref())
    }
}

/// A field that is absent (`None`), present as `null` (`Some(None)`) or set: the outer
/// `Option` is whether the key is there.
mod present {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, T: Serialize>(
        v: &Option<Option<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(inner) => inner.serialize(s),
            // `skip_serializing_if` leaves an absent field out before this is called.
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn two_revisions_are_kept_and_the_third_goes() {
        let k = |c: &str| Kept {
            commit: c.into(),
            bytes: Some(1),
        };
        // c in use, b recorded before it, a kept earlier: keep 2 keeps b, and a goes.
        let (kept, evict) = Kept::after([k("b"), k("a")].into_iter(), "c", 2);
        assert_eq!(kept, [k("b")]);
        assert_eq!(evict, ["a"]);
        // Back to a kept one (a rollback): it leaves the list, the one in use joins it.
        let (kept, evict) = Kept::after([k("c"), k("b")].into_iter(), "b", 2);
        assert_eq!((kept, evict), (vec![k("c")], Vec::<String>::new()));
        // keep 1 keeps none; keep 3 keeps both.
        assert_eq!(
            Kept::after([k("b"), k("a")].into_iter(), "c", 1).1,
            ["b", "a"]
        );
        assert_eq!(Kept::after([k("b"), k("a")].into_iter(), "c", 3).0.len(), 2);
    }

    #[test]
    fn nulls_stay_nulls_and_absent_stays_absent() {
        let download = json!({
            "block": "model.m", "repo": "org/m", "revision": "main", "commit": null,
            "cache": "/c", "include": [], "exclude": [], "image": "i", "node_name": "a",
            "role": "download", "download_node": "node.a", "address": null,
            "source_address": null, "total_bytes": null, "files": null, "facts": null,
            "serve_image": null, "endpoint": "http://h", "token": null,
        });
        let d = Desired::from_config(&download).unwrap();
        assert_eq!(d.to_config(), download);
        assert_eq!(d.endpoint(), Some("http://h"));
        assert!(d.is_download());
        let mut pull = download.as_object().unwrap().clone();
        for k in ["serve_image", "endpoint", "token"] {
            pull.remove(k);
        }
        pull.insert("role".into(), json!("pull"));
        let pull = serde_json::Value::Object(pull);
        assert_eq!(Desired::from_config(&pull).unwrap().to_config(), pull);
    }
}

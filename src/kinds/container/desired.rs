//! A container's desired configuration, typed: what its lowering produces, what its machine
//! half works on, and (as JSON, through serde) what plans diff and the state records. The
//! defaults are here and nowhere else.
//!
//! Numbers are kept as `serde_json::Number` so that the JSON is the one the definitions
//! evaluated to (`30`, not `30.0`): it is hashed into the container's label, and a different
//! form would replace every container.

use std::collections::BTreeMap;

use crate::vocabulary::Gpus;
use serde::{Deserialize, Serialize};
use serde_json::Number;

use crate::kind::DesiredConfig;
use crate::kinds::{known, Texts};

/// Docker's own stop timeout, when the block sets none.
pub const DEFAULT_STOP_SECS: i32 = 10;

/// Seconds of each start phase (`progress` patterns), by phase name.
pub type PhaseSecs = std::collections::BTreeMap<String, f64>;

/// What the state keeps of a running container: its ID, its image's ID and digest, and what
/// its start showed (the phases' seconds, the values its ready checks record from the log);
/// with a JIT cache mounted, the node's folder, whether it was warm, and the phases of the
/// latest cold and warm starts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_folder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_warm: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_secs_by_cache: Option<PhasesByCache>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_secs: Option<PhaseSecs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_log: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// Seconds from the container's start to its ready checks' pass: its own start, which no
    /// ordering of sparkform's can shorten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_secs: Option<f64>,
}

impl crate::kind::RecordedFacts for Recorded {}

/// The phases of the latest start from a cold cache folder and of the latest from a warm one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PhasesByCache {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<PhaseSecs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<PhaseSecs>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    /// The Docker name (the block's `name`, else the address's parts joined by `-`).
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub image: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub command: Option<Texts>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub entrypoint: Option<Texts>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_mode: Option<String>,
    /// Bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub shm_size: Option<Number>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub gpus: Option<Gpus>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub devices: Option<Texts>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub volumes: Option<Texts>,
    /// `name = "soft:hard"` or one value for both.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub ulimits: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub cap_add: Option<Texts>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub privileged: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Docker's restart policy (`no`, `always`, `unless-stopped`, `on-failure[:N]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub pull: Option<bool>,
    /// An image archive (relative to the definitions) loaded when the node lacks the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_archive: Option<String>,
    /// Seconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub stop_timeout: Option<Number>,
    /// The `ready` blocks, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<ReadyCheck>,
    /// What its start needs of nodes' memory (`memory`): checked before it is created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<MemoryNeed>,
    /// `{ REGEX = "the cause" }`: log lines that, once it runs, mean it no longer serves
    /// though it looks healthy (a wedged engine): `sparkform watch` acts on them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_on_log: Option<BTreeMap<String, String>>,
    /// A folder of the node kept across replacements, one per image (`cache`): compile and
    /// JIT artefacts a new container of the same image reuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMount>,
}

impl DesiredConfig for Desired {}

/// `cache = { host, path, skips }`: the node's folder `HOST/IMAGE_ID` (the image's ID without
/// `sha256:`) mounted at `path`, so a replacement with the same image finds what the previous
/// container compiled and a new image never reads another's artefacts. `destroy` keeps it
/// unless `-purge-caches`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheMount {
    /// An absolute path on the node: the folder of every image's cache.
    pub host: String,
    /// An absolute path in the container.
    pub path: String,
    /// The `progress` phases a warm cache skips: the plan's expected durations leave out what
    /// the last apply recorded for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skips: Vec<String>,
}

impl CacheMount {
    /// The node's folder for an image ID (`sha256:HEX` or `HEX`); `None` when the ID is not
    /// hexadecimal, so nothing but a digest ever joins the path.
    pub fn folder(&self, image_id: &str) -> Option<String> {
        let hex = image_id.strip_prefix("sha256:").unwrap_or(image_id);
        (!hex.is_empty() && hex.len() <= 128 && hex.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| format!("{}/{hex}", self.host.trim_end_matches('/')))
    }
}

/// One node's memory a container's start needs: on a unified-memory node the GPU's memory is
/// the node's, and what the kernel holds as free (`MemFree`; the page cache does not count)
/// is what CUDA reports free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryNeed {
    /// The node's address (`node.spark1`).
    pub node: String,
    /// The start waits (`timeout`) until the node has this much free.
    pub min_free_gib: f64,
    /// Files or folders whose clean page cache is dropped first (the weights just copied).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_page_cache: Vec<String>,
    /// Seconds to wait for the memory (an old engine releasing it); 120 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// A value the state recorded as its hash (sensitive) where a map, list, number or flag
/// belongs: read as not set, so the rest of a recorded configuration is still read. A desired
/// configuration holds clear values only.
fn hidden<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error as _;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(None),
        v @ serde_json::Value::String(_) => Ok(serde_json::from_value(v).ok()),
        v => serde_json::from_value(v)
            .map(Some)
            .map_err(D::Error::custom),
    }
}

impl Desired {
    /// Seconds a stop may take: `stop_timeout`, else Docker's 10, within 0..=3600.
    pub fn stop_secs(&self) -> i32 {
        self.stop_timeout
            .as_ref()
            .and_then(Number::as_i64)
            .map_or(DEFAULT_STOP_SECS, |s| s.clamp(0, 3600) as i32)
    }

    /// The restart policy, `no` when unset (Docker's default).
    pub fn restart_policy(&self) -> &str {
        self.restart.as_deref().unwrap_or("no")
    }

    /// Docker's GPU request count: -1 for all, `None` for none.
    pub fn gpu_count(&self) -> Option<i64> {
        self.gpus.as_ref().and_then(Gpus::request_count)
    }

    /// The patterns of every check's `progress`: a later check's phases may start during an
    /// earlier one.
    pub fn progress_patterns(&self) -> BTreeMap<String, String> {
        self.ready
            .iter()
            .filter_map(|c| c.progress.as_ref())
            .flat_map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }
}

/// One `ready { … }` block: exactly one of `exec`, `http`, `tcp` (the lowering checks it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyCheck {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub exec: Option<Texts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<String>,
    /// The HTTP status an `http` check wants.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub status: Option<Number>,
    /// The exit code an `exec` check wants.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub exit_code: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_contains: Option<String>,
    /// Seconds; always written (the lowering puts the default in).
    #[serde(default = "default_timeout")]
    pub timeout: Number,
    /// Seconds between attempts; always written.
    #[serde(default = "default_interval")]
    pub interval: Number,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub fail_on_log: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub warn_on_log: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub progress: Option<BTreeMap<String, String>>,
    /// `{ NAME = "REGEX" }`: once ready, what the log's lines matching each pattern say (their
    /// capture groups), recorded with the container (`from_log`) and shown by `status`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hidden"
    )]
    pub record_from_log: Option<BTreeMap<String, String>>,
}

pub const DEFAULT_READY_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_READY_INTERVAL_SECS: u64 = 2;

fn default_timeout() -> Number {
    Number::from(DEFAULT_READY_TIMEOUT_SECS)
}

fn default_interval() -> Number {
    Number::from(DEFAULT_READY_INTERVAL_SECS)
}

/// What a ready check does.
pub enum ReadyKind<'a> {
    Exec(Vec<String>),
    Http(&'a str),
    Tcp(&'a str),
    None,
}

impl ReadyCheck {
    pub fn probe(&self) -> ReadyKind<'_> {
        if let Some(cmd) = &self.exec {
            ReadyKind::Exec(known(cmd))
        } else if let Some(url) = &self.http {
            ReadyKind::Http(url)
        } else if let Some(addr) = &self.tcp {
            ReadyKind::Tcp(addr)
        } else {
            ReadyKind::None
        }
    }

    pub fn timeout_secs(&self) -> u64 {
        self.timeout.as_u64().unwrap_or(DEFAULT_READY_TIMEOUT_SECS)
    }

    pub fn interval_secs(&self) -> u64 {
        self.interval
            .as_u64()
            .unwrap_or(DEFAULT_READY_INTERVAL_SECS)
    }

    pub fn want_status(&self) -> u16 {
        crate::kinds::wanted_status(self.status.as_ref())
    }

    pub fn want_exit_code(&self) -> i64 {
        crate::kinds::wanted_exit_code(self.exit_code.as_ref())
    }

    /// What the check does, in progress lines and errors.
    pub fn describe(&self) -> String {
        match self.probe() {
            ReadyKind::Exec(c) => format!("exec {}", c.join(" ")),
            ReadyKind::Http(u) => format!("GET {u}"),
            ReadyKind::Tcp(a) => format!("tcp {a}"),
            ReadyKind::None => "tcp ".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_json_is_the_evaluated_one() {
        let config = json!({
            "name": "c", "node": "n1", "image": "i:1", "shm_size": 17179869184u64,
            "gpus": "all", "stop_timeout": 30, "env": {"A": "1"},
            // a node fact the first evaluation does not know yet
            "command": ["serve", "--memory", null],
            "ready": [{"http": "http://127.0.0.1:8000/health", "timeout": 900, "interval": 2}],
        });
        let d = Desired::from_config(&config).unwrap();
        assert_eq!(d.to_config(), config);
        assert_eq!(d.stop_secs(), 30);
        assert_eq!(
            crate::kinds::known(d.command.as_deref().unwrap()),
            ["serve", "--memory"]
        );
        assert_eq!(d.gpu_count(), Some(-1));
        assert_eq!(d.ready[0].want_status(), 200);
        let float = json!({"name": "c", "node": "n", "image": "i", "stop_timeout": 1.5});
        assert_eq!(Desired::from_config(&float).unwrap().to_config(), float);
    }

    #[test]
    fn a_recorded_hash_where_a_map_belongs_hides_only_that_attribute() {
        let recorded =
            json!({"name": "c", "image": "i", "env": "hmac-sha256:00", "stop_timeout": 7});
        let d = Desired::from_config(&recorded).unwrap();
        assert_eq!((d.stop_secs(), d.name.as_str()), (7, "c"));
        assert_eq!(d.env, None);
        assert!(Desired::from_config(&json!({"name": "c", "env": 3})).is_err());
    }

    #[test]
    fn defaults_live_here() {
        let d = Desired::from_config(&json!({"name": "c", "ready": [{"tcp": "h:1"}]})).unwrap();
        assert_eq!(d.stop_secs(), DEFAULT_STOP_SECS);
        assert_eq!(d.restart_policy(), "no");
        assert_eq!(d.ready[0].timeout_secs(), 300);
        assert_eq!(d.ready[0].interval_secs(), 2);
        assert_eq!(d.gpu_count(), None);
    }
}

//! A container on a node's Docker Engine.

pub mod desired;
pub(crate) mod lower;
pub mod machine;
pub mod progress;

use serde::{Deserialize, Serialize};

use crate::kind::Kind;
use crate::schema::{self, opt, req, spec, BlockSpec, Child};
use crate::vocabulary::OnDrift;

pub static READY: BlockSpec = spec(
    "ready",
    &[],
    &[
        opt("exec", schema::ValueType::ListStr),
        opt("http", schema::ValueType::Str),
        opt("tcp", schema::ValueType::Str),
        opt("status", schema::ValueType::Num),
        opt("exit_code", schema::ValueType::Num),
        opt("output_contains", schema::ValueType::Str),
        opt("timeout", schema::ValueType::Duration),
        opt("interval", schema::ValueType::Duration),
        opt("fail_on_log", schema::ValueType::MapStr),
        opt("warn_on_log", schema::ValueType::MapStr),
        opt("progress", schema::ValueType::MapStr),
        opt("record_from_log", schema::ValueType::MapStr),
    ],
    &[],
);

/// The block that declares it.
pub static CONTAINER: BlockSpec = spec(
    "container",
    &["name"],
    &[
        req("node", schema::ValueType::Node),
        req("image", schema::ValueType::Str),
        opt("name", schema::ValueType::Str),
        opt("command", schema::ValueType::ListStr),
        opt("entrypoint", schema::ValueType::ListStr),
        opt("env", schema::ValueType::MapStr),
        opt("network_mode", schema::ValueType::Str),
        opt("ipc_mode", schema::ValueType::Str),
        opt("pid_mode", schema::ValueType::Str),
        opt("shm_size", schema::ValueType::Size),
        opt("gpus", schema::ValueType::Gpus),
        opt("devices", schema::ValueType::ListStr),
        opt("volumes", schema::ValueType::ListStr),
        opt("ulimits", schema::ValueType::MapStr),
        opt("cap_add", schema::ValueType::ListStr),
        opt("privileged", schema::ValueType::Bool),
        opt("user", schema::ValueType::Str),
        opt("working_dir", schema::ValueType::Str),
        opt("restart", schema::ValueType::Str),
        opt("labels", schema::ValueType::MapStr),
        opt("pull", schema::ValueType::Bool),
        opt("image_archive", schema::ValueType::Str),
        opt("stop_timeout", schema::ValueType::Duration),
        opt("replace_triggered_by", schema::ValueType::RefList),
        opt("process_group", schema::ValueType::Str),
        opt("depends_on", schema::ValueType::RefList),
        opt("for_each", schema::ValueType::ForEach),
        opt("memory", schema::ValueType::Any),
        opt("watch_on_log", schema::ValueType::MapStr),
        opt("cache", schema::ValueType::Any),
    ],
    &[Child {
        name: "ready",
        spec: &READY,
        multiple: true,
    }],
);

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &CONTAINER;

use hcl::{Map, Value};

pub use super::to_json;
use super::Problem;
use crate::kind::DesiredConfig;
pub use desired::{
    CacheMount, Desired, MemoryNeed, PhaseSecs, PhasesByCache, ReadyCheck, ReadyKind, Recorded,
};

pub struct Container;
pub static KIND: Container = Container;
super::register!(Container, KIND, TOP_BLOCK, lower::lower);

impl Kind for Container {
    type Desired = Desired;
    type Recorded = Recorded;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &CONTAINER,
        in_place: IN_PLACE,
        // The ready checks are shown as a whole: one check's fields mean little apart.
        whole_attributes: &["ready"],
        lifecycle: crate::vocabulary::Lifecycle::Converges,
        on_drift: OnDrift::Replace,
        service: true,
        disruption: Some(crate::kind::STOPS),
        found_untracked: true,
        dot_shape: "box",
    };
    fn images(
        &self,
        desired: &Desired,
        recorded: Option<&Recorded>,
    ) -> Vec<(String, Option<String>)> {
        let text = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        // A state written before the lock file knew digests recorded the image ID only.
        let pinned = recorded.and_then(|r| text(&r.image_digest).or(text(&r.image_id)));
        vec![(desired.image.clone(), pinned)]
    }
    fn placement(&self, desired: &Desired) -> crate::kind::Placement {
        let mut fail_on_log: Vec<(String, String)> = desired
            .ready
            .iter()
            .filter_map(|r| r.fail_on_log.as_ref())
            .flat_map(|m| m.iter().map(|(p, f)| (p.clone(), f.clone())))
            .collect();
        fail_on_log.sort();
        fail_on_log.dedup();
        crate::kind::Placement {
            runs_in: Some(crate::kind::RunsIn {
                name: desired.name.clone(),
                fail_on_log,
            }),
            ..Default::default()
        }
    }
    fn holds(&self, recorded: &Recorded) -> crate::kind::Holds {
        crate::kind::Holds {
            id: recorded.container_id.clone(),
            from_log: recorded.from_log.clone().unwrap_or_default(),
            kept_on_delete: recorded
                .cache_folder
                .as_ref()
                .map(|folder| format!("the cache folder {folder}")),
            start_secs: recorded.start_secs,
            ..Default::default()
        }
    }
    fn reuse(
        &self,
        desired: &Desired,
        found: Option<&serde_json::Value>,
        recorded: Option<&Recorded>,
    ) -> Option<crate::kind::Reuse> {
        let cache = desired.cache.as_ref()?;
        let found: CacheFound = serde_json::from_value(found?.clone()).ok()?;
        let found = found.cache?;
        let times = StartTimes::of(recorded);
        Some(crate::kind::Reuse {
            image_id: found.image_id,
            warm: found.warm,
            last_start_warm: times.last_warm,
            skips: cache.skips.iter().map(|label| times.phase(label)).collect(),
        })
    }
}

/// What the kind's plan-time read found of a container's cache folder (`machine::cache`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CacheFound {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<FolderFound>,
}

/// A cache folder on the node: keyed by the image's ID (none when the node lacks the image).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FolderFound {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    #[serde(default)]
    pub warm: bool,
}

/// What a container's recorded starts took, phase by phase.
struct StartTimes<'r> {
    /// The last start's phases.
    last: Option<&'r PhaseSecs>,
    last_warm: bool,
    /// The latest start from each kind of folder.
    by_cache: Option<&'r PhasesByCache>,
}

impl<'r> StartTimes<'r> {
    fn of(recorded: Option<&'r Recorded>) -> Self {
        StartTimes {
            last: recorded.and_then(|r| r.phase_secs.as_ref()),
            last_warm: recorded.and_then(|r| r.cache_warm) == Some(true),
            by_cache: recorded.and_then(|r| r.phase_secs_by_cache.as_ref()),
        }
    }

    fn phase(&self, label: &str) -> crate::vocabulary::PhaseTimes {
        let of = |cache: fn(&PhasesByCache) -> Option<&PhaseSecs>| {
            self.by_cache.and_then(cache)?.get(label).copied()
        };
        // A state from before `phase_secs_by_cache`: its last start counts as cold.
        let last = self.last.and_then(|p| p.get(label).copied());
        crate::vocabulary::PhaseTimes {
            label: label.to_string(),
            cold_secs: of(|b| b.cold.as_ref()).or(if self.last_warm { None } else { last }),
            warm_secs: of(|b| b.warm.as_ref()).or(if self.last_warm { last } else { None }),
        }
    }
}

/// Docker can change a restart policy on a running container; sparkform's ready checks are its
/// own. Everything else needs a new container.
pub const IN_PLACE: &[&str] = &["restart", "ready", "memory", "watch_on_log"];

/// Labels sparkform puts on every container; users may not set them.
pub const LABEL_PREFIX: &str = "sparkform.";
/// The state lineage of the deployment the container belongs to.
pub const LABEL_LINEAGE: &str = "sparkform.lineage";
/// The resource address (`module.qwen.container.vllm`).
pub const LABEL_ADDRESS: &str = "sparkform.address";
/// The hash of the configuration the container was created from.
pub const LABEL_CONFIG_HASH: &str = "sparkform.config_hash";

/// Attributes copied into the desired configuration, in this order.
const ATTRIBUTES: &[&str] = &[
    "name",
    "node",
    "image",
    "command",
    "entrypoint",
    "env",
    "network_mode",
    "ipc_mode",
    "pid_mode",
    "shm_size",
    "gpus",
    "devices",
    "volumes",
    "ulimits",
    "cap_add",
    "privileged",
    "user",
    "working_dir",
    "restart",
    "labels",
    "pull",
    "image_archive",
    "stop_timeout",
    "memory",
    "watch_on_log",
    "cache",
];

/// The desired configuration of a container block's instance: its set attributes, typed, and
/// its `ready` checks.
pub fn desired(values: &Map<String, Value>, ready: Vec<ReadyCheck>) -> Result<Desired, String> {
    let mut out = serde_json::Map::new();
    for k in ATTRIBUTES {
        match values.get(*k) {
            None | Some(Value::Null) => {}
            // A map entry set to null is not set, as an attribute set to null is not: a
            // launcher's `VLLM_API_KEY = var.api_key` without a key adds no variable.
            Some(Value::Object(m)) => {
                let set = m.iter().filter(|(_, v)| !v.is_null());
                let m: serde_json::Map<_, _> = set.map(|(k, v)| (k.clone(), to_json(v))).collect();
                out.insert((*k).to_string(), serde_json::Value::Object(m));
            }
            Some(v) => {
                out.insert((*k).to_string(), to_json(v));
            }
        }
    }
    // A need's node may be written as the node (`node.spark1`): its address is kept.
    if let Some(serde_json::Value::Array(needs)) = out.get_mut("memory") {
        for need in needs.iter_mut() {
            if let Some(id) = need.get("node").and_then(|n| n.get("id")).cloned() {
                need["node"] = id;
            }
        }
    }
    let mut desired = Desired::from_config(&serde_json::Value::Object(out))?;
    desired.ready = ready;
    Ok(desired)
}

/// `memory`: a list of `{ node, min_free_gib, drop_page_cache, timeout }`.
fn check_memory(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    let Some(v) = values.get("memory").filter(|v| !v.is_null()) else {
        return;
    };
    let help = "memory = [{ node = node.spark1, min_free_gib = 95, drop_page_cache = [\"/path/to/weights\"], timeout = 120 }]";
    let Value::Array(needs) = v else {
        out.push(Problem::new("memory", "memory is not a list", help));
        return;
    };
    for need in needs {
        let Value::Object(m) = need else {
            out.push(Problem::new(
                "memory",
                "an entry of memory is not an object",
                help,
            ));
            continue;
        };
        if let Some(k) = m
            .keys()
            .find(|k| !["node", "min_free_gib", "drop_page_cache", "timeout"].contains(&k.as_str()))
        {
            out.push(Problem::new(
                "memory",
                format!("memory has no attribute {k:?}"),
                help,
            ));
        }
        let node_ok = match m.get("node") {
            Some(Value::String(s)) => s.starts_with("node.") && !has_control(s),
            Some(Value::Object(n)) => n.get("kind").and_then(Value::as_str) == Some("node"),
            _ => false,
        };
        if !node_ok {
            out.push(Problem::new(
                "memory",
                "a memory entry's node is not a node",
                help,
            ));
        }
        let gib = m.get("min_free_gib").and_then(|n| n.as_f64());
        if !gib.is_some_and(|g| g.is_finite() && (0.0..=1_048_576.0).contains(&g)) {
            out.push(Problem::new(
                "memory",
                "a memory entry's min_free_gib is not a number of GiB from 0",
                help,
            ));
        }
        if let Some(t) = m.get("timeout").filter(|t| !t.is_null()) {
            if !t.as_u64().is_some_and(|t| (1..=86_400).contains(&t)) {
                out.push(Problem::new(
                    "memory",
                    "a memory entry's timeout is not 1 to 86400 seconds",
                    help,
                ));
            }
        }
        match m.get("drop_page_cache") {
            None | Some(Value::Null) => {}
            Some(Value::Array(paths))
                if paths.iter().all(|p| {
                    p.as_str()
                        .is_some_and(|p| p.starts_with('/') && !has_control(p))
                }) => {}
            Some(_) => out.push(Problem::new(
                "memory",
                "drop_page_cache is not a list of absolute paths",
                help,
            )),
        }
    }
}

/// One `ready { … }` block as configuration: exactly one of exec, http, tcp.
pub fn ready_config(values: &Map<String, Value>) -> Result<ReadyCheck, String> {
    let kinds: Vec<&str> = ["exec", "http", "tcp"]
        .into_iter()
        .filter(|k| values.get(*k).is_some_and(|v| !v.is_null()))
        .collect();
    if kinds.len() != 1 {
        return Err(if kinds.is_empty() {
            "no check: set one of exec, http or tcp".into()
        } else {
            format!("{} set together; set exactly one", kinds.join(" and "))
        });
    }
    if let Some(Value::String(url)) = values.get("http") {
        if !url.starts_with("http://") {
            return Err(format!("{url:?} is not an http:// URL"));
        }
        crate::schema::parse_url(url)?;
    }
    if let Some(Value::String(addr)) = values.get("tcp") {
        if !addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        {
            return Err(format!("{addr:?} is not HOST:PORT"));
        }
    }
    if let Some(Value::Array(cmd)) = values.get("exec") {
        if cmd.is_empty() {
            return Err("exec needs a command: [\"program\", \"arg\", …]".into());
        }
    }
    for attr in ["fail_on_log", "warn_on_log"] {
        if let Some(Value::Object(patterns)) = values.get(attr) {
            for p in patterns.keys() {
                if let Err(e) = regex::Regex::new(p) {
                    return Err(format!(
                        "{attr} pattern {p:?} is not a regular expression: {e}"
                    ));
                }
            }
        }
    }
    if let Some(Value::Object(patterns)) = values.get("progress") {
        for p in patterns.keys() {
            progress::check_pattern(p)?;
        }
    }
    if let Some(Value::Object(named)) = values.get("record_from_log") {
        for (name, p) in named {
            let p = p.as_str().unwrap_or_default();
            if let Err(e) = regex::Regex::new(p) {
                return Err(format!(
                    "record_from_log pattern {p:?} ({name}) is not a regular expression: {e}"
                ));
            }
        }
    }
    let mut out = serde_json::Map::new();
    for (k, v) in values {
        if !v.is_null() {
            out.insert(k.clone(), to_json(v));
        }
    }
    serde_json::from_value(serde_json::Value::Object(out)).map_err(|e| e.to_string())
}

fn s<'a>(values: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    values.get(k).and_then(Value::as_str)
}

fn strings<'a>(values: &'a Map<String, Value>, k: &str) -> Vec<&'a str> {
    match values.get(k) {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn has_control(s: &str) -> bool {
    s.chars().any(|c| c.is_control())
}

/// Values Docker or a shell would misread, reported per attribute.
pub fn check(values: &Map<String, Value>) -> Vec<Problem> {
    let mut out = Vec::new();
    check_name_and_image(values, &mut out);
    check_modes(values, &mut out);
    check_mounts(values, &mut out);
    check_env_and_labels(values, &mut out);
    check_limits_paths_and_args(values, &mut out);
    check_memory(values, &mut out);
    check_watch_on_log(values, &mut out);
    check_cache(values, &mut out);
    out
}

/// `cache = { host = "/abs", path = "/abs", skips = ["phase", …] }`.
fn check_cache(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    let Some(v) = values.get("cache").filter(|v| !v.is_null()) else {
        return;
    };
    let help = "cache = { host = \"/var/cache/sparkform-jit\", path = \"/root/.cache/sparkform-jit\", skips = [\"compiling\"] }";
    let Value::Object(m) = v else {
        out.push(Problem::new("cache", "cache is not an object", help));
        return;
    };
    for k in m.keys() {
        if !matches!(k.as_str(), "host" | "path" | "skips") {
            out.push(Problem::new(
                "cache",
                format!("cache has no attribute {k:?}"),
                help,
            ));
        }
    }
    for k in ["host", "path"] {
        let ok = match m.get(k) {
            Some(Value::String(p)) => {
                p.starts_with('/')
                    && p.len() > 1
                    && !has_control(p)
                    && !p.contains(':')
                    && !p.contains(',')
                    && !p.split('/').any(|part| part == "..")
            }
            _ => false,
        };
        if !ok {
            out.push(Problem::new(
                "cache",
                format!("cache's {k} is not an absolute path (without `..`, `:` or `,`)"),
                help,
            ));
        }
    }
    match m.get("skips") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.iter().all(|x| x.is_string()) => {}
        Some(_) => out.push(Problem::new(
            "cache",
            "cache's skips is not a list of `progress` phase labels",
            help,
        )),
    }
}

/// `watch_on_log`'s patterns are regular expressions.
fn check_watch_on_log(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    if let Some(Value::Object(patterns)) = values.get("watch_on_log") {
        for p in patterns.keys() {
            if let Err(e) = regex::Regex::new(p) {
                out.push(Problem::new(
                    "watch_on_log",
                    format!("{p:?} is not a regular expression: {e}"),
                    "Rust regex syntax, like RE2: escape `[`, `(` and `.` with `\\\\`",
                ));
            }
        }
    }
}

/// The container's name and image reference.
fn check_name_and_image(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    if let Some(name) = s(values, "name") {
        let ok = name.len() <= 128
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok {
            out.push(Problem::new(
                "name",
                format!("{name:?} is not a valid container name"),
                "Docker container names are letters, digits, `_`, `.` and `-`, starting with a letter or digit",
            ));
        }
    }
    if let Some(image) = s(values, "image") {
        if image.is_empty()
            || image.chars().any(|c| c.is_whitespace() || c.is_control())
            || image.starts_with('-')
        {
            out.push(Problem::new(
                "image",
                format!("{image:?} is not an image reference"),
                "write REPOSITORY[:TAG] or REPOSITORY@sha256:DIGEST",
            ));
        }
    }
}

/// The namespace modes and the restart policy.
fn check_modes(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    for (attr, allowed) in [
        ("network_mode", &["host", "bridge", "none"][..]),
        ("ipc_mode", &["host", "private", "shareable", "none"][..]),
        ("pid_mode", &["host"][..]),
    ] {
        let Some(mode) = s(values, attr) else {
            continue;
        };
        let ok = allowed.contains(&mode)
            || mode.strip_prefix("container:").is_some_and(|c| {
                !c.is_empty()
                    && c.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            });
        if !ok {
            out.push(Problem::new(
                match attr {
                    "network_mode" => "network_mode",
                    "ipc_mode" => "ipc_mode",
                    _ => "pid_mode",
                },
                format!("{mode:?} is not a {attr}"),
                format!("use one of {} or \"container:NAME\"", allowed.join(", ")),
            ));
        }
    }
    if let Some(r) = s(values, "restart") {
        let ok = matches!(r, "no" | "always" | "unless-stopped" | "on-failure")
            || r.strip_prefix("on-failure:")
                .is_some_and(|n| n.parse::<u32>().is_ok());
        if !ok {
            out.push(Problem::new(
                "restart",
                format!("{r:?} is not a restart policy"),
                "use no, always, unless-stopped, on-failure or on-failure:N",
            ));
        }
    }
}

/// Volumes and devices.
fn check_mounts(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    for v in strings(values, "volumes") {
        if let Err(msg) = check_volume(v) {
            out.push(Problem::new("volumes", msg, "write HOST_PATH:CONTAINER_PATH[:ro] with absolute paths, or VOLUME_NAME:CONTAINER_PATH"));
        }
    }
    for d in strings(values, "devices") {
        let parts: Vec<&str> = d.split(':').collect();
        let ok = !has_control(d)
            && (1..=3).contains(&parts.len())
            && parts.iter().take(2).all(|p| p.starts_with("/dev/"))
            && parts
                .get(2)
                .is_none_or(|p| !p.is_empty() && p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')));
        if !ok {
            out.push(Problem::new(
                "devices",
                format!("{d:?} is not a device mapping"),
                "write /dev/HOST[:/dev/CONTAINER[:rwm]]",
            ));
        }
    }
}

/// Environment names and values, and labels off sparkform's prefix.
fn check_env_and_labels(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    if let Some(Value::Object(env)) = values.get("env") {
        for (k, v) in env {
            let key_ok = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !key_ok {
                out.push(Problem::new(
                    "env",
                    format!("{k:?} is not an environment variable name"),
                    "names are letters, digits and `_`, not starting with a digit",
                ));
            }
            if v.as_str().is_some_and(|s| s.contains('\0')) {
                out.push(Problem::new(
                    "env",
                    format!("the value of {k} contains a NUL byte"),
                    "environment values cannot hold NUL",
                ));
            }
        }
    }
    if let Some(Value::Object(labels)) = values.get("labels") {
        for k in labels.keys() {
            if k.starts_with(LABEL_PREFIX) {
                out.push(Problem::new(
                    "labels",
                    format!("label {k:?} uses the reserved prefix {LABEL_PREFIX:?}"),
                    "sparkform sets these labels itself; choose another prefix",
                ));
            }
        }
    }
}

/// Ulimits, paths, and the arguments of command and entrypoint.
fn check_limits_paths_and_args(values: &Map<String, Value>, out: &mut Vec<Problem>) {
    if let Some(Value::Object(ulimits)) = values.get("ulimits") {
        for (k, v) in ulimits {
            let text = v.as_str().unwrap_or_default();
            let num_ok = |p: &str| p == "-1" || p == "unlimited" || p.parse::<u64>().is_ok();
            let ok = k.chars().all(|c| c.is_ascii_lowercase())
                && match text.split_once(':') {
                    Some((soft, hard)) => num_ok(soft) && num_ok(hard),
                    None => num_ok(text),
                };
            if !ok {
                out.push(Problem::new(
                    "ulimits",
                    format!("ulimit {k} = {text:?} is not LIMIT or SOFT:HARD"),
                    "e.g. memlock = \"-1\", stack = \"67108864\", nofile = \"65536:65536\"",
                ));
            }
        }
    }
    for (attr, path) in [
        ("working_dir", s(values, "working_dir")),
        ("image_archive", s(values, "image_archive")),
    ] {
        if let Some(p) = path {
            if p.is_empty() || has_control(p) || (attr == "working_dir" && !p.starts_with('/')) {
                out.push(Problem::new(
                    if attr == "working_dir" {
                        "working_dir"
                    } else {
                        "image_archive"
                    },
                    format!("{p:?} is not a usable path"),
                    "paths must not be empty or hold control characters; working_dir is absolute",
                ));
            }
        }
    }
    for attr in ["command", "entrypoint"] {
        if strings(values, attr).iter().any(|a| a.contains('\0')) {
            out.push(Problem::new(
                if attr == "command" {
                    "command"
                } else {
                    "entrypoint"
                },
                "an argument contains a NUL byte",
                "arguments cannot hold NUL",
            ));
        }
    }
}

fn check_volume(v: &str) -> Result<(), String> {
    if has_control(v) {
        return Err(format!("{v:?} contains a control character"));
    }
    let parts: Vec<&str> = v.split(':').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(format!("{v:?} is not SOURCE:TARGET[:OPTIONS]"));
    }
    let (src, dst) = (parts[0], parts[1]);
    let named = src
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && src
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !(src.starts_with('/') || named) {
        return Err(format!(
            "source {src:?} is neither an absolute path nor a volume name"
        ));
    }
    if !dst.starts_with('/') {
        return Err(format!("target {dst:?} is not an absolute path"));
    }
    if [src, dst].iter().any(|p| p.split('/').any(|c| c == "..")) {
        return Err(format!("{v:?} uses `..`; write the path it means"));
    }
    if let Some(opts) = parts.get(2) {
        for o in opts.split(',') {
            if !matches!(
                o,
                "ro" | "rw"
                    | "z"
                    | "Z"
                    | "shared"
                    | "slave"
                    | "private"
                    | "rshared"
                    | "rslave"
                    | "rprivate"
                    | "nocopy"
            ) {
                return Err(format!("unknown volume option {o:?}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn volumes() {
        assert!(check_volume("/data/hf:/root/.cache/huggingface").is_ok());
        assert!(check_volume("/tmp/ray:/tmp/ray:rw").is_ok());
        assert!(check_volume("hfcache:/cache:ro").is_ok());
        assert!(check_volume("relative:/x").is_ok(), "a named volume");
        assert!(check_volume("./rel:/x").is_err());
        assert!(check_volume("/a:rel").is_err());
        assert!(check_volume("/a/../etc:/x").is_err());
        assert!(check_volume("/a:/b:bogus").is_err());
        assert!(check_volume("/a\n:/b").is_err());
    }

    #[test]
    fn a_cache_names_two_absolute_paths_and_phase_labels() {
        let cache = |v: hcl::Value| {
            let mut out = Vec::new();
            check_cache(&map(&[("cache", v)]), &mut out);
            out.into_iter().map(|p| p.message).collect::<Vec<_>>()
        };
        let good: hcl::Value = hcl::value!({ host = "/var/cache/jit", path = "/root/.cache/jit", skips = ["compiling"] });
        assert!(cache(good).is_empty());
        assert_eq!(
            cache(hcl::value!({ host = "/var/../etc", path = "rel" })),
            [
                "cache's host is not an absolute path (without `..`, `:` or `,`)",
                "cache's path is not an absolute path (without `..`, `:` or `,`)"
            ]
        );
        assert_eq!(
            cache(hcl::value!({ host = "/a:/b", path = "/c", skips = "compiling", size = 3 })),
            [
                "cache has no attribute \"size\"",
                "cache's host is not an absolute path (without `..`, `:` or `,`)",
                "cache's skips is not a list of `progress` phase labels"
            ]
        );
        assert_eq!(cache(Value::from("/x")), ["cache is not an object"]);
        // The folder is keyed by a hexadecimal ID only, so nothing else joins the path.
        let c = CacheMount {
            host: "/var/cache/jit/".into(),
            path: "/c".into(),
            skips: Vec::new(),
        };
        assert_eq!(
            c.folder("sha256:ab12").as_deref(),
            Some("/var/cache/jit/ab12")
        );
        assert_eq!(c.folder("sha256:../../etc"), None);
        assert_eq!(c.folder(""), None);
    }

    #[test]
    fn bad_values_are_reported_per_attribute() {
        let v = map(&[
            ("name", Value::from("ray head")),
            ("restart", Value::from("sometimes")),
            ("network_mode", Value::from("host; rm -rf /")),
            (
                "labels",
                Value::Object(map(&[("sparkform.address", Value::from("x"))])),
            ),
        ]);
        let attrs: Vec<&str> = check(&v).iter().map(|p| p.attribute).collect();
        assert_eq!(attrs, ["name", "network_mode", "restart", "labels"]);
    }

    #[test]
    fn ready_needs_exactly_one_check() {
        assert!(ready_config(&map(&[])).is_err());
        let both = map(&[
            ("http", Value::from("http://127.0.0.1:1/health")),
            ("tcp", Value::from("127.0.0.1:1")),
        ]);
        assert!(ready_config(&both).unwrap_err().contains("http and tcp"));
        let ok = ready_config(&map(&[("tcp", Value::from("127.0.0.1:6379"))])).unwrap();
        assert_eq!(ok.timeout_secs(), 300);
    }
}

//! Import: a container started by hand, observed with `docker inspect` and mapped to the
//! container's desired configuration.

use super::*;

/// The note an import of an unlabelled container carries into the plan.
pub const NOTE_UNLABELLED: &str = "it was started without sparkform's labels (Docker cannot add labels to a running container): the state tracks it by its container ID, and the labels come with its next replacement";

/// Import `object` (a container's name or ID) on `host`: inspect it and its image, and map what
/// runs to the container's desired shape.
pub async fn import_container(
    host: &dyn Host,
    address: &str,
    object: &str,
    desired: Option<&Desired>,
) -> Result<crate::kinds::machine::Imported, StepError> {
    let node = host.node().to_string();
    if object.is_empty() || object.chars().any(|c| c.is_control() || c == '/') {
        return Err(StepError::new(format!(
            "{address}: {object:?} is not a container name or ID"
        ))
        .help("write the id as NODE:CONTAINER, e.g. \"spark1:vllm\""));
    }
    let docker = host.docker().await?;
    let inspect = match docker
        .inspect_container(object, None::<q::InspectContainerOptions>)
        .await
    {
        Ok(i) => i,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            return Err(StepError::new(format!(
                "{address}: there is no container {object} on {node}"
            ))
            .help(format!(
                "`docker ps -a` on {node} lists its containers; the id is NODE:NAME or NODE:CONTAINER_ID"
            )))
        }
        Err(e) => return Err(docker_err(&format!("{node}: cannot inspect {object}"), e)),
    };
    let inspect = serde_json::to_value(&inspect).unwrap_or_default();
    let image_ref = inspect
        .pointer("/Config/Image")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let image_id = inspect
        .get("Image")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    // The image's own defaults (env, command, labels) are not the container's settings. The
    // image the container runs, by ID: the tag may have moved since.
    let image = match docker.inspect_image(&image_id).await {
        Ok(i) => serde_json::to_value(&i).unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    };
    let config = imported_config(&inspect, &image, address, &node, desired);
    // An env var the definition does not set may hold a token: never shown, never in clear.
    let wanted_env = desired.and_then(|d| d.env.as_ref());
    let secret_paths = config
        .env
        .iter()
        .flatten()
        .filter(|(k, _)| wanted_env.is_none_or(|w| !w.contains_key(*k)))
        .map(|(k, _)| vec!["env".to_string(), k.clone()])
        .collect();
    let repo_digests = image
        .get("RepoDigests")
        .and_then(|d| d.as_array())
        .map(|d| {
            d.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let image_digest = crate::runtime::image::ImageSeen {
        id: image_id.clone(),
        repo_digests,
    }
    .digest(&image_ref);
    let recorded = Recorded {
        container_id: inspect["Id"].as_str().map(str::to_string),
        image_id: Some(image_id),
        image_digest: Some(image_digest),
        ..Recorded::default()
    };
    let mut notes = Vec::new();
    let labelled = inspect
        .pointer("/Config/Labels")
        .and_then(|l| l.as_object())
        .is_some_and(|l| l.contains_key(LABEL_ADDRESS));
    if !labelled {
        notes.push(NOTE_UNLABELLED.to_string());
    }
    if image_ref.is_empty() {
        notes.push("Docker reports no image reference for it".into());
    }
    Ok(crate::kinds::machine::Imported {
        config: crate::kind::Configuration::of(config),
        attributes: crate::kind::Attributes::of(&recorded),
        notes,
        secret_paths,
    })
}

pub(super) fn text_list(v: Option<&serde_json::Value>) -> Vec<String> {
    strs(v).unwrap_or_default()
}

/// `K=V` entries as a map.
pub(super) fn env_map(v: Option<&serde_json::Value>) -> serde_json::Map<String, serde_json::Value> {
    text_list(v)
        .into_iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) => (k.to_string(), serde_json::json!(v)),
            None => (e, serde_json::json!("")),
        })
        .collect()
}

/// Docker keeps binds, devices and capabilities in no promised order (the order means nothing to
/// it): the ones the definition lists come in its order, then the others as Docker gave them.
pub(super) fn in_desired_order(mut observed: Vec<String>, wanted: &[String]) -> Vec<String> {
    observed.sort_by_key(|o| wanted.iter().position(|w| w == o).unwrap_or(usize::MAX));
    observed
}

pub(super) fn cap_name(c: &str) -> String {
    let up = c.to_ascii_uppercase();
    up.strip_prefix("CAP_").unwrap_or(&up).to_string()
}

/// What runs, as the container's desired configuration. Where what runs means what `desired`
/// says in other words (a device written short, a ulimit as one number, `CAP_` prefixes), the
/// desired text is kept, so a container started with the same settings plans no change. Values
/// at Docker's or the image's default are left out unless `desired` sets them so. Pure.
///
/// Docker's answers are JSON read by path; what `desired` says is compared attribute by
/// attribute with what runs (`Seen::put`), so it is read in its JSON form.
pub fn imported_config(
    inspect: &serde_json::Value,
    image: &serde_json::Value,
    address: &str,
    node: &str,
    desired: Option<&Desired>,
) -> Desired {
    let wanted = desired.map(Desired::to_config);
    let seen = Seen {
        inspect,
        image,
        desired: wanted.as_ref(),
    };
    let mut out = serde_json::Map::new();
    seen.identity_and_process(&mut out, address, node);
    seen.namespaces(&mut out);
    seen.gpus_and_devices(&mut out);
    seen.mounts_and_limits(&mut out);
    seen.user_restart_and_labels(&mut out);
    seen.sparkforms_own(&mut out);
    // Every value above has the attribute's type, so this cannot fail; if it did, the import
    // would record what Docker says alone.
    Desired::from_config(&serde_json::Value::Object(out)).unwrap_or_default()
}

type Attrs = serde_json::Map<String, serde_json::Value>;

/// What `imported_config` reads: `docker inspect` of the container and of its image, and the
/// definition's desired configuration (when there is one); one phase per group of attributes.
struct Seen<'a> {
    inspect: &'a serde_json::Value,
    image: &'a serde_json::Value,
    desired: Option<&'a serde_json::Value>,
}

/// A string value, or empty.
fn text(v: Option<&serde_json::Value>) -> String {
    v.and_then(|v| v.as_str()).unwrap_or_default().to_string()
}

impl<'a> Seen<'a> {
    fn want(&self, k: &str) -> Option<&'a serde_json::Value> {
        self.desired.and_then(|d| d.get(k))
    }

    fn cfg(&self, p: &str) -> Option<&'a serde_json::Value> {
        self.inspect.pointer(&format!("/Config/{p}"))
    }

    fn hc(&self, p: &str) -> Option<&'a serde_json::Value> {
        self.inspect.pointer(&format!("/HostConfig/{p}"))
    }

    fn img(&self, p: &str) -> Option<&'a serde_json::Value> {
        self.image.pointer(&format!("/Config/{p}"))
    }

    /// A value at its default is recorded only when the definition asks for that very value.
    fn put(&self, out: &mut Attrs, k: &str, v: serde_json::Value, default: bool) {
        if !default || self.want(k) == Some(&v) {
            out.insert(k.to_string(), v);
        }
    }

    /// The name (unless it is the default one), node, image, command, entrypoint, and the
    /// environment the image does not set.
    fn identity_and_process(&self, out: &mut Attrs, address: &str, node: &str) {
        use serde_json::{json, Value};
        let name = self
            .inspect
            .get("Name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string();
        let default_name = address.replace(['[', ']', '"'], "_");
        self.put(out, "name", json!(name), name == default_name);
        out.insert(
            "node".into(),
            self.want("node").cloned().unwrap_or_else(|| json!(node)),
        );
        out.insert(
            "image".into(),
            self.cfg("Image").cloned().unwrap_or(Value::Null),
        );
        for (k, key) in [("command", "Cmd"), ("entrypoint", "Entrypoint")] {
            let v = text_list(self.cfg(key));
            let default = v == text_list(self.img(key));
            self.put(out, k, json!(v), default);
        }
        let image_env = env_map(self.img("Env"));
        let wanted_env = self.want("env").and_then(|e| e.as_object());
        let env: serde_json::Map<String, Value> = env_map(self.cfg("Env"))
            .into_iter()
            .filter(|(k, v)| {
                let from_image = image_env.get(k) == Some(v)
                    || (k == "PATH"
                        && v == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
                !from_image || wanted_env.is_some_and(|w| w.get(k) == Some(v))
            })
            .collect();
        self.put(out, "env", Value::Object(env.clone()), env.is_empty());
    }

    /// Network, IPC and PID modes and the shared memory size, unless at Docker's defaults.
    fn namespaces(&self, out: &mut Attrs) {
        use serde_json::json;
        let network = text(self.hc("NetworkMode"));
        self.put(
            out,
            "network_mode",
            json!(network),
            matches!(network.as_str(), "" | "default" | "bridge"),
        );
        let ipc = text(self.hc("IpcMode"));
        self.put(
            out,
            "ipc_mode",
            json!(ipc),
            matches!(ipc.as_str(), "" | "private" | "shareable"),
        );
        let pid = text(self.hc("PidMode"));
        self.put(out, "pid_mode", json!(pid), pid.is_empty());
        let shm = self.hc("ShmSize").and_then(|v| v.as_i64()).unwrap_or(0);
        self.put(
            out,
            "shm_size",
            json!(shm),
            shm == 0 || shm == 64 * 1024 * 1024,
        );
    }

    /// The GPUs asked for and the devices, written as the definition writes them.
    fn gpus_and_devices(&self, out: &mut Attrs) {
        use serde_json::json;
        let gpus = self
            .hc("DeviceRequests")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .find(|r| {
                r.get("Capabilities")
                    .and_then(|c| c.as_array())
                    .into_iter()
                    .flatten()
                    .any(|set| text_list(Some(set)).iter().any(|c| c == "gpu"))
            })
            .map(|r| {
                let ids = text_list(r.get("DeviceIDs"));
                match r.get("Count").and_then(|c| c.as_i64()) {
                    Some(-1) => json!("all"),
                    Some(n) if n > 0 => json!(n),
                    _ if !ids.is_empty() => json!(ids.len()),
                    _ => json!("all"),
                }
            });
        if let Some(g) = gpus {
            out.insert("gpus".into(), g);
        }
        let wanted_devices = text_list(self.want("devices"));
        let devices: Vec<String> = self
            .hc("Devices")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .map(|d| {
                let triple = (
                    text(d.get("PathOnHost")),
                    text(d.get("PathInContainer")),
                    text(d.get("CgroupPermissions")),
                );
                wanted_devices
                    .iter()
                    .find(|w| device_triple(w) == triple)
                    .cloned()
                    .unwrap_or_else(|| format!("{}:{}:{}", triple.0, triple.1, triple.2))
            })
            .collect();
        let devices = in_desired_order(devices, &wanted_devices);
        self.put(out, "devices", json!(devices), devices.is_empty());
    }

    /// Volumes, ulimits, added capabilities and privilege, written as the definition writes them.
    fn mounts_and_limits(&self, out: &mut Attrs) {
        use serde_json::{json, Value};
        let mut volumes = text_list(self.hc("Binds"));
        for m in self
            .hc("Mounts")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let (src, dst) = (text(m.get("Source")), text(m.get("Target")));
            let ro = m.get("ReadOnly").and_then(|v| v.as_bool()) == Some(true);
            volumes.push(format!("{src}:{dst}{}", if ro { ":ro" } else { "" }));
        }
        // The cache folder sparkform mounts for the image (`cache`) is no volume of the
        // definitions: a container that mounts the wanted one is taken as this `cache`.
        if let Some(cache) = self.want("cache") {
            let host = cache
                .get("host")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            let path = cache
                .get("path")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            let prefix = format!("{}/", host.trim_end_matches('/'));
            volumes.retain(|v| {
                let mut parts = v.split(':');
                let (src, dst) = (parts.next().unwrap_or_default(), parts.next());
                let key = src.strip_prefix(&prefix).unwrap_or_default();
                let is_cache = !key.is_empty()
                    && key.chars().all(|c| c.is_ascii_hexdigit())
                    && dst == Some(path);
                !is_cache
            });
        }
        let volumes = in_desired_order(volumes, &text_list(self.want("volumes")));
        self.put(out, "volumes", json!(volumes), volumes.is_empty());
        let wanted_ulimits = self.want("ulimits").and_then(|u| u.as_object());
        let ulimits: serde_json::Map<String, Value> = self
            .hc("Ulimits")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|u| {
                let name = u.get("Name")?.as_str()?.to_string();
                let soft = u.get("Soft").and_then(|v| v.as_i64()).unwrap_or(-1);
                let hard = u.get("Hard").and_then(|v| v.as_i64()).unwrap_or(soft);
                let same = wanted_ulimits
                    .and_then(|w| w.get(&name))
                    .and_then(|w| w.as_str())
                    .filter(|w| ulimit_pair(w) == (soft, hard));
                let text = match same {
                    Some(w) => w.to_string(),
                    None if soft == hard => soft.to_string(),
                    None => format!("{soft}:{hard}"),
                };
                Some((name, json!(text)))
            })
            .collect();
        self.put(
            out,
            "ulimits",
            Value::Object(ulimits.clone()),
            ulimits.is_empty(),
        );
        let wanted_caps = text_list(self.want("cap_add"));
        let caps: Vec<String> = text_list(self.hc("CapAdd"))
            .into_iter()
            .map(|c| {
                wanted_caps
                    .iter()
                    .find(|w| cap_name(w) == cap_name(&c))
                    .cloned()
                    .unwrap_or(c)
            })
            .collect();
        let caps = in_desired_order(caps, &wanted_caps);
        self.put(out, "cap_add", json!(caps), caps.is_empty());
        let privileged = self
            .hc("Privileged")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        self.put(out, "privileged", json!(privileged), !privileged);
    }

    /// User, working folder, restart policy, and the labels that are neither sparkform's nor
    /// the image's.
    fn user_restart_and_labels(&self, out: &mut Attrs) {
        use serde_json::{json, Value};
        for (k, key) in [("user", "User"), ("working_dir", "WorkingDir")] {
            let v = text(self.cfg(key));
            let default = v.is_empty() || v == text(self.img(key));
            self.put(out, k, json!(v), default);
        }
        let policy = text(self.hc("RestartPolicy/Name"));
        let retries = self
            .hc("RestartPolicy/MaximumRetryCount")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        let restart = match policy.as_str() {
            "" => "no".to_string(),
            "on-failure" if retries > 0 => format!("on-failure:{retries}"),
            p => p.to_string(),
        };
        self.put(out, "restart", json!(restart), restart == "no");
        let image_labels = self.img("Labels").and_then(|l| l.as_object());
        let labels: serde_json::Map<String, Value> = self
            .cfg("Labels")
            .and_then(|l| l.as_object())
            .into_iter()
            .flatten()
            .filter(|(k, v)| {
                !k.starts_with(super::super::LABEL_PREFIX)
                    && image_labels.and_then(|i| i.get(*k)) != Some(v)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.put(
            out,
            "labels",
            Value::Object(labels.clone()),
            labels.is_empty(),
        );
    }

    /// What Docker does not keep and sparkform decides: how the image got there, the stop
    /// timeout, the ready checks, the log lines `watch` acts on, the memory a start needs, the
    /// cache folder.
    fn sparkforms_own(&self, out: &mut Attrs) {
        use serde_json::json;
        // What Docker does not keep: how the image got there is sparkform's to decide.
        for k in ["pull", "image_archive"] {
            if let Some(v) = self.want(k) {
                out.insert(k.into(), v.clone());
            }
        }
        match self.cfg("StopTimeout").and_then(|v| v.as_i64()) {
            Some(t) => self.put(out, "stop_timeout", json!(t), false),
            None => {
                if self.want("stop_timeout") == Some(&json!(10)) {
                    out.insert("stop_timeout".into(), json!(10));
                }
            }
        }
        // The ready checks are sparkform's own: a running container passed them or it would
        // not run.
        // So are what it watches its log for, what its start needs of memory and its cache
        // folder (a container without it gets it with its next replacement).
        for k in ["ready", "watch_on_log", "memory", "cache"] {
            if let Some(v) = self.want(k) {
                out.insert(k.into(), v.clone());
            }
        }
    }
}

//! A container on a node's Docker Engine.

use hcl::{Map, Value};

use super::Problem;

/// Docker can change a restart policy on a running container; sparkform's ready checks are its
/// own. Everything else needs a new container.
pub const IN_PLACE: &[&str] = &["restart", "ready"];

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
];

/// The canonical desired configuration: set attributes only, `ready` checks last.
pub fn desired_config(
    values: &Map<String, Value>,
    ready: Vec<serde_json::Value>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for k in ATTRIBUTES {
        match values.get(*k) {
            None | Some(Value::Null) => {}
            Some(v) => {
                out.insert((*k).to_string(), to_json(v));
            }
        }
    }
    if !ready.is_empty() {
        out.insert("ready".into(), serde_json::Value::Array(ready));
    }
    serde_json::Value::Object(out)
}

pub fn to_json(v: &Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// One `ready { … }` block as configuration: exactly one of exec, http, tcp.
pub fn ready_config(values: &Map<String, Value>) -> Result<serde_json::Value, String> {
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
    if let Some(Value::Object(patterns)) = values.get("fail_on_log") {
        for p in patterns.keys() {
            if let Err(e) = regex::Regex::new(p) {
                return Err(format!(
                    "fail_on_log pattern {p:?} is not a regular expression: {e}"
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
    out.entry("timeout").or_insert(serde_json::json!(300));
    out.entry("interval").or_insert(serde_json::json!(2));
    Ok(serde_json::Value::Object(out))
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
    out
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

// ----- on the machine -----

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters as q;
use futures_util::StreamExt;

use super::{Applied, Handler, StepCx, StepError};
use crate::plan::Action;

pub struct ContainerHandler;

/// Docker answers 304 when a container is already in the asked state: that is success.
fn already_so(r: Result<(), bollard::errors::Error>) -> Result<(), bollard::errors::Error> {
    match r {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 304, ..
        }) => Ok(()),
        other => other,
    }
}

/// Whether a Docker client error means the connection to the node is gone (not a refusal).
fn connection_lost(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    matches!(
        e,
        E::HyperLegacyError { .. }
            | E::IOError { .. }
            | E::RequestTimeoutError
            | E::HyperResponseError { .. }
    )
}

fn docker_err(what: &str, e: bollard::errors::Error) -> StepError {
    match e {
        e if connection_lost(&e) => {
            StepError::new(format!("{what}: the connection to the node's Docker Engine was lost ({e})"))
                .help("the node or its network went down during the step; check it, then run apply again (the state records what was done)")
        }
        e => StepError::new(format!("{what}: {e}")),
    }
}

fn strs(v: Option<&serde_json::Value>) -> Option<Vec<String>> {
    v.and_then(|v| v.as_array()).map(|a| {
        a.iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    })
}

fn restart_policy(text: &str) -> RestartPolicy {
    let (name, count) = match text.split_once(':') {
        Some((n, c)) => (n, c.parse().ok()),
        None => (text, None),
    };
    RestartPolicy {
        name: Some(match name {
            "always" => RestartPolicyNameEnum::ALWAYS,
            "unless-stopped" => RestartPolicyNameEnum::UNLESS_STOPPED,
            "on-failure" => RestartPolicyNameEnum::ON_FAILURE,
            _ => RestartPolicyNameEnum::NO,
        }),
        maximum_retry_count: count,
    }
}

fn ulimit_value(s: &str) -> i64 {
    match s {
        "unlimited" | "-1" => -1,
        n => n.parse().unwrap_or(-1),
    }
}

/// The Docker API body for a desired configuration, with sparkform's labels.
pub fn create_body(
    desired: &serde_json::Value,
    lineage: &str,
    address: &str,
    config_hash: &str,
    config_dir: &std::path::Path,
) -> ContainerCreateBody {
    let _ = config_dir;
    let get = |k: &str| desired.get(k);
    let mut labels: HashMap<String, String> = get("labels")
        .and_then(|l| l.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    labels.insert(LABEL_LINEAGE.into(), lineage.into());
    labels.insert(LABEL_ADDRESS.into(), address.into());
    labels.insert(LABEL_CONFIG_HASH.into(), config_hash.into());
    let env: Option<Vec<String>> = get("env").and_then(|e| e.as_object()).map(|m| {
        m.iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                )
            })
            .collect()
    });
    let device_requests = match get("gpus") {
        Some(serde_json::Value::String(s)) if s == "all" => Some(-1),
        Some(serde_json::Value::Number(n)) => n.as_i64().filter(|n| *n > 0),
        _ => None,
    }
    .map(|count| {
        vec![DeviceRequest {
            driver: Some("nvidia".into()),
            count: Some(count),
            capabilities: Some(vec![vec!["gpu".into()]]),
            ..Default::default()
        }]
    });
    let devices = strs(get("devices")).map(|ds| {
        ds.iter()
            .map(|d| {
                let mut parts = d.split(':');
                let host = parts.next().unwrap_or_default().to_string();
                let inside = parts
                    .next()
                    .map(str::to_string)
                    .unwrap_or_else(|| host.clone());
                DeviceMapping {
                    path_on_host: Some(host),
                    path_in_container: Some(inside),
                    cgroup_permissions: Some(parts.next().unwrap_or("rwm").to_string()),
                }
            })
            .collect()
    });
    let ulimits = get("ulimits").and_then(|u| u.as_object()).map(|m| {
        m.iter()
            .map(|(name, v)| {
                let text = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string());
                let (soft, hard) = match text.split_once(':') {
                    Some((s, h)) => (ulimit_value(s), ulimit_value(h)),
                    None => (ulimit_value(&text), ulimit_value(&text)),
                };
                ResourcesUlimits {
                    name: Some(name.clone()),
                    soft: Some(soft),
                    hard: Some(hard),
                }
            })
            .collect()
    });
    ContainerCreateBody {
        image: get("image").and_then(|v| v.as_str()).map(str::to_string),
        cmd: strs(get("command")),
        entrypoint: strs(get("entrypoint")),
        env,
        labels: Some(labels),
        user: get("user").and_then(|v| v.as_str()).map(str::to_string),
        working_dir: get("working_dir")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        stop_timeout: get("stop_timeout").and_then(|v| v.as_i64()),
        host_config: Some(HostConfig {
            network_mode: get("network_mode")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            ipc_mode: get("ipc_mode").and_then(|v| v.as_str()).map(str::to_string),
            pid_mode: get("pid_mode").and_then(|v| v.as_str()).map(str::to_string),
            shm_size: get("shm_size").and_then(|v| v.as_i64()),
            device_requests,
            devices,
            binds: strs(get("volumes")),
            ulimits,
            cap_add: strs(get("cap_add")),
            privileged: get("privileged").and_then(|v| v.as_bool()),
            restart_policy: get("restart").and_then(|v| v.as_str()).map(restart_policy),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn name_of(cx: &StepCx<'_>) -> String {
    cx.desired_str("name")
        .map(str::to_string)
        .or_else(|| {
            cx.recorded
                .and_then(|r| r.config.get("name"))
                .and_then(|n| n.as_str())
                .map(str::to_string)
        })
        .or_else(|| cx.change.orphan.as_ref().map(|o| o.name.clone()))
        .unwrap_or_else(|| cx.address.replace(['[', ']', '"'], "_"))
}

/// How long a container may take to stop: its `stop_timeout`, else Docker's 10 s.
fn stop_secs(cx: &StepCx<'_>) -> i32 {
    cx.recorded
        .and_then(|r| r.config.get("stop_timeout"))
        .or_else(|| cx.desired.and_then(|d| d.get("stop_timeout")))
        .and_then(|v| v.as_i64())
        .map_or(10, |s| s.clamp(0, 3600) as i32)
}

/// The container the state (or refresh) knows for this resource.
fn recorded_id(cx: &StepCx<'_>) -> Option<String> {
    cx.change.orphan.as_ref().map(|o| o.id.clone()).or_else(|| {
        cx.recorded
            .and_then(|r| r.attributes.get("container_id"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    })
}

async fn ensure_image(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &serde_json::Value,
) -> Result<String, StepError> {
    let node = cx.change.node.clone().unwrap_or_default();
    let image = desired
        .get("image")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    if let Ok(i) = docker.inspect_image(image).await {
        return Ok(i.id.unwrap_or_default());
    }
    if let Some(archive) = desired.get("image_archive").and_then(|v| v.as_str()) {
        let path = cx.config_dir.join(archive);
        cx.progress(
            format!("loading {} into {node}", path.display()),
            None,
            None,
        );
        load_archive(docker, &path).await?;
    } else if desired.get("pull").and_then(|v| v.as_bool()) == Some(true) {
        cx.progress(format!("pulling {image} on {node}"), None, None);
        let mut stream = docker.create_image(
            Some(q::CreateImageOptions {
                from_image: Some(image.to_string()),
                ..Default::default()
            }),
            None,
            None,
        );
        while let Some(item) = stream.next().await {
            let info =
                item.map_err(|e| StepError::new(format!("{node}: pulling {image} failed: {e}")))?;
            if let Some(status) = info.status {
                cx.progress(format!("pulling {image}: {status}"), None, None);
            }
        }
    } else {
        return Err(StepError::new(format!("image {image} is not on {node}"))
            .help("load it there (`docker load`), set `image_archive = \"image.tar\"` to have sparkform load a saved image, or `pull = true` to pull it from a registry"));
    }
    docker
        .inspect_image(image)
        .await
        .map(|i| i.id.unwrap_or_default())
        .map_err(|e| {
            StepError::new(format!(
                "{node}: image {image} is still missing after loading it: {e}"
            ))
        })
}

async fn load_archive(docker: &bollard::Docker, path: &std::path::Path) -> Result<(), StepError> {
    let file = tokio::fs::File::open(path).await.map_err(|e| {
        StepError::new(format!(
            "cannot open the image archive {}: {e}",
            path.display()
        ))
    })?;
    let stream = tokio_util::io::ReaderStream::new(file);
    let mut out = docker.import_image_stream(
        q::ImportImageOptions {
            quiet: true,
            ..Default::default()
        },
        stream,
        None,
    );
    while let Some(item) = out.next().await {
        let info =
            item.map_err(|e| StepError::new(format!("loading {} failed: {e}", path.display())))?;
        if let Some(err) = info.error_detail.and_then(|d| d.message) {
            return Err(StepError::new(format!(
                "loading {} failed: {err}",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Run a command in a container; (exit code, stdout, stderr).
pub async fn exec_in(
    docker: &bollard::Docker,
    container: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<(i64, String, String), String> {
    let work = async {
        let exec = docker
            .create_exec(
                container,
                bollard::exec::CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(cmd.to_vec()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("cannot exec in {container}: {e}"))?;
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let bollard::exec::StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| format!("cannot start exec in {container}: {e}"))?
        {
            while let Some(Ok(chunk)) = output.next().await {
                match chunk {
                    bollard::container::LogOutput::StdErr { message } => {
                        stderr.push_str(&String::from_utf8_lossy(&message))
                    }
                    other => stdout.push_str(&other.to_string()),
                }
            }
        }
        let code = docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| e.to_string())?
            .exit_code
            .unwrap_or(-1);
        Ok((code, stdout, stderr))
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        format!(
            "`{}` did not finish within {} s",
            cmd.join(" "),
            timeout.as_secs()
        )
    })?
}

/// The last `n` log lines of a container.
pub async fn log_tail(docker: &bollard::Docker, container: &str, n: usize) -> Vec<String> {
    let mut stream = docker.logs(
        container,
        Some(q::LogsOptions {
            stdout: true,
            stderr: true,
            tail: n.to_string(),
            ..Default::default()
        }),
    );
    let mut text = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(&chunk.to_string());
    }
    text.lines().map(str::to_string).collect()
}

/// Exit code, OOM kill and the last 40 log lines: the evidence for a failed container.
async fn evidence(docker: &bollard::Docker, id: &str) -> (String, Vec<String>) {
    let mut summary = String::new();
    if let Ok(i) = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
    {
        if let Some(st) = i.state {
            if st.running == Some(true) {
                summary.push_str("still running");
            } else {
                summary.push_str(&format!("exited with code {}", st.exit_code.unwrap_or(-1)));
            }
            if st.oom_killed == Some(true) {
                summary.push_str(", killed for lack of memory (OOM)");
            }
        }
    }
    let mut logs = log_tail(docker, id, 40).await;
    if logs.is_empty() {
        logs.push("(no log output)".into());
    }
    (summary, logs)
}

/// Whether the container runs; Err when the node does not answer.
async fn running(docker: &bollard::Docker, id: &str) -> Result<bool, String> {
    match tokio::time::timeout(
        Duration::from_secs(20),
        docker.inspect_container(id, None::<q::InspectContainerOptions>),
    )
    .await
    {
        Err(_) => Err("the node's Docker Engine did not answer for 20 s".into()),
        Ok(Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        })) => Ok(false),
        Ok(Err(e)) if connection_lost(&e) => Err(format!(
            "the connection to the node's Docker Engine was lost ({e})"
        )),
        Ok(Err(e)) => Err(format!("the node's Docker Engine failed: {e}")),
        Ok(Ok(i)) => Ok(i.state.and_then(|s| s.running).unwrap_or(false)),
    }
}

/// One attempt of a ready check; Err says why it did not pass yet.
async fn check_once(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    check: &serde_json::Value,
) -> Result<(), String> {
    let per_try = Duration::from_secs(
        check
            .get("interval")
            .and_then(|v| v.as_u64())
            .unwrap_or(2)
            .clamp(1, 30)
            + 10,
    );
    if let Some(cmd) = strs(check.get("exec")) {
        let (code, out, err) = exec_in(docker, id, &cmd, per_try).await?;
        let want = check.get("exit_code").and_then(|v| v.as_i64()).unwrap_or(0);
        if code != want {
            let last = out
                .lines()
                .chain(err.lines())
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string();
            return Err(format!(
                "`{}` exited {code}, expected {want}{}",
                cmd.join(" "),
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            ));
        }
        if let Some(want) = check.get("output_contains").and_then(|v| v.as_str()) {
            if !out.contains(want) {
                return Err(format!(
                    "`{}` output does not contain {want:?}",
                    cmd.join(" ")
                ));
            }
        }
        return Ok(());
    }
    let host = cx.host().map_err(|e| e.message)?;
    if let Some(url) = check.get("http").and_then(|v| v.as_str()) {
        let (h, port, _) = crate::http::parse_url(url)?;
        let ep = host.forward(&h, port).await.map_err(|e| e.to_string())?;
        let r = crate::http::send(
            &ep,
            &crate::http::Request {
                method: "GET".into(),
                url: url.into(),
                headers: Vec::new(),
                body: None,
                timeout: per_try,
            },
        )
        .await?;
        let want = check.get("status").and_then(|v| v.as_u64()).unwrap_or(200) as u16;
        if r.status != want {
            return Err(format!("GET {url} answered {}, expected {want}", r.status));
        }
        return Ok(());
    }
    if let Some(addr) = check.get("tcp").and_then(|v| v.as_str()) {
        let (h, p) = addr.rsplit_once(':').ok_or("bad tcp address")?;
        let port: u16 = p.parse().map_err(|_| "bad port")?;
        let ep = host.forward(h, port).await.map_err(|e| e.to_string())?;
        return tcp_open(&ep).await;
    }
    Err("the ready check has no exec, http or tcp".into())
}

/// Whether a TCP port answers through an endpoint. Through an SSH forward the local connect
/// always succeeds; a refused remote connect shows as an immediate close.
pub async fn tcp_open(ep: &crate::hosts::Endpoint) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    match ep {
        crate::hosts::Endpoint::Tcp(h, p) => tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect((h.as_str(), *p)),
        )
        .await
        .map_err(|_| format!("{h}:{p} did not answer"))?
        .map(|_| ())
        .map_err(|e| format!("{h}:{p}: {e}")),
        crate::hosts::Endpoint::Unix(path) => {
            let mut s = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| e.to_string())?;
            let mut b = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(500), s.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => Err("connection refused on the node".into()),
                _ => Ok(()),
            }
        }
    }
}

/// Fail at once when the container's log shows a known fatal condition (a regex of
/// `fail_on_log`), with the fix that goes with it.
async fn fail_on_log(
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    patterns: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), StepError> {
    let Ok(lines) = tokio::time::timeout(Duration::from_secs(10), log_tail(docker, id, 200)).await
    else {
        return Ok(());
    };
    for (pattern, fix) in patterns {
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        if let Some(line) = lines.iter().find(|l| re.is_match(l)) {
            let start = lines.len().saturating_sub(40);
            return Err(StepError::new(format!(
                "container {name} logged a fatal condition: {}",
                line.trim()
            ))
            .details(lines[start..].to_vec())
            .help(fix.as_str().unwrap_or_default().to_string()));
        }
    }
    Ok(())
}

/// Wait until every ready check passes, the container dies, the timeout passes or the apply is
/// cancelled.
async fn wait_ready(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    checks: &[serde_json::Value],
) -> Result<(), StepError> {
    for check in checks {
        let timeout =
            Duration::from_secs(check.get("timeout").and_then(|v| v.as_u64()).unwrap_or(300));
        let interval = Duration::from_secs(
            check
                .get("interval")
                .and_then(|v| v.as_u64())
                .unwrap_or(2)
                .max(1),
        );
        let what = if let Some(c) = strs(check.get("exec")) {
            format!("exec {}", c.join(" "))
        } else if let Some(u) = check.get("http").and_then(|v| v.as_str()) {
            format!("GET {u}")
        } else {
            format!(
                "tcp {}",
                check.get("tcp").and_then(|v| v.as_str()).unwrap_or("")
            )
        };
        let start = Instant::now();
        let mut backoff = super::Backoff::new(interval);
        loop {
            if cx.cancel.is_cancelled() {
                return Err(StepError::new(format!(
                    "{name}: cancelled while waiting for `{what}`"
                )));
            }
            let last = match check_once(cx, docker, id, check).await {
                Ok(()) => break,
                Err(e) => e,
            };
            if let Some(patterns) = check.get("fail_on_log").and_then(|p| p.as_object()) {
                fail_on_log(docker, id, name, patterns).await?;
            }
            let alive = running(docker, id).await.map_err(|e| {
                StepError::new(format!("{name}: {e} while waiting for `{what}`"))
                    .help("the node or its network may be down; check it and run again")
            })?;
            if !alive {
                let (state, logs) = evidence(docker, id).await;
                return Err(StepError::new(format!(
                    "container {name} {state} before it was ready (check `{what}`: {last})"
                ))
                .details(logs)
                .help("the log lines above are the container's last 40"));
            }
            if start.elapsed() >= timeout {
                let (state, logs) = evidence(docker, id).await;
                return Err(StepError::new(format!(
                    "container {name} was not ready after {} s: `{what}` kept failing ({last}); the container is {state}",
                    timeout.as_secs()
                ))
                .details(logs)
                .help("raise the ready block's timeout if it is only slow; the log lines above are the container's last 40"));
            }
            let log = tokio::time::timeout(Duration::from_secs(10), log_tail(docker, id, 1))
                .await
                .ok()
                .and_then(|mut l| l.pop());
            cx.progress(
                format!("waiting for `{what}`: {last}"),
                log,
                Some(timeout.as_secs()),
            );
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_wait()) => {}
                _ = cx.cancel.cancelled() => {}
            }
        }
    }
    Ok(())
}

async fn remove(docker: &bollard::Docker, id: &str) -> Result<(), StepError> {
    match docker
        .remove_container(
            id,
            Some(q::RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(docker_err(&format!("cannot remove container {id}"), e)),
    }
}

/// Rename a container aside and stop it, so a new one can take its name and the old one can
/// come back on rollback. Returns the name it was given.
async fn set_aside(
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    stop_secs: i32,
) -> Result<String, StepError> {
    let short: String = id.chars().take(12).collect();
    let aside = format!("{name}-sparkform-old-{short}");
    let current = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
        .ok()
        .and_then(|i| i.name)
        .map(|n| n.trim_start_matches('/').to_string());
    // An interrupted earlier run may already have set it aside.
    if current.as_deref() != Some(aside.as_str()) {
        docker
            .rename_container(
                id,
                q::RenameContainerOptions {
                    name: aside.clone(),
                },
            )
            .await
            .map_err(|e| docker_err(&format!("cannot rename {name} aside"), e))?;
    }
    let stopped = docker
        .stop_container(
            id,
            Some(q::StopContainerOptions {
                t: Some(stop_secs),
                ..Default::default()
            }),
        )
        .await;
    already_so(stopped).map_err(|e| docker_err(&format!("cannot stop {name}"), e))?;
    Ok(aside)
}

async fn restore(docker: &bollard::Docker, id: &str, name: &str) -> Result<(), StepError> {
    docker
        .rename_container(
            id,
            q::RenameContainerOptions {
                name: name.to_string(),
            },
        )
        .await
        .map_err(|e| docker_err(&format!("cannot rename the previous {name} back"), e))?;
    let started = docker
        .start_container(id, None::<q::StartContainerOptions>)
        .await;
    already_so(started).map_err(|e| docker_err(&format!("cannot start the previous {name}"), e))
}

/// Create, start and wait for a new container. On failure nothing of it is left.
async fn start_new(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &serde_json::Value,
    name: &str,
) -> Result<(String, String), StepError> {
    let node = cx.change.node.clone().unwrap_or_default();
    let image_id = ensure_image(cx, docker, desired).await?;
    // A container with this name from an earlier, interrupted run of this deployment is ours
    // to replace; anyone else's is not.
    if let Ok(existing) = docker
        .inspect_container(name, None::<q::InspectContainerOptions>)
        .await
    {
        let labels = existing.config.and_then(|c| c.labels).unwrap_or_default();
        if labels.get(LABEL_LINEAGE).map(String::as_str) == Some(cx.lineage) {
            remove(docker, existing.id.as_deref().unwrap_or(name)).await?;
        } else {
            return Err(StepError::new(format!(
                "a container named {name} already exists on {node} and sparkform did not create it"
            ))
            .help("remove or rename it, or give this container another `name`"));
        }
    }
    let hash = cx.change.after_hash.clone().unwrap_or_default();
    let body = create_body(desired, cx.lineage, cx.address, &hash, cx.config_dir);
    cx.progress(format!("creating {name} on {node}"), None, None);
    let created = docker
        .create_container(
            Some(q::CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|e| docker_err(&format!("{node}: cannot create container {name}"), e))?;
    let id = created.id;
    if let Err(e) = docker
        .start_container(&id, None::<q::StartContainerOptions>)
        .await
    {
        let (_, logs) = evidence(docker, &id).await;
        let _ = remove(docker, &id).await;
        return Err(docker_err(&format!("{node}: cannot start container {name}"), e).details(logs));
    }
    let checks: Vec<serde_json::Value> = desired
        .get("ready")
        .and_then(|r| r.as_array())
        .cloned()
        .unwrap_or_default();
    if let Err(e) = wait_ready(cx, docker, &id, name, &checks).await {
        let _ = remove(docker, &id).await;
        return Err(e);
    }
    Ok((id, image_id))
}

#[async_trait]
impl Handler for ContainerHandler {
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError> {
        let host = cx.host()?;
        let docker = host.docker().await?;
        let name = name_of(cx);
        let old = recorded_id(cx);
        match action {
            Action::Delete => {
                let Some(old) = old else {
                    return Ok(Applied::default());
                };
                if docker
                    .inspect_container(&old, None::<q::InspectContainerOptions>)
                    .await
                    .is_err()
                {
                    return Ok(Applied {
                        summary: format!("{name} was already gone"),
                        ..Applied::default()
                    });
                }
                let aside = set_aside(&docker, &old, &name, stop_secs(cx)).await?;
                Ok(Applied {
                    attributes: Default::default(),
                    undo: serde_json::json!({ "previous": old, "name": name, "aside": aside }),
                    summary: format!("stopped {name} (removed when the apply succeeds)"),
                })
            }
            Action::Update => {
                let desired = cx
                    .desired
                    .ok_or_else(|| StepError::new("no desired configuration"))?;
                let old = old.unwrap_or_else(|| name.clone());
                let previous_restart = cx
                    .recorded
                    .and_then(|r| r.config.get("restart"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("no")
                    .to_string();
                let restart = desired
                    .get("restart")
                    .and_then(|v| v.as_str())
                    .unwrap_or("no");
                if restart != previous_restart {
                    docker
                        .update_container(
                            &old,
                            bollard::models::ContainerUpdateBody {
                                restart_policy: Some(restart_policy(restart)),
                                ..Default::default()
                            },
                        )
                        .await
                        .map_err(|e| {
                            docker_err(&format!("cannot update the restart policy of {name}"), e)
                        })?;
                }
                Ok(Applied {
                    attributes: cx
                        .recorded
                        .map(|r| r.attributes.clone())
                        .unwrap_or_default(),
                    undo: serde_json::json!({ "container": old, "previous_restart": previous_restart }),
                    summary: format!("updated {name} in place"),
                })
            }
            _ => {
                let desired = cx
                    .desired
                    .ok_or_else(|| StepError::new("no desired configuration"))?;
                let mut aside = None;
                if let Some(old) = &old {
                    if docker
                        .inspect_container(old, None::<q::InspectContainerOptions>)
                        .await
                        .is_ok()
                    {
                        cx.progress(format!("stopping the previous {name}"), None, None);
                        aside = Some(set_aside(&docker, old, &name, stop_secs(cx)).await?);
                    }
                }
                match start_new(cx, &docker, desired, &name).await {
                    Ok((id, image_id)) => {
                        let mut attributes = std::collections::BTreeMap::new();
                        attributes.insert("container_id".into(), serde_json::json!(id));
                        attributes.insert("image_id".into(), serde_json::json!(image_id));
                        Ok(Applied {
                            attributes,
                            undo: serde_json::json!({ "created": id, "previous": if aside.is_some() { old.clone() } else { None }, "name": name }),
                            summary: format!(
                                "{name} running ({})",
                                id.chars().take(12).collect::<String>()
                            ),
                        })
                    }
                    Err(e) => {
                        if let (Some(old), Some(_)) = (&old, &aside) {
                            if let Err(r) = restore(&docker, old, &name).await {
                                return Err(StepError::new(format!(
                                    "{}; and bringing the previous container back failed: {}",
                                    e.message, r.message
                                ))
                                .details(e.details));
                            }
                        }
                        Err(e)
                    }
                }
            }
        }
    }

    async fn undo(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<String, StepError> {
        let host = cx.host()?;
        let docker = host.docker().await?;
        let u = &applied.undo;
        let name = u
            .get("name")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| name_of(cx));
        match action {
            Action::Update => {
                if let (Some(c), Some(r)) = (
                    u.get("container").and_then(|v| v.as_str()),
                    u.get("previous_restart").and_then(|v| v.as_str()),
                ) {
                    docker
                        .update_container(
                            c,
                            bollard::models::ContainerUpdateBody {
                                restart_policy: Some(restart_policy(r)),
                                ..Default::default()
                            },
                        )
                        .await
                        .map_err(|e| docker_err("cannot restore the restart policy", e))?;
                }
                Ok(format!("restored the restart policy of {name}"))
            }
            _ => {
                if let Some(created) = u.get("created").and_then(|v| v.as_str()) {
                    remove(&docker, created).await?;
                }
                if let Some(prev) = u.get("previous").and_then(|v| v.as_str()) {
                    restore(&docker, prev, &name).await?;
                    return Ok(format!(
                        "removed the new {name}, the previous one runs again"
                    ));
                }
                Ok(format!("removed {name}"))
            }
        }
    }

    async fn finalize(
        &self,
        cx: &StepCx<'_>,
        _action: Action,
        applied: &Applied,
    ) -> Result<(), StepError> {
        if let Some(prev) = applied.undo.get("previous").and_then(|v| v.as_str()) {
            let host = cx.host()?;
            let docker = host.docker().await?;
            remove(&docker, prev).await?;
        }
        Ok(())
    }
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
        assert_eq!(ok["timeout"], 300);
    }
}

//! A container on the machine: bollard over the node's forwarded Docker socket; observed by
//! the labels sparkform puts on it.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters as q;
use futures_util::StreamExt;

use super::{LABEL_ADDRESS, LABEL_CONFIG_HASH, LABEL_LINEAGE};
use crate::config::{Config, Resource};
use crate::hosts::{facts, Host, HostError, HostPool};
use crate::kinds::machine::{
    Applied, Backoff, Check, CheckRun, Machine, NodeObservations, ReadMode, StepCx, StepError,
};
use crate::plan::{Action, Observed, Orphan};
use crate::state::ResourceState;

pub struct ContainerMachine;
pub static MACHINE: ContainerMachine = ContainerMachine;

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
    match docker.inspect_image(image).await {
        Ok(i) => return Ok(i.id.unwrap_or_default()),
        Err(e) => image_missing(&node, image, e)?,
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
        // Bytes done and total per layer, summed: the engine reports each layer apart.
        let mut layers: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        let mut last_report: Option<Instant> = None;
        while let Some(item) = stream.next().await {
            let info =
                item.map_err(|e| StepError::new(format!("{node}: pulling {image} failed: {e}")))?;
            // Extracting reports its own bytes for the same layer: only downloads count.
            let downloading = info
                .status
                .as_deref()
                .is_some_and(|s| s.starts_with("Downloading"));
            if let (Some(id), Some(d), true) = (&info.id, &info.progress_detail, downloading) {
                if let (Some(cur), Some(total)) = (d.current, d.total) {
                    if total > 0 {
                        layers.insert(id.clone(), (cur.min(total), total));
                    }
                }
            }
            if let (Some(id), Some(status)) = (&info.id, &info.status) {
                // A finished layer reports no detail any more: count it as whole.
                if status.starts_with("Download complete") || status.starts_with("Pull complete") {
                    if let Some(l) = layers.get_mut(id) {
                        l.0 = l.1;
                    }
                }
            }
            // An event a second is enough for a line, and keeps `--json` readable.
            if last_report.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                continue;
            }
            last_report = Some(Instant::now());
            let message = if layers.is_empty() {
                format!(
                    "pulling {image}: {}",
                    info.status.as_deref().unwrap_or("starting")
                )
            } else {
                pull_progress(image, &layers)
            };
            cx.progress(message, None, None);
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

/// Only a 404 means the image is not there (and may be loaded or pulled); any other answer, or
/// none, is the engine or the connection failing, and loading the image would not help.
fn image_missing(node: &str, image: &str, e: bollard::errors::Error) -> Result<(), StepError> {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        } => Ok(()),
        e if connection_lost(&e) => Err(docker_err(
            &format!("{node}: cannot inspect image {image}"),
            e,
        )),
        e => Err(StepError::new(format!(
            "{node}: the Docker Engine failed to inspect image {image}: {e}"
        ))
        .help("this is not a missing image: the engine answered an error; check it on the node (`docker info`, its disk and logs), then run apply again")),
    }
}

/// `pulling IMAGE: 1.20 GiB / 3.40 GiB (35%, 4 layers)`.
fn pull_progress(image: &str, layers: &std::collections::BTreeMap<String, (i64, i64)>) -> String {
    let (done, total) = layers.values().fold((0u64, 0u64), |(d, t), (c, n)| {
        (d + (*c).max(0) as u64, t + (*n).max(0) as u64)
    });
    format!(
        "pulling {image}: {} / {} ({}%, {} layer{})",
        indicatif::BinaryBytes(done),
        indicatif::BinaryBytes(total),
        (done * 100).checked_div(total).unwrap_or(0),
        layers.len(),
        if layers.len() == 1 { "" } else { "s" }
    )
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
    log_tail_since(docker, container, n, 0).await
}

/// The last `n` log lines a container wrote since `since` (Unix seconds; 0: ever): a restarted
/// container's log still holds what its previous run wrote, fatal lines included.
async fn log_tail_since(
    docker: &bollard::Docker,
    container: &str,
    n: usize,
    since: i32,
) -> Vec<String> {
    let mut stream = docker.logs(
        container,
        Some(q::LogsOptions {
            stdout: true,
            stderr: true,
            tail: n.to_string(),
            since,
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

/// What a look at a container during its start found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Liveness {
    running: bool,
    /// Docker is between two restarts of it (its restart policy brought it back after a crash).
    restarting: bool,
    /// Docker's `RestartCount`: how often its restart policy restarted it.
    restarts: i64,
}

/// Whether the container runs and how often Docker restarted it; Err when the node does not
/// answer.
async fn liveness(docker: &bollard::Docker, id: &str) -> Result<Liveness, String> {
    match tokio::time::timeout(
        Duration::from_secs(20),
        docker.inspect_container(id, None::<q::InspectContainerOptions>),
    )
    .await
    {
        Err(_) => Err("the node's Docker Engine did not answer for 20 s".into()),
        Ok(Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        })) => Ok(Liveness {
            running: false,
            restarting: false,
            restarts: 0,
        }),
        Ok(Err(e)) if connection_lost(&e) => Err(format!(
            "the connection to the node's Docker Engine was lost ({e})"
        )),
        Ok(Err(e)) => Err(format!("the node's Docker Engine failed: {e}")),
        Ok(Ok(i)) => Ok(Liveness {
            running: i.state.as_ref().and_then(|s| s.running).unwrap_or(false),
            restarting: i.state.as_ref().and_then(|s| s.restarting).unwrap_or(false),
            restarts: i.restart_count.unwrap_or(0),
        }),
    }
}

/// Why a container that is not ready yet will not become ready.
#[derive(Debug, PartialEq, Eq)]
enum Doomed {
    Exited,
    /// Its restart policy keeps bringing it back after crashes; the text says how often.
    CrashLoop(String),
}

/// A new container has restarted 0 times, so any restart before it is ready is a crash, and
/// with `restart = "always"` Docker would go on restarting it for as long as sparkform waited.
/// `None` while it may still become ready.
fn doomed(l: &Liveness) -> Option<Doomed> {
    if l.restarting || l.restarts > 0 {
        let times = match l.restarts {
            ..=1 => "once".to_string(),
            n => format!("{n} times"),
        };
        return Some(Doomed::CrashLoop(format!(
            "is crash-looping: Docker restarted it {times} before it was ready"
        )));
    }
    (!l.running).then_some(Doomed::Exited)
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
    since: i32,
) -> Result<(), StepError> {
    let Ok(lines) = tokio::time::timeout(
        Duration::from_secs(10),
        log_tail_since(docker, id, 200, since),
    )
    .await
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

/// The `warn_on_log` patterns (regex → what it means) that match one of `lines` and are not in
/// `seen` yet: the pattern, the line and its message. Each warns once per start.
fn new_warnings(
    lines: &[String],
    patterns: &serde_json::Map<String, serde_json::Value>,
    seen: &mut BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (pattern, help) in patterns {
        if seen.contains(pattern) {
            continue;
        }
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        if let Some(line) = lines.iter().find(|l| re.is_match(l)) {
            seen.insert(pattern.clone());
            out.push((
                line.trim().to_string(),
                help.as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    out
}

/// Report the log lines `warn_on_log` names (once each); the start goes on.
async fn warn_on_log(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    patterns: &serde_json::Map<String, serde_json::Value>,
    seen: &mut BTreeSet<String>,
    since: i32,
) {
    if patterns.len() == seen.len() {
        return;
    }
    let Ok(lines) = tokio::time::timeout(
        Duration::from_secs(10),
        log_tail_since(docker, id, 200, since),
    )
    .await
    else {
        return;
    };
    for (line, help) in new_warnings(&lines, patterns, seen) {
        crate::events::emit(
            cx.events,
            crate::events::Event::StepWarning {
                address: cx.address.to_string(),
                message: format!("container {name} logged: {line}"),
                help,
            },
        );
    }
}

/// Follows a starting container's log, so that every phase its `progress` patterns name is
/// seen (and reported as an event) even when it lasts less than a check interval.
struct LogFollow<S> {
    stream: Option<S>,
    watch: super::progress::PhaseWatch,
    label: Option<String>,
    since: Instant,
}

impl<S> LogFollow<S>
where
    S: futures_util::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>>
        + Unpin,
{
    /// Read what the log says until `deadline` or the apply is cancelled.
    async fn read_until(&mut self, cx: &StepCx<'_>, deadline: tokio::time::Instant) {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = cx.cancel.cancelled() => {}
                }
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = cx.cancel.cancelled() => return,
                chunk = stream.next() => match chunk {
                    Some(Ok(chunk)) => {
                        for p in self.watch.feed(&chunk.to_string()) {
                            // A phase's time runs from its first line, not its last percentage.
                            if self.label.as_deref() != Some(p.label.as_str()) {
                                self.label = Some(p.label.clone());
                                self.since = Instant::now();
                            }
                            crate::events::emit(cx.events, crate::events::Event::Phase {
                                address: cx.address.to_string(),
                                phase: p.label,
                                percent: p.percent,
                                line: p.line,
                            });
                        }
                    }
                    // The container ended its log or the node dropped the stream: the checks
                    // that follow say which.
                    _ => self.stream = None,
                },
            }
        }
    }

    /// What the container does, for its progress line: the latest phase seen and since when.
    fn doing(&self) -> Option<String> {
        self.watch.current().map(|p| {
            format!(
                "{} ({} s)",
                crate::events::phase_text(&p.label, p.percent),
                self.since.elapsed().as_secs()
            )
        })
    }
}

/// Wait until every ready check passes, the container dies, the timeout passes or the apply is
/// cancelled. Only what the log says from `since` on counts (Unix seconds; 0 for a new
/// container).
async fn wait_ready(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    checks: &[serde_json::Value],
    since: i32,
) -> Result<(), StepError> {
    // One follower for all the checks: the phases of a start run across them.
    let mut follow = LogFollow {
        stream: Some(Box::pin(docker.logs(
            id,
            Some(q::LogsOptions {
                follow: true,
                stdout: true,
                stderr: true,
                tail: "all".into(),
                since,
                ..Default::default()
            }),
        ))),
        watch: super::progress::PhaseWatch::new(
            // The patterns of all the checks: a later check's phases may start during an
            // earlier one.
            Some(&serde_json::Value::Object(
                checks
                    .iter()
                    .filter_map(|c| c.get("progress").and_then(|p| p.as_object()))
                    .flat_map(|m| m.clone())
                    .collect(),
            )),
        ),
        label: None,
        since: Instant::now(),
    };
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
        let mut backoff = Backoff::new(interval);
        let warn_patterns = check.get("warn_on_log").and_then(|p| p.as_object());
        let mut warned = BTreeSet::new();
        loop {
            if cx.cancel.is_cancelled() {
                return Err(StepError::new(format!(
                    "{name}: cancelled while waiting for `{what}`"
                )));
            }
            let last = match check_once(cx, docker, id, check).await {
                Ok(()) => {
                    // A start that is ready at the first attempt still reports what it logged.
                    if let Some(patterns) = warn_patterns {
                        warn_on_log(cx, docker, id, name, patterns, &mut warned, since).await;
                    }
                    break;
                }
                Err(e) => e,
            };
            if let Some(patterns) = check.get("fail_on_log").and_then(|p| p.as_object()) {
                fail_on_log(docker, id, name, patterns, since).await?;
            }
            if let Some(patterns) = warn_patterns {
                warn_on_log(cx, docker, id, name, patterns, &mut warned, since).await;
            }
            let seen = liveness(docker, id).await.map_err(|e| {
                StepError::new(format!("{name}: {e} while waiting for `{what}`"))
                    .help("the node or its network may be down; check it and run again")
            })?;
            match doomed(&seen) {
                Some(Doomed::CrashLoop(why)) => {
                    let (_, logs) = evidence(docker, id).await;
                    return Err(StepError::new(format!(
                        "container {name} {why} (check `{what}`: {last})"
                    ))
                    .details(logs)
                    .help("the log lines above are the container's last 40; its restart policy would keep restarting it, so sparkform does not wait for the ready timeout"));
                }
                Some(Doomed::Exited) => {
                    let (state, logs) = evidence(docker, id).await;
                    return Err(StepError::new(format!(
                        "container {name} {state} before it was ready (check `{what}`: {last})"
                    ))
                    .details(logs)
                    .help("the log lines above are the container's last 40"));
                }
                None => {}
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
            let log = match follow.watch.last_line() {
                Some(l) => Some(l.to_string()),
                None if follow.stream.is_none() => {
                    tokio::time::timeout(Duration::from_secs(10), log_tail(docker, id, 1))
                        .await
                        .ok()
                        .and_then(|mut l| l.pop())
                }
                None => None,
            };
            cx.progress(
                // What it is doing says more than the check that did not pass yet.
                follow
                    .doing()
                    .unwrap_or_else(|| format!("waiting for `{what}`: {last}")),
                log,
                Some(timeout.as_secs()),
            );
            follow
                .read_until(cx, tokio::time::Instant::now() + backoff.next_wait())
                .await;
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

/// The container, other than `id`, that holds `name` on the node, if one does.
async fn name_holder(docker: &bollard::Docker, id: &str, name: &str) -> Option<String> {
    let holder = docker
        .inspect_container(name, None::<q::InspectContainerOptions>)
        .await
        .ok()?
        .id?;
    (holder != id && !holder.starts_with(id)).then_some(holder)
}

async fn restore(docker: &bollard::Docker, id: &str, name: &str) -> Result<(), StepError> {
    let current = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
        .ok()
        .and_then(|i| i.name)
        .map(|n| n.trim_start_matches('/').to_string());
    // Already under its name (an untracked copy found set aside keeps the name it had).
    if current.as_deref() != Some(name) {
        if let Some(holder) = name_holder(docker, id, name).await {
            return Err(StepError::new(format!(
                "cannot bring the previous {name} back: container {} holds the name",
                holder.chars().take(12).collect::<String>()
            ))
            .help("`sparkform plan` shows both; the next apply replaces what is not recorded"));
        }
        docker
            .rename_container(
                id,
                q::RenameContainerOptions {
                    name: name.to_string(),
                },
            )
            .await
            .map_err(|e| docker_err(&format!("cannot rename the previous {name} back"), e))?;
    }
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
    if let Err(e) = wait_ready(cx, docker, &id, name, &checks, 0).await {
        let _ = remove(docker, &id).await;
        return Err(e);
    }
    Ok((id, image_id))
}

#[async_trait]
impl Machine for ContainerMachine {
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
                // `docker stop` waits up to the stop timeout for the process to end.
                cx.progress(
                    format!("stopping {name}"),
                    None,
                    Some(stop_secs(cx).max(0) as u64),
                );
                let aside = set_aside(&docker, &old, &name, stop_secs(cx)).await?;
                // An untracked one goes back under its own name on rollback: the resource's
                // name is the tracked container's.
                let back = cx
                    .change
                    .orphan
                    .as_ref()
                    .map_or(name.clone(), |o| o.name.clone());
                Ok(Applied {
                    attributes: Default::default(),
                    undo: serde_json::json!({ "previous": old, "name": back, "aside": aside }),
                    summary: format!("stopped {name}; removed once every step has succeeded"),
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
                    // An untracked copy gives way to the tracked container at its address:
                    // it stays set aside and stopped, and the next apply removes it.
                    if cx.change.orphan.is_some() {
                        if let Some(holder) = name_holder(&docker, prev, &name).await {
                            return Ok(format!(
                                "left the untracked {} set aside and stopped: {} holds the name {name}; the next apply removes it",
                                prev.chars().take(12).collect::<String>(),
                                holder.chars().take(12).collect::<String>()
                            ));
                        }
                    }
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

    async fn restart(&self, cx: &StepCx<'_>) -> Result<String, StepError> {
        let host = cx.host()?;
        let docker = host.docker().await?;
        let name = name_of(cx);
        let id = recorded_id(cx)
            .ok_or_else(|| StepError::new(format!("{name}: no container recorded to restart")))?;
        cx.progress(format!("restarting {name}"), None, None);
        let stopped = docker
            .stop_container(
                &id,
                Some(q::StopContainerOptions {
                    t: Some(stop_secs(cx)),
                    ..Default::default()
                }),
            )
            .await;
        already_so(stopped).map_err(|e| docker_err(&format!("cannot stop {name}"), e))?;
        // What the previous run logged (a peer that went away) is no verdict on this one: it
        // has stopped, so every line from now on is the new run's.
        let since = i32::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
        let started = docker
            .start_container(&id, None::<q::StartContainerOptions>)
            .await;
        already_so(started).map_err(|e| docker_err(&format!("cannot start {name}"), e))?;
        // Ready as it was recorded: the checks of the configuration it runs, not the new one.
        let checks: Vec<serde_json::Value> = cx
            .recorded
            .and_then(|r| r.config.get("ready"))
            .and_then(|r| r.as_array())
            .cloned()
            .unwrap_or_default();
        wait_ready(cx, &docker, &id, &name, &checks, since).await?;
        Ok(format!(
            "restarted {name} ({}): its process group starts again as one",
            id.chars().take(12).collect::<String>()
        ))
    }

    async fn stop(&self, cx: &StepCx<'_>) -> Result<String, StepError> {
        let host = cx.host()?;
        let docker = host.docker().await?;
        let name = name_of(cx);
        let Some(id) = recorded_id(cx) else {
            return Ok(String::new());
        };
        let stopped = docker
            .stop_container(
                &id,
                Some(q::StopContainerOptions {
                    t: Some(stop_secs(cx)),
                    ..Default::default()
                }),
            )
            .await;
        match already_so(stopped) {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(format!("stopped {name}")),
            Err(e) => Err(docker_err(&format!("cannot stop {name}"), e)),
        }
    }

    /// The container the state records for an address is the one with the recorded id; others
    /// with the same address (set aside by an interrupted apply) are untracked.
    async fn observe(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, ResourceState)],
        _mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        let node = host.node();
        let docker = host.docker().await?;
        let mut filters = HashMap::new();
        filters.insert(
            "label".to_string(),
            vec![format!("{LABEL_LINEAGE}={lineage}")],
        );
        let list = docker
            .list_containers(Some(q::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| HostError::Docker {
                node: node.to_string(),
                message: format!("cannot list containers: {e}"),
                help: None,
            })?;
        let mut list = list;
        list.extend(unlabelled_by_id(&docker, recorded, &list).await);
        let images: Vec<String> = recorded
            .iter()
            .filter_map(|(_, r)| r.config.get("image")?.as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let now = facts::image_ids(host, &images).await;
        Ok(judge(node, recorded, &list, &now))
    }

    fn checks(&self, config: &Config, changed: &dyn Fn(&str) -> bool) -> Vec<Check> {
        parity_check(config, changed).into_iter().collect()
    }

    fn exec_target(&self, r: &Resource) -> Option<(String, String)> {
        Some((r.node.clone()?, r.config.get("name")?.as_str()?.to_string()))
    }

    async fn import(
        &self,
        host: &dyn Host,
        address: &str,
        object: &str,
        desired: Option<&serde_json::Value>,
    ) -> Result<crate::kinds::machine::Imported, StepError> {
        import_container(host, address, object, desired).await
    }
}

/// The recorded containers of a node against the labelled containers it has. Pure.
fn judge(
    node: &str,
    recorded: &[(String, ResourceState)],
    list: &[bollard::models::ContainerSummary],
    images_now: &std::collections::BTreeMap<String, Option<String>>,
) -> NodeObservations {
    let mut out = std::collections::BTreeMap::new();
    let recorded_ids: HashMap<&str, &str> = recorded
        .iter()
        .filter_map(|(a, r)| Some((a.as_str(), r.attributes.get("container_id")?.as_str()?)))
        .collect();
    let mut found: HashMap<String, &bollard::models::ContainerSummary> = HashMap::new();
    let mut claimed: std::collections::BTreeSet<String> = Default::default();
    for c in list {
        // An imported container started by hand carries no labels: it is the recorded ID's.
        if let Some((a, id)) = unlabelled_claim(c, &recorded_ids) {
            found.insert(a.to_string(), c);
            claimed.insert(id.to_string());
            continue;
        }
        let (Some(a), Some(id)) = (
            c.labels.as_ref().and_then(|l| l.get(LABEL_ADDRESS)),
            c.id.as_ref(),
        ) else {
            continue;
        };
        let claim = match recorded_ids.get(a.as_str()) {
            Some(rid) => *rid == id.as_str(),
            // A state without the id (written by an older sparkform): the first by address.
            None => recorded.iter().any(|(r, _)| r == a) && !found.contains_key(a),
        };
        if claim {
            found.insert(a.clone(), c);
            claimed.insert(id.clone());
        }
    }
    for (addr, r) in recorded {
        let obs = match found.get(addr) {
            None => Observed::Missing(format!(
                "container {} is gone from {node}",
                r.config
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or(addr)
            )),
            Some(c) => {
                let mut notes = Vec::new();
                let running = matches!(
                    c.state,
                    Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                );
                if !running {
                    notes.push(format!(
                        "container {} is {} ({})",
                        summary_name(c),
                        c.state
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "in an unknown state".into()),
                        c.status.clone().unwrap_or_default()
                    ));
                }
                let hash = c.labels.as_ref().and_then(|l| l.get(LABEL_CONFIG_HASH));
                if hash.is_some_and(|h| *h != r.config_hash) {
                    notes.push(format!("container {} was created from another configuration than the state records", summary_name(c)));
                }
                notes.extend(image_moved(node, r, c, images_now));
                if notes.is_empty() {
                    Observed::InSync
                } else {
                    Observed::Drifted(notes)
                }
            }
        };
        out.insert(addr.clone(), obs);
    }
    let orphans = list
        .iter()
        .filter_map(|c| {
            let addr = c.labels.as_ref()?.get(LABEL_ADDRESS)?;
            (!claimed.contains(c.id.as_deref().unwrap_or_default())).then(|| Orphan {
                kind: crate::kinds::KindId::Container,
                address: addr.clone(),
                node: node.to_string(),
                name: summary_name(c),
                id: c.id.clone().unwrap_or_default(),
            })
        })
        .collect();
    (out, orphans)
}

fn summary_name(c: &bollard::models::ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_else(|| c.id.clone().unwrap_or_default())
}

/// A pull or `docker tag` on the node since the apply: the reference names another image than
/// the one the container was created from, so a new container would run something else.
fn image_moved(
    node: &str,
    r: &ResourceState,
    c: &bollard::models::ContainerSummary,
    images_now: &std::collections::BTreeMap<String, Option<String>>,
) -> Option<String> {
    let image = r.config.get("image")?.as_str()?;
    let runs = r
        .attributes
        .get("image_id")
        .and_then(|v| v.as_str())
        .filter(|v| !v.is_empty())
        .or(c.image_id.as_deref())?;
    let now = images_now.get(image)?.as_deref()?;
    (now != runs).then(|| {
        format!(
            "image {image} on {node} is now {} (pulled or retagged); the container runs {}",
            facts::short_id(now),
            facts::short_id(runs)
        )
    })
}

/// One preflight before the first changed container of an apply starts: every image reference
/// is the same image ID on every node that runs it, and the nodes run one NVIDIA driver
/// version. A rank on another build or driver fails late and obscurely (NCCL, a version
/// mismatch); here it fails before anything changed.
fn parity_check(config: &Config, changed: &dyn Fn(&str) -> bool) -> Option<Check> {
    let containers: Vec<&Resource> = config
        .resources
        .iter()
        .filter(|r| r.kind == crate::kinds::KindId::Container)
        .collect();
    let before: Vec<String> = containers
        .iter()
        .filter(|r| changed(&r.address))
        .map(|r| r.address.clone())
        .collect();
    if before.is_empty() {
        return None;
    }
    // Every container counts, changed or not: a new rank must match the ranks already running.
    let mut images: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for r in &containers {
        if let (Some(node), Some(image)) = (&r.node, r.config.get("image").and_then(|v| v.as_str()))
        {
            images
                .entry(node.clone())
                .or_default()
                .insert(image.to_string());
        }
    }
    Some(Check {
        address: "containers (node parity)".into(),
        after: Vec::new(),
        covers: Vec::new(),
        before,
        nodes: images.keys().cloned().collect(),
        run: std::sync::Arc::new(Parity { images }),
    })
}

struct Parity {
    /// Node → the image references its containers use.
    images: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// What one node said for the parity check.
type NodeParity = (
    std::collections::BTreeMap<String, Option<String>>,
    Option<String>,
);

#[async_trait]
impl CheckRun for Parity {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        let mut tasks = crate::tasks::KeyedTasks::new();
        for (node, images) in &self.images {
            let host = pool.get(node)?;
            let images: Vec<String> = images.iter().cloned().collect();
            tasks.spawn(node.clone(), async move {
                let (ids, nvidia) = tokio::join!(
                    facts::image_ids(host.as_ref(), &images),
                    facts::nvidia(host.as_ref())
                );
                Ok::<NodeParity, HostError>((ids, nvidia?.map(|n| n.driver)))
            });
        }
        let mut seen = std::collections::BTreeMap::new();
        while let Some((node, r)) = tasks.next().await {
            let r = r.map_err(|panic| StepError::new(format!("{node}: {panic}")))?;
            seen.insert(node, r?);
        }
        judge_parity(&seen)
    }
}

/// The parity verdict from what every node said. Pure.
fn judge_parity(
    seen: &std::collections::BTreeMap<String, NodeParity>,
) -> Result<String, StepError> {
    let mut problems = Vec::new();
    let mut fine = Vec::new();
    let mut by_image: std::collections::BTreeMap<&str, Vec<(&str, &str)>> = Default::default();
    for (node, (ids, _)) in seen {
        for (image, id) in ids {
            // A node without the image loads or pulls it in its own step.
            if let Some(id) = id {
                by_image.entry(image).or_default().push((node, id));
            }
        }
    }
    for (image, on) in &by_image {
        let distinct: std::collections::BTreeSet<&str> = on.iter().map(|(_, id)| *id).collect();
        if distinct.len() > 1 {
            let each: Vec<String> = on
                .iter()
                .map(|(n, id)| format!("{n} has {}", facts::short_id(id)))
                .collect();
            problems.push(format!(
                "image {image} is not the same on every node: {}",
                each.join(", ")
            ));
        } else if let Some(id) = distinct.first() {
            fine.push(format!(
                "{image} is {} on {} node(s)",
                facts::short_id(id),
                on.len()
            ));
        }
    }
    let drivers: Vec<(&str, &str)> = seen
        .iter()
        .filter_map(|(n, (_, d))| Some((n.as_str(), d.as_deref()?)))
        .collect();
    let without: Vec<&str> = seen
        .iter()
        .filter(|(_, (_, d))| d.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    let distinct: std::collections::BTreeSet<&str> = drivers.iter().map(|(_, d)| *d).collect();
    if distinct.len() > 1 || (!drivers.is_empty() && !without.is_empty()) {
        let mut each: Vec<String> = drivers
            .iter()
            .map(|(n, d)| format!("{n} has {d}"))
            .collect();
        each.extend(without.iter().map(|n| format!("{n} has none")));
        problems.push(format!(
            "the NVIDIA driver differs between the nodes: {}",
            each.join(", ")
        ));
    } else if let Some(d) = distinct.first() {
        fine.push(format!("NVIDIA driver {d} everywhere"));
    } else {
        fine.push("no NVIDIA driver on any node: driver parity not checked".into());
    }
    if problems.is_empty() {
        return Ok(fine.join("; "));
    }
    Err(StepError::new(format!("node parity: {}", problems.join("; ")))
        .help("every rank must run the same build on the same driver: load or pull the same image on every node (or pin it by digest, REPO@sha256:…), and install one driver version everywhere; `sparkform nodes` shows what each node has"))
}

/// The recorded containers the lineage filter cannot find (imported ones, without labels), by
/// their recorded IDs. None found when there are none to look for, or the engine refuses.
async fn unlabelled_by_id(
    docker: &bollard::Docker,
    recorded: &[(String, ResourceState)],
    listed: &[bollard::models::ContainerSummary],
) -> Vec<bollard::models::ContainerSummary> {
    let ids: Vec<String> = recorded
        .iter()
        .filter_map(|(_, r)| r.attributes.get("container_id")?.as_str())
        .filter(|id| !listed.iter().any(|c| c.id.as_deref() == Some(*id)))
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let mut filters = HashMap::new();
    filters.insert("id".to_string(), ids.clone());
    docker
        .list_containers(Some(q::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.id.as_ref().is_some_and(|id| ids.contains(id)))
        .collect()
}

/// An unlabelled container whose ID the state records: (address, id).
fn unlabelled_claim<'a>(
    c: &'a bollard::models::ContainerSummary,
    recorded_ids: &HashMap<&'a str, &'a str>,
) -> Option<(&'a str, &'a str)> {
    if c.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_ADDRESS))
    {
        return None;
    }
    let id = c.id.as_deref()?;
    recorded_ids
        .iter()
        .find(|(_, rid)| **rid == id)
        .map(|(a, _)| (*a, id))
}

// ---- import: a container started by hand, observed with `docker inspect` ----

/// The note an import of an unlabelled container carries into the plan.
pub const NOTE_UNLABELLED: &str = "it was started without sparkform's labels (Docker cannot add labels to a running container): the state tracks it by its container ID, and the labels come with its next replacement";

/// Import `object` (a container's name or ID) on `host`: inspect it and its image, and map what
/// runs to the container's desired shape.
pub async fn import_container(
    host: &dyn Host,
    address: &str,
    object: &str,
    desired: Option<&serde_json::Value>,
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
    let wanted_env = desired
        .and_then(|d| d.get("env"))
        .and_then(|e| e.as_object());
    let secret_paths = config
        .get("env")
        .and_then(|e| e.as_object())
        .into_iter()
        .flatten()
        .filter(|(k, _)| wanted_env.is_none_or(|w| !w.contains_key(*k)))
        .map(|(k, _)| vec!["env".to_string(), k.clone()])
        .collect();
    let mut attributes = std::collections::BTreeMap::new();
    attributes.insert("container_id".into(), serde_json::json!(inspect["Id"]));
    attributes.insert("image_id".into(), serde_json::json!(image_id));
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
        config,
        attributes,
        notes,
        secret_paths,
    })
}

fn text_list(v: Option<&serde_json::Value>) -> Vec<String> {
    strs(v).unwrap_or_default()
}

/// `K=V` entries as a map.
fn env_map(v: Option<&serde_json::Value>) -> serde_json::Map<String, serde_json::Value> {
    text_list(v)
        .into_iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) => (k.to_string(), serde_json::json!(v)),
            None => (e, serde_json::json!("")),
        })
        .collect()
}

/// `soft:hard` of a ulimit as the desired configuration writes it.
fn ulimit_pair(text: &str) -> (i64, i64) {
    match text.split_once(':') {
        Some((s, h)) => (ulimit_value(s), ulimit_value(h)),
        None => (ulimit_value(text), ulimit_value(text)),
    }
}

/// A device mapping as (host, container, permissions), from `/dev/x[:/dev/y[:rwm]]`.
fn device_triple(text: &str) -> (String, String, String) {
    let mut parts = text.split(':');
    let host = parts.next().unwrap_or_default().to_string();
    let inside = parts
        .next()
        .map(str::to_string)
        .unwrap_or_else(|| host.clone());
    let perms = parts.next().unwrap_or("rwm").to_string();
    (host, inside, perms)
}

/// Docker keeps binds, devices and capabilities in no promised order (the order means nothing to
/// it): the ones the definition lists come in its order, then the others as Docker gave them.
fn in_desired_order(mut observed: Vec<String>, wanted: &[String]) -> Vec<String> {
    observed.sort_by_key(|o| wanted.iter().position(|w| w == o).unwrap_or(usize::MAX));
    observed
}

fn cap_name(c: &str) -> String {
    let up = c.to_ascii_uppercase();
    up.strip_prefix("CAP_").unwrap_or(&up).to_string()
}

/// What runs, as the container's desired configuration. Where what runs means what `desired`
/// says in other words (a device written short, a ulimit as one number, `CAP_` prefixes), the
/// desired text is kept, so a container started with the same settings plans no change. Values
/// at Docker's or the image's default are left out unless `desired` sets them so. Pure.
pub fn imported_config(
    inspect: &serde_json::Value,
    image: &serde_json::Value,
    address: &str,
    node: &str,
    desired: Option<&serde_json::Value>,
) -> serde_json::Value {
    use serde_json::{json, Value};
    let want = |k: &str| desired.and_then(|d| d.get(k));
    let cfg = |p: &str| inspect.pointer(&format!("/Config/{p}"));
    let hc = |p: &str| inspect.pointer(&format!("/HostConfig/{p}"));
    let img = |p: &str| image.pointer(&format!("/Config/{p}"));
    let mut out = serde_json::Map::new();
    // A value at its default is recorded only when the definition asks for that very value.
    let put = |out: &mut serde_json::Map<String, Value>, k: &str, v: Value, default: bool| {
        if !default || want(k) == Some(&v) {
            out.insert(k.to_string(), v);
        }
    };
    let name = inspect
        .get("Name")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .trim_start_matches('/')
        .to_string();
    let default_name = address.replace(['[', ']', '"'], "_");
    put(&mut out, "name", json!(name), name == default_name);
    out.insert(
        "node".into(),
        want("node").cloned().unwrap_or_else(|| json!(node)),
    );
    out.insert("image".into(), cfg("Image").cloned().unwrap_or(Value::Null));
    for (k, key) in [("command", "Cmd"), ("entrypoint", "Entrypoint")] {
        let v = text_list(cfg(key));
        let default = v == text_list(img(key));
        put(&mut out, k, json!(v), default);
    }
    let image_env = env_map(img("Env"));
    let wanted_env = want("env").and_then(|e| e.as_object());
    let env: serde_json::Map<String, Value> = env_map(cfg("Env"))
        .into_iter()
        .filter(|(k, v)| {
            let from_image = image_env.get(k) == Some(v)
                || (k == "PATH"
                    && v == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
            !from_image || wanted_env.is_some_and(|w| w.get(k) == Some(v))
        })
        .collect();
    put(&mut out, "env", Value::Object(env.clone()), env.is_empty());
    let text = |v: Option<&Value>| v.and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let network = text(hc("NetworkMode"));
    put(
        &mut out,
        "network_mode",
        json!(network),
        matches!(network.as_str(), "" | "default" | "bridge"),
    );
    let ipc = text(hc("IpcMode"));
    put(
        &mut out,
        "ipc_mode",
        json!(ipc),
        matches!(ipc.as_str(), "" | "private" | "shareable"),
    );
    let pid = text(hc("PidMode"));
    put(&mut out, "pid_mode", json!(pid), pid.is_empty());
    let shm = hc("ShmSize").and_then(|v| v.as_i64()).unwrap_or(0);
    put(
        &mut out,
        "shm_size",
        json!(shm),
        shm == 0 || shm == 64 * 1024 * 1024,
    );
    let gpus = hc("DeviceRequests")
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
    let wanted_devices = text_list(want("devices"));
    let devices: Vec<String> = hc("Devices")
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
    put(&mut out, "devices", json!(devices), devices.is_empty());
    let mut volumes = text_list(hc("Binds"));
    for m in hc("Mounts")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        let (src, dst) = (text(m.get("Source")), text(m.get("Target")));
        let ro = m.get("ReadOnly").and_then(|v| v.as_bool()) == Some(true);
        volumes.push(format!("{src}:{dst}{}", if ro { ":ro" } else { "" }));
    }
    let volumes = in_desired_order(volumes, &text_list(want("volumes")));
    put(&mut out, "volumes", json!(volumes), volumes.is_empty());
    let wanted_ulimits = want("ulimits").and_then(|u| u.as_object());
    let ulimits: serde_json::Map<String, Value> = hc("Ulimits")
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
    put(
        &mut out,
        "ulimits",
        Value::Object(ulimits.clone()),
        ulimits.is_empty(),
    );
    let wanted_caps = text_list(want("cap_add"));
    let caps: Vec<String> = text_list(hc("CapAdd"))
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
    put(&mut out, "cap_add", json!(caps), caps.is_empty());
    let privileged = hc("Privileged").and_then(|v| v.as_bool()).unwrap_or(false);
    put(&mut out, "privileged", json!(privileged), !privileged);
    for (k, key) in [("user", "User"), ("working_dir", "WorkingDir")] {
        let v = text(cfg(key));
        let default = v.is_empty() || v == text(img(key));
        put(&mut out, k, json!(v), default);
    }
    let policy = text(hc("RestartPolicy/Name"));
    let retries = hc("RestartPolicy/MaximumRetryCount")
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let restart = match policy.as_str() {
        "" => "no".to_string(),
        "on-failure" if retries > 0 => format!("on-failure:{retries}"),
        p => p.to_string(),
    };
    put(&mut out, "restart", json!(restart), restart == "no");
    let image_labels = img("Labels").and_then(|l| l.as_object());
    let labels: serde_json::Map<String, Value> = cfg("Labels")
        .and_then(|l| l.as_object())
        .into_iter()
        .flatten()
        .filter(|(k, v)| {
            !k.starts_with(super::LABEL_PREFIX) && image_labels.and_then(|i| i.get(*k)) != Some(v)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    put(
        &mut out,
        "labels",
        Value::Object(labels.clone()),
        labels.is_empty(),
    );
    // What Docker does not keep: how the image got there is sparkform's to decide.
    for k in ["pull", "image_archive"] {
        if let Some(v) = want(k) {
            out.insert(k.into(), v.clone());
        }
    }
    match cfg("StopTimeout").and_then(|v| v.as_i64()) {
        Some(t) => put(&mut out, "stop_timeout", json!(t), false),
        None => {
            if want("stop_timeout") == Some(&json!(10)) {
                out.insert("stop_timeout".into(), json!(10));
            }
        }
    }
    // The ready checks are sparkform's own: a running container passed them or it would not run.
    if let Some(r) = want("ready") {
        out.insert("ready".into(), r.clone());
    }
    // The attributes in the order of the desired configuration.
    let mut ordered = serde_json::Map::new();
    for k in super::ATTRIBUTES.iter().chain(std::iter::once(&"ready")) {
        if let Some(v) = out.remove(*k) {
            ordered.insert((*k).to_string(), v);
        }
    }
    Value::Object(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(images: &[(&str, Option<&str>)], driver: Option<&str>) -> NodeParity {
        (
            images
                .iter()
                .map(|(i, id)| (i.to_string(), id.map(str::to_string)))
                .collect(),
            driver.map(str::to_string),
        )
    }

    #[test]
    fn parity_refuses_different_image_ids_naming_both() {
        let seen: BTreeMap<String, NodeParity> = [
            (
                "node.a".into(),
                node(&[("vllm:x", Some("sha256:aaaaaaaaaaaaaaaa"))], None),
            ),
            (
                "node.b".into(),
                node(&[("vllm:x", Some("sha256:bbbbbbbbbbbbbbbb"))], None),
            ),
        ]
        .into();
        let e = judge_parity(&seen).unwrap_err();
        assert!(
            e.message.contains("node.a has sha256:aaaaaaaaaaaa"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("node.b has sha256:bbbbbbbbbbbb"),
            "{}",
            e.message
        );
    }

    #[test]
    fn parity_passes_alike_nodes_and_skips_a_missing_image_or_driver() {
        let seen: BTreeMap<String, NodeParity> = [
            (
                "node.a".into(),
                node(&[("vllm:x", Some("sha256:aaaa"))], None),
            ),
            ("node.b".into(), node(&[("vllm:x", None)], None)),
        ]
        .into();
        let ok = judge_parity(&seen).unwrap();
        assert!(ok.contains("no NVIDIA driver on any node"), "{ok}");
    }

    #[test]
    fn parity_refuses_different_drivers() {
        let seen: BTreeMap<String, NodeParity> = [
            ("node.a".into(), node(&[], Some("580.95.05"))),
            ("node.b".into(), node(&[], Some("580.82.07"))),
        ]
        .into();
        let e = judge_parity(&seen).unwrap_err();
        assert!(
            e.message
                .contains("node.a has 580.95.05, node.b has 580.82.07"),
            "{}",
            e.message
        );
        let one_without: BTreeMap<String, NodeParity> = [
            ("node.a".into(), node(&[], Some("580.95.05"))),
            ("node.b".into(), node(&[], None)),
        ]
        .into();
        assert!(judge_parity(&one_without).is_err());
    }

    #[test]
    fn a_retagged_image_is_drift() {
        let r: ResourceState = serde_json::from_value(serde_json::json!({
            "kind": "container",
            "node": "node.a",
            "config": { "image": "vllm:x", "name": "rank" },
            "config_hash": "h",
            "attributes": { "image_id": "sha256:aaaaaaaaaaaaaaaa" }
        }))
        .unwrap();
        let c = bollard::models::ContainerSummary::default();
        let same: BTreeMap<String, Option<String>> =
            [("vllm:x".into(), Some("sha256:aaaaaaaaaaaaaaaa".into()))].into();
        assert_eq!(image_moved("node.a", &r, &c, &same), None);
        let moved: BTreeMap<String, Option<String>> =
            [("vllm:x".into(), Some("sha256:cccccccccccccccc".into()))].into();
        let note = image_moved("node.a", &r, &c, &moved).unwrap();
        assert!(note.contains("now sha256:cccccccccccc"), "{note}");
        assert!(note.contains("runs sha256:aaaaaaaaaaaa"), "{note}");
    }

    #[test]
    fn a_warn_on_log_pattern_warns_once_with_its_line() {
        let patterns: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"NET/Socket : Using|Using network Socket": "NCCL runs over TCP sockets"}"#,
        )
        .unwrap();
        // NCCL's line when it falls back to sockets (NCCL_DEBUG=INFO).
        let lines = vec![
            "spark1:1234:1300 [0] NCCL INFO NET/IB : No device found.".to_string(),
            "spark1:1234:1300 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.200.1<0>"
                .to_string(),
        ];
        let mut seen = BTreeSet::new();
        let first = new_warnings(&lines, &patterns, &mut seen);
        assert_eq!(first.len(), 1);
        assert!(first[0].0.contains("NET/Socket : Using"), "{first:?}");
        assert_eq!(first[0].1, "NCCL runs over TCP sockets");
        assert!(new_warnings(&lines, &patterns, &mut seen).is_empty());
        let rdma =
            vec!["spark1:1234:1300 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE".to_string()];
        assert!(new_warnings(&rdma, &patterns, &mut BTreeSet::new()).is_empty());
    }

    #[test]
    fn pull_progress_sums_the_layers() {
        let mut layers = std::collections::BTreeMap::new();
        layers.insert("a".to_string(), (512 * 1024 * 1024, 1024 * 1024 * 1024));
        layers.insert("b".to_string(), (0, 1024 * 1024 * 1024));
        assert_eq!(
            pull_progress("vllm/vllm-openai:v0.21.0", &layers),
            "pulling vllm/vllm-openai:v0.21.0: 512.00 MiB / 2.00 GiB (25%, 2 layers)"
        );
    }

    #[test]
    fn only_a_404_from_image_inspect_is_a_missing_image() {
        use bollard::errors::Error as E;
        // Docker's answers, as its API gives them.
        let missing = E::DockerResponseServerError {
            status_code: 404,
            message: "No such image: ray:1".into(),
        };
        assert!(image_missing("node.node2", "ray:1", missing).is_ok());
        let broken = E::DockerResponseServerError {
            status_code: 500,
            message: "open /var/lib/docker/image/overlay2/repositories.json: input/output error"
                .into(),
        };
        let e = image_missing("node.node2", "ray:1", broken).unwrap_err();
        assert!(
            e.message.contains("failed to inspect image ray:1")
                && e.message.contains("input/output error"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("is not on"), "{}", e.message);
        assert!(!e.help.as_deref().unwrap_or("").contains("docker load"));
        // The forward of the node's socket ends when the node is cut off.
        let lost = E::IOError {
            err: std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "Connection reset by peer",
            ),
        };
        let e = image_missing("node.node2", "ray:1", lost).unwrap_err();
        assert!(
            e.message
                .contains("connection to the node's Docker Engine was lost"),
            "{}",
            e.message
        );
        assert!(image_missing("node.node2", "ray:1", E::RequestTimeoutError).is_err());
    }

    #[test]
    fn a_restart_before_ready_is_a_crash_loop_and_an_exit_is_an_exit() {
        let l = |running, restarting, restarts| Liveness {
            running,
            restarting,
            restarts,
        };
        assert_eq!(doomed(&l(true, false, 0)), None);
        assert_eq!(doomed(&l(false, false, 0)), Some(Doomed::Exited));
        assert_eq!(
            doomed(&l(true, false, 8)),
            Some(Doomed::CrashLoop(
                "is crash-looping: Docker restarted it 8 times before it was ready".into()
            ))
        );
        // Between two restarts Docker reports it restarting (and running).
        assert!(
            matches!(doomed(&l(true, true, 1)), Some(Doomed::CrashLoop(m)) if m.contains("once"))
        );
    }
}

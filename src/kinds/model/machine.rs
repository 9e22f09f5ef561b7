//! The model kind on the machines: `transfer.py` in one-shot containers of the block's image
//! (it carries `huggingface_hub`), on the host network, the cache folder bind-mounted at the
//! same path. The download node's step downloads and verifies; every other node's step starts
//! `serve` on the download node's fabric address, pulls from it (sha256 while streaming) and
//! stops the serve container however the step ends.
//!
//! The program and its input (the hub token of a download; the transfer's own random token
//! of a serve and its pull) reach the container as files put into it before it starts
//! (Docker's archive upload), the input removed once it is open: never in its command line or
//! its environment, so `docker inspect` shows neither. Helper containers carry the label
//! [`LABEL_HELPER`] (not the lineage label containers are observed by), what they do in
//! [`LABEL_TRANSFER`], and a name derived from the step, so one left by a killed run is
//! replaced by the next run of its step, and stopped before a delete removes the copy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters as q;

use super::desired::Kept;
use super::{human_bytes, is_commit, Desired, Recorded};
use crate::config::Config;
use crate::events::Event;
use crate::hosts::{Host, HostError};
use crate::kinds::machine::{remove_container, tar_of, Changed};
use crate::kinds::machine::{
    Check, Done, Machine, NodeObservations, ReadCx, ReadError, ReadMode, Record, Restorable, Step,
    StepCx, StepError,
};
use crate::runtime::one_shot;

mod arch;
pub mod observe;
mod read;
mod restore;

use crate::plan::{Action, Drift};
pub use arch::{architecture_checks, lacking};

pub struct ModelMachine;
pub static MACHINE: ModelMachine = ModelMachine;

/// The program, as the nodes run it.
pub const TRANSFER_PY: &str = include_str!("transfer.py");

/// The label of the helper containers, valued with the deployment's lineage.
pub const LABEL_HELPER: &str = "sparkform.model-helper";

/// What a helper does: `["BLOCK", "NODE", "MODE"]` (the node whose step it is), so a later run
/// finds what a killed one left without parsing names.
const LABEL_TRANSFER: &str = "sparkform.model-transfer";

/// Which sparkform process made a helper: a run removes the exited helpers of the deployment
/// that other runs left (a killed run never removes its own), never one of its own, which its
/// step may still be reading.
const LABEL_RUN: &str = "sparkform.run";

/// The lineage a plan-time resolve runs its helper under (no deployment's).
const RESOLVE_LINEAGE: &str = "resolve";

/// This process's value of [`LABEL_RUN`]: random, drawn once.
fn this_run() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let mut bytes = [0u8; 8];
        // Without randomness the process id still tells this run from a killed one.
        if getrandom::fill(&mut bytes).is_err() {
            return format!("pid-{}", std::process::id());
        }
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    })
}

/// Remove the deployment's helpers that exited under another run (a run killed while its
/// helper ran leaves it behind: a SIGKILL stops sparkform, not its helpers); one that still
/// runs is left to the step that replaces or stops it by name.
async fn remove_exited_of_other_runs(docker: &bollard::Docker, lineage: &str) {
    // Created and never started (killed between the two), or ended.
    remove_helpers(docker, lineage, &["created", "exited", "dead"], |labels| {
        labels.get(LABEL_RUN).map(String::as_str) != Some(this_run())
    })
    .await;
}

/// Remove the deployment's helpers (in one of `statuses`, or any) whose labels `which` picks. Unlisted,
/// they stay: what called this goes on, and a later run finds them again.
async fn remove_helpers(
    docker: &bollard::Docker,
    lineage: &str,
    statuses: &[&str],
    which: impl Fn(&std::collections::HashMap<String, String>) -> bool,
) {
    let mut filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![format!("{LABEL_HELPER}={lineage}")],
    )]);
    if !statuses.is_empty() {
        let statuses = statuses.iter().map(|s| s.to_string()).collect();
        filters.insert("status".to_string(), statuses);
    }
    let options = q::ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    for c in docker
        .list_containers(Some(options))
        .await
        .unwrap_or_default()
    {
        let picked = c.labels.as_ref().is_some_and(&which);
        if let (true, Some(id)) = (picked, c.id.as_deref()) {
            remove_container(docker, id).await;
        }
    }
}

/// How the container runs the program: its input file on standard input, removed as soon as it
/// is open (so a token in it is in no file once the program runs, and none is left in a
/// container a killed run leaves behind), the mode and its arguments passed as arguments
/// (`"$@"`), never pasted into the shell line.
const RUNNER: &str = "exec < /sparkform/input && rm -f /sparkform/input 2>/dev/null; exec python3 /sparkform/transfer.py \"$@\"";

/// How long a serve container waits for a request before it stops by itself (a puller that
/// went away, a sparkform that was killed).
const SERVE_IDLE_SECS: u32 = 120;

/// A one-shot run of transfer.py on a node.
struct Job<'a> {
    node: &'a str,
    docker: &'a bollard::Docker,
    who: Helper,
    image: &'a str,
    cache: &'a str,
    args: Vec<String>,
    /// Standard input: the hub token's or the transfer token's line, when there is one.
    input: String,
    lineage: &'a str,
}

/// How a run ended.
#[derive(Debug, Default)]
struct JobEnd {
    code: i64,
    result: Option<serde_json::Value>,
    error: Option<String>,
    stderr: Vec<String>,
    events: Vec<serde_json::Value>,
}

/// A helper container's name and what it does, for whoever finds it later.
struct Helper {
    name: String,
    /// The value of [`LABEL_TRANSFER`]: `[block, node, mode]` as JSON.
    transfer: String,
}

fn helper(block: &str, node: &str, mode: &str) -> Helper {
    Helper {
        name: helper_name(block, node, mode),
        transfer: serde_json::json!([block, node, mode]).to_string(),
    }
}

/// A name Docker accepts, from the step's parts.
fn helper_name(block: &str, node: &str, mode: &str) -> String {
    crate::kinds::machine::docker_name(&format!("sparkform-{block}-{node}-{mode}"))
}

/// Create the helper container (removing one a killed run left), put the program and its
/// input in, start it.
async fn spawn(job: &Job<'_>) -> Result<String, StepError> {
    let mut cmd = vec![
        "sh".to_string(),
        "-c".to_string(),
        RUNNER.to_string(),
        "transfer.py".to_string(),
    ];
    cmd.extend(job.args.iter().cloned());
    spawn_with(job, cmd).await
}

async fn spawn_with(job: &Job<'_>, cmd: Vec<String>) -> Result<String, StepError> {
    if job.lineage != RESOLVE_LINEAGE {
        remove_exited_of_other_runs(job.docker, job.lineage).await;
    }
    let mut labels = std::collections::HashMap::new();
    labels.insert(LABEL_HELPER.to_string(), job.lineage.to_string());
    labels.insert(LABEL_TRANSFER.to_string(), job.who.transfer.clone());
    labels.insert(LABEL_RUN.to_string(), this_run().to_string());
    let body = ContainerCreateBody {
        image: Some(job.image.to_string()),
        entrypoint: Some(cmd),
        cmd: None,
        labels: Some(labels),
        env: Some(vec![
            "HF_HUB_DISABLE_TELEMETRY=1".into(),
            "PYTHONUNBUFFERED=1".into(),
        ]),
        host_config: Some(HostConfig {
            binds: Some(vec![format!("{}:{}", job.cache, job.cache)]),
            network_mode: Some("host".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let tar = tar_of(&[
        ("transfer.py", TRANSFER_PY.as_bytes(), 0o755),
        ("input", job.input.as_bytes(), 0o600),
    ])?;
    one_shot::start(job.docker, &job.who.name, body, Some(tar))
        .await
        .map_err(|e| {
            let hint = format!("the image {} is not on {}: pull it there (or set the model block's `image` to one the node has)", job.image, job.node);
            crate::kinds::machine::helper_not_started(
                job.node,
                &format!("the transfer container {}", job.who.name),
                &hint,
                e,
            )
        })
}

/// Follow a helper's output to its end: every JSON line goes to `on_event`; `stop_when` ends
/// the following early (serve's `listening`). Returns what was seen.
async fn follow(
    docker: &bollard::Docker,
    id: &str,
    on_event: &mut (dyn FnMut(&serde_json::Value) + Send),
    stop_when: Option<&str>,
) -> JobEnd {
    let mut end = JobEnd::default();
    let mut buf = String::new();
    let mut stopped = false;
    let seen = &mut end;
    one_shot::follow(docker, id, &mut |is_stderr, text| {
        if is_stderr {
            for l in text.lines() {
                seen.stderr.push(l.to_string());
                if seen.stderr.len() > 20 {
                    seen.stderr.remove(0);
                }
            }
            return true;
        }
        buf.push_str(text);
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
                continue;
            };
            let ev = v.get("event").and_then(|e| e.as_str()).unwrap_or_default();
            match ev {
                "result" => seen.result = Some(v.clone()),
                "error" => {
                    seen.error = v
                        .get("message")
                        .and_then(|m| m.as_str())
                        .map(str::to_string)
                }
                "progress" => {}
                _ => seen.events.push(v.clone()),
            }
            on_event(&v);
            if stop_when == Some(ev) {
                stopped = true;
                return false;
            }
        }
        true
    })
    .await;
    if stopped {
        return end;
    }
    end.code = one_shot::exit_code(docker, id).await.unwrap_or(-1);
    end
}

/// Run a helper to its end and remove it; on cancel it is stopped (transfer.py keeps what it
/// verified) and removed.
async fn run(
    job: &Job<'_>,
    on_event: &mut (dyn FnMut(&serde_json::Value) + Send),
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<JobEnd, StepError> {
    let id = spawn(job).await?;
    let outcome = tokio::select! {
        end = follow(job.docker, &id, on_event, None) => Ok(end),
        _ = cancel.cancelled() => Err(StepError::new(format!("{}: interrupted; what was verified is kept", job.node))),
    };
    if outcome.is_err() {
        let _ = job
            .docker
            .stop_container(
                &id,
                Some(q::StopContainerOptions {
                    t: Some(10),
                    ..Default::default()
                }),
            )
            .await;
    }
    remove_container(job.docker, &id).await;
    outcome
}

/// A failed run as a step error, with transfer.py's message and exit code explained.
fn failed(node: &str, what: &str, end: &JobEnd) -> StepError {
    let why = end
        .error
        .clone()
        .or_else(|| end.stderr.last().cloned())
        .unwrap_or_else(|| format!("exit code {}", end.code));
    let help = match end.code {
        3 => "a file's size or sha256 differs from the hub's manifest; nothing unverified was kept: apply again to fetch it again",
        4 => "the hub or the peer failed: check the endpoint, the token and the fabric between the nodes",
        5 => "the repository, revision or file is unknown to the hub (or the token may not read it)",
        6 => "the image lacks huggingface_hub: set the model block's `image` to the deployment's vLLM image",
        7 => "a local I/O error on the node: is the cache folder writable, is the disk full?",
        8 => "interrupted: what was verified is kept; apply again to finish",
        _ => "see the message; apply again once it is fixed",
    };
    StepError::new(format!("{node}: {what} failed: {why}"))
        .details(end.stderr.clone())
        .help(help)
}

/// A text field of what transfer.py or a one-shot run printed (a JSON line).
fn s<'a>(v: &'a serde_json::Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(|x| x.as_str())
}

/// A list of texts of what a one-shot run printed.
fn list(v: &serde_json::Value, k: &str) -> Vec<String> {
    v.get(k)
        .and_then(|x| x.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What a step reads from its configuration: the desired one with its commit resolved.
struct Want {
    block: String,
    repo: String,
    revision: String,
    commit: String,
    cache: String,
    image: String,
    node_name: String,
    role: String,
    download_node: String,
    source_address: Option<String>,
    /// The download node's other fabric addresses: serve listens and pull connects on all.
    more_source_addresses: Vec<String>,
    endpoint: Option<String>,
    token: Option<String>,
    include: Vec<String>,
    exclude: Vec<String>,
}

fn want(address: &str, c: &Desired) -> Result<Want, StepError> {
    let commit = c.commit.clone().filter(|c| is_commit(c)).ok_or_else(|| {
        StepError::new(format!(
            "{address}: revision {:?} of {} is not resolved to a commit",
            c.revision, c.repo
        ))
        .help("plan and apply resolve it on the download node; with -refresh=false the commit recorded in the state is used")
    })?;
    Ok(Want {
        block: c.block.clone(),
        repo: c.repo.clone(),
        revision: c.revision.clone(),
        commit,
        cache: c.cache.clone(),
        image: c.image.clone(),
        node_name: c.node_name.clone(),
        role: c.role.clone(),
        download_node: c.download_node.clone(),
        source_address: c.source_address.clone(),
        more_source_addresses: c.more_source_addresses.clone(),
        endpoint: c.endpoint().map(str::to_string),
        token: c.token().map(str::to_string),
        include: c.include.clone(),
        exclude: c.exclude.clone(),
    })
}

/// [`want`] of a recorded configuration (`None`: it does not read as a model's).
fn want_recorded(address: &str, config: Option<&Desired>) -> Result<Want, StepError> {
    let c = config.ok_or_else(|| {
        StepError::new(format!(
            "{address}: the recorded configuration is not a model's"
        ))
    })?;
    want(address, c)
}

fn filters(w: &Want) -> Vec<String> {
    let mut a = Vec::new();
    for p in &w.include {
        a.push("--include".into());
        a.push(p.clone());
    }
    for p in &w.exclude {
        a.push("--exclude".into());
        a.push(p.clone());
    }
    a
}

/// Progress lines from transfer.py's `progress` events, at most one a second.
struct Reporter<'a, 'b> {
    cx: &'a StepCx<'b>,
    what: &'static str,
    node: String,
    last: Option<Instant>,
}

impl Reporter<'_, '_> {
    fn on(&mut self, v: &serde_json::Value) {
        if s(v, "event") != Some("progress") {
            return;
        }
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last = Some(Instant::now());
        let done = v.get("bytes_done").and_then(|x| x.as_u64()).unwrap_or(0);
        let total = v.get("bytes_total").and_then(|x| x.as_u64()).unwrap_or(0);
        let rate = v.get("rate_bps").and_then(|x| x.as_u64()).unwrap_or(0);
        let pct = (total > 0).then(|| done as f64 * 100.0 / total as f64);
        let line = format!(
            "{} on {}: {} of {} at {}/s",
            self.what,
            self.node,
            human_bytes(done),
            human_bytes(total),
            human_bytes(rate)
        );
        self.cx.emit(Event::Phase {
            address: self.cx.address.to_string(),
            phase: self.what.to_string(),
            percent: pct,
            line: line.clone(),
        });
        self.cx.progress(line, None, None);
    }
}

async fn download(cx: &StepCx<'_>, w: &Want, deep: bool) -> Result<Done<ModelMachine>, StepError> {
    let host = cx.host()?;
    let node = host.node().to_string();
    let _alone = cache_lock(&node, w).await;
    let docker = host.docker().await?;
    let mut args = vec![
        "download".to_string(),
        w.repo.clone(),
        w.commit.clone(),
        "--cache".into(),
        w.cache.clone(),
    ];
    if !is_commit(&w.revision) {
        args.extend(["--ref".to_string(), w.revision.clone()]);
    }
    if let Some(ep) = &w.endpoint {
        args.extend(["--endpoint".to_string(), ep.clone()]);
    }
    if deep {
        args.push("--deep".into());
    }
    let mut input = String::new();
    if let Some(t) = &w.token {
        args.push("--token-stdin".into());
        input = format!("{t}\n");
    }
    args.extend(filters(w));
    let job = Job {
        node: &node,
        docker: &docker,
        who: helper(&w.block, &w.node_name, "download"),
        image: &w.image,
        cache: &w.cache,
        args,
        input,
        lineage: cx.lineage,
    };
    cx.progress(
        format!("downloading {} at {} on {node}", w.repo, &w.commit[..12]),
        None,
        None,
    );
    let mut rep = Reporter {
        cx,
        what: "downloading",
        node: node.clone(),
        last: None,
    };
    let end = run(&job, &mut |v| rep.on(v), cx.cancel).await?;
    let Some(result) = end.result.as_ref().filter(|_| end.code == 0) else {
        return Err(failed(&node, "downloading the model", &end));
    };
    Ok(copy_done(
        w,
        result,
        ("bytes_downloaded", "files_downloaded"),
        Recorded::default(),
        |total, got| format!("{total} verified on {node} ({got} fetched from the hub)"),
    ))
}

/// What a model step undoes: the commit it verified (kept by a rollback), and the earlier
/// revisions that no longer fit `keep_revisions` (removed once the apply succeeded).
#[derive(Debug, Clone, Default)]
pub struct Undo {
    commit: String,
    /// The earlier revisions' snapshots beyond `keep_revisions`, removed once the apply
    /// succeeded.
    evict: Vec<String>,
}

/// A download's or pull's result (transfer.py's `result` event) as the step's record: the
/// commit, sizes and file count under the same names for both roles, plus a pull's own.
fn copy_done(
    w: &Want,
    r: &serde_json::Value,
    (bytes_key, files_key): (&str, &str),
    mut recorded: Recorded,
    summary: impl FnOnce(String, String) -> String,
) -> Done<ModelMachine> {
    let num = |k: &str| r.get(k).and_then(|x| x.as_u64());
    let (got, total) = (num(bytes_key).unwrap_or(0), num("bytes_total").unwrap_or(0));
    recorded.commit = Some(w.commit.clone());
    recorded.bytes_total = Some(total);
    recorded.bytes_fetched = Some(got);
    recorded.files_fetched = num(files_key);
    recorded.seconds = r.get("seconds").and_then(|x| x.as_number()).cloned();
    Done {
        recorded,
        undo: Undo {
            commit: w.commit.clone(),
            evict: Vec::new(),
        },
        summary: summary(human_bytes(total), human_bytes(got)),
    }
}

async fn pull(cx: &StepCx<'_>, w: &Want, deep: bool) -> Result<Done<ModelMachine>, StepError> {
    let host = cx.host()?;
    let node = host.node().to_string();
    let _alone = cache_lock(&node, w).await;
    let docker = host.docker().await?;
    let source = w.source_address.clone().ok_or_else(|| {
        StepError::new(format!(
            "{}: the download node has no address on the model's network",
            cx.address
        ))
    })?;
    // Every fabric address of the download node: serve listens on each, pull spreads over them.
    let source = std::iter::once(source)
        .chain(w.more_source_addresses.iter().cloned())
        .collect::<Vec<_>>()
        .join(",");
    let dl_host: Arc<dyn Host> = cx.pool.get(&w.download_node)?;
    let dl_node = dl_host.node().to_string();
    let dl_docker = dl_host.docker().await?;
    // A token of this transfer alone, that serve requires of every request and pull sends: in
    // both containers' input (standard input), never in an argument, the environment or the
    // state.
    let token = transfer_token()?;
    // serve: the download node's fabric address only, an ephemeral port
    let serve = Job {
        node: &dl_node,
        docker: &dl_docker,
        who: helper(&w.block, &w.node_name, "serve"),
        image: &w.image,
        cache: &w.cache,
        args: [
            vec!["serve".into(), source.clone(), "0".into()],
            snapshot_args(w, &w.commit),
            vec![
                "--idle-timeout".into(),
                SERVE_IDLE_SECS.to_string(),
                "--auth-stdin".into(),
            ],
        ]
        .concat(),
        input: format!("{token}\n"),
        lineage: cx.lineage,
    };
    cx.progress(
        format!("serving the weights on {dl_node} at {source}"),
        None,
        None,
    );
    let serve_id = spawn(&serve).await?;
    let mut ignore = |_: &serde_json::Value| {};
    let listening = tokio::select! {
        end = tokio::time::timeout(Duration::from_secs(120), follow(&dl_docker, &serve_id, &mut ignore, Some("listening"))) => end.ok(),
        _ = cx.cancel.cancelled() => None,
    };
    let port = listening
        .as_ref()
        .and_then(|end| {
            end.events
                .iter()
                .find(|e| s(e, "event") == Some("listening"))
        })
        .and_then(|e| e.get("port"))
        .and_then(|p| p.as_u64());
    let result = match port {
        None => {
            let end = listening.unwrap_or_default();
            Err(failed(
                &dl_node,
                "serving the weights to the other nodes",
                &end,
            ))
        }
        Some(port) => {
            let args = pull_args(w, &source, port, deep);
            let job = Job {
                node: &node,
                docker: &docker,
                who: helper(&w.block, &w.node_name, "pull"),
                image: &w.image,
                cache: &w.cache,
                args,
                input: format!("{token}\n"),
                lineage: cx.lineage,
            };
            let mut rep = Reporter {
                cx,
                what: "copying",
                node: node.clone(),
                last: None,
            };
            run(&job, &mut |v| rep.on(v), cx.cancel).await
        }
    };
    // The serve container goes however the pull ended; what it served (and to whom) first.
    let served = crate::runtime::exec::log_tail(&dl_docker, &serve_id, 2000).await;
    let _ = dl_docker
        .stop_container(
            &serve_id,
            Some(q::StopContainerOptions {
                t: Some(5),
                ..Default::default()
            }),
        )
        .await;
    remove_container(&dl_docker, &serve_id).await;
    let end = result?;
    let Some(r) = end.result.as_ref().filter(|_| end.code == 0) else {
        return Err(failed(
            &node,
            &format!("copying the model from {dl_node}"),
            &end,
        ));
    };
    let peers = peers_served(&served);
    let over = served_over(&served);
    let extra = Recorded {
        served_over: Some(over),
        source: Some(format!("{source}:{}", port.unwrap_or(0))),
        peers_served: Some(peers),
        rate_bps: r.get("rate_bps").and_then(|x| x.as_number()).cloned(),
        ..Recorded::default()
    };
    Ok(copy_done(
        w,
        r,
        ("bytes_copied", "files_copied"),
        extra,
        |total, copied| {
            format!("{total} verified on {node} ({copied} copied from {dl_node} over {source})")
        },
    ))
}

/// A transfer's token: 32 bytes from the operating system's CSPRNG, as hex.
fn transfer_token() -> Result<String, StepError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| StepError::new(format!("no random token for the transfer: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Which snapshot a transfer works on: the repository, `commit` and the cache folder.
fn snapshot_args(w: &Want, commit: &str) -> Vec<String> {
    vec![
        "--repo".into(),
        w.repo.clone(),
        "--commit".into(),
        commit.to_string(),
        "--cache".into(),
        w.cache.clone(),
    ]
}

/// transfer.py's `pull` from the serve at `source:port`.
fn pull_args(w: &Want, source: &str, port: u64, deep: bool) -> Vec<String> {
    let mut args = vec!["pull".to_string(), source.to_string(), port.to_string()];
    args.extend(snapshot_args(w, &w.commit));
    if !is_commit(&w.revision) {
        args.extend(["--ref".to_string(), w.revision.clone()]);
    }
    if deep {
        args.push("--deep".into());
    }
    args.push("--auth-stdin".into());
    args.extend(filters(w));
    args
}

/// The bytes a serve's log says it sent, by the address each request came in on (`local`): how
/// a copy spread over the download node's fabric addresses.
fn served_over(log: &[String]) -> BTreeMap<String, u64> {
    let mut over = BTreeMap::new();
    for v in log
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| s(v, "event") == Some("served"))
    {
        if let Some(local) = s(&v, "local") {
            *over.entry(local.to_string()).or_default() +=
                v.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0);
        }
    }
    over
}

/// The peers a serve's log says it served, each once.
fn peers_served(log: &[String]) -> Vec<String> {
    let mut peers: Vec<String> = log
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| s(v, "event") == Some("served"))
        .filter_map(|v| s(&v, "peer").map(str::to_string))
        .collect();
    peers.sort();
    peers.dedup();
    peers
}

/// Whether a helper (its [`LABEL_TRANSFER`] value) is one of a block's transfers on a node:
/// its pull or download (which write the node's copy) or a serve there (which reads it),
/// whichever node pulls.
fn is_transfer_of(label: &str, block: &str, node_name: &str) -> bool {
    let Ok([b, n, mode]) = serde_json::from_str::<[String; 3]>(label) else {
        return false;
    };
    b == block
        && (mode == "serve" || n == node_name && matches!(mode.as_str(), "pull" | "download"))
}

/// The transfers of the block a killed run left on the node (a SIGKILL stops sparkform, not
/// its helpers): stopped and removed before the copy goes, or a pull still running would write
/// its files back after the removal, and a serve would hold them open. Nothing else of the
/// block runs then: the state lock keeps other applies out, and a delete or a finalize runs
/// when the block's copies on the node are not being made.
async fn remove_stale_transfers(docker: &bollard::Docker, lineage: &str, w: &Want) {
    remove_helpers(docker, lineage, &[], |labels| {
        labels
            .get(LABEL_TRANSFER)
            .is_some_and(|t| is_transfer_of(t, &w.block, &w.node_name))
    })
    .await;
}

/// One change at a time to a repository's folder in a node's cache: a removal decides which
/// blobs no other snapshot links to, so another removal or a copy into the same folder at the
/// same time would make it remove a blob that is being linked (or keep one that is not).
async fn cache_lock(node: &str, w: &Want) -> tokio::sync::OwnedMutexGuard<()> {
    let folder = observe::storage_folder(&w.cache, &w.repo);
    crate::kinds::machine::one_at_a_time(&format!("model folder {folder} on {node}")).await
}

/// Remove one commit's snapshot from a node.
async fn remove_snapshot(
    host: &dyn Host,
    lineage: &str,
    w: &Want,
    commit: &str,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<String, StepError> {
    let node = host.node().to_string();
    let _alone = cache_lock(&node, w).await;
    let docker = host.docker().await?;
    remove_stale_transfers(&docker, lineage, w).await;
    let job = Job {
        node: &node,
        docker: &docker,
        who: helper(&w.block, &w.node_name, "remove"),
        image: &w.image,
        cache: &w.cache,
        args: [vec!["remove".into()], snapshot_args(w, commit)].concat(),
        input: String::new(),
        lineage,
    };
    let end = run(&job, &mut |_| {}, cancel).await?;
    if end.code != 0 {
        return Err(failed(&node, "removing the model's snapshot", &end));
    }
    let freed = end
        .result
        .as_ref()
        .and_then(|r| r.get("bytes_freed"))
        .and_then(|x| x.as_u64())
        .unwrap_or(0);
    Ok(format!(
        "removed {} at {} from {node} ({} freed)",
        w.repo,
        &commit[..commit.len().min(12)],
        human_bytes(freed)
    ))
}

/// What resolving a revision needs: the download node's view of the hub.
pub struct ResolveRequest<'a> {
    pub block: &'a str,
    pub repo: &'a str,
    pub revision: &'a str,
    pub image: &'a str,
    pub cache: &'a str,
    pub endpoint: Option<&'a str>,
    pub token: Option<&'a str>,
    pub include: &'a [String],
    pub exclude: &'a [String],
    /// With the hub unreachable, resolve a revision the node keeps from what it recorded.
    pub offline: bool,
}

/// Resolve a revision to its commit and manifest (with the `config.json` facts) on a node, as
/// its vLLM containers will reach the hub: transfer.py's `resolve` result.
pub async fn resolve(
    host: &dyn Host,
    req: &ResolveRequest<'_>,
) -> Result<serde_json::Value, StepError> {
    let node = host.node().to_string();
    let docker = host.docker().await?;
    let mut args = vec![
        "resolve".to_string(),
        req.repo.to_string(),
        req.revision.to_string(),
    ];
    if req.offline {
        // With the cache, a revision the node keeps resolves without the hub when it is down.
        args.extend(["--cache".to_string(), req.cache.to_string()]);
    }
    if let Some(ep) = req.endpoint {
        args.extend(["--endpoint".to_string(), ep.to_string()]);
    }
    let mut input = String::new();
    if let Some(t) = req.token {
        args.push("--token-stdin".into());
        input = format!("{t}\n");
    }
    for p in req.include {
        args.extend(["--include".to_string(), p.clone()]);
    }
    for p in req.exclude {
        args.extend(["--exclude".to_string(), p.clone()]);
    }
    let job = Job {
        node: &node,
        docker: &docker,
        who: helper(req.block, &node.replace("node.", ""), "resolve"),
        image: req.image,
        cache: req.cache,
        args,
        input,
        lineage: RESOLVE_LINEAGE,
    };
    let never = tokio_util::sync::CancellationToken::new();
    let end = run(&job, &mut |_| {}, &never).await?;
    match end.result {
        Some(mut r) if end.code == 0 => {
            if let Some(o) = r.as_object_mut() {
                o.remove("event");
                o.remove("mode");
            }
            Ok(r)
        }
        _ => Err(failed(
            &node,
            &format!("resolving {} at {:?}", req.repo, req.revision),
            &end,
        )),
    }
}

fn recorded_commit(cx: &Step<'_, super::Model>) -> Option<String> {
    cx.recorded_config()
        .and_then(|d| d.commit.clone())
        .filter(|c| is_commit(c))
}

/// The earlier revisions' snapshots a node keeps once `commit` is in use, newest first, at
/// most `keep - 1`: the one the state recorded in use until now, then those it kept (the one
/// now in use leaves the list); and the commits that fall off it, to remove.
fn kept_after(cx: &Step<'_, super::Model>, commit: &str, keep: u64) -> (Vec<Kept>, Vec<String>) {
    let facts = cx.recorded_facts();
    let previous = recorded_commit(cx).map(|c| Kept {
        commit: c,
        bytes: facts.as_ref().and_then(|f| f.bytes_total),
    });
    let earlier = facts.map(|f| f.kept.clone()).unwrap_or_default();
    Kept::after(previous.into_iter().chain(earlier), commit, keep)
}

#[async_trait]
impl Machine for ModelMachine {
    type Kind = super::Model;
    type Undo = Undo;

    /// Besides its image: whether the node still keeps the revision the generation ran as the
    /// manifest recorded at its download says, and else whether the hub can give it again
    /// (`restore::restorable`).
    async fn restorable(
        &self,
        host: &dyn Host,
        address: &str,
        record: &Record<'_, super::Model>,
        number: u64,
    ) -> Vec<Restorable> {
        restore::restorable(host, address, record, number).await
    }

    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check> {
        architecture_checks(config, &|a| changed.is(a))
    }

    async fn apply(
        &self,
        cx: &Step<'_, super::Model>,
        action: Action,
    ) -> Result<Done<Self>, StepError> {
        if action == Action::Delete {
            let rec = cx
                .recorded
                .as_ref()
                .ok_or_else(|| StepError::new(format!("{}: nothing recorded", cx.address)))?;
            let w = want_recorded(cx.address, rec.config.as_ref())?;
            // An untracked snapshot beside the recorded one (refresh found its record).
            let commit = match &cx.change.orphan {
                Some(o) if is_commit(&o.id) => o.id.clone(),
                Some(o) => {
                    return Err(StepError::new(format!(
                        "{}: the untracked snapshot {:?} is not named by a commit",
                        cx.address, o.id
                    )))
                }
                None => w.commit.clone(),
            };
            let host = cx.host()?;
            let mut summary =
                remove_snapshot(host.as_ref(), cx.lineage, &w, &commit, cx.cancel).await?;
            // The earlier revisions kept for a rollback go with the copy they were kept beside.
            if cx.change.orphan.is_none() {
                for k in rec.facts.kept.clone() {
                    let also = remove_snapshot(host.as_ref(), cx.lineage, &w, &k.commit, cx.cancel)
                        .await?;
                    summary.push_str(&format!("; {also}"));
                }
            }
            return Ok(Done::summary(summary));
        }
        let w = want(cx.address, cx.desired()?)?;
        // Drift (a file missing or corrupt) rereads every file, not only the unrecorded ones.
        let deep = !cx.change.drift.is_empty();
        let mut done = match w.role.as_str() {
            "download" => download(cx, &w, deep).await?,
            _ => pull(cx, &w, deep).await?,
        };
        let (kept, evict) = kept_after(cx, &w.commit, cx.desired()?.keep_revisions());
        done.recorded.kept = kept;
        done.undo.evict = evict;
        Ok(done)
    }

    /// A rollback keeps the copy the step verified: the weights cost a download (or a copy)
    /// and nothing runs on them once what uses them is undone; the state forgets them, and the
    /// next apply finds them verified and fetches nothing again (an interrupted apply, a failed
    /// architecture check or vLLM start, then the fixed apply). A previous commit was never
    /// touched before `finalize`, so it is as it was.
    async fn undo(
        &self,
        cx: &Step<'_, super::Model>,
        action: Action,
        done: &Done<Self>,
    ) -> Result<String, StepError> {
        if action == Action::Delete {
            return Err(StepError::new(format!(
                "{}: the copy was removed; it is not put back",
                cx.address
            ))
            .help("apply again to fetch it again"));
        }
        let commit = done.undo.commit.as_str();
        let (node, cache) = cx
            .desired
            .as_ref()
            .map(|d| (d.node_name.clone(), d.cache.clone()))
            .unwrap_or_default();
        Ok(format!(
            "kept the verified copy at {} on {node} in {cache}: the next apply uses it without fetching it again",
            &commit[..commit.len().min(12)]
        ))
    }

    /// After a replacement succeeded, the snapshots of the revisions beyond `keep_revisions`
    /// go (blobs a kept one shares stay).
    async fn finalize(
        &self,
        cx: &Step<'_, super::Model>,
        _action: Action,
        done: &Done<Self>,
    ) -> Result<(), StepError> {
        if done.undo.evict.is_empty() {
            return Ok(());
        }
        let w = want(cx.address, cx.desired()?)?;
        let host = cx.host()?;
        for commit in &done.undo.evict {
            remove_snapshot(host.as_ref(), cx.lineage, &w, commit, cx.cancel).await?;
        }
        Ok(())
    }

    /// One command on the node for every recorded copy (and the untracked ones beside them);
    /// `-refresh=deep` rehashes each recorded copy in a one-shot container.
    async fn observe(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, Record<'_, super::Model>)],
        mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        let mut out = BTreeMap::new();
        let mut asked = Vec::new();
        let mut wants = Vec::new();
        for (address, r) in recorded {
            match want_recorded(address, r.config.as_ref()) {
                Ok(w) => {
                    asked.push(observe::Asked {
                        address: address.clone(),
                        repo: w.repo.clone(),
                        commit: w.commit.clone(),
                        cache: w.cache.clone(),
                        node_name: w.node_name.clone(),
                        kept: r.facts.kept.iter().map(|k| k.commit.clone()).collect(),
                    });
                    wants.push((address, w));
                }
                Err(_) => {
                    out.insert(address.clone(), Drift::Missing("no commit recorded".into()));
                }
            }
        }
        if asked.is_empty() {
            return Ok((out, Vec::new()));
        }
        let (seen, orphans) = observe::observe_copies(host, &asked).await?;
        out.extend(seen);
        if mode.deep() {
            for (address, w) in wants {
                let seen = observe::deep(host, lineage, address, &w).await?;
                out.insert(address.clone(), seen);
            }
        }
        Ok((out, orphans))
    }

    fn read_nodes(&self, config: &Config) -> Vec<String> {
        read::nodes(config)
    }

    async fn read(&self, cx: &ReadCx<'_>) -> Result<crate::config::Readings, ReadError> {
        read::read(cx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_a_tar_with_its_checksums_and_long_names_whole() {
        let t = tar_of(&[("input", b"secret\n", 0o600)]).unwrap();
        assert_eq!(t.len() % 512, 0);
        assert_eq!(&t[257..262], b"ustar");
        assert_eq!(&t[512..527], b"sparkform/input");
        // checksum of the second header
        let h = &t[512..1024];
        let mut copy = h.to_vec();
        copy[148..156].copy_from_slice(b"        ");
        let sum: u64 = copy.iter().map(|b| *b as u64).sum();
        let written = std::str::from_utf8(&h[148..156]).unwrap();
        let written = written.trim_matches(|c: char| c == '\0' || c == ' ');
        assert_eq!(u64::from_str_radix(written, 8).unwrap(), sum);
        assert_eq!(&t[1024..1031], b"secret\n");
        // Names over a header's 100 bytes, and over its 512: read back whole by a tar reader.
        for len in [150, 700] {
            let name = "n".repeat(len);
            let t = tar_of(&[(name.as_str(), b"x", 0o644)]).unwrap();
            let mut archive = tar::Archive::new(t.as_slice());
            let paths: Vec<String> = archive
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().display().to_string())
                .collect();
            assert_eq!(
                paths,
                ["sparkform/".to_string(), format!("sparkform/{name}")]
            );
        }
    }

    #[test]
    fn helper_names_are_docker_names() {
        assert_eq!(
            helper_name("module.m.model.qwen", "spark1", "pull"),
            "sparkform-module.m.model.qwen-spark1-pull"
        );
        assert!(!helper_name("model.a b", "n", "x").contains(' '));
    }

    #[test]
    fn a_removal_stops_the_blocks_transfers_on_its_node_only() {
        let b = "model.qwen-x";
        let t = |b: &str, n: &str, m: &str| helper(b, n, m).transfer;
        for stale in [
            t(b, "spark1", "pull"),
            t(b, "spark1", "download"),
            t(b, "spark2", "serve"),
        ] {
            assert!(is_transfer_of(&stale, b, "spark1"), "{stale}");
        }
        for other in [
            t(b, "spark1", "remove"),
            t(b, "spark1", "observe"),
            t(b, "spark2", "pull"),
            t("model.qwen", "spark1", "pull"),
            t("model.qwen-x-y", "spark2", "serve"),
            "not json".to_string(),
        ] {
            assert!(!is_transfer_of(&other, b, "spark1"), "{other}");
        }
    }
}

//! A Docker Engine in memory, for tests of the container and probe machines without Docker: an
//! HTTP server on a unix socket in a temporary folder that speaks the part of the Engine API
//! sparkform uses (ping, version, image inspect, containers: create, start, inspect, list by
//! label, rename, stop, kill, update, remove, logs; exec: create, start, inspect). A real
//! `bollard::Docker` talks to it, so the machines' code is the code that runs on a node.
//!
//! Faults it takes: creating a container fails, a container never becomes ready (every exec in
//! it exits 1), a container exits right after it starts with log lines, a command in it fails,
//! an image is another build than on the other nodes, the engine disappears at its k-th
//! request (it then drops every connection), a container crash-loops under its restart policy
//! (running, its RestartCount rising), an image inspect answers an error. The server's tasks and the folder end when the
//! [`FakeDocker`] is dropped.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

type Body = Full<Cursor<Vec<u8>>>;

/// The order of every fake engine's requests in this process ([`FakeDocker::timeline`]).
static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What goes wrong with one container (by its Docker name).
#[derive(Debug, Clone)]
pub enum Fault {
    /// Creating it fails with this message (a 500 from the engine).
    CreateFails(String),
    /// Every command run in it exits 1: an exec ready check never passes.
    NeverReady,
    /// It exits with this code right after it starts, having logged these lines.
    ExitsAfterStart(i64, Vec<String>),
    /// A command run in it whose program is this one exits with this code and message.
    ExecExits(String, i64, String),
    /// A command run in it whose last argument contains this text prints this and exits 0
    /// (HAProxy's `show stat`, asked through its admin socket).
    ExecAnswers(String, String),
    /// A command run in it that contains this text answers after this many milliseconds; its
    /// end is in the timeline (`exec done NAME: CMD`), so a test sees what waited for it.
    ExecTakes(String, u64),
    /// It starts, keeps running and logs these lines.
    Logs(Vec<String>),
    /// It crashes at once and Docker restarts it, again and again: every inspect finds it
    /// running with a RestartCount one higher, every command in it fails, and each restart
    /// logs these lines again.
    CrashLoop(Vec<String>),
}

/// A container as the fake engine holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub running: bool,
    pub exit_code: i64,
    pub restart: String,
    pub logs: Vec<String>,
    /// The body it was created with (`Cmd`, `Env`, `HostConfig`…), which inspect shows back;
    /// null for one added with [`FakeDocker::add`].
    pub created: Value,
    /// How many times the engine restarted it (Docker's `RestartCount`).
    pub restart_count: u64,
}

#[derive(Debug)]
struct Exec {
    container: String,
    cmd: Vec<String>,
    exit_code: Option<i64>,
}

#[derive(Debug, Default)]
struct Engine {
    containers: Vec<Container>,
    execs: BTreeMap<String, Exec>,
    faults: Vec<(String, Fault)>,
    /// Image IDs other than the default `sha256:NAME`.
    images: BTreeMap<String, String>,
    /// Images' own `Config` (`Env`, `Cmd`, `Labels`…), by name.
    image_configs: BTreeMap<String, Value>,
    /// Images whose inspect answers this status and message instead.
    image_errors: BTreeMap<String, (u16, String)>,
    requests: Vec<String>,
    /// Every request and every command run in a container, each with its place in the order of
    /// all the fake engines' requests (one counter for every engine of the test's process).
    timeline: Vec<(u64, String)>,
    /// Every container created so far (name, create body), removed ones included.
    created: Vec<(String, Value)>,
    /// Every archive put into a container (its name, the tar), removed ones included.
    uploads: Vec<(String, Vec<u8>)>,
    gone_at: Option<usize>,
    gone: bool,
}

impl Engine {
    fn find(&self, key: &str) -> Option<usize> {
        let key = key.trim_start_matches('/');
        self.containers
            .iter()
            .position(|c| c.id == key || c.name == key)
            .or_else(|| {
                // An id prefix, as `docker` accepts one.
                (key.len() >= 4)
                    .then(|| self.containers.iter().position(|c| c.id.starts_with(key)))
                    .flatten()
            })
    }

    fn fault(&self, name: &str) -> Option<&Fault> {
        self.faults
            .iter()
            .rev()
            .find(|(n, f)| {
                n == name
                    && !matches!(
                        f,
                        Fault::ExecExits(..) | Fault::ExecAnswers(..) | Fault::ExecTakes(..)
                    )
            })
            .map(|(_, f)| f)
    }

    /// How a command run in a container ends: (exit code, its output as a stream frame).
    fn exec_answer(&self, container: &str, cmd: &[String]) -> (i64, Vec<u8>) {
        let name = self
            .find(container)
            .map(|i| self.containers[i].name.as_str())
            .unwrap_or_default();
        for (_, f) in self.faults.iter().rev().filter(|(n, _)| n == name) {
            match f {
                Fault::NeverReady => return (1, frame(2, "not ready yet\n")),
                Fault::CrashLoop(_) => return (1, frame(2, "container is restarting\n")),
                Fault::ExecExits(program, code, message) if cmd.first() == Some(program) => {
                    return (*code, frame(2, &format!("{message}\n")))
                }
                Fault::ExecAnswers(needle, out)
                    if cmd.last().is_some_and(|l| l.contains(needle)) =>
                {
                    return (0, frame(1, out))
                }
                _ => {}
            }
        }
        (0, frame(1, &format!("ok: {}\n", cmd.join(" "))))
    }

    /// How long a command run in a container takes to answer ([`Fault::ExecTakes`]).
    fn exec_takes(&self, container: &str, cmd: &[String]) -> Option<Duration> {
        let name = self
            .find(container)
            .map(|i| self.containers[i].name.as_str())?;
        let joined = cmd.join(" ");
        self.faults.iter().rev().find_map(|(n, f)| match f {
            Fault::ExecTakes(needle, ms) if n == name && joined.contains(needle.as_str()) => {
                Some(Duration::from_millis(*ms))
            }
            _ => None,
        })
    }

    fn new_id(&mut self) -> String {
        // Unique across the engines of a test, as ids of different machines are.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Unique in their first 12 characters too, as Docker's short ids are.
        format!("fa4e{n:08x}{n:052x}")
    }
}

/// A fake Docker Engine, serving while it lives.
pub struct FakeDocker {
    engine: Arc<Mutex<Engine>>,
    socket: PathBuf,
    cancel: CancellationToken,
    // Holds the socket; removed with the fake.
    _dir: tempfile::TempDir,
}

impl Drop for FakeDocker {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn lock(engine: &Mutex<Engine>) -> MutexGuard<'_, Engine> {
    // A test that panicked while holding it leaves nothing worth refusing to read.
    engine.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeDocker {
    /// Start serving (inside a tokio runtime).
    pub fn start() -> std::io::Result<FakeDocker> {
        let dir = tempfile::Builder::new()
            .prefix("sparkform-docker")
            .tempdir()?;
        let socket = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let engine = Arc::new(Mutex::new(Engine::default()));
        let cancel = CancellationToken::new();
        let (e, c) = (engine.clone(), cancel.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = c.cancelled() => break,
                    s = listener.accept() => match s {
                        Ok((s, _)) => s,
                        Err(_) => break,
                    },
                };
                if lock(&e).gone {
                    drop(stream);
                    continue;
                }
                let (e, c2, stop) = (e.clone(), c.clone(), c.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (e, c) = (e.clone(), c2.clone());
                        async move { handle(&e, &c, req).await }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = conn => {}
                    }
                });
            }
        });
        Ok(FakeDocker {
            engine,
            socket,
            cancel,
            _dir: dir,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Inject a fault for the container named `name`.
    pub fn fault(&self, name: &str, fault: Fault) {
        lock(&self.engine).faults.push((name.to_string(), fault));
    }

    /// The ID this engine gives the image `name` (by default `sha256:NAME`): a node with
    /// another build of the same tag.
    pub fn image(&self, name: &str, id: &str) {
        lock(&self.engine)
            .images
            .insert(name.to_string(), id.to_string());
    }

    /// Inspecting the image `name` answers `status` with `message` (a 404 is a missing image;
    /// a 500 is an engine that cannot answer, e.g. its storage is gone).
    pub fn image_error(&self, name: &str, status: u16, message: &str) {
        lock(&self.engine)
            .image_errors
            .insert(name.to_string(), (status, message.to_string()));
    }

    /// Take every fault back, other image builds included (the machine is repaired).
    pub fn heal(&self) {
        let mut e = lock(&self.engine);
        e.faults.clear();
        e.images.clear();
        e.image_errors.clear();
    }

    /// The engine stops answering at its `k`-th request (from 1), and for good.
    pub fn disappear_at(&self, k: usize) {
        lock(&self.engine).gone_at = Some(k);
    }

    /// A container made outside sparkform (or left by an interrupted run).
    pub fn add(&self, name: &str, image: &str, labels: &[(&str, &str)], running: bool) -> String {
        let mut e = lock(&self.engine);
        let id = e.new_id();
        e.containers.push(Container {
            id: id.clone(),
            name: name.to_string(),
            image: image.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            running,
            exit_code: 0,
            restart: "no".into(),
            logs: Vec::new(),
            created: Value::Null,
            restart_count: 0,
        });
        id
    }

    /// The image `name`'s own configuration (its `Env`, `Cmd`, `Labels`), as image inspect
    /// shows it by name or by ID.
    pub fn image_config(&self, name: &str, config: Value) {
        lock(&self.engine)
            .image_configs
            .insert(name.to_string(), config);
    }

    /// A container renamed behind sparkform's back (or by a run that was then killed).
    pub fn rename(&self, name: &str, to: &str) {
        let mut e = lock(&self.engine);
        if let Some(i) = e.find(name) {
            e.containers[i].name = to.to_string();
        }
    }

    /// Someone stops a container by hand.
    pub fn stop(&self, name: &str) {
        let mut e = lock(&self.engine);
        if let Some(i) = e.find(name) {
            e.containers[i].running = false;
        }
    }

    /// A container's process ends on its own with `code` (137: killed, as by the kernel's
    /// OOM killer or a `docker kill`), behind sparkform's back.
    pub fn exit(&self, name: &str, code: i64) {
        let mut e = lock(&self.engine);
        if let Some(i) = e.find(name) {
            e.containers[i].running = false;
            e.containers[i].exit_code = code;
        }
    }

    pub fn containers(&self) -> Vec<Container> {
        lock(&self.engine).containers.clone()
    }

    pub fn container(&self, name: &str) -> Option<Container> {
        let e = lock(&self.engine);
        e.find(name).map(|i| e.containers[i].clone())
    }

    /// Every container created so far, removed ones too (one-shot helpers), with the body it
    /// was created with (`Entrypoint`, `Cmd`, `Env`…), in order.
    pub fn created(&self) -> Vec<(String, Value)> {
        lock(&self.engine).created.clone()
    }

    /// Every archive put into a container so far (the container's name, the tar as sent), in
    /// order: what the model kind's helpers get as files (the program, their input).
    pub fn uploads(&self) -> Vec<(String, Vec<u8>)> {
        lock(&self.engine).uploads.clone()
    }

    /// Every request so far, as `METHOD /path`, without the API version.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.engine).requests.clone()
    }

    /// Every request (`METHOD /path`), every container created (`create NAME`), stopped
    /// (`stop NAME`, `kill NAME`: the name it had then) and every command run in one (`exec
    /// NAME: CMD…`) so far, each with its place among all the fake engines' (merge two engines' timelines
    /// by it to see which came first).
    pub fn timeline(&self) -> Vec<(u64, String)> {
        lock(&self.engine).timeline.clone()
    }
}

fn reply(status: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Cursor::new(body.to_string().into_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Cursor::new(Vec::new())));
    *r.status_mut() = status;
    r
}

fn error(status: StatusCode, message: String) -> Response<Body> {
    reply(status, json!({ "message": message }))
}

fn no_such(key: &str) -> Response<Body> {
    error(
        StatusCode::NOT_FOUND,
        format!("No such container: {}", key.trim_start_matches('/')),
    )
}

/// `%7B%22label…` → `{"label…`; `+` is a space in a query.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (!k.is_empty()).then(|| (unescape(k), unescape(v)))
        })
        .collect()
}

/// A frame of Docker's multiplexed stream: 1 stdout, 2 stderr.
fn frame(stream: u8, text: &str) -> Vec<u8> {
    let mut f = vec![stream, 0, 0, 0];
    f.extend_from_slice(&(text.len() as u32).to_be_bytes());
    f.extend_from_slice(text.as_bytes());
    f
}

fn inspect(c: &Container) -> Value {
    let mut config = c.created.clone();
    let mut host_config = config
        .as_object_mut()
        .and_then(|m| m.remove("HostConfig"))
        .unwrap_or_else(|| json!({}));
    if !config.is_object() {
        config = json!({});
    }
    config["Image"] = json!(c.image);
    config["Labels"] = json!(c.labels);
    host_config["RestartPolicy"]["Name"] = json!(c.restart);
    json!({
        "Id": c.id,
        "Name": format!("/{}", c.name),
        "Image": default_id(&c.image),
        "State": {
            "Status": if c.running { "running" } else { "exited" },
            "Running": c.running,
            "ExitCode": c.exit_code,
            "OOMKilled": false,
        },
        "RestartCount": c.restart_count,
        "Config": config,
        "HostConfig": host_config,
    })
}

/// The ID an image the container was created from has by default: `sha256:NAME`, or the ID
/// itself when it was created from one.
fn default_id(image: &str) -> String {
    if image.starts_with("sha256:") {
        image.to_string()
    } else {
        format!("sha256:{image}")
    }
}

fn summary(c: &Container) -> Value {
    json!({
        "Id": c.id,
        "Names": [format!("/{}", c.name)],
        "Image": c.image,
        "ImageID": default_id(&c.image),
        "Labels": c.labels,
        "State": if c.running { "running" } else { "exited" },
        "Status": if c.running { "Up 1 second" } else { "Exited" },
    })
}

/// Whether a container carries every `key=value` (or `key`) label of a list filter.
fn labelled(c: &Container, filters: &Value) -> bool {
    let wanted: Vec<&str> = match filters.get("label") {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        // The older form: {"label": {"k=v": true}}.
        Some(Value::Object(m)) => m.keys().map(String::as_str).collect(),
        _ => Vec::new(),
    };
    wanted.iter().all(|w| match w.split_once('=') {
        Some((k, v)) => c.labels.get(k).map(String::as_str) == Some(v),
        None => c.labels.contains_key(*w),
    })
}

/// Whether a container is in a state of a `status` list filter (`running`, `exited`; any,
/// without one).
fn with_status(c: &Container, filters: &Value) -> bool {
    match filters.get("status") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .any(|s| s == if c.running { "running" } else { "exited" }),
        _ => true,
    }
}

/// Whether a container is one of an `id` list filter's (any, without one).
fn with_id(c: &Container, filters: &Value) -> bool {
    match filters.get("id") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .any(|id| c.id.starts_with(id)),
        _ => true,
    }
}

/// `GET /containers/json`: the containers its `all` and `filters` (label, id, status) select.
fn list_containers(e: &Engine, q: &BTreeMap<String, String>) -> Response<Body> {
    let all = q.get("all").is_some_and(|v| v == "true" || v == "1");
    let filters: Value = q
        .get("filters")
        .and_then(|f| serde_json::from_str(f).ok())
        .unwrap_or(Value::Null);
    let list: Vec<Value> = e
        .containers
        .iter()
        .filter(|c| {
            (all || c.running)
                && labelled(c, &filters)
                && with_id(c, &filters)
                && with_status(c, &filters)
        })
        .map(summary)
        .collect();
    reply(StatusCode::OK, Value::Array(list))
}

async fn handle(
    engine: &Arc<Mutex<Engine>>,
    cancel: &CancellationToken,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, std::io::Error> {
    let method = req.method().clone();
    // `/v1.47/containers/json` → `/containers/json`
    let full = req.uri().path().to_string();
    let path = match full.strip_prefix("/v") {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => rest
            .find('/')
            .map(|i| rest[i..].to_string())
            .unwrap_or_default(),
        _ => full.clone(),
    };
    {
        let mut e = lock(engine);
        e.requests.push(format!("{method} {path}"));
        let at = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        e.timeline.push((at, format!("{method} {path}")));
        let n = e.requests.len();
        if e.gone_at.is_some_and(|k| n >= k) {
            e.gone = true;
        }
        if e.gone {
            // The connection drops without an answer, as when the node goes away.
            return Err(std::io::Error::other("the fake engine went away"));
        }
    }
    let q = query(&req);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let raw = if method == Method::POST || method == Method::PUT {
        req.body_mut()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes()
    } else {
        bytes::Bytes::new()
    };
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let mut e = lock(engine);
    if let (&Method::PUT, ["containers", key, "archive"]) = (&method, segs.as_slice()) {
        if let Some(i) = e.find(&unescape(key)) {
            let name = e.containers[i].name.clone();
            e.uploads.push((name, raw.to_vec()));
        }
    }
    let r = match (&method, segs.as_slice()) {
        (&Method::GET | &Method::HEAD, ["_ping"]) => {
            let mut r = Response::new(Full::new(Cursor::new(b"OK".to_vec())));
            *r.status_mut() = StatusCode::OK;
            r
        }
        (&Method::GET, ["version"]) => reply(
            StatusCode::OK,
            json!({
                "Version": "27.0.0-fake",
                "ApiVersion": "1.47",
                "MinAPIVersion": "1.24",
                "Os": "linux",
                "Arch": "amd64",
                "KernelVersion": "6.8.0-fake",
            }),
        ),
        // Every image is there: `images/NAME[/MORE]/json`, the name may hold slashes.
        (&Method::GET, ["images", name @ .., "json"]) if !name.is_empty() => {
            inspect_image(&e, &unescape(&name.join("/")))
        }
        (&Method::POST, ["containers", "create"]) => create_container(&mut e, &q, &body),
        (&Method::GET, ["containers", "json"]) => list_containers(&e, &q),
        (m, ["containers", key, rest @ ..]) => {
            let key = unescape(key);
            match e.find(&key) {
                None => no_such(&key),
                Some(i) => container_request(&mut e, i, m, rest, &q, &body),
            }
        }
        (&Method::POST, ["exec", id, "start"]) => {
            let Some(x) = e.execs.get(*id) else {
                return Ok(error(
                    StatusCode::NOT_FOUND,
                    format!("No such exec instance: {id}"),
                ));
            };
            let (code, out) = e.exec_answer(&x.container, &x.cmd);
            let takes = e.exec_takes(&x.container, &x.cmd);
            let done = format!(
                "exec done {}: {}",
                e.find(&x.container)
                    .map(|i| e.containers[i].name.clone())
                    .unwrap_or_default(),
                x.cmd.join(" ")
            );
            if let Some(x) = e.execs.get_mut(*id) {
                x.exit_code = Some(code);
            }
            drop(e);
            let engine = engine.clone();
            // The client asked to upgrade: the output follows on the raw connection.
            let upgrade = hyper::upgrade::on(&mut req);
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let write = async {
                    if let Ok(up) = upgrade.await {
                        if let Some(t) = takes {
                            tokio::time::sleep(t).await;
                            let at = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            lock(&engine).timeline.push((at, done));
                        }
                        let mut io = TokioIo::new(up);
                        let _ = io.write_all(&out).await;
                        let _ = io.shutdown().await;
                    }
                };
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = write => {}
                }
            });
            let mut r = empty(StatusCode::SWITCHING_PROTOCOLS);
            r.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("Upgrade"),
            );
            r.headers_mut().insert(
                hyper::header::UPGRADE,
                hyper::header::HeaderValue::from_static("tcp"),
            );
            return Ok(r);
        }
        (&Method::GET, ["exec", id, "json"]) => match e.execs.get(*id) {
            Some(x) => reply(
                StatusCode::OK,
                json!({
                    "ID": id,
                    "Running": x.exit_code.is_none(),
                    "ExitCode": x.exit_code,
                    "ContainerID": x.container,
                }),
            ),
            None => error(
                StatusCode::NOT_FOUND,
                format!("No such exec instance: {id}"),
            ),
        },
        _ => error(
            StatusCode::NOT_FOUND,
            format!("the fake Docker Engine does not serve {method} {path}"),
        ),
    };
    Ok(r)
}

fn container_request(
    e: &mut Engine,
    i: usize,
    method: &Method,
    rest: &[&str],
    q: &BTreeMap<String, String>,
    body: &Value,
) -> Response<Body> {
    match (method, rest) {
        (&Method::GET, ["json"]) => {
            // A crash-looping container is found restarted once more at every look.
            if let Some(Fault::CrashLoop(lines)) = e.fault(&e.containers[i].name).cloned() {
                let c = &mut e.containers[i];
                if c.running {
                    c.restart_count += 1;
                    c.logs.extend(lines);
                }
            }
            reply(StatusCode::OK, inspect(&e.containers[i]))
        }
        // Files put into a container (the model kind's program) are recorded (`uploads`), not
        // unpacked.
        (&Method::PUT, ["archive"]) => empty(StatusCode::OK),
        (&Method::POST, ["start" | "restart"]) => start_container(e, i, rest == ["restart"]),
        (&Method::POST, ["stop" | "kill"]) => {
            let c = &mut e.containers[i];
            if !c.running {
                return empty(StatusCode::NOT_MODIFIED);
            }
            c.running = false;
            c.exit_code = if rest == ["kill"] { 137 } else { 0 };
            let what = format!("{} {}", rest[0], c.name);
            let at = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            e.timeline.push((at, what));
            empty(StatusCode::NO_CONTENT)
        }
        (&Method::POST, ["rename"]) => {
            let name = q.get("name").cloned().unwrap_or_default();
            // As Docker answers it.
            if e.containers[i].name == name {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Renaming a container with the same name as its current name".into(),
                );
            }
            if e.find(&name).is_some_and(|j| j != i) {
                return error(
                    StatusCode::CONFLICT,
                    format!("Conflict. The container name \"/{name}\" is already in use"),
                );
            }
            e.containers[i].name = name;
            empty(StatusCode::NO_CONTENT)
        }
        (&Method::POST, ["update"]) => {
            if let Some(r) = body.pointer("/RestartPolicy/Name").and_then(Value::as_str) {
                e.containers[i].restart = r.to_string();
            }
            reply(StatusCode::OK, json!({ "Warnings": [] }))
        }
        (&Method::DELETE, []) => {
            if e.containers[i].running && q.get("force").is_none_or(|f| f != "true") {
                return error(
                    StatusCode::CONFLICT,
                    "You cannot remove a running container; stop it first or use force".into(),
                );
            }
            e.containers.remove(i);
            empty(StatusCode::NO_CONTENT)
        }
        (&Method::GET, ["logs"]) => {
            let c = &e.containers[i];
            let tail = q
                .get("tail")
                .and_then(|t| t.parse::<usize>().ok())
                .unwrap_or(c.logs.len());
            let mut out = Vec::new();
            for l in &c.logs[c.logs.len().saturating_sub(tail)..] {
                out.extend(frame(1, &format!("{l}\n")));
            }
            let mut r = Response::new(Full::new(Cursor::new(out)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/vnd.docker.multiplexed-stream",
                ),
            );
            r
        }
        (&Method::POST, ["exec"]) => {
            let c = &e.containers[i];
            if !c.running {
                return error(
                    StatusCode::CONFLICT,
                    format!("container {} is not running", c.id),
                );
            }
            let container = c.id.clone();
            let name = c.name.clone();
            let cmd: Vec<String> = body
                .get("Cmd")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let id = e.new_id();
            let at = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            e.timeline
                .push((at, format!("exec {name}: {}", cmd.join(" "))));
            e.execs.insert(
                id.clone(),
                Exec {
                    container,
                    cmd,
                    exit_code: None,
                },
            );
            reply(StatusCode::CREATED, json!({ "Id": id }))
        }
        _ => error(
            StatusCode::NOT_FOUND,
            format!(
                "the fake Docker Engine does not serve {method} /containers/…/{}",
                rest.join("/")
            ),
        ),
    }
}

/// `GET /images/NAME/json`: every image is there (by name or by ID), unless an image error
/// is injected for it (for an ID, on the ID itself: a retagged name leaves its old image there
/// under its ID, as a Docker Engine does).
fn inspect_image(e: &Engine, name: &str) -> Response<Body> {
    let name = name.to_string();
    if let Some((status, message)) = e.image_errors.get(&name) {
        let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, message.clone());
    }
    let id_of = |n: &str| {
        e.images
            .get(n)
            .cloned()
            .unwrap_or_else(|| format!("sha256:{n}"))
    };
    if let Some(tag) = name.strip_prefix("sha256:") {
        // An ID: the name it is the ID of, where one still names it.
        let tags: Vec<&String> = e
            .images
            .keys()
            .chain(e.image_configs.keys())
            .filter(|n| id_of(n) == name)
            .collect();
        let tagged = tags.first().map(|t| t.to_string()).or_else(|| {
            (!e.images.contains_key(tag) && !e.image_errors.contains_key(tag))
                .then(|| tag.to_string())
        });
        let config = tagged
            .as_ref()
            .and_then(|t| e.image_configs.get(t).cloned())
            .unwrap_or(json!({}));
        return reply(
            StatusCode::OK,
            json!({ "Id": name, "RepoTags": tagged.into_iter().collect::<Vec<_>>(), "Config": config }),
        );
    }
    let config = e.image_configs.get(&name).cloned().unwrap_or(json!({}));
    reply(
        StatusCode::OK,
        json!({ "Id": id_of(&name), "RepoTags": [name], "Config": config }),
    )
}

/// `POST /containers/create`: a new stopped container, unless the name is taken or creating
/// it is to fail.
fn create_container(e: &mut Engine, q: &BTreeMap<String, String>, body: &Value) -> Response<Body> {
    let name = q.get("name").cloned().unwrap_or_default();
    if let Some(Fault::CreateFails(msg)) = e.fault(&name) {
        error(StatusCode::INTERNAL_SERVER_ERROR, msg.clone())
    } else if e.find(&name).is_some() {
        error(
            StatusCode::CONFLICT,
            format!("Conflict. The container name \"/{name}\" is already in use"),
        )
    } else {
        let id = e.new_id();
        e.created.push((name.clone(), body.clone()));
        let at = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        e.timeline.push((at, format!("create {name}")));
        let labels = body
            .get("Labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let restart = body
            .pointer("/HostConfig/RestartPolicy/Name")
            .and_then(Value::as_str)
            .unwrap_or("no")
            .to_string();
        e.containers.push(Container {
            id: id.clone(),
            name,
            image: body
                .get("Image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            labels,
            running: false,
            exit_code: 0,
            restart,
            logs: Vec::new(),
            created: body.clone(),
            restart_count: 0,
        });
        reply(StatusCode::CREATED, json!({ "Id": id, "Warnings": [] }))
    }
}

/// `POST /containers/ID/start` (or `restart`): it runs, or exits at once, or logs what its
/// fault says.
fn start_container(e: &mut Engine, i: usize, restart: bool) -> Response<Body> {
    // A restart is a stop, then a start like any other.
    if restart {
        e.containers[i].running = false;
    }
    if e.containers[i].running {
        return empty(StatusCode::NOT_MODIFIED);
    }
    let fault = e.fault(&e.containers[i].name).cloned();
    let c = &mut e.containers[i];
    match fault {
        Some(Fault::ExitsAfterStart(code, lines)) => {
            c.running = false;
            c.exit_code = code;
            c.logs.extend(lines);
        }
        Some(Fault::Logs(lines) | Fault::CrashLoop(lines)) => {
            c.running = true;
            c.exit_code = 0;
            c.logs.extend(lines);
        }
        _ => {
            c.running = true;
            c.exit_code = 0;
            c.logs.push(format!("{} started", c.name));
        }
    }
    empty(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_serves_while_it_lives_and_leaves_nothing() {
        let d = FakeDocker::start().unwrap();
        let trips = sparkform::hosts::Counter::default();
        let docker = sparkform::hosts::docker_on_socket("node.a", d.socket(), &trips)
            .await
            .unwrap();
        assert_eq!(docker.ping().await.unwrap(), "OK");
        assert!(docker
            .inspect_container(
                "nope",
                None::<bollard::query_parameters::InspectContainerOptions>
            )
            .await
            .is_err());
        assert_eq!(
            d.requests(),
            ["GET /version", "GET /_ping", "GET /containers/nope/json"]
        );
        assert_eq!(
            trips.get().docker,
            3,
            "the client counts what the engine received"
        );
        let dir = d.socket().parent().unwrap().to_path_buf();
        drop(d);
        assert!(!dir.exists(), "the socket's folder goes with the fake");
        assert!(docker.ping().await.is_err(), "and nothing answers any more");
    }

    #[test]
    fn queries_are_unescaped() {
        assert_eq!(
            unescape("%7B%22label%22%3A%5B%22a%3Db%22%5D%7D"),
            r#"{"label":["a=b"]}"#
        );
        assert_eq!(unescape("a+b%2"), "a b%2");
    }
}

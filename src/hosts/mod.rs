//! The only way the rest of sparkform touches a machine: run a command, talk to its Docker
//! Engine, reach one of its ports. `ssh` reaches nodes through jump hosts with one master
//! connection each; `local` is this machine.

pub mod lifetime;
pub mod local;
pub mod memo;
pub mod pool;
pub mod pooled;
pub mod ssh;
pub mod ssh_config;
pub mod tools;
pub mod warm;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use pool::{HostOptions, HostPool};

/// A command to run on a host: a program and its arguments, never a shell line. Each argument
/// reaches the remote program as one literal string.
#[derive(Debug, Clone)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<String>,
    pub timeout: Duration,
}

impl Cmd {
    pub fn new(program: &str) -> Self {
        Cmd {
            program: program.to_string(),
            args: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// How the command reads in messages.
    pub fn display(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .map(shell_quote)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Where a forwarded port can be reached from this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String, u16),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(h, port) => write!(f, "{h}:{port}"),
        }
    }
}

impl Endpoint {
    /// Whether a TCP port answers through the endpoint. Through an SSH forward the local
    /// connect always succeeds; a refused remote connect shows as an immediate close.
    pub async fn answers(&self) -> Result<(), String> {
        use tokio::io::AsyncReadExt;
        match self {
            Endpoint::Tcp(h, p) => tokio::time::timeout(
                std::time::Duration::from_secs(5),
                tokio::net::TcpStream::connect((h.as_str(), *p)),
            )
            .await
            .map_err(|_| format!("{h}:{p} did not answer"))?
            .map(|_| ())
            .map_err(|e| format!("{h}:{p}: {e}")),
            Endpoint::Unix(path) => {
                let mut s = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut b = [0u8; 1];
                match tokio::time::timeout(std::time::Duration::from_millis(500), s.read(&mut b))
                    .await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => Err("connection refused on the node".into()),
                    _ => Ok(()),
                }
            }
        }
    }
}

#[derive(Debug, Clone, thiserror::Error, miette::Diagnostic)]
pub enum HostError {
    #[error("{node}: cannot reach {target}: {reason}")]
    #[diagnostic(code(sparkform::host::unreachable))]
    Unreachable {
        node: String,
        target: String,
        reason: String,
        #[help]
        help: Option<String>,
    },
    #[error("{node}: the jump host {jump} is unreachable: {reason}")]
    #[diagnostic(code(sparkform::host::jump_unreachable))]
    JumpUnreachable {
        node: String,
        jump: String,
        reason: String,
        #[help]
        help: Option<String>,
    },
    #[error("{node}: {target} refused authentication ({reason})")]
    #[diagnostic(
        code(sparkform::host::auth),
        help("check the node's `user` and `identity_file`, and that the key is in ~/.ssh/authorized_keys on the machine")
    )]
    AuthRefused {
        node: String,
        target: String,
        reason: String,
    },
    #[error("{node}: the host key of {target} is not known")]
    #[diagnostic(code(sparkform::host::host_key_unknown))]
    HostKeyUnknown {
        node: String,
        target: String,
        known_hosts: String,
        #[help]
        help: Option<String>,
    },
    #[error("{node}: the host key of {target} has CHANGED since it was recorded in {known_hosts}")]
    #[diagnostic(code(sparkform::host::host_key_changed))]
    HostKeyChanged {
        node: String,
        target: String,
        known_hosts: String,
        #[help]
        help: Option<String>,
    },
    #[error("{node}: `{command}` did not finish within {seconds} s")]
    #[diagnostic(code(sparkform::host::timeout))]
    Timeout {
        node: String,
        command: String,
        seconds: u64,
    },
    #[error("{node}: the connection was lost: {reason}")]
    #[diagnostic(
        code(sparkform::host::disconnected),
        help("the node or its network went away; check it and run again")
    )]
    Disconnected { node: String, reason: String },
    #[error("{node}: {message}")]
    #[diagnostic(code(sparkform::host::docker))]
    Docker {
        node: String,
        message: String,
        #[help]
        help: Option<String>,
    },
    /// Connected, but a program sparkform needs there is not installed ([`tools`]).
    #[error("{node}: {}", tools::missing(command))]
    #[diagnostic(code(sparkform::host::program_missing))]
    ProgramMissing {
        node: String,
        command: String,
        #[help]
        help: Option<String>,
    },
    #[error("{node}: {message}")]
    #[diagnostic(code(sparkform::host::other))]
    Other { node: String, message: String },
}

impl HostError {
    pub fn node(&self) -> &str {
        match self {
            HostError::Unreachable { node, .. }
            | HostError::JumpUnreachable { node, .. }
            | HostError::AuthRefused { node, .. }
            | HostError::HostKeyUnknown { node, .. }
            | HostError::HostKeyChanged { node, .. }
            | HostError::Timeout { node, .. }
            | HostError::Disconnected { node, .. }
            | HostError::Docker { node, .. }
            | HostError::ProgramMissing { node, .. }
            | HostError::Other { node, .. } => node,
        }
    }
}

/// A machine sparkform works on.
#[async_trait]
pub trait Host: Send + Sync {
    /// The node's address in the definitions (`node.spark1`).
    fn node(&self) -> &str;

    /// Run a program with arguments (no shell) and collect its output.
    async fn exec(&self, cmd: &Cmd) -> Result<Output, HostError>;

    /// A client for the node's Docker Engine, API version negotiated.
    async fn docker(&self) -> Result<bollard::Docker, HostError>;

    /// Make `host:port`, as seen from the node, reachable from here.
    async fn forward(&self, host: &str, port: u16) -> Result<Endpoint, HostError>;

    /// Close connections cleanly.
    async fn close(&self);

    /// The round trips made on this node so far: every [`Host::exec`] and every Docker API
    /// request of the clients [`Host::docker`] handed out (the version negotiation included).
    fn round_trips(&self) -> RoundTrips;

    /// What the reads of the plan being made share on this node ([`memo::remembered`]): a
    /// pool that reads for a plan keeps one ([`pooled::Pooled`]); `None`: every read looks
    /// again. A reader may then take its part of one shared read (the node's glance) instead of
    /// a command of its own.
    fn memo(&self) -> Option<&memo::Memo> {
        None
    }
}

/// Round trips to one node: commands and Docker API requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RoundTrips {
    pub exec: u64,
    pub docker: u64,
    /// `exec + docker`.
    pub total: u64,
}

impl RoundTrips {
    pub fn new(exec: u64, docker: u64) -> RoundTrips {
        RoundTrips {
            exec,
            docker,
            total: exec + docker,
        }
    }

    /// What was made after `before`.
    pub fn since(self, before: RoundTrips) -> RoundTrips {
        RoundTrips::new(
            self.exec.saturating_sub(before.exec),
            self.docker.saturating_sub(before.docker),
        )
    }
}

/// A host's count of round trips ([`Host::round_trips`]), shared with the Docker clients it
/// hands out.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<[AtomicU64; 2]>);

impl Counter {
    /// One command.
    pub fn exec(&self) {
        self.0[0].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> RoundTrips {
        RoundTrips::new(
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }

    /// One Docker API request.
    fn docker_request(&self) {
        self.0[1].fetch_add(1, Ordering::Relaxed);
    }
}

/// The body of bollard's requests (its own name for it is private to it).
trait BodyOf {
    type Body;
}

impl<B> BodyOf for hyper::Request<B> {
    type Body = B;
}

type DockerBody = <bollard::BollardRequest as BodyOf>::Body;

/// A Docker client on the socket at `path`, as bollard's own Unix transport makes it (hyper
/// over the socket, the socket's path hex-encoded in the URI's host), each request counted on
/// `trips` and logged (`SPARKFORM_LOG`) with `node` and how long the Engine took to answer.
fn docker_client(
    node: &str,
    path: &std::path::Path,
    trips: &Counter,
) -> Result<bollard::Docker, bollard::errors::Error> {
    // A new connection per request, as bollard's own: an idle one kept across an SSH forward
    // can be closed under it.
    let client: hyper_util::client::legacy::Client<_, DockerBody> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(hyperlocal::UnixConnector);
    let node = node.to_string();
    let trips = trips.clone();
    let transport = move |req: bollard::BollardRequest| {
        let client = client.clone();
        let node = node.clone();
        trips.docker_request();
        async move {
            let what = format!(
                "{} {}",
                req.method(),
                req.uri().path_and_query().map_or("", |p| p.as_str())
            );
            let started = std::time::Instant::now();
            let answer = client.request(req).await;
            tracing::debug!(
                target: "sparkform::docker",
                node = %node,
                request = %what,
                status = answer.as_ref().map_or(0, |r| r.status().as_u16()),
                ms = started.elapsed().as_millis() as u64,
                "Docker API call"
            );
            answer.map_err(bollard::errors::Error::from)
        }
    };
    let host: String = path
        .to_string_lossy()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    bollard::Docker::connect_with_custom_transport(
        transport,
        Some(format!("unix://{host}")),
        300,
        bollard::API_DEFAULT_VERSION,
    )
}

/// Run a command on `node` (`run`: the transport's own work) and log it (`SPARKFORM_LOG`): the
/// command as shown to a user, its exit code or error, and how long it took.
pub(crate) async fn logged_exec(
    node: &str,
    cmd: &Cmd,
    run: impl std::future::Future<Output = Result<Output, HostError>>,
) -> Result<Output, HostError> {
    let started = std::time::Instant::now();
    let result = run.await;
    tracing::debug!(
        target: "sparkform::exec",
        node = node,
        command = %cmd.display(),
        code = result.as_ref().ok().and_then(|o| o.code).unwrap_or(-1),
        error = result.as_ref().err().map(|e| e.to_string()).unwrap_or_default(),
        ms = started.elapsed().as_millis() as u64,
        "remote command"
    );
    result
}

/// Quote a string for a POSIX shell: used only for display and for the rare `sh -c` whose
/// script sparkform writes itself.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Connect a bollard client to a Docker socket and negotiate the API version (Debian's engine
/// speaks 1.41 at most); each request, the negotiation's included, counted on `trips`.
pub async fn docker_on_socket(
    node: &str,
    path: &std::path::Path,
    trips: &Counter,
) -> Result<bollard::Docker, HostError> {
    let err = |message: String| {
        HostError::Docker {
        node: node.to_string(),
        message,
        help: Some("is Docker Engine installed (on Debian or Ubuntu: docker.io, or Docker's own docker-ce) and running on the node, and may this user use /var/run/docker.sock?".into()),
    }
    };
    let docker = docker_client(node, path, trips)
        .map_err(|e| err(format!("cannot open the Docker socket: {e}")))?;
    let docker = tokio::time::timeout(Duration::from_secs(20), docker.negotiate_version())
        .await
        .map_err(|_| err("the Docker Engine did not answer within 20 s".into()))?
        .map_err(|e| err(format!("the Docker Engine did not answer: {e}")))?;
    Ok(docker)
}

/// Remove a one-shot container however it is (running, exited, gone), with its volumes.
pub async fn remove_container(docker: &bollard::Docker, name: &str) {
    let _ = docker
        .remove_container(
            name,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("$(reboot)"), "'$(reboot)'");
        assert_eq!(shell_quote(""), "''");
    }
}

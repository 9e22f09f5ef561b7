//! The machine halves of the resource kinds: what a step does on a host, how a node is
//! observed, and what the executor hands a step. The executor and refresh ask [`machine`] for a
//! kind's half and name no kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::{DesiredConfig, KindId};
use crate::config::Observed as Facts;
use crate::config::{Config, Resource};
use crate::diag::Diagnostics;
use crate::events::{emit, Event, Sender};
use crate::hosts::{Host, HostError, HostPool};
use crate::plan::{Action, Change, Foreign, Observed, Orphan, Plan};
use crate::state::{ResourceState, State};

macro_rules! define_machines {
    ($($(#[$meta:meta])* $variant:ident => $module:ident,)*) => {
        /// A kind's machine half.
        pub fn machine(kind: KindId) -> &'static dyn Machine {
            match kind {
                $($(#[$meta])* KindId::$variant => &super::$module::machine::MACHINE,)*
            }
        }
    };
}
super::for_each_kind!(define_machines);

/// How the machines are read before a plan: what `-refresh` asked for, or what stands in for
/// looking. Every read and observation is handed it (no global setting), so two operations in
/// one process never see each other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// Look at the machines (`-refresh=true`, the default).
    #[default]
    Normal,
    /// Look, and go further where a kind can at a cost: the model kind rehashes every file on
    /// every node (`-refresh=deep`).
    Deep,
    /// Connect to nothing: what the state recorded stands in (`-refresh=false`; the commands
    /// about what is deployed).
    Recorded,
    /// Connect to nothing: what a saved plan was made with stands in (`apply PLANFILE`).
    Planned,
    /// Connect to nothing and read nothing: the definitions as written (`validate`, `graph`).
    None,
}

impl ReadMode {
    /// `-refresh=true|false`: look, or take what the state recorded.
    pub fn refresh(look: bool) -> ReadMode {
        if look {
            ReadMode::Normal
        } else {
            ReadMode::Recorded
        }
    }

    /// Whether the machines are looked at.
    pub fn looks(self) -> bool {
        matches!(self, ReadMode::Normal | ReadMode::Deep)
    }

    /// Whether a kind that can look further at a cost does.
    pub fn deep(self) -> bool {
        self == ReadMode::Deep
    }
}

/// What a kind's plan-time read ([`Machine::read`]) is handed: the definitions as evaluated
/// so far, how to read, and what stands in for looking.
pub struct ReadCx<'a> {
    pub config: &'a Config,
    pub mode: ReadMode,
    /// Connected to every kind's [`Machine::read_nodes`] when `mode` looks; empty otherwise.
    pub pool: &'a HostPool,
    /// The state on disk: what [`ReadMode::Recorded`] takes.
    pub state: Option<&'a State>,
    /// A saved plan: what [`ReadMode::Planned`] takes.
    pub plan: Option<&'a Plan>,
    /// `sparkform.lock.hcl`: what a kind finds locked there it takes instead of reading the
    /// world (a branch stays at its locked commit), unless `upgrade`.
    pub lock: Option<&'a crate::lockfile::Lock>,
    /// `-upgrade`: read the world again, whatever the lock says.
    pub upgrade: bool,
    /// A plan is made from what is read, so a value that cannot be read is an error; otherwise
    /// (commands about what is deployed) it stays unread.
    pub complete: bool,
}

/// Why a plan-time read failed.
#[derive(Debug)]
pub enum ReadError {
    /// What the definitions ask cannot be read (a diagnostic on the block).
    Config(Diagnostics),
    /// Nodes that could not be reached.
    Hosts(Vec<Arc<HostError>>),
}

/// Where an exec probe can run a command, by container address: (node, Docker name).
pub type ContainerIndex = BTreeMap<String, (String, String)>;

/// The exec targets of a configuration, from every kind that has them.
pub fn container_index(config: &Config) -> ContainerIndex {
    config
        .resources
        .iter()
        .filter_map(|r| Some((r.address.clone(), machine(r.kind).exec_target(r)?)))
        .collect()
}

/// What observing a node found: recorded resources by address, and objects nobody recorded.
pub type NodeObservations = (BTreeMap<String, Observed>, Vec<Orphan>);

/// Serializes the work of this process that shares `scope` (a node's interface, a node's model
/// cache folder): the guard held is the only one of its scope until it is dropped.
pub async fn one_at_a_time(scope: &str) -> tokio::sync::OwnedMutexGuard<()> {
    type Locks = std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>;
    static LOCKS: std::sync::OnceLock<Locks> = std::sync::OnceLock::new();
    let lock = {
        let mut map = LOCKS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.entry(scope.to_string()).or_default().clone()
    };
    lock.lock_owned().await
}

/// Whether a Docker client error means the connection to the node is gone (the forwarded
/// socket broke: the node, or the way to it, went down), not a refusal by its engine.
pub fn docker_connection_lost(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    matches!(
        e,
        E::HyperLegacyError { .. }
            | E::IOError { .. }
            | E::RequestTimeoutError
            | E::HyperResponseError { .. }
    )
}

/// A Docker API error of a step (`what` names the node and what it did): a broken connection
/// names the lost node, as the ssh path does, not its engine, which was never asked.
pub fn docker_error(what: &str, e: bollard::errors::Error) -> StepError {
    if docker_connection_lost(&e) {
        StepError::new(format!(
            "{what}: the node was lost: the connection to it broke ({e})"
        ))
        .help("the node or its network went down during the step (its Docker Engine was not reached); check that the node is up and reachable, then run apply again (the state records what was done)")
    } else {
        StepError::new(format!("{what}: {e}"))
    }
}

/// What a step works with. The executor fills it; handlers never look elsewhere.
pub struct StepCx<'a> {
    pub address: &'a str,
    pub change: &'a Change,
    /// The node's host, when the resource lives on a node.
    pub host: Option<Arc<dyn Host>>,
    /// Every connected node, for probes that go through another node.
    pub pool: &'a HostPool,
    pub lineage: &'a str,
    /// The desired configuration with its real values (sensitive ones included).
    pub desired: Option<&'a serde_json::Value>,
    /// What the state recorded before this apply.
    pub recorded: Option<&'a ResourceState>,
    /// Folder of the definitions, for relative paths (image archives).
    pub config_dir: &'a std::path::Path,
    pub events: &'a Sender,
    pub cancel: &'a tokio_util::sync::CancellationToken,
    /// Containers of the configuration by address: (node, Docker name), for exec probes.
    pub containers: &'a ContainerIndex,
    /// The configuration's sensitive values: what a step reports passes through them.
    pub secrets: &'a crate::events::Secrets,
}

impl StepCx<'_> {
    pub fn progress(
        &self,
        message: impl Into<String>,
        log: Option<String>,
        timeout_secs: Option<u64>,
    ) {
        self.emit(Event::StepProgress {
            address: self.address.to_string(),
            message: message.into(),
            log,
            timeout_secs,
        });
    }

    /// Report an event of this step, scrubbed of the configuration's sensitive values (what
    /// a probe printed, a log line, a command).
    pub fn emit(&self, event: Event) {
        emit(self.events, event.scrubbed(self.secrets));
    }

    pub fn host(&self) -> Result<Arc<dyn Host>, StepError> {
        self.host
            .clone()
            .ok_or_else(|| StepError::new(format!("{}: no node to run on", self.address)))
    }

    /// The desired configuration as the kind's type.
    pub fn desired_as<D: DesiredConfig>(&self) -> Result<D, StepError> {
        let config = self
            .desired
            .ok_or_else(|| StepError::new(format!("{}: no desired configuration", self.address)))?;
        // serde's message could quote a sensitive value: not shown.
        D::from_config(config).map_err(|_| {
            StepError::new(format!(
                "{}: the desired configuration is not of this resource's kind",
                self.address
            ))
            .help("this is a bug in sparkform: please report it")
        })
    }

    /// What the state recorded before this apply, as the kind's type; `None` when nothing was
    /// recorded or the record is not of the kind (written by another version).
    pub fn recorded_as<D: DesiredConfig>(&self) -> Option<D> {
        self.recorded.and_then(|r| D::from_config(&r.config).ok())
    }
}

/// A step that failed: what happened, the evidence (log lines), and what to do.
#[derive(Debug, Clone)]
pub struct StepError {
    pub message: String,
    pub details: Vec<String>,
    pub help: Option<String>,
}

impl StepError {
    pub fn new(message: impl Into<String>) -> Self {
        StepError {
            message: message.into(),
            details: Vec::new(),
            help: None,
        }
    }
    pub fn help(mut self, h: impl Into<String>) -> Self {
        self.help = Some(h.into());
        self
    }
    pub fn details(mut self, d: Vec<String>) -> Self {
        self.details = d;
        self
    }
    /// The error with every text it carries scrubbed of `secrets`.
    pub fn scrubbed(self, secrets: &crate::events::Secrets) -> StepError {
        StepError {
            message: secrets.scrub(&self.message).into_owned(),
            details: self
                .details
                .iter()
                .map(|d| secrets.scrub(d).into_owned())
                .collect(),
            help: self.help.map(|h| secrets.scrub(&h).into_owned()),
        }
    }

    /// The whole error as text: message, evidence, hint.
    pub fn render(&self) -> String {
        let mut s = self.message.clone();
        if !self.details.is_empty() {
            s.push('\n');
            for d in &self.details {
                s.push_str("    │ ");
                s.push_str(d);
                s.push('\n');
            }
        }
        if let Some(h) = &self.help {
            s.push_str(&format!("\n  help: {h}"));
        }
        s
    }
}

impl From<HostError> for StepError {
    fn from(e: HostError) -> Self {
        use miette::Diagnostic;
        StepError {
            message: e.to_string(),
            details: Vec::new(),
            help: e.help().map(|h| h.to_string()),
        }
    }
}

impl From<Arc<HostError>> for StepError {
    fn from(e: Arc<HostError>) -> Self {
        use miette::Diagnostic;
        StepError {
            message: e.to_string(),
            details: Vec::new(),
            help: e.help().map(|h| h.to_string()),
        }
    }
}

/// What a completed step leaves: facts to record in the state, and what its undo needs.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub attributes: BTreeMap<String, serde_json::Value>,
    pub undo: serde_json::Value,
    /// One line for the progress output (a probe's latency and answer, a container's id).
    pub summary: String,
}

/// What importing an object found (see [`Machine::import`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Imported {
    /// The object as a desired configuration of its kind, clear values included.
    pub config: serde_json::Value,
    /// Facts to record (a container's id and image id).
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// What the plan says about it (a container without sparkform's labels).
    pub notes: Vec<String>,
    /// Paths in `config` of values that may be secrets the definition does not mark (an env
    /// var it does not set): plans and the state hold them as hashes.
    pub secret_paths: Vec<Vec<String>>,
}

/// Everything the executor and refresh do to a resource of one kind on a machine.
#[async_trait]
pub trait Machine: Send + Sync {
    /// Make the machine match the change: create, update in place, replace, delete (and for
    /// a kind that runs, run it). Waiting until the result is ready is part of it.
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError>;
    /// Reverse a completed `apply` (rollback). Kinds that leave nothing on a machine have
    /// nothing to undo.
    async fn undo(
        &self,
        _cx: &StepCx<'_>,
        _action: Action,
        _applied: &Applied,
    ) -> Result<String, StepError> {
        Ok(String::new())
    }
    /// After the whole apply succeeded: drop what was kept for rollback.
    async fn finalize(
        &self,
        _cx: &StepCx<'_>,
        _action: Action,
        _applied: &Applied,
    ) -> Result<(), StepError> {
        Ok(())
    }
    /// Start again, from scratch, what the state recorded for it before the apply, and wait
    /// until it is ready: after a rollback the members of a process group restart one after
    /// another in dependency order, because a member that came back alone may have joined a
    /// peer the rollback removed. Kinds that run no process have nothing to restart.
    async fn restart(&self, _cx: &StepCx<'_>) -> Result<String, StepError> {
        Ok(String::new())
    }
    /// Stop what the state recorded for it (a process group that could not be restored whole
    /// stops rather than run half of it).
    async fn stop(&self, _cx: &StepCx<'_>) -> Result<String, StepError> {
        Ok(String::new())
    }
    /// Look at one node: how the recorded resources of this kind there differ from the state,
    /// and objects of this kind the state does not explain, looking as far as `mode` says
    /// ([`ReadMode::deep`]). Kinds that leave nothing on a machine observe nothing.
    async fn observe(
        &self,
        _host: &dyn Host,
        _lineage: &str,
        _recorded: &[(String, ResourceState)],
        _mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        Ok(Default::default())
    }
    /// Objects of this kind on one node that carry sparkform's labels for one of `addresses`
    /// (resources of the definitions that the state does not record) under another lineage
    /// than `lineage`, or under none: what a lost or replaced state left running. The plan
    /// lists them and offers the `import` blocks that adopt them. Kinds whose objects carry no
    /// labels find none.
    async fn find_foreign(
        &self,
        _host: &dyn Host,
        _lineage: &str,
        _addresses: &[String],
    ) -> Result<Vec<Foreign>, HostError> {
        Ok(Vec::new())
    }
    /// The nodes this kind's plan-time [`Machine::read`] works on for `config`'s resources
    /// (connected before it when the mode looks). None by default: the kind reads nothing.
    fn read_nodes(&self, _config: &Config) -> Vec<String> {
        Vec::new()
    }
    /// Plan-time read: what the world says about the values this kind's resources leave to it
    /// (a model's commit), for the evaluation of the definitions with it
    /// (`config::load_observed`). `cx.mode` says how: looked up on `cx.pool`, or taken from the
    /// state or a saved plan; a mode that does not look never waits on anything.
    async fn read(&self, _cx: &ReadCx<'_>) -> Result<Facts, ReadError> {
        Ok(Facts::default())
    }
    /// Look at an object that exists on the node (`object`: the part of the import id after
    /// `NODE:`) and say how the state would record it, changing nothing: its configuration in
    /// the kind's desired shape (what `desired` leaves to sparkform, such as ready checks, taken
    /// from it; attributes the object has at Docker's or the kernel's default left out when
    /// `desired` leaves them unset), the facts to record, and notes for the plan.
    async fn import(
        &self,
        _host: &dyn Host,
        address: &str,
        _object: &str,
        _desired: Option<&serde_json::Value>,
    ) -> Result<Imported, StepError> {
        Err(StepError::new(format!(
            "{address}: this kind of resource cannot be imported"
        )))
    }
    /// Run it against what is deployed, changing nothing (`sparkform verify`, `watch`): how
    /// long it took and what it saw. A failed attempt is tried again only for `retry_for` (the
    /// deployment passed once: nothing is still loading), never for the load-time wait of the
    /// definitions. `None` for kinds that are not checks.
    async fn verify(
        &self,
        _config: &serde_json::Value,
        _pool: &HostPool,
        _containers: &ContainerIndex,
        _retry_for: std::time::Duration,
        _cancel: &tokio_util::sync::CancellationToken,
        _progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(std::time::Duration, String), StepError>> {
        None
    }
    /// Why what a deployed resource runs is down now, if it is: a check that depends on it
    /// (`verify`, `watch`) asks before it runs, and fails at once with the answer instead of
    /// retrying against it (a container that exited, with its state and exit code). `recorded`
    /// is its record in the state. `None` when it is up, when its kind runs nothing, and when
    /// it cannot be told (the check itself then finds out).
    async fn down(&self, _recorded: &ResourceState, _pool: &HostPool) -> Option<String> {
        None
    }
    /// Where an exec probe can run commands inside this resource: (node, Docker name).
    fn exec_target(&self, _resource: &Resource) -> Option<(String, String)> {
        None
    }
    /// Nodes a step reaches besides its own (a probe's exec goes into containers elsewhere).
    fn other_nodes(&self, _change: &Change, _containers: &ContainerIndex) -> Vec<String> {
        Vec::new()
    }
    /// Checks of what the changed resources of this kind do together (every attachment of a
    /// network reaches every other), run after them and before what depends on them.
    fn checks(&self, _config: &Config, _changed: &dyn Fn(&str) -> bool) -> Vec<Check> {
        Vec::new()
    }
}

/// A step the executor adds that is no resource and records nothing.
pub struct Check {
    /// How it reads in progress lines (`network.roce (fabric check)`).
    pub address: String,
    /// The changed resources it runs after.
    pub after: Vec<String>,
    /// The resources whose dependents wait for it.
    pub covers: Vec<String>,
    /// The changed resources that themselves wait for it (a preflight before they start).
    pub before: Vec<String>,
    /// The nodes it uses.
    pub nodes: Vec<String>,
    pub run: Arc<dyn CheckRun>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("address", &self.address)
            .field("after", &self.after)
            .finish()
    }
}

#[async_trait]
pub trait CheckRun: Send + Sync {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError>;
}

/// The waits between the attempts of a ready check or a probe: 100 ms, doubling, up to the
/// configured interval. Something ready soon after a start is seen soon; something slow is not
/// polled more often than the interval asks.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: std::time::Duration,
    max: std::time::Duration,
}

impl Backoff {
    pub fn new(interval: std::time::Duration) -> Backoff {
        Backoff {
            next: std::time::Duration::from_millis(100).min(interval),
            max: interval,
        }
    }

    /// The wait before the next attempt.
    pub fn next_wait(&mut self) -> std::time::Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// The wait `next_wait` will return, without advancing.
    pub fn peek(&self) -> std::time::Duration {
        self.next
    }
}

/// A name Docker accepts for a one-shot container: every character but letters, digits, `-`,
/// `_` and `.` made `-`, at most 120 characters.
pub fn docker_name(raw: &str) -> String {
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(120)
        .collect()
}

/// A tar archive of regular files (ustar) under `sparkform/`, for Docker's archive upload
/// into a one-shot container (the program it runs and its input).
pub fn tar_of(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    fn octal(field: &mut [u8], v: u64) {
        let s = format!("{:0w$o}", v, w = field.len() - 1);
        field[..s.len()].copy_from_slice(s.as_bytes());
    }
    let mut out = Vec::new();
    let mut entry = |name: &str, data: &[u8], mode: u32, dir: bool| {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        octal(&mut h[100..108], mode as u64);
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], data.len() as u64);
        octal(&mut h[136..148], 0);
        h[156] = if dir { b'5' } else { b'0' };
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|b| *b as u64).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    };
    entry("sparkform/", &[], 0o755, true);
    for (name, data, mode) in files {
        entry(&format!("sparkform/{name}"), data, *mode, false);
    }
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

/// Remove a one-shot container however it is (running, exited, gone), with its volumes; in
/// `hosts` since `nodes`' NCCL probe runs one too.
pub use crate::hosts::remove_container;

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn backoff_starts_fast_and_doubles_up_to_the_interval() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let waits: Vec<u128> = (0..6).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        let mut short = Backoff::new(Duration::from_millis(50));
        assert_eq!(short.next_wait(), Duration::from_millis(50));
        assert_eq!(short.next_wait(), Duration::from_millis(50));
    }

    /// A node cut off while its engine is asked (the forwarded socket resets) is named lost, with
    /// no advice about its Docker Engine; an answer of the engine stays the engine's.
    #[test]
    fn a_broken_docker_connection_names_the_lost_node_not_its_engine() {
        use bollard::errors::Error as E;
        let cut = E::IOError {
            err: std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "Connection reset by peer",
            ),
        };
        let e = super::docker_error("node.n2: cannot create the transfer container x", cut);
        assert!(
            e.message
                .starts_with("node.n2: cannot create the transfer container x: the node was lost"),
            "{}",
            e.message
        );
        let help = e.help.unwrap_or_default();
        assert!(
            help.contains("check that the node is up")
                && !help.contains("check the node's Docker Engine"),
            "{help}"
        );
        let refused = E::DockerResponseServerError {
            status_code: 409,
            message: "Conflict. The container name is already in use".into(),
        };
        let e = super::docker_error("node.n2: cannot create container w", refused);
        assert!(!e.message.contains("lost"), "{}", e.message);
        assert!(e.message.contains("already in use"));
    }
}

//! The machine halves of the resource kinds: what a step does on a host, how a node is
//! observed, and what the executor hands a step. The executor and refresh ask [`machine`] for a
//! kind's half and name no kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::config::Config;
use crate::config::Readings;
use crate::diag::Diagnostics;
use crate::events::{emit, Event, Sender};
use crate::hosts::{Host, HostError, HostPool};
use crate::kind::Kind;
use crate::kind::Registered;
use crate::plan::{Action, Change, Drift, Foreign, Orphan, Plan};
use crate::state::{ResourceState, State};
use crate::vocabulary::KindId;

mod check;
mod docker_errors;
mod gate;
mod restore;
pub use check::{Changed, Check, CheckRun};
pub use docker_errors::{docker_connection_lost, docker_error, helper_not_started};
pub use gate::{GatePhase, StartGate, StartGates};
pub use restore::{restorable_images, Restorable};

macro_rules! define_machines {
    ($($(#[$meta:meta])* $variant:ident => $module:ident,)*) => {
        /// A kind's machine half.
        pub fn machine(kind: KindId) -> &'static dyn AnyMachine {
            match kind {
                $($(#[$meta])* KindId::$variant => &super::$module::machine::MACHINE,)*
            }
        }
    };
}
crate::vocabulary::for_each_kind!(define_machines);

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
    pub lock: Option<&'a crate::lock_file::LockFile>,
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

/// The exec targets of a configuration: what every resource runs in on its node.
pub fn container_index(config: &Config) -> ContainerIndex {
    config
        .resources
        .iter()
        .filter_map(|r| {
            let runs_in = r.kind.kind().placement(&r.config).runs_in?;
            Some((r.address.clone(), (r.node.clone()?, runs_in.name)))
        })
        .collect()
}

/// What observing a node found: recorded resources by address, and objects nobody recorded.
pub type NodeObservations = (BTreeMap<String, Drift>, Vec<Orphan>);

/// What a resource looks like on its machine, as `sparkform status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Seen {
    Running {
        uptime_secs: Option<u64>,
        restarts: i64,
        image_id: Option<String>,
    },
    Exited {
        code: i64,
        restarts: i64,
        image_id: Option<String>,
    },
    /// Created, paused, restarting…: Docker's word for it.
    Other {
        status: String,
    },
    InSync,
    Drifted {
        notes: Vec<String>,
    },
    Missing {
        reason: String,
    },
    /// Its node could not be reached.
    Unknown,
}

impl Seen {
    /// What observing it found, as status shows it (`None`: not seen).
    pub fn of(observed: Option<&Drift>) -> Seen {
        match observed {
            Some(Drift::InSync) => Seen::InSync,
            Some(Drift::Drifted(notes)) => Seen::Drifted {
                notes: notes.clone(),
            },
            Some(Drift::Missing(reason)) => Seen::Missing {
                reason: reason.clone(),
            },
            None => Seen::Unknown,
        }
    }
}

/// One line of a resource's log (`sparkform logs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Nanoseconds since the epoch, from its runtime's timestamp.
    pub time: i64,
    pub address: String,
    pub text: String,
    pub stderr: bool,
}

/// What comes out of a logs run, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    Line(LogLine),
    /// Something the reader should know that is no log line (a container replaced, a node down).
    Note(String),
}

/// `2026-12-01T10:44:11.123456789Z text` → (nanoseconds, text).
pub fn split_timestamp(line: &str) -> Option<(i64, &str)> {
    let (ts, text) = line.split_once(' ').unwrap_or((line, ""));
    let t = chrono::DateTime::parse_from_rfc3339(ts).ok()?;
    Some((t.timestamp_nanos_opt()?, text))
}

/// A log read for `sparkform logs`: which resource, how far back and whether to follow, and
/// where its lines (to the merge, as `(index, line)`, `None` at its end) and notes go.
pub struct LogRead {
    pub index: usize,
    pub address: String,
    pub node: String,
    pub source: crate::kind::RunsIn,
    pub lineage: Option<String>,
    pub follow: bool,
    /// Only lines newer than this (Unix seconds).
    pub since: Option<i64>,
    /// At most this many lines to start with.
    pub tail: Option<usize>,
    pub lines: tokio::sync::mpsc::Sender<(usize, Option<LogLine>)>,
    pub notes: tokio::sync::mpsc::UnboundedSender<LogEvent>,
    pub cancel: tokio_util::sync::CancellationToken,
}

impl LogRead {
    /// Say `why` there is no (more) log, and end this source.
    pub async fn end(&self, why: Option<String>) {
        if let Some(why) = why {
            let _ = self.notes.send(LogEvent::Note(why));
        }
        let _ = self.lines.send((self.index, None)).await;
    }
}

/// What a rollback brings a recorded process back to ([`Machine::restore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// Started again from scratch, and ready.
    Running,
    /// Stopped.
    Stopped,
}

/// Over what a health check looks ([`Machine::health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthWindow {
    /// Now, at once: whether it serves, and if not why (its log from its start).
    Now,
    /// Since the last check of `sparkform watch`: `restarts_before` is its runtime's restart
    /// count then, `log_since` when (Unix seconds) its log is still to be read.
    SinceLastCheck {
        restarts_before: Option<i64>,
        log_since: i64,
    },
}

/// Why what `recorded` runs is down now, if it is ([`Machine::health`] over [`HealthWindow::Now`]).
pub async fn down(address: &str, recorded: &ResourceState, pool: &HostPool) -> Option<String> {
    machine(recorded.kind)
        .health(address, recorded, pool, HealthWindow::Now)
        .await?
        .failure
        .map(|f| f.cause)
}

/// What a check of a running resource's health found (`sparkform watch`), and what the next
/// check starts from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// How many times its runtime restarted it so far (Docker's count).
    pub restart_count: Option<i64>,
    /// Until when (Unix seconds) its log was read.
    pub log_until: Option<i64>,
    pub failure: Option<HealthFailure>,
}

/// What is wrong with a running resource.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthFailure {
    pub cause: String,
    /// Whether replacing it can help (an unreachable node is no engine's fault).
    pub restartable: bool,
}

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
    pub desired: Option<&'a crate::kind::Configuration>,
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
    /// The start gate of its process group, when the apply starts several of its members: they
    /// stop their previous containers and start their new ones together ([`StartGate`]).
    pub gate: Option<&'a StartGate>,
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

/// What a completed step leaves, as the engine keeps it: the facts to record in the state (the
/// kind's [`Kind::Recorded`] as attributes), and what its undo needs, a value of the kind's
/// [`Machine::Undo`] that only its machine half reads.
#[derive(Clone, Default)]
pub struct Applied {
    pub attributes: crate::kind::Attributes,
    pub undo: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// One line for the progress output (a probe's latency and answer, a container's id).
    pub summary: String,
}

impl std::fmt::Debug for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applied")
            .field("attributes", &self.attributes)
            .field("undo", &self.undo.is_some())
            .field("summary", &self.summary)
            .finish()
    }
}

/// The facts a kind's machine half records.
pub type FactsOf<M> = <<M as Machine>::Kind as Kind>::Recorded;
/// The desired configuration a kind's machine half works on.
pub type DesiredOf<M> = <<M as Machine>::Kind as Kind>::Desired;

/// What a completed step of a kind leaves, on the kind's types.
pub struct Done<M: Machine + ?Sized> {
    pub recorded: FactsOf<M>,
    pub undo: M::Undo,
    /// One line for the progress output.
    pub summary: String,
}

impl<M: Machine + ?Sized> Done<M> {
    /// A step that records nothing and has nothing to undo.
    pub fn summary(summary: impl Into<String>) -> Self {
        Done {
            recorded: Default::default(),
            undo: Default::default(),
            summary: summary.into(),
        }
    }
}

/// A resource as the state recorded it, read as its kind's types.
pub struct Record<'a, K: Kind> {
    /// The record as the state keeps it (its node, hash, dependencies).
    pub state: &'a ResourceState,
    /// Its configuration; `None` when it does not read as the kind's (written by another
    /// version).
    pub config: Option<K::Desired>,
    /// The facts its steps found.
    pub facts: K::Recorded,
}

impl<'a, K: Kind> Record<'a, K> {
    /// `state` read as `K`'s: facts that do not fit the shape (a state the load could not
    /// upgrade) read as none.
    pub fn of(state: &'a ResourceState) -> Self {
        Record {
            state,
            config: state.config.typed::<K::Desired>().ok(),
            facts: state.attributes.typed().unwrap_or_default(),
        }
    }
}

/// What a step of a kind works with: the executor's [`StepCx`] (through `Deref`), with the
/// desired configuration and the record read as the kind's types, once, by the adapter.
pub struct Step<'a, K: Kind> {
    cx: &'a StepCx<'a>,
    /// The desired configuration with its real values (sensitive ones included); `None` for a
    /// delete.
    pub desired: Option<K::Desired>,
    /// What the state recorded before this apply.
    pub recorded: Option<Record<'a, K>>,
}

impl<'a, K: Kind> std::ops::Deref for Step<'a, K> {
    type Target = StepCx<'a>;
    fn deref(&self) -> &StepCx<'a> {
        self.cx
    }
}

impl<'a, K: Kind> Step<'a, K> {
    /// `cx`'s configuration and record read as `K`'s; a desired configuration that is not the
    /// kind's is a bug, said as such (serde's message could quote a sensitive value: not shown).
    pub fn of(cx: &'a StepCx<'a>) -> Result<Self, StepError> {
        let desired = match cx.desired {
            Some(config) => Some(config.typed::<K::Desired>().map_err(|_| {
                StepError::new(format!(
                    "{}: the desired configuration is not of this resource's kind",
                    cx.address
                ))
                .help("this is a bug in sparkform: please report it")
            })?),
            None => None,
        };
        Ok(Step {
            cx,
            desired,
            recorded: cx.recorded.map(Record::of),
        })
    }

    /// The desired configuration; an error for a step that has none (a delete).
    pub fn desired(&self) -> Result<&K::Desired, StepError> {
        self.desired
            .as_ref()
            .ok_or_else(|| StepError::new(format!("{}: no desired configuration", self.cx.address)))
    }

    /// The configuration the state recorded, when it reads as the kind's.
    pub fn recorded_config(&self) -> Option<&K::Desired> {
        self.recorded.as_ref()?.config.as_ref()
    }

    /// The facts the state recorded (none when nothing was).
    pub fn recorded_facts(&self) -> Option<&K::Recorded> {
        self.recorded.as_ref().map(|r| &r.facts)
    }

    /// In a rollback, what the generation it puts back recorded of this resource
    /// (`Change::restores`); `None` otherwise, or when that record does not read as the kind's.
    pub fn restored_facts(&self) -> Option<K::Recorded> {
        self.cx.change.restores.as_ref()?.typed().ok()
    }
}

/// What importing an object found (see [`Machine::import`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Imported {
    /// The object as a desired configuration of its kind, clear values included.
    pub config: crate::kind::Configuration,
    /// Readings to record (a container's id and image id).
    pub attributes: crate::kind::Attributes,
    /// What the plan says about it (a container without sparkform's labels).
    pub notes: Vec<String>,
    /// Paths in `config` of values that may be secrets the definition does not mark (an env
    /// var it does not set): plans and the state hold them as hashes.
    pub secret_paths: Vec<Vec<String>>,
}

/// Everything the executor and refresh do to a resource of one kind on a machine, on the
/// kind's types: its [`Kind`]'s `Desired` and `Recorded`, and its own `Undo`. The engine sees
/// it through [`AnyMachine`], which every implementation has.
#[async_trait]
pub trait Machine: Send + Sync + 'static {
    /// The pure half it works for.
    type Kind: Kind;
    /// What a completed step keeps for its undo, in this process only.
    type Undo: Default + Clone + Send + Sync + 'static;
    /// Make the machine match the change: create, update in place, replace, delete (and for
    /// a kind that runs, run it). Waiting until the result is ready is part of it.
    async fn apply(
        &self,
        cx: &Step<'_, Self::Kind>,
        action: Action,
    ) -> Result<Done<Self>, StepError>;
    /// Reverse a completed `apply` (rollback). Kinds that leave nothing on a machine have
    /// nothing to undo.
    async fn undo(
        &self,
        _cx: &Step<'_, Self::Kind>,
        _action: Action,
        _done: &Done<Self>,
    ) -> Result<String, StepError> {
        Ok(String::new())
    }
    /// After the whole apply succeeded: drop what was kept for rollback.
    async fn finalize(
        &self,
        _cx: &Step<'_, Self::Kind>,
        _action: Action,
        _done: &Done<Self>,
    ) -> Result<(), StepError> {
        Ok(())
    }
    /// Bring what the state recorded for it before the apply back as a rollback puts a process
    /// group back: [`Restore::Running`], started again from scratch and ready (the members
    /// restart one after another in dependency order, because a member that came back alone
    /// may have joined a peer the rollback removed), or [`Restore::Stopped`] (a group that could
    /// not be restored whole stops rather than run half of it). Kinds that run no process have
    /// nothing to restore.
    async fn restore(&self, _cx: &Step<'_, Self::Kind>, _to: Restore) -> Result<String, StepError> {
        Ok(String::new())
    }
    /// Look at one node: how the recorded resources of this kind there differ from the state,
    /// and objects of this kind the state does not explain, looking as far as `mode` says
    /// ([`ReadMode::deep`]). Kinds that leave nothing on a machine observe nothing.
    async fn observe(
        &self,
        _host: &dyn Host,
        _lineage: &str,
        _recorded: &[(String, Record<'_, Self::Kind>)],
        _mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        Ok(Default::default())
    }
    /// How each recorded resource of this kind on one node stands now, by address, as
    /// `sparkform status` shows it: by default what [`Machine::observe`] says of it. One not in
    /// the answer is shown as not seen.
    async fn look(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, Record<'_, Self::Kind>)],
    ) -> BTreeMap<String, Seen> {
        let Ok((seen, _)) = self
            .observe(host, lineage, recorded, ReadMode::Normal)
            .await
        else {
            return BTreeMap::new();
        };
        recorded
            .iter()
            .map(|(a, _)| (a.clone(), Seen::of(seen.get(a))))
            .collect()
    }
    /// Read its log on `host` as `read` asks, until it ends or `read.cancel` fires, and end the
    /// source (`LogRead::end`). Kinds without a log end it at once.
    async fn read_log(&self, _host: Arc<dyn Host>, read: LogRead) {
        read.end(None).await;
    }
    /// Whether what a recorded resource runs is healthy, over `window`: since the last check
    /// (`sparkform watch`, every interval), or now, at once, with why it is down (a check that
    /// depends on it, in `verify`, `watch` and an apply, asks before it runs and fails at once
    /// instead of retrying against it: a container that exited, with its exit code and what its
    /// log says it died of). `None`: the kind runs nothing, or it cannot be told (the check
    /// itself then finds out).
    async fn health(
        &self,
        _address: &str,
        _recorded: &Record<'_, Self::Kind>,
        _pool: &HostPool,
        _window: HealthWindow,
    ) -> Option<Health> {
        None
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
    /// (`config::load_with_readings`). `cx.mode` says how: looked up on `cx.pool`, or taken from the
    /// state or a saved plan; a mode that does not look never waits on anything.
    async fn read(&self, _cx: &ReadCx<'_>) -> Result<Readings, ReadError> {
        Ok(Readings::default())
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
        _desired: Option<&DesiredOf<Self>>,
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
        _desired: &DesiredOf<Self>,
        _pool: &HostPool,
        _containers: &ContainerIndex,
        _retry_for: std::time::Duration,
        _cancel: &tokio_util::sync::CancellationToken,
        _progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(std::time::Duration, String), StepError>> {
        None
    }
    /// What a rollback that starts `record` (the resource as generation `number` recorded it)
    /// again would miss on its node, as the plan's notes, found before anything runs: by
    /// default the images it ran (`Kind::images`) that the node's references no longer name.
    async fn restorable(
        &self,
        host: &dyn Host,
        address: &str,
        record: &Record<'_, Self::Kind>,
        number: u64,
    ) -> Vec<Restorable> {
        let r = record.state;
        let images = r.kind.kind().images(&r.config, Some(&r.attributes));
        restorable_images(host, address, images, number).await
    }
    /// Checks of what the changed resources of this kind do together (every attachment of a
    /// network reaches every other), run after them and before what depends on them.
    fn checks(&self, _config: &Config, _changed: &Changed<'_>) -> Vec<Check> {
        Vec::new()
    }
}

/// A kind's machine half as the engine uses it: configurations and records as the state and
/// plans hold them. Every [`Machine`] has it through the blanket impl below, which reads them
/// as the kind's types, so neither the engine nor a kind reads a key.
#[async_trait]
pub trait AnyMachine: Send + Sync {
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError>;
    async fn undo(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<String, StepError>;
    async fn finalize(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<(), StepError>;
    async fn restore(&self, cx: &StepCx<'_>, to: Restore) -> Result<String, StepError>;
    async fn observe(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, ResourceState)],
        mode: ReadMode,
    ) -> Result<NodeObservations, HostError>;
    async fn look(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, ResourceState)],
    ) -> BTreeMap<String, Seen>;
    async fn health(
        &self,
        address: &str,
        recorded: &ResourceState,
        pool: &HostPool,
        window: HealthWindow,
    ) -> Option<Health>;
    async fn read_log(&self, host: Arc<dyn Host>, read: LogRead);
    async fn find_foreign(
        &self,
        host: &dyn Host,
        lineage: &str,
        addresses: &[String],
    ) -> Result<Vec<Foreign>, HostError>;
    fn read_nodes(&self, config: &Config) -> Vec<String>;
    async fn read(&self, cx: &ReadCx<'_>) -> Result<Readings, ReadError>;
    async fn import(
        &self,
        host: &dyn Host,
        address: &str,
        object: &str,
        desired: Option<&crate::kind::Configuration>,
    ) -> Result<Imported, StepError>;
    async fn verify(
        &self,
        config: &crate::kind::Configuration,
        pool: &HostPool,
        containers: &ContainerIndex,
        retry_for: std::time::Duration,
        cancel: &tokio_util::sync::CancellationToken,
        progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(std::time::Duration, String), StepError>>;
    async fn restorable(
        &self,
        host: &dyn Host,
        address: &str,
        record: &ResourceState,
        number: u64,
    ) -> Vec<Restorable>;
    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check>;
}

impl<M: Machine> Done<M> {
    fn erased(self) -> Applied {
        Applied {
            attributes: crate::kind::Attributes::of(&self.recorded),
            undo: Some(Arc::new(self.undo)),
            summary: self.summary,
        }
    }

    /// What `applied` kept, back on `M`'s types; `None` when it is not `M`'s (a bug).
    fn of(applied: &Applied) -> Option<Done<M>> {
        let undo = match &applied.undo {
            Some(u) => u.downcast_ref::<M::Undo>()?.clone(),
            None => M::Undo::default(),
        };
        Some(Done {
            recorded: applied.attributes.typed().unwrap_or_default(),
            undo,
            summary: applied.summary.clone(),
        })
    }
}

/// Records by address read as `K`'s.
fn records<K: Kind>(recorded: &[(String, ResourceState)]) -> Vec<(String, Record<'_, K>)> {
    recorded
        .iter()
        .map(|(a, r)| (a.clone(), Record::of(r)))
        .collect()
}

/// A completed step whose record is not its kind's: a bug.
fn not_its_kind(address: &str) -> StepError {
    StepError::new(format!(
        "{address}: what the step left is not of this resource's kind"
    ))
    .help("this is a bug in sparkform: please report it")
}

#[async_trait]
impl<M: Machine> AnyMachine for M {
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError> {
        let step = Step::of(cx)?;
        Machine::apply(self, &step, action).await.map(Done::erased)
    }
    async fn undo(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<String, StepError> {
        let step = Step::of(cx)?;
        let done = Done::<M>::of(applied).ok_or_else(|| not_its_kind(cx.address))?;
        Machine::undo(self, &step, action, &done).await
    }
    async fn finalize(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<(), StepError> {
        let step = Step::of(cx)?;
        let done = Done::<M>::of(applied).ok_or_else(|| not_its_kind(cx.address))?;
        Machine::finalize(self, &step, action, &done).await
    }
    async fn restore(&self, cx: &StepCx<'_>, to: Restore) -> Result<String, StepError> {
        Machine::restore(self, &Step::of(cx)?, to).await
    }
    async fn observe(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, ResourceState)],
        mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        let typed = records::<M::Kind>(recorded);
        Machine::observe(self, host, lineage, &typed, mode).await
    }
    async fn look(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, ResourceState)],
    ) -> BTreeMap<String, Seen> {
        let typed = records::<M::Kind>(recorded);
        Machine::look(self, host, lineage, &typed).await
    }
    async fn health(
        &self,
        address: &str,
        recorded: &ResourceState,
        pool: &HostPool,
        window: HealthWindow,
    ) -> Option<Health> {
        Machine::health(self, address, &Record::of(recorded), pool, window).await
    }
    async fn read_log(&self, host: Arc<dyn Host>, read: LogRead) {
        Machine::read_log(self, host, read).await
    }
    async fn find_foreign(
        &self,
        host: &dyn Host,
        lineage: &str,
        addresses: &[String],
    ) -> Result<Vec<Foreign>, HostError> {
        Machine::find_foreign(self, host, lineage, addresses).await
    }
    fn read_nodes(&self, config: &Config) -> Vec<String> {
        Machine::read_nodes(self, config)
    }
    async fn read(&self, cx: &ReadCx<'_>) -> Result<Readings, ReadError> {
        Machine::read(self, cx).await
    }
    async fn import(
        &self,
        host: &dyn Host,
        address: &str,
        object: &str,
        desired: Option<&crate::kind::Configuration>,
    ) -> Result<Imported, StepError> {
        let desired = desired.and_then(|d| d.typed::<DesiredOf<M>>().ok());
        Machine::import(self, host, address, object, desired.as_ref()).await
    }
    async fn verify(
        &self,
        config: &crate::kind::Configuration,
        pool: &HostPool,
        containers: &ContainerIndex,
        retry_for: std::time::Duration,
        cancel: &tokio_util::sync::CancellationToken,
        progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(std::time::Duration, String), StepError>> {
        let desired = match config.typed::<DesiredOf<M>>() {
            Ok(d) => d,
            Err(_) => {
                return Some(Err(StepError::new(
                    "the configuration is not of this resource's kind",
                )
                .help("this is a bug in sparkform: please report it")))
            }
        };
        Machine::verify(
            self, &desired, pool, containers, retry_for, cancel, progress,
        )
        .await
    }
    async fn restorable(
        &self,
        host: &dyn Host,
        address: &str,
        record: &ResourceState,
        number: u64,
    ) -> Vec<Restorable> {
        Machine::restorable(self, host, address, &Record::of(record), number).await
    }
    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check> {
        Machine::checks(self, config, changed)
    }
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

/// A tar archive of regular files under `sparkform/`, for Docker's archive upload into a
/// one-shot container (the program it runs and its input), written by the `tar` crate: a name
/// longer than a header holds gets GNU's long-name entry, never a corrupt header.
pub fn tar_of(files: &[(&str, &[u8], u32)]) -> Result<Vec<u8>, StepError> {
    let fail =
        |e: std::io::Error| StepError::new(format!("cannot pack the files for a container: {e}"));
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    b.append_data(&mut dir, "sparkform/", std::io::empty())
        .map_err(fail)?;
    for (name, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, format!("sparkform/{name}"), *data)
            .map_err(fail)?;
    }
    b.into_inner().map_err(fail)
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

    /// The toy's step records its typed facts and keeps its typed undo; the engine sees only
    /// the erased `Applied`, and hands it back to the same kind's undo.
    #[tokio::test]
    async fn a_kinds_facts_and_undo_pass_the_engine_typed() {
        let text = crate::state::toy_state(Some(2), serde_json::json!({ "said": "before" }));
        let state = crate::state::parse_document(std::path::Path::new("s.json"), &text).unwrap();
        let recorded = &state.resources["toy.t"];
        let desired = serde_json::json!({ "node": "node.a", "greeting": "after" });
        let change: crate::plan::Change = serde_json::from_value(serde_json::json!({
            "address": "toy.t", "kind": "toy", "action": "update", "attributes": [],
        }))
        .unwrap();
        let pool = crate::hosts::HostPool::from_hosts(Default::default());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = tokio_util::sync::CancellationToken::new();
        let containers = Default::default();
        let secrets = Default::default();
        let cx = super::StepCx {
            address: "toy.t",
            change: &change,
            host: None,
            pool: &pool,
            lineage: "l",
            desired: Some(&desired.into()),
            recorded: Some(recorded),
            config_dir: std::path::Path::new("."),
            events: &tx,
            cancel: &cancel,
            containers: &containers,
            secrets: &secrets,
            gate: None,
        };
        let toy = super::machine(crate::vocabulary::KindId::Toy);
        let applied: super::Applied = toy.apply(&cx, crate::plan::Action::Update).await.unwrap();
        let facts: crate::kinds::toy::Recorded =
            crate::kind::facts_of(&applied.attributes).unwrap();
        assert_eq!(facts.said.as_deref(), Some("after"));
        let undone = toy
            .undo(&cx, crate::plan::Action::Update, &applied)
            .await
            .unwrap();
        assert_eq!(undone, "says Some(\"before\") again");
        // Another kind's record is not the toy's: a bug, said as one, never a panic.
        let foreign = super::Applied {
            undo: Some(std::sync::Arc::new(5u8)),
            ..super::Applied::default()
        };
        let e = toy
            .undo(&cx, crate::plan::Action::Update, &foreign)
            .await
            .unwrap_err();
        assert!(
            e.message.contains("not of this resource's kind"),
            "{}",
            e.message
        );
    }
}

//! One connection per node, opened in parallel, shared by everything that works on the node.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::local::LocalHost;
use super::pooled::Pooled;
use super::ssh::{ConnectContext, SshHost};
use super::ssh_config::{self, SshSettings, SshTarget};

use super::{Host, HostError, RoundTrips};
use crate::config::Config;

/// Opens a node's host without connecting to it: how the tests hand the engine nodes in memory
/// (the test kit's `FakeNodes`) through the same pool the product uses.
pub trait OpenNode: Send + Sync + std::fmt::Debug {
    /// The node's host, or why there is none.
    fn open(&self, node: &str) -> Result<Arc<dyn Host>, HostError>;
}

#[derive(Debug, Clone)]
pub struct HostOptions {
    /// `-accept-new-host-keys`: trust unknown host keys on first use (changed keys never).
    pub accept_new_host_keys: bool,
    pub connect_timeout: Duration,
    /// Read the user's ~/.ssh/config for aliases (off in tests, for isolation).
    pub use_user_config: bool,
    /// The warm mode's idle bound (`--persist`, `hosts::warm`): masters kept for the next
    /// command. None: every connection ends with its command.
    pub persist: Option<Duration>,
    /// Open every node with this instead of connecting (the test kit's nodes in memory).
    pub opener: Option<Arc<dyn OpenNode>>,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            accept_new_host_keys: false,
            connect_timeout: Duration::from_secs(10),
            use_user_config: true,
            persist: None,
            opener: None,
        }
    }
}

/// Node handshakes at once behind one jump host. The hops are channels of the jump host's
/// master connection, so its sshd's `MaxStartups` (10 by default) does not count them; the cap
/// only keeps a large fleet from starting hundreds of ssh processes at once.
const NEW_CONNECTIONS_PER_JUMP: usize = 32;

/// Where `connect_reporting` sends each node the moment it is connected.
pub type Ready = tokio::sync::mpsc::UnboundedSender<(String, Arc<dyn Host>)>;

pub struct HostPool {
    /// Each node as the pool hands it out: counted, and sharing reads while it remembers.
    hosts: BTreeMap<String, Arc<Pooled>>,
    /// Whether the pool reads for a plan ([`HostPool::remember`]).
    remembering: bool,
    errors: BTreeMap<String, Arc<HostError>>,
    /// Master connections to jump hosts (their control sockets), closed with the pool.
    jump_masters: Vec<PathBuf>,
    /// Hold the generated ssh configs and the control sockets; removed on drop.
    dirs: Vec<tempfile::TempDir>,
}

impl HostPool {
    /// Connect to `nodes` (addresses such as `node.spark1`) in parallel. A node that cannot be
    /// reached gets an error; the others are usable.
    pub async fn connect(config: &Config, nodes: &[String], opts: &HostOptions) -> HostPool {
        Self::connect_reporting(config, nodes, opts, None).await
    }

    /// A pool with no remote connection (none asked for, or none possible: `errors` say why).
    fn unconnected(
        hosts: BTreeMap<String, Arc<Pooled>>,
        errors: BTreeMap<String, Arc<HostError>>,
        dirs: Vec<tempfile::TempDir>,
    ) -> HostPool {
        HostPool {
            hosts,
            remembering: false,
            errors,
            jump_masters: Vec::new(),
            dirs,
        }
    }

    /// `connect`, sending each node on `ready` as soon as it is connected, so work on the first
    /// nodes overlaps the handshakes of the last. The channel closes when every node is done.
    pub async fn connect_reporting(
        config: &Config,
        nodes: &[String],
        opts: &HostOptions,
        ready: Option<Ready>,
    ) -> HostPool {
        if let Some(opener) = &opts.opener {
            return Self::open_each(opener.as_ref(), config, nodes, &ready);
        }
        let mut hosts: BTreeMap<String, Arc<Pooled>> = BTreeMap::new();
        let mut errors = undeclared(config, nodes);
        let wanted: Vec<&crate::config::Node> =
            nodes.iter().filter_map(|n| config.nodes.get(n)).collect();
        for node in wanted.iter().filter(|n| n.host == "local") {
            let host = Arc::new(Pooled::new(Arc::new(LocalHost::new(&node.address))));
            report(&ready, &node.address, &host);
            hosts.insert(node.address.clone(), host);
        }
        let remote: Vec<&&crate::config::Node> =
            wanted.iter().filter(|n| n.host != "local").collect();
        if remote.is_empty() {
            return HostPool::unconnected(hosts, errors, Vec::new());
        }
        let fail_all = |errors: &mut BTreeMap<String, Arc<HostError>>, message: String| {
            for n in &remote {
                errors.insert(
                    n.address.clone(),
                    Arc::new(HostError::Other {
                        node: n.address.clone(),
                        message: message.clone(),
                    }),
                );
            }
        };
        let dir = match super::lifetime::control_dir() {
            Ok(d) => d,
            Err(e) => {
                fail_all(
                    &mut errors,
                    format!("cannot create a temporary directory: {e}"),
                );
                return HostPool::unconnected(hosts, errors, Vec::new());
            }
        };
        let warm_root = match opts.persist.map(|_| super::warm::root()).transpose() {
            Ok(r) => r,
            Err(e) => {
                fail_all(&mut errors, format!("warm mode (--persist): {e}"));
                return HostPool::unconnected(hosts, errors, vec![dir]);
            }
        };
        let (targets, settings, slots) =
            ssh_targets(config, &remote, opts, &dir, warm_root.as_deref()).await;
        let text = match ssh_config::render(&targets, &settings) {
            Ok(t) => t,
            Err(e) => {
                fail_all(&mut errors, e);
                return HostPool::unconnected(hosts, errors, vec![dir]);
            }
        };
        let config_file = dir.path().join("ssh_config");
        if let Err(e) = std::fs::write(&config_file, text) {
            fail_all(&mut errors, format!("cannot write the ssh config: {e}"));
            return HostPool::unconnected(hosts, errors, vec![dir]);
        }
        // One master per jump host first: every node hop then goes through it, one handshake
        // at the jump host instead of one per node (and no pressure on its MaxStartups).
        let (jump_masters, jump_failed) =
            start_jump_masters(config, &targets, &config_file, opts, &slots).await;
        let ctl_root = dir.path().to_path_buf();
        let mut pool = HostPool {
            hosts,
            remembering: false,
            errors,
            jump_masters,
            dirs: vec![dir],
        };
        pool.connect_nodes(
            &remote,
            &targets,
            &jump_failed,
            &config_file,
            &ctl_root,
            opts,
            &ready,
            &slots,
        )
        .await;
        pool
    }

    /// The remote nodes, through their jump hosts' masters, at most `NEW_CONNECTIONS_PER_JUMP`
    /// handshakes at once per jump host; a node behind a jump host that failed gets its error.
    #[allow(clippy::too_many_arguments)]
    async fn connect_nodes(
        &mut self,
        remote: &[&&crate::config::Node],
        targets: &[SshTarget],
        jump_failed: &HashMap<String, Arc<HostError>>,
        config_file: &Path,
        ctl_root: &Path,
        opts: &HostOptions,
        ready: &Option<Ready>,
        slots: &HashMap<String, super::warm::Slot>,
    ) {
        let mut gates: HashMap<String, Arc<Semaphore>> = HashMap::new();
        let mut tasks = crate::tasks::KeyedTasks::new();
        for node in remote {
            if let Some(e) = node.jump.as_ref().and_then(|j| jump_failed.get(j)) {
                self.errors.insert(
                    node.address.clone(),
                    Arc::new(behind_jump(
                        &node.address,
                        node.jump.as_deref().unwrap_or_default(),
                        e,
                    )),
                );
                continue;
            }
            let gate = gates
                .entry(node.jump.clone().unwrap_or_else(|| node.address.clone()))
                .or_insert_with(|| Arc::new(Semaphore::new(NEW_CONNECTIONS_PER_JUMP)))
                .clone();
            let target = targets
                .iter()
                .find(|t| t.alias == ssh_config::alias(&node.address))
                .cloned();
            let known_hosts = target
                .as_ref()
                .and_then(|t| t.known_hosts.clone())
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| Path::new(&h).join(".ssh/known_hosts"))
                })
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "~/.ssh/known_hosts".into());
            let (address, host, jump) =
                (node.address.clone(), node.host.clone(), node.jump.clone());
            let config_file: PathBuf = config_file.to_path_buf();
            let ctl_root = ctl_root.to_path_buf();
            let timeout = opts.connect_timeout;
            let slot = slots.get(&ssh_config::alias(&address)).cloned();
            tasks.spawn(address.clone(), async move {
                let _permit = gate.acquire_owned().await;
                let alias = ssh_config::alias(&address);
                let cx = ConnectContext {
                    node: &address,
                    target: &host,
                    jump: jump.as_deref(),
                    known_hosts,
                    timeout,
                };
                SshHost::connect(&config_file, &alias, &ctl_root, cx, slot).await
            });
        }
        while let Some((address, joined)) = tasks.next().await {
            match joined {
                Ok(Ok(h)) => {
                    let host = Arc::new(Pooled::new(Arc::new(h)));
                    report(ready, &address, &host);
                    self.hosts.insert(address, host);
                }
                Ok(Err(e)) => {
                    self.errors.insert(address, Arc::new(e));
                }
                Err(message) => {
                    let e = HostError::Other {
                        node: address.clone(),
                        message,
                    };
                    self.errors.insert(address, Arc::new(e));
                }
            }
        }
    }

    /// Connect the `nodes` this pool has not tried yet, so that an apply reuses the connections
    /// its refresh opened.
    pub async fn connect_more(&mut self, config: &Config, nodes: &[String], opts: &HostOptions) {
        let missing: Vec<String> = nodes
            .iter()
            .filter(|n| !self.hosts.contains_key(*n) && !self.errors.contains_key(*n))
            .cloned()
            .collect();
        if missing.is_empty() {
            return;
        }
        let mut more = HostPool::connect(config, &missing, opts).await;
        more.remember(self.remembering);
        self.hosts.extend(std::mem::take(&mut more.hosts));
        self.errors.extend(std::mem::take(&mut more.errors));
        self.jump_masters
            .extend(std::mem::take(&mut more.jump_masters));
        self.dirs.extend(std::mem::take(&mut more.dirs));
    }

    /// [`Self::connect_reporting`] through an [`OpenNode`] (`HostOptions::opener`).
    fn open_each(
        opener: &dyn OpenNode,
        config: &Config,
        nodes: &[String],
        ready: &Option<Ready>,
    ) -> HostPool {
        let mut pool = HostPool::from_hosts(BTreeMap::new());
        pool.errors = undeclared(config, nodes);
        for node in nodes.iter().filter(|n| config.nodes.contains_key(*n)) {
            match opener.open(node) {
                Ok(host) => {
                    let host = Arc::new(Pooled::new(host));
                    report(ready, node, &host);
                    pool.hosts.insert(node.clone(), host);
                }
                Err(e) => {
                    pool.errors.insert(node.clone(), Arc::new(e));
                }
            }
        }
        pool
    }

    /// A pool of hosts made elsewhere (the fake ones of tests): nothing to connect or close.
    pub fn from_hosts(hosts: BTreeMap<String, Arc<dyn Host>>) -> HostPool {
        HostPool {
            hosts: hosts
                .into_iter()
                .map(|(a, h)| (a, Arc::new(Pooled::new(h))))
                .collect(),
            remembering: false,
            errors: BTreeMap::new(),
            jump_masters: Vec::new(),
            dirs: Vec::new(),
        }
    }

    pub fn get(&self, node: &str) -> Result<Arc<dyn Host>, Arc<HostError>> {
        match self.hosts.get(node) {
            Some(h) => Ok(h.clone() as Arc<dyn Host>),
            None => Err(self.errors.get(node).cloned().unwrap_or_else(|| {
                Arc::new(HostError::Other {
                    node: node.to_string(),
                    message: "no connection was opened to this node".into(),
                })
            })),
        }
    }

    pub fn errors(&self) -> &BTreeMap<String, Arc<HostError>> {
        &self.errors
    }

    pub fn connected(&self) -> impl Iterator<Item = (&String, Arc<dyn Host>)> {
        self.hosts
            .iter()
            .map(|(a, h)| (a, h.clone() as Arc<dyn Host>))
    }

    /// While a plan is made from what the nodes show (`on`): every reader of a node shares
    /// one glance and one inspect per image reference (`hosts::pooled`). Off forgets them,
    /// before anything changes the nodes.
    pub fn remember(&mut self, on: bool) {
        self.remembering = on;
        for h in self.hosts.values() {
            h.remember(on);
        }
    }

    /// The round trips made on each connected node since it joined the pool.
    pub fn round_trips(&self) -> BTreeMap<String, RoundTrips> {
        self.hosts
            .iter()
            .map(|(a, h)| (a.clone(), h.round_trips()))
            .collect()
    }

    /// Close every master connection (in parallel).
    pub async fn close(mut self) {
        let mut set = tokio::task::JoinSet::new();
        for (_, h) in std::mem::take(&mut self.hosts) {
            set.spawn(async move { h.close().await });
        }
        while set.join_next().await.is_some() {}
        for ctl in std::mem::take(&mut self.jump_masters) {
            let _ = tokio::process::Command::from(exit_master(&ctl))
                .status()
                .await;
        }
    }
}

impl Drop for HostPool {
    /// A pool dropped without `close` (an early return) must not leave its jump masters
    /// running: they were started with ControlPersist and outlive the process otherwise.
    fn drop(&mut self) {
        for ctl in std::mem::take(&mut self.jump_masters) {
            let _ = exit_master(&ctl).status();
        }
    }
}

/// `ssh -O exit` for the master connection behind control socket `ctl`.
fn exit_master(ctl: &Path) -> std::process::Command {
    super::lifetime::exit_master(ctl)
}

/// When the user's ssh config defines the address as an alias, use what it resolves to, as
/// plain `ssh ADDRESS` would.
async fn apply_user_alias(user_config: &Path, t: &mut SshTarget) {
    let out = tokio::process::Command::new("ssh")
        .arg("-G")
        .arg("-F")
        .arg(user_config)
        .arg(&t.hostname)
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    let Ok(out) = out else { return };
    if !out.status.success() {
        return;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
            .map(str::to_string)
    };
    let Some(hostname) = get("hostname") else {
        return;
    };
    if hostname.eq_ignore_ascii_case(&t.hostname) {
        return;
    }
    t.hostname = hostname;
    if t.user.is_none() {
        t.user = get("user");
    }
    if t.port.is_none() {
        t.port = get("port").and_then(|p| p.parse().ok());
    }
}

/// Start the master connection to a jump host (in the warm mode: reuse the warm one when it
/// answers, else start one there); Err carries ssh's log.
async fn start_jump_master(
    config_file: &Path,
    t: &SshTarget,
    timeout: Duration,
    warm: Option<super::warm::Slot>,
) -> Result<(), String> {
    let Some(ctl) = &t.control_path else {
        return Ok(());
    };
    let limit = timeout * 2 + Duration::from_secs(5);
    let _guard = match &warm {
        Some(slot) => {
            let guard = slot.lock(limit).await?;
            if super::warm::answers(ctl).await && super::lifetime::hold(ctl).is_ok() {
                return Ok(());
            }
            let _ = std::fs::remove_file(ctl);
            Some(guard)
        }
        None => None,
    };
    let log = ctl.with_extension("log");
    let _ = std::fs::remove_file(&log);
    let options = match &warm {
        Some(slot) => super::lifetime::master_options_persisting(slot.persist),
        None => super::lifetime::master_options(),
    };
    let mut cmd = tokio::process::Command::new("ssh");
    cmd.arg("-F")
        .arg(config_file)
        .arg("-E")
        .arg(&log)
        .args(options)
        // Its own process group, so the terminal's Ctrl-C leaves it up for the rollback.
        .process_group(0)
        .arg(&t.alias)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(limit, cmd.status()).await {
        Ok(Ok(s)) if s.success() => {
            let up = match &warm {
                Some(slot) => super::lifetime::hold(ctl).inspect(|()| {
                    slot.write_info(&super::warm::Info {
                        address: t.alias.trim_start_matches("sf.").to_string(),
                        target: t.hostname.clone(),
                        via: None,
                        persist_secs: slot.persist.as_secs(),
                        started: super::warm::now_secs(),
                    })
                }),
                None => super::lifetime::started(ctl),
            };
            up.map_err(|e| format!("the master connection went away at once: {e}"))
        }
        Ok(Ok(_)) => Err(std::fs::read_to_string(&log).unwrap_or_default()),
        Ok(Err(e)) => Err(format!("cannot run ssh: {e}")),
        Err(_) => Err(format!(
            "connect to host {} timed out: no answer within {} s",
            t.hostname,
            (timeout * 2).as_secs() + 5
        )),
    }
}

/// A node's error when its jump host could not be reached: the jump's own error, kept when it
/// is about keys (the user must act on that host), otherwise "jump unreachable".
fn behind_jump(node: &str, jump: &str, e: &HostError) -> HostError {
    use miette::Diagnostic;
    match e {
        HostError::HostKeyUnknown {
            target,
            known_hosts,
            help,
            ..
        } => HostError::HostKeyUnknown {
            node: node.to_string(),
            target: target.clone(),
            known_hosts: known_hosts.clone(),
            help: help.clone(),
        },
        HostError::HostKeyChanged {
            target,
            known_hosts,
            help,
            ..
        } => HostError::HostKeyChanged {
            node: node.to_string(),
            target: target.clone(),
            known_hosts: known_hosts.clone(),
            help: help.clone(),
        },
        HostError::AuthRefused { target, reason, .. } => HostError::AuthRefused {
            node: node.to_string(),
            target: target.clone(),
            reason: reason.clone(),
        },
        other => HostError::JumpUnreachable {
            node: node.to_string(),
            jump: jump.to_string(),
            reason: other.to_string(),
            help: Some(other.help().map(|h| h.to_string()).unwrap_or_else(|| {
                "the node was not tried: check the jump host's address, port and that it is up"
                    .into()
            })),
        },
    }
}

/// Send a connected node on `ready`, when the caller asked for them as they come.
fn report(ready: &Option<Ready>, address: &str, host: &Arc<Pooled>) {
    if let Some(tx) = ready {
        let _ = tx.send((address.to_string(), host.clone() as Arc<dyn Host>));
    }
}

/// The nodes asked for that the configuration does not declare, each with its error.
fn undeclared(config: &Config, nodes: &[String]) -> BTreeMap<String, Arc<HostError>> {
    let mut errors = BTreeMap::new();
    for n in nodes {
        if !config.nodes.contains_key(n) {
            errors.insert(
                n.clone(),
                Arc::new(HostError::Other {
                    node: n.clone(),
                    message: "not declared in the configuration".into(),
                }),
            );
        }
    }
    errors
}

/// The generated ssh config's targets (with the user's aliases when their config is used), a
/// control socket for each jump host, the settings it is rendered with, and in the warm mode
/// (`warm_root`) each target's warm slot by alias.
async fn ssh_targets(
    config: &Config,
    remote: &[&&crate::config::Node],
    opts: &HostOptions,
    dir: &tempfile::TempDir,
    warm_root: Option<&Path>,
) -> (
    Vec<SshTarget>,
    SshSettings,
    HashMap<String, super::warm::Slot>,
) {
    let user_config = std::env::var_os("HOME")
        .map(|h| Path::new(&h).join(".ssh/config"))
        .filter(|p| opts.use_user_config && p.is_file());
    let mut targets = ssh_config::targets(config);
    if let Some(uc) = &user_config {
        // One `ssh -G` per target, all at once: sequentially they add up at many nodes.
        futures_util::future::join_all(targets.iter_mut().map(|t| apply_user_alias(uc, t))).await;
    }
    let jump_aliases: Vec<String> = remote
        .iter()
        .filter_map(|n| n.jump.as_deref().map(ssh_config::alias))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let settings = SshSettings {
        accept_new_host_keys: opts.accept_new_host_keys,
        connect_timeout_secs: opts.connect_timeout.as_secs().max(1),
        user_config,
    };
    let slots = match (warm_root, opts.persist) {
        (Some(root), Some(persist)) => warm_slots(&targets, &settings, root, persist),
        _ => HashMap::new(),
    };
    for (i, t) in targets.iter_mut().enumerate() {
        if jump_aliases.contains(&t.alias) {
            t.control_path = Some(match slots.get(&t.alias) {
                Some(slot) => slot.master(),
                None => dir.path().join(format!("j{i}")),
            });
        }
    }
    (targets, settings, slots)
}

/// Each target's warm slot, named by everything its connection is made with: its own entry,
/// its jump host's and the settings.
fn warm_slots(
    targets: &[SshTarget],
    settings: &SshSettings,
    root: &Path,
    persist: Duration,
) -> HashMap<String, super::warm::Slot> {
    let entry = |alias: &str| {
        targets
            .iter()
            .find(|t| t.alias == alias)
            .map(|t| {
                format!(
                    "{:?}",
                    SshTarget {
                        control_path: None,
                        ..t.clone()
                    }
                )
            })
            .unwrap_or_default()
    };
    targets
        .iter()
        .map(|t| {
            let jump = t.proxy_jump.as_deref().map(entry).unwrap_or_default();
            let text = format!(
                "{}\njump {jump}\naccept-new {}\nuser config {:?}",
                entry(&t.alias),
                settings.accept_new_host_keys,
                settings.user_config
            );
            (
                t.alias.clone(),
                super::warm::Slot::new(root, &text, persist),
            )
        })
        .collect()
}

/// One master connection per jump host, all at once: the control sockets of those that
/// started, and the error of each that did not (by the jump host's address).
async fn start_jump_masters(
    config: &Config,
    targets: &[SshTarget],
    config_file: &Path,
    opts: &HostOptions,
    slots: &HashMap<String, super::warm::Slot>,
) -> (Vec<PathBuf>, HashMap<String, Arc<HostError>>) {
    let mut jump_masters = Vec::new();
    let mut jump_failed: HashMap<String, Arc<HostError>> = HashMap::new();
    let mut starts = crate::tasks::KeyedTasks::new();
    for t in targets.iter().filter(|t| t.control_path.is_some()) {
        let (key, t, config_file, timeout) = (
            t.clone(),
            t.clone(),
            config_file.to_path_buf(),
            opts.connect_timeout,
        );
        let slot = slots.get(&t.alias).cloned();
        starts.spawn(key, async move {
            start_jump_master(&config_file, &t, timeout, slot).await
        });
    }
    while let Some((t, r)) = starts.next().await {
        let jump_address = config
            .jumps
            .values()
            .find(|j| ssh_config::alias(&j.address) == t.alias)
            .map(|j| j.address.clone())
            .unwrap_or_else(|| t.alias.clone());
        match r {
            // A warm master is kept, not ended with the pool.
            Ok(Ok(())) if slots.contains_key(&t.alias) => {}
            Ok(Ok(())) => jump_masters.extend(t.control_path.clone()),
            Err(message) => {
                let e = Arc::new(HostError::Other {
                    node: jump_address.clone(),
                    message,
                });
                jump_failed.insert(jump_address, e);
            }
            Ok(Err(log)) => {
                let cx = ConnectContext {
                    node: &jump_address,
                    target: &t.hostname,
                    jump: None,
                    known_hosts: t
                        .known_hosts
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "~/.ssh/known_hosts".into()),
                    timeout: opts.connect_timeout,
                };
                let e = Arc::new(super::ssh::classify(&log, &cx));
                jump_failed.insert(jump_address.clone(), e);
            }
        }
    }
    (jump_masters, jump_failed)
}

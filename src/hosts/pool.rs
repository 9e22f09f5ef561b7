//! One connection per node, opened in parallel, shared by everything that works on the node.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::local::LocalHost;
use super::ssh::{ConnectContext, SshHost};
use super::ssh_config::{self, SshSettings, SshTarget};
use super::{Host, HostError};
use crate::config::Config;

#[derive(Debug, Clone)]
pub struct HostOptions {
    /// `-accept-new-host-keys`: trust unknown host keys on first use (changed keys never).
    pub accept_new_host_keys: bool,
    pub connect_timeout: Duration,
    /// Read the user's ~/.ssh/config for aliases (off in tests, for isolation).
    pub use_user_config: bool,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            accept_new_host_keys: false,
            connect_timeout: Duration::from_secs(10),
            use_user_config: true,
        }
    }
}

/// sshd's default `MaxStartups 10:30:100` refuses unauthenticated connections beyond 10: open
/// at most this many at once through one jump host.
const NEW_CONNECTIONS_PER_JUMP: usize = 8;

pub struct HostPool {
    hosts: BTreeMap<String, Arc<dyn Host>>,
    errors: BTreeMap<String, Arc<HostError>>,
    /// Holds the generated ssh config and the control sockets; removed on drop.
    _dir: Option<tempfile::TempDir>,
}

impl HostPool {
    /// Connect to `nodes` (addresses such as `node.spark1`) in parallel. A node that cannot be
    /// reached gets an error; the others are usable.
    pub async fn connect(config: &Config, nodes: &[String], opts: &HostOptions) -> HostPool {
        let mut hosts: BTreeMap<String, Arc<dyn Host>> = BTreeMap::new();
        let mut errors = BTreeMap::new();
        let wanted: Vec<&crate::config::Node> =
            nodes.iter().filter_map(|n| config.nodes.get(n)).collect();
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
        for node in wanted.iter().filter(|n| n.host == "local") {
            hosts.insert(
                node.address.clone(),
                Arc::new(LocalHost::new(&node.address)),
            );
        }
        let remote: Vec<&&crate::config::Node> =
            wanted.iter().filter(|n| n.host != "local").collect();
        if remote.is_empty() {
            return HostPool {
                hosts,
                errors,
                _dir: None,
            };
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
        // Short path: unix socket paths are limited to 108 bytes.
        let dir = match tempfile::Builder::new().prefix("sf").tempdir_in("/tmp") {
            Ok(d) => d,
            Err(e) => {
                fail_all(
                    &mut errors,
                    format!("cannot create a temporary directory: {e}"),
                );
                return HostPool {
                    hosts,
                    errors,
                    _dir: None,
                };
            }
        };
        let user_config = std::env::var_os("HOME")
            .map(|h| Path::new(&h).join(".ssh/config"))
            .filter(|p| opts.use_user_config && p.is_file());
        let mut targets = ssh_config::targets(config);
        if let Some(uc) = &user_config {
            for t in &mut targets {
                apply_user_alias(uc, t).await;
            }
        }
        let settings = SshSettings {
            accept_new_host_keys: opts.accept_new_host_keys,
            connect_timeout_secs: opts.connect_timeout.as_secs().max(1),
            user_config,
        };
        let text = match ssh_config::render(&targets, &settings) {
            Ok(t) => t,
            Err(e) => {
                fail_all(&mut errors, e);
                return HostPool {
                    hosts,
                    errors,
                    _dir: Some(dir),
                };
            }
        };
        let config_file = dir.path().join("ssh_config");
        if let Err(e) = std::fs::write(&config_file, text) {
            fail_all(&mut errors, format!("cannot write the ssh config: {e}"));
            return HostPool {
                hosts,
                errors,
                _dir: Some(dir),
            };
        }
        let mut gates: HashMap<String, Arc<Semaphore>> = HashMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        for node in remote {
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
            let config_file: PathBuf = config_file.clone();
            let ctl_root = dir.path().to_path_buf();
            let timeout = opts.connect_timeout;
            tasks.spawn(async move {
                let _permit = gate.acquire_owned().await;
                let alias = ssh_config::alias(&address);
                let cx = ConnectContext {
                    node: &address,
                    target: &host,
                    jump: jump.as_deref(),
                    known_hosts,
                    timeout,
                };
                let r = SshHost::connect(&config_file, &alias, &ctl_root, cx).await;
                (address, r)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((address, Ok(h))) => {
                    hosts.insert(address, Arc::new(h));
                }
                Ok((address, Err(e))) => {
                    errors.insert(address, Arc::new(e));
                }
                Err(e) => {
                    // A panicking connect task: report it on every node still missing.
                    let _ = e;
                }
            }
        }
        HostPool {
            hosts,
            errors,
            _dir: Some(dir),
        }
    }

    pub fn get(&self, node: &str) -> Result<Arc<dyn Host>, Arc<HostError>> {
        match self.hosts.get(node) {
            Some(h) => Ok(h.clone()),
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

    pub fn connected(&self) -> impl Iterator<Item = (&String, &Arc<dyn Host>)> {
        self.hosts.iter()
    }

    /// Close every master connection (in parallel).
    pub async fn close(self) {
        let mut set = tokio::task::JoinSet::new();
        for (_, h) in self.hosts {
            set.spawn(async move { h.close().await });
        }
        while set.join_next().await.is_some() {}
    }
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

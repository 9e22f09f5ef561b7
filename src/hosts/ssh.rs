//! A node reached over SSH: one master connection (native mux) shared by every command, the
//! Docker socket forwarded through it, at most 8 sessions at once (sshd's MaxSessions is 10).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use openssh::{ForwardType, Session, Socket};
use tokio::sync::{Mutex, Semaphore};

use super::{
    docker_on_socket, lifetime, warm, Cmd, Counter, Endpoint, Host, HostError, Output, RoundTrips,
};

pub const MAX_SESSIONS: usize = 8;

pub struct SshHost {
    node: String,
    /// What the user wrote (`spark1`), for messages.
    target: String,
    /// Shared by concurrent commands; taken out only to close.
    session: std::sync::Mutex<Option<Arc<Session>>>,
    /// This run's folder for the connection: the forwarded sockets (and, cold, the master).
    ctl_dir: PathBuf,
    /// The master's control socket.
    master: PathBuf,
    /// A warm master (`warm`): kept when this command ends, so `close` lets it go instead.
    warm: bool,
    /// The run folder of a warm connection (a cold one's belongs to its session).
    _run_dir: Option<tempfile::TempDir>,
    sessions: Arc<Semaphore>,
    docker: Mutex<Option<bollard::Docker>>,
    forwards: Mutex<Vec<(String, u16, PathBuf)>>,
    trips: Counter,
}

/// Where a master connection failed, for the error message.
pub struct ConnectContext<'a> {
    pub node: &'a str,
    pub target: &'a str,
    pub jump: Option<&'a str>,
    pub known_hosts: String,
    pub timeout: Duration,
}

impl SshHost {
    /// Start the master connection for `alias` of the generated config file; with `warm`, reuse
    /// the warm master of its slot when one answers, or start one there that outlives this
    /// command by the slot's bound.
    pub async fn connect(
        config_file: &Path,
        alias: &str,
        ctl_root: &Path,
        cx: ConnectContext<'_>,
        warm: Option<warm::Slot>,
    ) -> Result<SshHost, HostError> {
        let other = |message: String| HostError::Other {
            node: cx.node.to_string(),
            message,
        };
        let dir = tempfile::Builder::new()
            .prefix("m")
            .tempdir_in(ctl_root)
            .map_err(|e| other(format!("cannot create the ssh control directory: {e}")))?;
        // ssh bounds each TCP connect; the jump adds one more hop and authentication.
        let limit = cx.timeout * 2 + Duration::from_secs(5);
        let (master, log, _guard) = match &warm {
            None => (dir.path().join("master"), dir.path().join("log"), None),
            Some(slot) => {
                let guard = slot.lock(limit).await.map_err(other)?;
                let master = slot.master();
                if warm::answers(&master).await && lifetime::hold(&master).is_ok() {
                    let session = Session::resume_mux(master.clone().into(), None);
                    if reaches(&session).await {
                        let ctl_dir = dir.path().to_path_buf();
                        return Ok(SshHost::build(&cx, session, master, ctl_dir, Some(dir)));
                    }
                    // The machine went away behind a master that still answers here (it would
                    // notice within its keepalives): end it and connect anew.
                    lifetime::release(&master);
                    let mut exit = tokio::process::Command::from(lifetime::exit_command(&master));
                    exit.kill_on_drop(true);
                    let _ = tokio::time::timeout(Duration::from_secs(5), exit.status()).await;
                }
                // A master that died (killed, the machine rebooted): reaped here.
                let _ = std::fs::remove_file(&master);
                let _ = std::fs::remove_file(slot.log());
                (master, slot.log(), Some(guard))
            }
        };
        let options = match &warm {
            Some(slot) => lifetime::master_options_persisting(slot.persist),
            None => lifetime::master_options(),
        };
        // `-E` takes only this ssh's own messages; the ProxyJump hop it runs reports on stderr
        // (e.g. the jump's master refusing the forward to an unreachable node).
        let stderr_path = dir.path().join("stderr");
        let stderr = match std::fs::File::create(&stderr_path) {
            Ok(f) => std::process::Stdio::from(f),
            Err(_) => std::process::Stdio::null(),
        };
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.arg("-F")
            .arg(config_file)
            .arg("-E")
            .arg(&log)
            .arg("-S")
            .arg(&master)
            .args(options)
            // Its own process group: the terminal's Ctrl-C must not reach the ProxyJump
            // helper it leaves behind when it goes to the background, or the rollback that
            // Ctrl-C starts finds the node unreachable.
            .process_group(0)
            .arg(alias)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        let status = match tokio::time::timeout(limit, cmd.status()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(other(format!("cannot run ssh: {e}"))),
            Err(_) => return Err(HostError::Unreachable {
                node: cx.node.to_string(),
                target: cx.target.to_string(),
                reason: format!("no answer within {} s", limit.as_secs()),
                help: Some(
                    "check that the machine is up and reachable from here (or from its jump host)"
                        .into(),
                ),
            }),
        };
        if !status.success() {
            let mut text = std::fs::read_to_string(&log).unwrap_or_default();
            text.push('\n');
            text.push_str(&std::fs::read_to_string(&stderr_path).unwrap_or_default());
            // Under ControlPersist ssh sends the ProxyJump hop's stderr to /dev/null, so the
            // hop's "Session open refused by peer" is lost: ask the jump host's master instead.
            let jump_up = cx.jump.is_some() && jump_master_answers(config_file, alias).await;
            return Err(classify_hop(&text, &cx, jump_up));
        }
        let up = match &warm {
            Some(_) => lifetime::hold(&master),
            None => lifetime::started(&master),
        };
        if let Err(e) = up {
            let _ = tokio::process::Command::from(lifetime::exit_master(&master))
                .status()
                .await;
            return Err(other(format!(
                "the ssh master connection went away at once: {e}"
            )));
        }
        match warm {
            Some(slot) => {
                slot.write_info(&warm::Info {
                    address: cx.node.to_string(),
                    target: cx.target.to_string(),
                    via: cx.jump.map(str::to_string),
                    persist_secs: slot.persist.as_secs(),
                    started: warm::now_secs(),
                });
                let session = Session::resume_mux(master.clone().into(), None);
                let ctl_dir = dir.path().to_path_buf();
                Ok(SshHost::build(&cx, session, master, ctl_dir, Some(dir)))
            }
            None => {
                let ctl_dir = dir.path().to_path_buf();
                let session = Session::new_native_mux(dir);
                Ok(SshHost::build(&cx, session, master, ctl_dir, None))
            }
        }
    }

    /// `run_dir`: a warm connection's folder of this run (a cold one's is its session's).
    fn build(
        cx: &ConnectContext<'_>,
        session: Session,
        master: PathBuf,
        ctl_dir: PathBuf,
        run_dir: Option<tempfile::TempDir>,
    ) -> SshHost {
        SshHost {
            node: cx.node.to_string(),
            target: cx.target.to_string(),
            session: std::sync::Mutex::new(Some(Arc::new(session))),
            ctl_dir,
            master,
            warm: run_dir.is_some(),
            _run_dir: run_dir,
            sessions: Arc::new(Semaphore::new(MAX_SESSIONS)),
            docker: Mutex::new(None),
            forwards: Mutex::new(Vec::new()),
            trips: Counter::default(),
        }
    }

    fn lost(&self, reason: impl std::fmt::Display) -> HostError {
        HostError::Disconnected {
            node: self.node.clone(),
            reason: reason.to_string(),
        }
    }

    fn session(&self) -> Result<Arc<Session>, HostError> {
        self.session
            .lock()
            .ok()
            .and_then(|g| g.clone())
            .ok_or_else(|| self.lost("the connection was closed"))
    }

    async fn forward_unix(&self, local: &Path, remote: Socket<'_>) -> Result<(), HostError> {
        let _ = std::fs::remove_file(local);
        let session = self.session()?;
        session
            .request_port_forward(
                ForwardType::Local,
                Socket::UnixSocket { path: local.into() },
                remote,
            )
            .await
            .map_err(|e| self.lost(format!("port forward refused: {e}")))
    }
}

#[async_trait]
impl Host for SshHost {
    fn node(&self) -> &str {
        &self.node
    }

    fn round_trips(&self) -> RoundTrips {
        self.trips.get()
    }

    async fn exec(&self, cmd: &Cmd) -> Result<Output, HostError> {
        super::logged_exec(&self.node, cmd, self.run_command(cmd)).await
    }

    async fn docker(&self) -> Result<bollard::Docker, HostError> {
        let mut cached = self.docker.lock().await;
        if let Some(d) = cached.as_ref() {
            return Ok(d.clone());
        }
        let local = self.ctl_dir.join("docker.sock");
        self.forward_unix(
            &local,
            Socket::UnixSocket {
                path: Path::new("/var/run/docker.sock").into(),
            },
        )
        .await?;
        let d = docker_on_socket(&self.node, &local, &self.trips).await?;
        *cached = Some(d.clone());
        Ok(d)
    }

    async fn forward(&self, host: &str, port: u16) -> Result<Endpoint, HostError> {
        let mut forwards = self.forwards.lock().await;
        if let Some((_, _, p)) = forwards.iter().find(|(h, pt, _)| h == host && *pt == port) {
            return Ok(Endpoint::Unix(p.clone()));
        }
        let local = self.ctl_dir.join(format!("f{}.sock", forwards.len()));
        self.forward_unix(
            &local,
            Socket::TcpSocket {
                host: host.to_string().into(),
                port,
            },
        )
        .await?;
        forwards.push((host.to_string(), port, local.clone()));
        Ok(Endpoint::Unix(local))
    }

    async fn close(&self) {
        self.docker.lock().await.take();
        let taken = self.session.lock().ok().and_then(|mut g| g.take());
        let Some(session) = taken else { return };
        if self.warm {
            // The master stays for the next command: take back what this one asked of it.
            let docker = self.ctl_dir.join("docker.sock");
            let mut forwards: Vec<(PathBuf, Socket<'static>)> = Vec::new();
            if docker.exists() {
                forwards.push((
                    docker,
                    Socket::UnixSocket {
                        path: Path::new("/var/run/docker.sock").into(),
                    },
                ));
            }
            for (host, port, local) in self.forwards.lock().await.iter() {
                forwards.push((
                    local.clone(),
                    Socket::TcpSocket {
                        host: host.clone().into(),
                        port: *port,
                    },
                ));
            }
            for (local, remote) in forwards {
                let cancel = session.close_port_forward(
                    ForwardType::Local,
                    Socket::UnixSocket { path: local.into() },
                    remote,
                );
                let _ = tokio::time::timeout(Duration::from_secs(2), cancel).await;
            }
            lifetime::release(&self.master);
            return;
        }
        // `-O exit` ends the master even while commands still hold the session; the control
        // folder goes when the last of them drops it.
        let mut exit = tokio::process::Command::from(lifetime::exit_master(&self.master));
        exit.kill_on_drop(true);
        // A hung master must not hang the command: the janitor still ends it at exit.
        let _ = tokio::time::timeout(Duration::from_secs(5), exit.status()).await;
    }
}

/// Whether a command runs through a kept master: one round trip to the machine, bounded.
async fn reaches(session: &Session) -> bool {
    let mut cmd = session.command("true");
    matches!(
        tokio::time::timeout(Duration::from_secs(5), cmd.status()).await,
        Ok(Ok(status)) if status.success()
    )
}

/// The jump host's master connection that the node hop `alias` goes through, from the generated
/// config: the `ControlPath` of the host its `ProxyJump` names.
fn jump_control_path(config: &str, alias: &str) -> Option<PathBuf> {
    let block = |name: &str| -> Vec<String> {
        config
            .lines()
            .skip_while(|l| l.trim() != format!("Host {name}"))
            .skip(1)
            .take_while(|l| !l.starts_with("Host ") && !l.starts_with("Match "))
            .map(|l| l.trim().to_string())
            .collect()
    };
    let jump = block(alias)
        .iter()
        .find_map(|l| l.strip_prefix("ProxyJump ").map(str::to_string))?;
    block(&jump).iter().find_map(|l| {
        l.strip_prefix("ControlPath ")
            .map(|p| PathBuf::from(p.trim_matches('"')))
    })
}

/// Whether the jump host's master, which the node hop of `alias` uses, is up: then the jump
/// host was reached and the node is what could not be.
async fn jump_master_answers(config_file: &Path, alias: &str) -> bool {
    let Some(ctl) = std::fs::read_to_string(config_file)
        .ok()
        .and_then(|c| jump_control_path(&c, alias))
    else {
        return false;
    };
    let mut check = tokio::process::Command::new("ssh");
    check
        .arg("-S")
        .arg(&ctl)
        .args(["-O", "check", "sparkform"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), check.status()).await,
        Ok(Ok(s)) if s.success()
    )
}

/// Turn ssh's log (its `-E` file, then its stderr, where the ProxyJump hop writes) into an error
/// that says what happened and what to do.
pub(crate) fn classify(log: &str, cx: &ConnectContext<'_>) -> HostError {
    classify_hop(log, cx, false)
}

/// [`classify`], knowing whether the jump host's master connection is up (`jump_up`).
fn classify_hop(log: &str, cx: &ConnectContext<'_>, jump_up: bool) -> HostError {
    let text = log.trim();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("ssh failed without a message")
        .trim()
        .to_string();
    let node = cx.node.to_string();
    let target = cx.target.to_string();
    if text.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
        || text.contains("Host key for") && text.contains("has changed")
    {
        let line = text
            .lines()
            .find(|l| l.contains("Offending") && l.contains("key in"))
            .map(|l| l.trim().to_string());
        let which = line
            .as_ref()
            .and_then(|l| l.split("key in ").nth(1))
            .unwrap_or(&cx.known_hosts)
            .to_string();
        return HostError::HostKeyChanged {
            node,
            target: host_in(text).unwrap_or(target),
            known_hosts: which.clone(),
            help: Some(format!(
                "someone may be intercepting the connection, or the machine was reinstalled. If you know the new key is right, remove the old entry ({which}) with `ssh-keygen -R HOST -f FILE`"
            )),
        };
    }
    if text.contains("No ") && text.contains("host key is known for")
        || text.contains("Host key verification failed")
    {
        let host = text
            .lines()
            .find_map(|l| l.split("host key is known for ").nth(1))
            .map(|h| h.split_whitespace().next().unwrap_or(h).to_string())
            .unwrap_or(target);
        return HostError::HostKeyUnknown {
            node,
            target: host.clone(),
            known_hosts: cx.known_hosts.clone(),
            help: Some(format!(
                "add its key to {} after checking it (e.g. `ssh-keyscan {host} >> {}` and compare the fingerprint), or run with -accept-new-host-keys to trust it on first use",
                cx.known_hosts, cx.known_hosts
            )),
        };
    }
    if text.contains("Permission denied") {
        return HostError::AuthRefused {
            node,
            target: host_in(text).unwrap_or(target),
            reason: last,
        };
    }
    // With a jump host, a failure to reach the node is reported by the jump ("channel 0: open
    // failed", "stdio forwarding failed"; through the jump's master connection "Stdio forwarding
    // request failed: Session open refused by peer", the jump's sshd refusing to connect to the
    // node); a failure to reach the jump names the jump's address.
    if let Some(jump) = cx.jump {
        let reached_jump = jump_up
            || text.contains("channel 0: open failed")
            || text.contains("stdio forwarding failed")
            || text.contains("Stdio forwarding request failed")
            || text.contains("administratively prohibited");
        if !reached_jump
            && (text.contains("Connection closed by UNKNOWN")
                || text.contains("kex_exchange_identification")
                || text.contains("connect to host"))
        {
            return HostError::JumpUnreachable {
                node,
                jump: jump.to_string(),
                reason: last,
                help: Some(
                    "the node was not tried: check the jump host's address, port and that it is up"
                        .into(),
                ),
            };
        }
        return HostError::Unreachable {
            node,
            target,
            reason: last,
            help: Some(format!("the jump host {jump} was reached, but it could not reach the node: check the node's address and that it is up")),
        };
    }
    HostError::Unreachable {
        node,
        target,
        reason: last,
        help: Some("check the address and port, and that the machine is up".into()),
    }
}

/// The host a message talks about: "... for HOST ..." / "HOST: Permission denied".
fn host_in(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.strip_suffix(": Permission denied (publickey).")
            .or_else(|| {
                l.split(": Permission denied")
                    .next()
                    .filter(|_| l.contains("Permission denied"))
            })
            .map(|h| h.trim().to_string())
    })
}

/// An error with its causes, `a: b: c`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl SshHost {
    /// Run `cmd` on the machine (its log is `Host::exec`'s).
    async fn run_command(&self, cmd: &Cmd) -> Result<Output, HostError> {
        self.trips.exec();
        let _permit = self.sessions.acquire().await.map_err(|e| self.lost(e))?;
        let session = self.session()?;
        let deadline = tokio::time::Instant::now() + cmd.timeout;
        let mut backoff = Duration::from_millis(20);
        let result = loop {
            let mut c = session.command(cmd.program.as_str());
            // `arg` shell-escapes each argument for the remote shell: it arrives as literal data.
            for a in &cmd.args {
                c.arg(a);
            }
            let r = tokio::time::timeout_at(deadline, c.output()).await;
            // sshd frees a finished session a moment after its command exits, so a new one can be
            // refused at the MaxSessions limit although fewer than 8 run: wait briefly and retry.
            if let Ok(Err(e)) = &r {
                if error_chain(e).contains("Session open refused")
                    && tokio::time::Instant::now() + backoff < deadline
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    continue;
                }
            }
            break r;
        };
        match result {
            Err(_) => Err(HostError::Timeout {
                node: self.node.clone(),
                command: cmd.display(),
                seconds: cmd.timeout.as_secs(),
            }),
            // openssh reports the remote shell's 127 as an error; it is an exit code.
            Ok(Err(openssh::Error::Remote(io))) if io.kind() == std::io::ErrorKind::NotFound => {
                Ok(Output {
                    code: Some(127),
                    stdout: String::new(),
                    stderr: format!("{}: command not found", cmd.program),
                })
            }
            Ok(Err(e)) => Err(self.lost(error_chain(&e))),
            Ok(Ok(o)) => {
                let code = o.status.code();
                // 255 is also ssh's own failure code: ask the master whether it is still there.
                if code == Some(255) && session.check().await.is_err() {
                    return Err(self.lost(format!(
                        "{} while running `{}`",
                        self.target,
                        cmd.display()
                    )));
                }
                Ok(Output {
                    code,
                    stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(jump: Option<&'static str>) -> ConnectContext<'static> {
        ConnectContext {
            node: "node.a",
            target: "sf-node1",
            jump,
            known_hosts: "/k/known_hosts".into(),
            timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn classifies_ssh_failures() {
        let changed = "@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nOffending ED25519 key in /k/known_hosts:3\nHost key verification failed.";
        match classify(changed, &cx(None)) {
            HostError::HostKeyChanged { known_hosts, .. } => {
                assert_eq!(known_hosts, "/k/known_hosts:3")
            }
            e => panic!("{e:?}"),
        }
        let unknown = "No ED25519 host key is known for sf-node1 and you have requested strict checking.\nHost key verification failed.";
        assert!(
            matches!(classify(unknown, &cx(None)), HostError::HostKeyUnknown { target, .. } if target == "sf-node1")
        );
        let denied = "root@sf-node1: Permission denied (publickey).";
        assert!(matches!(
            classify(denied, &cx(None)),
            HostError::AuthRefused { .. }
        ));
        let jump_down = "ssh: connect to host 127.0.0.1 port 2299: Connection refused\nConnection closed by UNKNOWN port 65535";
        assert!(matches!(
            classify(jump_down, &cx(Some("jump.testbed"))),
            HostError::JumpUnreachable { .. }
        ));
        let node_down = "channel 0: open failed: connect failed: No route to host\nstdio forwarding failed\nConnection closed by UNKNOWN port 65535";
        assert!(matches!(
            classify(node_down, &cx(Some("jump.testbed"))),
            HostError::Unreachable { .. }
        ));
    }

    #[test]
    fn a_node_the_jump_master_cannot_open_a_channel_to_is_the_node_unreachable() {
        // A node cut from the jump's network, reached through the jump host's master: the main
        // ssh's `-E` log says the connection closed, the ProxyJump hop's stderr why.
        let log = "kex_exchange_identification: Connection closed by remote host\nConnection closed by UNKNOWN port 65535\n";
        let stderr = "Stdio forwarding request failed: Session open refused by peer\n";
        let text = format!("{log}\n{stderr}");
        match classify(&text, &cx(Some("jump.testbed"))) {
            HostError::Unreachable {
                target,
                reason,
                help,
                ..
            } => {
                assert_eq!(target, "sf-node1");
                assert_eq!(
                    reason,
                    "Stdio forwarding request failed: Session open refused by peer"
                );
                let help = help.unwrap_or_default();
                assert!(
                    help.contains("jump host jump.testbed was reached"),
                    "{help}"
                );
            }
            e => panic!("the node is unreachable, not the jump host: {e:?}"),
        }
        // The same log without the hop's line still blames the jump host...
        assert!(matches!(
            classify(log, &cx(Some("jump.testbed"))),
            HostError::JumpUnreachable { .. }
        ));
        // ...unless the jump host's master answers (ssh sent the hop's stderr to /dev/null).
        assert!(matches!(
            classify_hop(log, &cx(Some("jump.testbed")), true),
            HostError::Unreachable { .. }
        ));
    }

    #[test]
    fn the_jump_master_of_a_node_hop_is_found_in_the_generated_config() {
        let config = "Host sf.jump.j\n  HostName 127.0.0.1\n  ControlPath \"/tmp/sf1/j0\"\n  ControlMaster no\n\nHost sf.node.a\n  HostName sf-node1\n  ProxyJump sf.jump.j\n\nMatch all\n";
        assert_eq!(
            jump_control_path(config, "sf.node.a"),
            Some(PathBuf::from("/tmp/sf1/j0"))
        );
        assert_eq!(jump_control_path(config, "sf.jump.j"), None);
        assert_eq!(jump_control_path(config, "sf.node.zz"), None);
    }
}

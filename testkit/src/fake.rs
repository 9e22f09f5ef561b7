//! A machine in memory, for tests of everything above `Host` without Docker or ssh: it answers
//! `ip` (addresses and MTUs of its interfaces, kept in memory), `ping` and scripted commands,
//! and takes injected faults: a command that fails, hangs or panics, a node that disappears
//! after its k-th command. A [`FakeWorld`] shared by the nodes records every command in the
//! order they ran and how many ran at once.
//!
//! Its Docker Engine is a [`FakeDocker`] given with [`FakeHost::docker_engine`]; without one,
//! `docker()` fails like an engine that is not installed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use sparkform::hosts::pool::OpenNode;
use sparkform::hosts::{Cmd, Counter, Endpoint, Host, HostError, Output, RoundTrips};
use sparkform::inspect::glance;
use sparkform::inspect::ip_addr::Interface;

use crate::fake_docker::FakeDocker;

/// What a scripted command answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Exit code, stdout, stderr.
    Exit(i32, String, String),
    /// Never answers (until the command's timeout).
    Hang,
    /// The task running the command panics (a bug in a handler, as seen by the executor).
    Panic,
    /// The connection is lost, and stays lost.
    Disappear,
}

/// A rule: commands whose program and arguments start with `prefix` get `answer`.
#[derive(Debug, Clone)]
struct Rule {
    prefix: Vec<String>,
    answer: Answer,
}

/// Shared by the nodes of one test: the order of commands and their overlap.
#[derive(Debug, Default)]
pub struct FakeWorld {
    inner: Mutex<WorldLog>,
}

#[derive(Debug, Default)]
struct WorldLog {
    log: Vec<String>,
    running: usize,
    max_running: usize,
}

impl FakeWorld {
    pub fn new() -> Arc<FakeWorld> {
        Arc::new(FakeWorld::default())
    }

    fn lock(&self) -> MutexGuard<'_, WorldLog> {
        // A panicking command (an injected fault) poisons nothing worth refusing to read.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every command run so far, as `node: program args`, in the order they started.
    pub fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    /// The most commands that ran at the same time.
    pub fn max_running(&self) -> usize {
        self.lock().max_running
    }
}

#[derive(Debug)]
struct NodeState {
    interfaces: Vec<Interface>,
    rules: Vec<Rule>,
    /// Commands run on this node.
    count: usize,
    /// The node disappears when its command number `k` (from 1) starts.
    gone_at: Option<usize>,
    gone: bool,
}

/// One fake node.
pub struct FakeHost {
    node: String,
    world: Arc<FakeWorld>,
    /// How long each command takes, so that overlapping steps overlap.
    latency: Duration,
    state: Mutex<NodeState>,
    docker: Option<Arc<FakeDocker>>,
    /// The client of its engine, negotiated once per connection as ssh's is (dropped by
    /// `close`, so the next pool negotiates again).
    client: tokio::sync::Mutex<Option<bollard::Docker>>,
    trips: Counter,
}

impl FakeHost {
    pub fn new(node: &str, world: &Arc<FakeWorld>) -> FakeHost {
        FakeHost {
            node: node.to_string(),
            world: world.clone(),
            latency: Duration::from_millis(2),
            state: Mutex::new(NodeState {
                interfaces: Vec::new(),
                rules: Vec::new(),
                count: 0,
                gone_at: None,
                gone: false,
            }),
            docker: None,
            client: tokio::sync::Mutex::new(None),
            trips: Counter::default(),
        }
    }

    /// The node's Docker Engine.
    pub fn docker_engine(mut self, engine: Arc<FakeDocker>) -> Self {
        self.docker = Some(engine);
        self
    }

    fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn latency(mut self, d: Duration) -> Self {
        self.latency = d;
        self
    }

    /// An interface, up, with its MTU and addresses (`10.0.0.1/24`).
    pub fn interface(self, name: &str, mtu: u32, addresses: &[&str]) -> Self {
        self.lock().interfaces.push(Interface {
            name: name.into(),
            mtu,
            state: "UP".into(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
        });
        self
    }

    /// Commands starting with `prefix` (program, then arguments) get `answer`; the latest rule
    /// that matches wins, and rules come before the built-in `ip` and `ping`.
    pub fn on(&self, prefix: &[&str], answer: Answer) {
        self.lock().rules.push(Rule {
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
            answer,
        });
    }

    /// The node disappears when its `k`-th command (from 1) starts.
    pub fn disappear_at(&self, k: usize) {
        self.lock().gone_at = Some(k);
    }

    /// Someone else takes an address off an interface (outside sparkform).
    pub fn remove_address(&self, interface: &str, cidr: &str) {
        for i in self
            .lock()
            .interfaces
            .iter_mut()
            .filter(|i| i.name == interface)
        {
            i.addresses.retain(|a| a != cidr);
        }
    }

    pub fn interfaces(&self) -> Vec<Interface> {
        self.lock().interfaces.clone()
    }

    fn lost(&self) -> HostError {
        HostError::Disconnected {
            node: self.node.clone(),
            reason: "the fake node went away".into(),
        }
    }

    /// Decide the answer without holding the lock across an await.
    fn answer(&self, cmd: &Cmd) -> Result<Answer, HostError> {
        let mut st = self.lock();
        st.count += 1;
        if st.gone_at.is_some_and(|k| st.count >= k) {
            st.gone = true;
        }
        if st.gone {
            return Err(self.lost());
        }
        let words: Vec<&str> = std::iter::once(cmd.program.as_str())
            .chain(cmd.args.iter().map(String::as_str))
            .collect();
        if words == ["sh", "-c", glance::script()] {
            return Ok(glance(&mut st));
        }
        Ok(answer_to(&mut st, &words))
    }
}

/// The glance ([`glance`]): each section answered as its command alone would be; the
/// first fault among them is the glance's.
fn glance(st: &mut NodeState) -> Answer {
    let mut parts = Vec::new();
    for (name, cmd) in glance::sections() {
        match answer_to(st, &cmd) {
            Answer::Exit(code, stdout, stderr) => parts.push((name, code, stdout, stderr)),
            fault => return fault,
        }
    }
    let parts: Vec<(&str, i32, &str, &str)> = parts
        .iter()
        .map(|(n, c, o, e)| (*n, *c, o.as_str(), e.as_str()))
        .collect();
    Answer::Exit(0, glance::render(&parts), String::new())
}

/// What the node answers `words`: the latest rule that matches, else `ip` and `ping` in memory.
fn answer_to(st: &mut NodeState, words: &[&str]) -> Answer {
    if let Some(r) =
        st.rules.iter().rev().find(|r| {
            r.prefix.len() <= words.len() && r.prefix.iter().zip(words).all(|(a, b)| a == b)
        })
    {
        return r.answer.clone();
    }
    match words {
        ["ip", rest @ ..] => ip(&mut st.interfaces, rest),
        ["ping", ..] => Answer::Exit(0, "2 packets transmitted, 2 received\n".into(), "".into()),
        _ => Answer::Exit(
            127,
            String::new(),
            format!("{}: command not found", words.first().unwrap_or(&"")),
        ),
    }
}

/// The part of `ip` sparkform uses, on the interfaces in memory.
fn ip(interfaces: &mut [Interface], args: &[&str]) -> Answer {
    let ok = || Answer::Exit(0, String::new(), String::new());
    let no_dev = |d: &str| Answer::Exit(1, String::new(), format!("Cannot find device \"{d}\""));
    match args {
        ["-j", "addr"] => {
            let doc: Vec<serde_json::Value> = interfaces
                .iter()
                .map(|i| {
                    let addr: Vec<serde_json::Value> = i
                        .addresses
                        .iter()
                        .filter_map(|a| {
                            let (local, len) = a.split_once('/')?;
                            Some(serde_json::json!({"family": "inet", "local": local, "prefixlen": len.parse::<u8>().ok()?}))
                        })
                        .collect();
                    serde_json::json!({"ifname": i.name, "mtu": i.mtu, "operstate": i.state, "addr_info": addr})
                })
                .collect();
            Answer::Exit(0, serde_json::Value::Array(doc).to_string(), String::new())
        }
        ["addr", op @ ("replace" | "del"), cidr, "dev", dev] => {
            let Some(i) = interfaces.iter_mut().find(|i| i.name == *dev) else {
                return no_dev(dev);
            };
            let has = i.addresses.iter().any(|a| a == cidr);
            match (*op, has) {
                ("replace", false) => i.addresses.push(cidr.to_string()),
                ("del", true) => i.addresses.retain(|a| a != cidr),
                ("del", false) => {
                    return Answer::Exit(
                        2,
                        String::new(),
                        "RTNETLINK answers: Cannot assign requested address".into(),
                    )
                }
                _ => {}
            }
            ok()
        }
        ["link", "set", "dev", dev, "mtu", mtu, rest @ ..] => {
            let Some(i) = interfaces.iter_mut().find(|i| i.name == *dev) else {
                return no_dev(dev);
            };
            let Ok(m) = mtu.parse() else {
                return Answer::Exit(
                    255,
                    String::new(),
                    format!("Error: argument \"{mtu}\" is wrong"),
                );
            };
            i.mtu = m;
            if rest == ["up"] {
                i.state = "UP".into();
            }
            ok()
        }
        _ => Answer::Exit(
            255,
            String::new(),
            format!("fake ip: unsupported {}", args.join(" ")),
        ),
    }
}

#[async_trait]
impl Host for FakeHost {
    fn node(&self) -> &str {
        &self.node
    }

    async fn exec(&self, cmd: &Cmd) -> Result<Output, HostError> {
        self.trips.exec();
        {
            let mut w = self.world.lock();
            w.log.push(format!("{}: {}", self.node, cmd.display()));
            w.running += 1;
            w.max_running = w.max_running.max(w.running);
        }
        // Counted down however the command ends (an injected panic included).
        struct Done<'a>(&'a FakeWorld);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut w = self.0.lock();
                w.running = w.running.saturating_sub(1);
            }
        }
        let _done = Done(&self.world);
        let answer = self.answer(cmd)?;
        tokio::time::sleep(self.latency).await;
        match answer {
            Answer::Exit(code, stdout, stderr) => Ok(Output {
                code: Some(code),
                stdout,
                stderr,
            }),
            Answer::Hang => {
                tokio::time::sleep(cmd.timeout).await;
                Err(HostError::Timeout {
                    node: self.node.clone(),
                    command: cmd.display(),
                    seconds: cmd.timeout.as_secs(),
                })
            }
            Answer::Panic => panic!("injected fault: {} panics", cmd.display()),
            Answer::Disappear => {
                self.lock().gone = true;
                Err(self.lost())
            }
        }
    }

    async fn docker(&self) -> Result<bollard::Docker, HostError> {
        if self.lock().gone {
            return Err(self.lost());
        }
        if let Some(engine) = &self.docker {
            let mut client = self.client.lock().await;
            if let Some(d) = client.as_ref() {
                return Ok(d.clone());
            }
            let d = sparkform::hosts::docker_on_socket(&self.node, engine.socket(), &self.trips)
                .await?;
            *client = Some(d.clone());
            return Ok(d);
        }
        Err(HostError::Docker {
            node: self.node.clone(),
            message: "the fake node has no Docker Engine".into(),
            help: None,
        })
    }

    async fn forward(&self, host: &str, port: u16) -> Result<Endpoint, HostError> {
        Err(HostError::Other {
            node: self.node.clone(),
            message: format!("the fake node forwards nothing ({host}:{port})"),
        })
    }

    async fn close(&self) {
        self.client.lock().await.take();
    }

    fn round_trips(&self) -> RoundTrips {
        self.trips.get()
    }
}

/// A node by address, as a pool or [`FakeNodes`] takes it.
pub type Node = (String, Arc<dyn Host>);

/// A node of `world` named `name` with an `eth1` at MTU 1500 and a Docker Engine in memory of
/// its own: the node as a pool or [`FakeNodes`] takes it, and its engine.
pub fn node_with_engine(
    name: &str,
    world: &Arc<FakeWorld>,
) -> std::io::Result<(Node, Arc<FakeDocker>)> {
    let engine = Arc::new(FakeDocker::start()?);
    let host = FakeHost::new(name, world)
        .interface("eth1", 1500, &[])
        .docker_engine(engine.clone());
    Ok(((name.to_string(), Arc::new(host)), engine))
}

/// Fake nodes by address, to hand to [`sparkform::hosts::HostPool::from_hosts`].
pub fn hosts(nodes: Vec<FakeHost>) -> BTreeMap<String, Arc<dyn Host>> {
    nodes
        .into_iter()
        .map(|h| (h.node.clone(), Arc::new(h) as Arc<dyn Host>))
        .collect()
}

/// What [`sparkform::hosts::HostPool::connect`] opens when it is the
/// [`sparkform::hosts::HostOptions::opener`]: the
/// node's fake host instead of an ssh master, each opening counted (how many connections an
/// operation makes: one per node).
#[derive(Clone, Default)]
pub struct FakeNodes {
    hosts: BTreeMap<String, Arc<dyn Host>>,
    opened: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl std::fmt::Debug for FakeNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeNodes")
            .field("hosts", &self.hosts.keys().collect::<Vec<_>>())
            .field("opened", &self.opened())
            .finish()
    }
}

impl FakeNodes {
    pub fn new(hosts: BTreeMap<String, Arc<dyn Host>>) -> FakeNodes {
        FakeNodes {
            hosts,
            opened: Arc::default(),
        }
    }

    /// The node's host, counted as one connection; an error for a node it does not have.
    pub fn open(&self, node: &str) -> Result<Arc<dyn Host>, HostError> {
        *self
            .opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(node.to_string())
            .or_default() += 1;
        self.hosts
            .get(node)
            .cloned()
            .ok_or_else(|| HostError::Other {
                node: node.to_string(),
                message: "no such fake node".into(),
            })
    }

    /// These nodes as the [`sparkform::hosts::HostOptions::opener`].
    pub fn opener(&self) -> Option<Arc<dyn OpenNode>> {
        Some(Arc::new(self.clone()))
    }

    /// The nodes it has, by address.
    pub fn nodes(&self) -> Vec<String> {
        self.hosts.keys().cloned().collect()
    }

    /// How many connections were opened to each node so far.
    pub fn opened(&self) -> BTreeMap<String, usize> {
        self.opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl OpenNode for FakeNodes {
    fn open(&self, node: &str) -> Result<Arc<dyn Host>, HostError> {
        FakeNodes::open(self, node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparkform::inspect::ip_addr::parse_ip_addr;

    #[tokio::test]
    async fn ip_changes_what_ip_shows_and_faults_come_as_asked() {
        let world = FakeWorld::new();
        let h = FakeHost::new("node.a", &world).interface("eth1", 1500, &["10.0.0.9/24"]);
        let run = |args: &[&str]| Cmd::new("ip").args(args.iter().copied());
        assert!(h
            .exec(&run(&["addr", "replace", "10.0.0.1/24", "dev", "eth1"]))
            .await
            .unwrap()
            .success());
        assert!(h
            .exec(&run(&["link", "set", "dev", "eth1", "mtu", "9000", "up"]))
            .await
            .unwrap()
            .success());
        let out = h.exec(&run(&["-j", "addr"])).await.unwrap();
        let i = parse_ip_addr(&out.stdout).unwrap();
        assert_eq!((i[0].mtu, i[0].addresses.len()), (9000, 2));
        assert!(!h
            .exec(&run(&["addr", "replace", "10.0.0.1/24", "dev", "eth9"]))
            .await
            .unwrap()
            .success());
        h.on(&["ip", "-j"], Answer::Exit(1, String::new(), "boom".into()));
        assert!(!h.exec(&run(&["-j", "addr"])).await.unwrap().success());
        h.disappear_at(6);
        assert!(matches!(
            h.exec(&Cmd::new("true")).await,
            Err(HostError::Disconnected { .. })
        ));
        assert!(h.exec(&Cmd::new("ping")).await.is_err(), "gone stays gone");
        assert_eq!(world.log().len(), 7);
        assert_eq!(
            world.log()[0],
            "node.a: ip addr replace 10.0.0.1/24 dev eth1"
        );
    }
}

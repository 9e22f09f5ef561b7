//! The router on a machine: HAProxy's admin socket, reached by `docker exec` in the router's
//! container. A create or update puts every replica in (and waits until HAProxy's own health
//! check says each is up); an apply that replaces a replica's resources gets a drain before
//! them and an admit after its probes, one replica after another ([`rolling_checks`]).

use crate::vocabulary::KindId;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Desired, ADMIN_SOCKET};
use crate::config::Config;
use crate::config::Readings;
use crate::diag::Diag;
use crate::hosts::HostPool;
use crate::kinds::machine::{
    Changed, Check, CheckRun, Done, Machine, ReadCx, ReadError, Step, StepError,
};
use crate::plan::Action;
use crate::runtime::exec::exec_in;

pub struct RouterMachine;
pub static MACHINE: RouterMachine = RouterMachine;

/// How long an admitted replica may take to pass HAProxy's health check (its probes passed
/// already: the check's next round, a second or two, is what it waits for).
const UP_WITHIN_SECS: u64 = 60;

/// The shell functions the scripts share: a command on HAProxy's admin socket, and a
/// server's field of `show stat` (5: sessions now, 18: status), `missing` when the backend has
/// no such server. Arguments arrive as `$1`…: nothing is interpolated.
const HAPROXY_SH: &str = r#"set -u
S=__SOCKET__; B=$1; K=$2; T=$3
cmd() { printf '%s\n' "$1" | socat -t 5 stdio "unix-connect:$S"; }
field() { cmd "show stat" | awk -F, -v b="$B" -v s="$K" -v f="$1" '$1==b && $2==s {print $f; x=1} END {if (!x) print "missing"}'; }
start=$(date +%s)
"#;

/// The drain and admit scripts' start: the server is there.
const EXISTS_SH: &str = r#"[ "$(field 18)" = missing ] && { echo "HAProxy's backend $B has no server $K" >&2; exit 3; }
"#;

/// Drain: no new requests, then wait until none is in flight (or `T` seconds), then out.
const DRAIN_SH: &str = r#"cmd "set server $B/$K state drain" >/dev/null
while :; do
  n=$(field 5)
  [ "$n" = 0 ] && break
  if [ $(( $(date +%s) - start )) -ge "$T" ]; then echo "left $n in flight after $T s"; break; fi
  sleep 0.2
done
cmd "set server $B/$K state maint" >/dev/null
echo "drained in $(( $(date +%s) - start )) s"
"#;

/// Admit: back in, then wait until HAProxy's health check says it is up.
const ADMIT_SH: &str = r#"cmd "set server $B/$K state ready" >/dev/null
while :; do
  st=$(field 18)
  case $st in UP|"no check") break ;; esac
  if [ $(( $(date +%s) - start )) -ge "$T" ]; then echo "HAProxy says $K is $st after $T s (not up)" >&2; exit 4; fi
  sleep 0.2
done
echo "up in $(( $(date +%s) - start )) s"
"#;

/// Add: a new server `$4` (`HOST:PORT`) with the options `$5`, in maintenance until admitted;
/// its health check on when the options ask for one. No reload: nothing in flight is touched.
const ADD_SH: &str = r#"out=$(cmd "experimental-mode on; add server $B/$K $4 $5")
case $out in *"New server registered"*) ;; *) echo "HAProxy did not add $K: $out" >&2; exit 5 ;; esac
case " $5 " in *" check "*) cmd "enable health $B/$K" >/dev/null ;; esac
echo "added"
"#;

/// Remove: after the drain, the server is deleted (HAProxy refuses while a request is on it).
const DELETE_SH: &str = r#"out=$(cmd "experimental-mode on; del server $B/$K")
case $out in *"Server deleted"*) ;; *) echo "HAProxy did not delete $K: $out" >&2; exit 5 ;; esac
echo "removed"
"#;

/// Move: the server's address becomes `$4` port `$5`.
const MOVE_SH: &str = r#"cmd "set server $B/$K addr $4 port $5" >/dev/null
echo "now at $4:$5"
"#;

/// What the admit script says of a replica whose health check still fails at its bound.
const NOT_UP: &str = "(not up)";

/// One command on one replica's server in the router.
#[derive(Debug, Clone)]
struct OnServer {
    node: String,
    container: String,
    backend: String,
    server: String,
    bound_secs: u64,
}

impl OnServer {
    fn of(d: &Desired, server: &str, bound_secs: u64) -> OnServer {
        OnServer {
            node: d.node.clone(),
            container: d.container.clone(),
            backend: d.backend.clone(),
            server: server.to_string(),
            bound_secs,
        }
    }

    /// `body` (one of the scripts above) on this server, with `args` after the backend, the
    /// server and the bound.
    async fn run(&self, pool: &HostPool, body: &str) -> Result<String, StepError> {
        self.run_with(pool, body, &[]).await
    }

    async fn run_with(
        &self,
        pool: &HostPool,
        body: &str,
        args: &[&str],
    ) -> Result<String, StepError> {
        let host = pool.get(&self.node)?;
        let docker = host.docker().await?;
        let script = format!("{}{body}", HAPROXY_SH.replace("__SOCKET__", ADMIN_SOCKET));
        let mut cmd: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            script,
            "sh".into(),
            self.backend.clone(),
            self.server.clone(),
            self.bound_secs.to_string(),
        ];
        cmd.extend(args.iter().map(|a| a.to_string()));
        let timeout = Duration::from_secs(self.bound_secs + 30);
        match exec_in(&docker, &self.container, &cmd, timeout).await {
            Ok((0, out, _)) => Ok(out.trim().to_string()),
            Ok((code, out, err)) => Err(StepError::new(format!(
                "the router {} on {} refused replica {}: {} (exit {code})",
                self.container,
                self.node,
                self.server,
                first_line(&err).or(first_line(&out)).unwrap_or("no output")
            ))
            .help("the router's image must be HAProxy with its admin socket at /run/haproxy/admin.sock, socat, and a server per replica named by its key in the backend (modules/router writes that configuration)")),
            Err(e) => Err(StepError::new(format!(
                "cannot reach the router {} on {}: {e}",
                self.container, self.node
            ))),
        }
    }

    async fn admit(&self, pool: &HostPool) -> Result<String, StepError> {
        let said = self.run(pool, &format!("{EXISTS_SH}{ADMIT_SH}")).await?;
        Ok(format!(
            "replica {} back in the router: {said}",
            self.server
        ))
    }
}

/// The routers of `config`, each with its desired configuration.
fn routers(config: &Config) -> impl Iterator<Item = (&crate::config::Resource, Desired)> {
    config
        .resources
        .iter()
        .filter(|r| r.kind == KindId::Router)
        .filter_map(|r| Some((r, r.config.typed::<Desired>().ok()?)))
}

/// `sh -c SCRIPT sh ARGS…` in the router's container, for what concerns no one server: its
/// output, or an error saying it could not `what`.
async fn in_router(
    pool: &HostPool,
    d: &Desired,
    script: &str,
    args: &[&str],
    what: &str,
) -> Result<String, StepError> {
    let docker = pool.get(&d.node)?.docker().await?;
    let mut cmd: Vec<String> = vec!["sh".into(), "-c".into(), script.into()];
    if !args.is_empty() {
        cmd.push("sh".into());
        cmd.extend(args.iter().map(|a| a.to_string()));
    }
    match exec_in(&docker, &d.container, &cmd, Duration::from_secs(30)).await {
        Ok((0, out, _)) => Ok(out),
        Ok((code, out, err)) => Err(StepError::new(format!(
            "the router {} on {} could not {what}: {} (exit {code})",
            d.container,
            d.node,
            first_line(&err).or(first_line(&out)).unwrap_or("no output")
        ))
        .help("the router's image must be HAProxy with its admin socket at /run/haproxy/admin.sock, and socat")),
        Err(e) => Err(StepError::new(format!(
            "cannot reach the router {} on {}: {e}",
            d.container, d.node
        ))),
    }
}

/// The servers HAProxy's backend has now, each with its address (`show stat`).
async fn servers(
    pool: &HostPool,
    d: &Desired,
) -> Result<std::collections::BTreeMap<String, String>, StepError> {
    let script = format!("echo 'show stat' | socat -t 5 stdio unix-connect:{ADMIN_SOCKET}");
    let csv = in_router(pool, d, &script, &[], "list its servers").await?;
    Ok(parse_servers(&csv, &d.backend))
}

/// Of `show stat`'s CSV, the servers of `backend` with their `addr` (the header names the
/// columns; a row that is the backend's or a frontend's own is none).
pub fn parse_servers(csv: &str, backend: &str) -> std::collections::BTreeMap<String, String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches('#')
        .trim()
        .split(',')
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(px), Some(sv), Some(addr)) = (col("pxname"), col("svname"), col("addr")) else {
        return Default::default();
    };
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.get(px) == Some(&backend))
        .filter_map(|f| {
            let name = *f.get(sv)?;
            (!matches!(name, "BACKEND" | "FRONTEND"))
                .then(|| (name.to_string(), f.get(addr).unwrap_or(&"").to_string()))
        })
        .collect()
}

/// Where the router's container keeps its servers between two starts of HAProxy
/// ([`super::SERVERS_FILE`], which modules/router appends to its configuration).
async fn write_servers_file(pool: &HostPool, d: &Desired) -> Result<(), StepError> {
    let lines: String = d
        .replicas
        .iter()
        .map(|(k, r)| format!("  {}\n", d.server_line(k, r)))
        .collect();
    let script = format!(
        r#"printf '%s' "$1" > {f}.new && mv {f}.new {f}"#,
        f = super::SERVERS_FILE
    );
    in_router(pool, d, &script, &[&lines], "keep its servers")
        .await
        .map(|_| ())
}

fn first_line(s: &str) -> Option<&str> {
    s.lines().map(str::trim).find(|l| !l.is_empty())
}

/// A replica taken out of the router before its resources are replaced; a rollback puts it back.
struct Drain(OnServer);

#[async_trait]
impl CheckRun for Drain {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        let said = self.0.run(pool, &format!("{EXISTS_SH}{DRAIN_SH}")).await?;
        Ok(format!(
            "replica {} out of the router: {said}",
            self.0.server
        ))
    }
    fn undoes(&self) -> bool {
        true
    }
    /// Back in the router. A replica that does not answer yet (its engine could not be
    /// brought back) is in all the same: HAProxy sends it nothing until its health check
    /// passes, and the step that failed says why it does not answer.
    async fn undo(&self, pool: &HostPool) -> Result<String, StepError> {
        let mut admit = self.0.clone();
        admit.bound_secs = UP_WITHIN_SECS;
        match admit.run(pool, &format!("{EXISTS_SH}{ADMIT_SH}")).await {
            Ok(said) => Ok(format!("replica {} back in the router: {said}", admit.server)),
            Err(e) if e.message.contains(NOT_UP) => Ok(format!(
                "replica {} back in the router; HAProxy sends it requests once its health check passes (it does not yet)",
                admit.server
            )),
            Err(e) => Err(e),
        }
    }
}

/// A replica put back once its resources are replaced and its probes passed.
struct Admit(OnServer);

#[async_trait]
impl CheckRun for Admit {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        self.0.admit(pool).await
    }
}

/// The drain and admit steps of every router whose replicas this apply replaces: for each
/// such replica, in key order, a drain that its changed resources wait for and an admit
/// that waits for them (its probes included), each drain after the admit before it, so one
/// replica at a time is out. A replica that is only created is added by the router's own
/// update, after its probes; one removed is drained before its resources are deleted
/// ([`removal_drains`]); a router whose container starts now puts every replica in itself.
pub fn rolling_checks(config: &Config, changed: &Changed<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    for r in config.resources.iter().filter(|r| r.kind == KindId::Router) {
        let Ok(d) = r.config.typed::<Desired>() else {
            continue;
        };
        let starts_now = |a: &str| {
            changed
                .change(a)
                .is_some_and(|c| matches!(c.action, Action::Create | Action::Replace))
        };
        if starts_now(&r.address) || starts_now(&d.container_address) {
            continue;
        }
        out.extend(removal_drains(&r.address, &d, changed));
        let mut previous: Option<String> = None;
        let mut rolled = Vec::new();
        for (key, replica) in &d.replicas {
            let now: Vec<String> = replica
                .members
                .iter()
                .filter(|m| changed.is(m))
                .cloned()
                .collect();
            let stops = now.iter().any(|m| {
                changed
                    .change(m)
                    .is_some_and(|c| c.action == Action::Replace)
            });
            if !stops {
                continue;
            }
            let drain = format!("{} (drain {key})", r.address);
            let admit = format!("{} (admit {key})", r.address);
            out.push(Check {
                address: drain.clone(),
                after: previous.iter().cloned().collect(),
                covers: Vec::new(),
                before: now.clone(),
                nodes: vec![d.node.clone()],
                keeps: Vec::new(),
                run: Arc::new(Drain(OnServer::of(&d, key, d.drain_timeout))),
            });
            let mut keeps = now.clone();
            keeps.push(drain);
            out.push(Check {
                address: admit.clone(),
                after: now,
                covers: Vec::new(),
                before: Vec::new(),
                nodes: vec![d.node.clone()],
                keeps,
                run: Arc::new(Admit(OnServer::of(&d, key, UP_WITHIN_SECS))),
            });
            rolled.push(out.len() - 1);
            previous = Some(admit);
        }
        // What waits for the router (the endpoint's probe) waits for the last replica back.
        if let Some(&last) = rolled.last() {
            out[last].covers.push(r.address.clone());
        }
    }
    out
}

/// For each replica a router's update removes, a drain its resources' deletion waits for: no
/// request on it is cut when its engine stops. It waits for nothing (every change waits for
/// the deletions), so it runs at the apply's start; the update deletes its server after.
fn removal_drains(router: &str, d: &Desired, changed: &Changed<'_>) -> Vec<Check> {
    let Some(before) = changed
        .change(router)
        .filter(|c| c.action == Action::Update)
        .and_then(|c| c.attributes.iter().find(|a| a.path == "replicas"))
        .and_then(|a| a.before.clone())
    else {
        return Vec::new();
    };
    let Ok(before) =
        serde_json::from_value::<std::collections::BTreeMap<String, super::Replica>>(before)
    else {
        return Vec::new();
    };
    before
        .into_iter()
        .filter(|(key, _)| !d.replicas.contains_key(key))
        .map(|(key, replica)| Check {
            address: format!("{router} (drain {key}, removed)"),
            after: Vec::new(),
            covers: Vec::new(),
            before: replica.members,
            nodes: vec![d.node.clone()],
            keeps: Vec::new(),
            run: Arc::new(Drain(OnServer::of(d, &key, d.drain_timeout))),
        })
        .collect()
}

#[async_trait]
impl Machine for RouterMachine {
    type Kind = super::Router;
    type Undo = ();

    /// HAProxy's servers made the replicas, through its admin socket (no reload: nothing in
    /// flight is touched): one that is no replica any more drained and deleted, a new one
    /// added, one whose address changed moved; then every replica in, each up by HAProxy's
    /// own check before the next is asked; then the servers file, which HAProxy reads when
    /// it starts again in this container.
    async fn apply(
        &self,
        cx: &Step<'_, super::Router>,
        action: Action,
    ) -> Result<Done<Self>, StepError> {
        let Some(d) = cx.desired.as_ref().filter(|_| action != Action::Delete) else {
            return Ok(Done::summary(
                "the router's container goes with its own resource",
            ));
        };
        let present = servers(cx.pool, d).await?;
        let mut said = Vec::new();
        for gone in present.keys().filter(|k| !d.replicas.contains_key(*k)) {
            OnServer::of(d, gone, d.drain_timeout)
                .run(cx.pool, &format!("{EXISTS_SH}{DRAIN_SH}{DELETE_SH}"))
                .await?;
            said.push(format!("{gone} removed"));
        }
        for (key, replica) in &d.replicas {
            let on = OnServer::of(d, key, UP_WITHIN_SECS);
            match present.get(key) {
                None => {
                    on.run_with(cx.pool, ADD_SH, &[&replica.address, &d.server_options])
                        .await?;
                    said.push(format!("{key} added"));
                }
                Some(now) if now != &replica.address => {
                    let Some((host, port)) = super::server_address(&replica.address) else {
                        return Err(StepError::new(format!(
                            "replica {key}: {} is no HOST:PORT",
                            replica.address
                        )));
                    };
                    on.run_with(cx.pool, MOVE_SH, &[host, &port.to_string()])
                        .await?;
                    said.push(format!("{key} moved to {}", replica.address));
                }
                Some(_) => said.push(format!("{key} in")),
            }
            on.admit(cx.pool).await?;
        }
        write_servers_file(cx.pool, d).await?;
        Ok(Done::summary(format!(
            "{} replica(s) in the router: {}",
            d.replicas.len(),
            said.join(", ")
        )))
    }

    async fn undo(
        &self,
        _cx: &Step<'_, super::Router>,
        _action: Action,
        _done: &Done<Self>,
    ) -> Result<String, StepError> {
        Ok("nothing to undo: the replicas it put in serve as before".into())
    }

    /// The routers' nodes: a plan looks at the ports they listen on.
    fn read_nodes(&self, config: &Config) -> Vec<String> {
        let mut nodes: Vec<String> = routers(config).map(|(_, d)| d.node).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// A router whose port something else holds on its node is refused at plan, not found when
    /// HAProxy fails to start: the port is taken when its node listens on it and this
    /// deployment's state records no router container there (once recorded, what listens is
    /// the router itself, which an apply stops before it starts the new one).
    async fn read(&self, cx: &ReadCx<'_>) -> Result<Readings, ReadError> {
        if !cx.mode.looks() {
            return Ok(Readings::default());
        }
        let nodes = self.read_nodes(cx.config);
        let glances = crate::inspect::glance::read_each(cx.pool, &nodes).await;
        let mut refused = Vec::new();
        for (r, d) in routers(cx.config) {
            let Some(port) = d.port else { continue };
            let recorded = cx
                .state
                .is_some_and(|s| s.resources.contains_key(&d.container_address));
            let taken = glances.get(&d.node).is_some_and(|g| {
                crate::inspect::glance::listening_ports(&g.tcp.stdout).contains(&port)
            });
            if taken && !recorded {
                refused.push(
                    Diag::error(
                        "plan::router_port_taken",
                        format!(
                            "{}: port {port} is taken on {}: something this deployment does not run listens there",
                            r.address, d.node
                        ),
                    )
                    .label(&r.span, "this router's HAProxy would listen there")
                    .help("choose another `port` for the router, or stop what holds it (`ss -ltnp` on the node names it)"),
                );
            }
        }
        if refused.is_empty() {
            Ok(Readings::default())
        } else {
            Err(ReadError::Config(crate::diag::Diagnostics(refused)))
        }
    }

    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check> {
        rolling_checks(config, changed)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_servers;

    #[test]
    fn show_stat_gives_the_backends_servers_and_their_addresses_by_its_header() {
        // HAProxy 2.6's columns, cut: the header names them, wherever `addr` is.
        let csv = "# pxname,svname,qcur,qmax,scur,status,addr\n\
                   api,FRONTEND,,,0,OPEN,\n\
                   engines,a,0,0,1,UP,10.0.0.3:8000\n\
                   engines,b,0,0,0,MAINT,10.0.0.4:8000\n\
                   engines,BACKEND,0,0,1,UP,\n\
                   other,c,0,0,0,UP,10.0.0.9:80\n";
        let servers = parse_servers(csv, "engines");
        assert_eq!(
            servers.into_iter().collect::<Vec<_>>(),
            [
                ("a".to_string(), "10.0.0.3:8000".to_string()),
                ("b".to_string(), "10.0.0.4:8000".to_string())
            ]
        );
        // No header (an error message instead): no server, not a panic.
        assert!(parse_servers("Unknown command\n", "engines").is_empty());
    }
}

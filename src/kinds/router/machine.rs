//! The router on a machine: HAProxy's admin socket, reached by `docker exec` in the router's
//! container. A create or update puts every replica in (and waits until HAProxy's own health
//! check says each is up); an apply that replaces a replica's resources gets a drain before
//! them and an admit after its probes, one replica after another ([`rolling_checks`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Desired, ADMIN_SOCKET};
use crate::config::{Config, ResourceKind};
use crate::hosts::HostPool;
use crate::kinds::container::machine::exec_in;
use crate::kinds::machine::{Changed, Check, CheckRun, Done, Machine, Step, StepError};
use crate::kinds::DesiredConfig;
use crate::plan::Action;

pub struct RouterMachine;
pub static MACHINE: RouterMachine = RouterMachine;

/// How long an admitted replica may take to pass HAProxy's health check (its probes passed
/// already: the check's next round, a second or two, is what it waits for).
const UP_WITHIN_SECS: u64 = 60;

/// The shell functions the drain and admit scripts share: a command on HAProxy's admin socket,
/// and a server's field of `show stat` (5: sessions now, 18: status), `missing` when the
/// backend has no such server. Arguments arrive as `$1`…: nothing is interpolated.
const HAPROXY_SH: &str = r#"set -u
S=__SOCKET__; B=$1; K=$2; T=$3
cmd() { echo "$1" | socat -t 5 stdio "unix-connect:$S"; }
field() { cmd "show stat" | awk -F, -v b="$B" -v s="$K" -v f="$1" '$1==b && $2==s {print $f; x=1} END {if (!x) print "missing"}'; }
[ "$(field 18)" = missing ] && { echo "HAProxy's backend $B has no server $K" >&2; exit 3; }
start=$(date +%s)
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

    async fn run(&self, pool: &HostPool, body: &str) -> Result<String, StepError> {
        let host = pool.get(&self.node)?;
        let docker = host.docker().await?;
        let script = format!("{}{body}", HAPROXY_SH.replace("__SOCKET__", ADMIN_SOCKET));
        let cmd: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            script,
            "sh".into(),
            self.backend.clone(),
            self.server.clone(),
            self.bound_secs.to_string(),
        ];
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
        let said = self.run(pool, ADMIT_SH).await?;
        Ok(format!(
            "replica {} back in the router: {said}",
            self.server
        ))
    }
}

fn first_line(s: &str) -> Option<&str> {
    s.lines().map(str::trim).find(|l| !l.is_empty())
}

/// A replica taken out of the router before its resources are replaced; a rollback puts it back.
struct Drain(OnServer);

#[async_trait]
impl CheckRun for Drain {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        let said = self.0.run(pool, DRAIN_SH).await?;
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
        match admit.run(pool, ADMIT_SH).await {
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
/// replica at a time is out. A replica that is only created is admitted by the router's own
/// update; a router whose container starts now starts with every replica in.
pub fn rolling_checks(config: &Config, changed: &Changed<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    for r in config
        .resources
        .iter()
        .filter(|r| r.kind == ResourceKind::Router)
    {
        let Ok(d) = Desired::from_config(&r.config) else {
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
        let mut previous: Option<String> = None;
        let mut rolled = Vec::new();
        for (key, members) in &d.replicas {
            let now: Vec<String> = members.iter().filter(|m| changed.is(m)).cloned().collect();
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

#[async_trait]
impl Machine for RouterMachine {
    type Kind = super::Router;
    type Undo = ();

    /// Every replica in, each up by HAProxy's own check before the next is asked.
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
        let mut said = Vec::new();
        for key in d.replicas.keys() {
            OnServer::of(d, key, UP_WITHIN_SECS).admit(cx.pool).await?;
            said.push(key.as_str());
        }
        Ok(Done::summary(format!(
            "{} of {} replicas in: {}",
            said.len(),
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

    fn read_nodes(&self, _config: &Config) -> Vec<String> {
        Vec::new()
    }

    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check> {
        rolling_checks(config, changed)
    }
}

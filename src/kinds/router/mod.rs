//! A `router` block: the replicas of one model behind one HAProxy, and how an apply rolls a
//! change through them. It names the router's container (HAProxy with an admin socket at
//! [`ADMIN_SOCKET`], one backend whose servers are the replicas, named by their keys) and, for
//! each replica, the resources it is made of. An apply that replaces a replica's resources
//! takes that replica out of the router first (drain: no new requests, in-flight ones finish
//! within `drain_timeout`), replaces it, passes its probes directly, and puts it back once
//! HAProxy's own health check says it is up, one replica after another
//! (`machine::RollingChecks`); a later replica that fails is rolled back and put back while the
//! ones already done keep their new version.

pub(crate) mod lower;
pub mod machine;

use std::collections::BTreeMap;

use crate::kind::{Kind, NoFacts};
use crate::schema::{self, opt, req, spec, BlockSpec};
use crate::vocabulary::OnDrift;

/// Where the router's image keeps HAProxy's admin socket (`stats socket … level admin`).
pub const ADMIN_SOCKET: &str = "/run/haproxy/admin.sock";

/// Where the router's container keeps HAProxy's servers (one `server` line each) between two
/// starts: the router's apply writes it, the container appends it to its configuration.
pub const SERVERS_FILE: &str = "/run/haproxy/servers.cfg";

/// The block that declares it.
pub static ROUTER: BlockSpec = spec(
    "router",
    &["name"],
    &[
        req("container", schema::ValueType::Container),
        req("replicas", schema::ValueType::Any),
        opt("backend", schema::ValueType::Str),
        opt("drain_timeout", schema::ValueType::Duration),
        opt("server_options", schema::ValueType::Str),
        opt("port", schema::ValueType::Num),
        opt("depends_on", schema::ValueType::RefList),
    ],
    &[],
);

/// Its desired configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Desired {
    /// The router container's node and Docker name.
    pub node: String,
    pub container: String,
    /// The container's address, whose replacement restarts HAProxy with every replica in.
    pub container_address: String,
    /// HAProxy's backend whose servers are the replicas.
    #[serde(default = "default_backend")]
    pub backend: String,
    /// How long a drain waits for the requests in flight on a replica.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: u64,
    /// The port HAProxy listens on, on its node: a plan refuses one that something this
    /// deployment does not run holds already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// What HAProxy's `server` line says after a replica's address (its health check).
    #[serde(default = "default_server_options")]
    pub server_options: String,
    /// Each replica by its key, HAProxy's server name.
    pub replicas: BTreeMap<String, Replica>,
}

/// One replica behind the router.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Replica {
    /// Where the router's node reaches its engine, `HOST:PORT`: HAProxy's server address.
    pub address: String,
    /// The addresses of the resources it is made of (what a change to it replaces).
    pub members: Vec<String>,
}

impl Desired {
    /// HAProxy's `server` line of replica `key` (the servers file, `add server`).
    pub fn server_line(&self, key: &str, replica: &Replica) -> String {
        format!("server {key} {} {}", replica.address, self.server_options)
    }
}

/// `HOST:PORT` split, when it is one HAProxy can take as a server address: an IPv4 address or
/// a host name (letters, digits, `.`, `-`) and a port from 1 to 65535.
pub fn server_address(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|&p| p > 0)?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    host_ok.then_some((host, port))
}

/// Whether `options` can follow a server's address on HAProxy's admin socket as they are:
/// nothing there that socket reads as another command (`;`) or as a quote.
pub fn valid_server_options(options: &str) -> bool {
    options
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '.' | ':' | '_' | '-' | '/'))
}

fn default_server_options() -> String {
    "check inter 1s fall 2 rise 1".into()
}

fn default_backend() -> String {
    "engines".into()
}

fn default_drain_timeout() -> u64 {
    60
}

impl crate::kind::DesiredConfig for Desired {}

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &ROUTER;

pub struct Router;
pub static KIND: Router = Router;
super::register!(Router, KIND, TOP_BLOCK, lower::lower);

impl Kind for Router {
    type Desired = Desired;
    type Recorded = NoFacts;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &ROUTER,
        // Nothing of it is replaced: a replica added is put in, one removed taken out, where
        // HAProxy runs (its admin socket: no restart, no request lost). A new container of the
        // router replaces it (`replace_triggered_by`).
        in_place: &[
            "node",
            "container",
            "container_address",
            "backend",
            "drain_timeout",
            "server_options",
            "port",
            "replicas",
        ],
        whole_attributes: &["replicas"],
        lifecycle: crate::vocabulary::Lifecycle::Converges,
        on_drift: OnDrift::Ignore,
        service: false,
        disruption: None,
        found_untracked: false,
        dot_shape: "hexagon",
    };
    fn rolling(&self, desired: &Desired) -> Option<crate::kind::Rolling> {
        Some(crate::kind::Rolling {
            replicas: desired
                .replicas
                .iter()
                .map(|(k, r)| (k.clone(), r.members.clone()))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{server_address, valid_server_options};

    #[test]
    fn a_server_address_is_a_host_and_a_port_and_options_cannot_start_another_command() {
        assert_eq!(server_address("10.0.0.3:8000"), Some(("10.0.0.3", 8000)));
        assert_eq!(server_address("node-3.lan:80"), Some(("node-3.lan", 80)));
        for bad in [
            "10.0.0.3",
            "10.0.0.3:0",
            "10.0.0.3:70000",
            ":80",
            "a b:80",
            "x;y:80",
        ] {
            assert_eq!(server_address(bad), None, "{bad}");
        }
        assert!(valid_server_options("check inter 1s fall 2 rise 1"));
        assert!(!valid_server_options("check; del server engines/a"));
        assert!(!valid_server_options("check \"x\""));
    }
}

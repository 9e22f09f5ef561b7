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

use super::{Kind, NoFacts, OnDrift};
use crate::schema::{self, opt, req, spec, BlockSpec};

/// Where the router's image keeps HAProxy's admin socket (`stats socket … level admin`).
pub const ADMIN_SOCKET: &str = "/run/haproxy/admin.sock";

/// The block that declares it.
pub static ROUTER: BlockSpec = spec(
    "router",
    &["name"],
    &[
        req("container", schema::Kind::Container),
        req("replicas", schema::Kind::Any),
        opt("backend", schema::Kind::Str),
        opt("drain_timeout", schema::Kind::Duration),
        opt("depends_on", schema::Kind::RefList),
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
    /// Each replica (HAProxy's server name) with the addresses of the resources it is made of.
    pub replicas: BTreeMap<String, Vec<String>>,
}

fn default_backend() -> String {
    "engines".into()
}

fn default_drain_timeout() -> u64 {
    60
}

impl super::DesiredConfig for Desired {}

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &ROUTER;

pub struct Router;
pub static KIND: Router = Router;

impl Kind for Router {
    type Desired = Desired;
    type Recorded = NoFacts;
    fn block(&self) -> &'static BlockSpec {
        &ROUTER
    }
    /// Nothing of it is replaced: a new set of replicas is admitted where it stands.
    fn in_place(&self) -> &'static [&'static str] {
        &[
            "node",
            "container",
            "container_address",
            "backend",
            "drain_timeout",
            "replicas",
        ]
    }
    fn whole_attributes(&self) -> &'static [&'static str] {
        &["replicas"]
    }
    fn on_drift(&self) -> OnDrift {
        OnDrift::Ignore
    }
    fn rolling(&self, desired: &Desired) -> Option<super::Rolling> {
        Some(super::Rolling {
            replicas: desired.replicas.clone(),
        })
    }
    fn dot_shape(&self) -> &'static str {
        "hexagon"
    }
}

//! The lowering halves of the resource kinds (`kinds/<kind>/lower.rs`): each turns its
//! top-level block into resources with the evaluation engine (`config::lowering::Engine`). The
//! engine asks [`lower`] for a kind's and names no kind.

use hcl::Value;

use super::KindId;
use crate::config::lowering::Lower;

macro_rules! define_lowerings {
    ($($(#[$meta:meta])* $variant:ident => $module:ident,)*) => {
        /// How a kind's top-level block becomes resources.
        pub fn lower(kind: KindId) -> Lower {
            match kind {
                $($(#[$meta])* KindId::$variant => super::$module::lower::lower,)*
            }
        }
    };
}
super::for_each_kind!(define_lowerings);

/// A node object's name (`spark1`), from a `node.spark1` value.
pub(crate) fn node_name(v: &Value) -> Option<String> {
    let o = v.as_object()?;
    (o.get("kind").and_then(Value::as_str) == Some("node"))
        .then(|| o.get("name").and_then(Value::as_str).map(str::to_string))
        .flatten()
}

/// The node's address on a network value (`network.roce`): its attachment's `address`.
pub(crate) fn fabric_address(network: &Value, node: &str) -> Option<String> {
    network
        .as_object()?
        .get("attach")?
        .as_object()?
        .values()
        .filter_map(Value::as_object)
        .find(|a| a.get("node_name").and_then(Value::as_str) == Some(node))
        .and_then(|a| a.get("address").and_then(Value::as_str))
        .map(str::to_string)
}

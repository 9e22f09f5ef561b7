//! The lowering halves of the resource kinds (`kinds/<kind>/lower.rs`): each turns its
//! top-level block into resources with the evaluation engine (`config::lowering::Engine`). The
//! engine asks [`lower`] for a kind's and names no kind.

use std::sync::Arc;

use hcl::Value;
use hcl_edit::structure::Block;
use hcl_edit::Span as _;

use crate::config::lowering::{span_of, Ctx, Engine};
use crate::diag::{Diag, SourceFile};

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

impl dyn Engine<'_> + '_ {
    /// The instances of a block with `for_each` (a container, a probe): one, or one per key.
    /// `what` names the block in errors (``container `rank` ``).
    pub(crate) fn block_instances(
        &mut self,
        ctx: &Ctx,
        file: &Arc<SourceFile>,
        block: &Block,
        what: &str,
    ) -> Option<Vec<(Option<String>, Value)>> {
        let instances: Vec<(Option<String>, Value)> = match block.body.get_attribute("for_each") {
            None => vec![(None, Value::Null)],
            Some(fe) => {
                self.refuse_sensitive_for_each(fe, what)?;
                let v = self.eval_expr(ctx, file, &fe.value)?;
                let span = span_of(file, fe.value.span());
                match self.for_each_instances(&v) {
                    Ok(list) => list.into_iter().map(|(k, v)| (Some(k), v)).collect(),
                    Err(msg) => {
                        self.diag(
                            Diag::error(
                                "config::for_each",
                                format!("invalid for_each in {what}"),
                            )
                            .label(&span, msg)
                            .help(
                                "for_each takes a map (each.key, each.value) or a set of strings",
                            ),
                        );
                        return None;
                    }
                }
            }
        };
        Some(instances)
    }

    /// What an instance of a block depends on: what it names, `container.x[each.key]` its own
    /// key's only (a block without `for_each`: everything its context names).
    pub(crate) fn deps_of_instance(
        &self,
        ctx: &Ctx,
        key: Option<&str>,
    ) -> std::collections::BTreeSet<String> {
        match key {
            Some(k) => self.instance_deps(k),
            None => ctx.deps.clone(),
        }
    }
}

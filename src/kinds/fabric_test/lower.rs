//! Lowering a `fabric_test` block into one resource on rank 0's node: the ranks in the order of
//! `nodes`, each with its fabric address on `network`, its environment (`env`, by node name)
//! and its GPUs (`gpus`, by node name).

use std::collections::{BTreeMap, BTreeSet};

use hcl::{Map, Value};
use serde_json::Number;

use super::{check, Desired, Rank, FABRIC_TEST};
use crate::config::lowering::*;
use crate::kinds::lower::{fabric_address, node_name};
use crate::kinds::to_json;
use crate::vocabulary::Gpus;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    cx.eval_fabric_test()
}

fn number(attrs: &Attrs, k: &str, default: u64) -> Number {
    match attrs.values.get(k) {
        Some(Value::Number(n)) => to_json(&Value::Number(*n))
            .as_number()
            .cloned()
            .unwrap_or_else(|| Number::from(default)),
        _ => Number::from(default),
    }
}

fn texts(attrs: &Attrs, k: &str) -> Option<Vec<Option<String>>> {
    attrs
        .values
        .get(k)
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect())
}

/// A by-node-name map's entry for `node` (`env`, `gpus`).
fn by_node<'a>(attrs: &'a Attrs, k: &str, node: &str) -> Option<&'a Value> {
    attrs
        .values
        .get(k)
        .and_then(Value::as_object)
        .and_then(|m| m.get(node))
}

impl dyn Engine<'_> + '_ {
    fn eval_fabric_test(&mut self) -> Option<ItemValue> {
        let item = self.item();
        let name = item.name.clone();
        let edge_deps = self.edge_deps("depends_on")?;
        let (attrs, ctx) = self.simple_block(&FABRIC_TEST)?;
        let address = format!("{}fabric_test.{}", self.prefix(), name);
        let network = attrs
            .raw
            .get("network")
            .or(attrs.values.get("network"))
            .cloned();
        let node_values: Vec<Value> = match attrs.raw.get("nodes").or(attrs.values.get("nodes")) {
            Some(Value::Array(a)) => a.clone(),
            _ => Vec::new(),
        };
        let mut nodes: Vec<String> = Vec::new();
        for v in &node_values {
            match node_name(v) {
                Some(n) if !nodes.contains(&n) => nodes.push(n),
                Some(n) => {
                    self.value_error(
                        &attrs,
                        "nodes",
                        format!("node.{n} is listed twice"),
                        "one rank per node: list each node once",
                    );
                    return None;
                }
                None => {
                    self.value_error(
                        &attrs,
                        "nodes",
                        "expected a list of node references".into(),
                        "nodes = [node.spark1, node.spark2] (rank 0 first)",
                    );
                    return None;
                }
            }
        }
        if nodes.len() < 2 {
            self.value_error(
                &attrs,
                "nodes",
                format!("{} node(s): a fabric test needs two or more", nodes.len()),
                "nodes = [node.spark1, node.spark2] (rank 0 first)",
            );
            return None;
        }
        let mut ranks = Vec::new();
        let mut env = BTreeMap::new();
        let mut gpus = BTreeMap::new();
        for n in &nodes {
            let Some(addr) = network.as_ref().and_then(|net| fabric_address(net, n)) else {
                self.value_error(
                    &attrs,
                    "network",
                    format!("node.{n} has no address on this network"),
                    "every node of the test needs an `attach` on the network (network.roce)",
                );
                return None;
            };
            let node_env: BTreeMap<String, Option<String>> = by_node(&attrs, "env", n)
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| (k.clone(), v.as_str().map(str::to_string)))
                        .collect()
                })
                .unwrap_or_default();
            env.insert(n.clone(), node_env);
            match by_node(&attrs, "gpus", n) {
                Some(Value::String(s)) => {
                    gpus.insert(n.clone(), Gpus::Named(s.clone()));
                }
                Some(Value::Number(c)) => {
                    if let Some(c) = c.as_u64() {
                        gpus.insert(n.clone(), Gpus::Count(c));
                    }
                }
                _ => {}
            }
            ranks.push(Rank {
                node: format!("node.{n}"),
                address: addr,
            });
        }
        let desired = Desired {
            image: attrs.string("image").unwrap_or_default(),
            ranks,
            env,
            gpus,
            min_busbw_gbps: number(&attrs, "min_busbw_gbps", 0),
            port: number(&attrs, "port", super::DEFAULT_PORT),
            size: number(&attrs, "size", super::DEFAULT_SIZE),
            iterations: number(&attrs, "iterations", super::DEFAULT_ITERATIONS),
            timeout: number(&attrs, "timeout", super::DEFAULT_TIMEOUT_SECS),
            shm_size: attrs
                .values
                .get("shm_size")
                .and_then(|v| to_json(v).as_number().cloned()),
            devices: texts(&attrs, "devices"),
            cap_add: texts(&attrs, "cap_add"),
            ulimits: attrs
                .values
                .get("ulimits")
                .is_some_and(Value::is_object)
                .then(|| attrs.string_map("ulimits")),
        };
        let problems = check(&desired);
        for (key, message, help) in &problems {
            self.value_error(&attrs, key, message.clone(), help);
        }
        if !problems.is_empty() {
            return None;
        }
        let mut deps = ctx.deps.clone();
        deps.extend(edge_deps);
        deps.extend(self.extra_deps().iter().cloned());
        self.add_resource(Resource {
            address: address.clone(),
            kind: KindId::FabricTest,
            node: nodes.first().map(|n| format!("node.{n}")),
            config: crate::kind::Configuration::of(desired),
            sensitive: attrs.sensitive.clone(),
            ephemeral: Vec::new(),
            deps,
            replace_triggered_by: BTreeSet::new(),
            group: None,
            span: item.header,
        });
        let mut value = Map::new();
        value.insert("kind".into(), "fabric_test".into());
        value.insert("id".into(), address.clone().into());
        value.insert("name".into(), name.into());
        Some(ItemValue::of_resources(
            Value::Object(value),
            BTreeSet::from([address]),
        ))
    }
}

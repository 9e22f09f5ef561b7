//! Lowering a `router` block: one resource on its container's node, with each replica's
//! members as addresses (the references in `replicas`, which are also its dependencies: the
//! router admits a replica only once what it is made of is there).

use std::collections::{BTreeMap, BTreeSet};

use hcl::{Map, Value};

use super::ROUTER;
use crate::config::lowering::*;
use crate::diag::Diag;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    let item = cx.item();
    let header = item.header.clone();
    let name = item.name.clone();
    let (attrs, ctx) = cx.simple_block(&ROUTER)?;
    let address = format!("{}router.{}", cx.prefix(), name);
    let span = |k: &str| attrs.spans.get(k).cloned().unwrap_or(header.clone());
    let container = attrs.raw.get("container").and_then(Value::as_object);
    let node = container
        .and_then(|c| c.get("node"))
        .and_then(Value::as_object)
        .and_then(|n| n.get("id"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let docker_name = container
        .and_then(|c| c.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let (Some(node), Some(docker_name), Some(container_address)) =
        (node, docker_name, attrs.string("container"))
    else {
        cx.diag(
            Diag::error(
                "config::invalid_value",
                format!("router `{name}`: `container` names no container on a node"),
            )
            .label(&span("container"), "here")
            .help("set `container = container.NAME`: the HAProxy container the router drives"),
        );
        return None;
    };
    let replicas = match replicas(attrs.values.get("replicas")) {
        Ok(r) => r,
        Err(message) => {
            let help = if message.contains("share a node") {
                "give each replica its own node (a replica over several nodes owns all of them)"
            } else {
                "write `replicas = { a = { address = \"10.0.0.3:8000\", members = [container.engine[\"a\"], probe.direct[\"a\"]] }, … }`: each replica's key (HAProxy's server name), where the router reaches it, and the resources it is made of"
            };
            cx.diag(
                Diag::error(
                    "config::invalid_value",
                    format!("router `{name}`: {message}"),
                )
                .label(&span("replicas"), message.clone())
                .help(help),
            );
            return None;
        }
    };
    let desired = super::Desired {
        node: node.clone(),
        container: docker_name,
        container_address: container_address.clone(),
        backend: attrs
            .string("backend")
            .unwrap_or_else(super::default_backend),
        drain_timeout: attrs
            .number("drain_timeout")
            .map(|n| n as u64)
            .unwrap_or_else(super::default_drain_timeout),
        port: match attrs.number("port") {
            None => None,
            Some(p) if (1.0..=65535.0).contains(&p) && p.fract() == 0.0 => Some(p as u16),
            Some(p) => {
                cx.diag(
                    Diag::error(
                        "config::invalid_value",
                        format!("router `{name}`: `port` {p} is no TCP port"),
                    )
                    .label(&span("port"), "here")
                    .help("a whole number from 1 to 65535: the port HAProxy listens on"),
                );
                return None;
            }
        },
        server_options: match attrs.string("server_options") {
            Some(o) if !super::valid_server_options(&o) => {
                cx.diag(
                    Diag::error(
                        "config::invalid_value",
                        format!("router `{name}`: `server_options` {o:?} holds a character HAProxy's admin socket would read as another command"),
                    )
                    .label(&span("server_options"), "here")
                    .help("HAProxy server keywords and values only: letters, digits, spaces and `.:_-/`, as `check inter 1s fall 2 rise 1`"),
                );
                return None;
            }
            Some(o) => o,
            None => super::default_server_options(),
        },
        replicas: replicas.clone(),
    };
    let mut deps = ctx.deps.clone();
    deps.insert(container_address.clone());
    deps.extend(replicas.values().flat_map(|r| r.members.iter().cloned()));
    deps.extend(cx.extra_deps().iter().cloned());
    deps.remove(&address);
    cx.add_resource(Resource {
        address: address.clone(),
        kind: KindId::Router,
        node: Some(node),
        config: crate::kind::Configuration::of(desired.clone()),
        sensitive: Vec::new(),
        ephemeral: Vec::new(),
        deps,
        // A new container is a new HAProxy, which has none of the servers this resource put in:
        // its replacement replaces this resource, whose create puts them all in again.
        replace_triggered_by: BTreeSet::from([container_address]),
        group: None,
        span: header,
    });
    let mut value = Map::new();
    value.insert("kind".into(), "router".into());
    value.insert("id".into(), address.clone().into());
    value.insert("name".into(), name.into());
    Some(ItemValue::of_resources(
        Value::Object(value),
        BTreeSet::from([address]),
    ))
}

/// `replicas` as each key with its server address and its members' addresses; `Err` says
/// what is not a map of `{ address, members }`.
fn replicas(value: Option<&Value>) -> Result<BTreeMap<String, super::Replica>, String> {
    let Some(Value::Object(map)) = value else {
        return Err(
            "`replicas` must be a map of `{ address = \"HOST:PORT\", members = [resources] }`"
                .into(),
        );
    };
    if map.is_empty() {
        return Err("`replicas` names no replica: a router needs at least one".into());
    }
    let mut out = BTreeMap::new();
    for (key, replica) in map {
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "replica key {key:?} must be letters, digits, `_` or `-` (it is HAProxy's server name)"
            ));
        }
        let Some(replica) = replica.as_object() else {
            return Err(format!(
                "replica `{key}` must be `{{ address = \"HOST:PORT\", members = [resources] }}`"
            ));
        };
        let address = match replica.get("address") {
            Some(Value::String(a)) if super::server_address(a).is_some() => a.clone(),
            Some(other) => {
                return Err(format!(
                    "replica `{key}`: `address` must be HOST:PORT (an IP address or a host name and a port), not {other}"
                ))
            }
            None => return Err(format!("replica `{key}` has no `address` (HOST:PORT, where the router reaches it)")),
        };
        let Some(Value::Array(list)) = replica.get("members") else {
            return Err(format!(
                "replica `{key}`: `members` must be a list of resources"
            ));
        };
        let mut members = Vec::new();
        for m in list {
            let id = m
                .as_object()
                .filter(|o| o.get("kind").and_then(Value::as_str).is_some())
                .and_then(|o| o.get("id"))
                .and_then(Value::as_str);
            match id {
                Some(a) => members.push(a.to_string()),
                None => {
                    return Err(format!(
                        "replica `{key}` lists something that is not a resource (a container or a probe)"
                    ))
                }
            }
        }
        if members.is_empty() {
            return Err(format!("replica `{key}` lists no resource"));
        }
        out.insert(key.clone(), super::Replica { address, members });
    }
    // Two replicas on one node would share its GPUs and its memory budget.
    let mut on_node: BTreeMap<String, String> = BTreeMap::new();
    for (key, replica) in map {
        let members = replica.as_object().and_then(|r| r.get("members"));
        let nodes = members
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| {
                m.as_object()?
                    .get("node")?
                    .as_object()?
                    .get("id")?
                    .as_str()
                    .map(str::to_string)
            });
        for node in nodes.collect::<BTreeSet<_>>() {
            if let Some(other) = on_node.insert(node.clone(), key.clone()) {
                if &other != key {
                    return Err(format!(
                        "replicas `{other}` and `{key}` both run on {node}: two replicas never share a node's GPUs and memory"
                    ));
                }
            }
        }
    }
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (key, replica) in &out {
        for m in &replica.members {
            if let Some(other) = seen.insert(m, key) {
                return Err(format!(
                    "{m} is in two replicas, `{other}` and `{key}`: a replica's resources are its own"
                ));
            }
        }
    }
    Ok(out)
}

//! Lowering a `toy` block: one resource on its node, carrying the greeting its kind read
//! there at plan time (`Engine::observed`), null before.

use std::collections::BTreeSet;

use hcl::{Map, Value};

use super::TOY;
use crate::config::lowering::*;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    let item = cx.item();
    let (attrs, ctx) = cx.simple_block(&TOY)?;
    let address = format!("{}toy.{}", cx.prefix(), item.name);
    let node = attrs.string("node").unwrap_or_default();
    let greeting = cx
        .readings()
        .kinds
        .get(&address)
        .cloned()
        .unwrap_or_default();
    let mut deps = ctx.deps.clone();
    deps.extend(cx.extra_deps().iter().cloned());
    cx.add_resource(Resource {
        address: address.clone(),
        kind: KindId::Toy,
        node: Some(node.clone()),
        config: crate::kind::Configuration::of(super::Desired {
            node: node.clone(),
            greeting,
        }),
        sensitive: Vec::new(),
        ephemeral: Vec::new(),
        deps,
        replace_triggered_by: BTreeSet::new(),
        group: None,
        span: item.header,
    });
    let mut value = Map::new();
    value.insert("kind".into(), "toy".into());
    value.insert("id".into(), address.clone().into());
    Some(ItemValue::of_resources(
        Value::Object(value),
        BTreeSet::from([address]),
    ))
}

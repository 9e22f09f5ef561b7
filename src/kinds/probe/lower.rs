//! Lowering `probe` blocks into probe resources (`kinds::probe` builds and checks the
//! desired configuration).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use hcl::{Map, Value};

use super::PROBE;
use crate::config::lowering::*;
use crate::diag::Diag;
use crate::kinds::probe;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    cx.eval_probe()
}

impl dyn Engine<'_> + '_ {
    /// A probe, or one per `for_each` key (`probe.NAME["key"]`, `each.key` and `each.value`
    /// inside): its value is the probe's object, or a map of them by key.
    fn eval_probe(&mut self) -> Option<ItemValue> {
        let item = self.item();
        let block = item.block?;
        let file = item.file.clone();
        let name = item.name.clone();
        let mut ctx = self.item_context()?;
        let instances = self.block_instances(&ctx, &file, block, &format!("probe `{name}`"))?;
        let mut values = Map::new();
        let mut inst_deps = BTreeMap::new();
        let mut single = None;
        for (key, each_value) in instances {
            ctx.each = key.as_ref().map(|k| {
                let mut m = Map::new();
                m.insert("key".into(), Value::from(k.clone()));
                m.insert("value".into(), each_value.clone());
                Value::Object(m)
            });
            let (address, value) = self.eval_probe_instance(&ctx, key.as_deref())?;
            let deps = DepTree::Leaf(BTreeSet::from([address]));
            match key {
                Some(k) => {
                    values.insert(k.clone(), value);
                    inst_deps.insert(k, deps);
                }
                None => single = Some((value, deps)),
            }
        }
        let (value, deps) = match single {
            Some(one) => one,
            None => (Value::Object(values), DepTree::Keyed(inst_deps)),
        };
        Some(ItemValue {
            value,
            sensitive: false,
            ephemeral: false,
            sensitive_keys: HashSet::new(),
            deps,
            all_resources: BTreeSet::new(),
        })
    }

    /// One probe: its address and its value.
    fn eval_probe_instance(&mut self, ctx: &Ctx, key: Option<&str>) -> Option<(String, Value)> {
        let item = self.item();
        let block = item.block?;
        let file = item.file.clone();
        let name = item.name.clone();
        let header = item.header.clone();
        let edge_deps = self.edge_deps("depends_on")?;
        let attrs = self.eval_body(ctx, &file, &block.body, &PROBE)?;
        let mut parts: BTreeMap<&str, Attrs> = BTreeMap::new();
        let mut ok = true;
        for kind in PROBE.blocks.iter().map(|c| c.name) {
            if let Some(b) = block.body.get_blocks(kind).next() {
                let spec = PROBE.child(kind).map(|c| c.spec)?;
                match self.eval_body(ctx, &file, &b.body, spec) {
                    Some(a) => {
                        parts.insert(kind, a);
                    }
                    None => ok = false,
                }
            }
        }
        if !ok {
            return None;
        }
        let address = match key {
            Some(k) => format!("{}probe.{}[{k:?}]", self.prefix(), name),
            None => format!("{}probe.{}", self.prefix(), name),
        };
        let mut sensitive = Vec::new();
        for (k, a) in &parts {
            for p in &a.sensitive {
                let mut path = vec![k.to_string()];
                path.extend(p.iter().cloned());
                sensitive.push(path);
            }
        }
        let values: BTreeMap<&str, &Map<String, Value>> =
            parts.iter().map(|(k, a)| (*k, &a.values)).collect();
        let (config, node) = match probe::desired(&attrs.values, &values) {
            // An exec probe in a container runs on that container's node.
            Ok((c, None)) => {
                let node = parts
                    .get("exec")
                    .and_then(|a| a.raw.get("container"))
                    .and_then(|c| c.as_object())
                    .and_then(|c| c.get("node"))
                    .and_then(|n| n.as_object())
                    .and_then(|n| n.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                (c, node)
            }
            Ok(c) => c,
            Err(p) => {
                let span = parts
                    .get(p.block)
                    .and_then(|a| a.spans.get(p.attribute))
                    .cloned()
                    .unwrap_or(header.clone());
                self.diag(
                    Diag::error(
                        "config::invalid_value",
                        format!("probe `{name}`: {}", p.message),
                    )
                    .label(&span, p.message.clone())
                    .help(p.help),
                );
                return None;
            }
        };
        let mut deps = self.deps_of_instance(ctx, key);
        deps.extend(edge_deps);
        deps.extend(self.extra_deps().iter().cloned());
        self.add_resource(Resource {
            address: address.clone(),
            kind: KindId::Probe,
            node,
            config: crate::kind::Configuration::of(config),
            sensitive,
            ephemeral: Vec::new(),
            deps,
            replace_triggered_by: BTreeSet::new(),
            group: None,
            span: header,
        });
        let mut value = Map::new();
        value.insert("kind".into(), "probe".into());
        value.insert("id".into(), address.clone().into());
        value.insert("name".into(), name.into());
        Some((address, Value::Object(value)))
    }
}

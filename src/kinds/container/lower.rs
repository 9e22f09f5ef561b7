//! Lowering `container` blocks (with `for_each` and `ready`) into container resources
//! (`kinds::container` builds and checks the desired configuration).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use hcl::{Map, Value};
use hcl_edit::structure::Block;

use super::{CONTAINER, READY};
use crate::config::lowering::*;
use crate::diag::{Diag, SourceFile, Span};
use crate::kinds::container;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    cx.eval_container()
}

impl dyn Engine<'_> + '_ {
    fn eval_container(&mut self) -> Option<ItemValue> {
        let item = self.item();
        let block = item.block?;
        let file = item.file.clone();
        let name = item.name.clone();
        let header = item.header.clone();
        let mut ctx = self.item_context()?;
        let edge_deps = self.edge_deps("depends_on")?;
        let replace_by = self.edge_deps("replace_triggered_by")?;
        let base = format!("{}container.{}", self.prefix(), name);
        let instances = self.block_instances(&ctx, &file, block, &format!("container `{name}`"))?;
        let mut values = Map::new();
        let mut inst_deps = BTreeMap::new();
        let mut single: Option<Value> = None;
        let mut ok = true;
        for (key, each_value) in instances {
            ctx.each = key.as_ref().map(|k| {
                let mut m = Map::new();
                m.insert("key".into(), Value::from(k.clone()));
                m.insert("value".into(), each_value.clone());
                Value::Object(m)
            });
            let Some(mut attrs) = self.eval_body(&ctx, &file, &block.body, &CONTAINER) else {
                ok = false;
                continue;
            };
            if !self.refuse_sensitive_name(&attrs, "name") {
                ok = false;
                continue;
            }
            let Some(ready) = self.container_ready_checks(&ctx, &file, block, &name) else {
                ok = false;
                continue;
            };
            let address = match &key {
                Some(k) => format!("{base}[{k:?}]"),
                None => base.clone(),
            };
            let docker_name = match attrs.string("name") {
                Some(n) => n,
                None => {
                    let mut parts = self.path().to_vec();
                    parts.push(name.clone());
                    if let Some(k) = &key {
                        parts.push(k.clone());
                    }
                    // Renamed by a `moved` block: the name it had, so the move restarts nothing.
                    let before = self.address_before_moves(&address);
                    if before != address {
                        if let Some(a) = crate::kind::address::Address::parse(&before) {
                            parts = a.modules.into_iter().chain([a.name]).chain(a.key).collect();
                        }
                    }
                    parts.join("-")
                }
            };
            attrs
                .values
                .insert("name".into(), Value::from(docker_name.clone()));
            let node = attrs.string("node").unwrap_or_default();
            let problems = container::check(&attrs.values);
            if !problems.is_empty() {
                self.report_container_problems(&attrs, problems, &name, key.as_deref(), &header);
                ok = false;
                continue;
            }
            let config = match container::desired(&attrs.values, ready) {
                Ok(d) => crate::kind::Configuration::of(d),
                Err(_) => {
                    // The schema's types make this unreachable; serde's message could quote a
                    // sensitive value, so it is not shown.
                    self.diag(
                        Diag::error(
                            "config::invalid_value",
                            format!("container `{name}`: its attributes do not fit a container's configuration"),
                        )
                        .label(&header, "in this block")
                        .help("this is a bug in sparkform: please report it with the block"),
                    );
                    ok = false;
                    continue;
                }
            };
            let mut deps = self.deps_of_instance(&ctx, key.as_deref());
            deps.extend(edge_deps.iter().cloned());
            deps.extend(self.extra_deps().iter().cloned());
            deps.remove(&address);
            self.add_resource(Resource {
                address: address.clone(),
                kind: KindId::Container,
                node: Some(node.clone()),
                config,
                sensitive: attrs.sensitive.clone(),
                ephemeral: Vec::new(),
                deps,
                replace_triggered_by: replace_by.clone(),
                group: attrs
                    .string("process_group")
                    .map(|g| format!("{}{g}", self.prefix())),
                span: header.clone(),
            });
            let mut value = attrs.to_object();
            value.insert(
                "node".into(),
                attrs.raw.get("node").cloned().unwrap_or(Value::Null),
            );
            value.insert("kind".into(), "container".into());
            value.insert("id".into(), address.clone().into());
            match key {
                Some(k) => {
                    values.insert(k.clone(), Value::Object(value));
                    inst_deps.insert(k, DepTree::Leaf(BTreeSet::from([address])));
                }
                None => {
                    single = Some(Value::Object(value));
                    inst_deps.insert(String::new(), DepTree::Leaf(BTreeSet::from([address])));
                }
            }
        }
        if !ok {
            return None;
        }
        let (value, deps) = match single {
            Some(v) => (
                v,
                DepTree::Leaf(
                    inst_deps
                        .into_values()
                        .next()
                        .map(|t| {
                            let mut s = BTreeSet::new();
                            t.collect_all(&mut s);
                            s
                        })
                        .unwrap_or_default(),
                ),
            ),
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

    /// The `ready` blocks of a container instance, checked; `None` when one is invalid (its
    /// error is reported).
    fn container_ready_checks(
        &mut self,
        ctx: &Ctx,
        file: &Arc<SourceFile>,
        block: &Block,
        name: &str,
    ) -> Option<Vec<container::ReadyCheck>> {
        let mut ready = Vec::new();
        let mut ready_ok = true;
        for rb in block.body.get_blocks("ready") {
            let rheader = header_span(file, rb);
            match self.eval_body(ctx, file, &rb.body, &READY) {
                Some(r) => match container::ready_config(&r.values) {
                    Ok(v) => ready.push(v),
                    Err(msg) => {
                        // A bad pattern or URL is pointed at where it is written.
                        let pattern_attr =
                            ["fail_on_log", "warn_on_log", "progress", "record_from_log"]
                                .into_iter()
                                .find(|a| msg.starts_with(&format!("{a} pattern")));
                        let bad_url = matches!(r.values.get("http"), Some(Value::String(u)) if crate::schema::parse_url(u).is_err());
                        let (span, help) = match pattern_attr.and_then(|a| r.spans.get(a)) {
                            Some(s) => (s.clone(), "patterns are Rust regular expressions (the `regex` crate's syntax); escape a literal ( or . with \\\\"),
                            None => (
                                bad_url.then(|| r.spans.get("http")).flatten().unwrap_or(&rheader).clone(),
                                "a ready block has exactly one of exec = [...], http = \"http://…\" or tcp = \"HOST:PORT\"",
                            ),
                        };
                        self.diag(
                            Diag::error(
                                "config::invalid_value",
                                format!("invalid ready check in container `{name}`"),
                            )
                            .label(&span, msg.clone())
                            .help(help),
                        );
                        ready_ok = false;
                    }
                },
                None => ready_ok = false,
            }
        }
        ready_ok.then_some(ready)
    }

    /// Each problem of a container instance's values, at the attribute that has it (a
    /// sensitive value is not shown).
    fn report_container_problems(
        &mut self,
        attrs: &Attrs,
        problems: Vec<crate::kinds::Problem>,
        name: &str,
        key: Option<&str>,
        header: &Span,
    ) {
        for p in problems {
            let span = attrs
                .spans
                .get(p.attribute)
                .cloned()
                .unwrap_or(header.clone());
            let label = if attrs.is_sensitive(p.attribute) {
                "invalid (sensitive value)".to_string()
            } else {
                p.message.clone()
            };
            let message = if attrs.is_sensitive(p.attribute) {
                format!("invalid `{}`", p.attribute)
            } else {
                format!("invalid `{}`: {}", p.attribute, p.message)
            };
            self.diag(
                Diag::error(
                    "config::invalid_value",
                    format!(
                        "container `{name}`{}: {message}",
                        key.map(|k| format!(" [{k:?}]")).unwrap_or_default()
                    ),
                )
                .label(&span, label)
                .help(p.help),
            );
        }
    }
}

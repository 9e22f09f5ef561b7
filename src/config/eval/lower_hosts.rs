//! Lowering `jump` and `node` blocks: where and how to reach a machine.

use super::*;
use crate::config::NodeReadings;

impl Loader {
    pub(super) fn eval_jump(&mut self, scope: &mut Scope<'_>, i: usize) -> Option<ItemValue> {
        let (attrs, ctx) = self.simple_block(scope, i, &schema::JUMP)?;
        let item = &scope.items[i];
        let address = format!("{}jump.{}", scope.prefix, item.name);
        let host = attrs.string("address")?;
        let header = item.header.clone();
        let mut ok = self.check_host(&attrs, &host);
        ok &= self.check_user(&attrs);
        let port = self.port(&attrs, &mut ok);
        if !ok {
            return None;
        }
        let jump = Jump {
            address: address.clone(),
            name: item.name.clone(),
            host,
            user: attrs.string("user"),
            port,
            identity_file: attrs.string("identity_file").map(|p| scope.dir.join(p)),
            known_hosts: attrs.string("known_hosts").map(|p| scope.dir.join(p)),
            span: header,
        };
        self.config.jumps.insert(address.clone(), jump);
        let mut value = attrs.to_object();
        value.insert("kind".into(), "jump".into());
        value.insert("id".into(), address.into());
        value.insert("name".into(), scope.items[i].name.clone().into());
        Some(ItemValue {
            value: Value::Object(value),
            sensitive: false,
            ephemeral: false,
            sensitive_keys: HashSet::new(),
            deps: DepTree::Leaf(ctx.deps),
            all_resources: BTreeSet::new(),
        })
    }

    pub(super) fn check_host(&mut self, attrs: &Attrs, host: &str) -> bool {
        let valid = host == "local"
            || (!host.is_empty()
                && host.len() <= 253
                && !host.starts_with('-')
                && host.chars().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
                }));
        if !valid {
            self.value_error(
                attrs,
                "address",
                format!("{host:?} is not a host name or IP address"),
                "use a DNS name, an ssh config alias, an IP address, or \"local\" for this machine",
            );
        }
        valid
    }

    pub(super) fn check_user(&mut self, attrs: &Attrs) -> bool {
        let Some(user) = attrs.string("user") else {
            return true;
        };
        let valid = !user.is_empty()
            && user.len() <= 32
            && !user.starts_with('-')
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            self.value_error(
                attrs,
                "user",
                format!("{user:?} is not a valid user name"),
                "user names are letters, digits, `_`, `-` and `.`",
            );
        }
        valid
    }

    pub(super) fn port(&mut self, attrs: &Attrs, ok: &mut bool) -> Option<u16> {
        let n = attrs.number("port")?;
        if (1.0..=65535.0).contains(&n) && n.fract() == 0.0 {
            Some(n as u16)
        } else {
            self.value_error(
                attrs,
                "port",
                format!("{n} is not a TCP port"),
                "ports are 1 to 65535",
            );
            *ok = false;
            None
        }
    }

    pub(super) fn eval_node(&mut self, scope: &mut Scope<'_>, i: usize) -> Option<ItemValue> {
        let (attrs, ctx) = self.simple_block(scope, i, &schema::NODE)?;
        let item = &scope.items[i];
        let address = format!("{}node.{}", scope.prefix, item.name);
        let host = attrs.string("address")?;
        let header = item.header.clone();
        let name = item.name.clone();
        let mut ok = self.check_host(&attrs, &host);
        ok &= self.check_user(&attrs);
        let port = self.port(&attrs, &mut ok);
        let gpus = match attrs.number("gpus") {
            Some(g) if g >= 0.0 && g.fract() == 0.0 && g <= 1024.0 => Some(g as u32),
            Some(g) => {
                self.value_error(
                    &attrs,
                    "gpus",
                    format!("{g} is not a number of GPUs"),
                    "a whole number, 0 or more",
                );
                ok = false;
                None
            }
            None => None,
        };
        let memory = attrs.number("memory_gib");
        if memory.is_some_and(|m| m <= 0.0) {
            self.value_error(
                &attrs,
                "memory_gib",
                "memory must be positive".into(),
                "the node's memory in GiB",
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let gpu_devices = attrs.values.get("gpu_devices") != Some(&Value::Bool(false));
        let declared = NodeReadings {
            unified_memory: attrs.values.get("unified_memory").and_then(Value::as_bool),
            memory_gib: memory,
            gpus,
        };
        let facts = self.node_facts(&attrs, &name, &declared, gpu_devices);
        let jump = attrs.string("jump");
        let node = Node {
            address: address.clone(),
            name: name.clone(),
            host,
            user: attrs.string("user"),
            port,
            jump,
            identity_file: attrs.string("identity_file").map(|p| scope.dir.join(p)),
            known_hosts: attrs.string("known_hosts").map(|p| scope.dir.join(p)),
            gpus: facts.gpus,
            memory_gib: facts.memory_gib,
            unified_memory: facts.unified_memory,
            gpu_devices,
            labels: attrs.string_map("labels"),
            span: header,
        };
        self.config.nodes.insert(address.clone(), node);
        let mut value = attrs.to_object();
        for k in [
            "gpus",
            "memory_gib",
            "user",
            "port",
            "jump",
            "labels",
            "unified_memory",
        ] {
            value.entry(k.to_string()).or_insert(Value::Null);
        }
        // What the modules' checks see: the definition's values, else the node's facts.
        value.insert("gpus".into(), facts.gpus.map_or(Value::Null, Value::from));
        value.insert(
            "memory_gib".into(),
            facts.memory_gib.map_or(Value::Null, Value::from),
        );
        value.insert(
            "unified_memory".into(),
            facts.unified_memory.map_or(Value::Null, Value::Bool),
        );
        value
            .entry("gpu_devices".to_string())
            .or_insert(Value::Bool(true));
        value.insert("kind".into(), "node".into());
        value.insert("id".into(), address.into());
        value.insert("name".into(), name.into());
        Some(ItemValue {
            value: Value::Object(value),
            sensitive: false,
            ephemeral: false,
            sensitive_keys: HashSet::new(),
            deps: DepTree::Leaf(ctx.deps),
            all_resources: BTreeSet::new(),
        })
    }

    /// What a node block declares, with what it leaves unset taken from the facts refresh read
    /// on the node (`Readings`); where it sets a value the node contradicts, a warning at the
    /// attribute naming both values and the fix.
    fn node_facts(
        &mut self,
        attrs: &Attrs,
        name: &str,
        declared: &NodeReadings,
        gpu_devices: bool,
    ) -> NodeReadings {
        let Some(seen) = self.readings.nodes.get(name).cloned() else {
            return declared.clone();
        };
        for d in seen.disagreements(declared, gpu_devices) {
            let message = format!(
                "node \"{name}\" sets {} = {}, but {}",
                d.attribute,
                d.declared,
                d.what_the_node_shows()
            );
            self.diags.push(
                Diag::warning("config::node_facts", message)
                    .maybe_label(
                        attrs.spans.get(d.attribute),
                        format!("the node shows {}", d.observed),
                    )
                    .help(d.fix()),
            );
        }
        seen.fill(declared, gpu_devices)
    }

    // ----- network and its attachments -----
}

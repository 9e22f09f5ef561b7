//! Lowering a `model` block into one resource per node (`model.qwen["spark1"]`) and the value
//! the modules reference (`path`, `commit`, `size_bytes`, `config`, …). The commit comes from
//! what `ops` resolved before the evaluation (`Engine::observed`); without it the resources
//! say the commit is not resolved, and an apply refuses them.

use std::collections::{BTreeMap, BTreeSet};

use hcl::{Map, Value};

use super::{check_cache, check_pattern, check_repo, check_revision, is_commit, snapshot_path};
use super::{DEFAULT_IMAGE, DEFAULT_REVISION, MODEL};
use super::{ROLE_DOWNLOAD, ROLE_PULL};
use crate::config::lowering::*;
use crate::diag::{Diag, Span};
use crate::kinds::lower::{fabric_address, node_name};
use crate::kinds::model;

pub(crate) fn lower(cx: &mut dyn Engine<'_>) -> Option<ItemValue> {
    cx.eval_model()
}

impl dyn Engine<'_> + '_ {
    /// The block's `keep_revisions`, checked: unset, or a whole number of at least 1.
    fn keep_revisions(&mut self, attrs: &Attrs) -> Option<Option<u64>> {
        let Some(v) = attrs.values.get("keep_revisions").filter(|v| !v.is_null()) else {
            return Some(None);
        };
        match v.as_number().and_then(|n| n.as_u64()).filter(|k| *k > 0) {
            Some(k) => Some(Some(k)),
            None => {
                self.value_error(
                    attrs,
                    "keep_revisions",
                    "keep_revisions must be a whole number of at least 1 (the revision in use)".into(),
                    "keep_revisions = 2 keeps the revision in use and the one before it for a rollback; 1 keeps none",
                );
                None
            }
        }
    }

    fn eval_model(&mut self) -> Option<ItemValue> {
        let item = self.item();
        let name = item.name.clone();
        let header = item.header.clone();
        let edge_deps = self.edge_deps("depends_on")?;
        let (attrs, ctx) = self.simple_block(&MODEL)?;
        let block_address = format!("{}model.{}", self.prefix(), name);
        let repo = attrs.string("repo").unwrap_or_default();
        let revision = attrs
            .string("revision")
            .unwrap_or_else(|| DEFAULT_REVISION.to_string());
        let cache = attrs.string("cache").unwrap_or_default();
        let mut ok = true;
        let mut bad = |me: &mut Self, key: &str, r: Result<(), String>, help: &str| {
            if let Err(msg) = r {
                me.value_error(&attrs, key, msg, help);
                ok = false;
            }
        };
        bad(
            self,
            "repo",
            check_repo(&repo),
            "the repository as the hub names it, e.g. \"Qwen/Qwen3.5-122B-A10B-FP8\"",
        );
        bad(
            self,
            "revision",
            check_revision(&revision),
            "a branch (\"main\"), a tag or a 40-hex commit",
        );
        bad(
            self,
            "cache",
            check_cache(&cache),
            "the Hugging Face cache folder on the nodes, e.g. \"/home/nvidia/.cache/huggingface/hub\"",
        );
        let patterns = |k: &str| -> Vec<String> {
            attrs
                .values
                .get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let include = patterns("include");
        let exclude = patterns("exclude");
        for (k, list) in [("include", &include), ("exclude", &exclude)] {
            for p in list {
                bad(
                    self,
                    k,
                    check_pattern(p),
                    "patterns are fnmatch globs such as \"*.safetensors\"",
                );
            }
        }
        let (nodes, download) = self.model_nodes(&attrs, &mut ok);
        let addresses = self.model_addresses(&attrs, &name, &header, &nodes, &mut ok);
        if !ok {
            return None;
        }
        let observed = self
            .readings()
            .models
            .get(&block_address)
            .filter(|o| o.revision == revision)
            .cloned();
        let commit: Option<String> = observed
            .as_ref()
            .map(|o| o.commit.clone())
            .or_else(|| is_commit(&revision).then(|| revision.clone()));
        let manifest = observed.as_ref().map(|o| o.manifest.clone());
        let total_bytes = manifest
            .as_ref()
            .and_then(|m| m.get("total_bytes"))
            .and_then(|v| v.as_u64());
        let file_count = manifest
            .as_ref()
            .and_then(|m| m.get("files"))
            .and_then(|v| v.as_array().map(|a| a.len() as u64).or_else(|| v.as_u64()));
        let facts = observed
            .as_ref()
            .map(|o| o.config.clone())
            .filter(|c| !c.is_null());
        let image = attrs
            .string("image")
            .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        let endpoint = attrs.string("endpoint");
        let serve_image = attrs.string("serve_image");
        let token = self.hub_token(&attrs, &item.name);
        let keep_revisions = self.keep_revisions(&attrs)?;
        let mut deps = ctx.deps.clone();
        deps.extend(edge_deps);
        deps.extend(self.extra_deps().iter().cloned());
        // What every node's resource shares; the node's own parts are filled per node.
        let base = model::Desired {
            block: block_address.clone(),
            repo,
            revision,
            commit,
            cache,
            include,
            exclude,
            image,
            node_name: String::new(),
            role: String::new(),
            download_node: format!("node.{download}"),
            address: None,
            source_address: addresses
                .get(&download)
                .and_then(|a| a.first().cloned().flatten()),
            more_source_addresses: addresses
                .get(&download)
                .map(|a| a.iter().skip(1).flatten().cloned().collect())
                .unwrap_or_default(),
            total_bytes,
            files: file_count,
            facts: facts.unwrap_or(serde_json::Value::Null),
            serve_image: Some(serve_image),
            endpoint: Some(endpoint),
            token: Some(token),
            keep_revisions,
        };
        // An ephemeral token is used by the download and recorded nowhere, not even hashed.
        let token_ephemeral = attrs.is_ephemeral("token");
        let (resources, all) = self.add_model_resources(
            &base,
            &nodes,
            &download,
            &addresses,
            deps,
            (&header, token_ephemeral),
        );
        Some(ItemValue::of_resources(
            model_value(&name, &base, &nodes, &download, resources),
            all,
        ))
    }

    /// The block's hub token. A token is a secret however it is written: the state and plans
    /// hold its keyed hash only (nothing when it is ephemeral); one written in the definitions
    /// is also in version control, which is said.
    fn hub_token(&mut self, attrs: &Attrs, model: &str) -> Option<String> {
        let token = attrs.string("token");
        if token.is_some() && !attrs.is_sensitive("token") && !attrs.is_ephemeral("token") {
            if let Some(span) = attrs.spans.get("token").cloned() {
                self.diag(
                    Diag::warning(
                        "config::literal_token",
                        format!("model `{model}`: its hub token is written in the definitions"),
                    )
                    .label(&span, "this token is in every copy of this file")
                    .help("pass it through a variable with `ephemeral = true` or `sensitive = true` (SPARKFORM_VAR_hf_token, or -var-file); sparkform keeps it hashed in the state either way"),
                );
            }
        }
        token
    }

    /// The `nodes` of a model block and its download node; errors reported (`ok` false then).
    fn model_nodes(&mut self, attrs: &Attrs, ok: &mut bool) -> (Vec<String>, String) {
        let node_values: Vec<Value> = match attrs.raw.get("nodes").or(attrs.values.get("nodes")) {
            Some(Value::Array(a)) => a.clone(),
            Some(v @ Value::Object(_)) => vec![v.clone()],
            _ => Vec::new(),
        };
        let mut nodes: Vec<String> = Vec::new();
        for v in &node_values {
            match node_name(v) {
                Some(n) if !nodes.contains(&n) => nodes.push(n),
                Some(n) => {
                    self.value_error(
                        attrs,
                        "nodes",
                        format!("node.{n} is listed twice"),
                        "list each node once",
                    );
                    *ok = false;
                }
                None => {
                    self.value_error(
                        attrs,
                        "nodes",
                        "expected a list of node references".into(),
                        "nodes = [node.spark1, node.spark2]",
                    );
                    *ok = false;
                    break;
                }
            }
        }
        if nodes.is_empty() && *ok {
            self.value_error(
                attrs,
                "nodes",
                "no node".into(),
                "nodes = [node.spark1, node.spark2]",
            );
            *ok = false;
        }
        let download = match attrs.string("download_node") {
            Some(id) => {
                let n = id.strip_prefix("node.").unwrap_or(&id).to_string();
                if !nodes.contains(&n) && *ok {
                    self.value_error(
                        attrs,
                        "download_node",
                        format!("{id} is not one of the model's nodes"),
                        "the download node is one of `nodes`",
                    );
                    *ok = false;
                }
                n
            }
            None => nodes.first().cloned().unwrap_or_default(),
        };
        (nodes, download)
    }

    /// Each node's addresses on the block's `network` (one network, or a list of them: the
    /// first is the node's own address, the others more ways to the download node); errors
    /// reported (`ok` false then).
    fn model_addresses(
        &mut self,
        attrs: &Attrs,
        name: &str,
        header: &Span,
        nodes: &[String],
        ok: &mut bool,
    ) -> BTreeMap<String, Vec<Option<String>>> {
        let network = attrs.raw.get("network").or(attrs.values.get("network"));
        let networks: Vec<&Value> = match network {
            Some(Value::Array(list)) => list.iter().collect(),
            Some(net) => vec![net],
            None => Vec::new(),
        };
        let mut addresses: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        for n in nodes {
            addresses.insert(
                n.clone(),
                networks.iter().map(|net| fabric_address(net, n)).collect(),
            );
        }
        if nodes.len() > 1 && *ok {
            if networks.is_empty() {
                self.diag(
                    Diag::error(
                        "config::missing_attribute",
                        format!("model `{name}`: `network` is required with more than one node"),
                    )
                    .label(header, "copies between the nodes need the fabric")
                    .help("network = network.roce: the nodes pull the weights from the download node over its addresses, never over the management network"),
                );
                *ok = false;
            }
            for (i, net) in networks.iter().enumerate() {
                let lacking: Vec<&String> = addresses
                    .iter()
                    .filter(|(_, a)| a.get(i).cloned().flatten().is_none())
                    .map(|(n, _)| n)
                    .collect();
                if lacking.is_empty() || !*ok {
                    continue;
                }
                let net_name = net
                    .as_object()
                    .and_then(|o| o.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or("the network")
                    .to_string();
                self.value_error(
                    attrs,
                    "network",
                    format!(
                        "{net_name} has no attachment on {}",
                        lacking
                            .iter()
                            .map(|n| format!("node.{n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "attach every node of the model to each network the copies travel over",
                );
                *ok = false;
            }
        }
        addresses
    }

    /// One resource per node: the download node's with its own fields, the others pulling
    /// from it. The resources by node name and their addresses.
    fn add_model_resources(
        &mut self,
        base: &model::Desired,
        nodes: &[String],
        download: &str,
        addresses: &BTreeMap<String, Vec<Option<String>>>,
        deps: BTreeSet<String>,
        (header, token_ephemeral): (&Span, bool),
    ) -> (Map<String, Value>, BTreeSet<String>) {
        let block_address = &base.block;
        let download_address = format!("{block_address}[{download:?}]");
        let mut all = BTreeSet::new();
        let mut resources = Map::new();
        for n in nodes {
            let address = format!("{block_address}[{n:?}]");
            let is_download = n == download;
            let own = |v: &Option<Option<String>>| if is_download { v.clone() } else { None };
            let c = model::Desired {
                node_name: n.clone(),
                role: if is_download {
                    ROLE_DOWNLOAD
                } else {
                    ROLE_PULL
                }
                .to_string(),
                address: addresses.get(n).and_then(|a| a.first().cloned().flatten()),
                serve_image: own(&base.serve_image),
                endpoint: own(&base.endpoint),
                token: own(&base.token),
                ..base.clone()
            };
            let (mut sensitive, mut ephemeral) = (Vec::new(), Vec::new());
            if c.token().is_some() {
                let path = vec!["token".to_string()];
                if token_ephemeral {
                    ephemeral.push(path);
                } else {
                    sensitive.push(path);
                }
            }
            let mut rdeps = deps.clone();
            if !is_download {
                rdeps.insert(download_address.clone());
            }
            self.add_resource(Resource {
                address: address.clone(),
                kind: KindId::Model,
                node: Some(format!("node.{n}")),
                config: crate::kind::Configuration::of(c),
                sensitive,
                ephemeral,
                deps: rdeps,
                replace_triggered_by: BTreeSet::new(),
                group: None,
                span: header.clone(),
            });
            resources.insert(n.clone(), address.clone().into());
            all.insert(address);
        }
        (resources, all)
    }
}

/// The value the modules reference as `model.NAME`.
fn model_value(
    name: &str,
    base: &model::Desired,
    nodes: &[String],
    download: &str,
    resources: Map<String, Value>,
) -> Value {
    let (repo, revision, commit, cache) = (&base.repo, &base.revision, &base.commit, &base.cache);
    let total_bytes = base.total_bytes;
    let facts = Some(&base.facts).filter(|f| !f.is_null());
    let image = base.image.clone();
    let block_address = &base.block;
    let mut value = Map::new();
    value.insert("kind".into(), "model".into());
    value.insert("id".into(), block_address.clone().into());
    value.insert("name".into(), name.into());
    value.insert("repo".into(), repo.clone().into());
    value.insert("revision".into(), revision.clone().into());
    value.insert(
        "commit".into(),
        commit.clone().map(Value::from).unwrap_or(Value::Null),
    );
    // Unresolved (validate, or a plan that could not resolve): a path that says so, so
    // that the modules still evaluate; an apply refuses an unresolved model.
    let path = snapshot_path(
        cache,
        repo,
        commit
            .as_deref()
            .unwrap_or(&format!("unresolved-{revision}")),
    );
    value.insert("path".into(), path.into());
    value.insert("cache".into(), cache.clone().into());
    value.insert(
        "size_bytes".into(),
        total_bytes.map(Value::from).unwrap_or(Value::Null),
    );
    value.insert(
        "size_gib".into(),
        total_bytes
            .map(|b| Value::from(b as f64 / (1u64 << 30) as f64))
            .unwrap_or(Value::Null),
    );
    let facts_value: Value = facts
        .as_ref()
        .and_then(|f| hcl::to_value(f).ok())
        .unwrap_or(Value::Null);
    let architectures: Value = facts_value
        .as_object()
        .and_then(|o| o.get("architectures"))
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    value.insert("config".into(), facts_value);
    value.insert("architectures".into(), architectures);
    value.insert(
        "nodes".into(),
        Value::Array(nodes.iter().cloned().map(Value::from).collect()),
    );
    value.insert("download_node".into(), download.into());
    value.insert("resources".into(), Value::Object(resources));
    value.insert("image".into(), image.into());
    Value::Object(value)
}

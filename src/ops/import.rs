//! Import as an operation: adopt objects that run already (started by hand, by a script) into
//! the state without restarting them. The kind observes the object (`Machine::import`) and says
//! how the state records it; the plan then compares that with the definitions like any
//! recorded resource. `import` blocks are observed here for `plan` and `apply`; `sparkform
//! import ADDR ID` records one at once.

use std::collections::BTreeMap;

use crate::config::{Config, ImportBlock};
use crate::diag::{did_you_mean, Diag, Diagnostics, Span};
use crate::events::Sender;
use crate::hosts::{HostOptions, HostPool};
use crate::kind::Registered;
use crate::kinds::machine::machine;
use crate::plan::{Import, Plan, PlanOptions};
use crate::state::{State, StateStore};
use crate::vocabulary::KindId;

use super::OpError;

/// The kind an address declares: its first part after the `module.NAME.` prefixes.
pub fn kind_of_address(address: &str) -> Option<KindId> {
    let mut parts = address.split('.');
    loop {
        match parts.next()? {
            "module" => {
                parts.next()?;
            }
            block => return crate::kind::declared_by(block.split('[').next()?),
        }
    }
}

/// What one import is to adopt, resolved against the definitions.
struct Wanted<'a> {
    address: &'a str,
    kind: KindId,
    /// The node's address (`node.spark1`).
    node: String,
    object: &'a str,
    id: String,
    desired: Option<&'a crate::kind::Configuration>,
    /// Where it was asked for (an import block), for errors.
    span: Option<&'a Span>,
}

fn error_at(d: Diag, span: Option<&Span>, what: &str) -> Diag {
    match span {
        Some(s) => d.label(s, what),
        None => d,
    }
}

/// Check one import against the definitions: the address (a resource of the definitions, or
/// with `generate` one they could declare) and the node.
fn resolve<'a>(
    config: &'a Config,
    address: &'a str,
    node: &'a str,
    object: &'a str,
    span: Option<&'a Span>,
    to_span: Option<&'a Span>,
    generate: bool,
) -> Result<Wanted<'a>, Box<Diag>> {
    let resource = config.resource(address);
    let kind = match resource {
        Some(r) => r.kind,
        None => {
            let kind = kind_of_address(address).filter(|_| generate);
            match kind {
                Some(k) => k,
                None => {
                    let mut d = Diag::error(
                        "import::unknown_address",
                        format!("import to {address}: the definitions have no such resource"),
                    );
                    d = error_at(d, to_span, "no resource block declares this address");
                    let addrs = config.resources.iter().map(|r| r.address.as_str());
                    d = match did_you_mean(address, addrs) {
                        Some(s) => d.help(format!("did you mean {s}?")),
                        None => d.help("an import adopts an object for a resource the definitions declare: write its block first, or let `sparkform plan -generate-config-out=FILE` write it; `sparkform graph` lists the addresses"),
                    };
                    return Err(Box::new(d));
                }
            }
        }
    };
    let node_address = format!("node.{node}");
    if !config.nodes.contains_key(&node_address) {
        let mut d = Diag::error(
            "import::unknown_node",
            format!("import to {address}: there is no node `{node}`"),
        );
        d = error_at(d, span, "the id's NODE");
        let names: Vec<&str> = config.nodes.values().map(|n| n.name.as_str()).collect();
        d = match did_you_mean(node, names.iter().copied()) {
            Some(s) => d.help(format!("did you mean {s}? The id is NODE:OBJECT")),
            None => d.help(format!(
                "the id is NODE:OBJECT with NODE one of: {}",
                names.join(", ")
            )),
        };
        return Err(Box::new(d));
    }
    if let Some(r) = resource {
        if let Some(n) = r.node.as_deref().filter(|n| **n != node_address) {
            let d = Diag::error(
                "import::other_node",
                format!("import to {address}: the definitions put it on {n}, the id on {node}"),
            );
            return Err(Box::new(error_at(d, span, "here").help(format!(
                "import the object that runs on {n}, or change the resource's node"
            ))));
        }
    }
    Ok(Wanted {
        address,
        kind,
        node: node_address,
        object,
        id: format!("{node}:{object}"),
        desired: resource.map(|r| &r.config),
        span,
    })
}

/// Observe every wanted object, each node at once over its connection.
async fn observe(
    config: &Config,
    wanted: Vec<Wanted<'_>>,
    pool: &mut Option<HostPool>,
    hosts: &HostOptions,
) -> Result<Vec<Import>, OpError> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let nodes: Vec<String> = wanted
        .iter()
        .map(|w| w.node.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    match pool {
        Some(p) => p.connect_more(config, &nodes, hosts).await,
        None => *pool = Some(HostPool::connect(config, &nodes, hosts).await),
    }
    let Some(p) = pool.as_ref() else {
        return Err(OpError::Local("no connections".into()));
    };
    let looks = wanted.iter().map(|w| async move {
        let host = p.get(&w.node).map_err(|e| {
            error_at(
                Diag::error(
                    "import::node_unreachable",
                    format!("import to {}: cannot reach {}: {e}", w.address, w.node),
                ),
                w.span,
                "this import",
            )
            .help("`sparkform nodes` checks the connection to every node")
        })?;
        let imported = machine(w.kind)
            .import(host.as_ref(), w.address, w.object, w.desired)
            .await
            .map_err(|e| {
                let mut d = Diag::error("import::not_found", e.message.clone());
                if let Some(h) = e.help {
                    d = d.help(h);
                }
                error_at(d, w.span, "this import")
            })?;
        Ok::<_, Diag>(Import {
            address: w.address.to_string(),
            kind: w.kind,
            node: Some(w.node.clone()),
            id: w.id.clone(),
            config: imported.config,
            attributes: imported.attributes,
            notes: imported.notes,
            secret_paths: imported.secret_paths,
        })
    });
    let results = futures_util::future::join_all(looks).await;
    let mut errors = Vec::new();
    let mut out = Vec::new();
    for r in results {
        match r {
            Ok(i) => out.push(i),
            Err(d) => errors.push(d),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(OpError::Config(Diagnostics(errors)))
    }
}

/// The definitions' `import` blocks whose resources the state does not record yet, observed.
/// With `generate`, blocks naming resources the definitions lack are observed too (for
/// `-generate-config-out`); without it they are errors. Reuses `pool` when given.
pub async fn observe_blocks(
    config: &Config,
    state: &State,
    generate: bool,
    pool: &mut Option<HostPool>,
    hosts: &HostOptions,
) -> Result<Vec<Import>, OpError> {
    let mut errors = Vec::new();
    let mut wanted = Vec::new();
    let mut seen: BTreeMap<&str, &ImportBlock> = BTreeMap::new();
    for b in &config.imports {
        if let Some(first) = seen.insert(&b.to, b) {
            errors.push(
                Diag::error(
                    "import::duplicate",
                    format!("two import blocks adopt an object for {}", b.to),
                )
                .label(&b.to_span, "second")
                .label(&first.to_span, "first")
                .help("a resource is one object: keep one of them"),
            );
            continue;
        }
        // Terraform's rule: an import whose resource the state has is done; it stays harmless.
        if state.resources.contains_key(&b.to) {
            continue;
        }
        match resolve(
            config,
            &b.to,
            &b.node,
            &b.object,
            Some(&b.id_span),
            Some(&b.to_span),
            generate,
        ) {
            Ok(w) => wanted.push(w),
            Err(d) => errors.push(*d),
        }
    }
    if !errors.is_empty() {
        return Err(OpError::Config(Diagnostics(errors)));
    }
    observe(config, wanted, pool, hosts).await
}

pub struct ImportRequest {
    /// The definitions as written; the import pins them to what the state records (the plan
    /// it shows compares with what is deployed).
    pub evaluated: super::definitions::Evaluated,
    pub store: StateStore,
    /// `module.qwen.container.vllm`.
    pub address: String,
    /// `NODE:OBJECT`.
    pub id: String,
    pub hosts: HostOptions,
}

/// What `sparkform import` did: what it recorded, and the plan the definitions now make
/// against it (what the next apply changes, if anything).
pub struct ImportResult {
    pub import: Import,
    pub plan: Plan,
}

impl ImportResult {
    /// What the state records the object by on its node (a container's ID), as its kind says.
    pub fn recorded_id(&self) -> Option<String> {
        let i = &self.import;
        i.kind.kind().holds(&i.attributes).id
    }
}

/// `sparkform import ADDR ID`: observe one object and record it, under the state lock.
pub async fn import(req: ImportRequest, _events: &Sender) -> Result<ImportResult, OpError> {
    let recorded = req.store.load()?;
    let defs = req
        .evaluated
        .pin(super::definitions::Pins::Recorded(recorded.as_ref()))?;
    let (config, graph) = (&defs.config, &defs.graph);
    let (node, object) = match req.id.split_once(':') {
        Some((n, o)) if crate::config::valid_name(n) && !o.is_empty() => (n, o),
        _ => {
            return Err(OpError::Config(Diagnostics(vec![Diag::error(
                "import::bad_id",
                format!("import id {:?} is not NODE:OBJECT", req.id),
            )
            .help("a container is NODE:NAME (or NODE:CONTAINER_ID), a fabric address NODE:ADDRESS/PREFIX; NODE is a node block's name")])))
        }
    };
    let wanted = resolve(config, &req.address, node, object, None, None, false)
        .map_err(|d| OpError::Config(Diagnostics(vec![*d])))?;
    let lock = req.store.lock("import")?;
    let mut state = req.store.load()?.unwrap_or_default();
    if state.resources.contains_key(&req.address) {
        return Err(OpError::Config(Diagnostics(vec![Diag::error(
            "import::already_managed",
            format!("{} is in the state already", req.address),
        )
        .help(
            "sparkform manages it: `sparkform plan` shows how it compares with the definitions",
        )])));
    }
    let key = req.store.key_or_create()?;
    let mut pool = None;
    let observed = observe(config, vec![wanted], &mut pool, &req.hosts).await;
    if let Some(p) = pool {
        p.close().await;
    }
    let observed = observed?;
    let opts = PlanOptions {
        key: Some(key.clone()),
        imports: observed,
        ..PlanOptions::default()
    };
    let with_import = crate::plan::plan(config, graph, &state, &opts)?;
    let Some(import) = with_import.import(&req.address).cloned() else {
        return Err(OpError::Local(format!(
            "{}: the plan did not take the import",
            req.address
        )));
    };
    let deps = config
        .resource(&req.address)
        .map(|r| r.deps.iter().cloned().collect())
        .unwrap_or_default();
    crate::plan::record_import(&mut state, &import, deps);
    req.store.write(&mut state)?;
    drop(lock);
    let plan = crate::plan::plan(config, graph, &state, &PlanOptions::with_key(key))?;
    Ok(ImportResult { import, plan })
}

/// HCL blocks for imported objects the definitions have no block for (`-generate-config-out`),
/// and a line for each one no block can be written for (inside a module, or a part of another
/// block such as a network's `attach`). Values as observed: ready checks, which Docker does
/// not keep, are left to the user. Pure.
pub fn generated_hcl(imports: &[Import]) -> (String, Vec<String>) {
    let mut body = hcl::Body::builder();
    let mut skipped = Vec::new();
    for i in imports {
        let parts: Vec<&str> = i.address.split('.').collect();
        let block = i.kind.top_block().kind;
        let (Some(ty), Some(name), 2) = (parts.first(), parts.get(1), parts.len()) else {
            skipped.push(format!(
                "{}: write its block by hand (a block inside a module or another block)",
                i.address
            ));
            continue;
        };
        if *ty != block
            || !crate::config::valid_name(name)
            || i.kind.kind().description().block.kind != block
        {
            skipped.push(format!(
                "{}: write its block by hand (no `{block}` block of its own)",
                i.address
            ));
            continue;
        }
        let mut b = hcl::Block::builder(block).add_label(*name);
        if let Some(obj) = i.config.as_object() {
            for (k, v) in obj {
                // The node as a reference to its block.
                let node = (k == "node")
                    .then(|| i.node.as_deref()?.strip_prefix("node."))
                    .flatten()
                    .filter(|n| crate::config::valid_name(n));
                let e: hcl::Expression = match node {
                    Some(n) => {
                        hcl::expr::Traversal::builder(hcl::expr::Variable::unchecked("node"))
                            .attr(n)
                            .build()
                            .into()
                    }
                    None => hcl::to_expression(v).unwrap_or(hcl::Expression::Null),
                };
                b = b.add_attribute((k.as_str(), e));
            }
        }
        body = body.add_block(b.build());
    }
    let text = hcl::to_string(&body.build()).unwrap_or_default();
    // As `sparkform fmt` lays it out, so that keeping it with the definitions changes nothing.
    let text = crate::fmt::format_source(&text).unwrap_or(text);
    let head = if text.is_empty() {
        String::new()
    } else {
        "# Written by `sparkform plan -generate-config-out`: the imported objects as they run.\n# Review it (ready checks are not observed) and keep it with the definitions.\n\n".to_string()
    };
    (format!("{head}{text}"), skipped)
}

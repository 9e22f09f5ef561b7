//! Evaluating a module's blocks in dependency order.
//!
//! Each block becomes an item; references between items order the evaluation and become the
//! dependency edges of the resources. An item is evaluated with a context that holds only the
//! parts of other items it references, so the cost follows the references, not the config size.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use hcl::eval::{Context, Evaluate};
use hcl::{Map, Value};
use hcl_edit::expr::Expression;
use hcl_edit::structure::{Attribute, Block, Body, Structure};
use hcl_edit::Span as _;
use petgraph::graph::{DiGraph, NodeIndex};

pub(super) use super::lowering::*;
use super::model::{Config, Jump, Node, Output};
use super::parse::{read_folder, ModuleFiles};
use super::refs::{self, Ref, Step};
use super::schema::{self, BlockSpec, Kind};
use super::types::{self, Type};
use crate::diag::{did_you_mean, Diag, Diagnostics, SourceFile, Span};
use crate::kinds::KindId;

// The lowering of each block that is no resource kind, one file each; the engine is this file.
// The resource kinds lower their own blocks (`kinds::<kind>::lower`).
mod lower_hosts;
mod lower_import;
mod lower_module;
mod lower_outputs;

/// The value of a variable handed to a module (or to the root from the command line).
#[derive(Debug, Clone)]
pub struct InputValue {
    pub value: Value,
    pub sensitive: bool,
    pub deps: BTreeSet<String>,
    /// Where it was set: a module block's attribute or a var file.
    pub span: Option<Span>,
    /// How it was set, for messages about command-line values: `-var x=…`.
    pub origin: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Root {
    Var,
    Local,
    Jump,
    Node,
    /// The top-level block of a resource kind (`network` declares attachments).
    Resource(KindId),
    Module,
    Check,
    Output,
}

impl Root {
    fn referable(ident: &str) -> Option<Root> {
        Some(match ident {
            "var" => Root::Var,
            "local" => Root::Local,
            "jump" => Root::Jump,
            "node" => Root::Node,
            "module" => Root::Module,
            other => Root::Resource(KindId::declared_by(other)?),
        })
    }

    fn ident(self) -> &'static str {
        match self {
            Root::Var => "var",
            Root::Local => "local",
            Root::Jump => "jump",
            Root::Node => "node",
            Root::Resource(k) => k.top_block().kind,
            Root::Module => "module",
            Root::Check => "check",
            Root::Output => "output",
        }
    }

    fn from_block(kind: &str) -> Option<Root> {
        match kind {
            "variable" => Some(Root::Var),
            "check" => Some(Root::Check),
            "output" => Some(Root::Output),
            other => Root::referable(other),
        }
    }
}

/// What a reference can start with: the resource kinds' blocks come from the registry.
fn referable() -> impl Iterator<Item = &'static str> {
    ["var", "local", "jump", "node"]
        .into_iter()
        .chain(KindId::ALL.iter().map(|k| k.top_block().kind))
        .chain(["module", "each"])
}

impl DepTree {
    fn resolve(&self, path: &[Step], out: &mut BTreeSet<String>) {
        match (self, path.first()) {
            (DepTree::Keyed(m), Some(Step::Key(k))) => match m.get(k) {
                Some(t) => t.resolve(&path[1..], out),
                None => self.collect_all(out),
            },
            _ => self.collect_all(out),
        }
    }
}

struct Item<'m> {
    root: Root,
    name: String,
    file: Arc<SourceFile>,
    block: Option<&'m Block>,
    local: Option<&'m Attribute>,
    header: Span,
    /// References that are evaluated.
    refs: Vec<Ref>,
    /// `depends_on` and `replace_triggered_by`: edges only.
    edge_refs: Vec<Ref>,
    broken: bool,
    /// Whether any evaluated expression of the item calls a function.
    calls_functions: bool,
}

/// What a module instance gives its caller.
pub struct ModuleResult {
    pub outputs: Map<String, Value>,
    pub output_deps: BTreeMap<String, BTreeSet<String>>,
    pub sensitive_outputs: HashSet<String>,
    pub all_resources: BTreeSet<String>,
    pub output_items: Vec<Output>,
}

pub struct Loader {
    pub diags: Diagnostics,
    cache: HashMap<PathBuf, Rc<ModuleFiles>>,
    stack: Vec<PathBuf>,
    pub config: Config,
    pub observed: crate::config::Observed,
}

const MAX_MODULE_DEPTH: usize = 16;

impl Loader {
    pub fn new(dir: &Path) -> Self {
        Loader {
            diags: Diagnostics::default(),
            cache: HashMap::new(),
            stack: Vec::new(),
            config: Config {
                dir: dir.to_path_buf(),
                vars: Default::default(),
                observed: Default::default(),
                jumps: BTreeMap::new(),
                nodes: BTreeMap::new(),
                networks: BTreeMap::new(),
                resources: Vec::new(),
                outputs: Vec::new(),
                warnings: Vec::new(),
                imports: Vec::new(),
            },
            observed: Default::default(),
        }
    }

    pub fn load_folder(&mut self, dir: &Path) -> Option<Rc<ModuleFiles>> {
        let key = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        if let Some(m) = self.cache.get(&key) {
            return Some(m.clone());
        }
        let files = Rc::new(read_folder(dir, &mut self.diags)?);
        self.cache.insert(key, files.clone());
        Some(files)
    }

    /// The names of the variables a module declares, with their blocks, for checking inputs.
    pub fn declared_variables(files: &ModuleFiles) -> Vec<(String, Arc<SourceFile>, &Block)> {
        let mut out = Vec::new();
        for (file, body) in &files.files {
            for block in body.blocks() {
                if block.ident.as_str() == "variable" && block.labels.len() == 1 {
                    out.push((block.labels[0].as_str().to_string(), file.clone(), block));
                }
            }
        }
        out
    }

    pub fn eval_module(
        &mut self,
        files: &ModuleFiles,
        path: &[String],
        inputs: HashMap<String, InputValue>,
        extra_deps: &BTreeSet<String>,
        caller: Option<&Span>,
    ) -> ModuleResult {
        let key = files
            .dir
            .canonicalize()
            .unwrap_or_else(|_| files.dir.clone());
        self.stack.push(key);
        let mut scope = Scope {
            path: path.to_vec(),
            prefix: path.iter().map(|m| format!("module.{m}.")).collect(),
            items: Vec::new(),
            index: HashMap::new(),
            values: Vec::new(),
            inputs,
            extra_deps: extra_deps.clone(),
            caller: caller.cloned(),
            dir: files.dir.clone(),
            all_resources: BTreeSet::new(),
        };
        self.collect_items(&mut scope, files);
        let order = self.order(&mut scope);
        scope.values = vec![None; scope.items.len()];
        let mut result = ModuleResult {
            outputs: Map::new(),
            output_deps: BTreeMap::new(),
            sensitive_outputs: HashSet::new(),
            all_resources: BTreeSet::new(),
            output_items: Vec::new(),
        };
        for i in order {
            if scope.items[i].broken {
                continue;
            }
            let value = crate::config::functions::with_base_dir(&files.dir, || {
                self.eval_item(&mut scope, i, &mut result)
            });
            if let Some(ev) = &value {
                if ev.sensitive {
                    note_secrets(&ev.value);
                }
                for k in &ev.sensitive_keys {
                    if let Value::Object(m) = &ev.value {
                        m.get(k).into_iter().for_each(note_secrets);
                    }
                }
            }
            scope.values[i] = value;
        }
        result.all_resources = scope.all_resources.clone();
        self.stack.pop();
        result
    }

    fn collect_items<'m>(&mut self, scope: &mut Scope<'m>, files: &'m ModuleFiles) {
        for (file, body) in &files.files {
            for structure in body.iter() {
                match structure {
                    Structure::Attribute(attr) => {
                        let span = span_of(file, attr.span());
                        self.diags.push(
                            Diag::error(
                                "config::top_level_attribute",
                                format!(
                                    "unexpected attribute `{}` at the top level",
                                    attr.key.as_str()
                                ),
                            )
                            .label(&span, "attributes belong inside a block")
                            .help("put it in a `locals { … }` block, or make it a `variable`"),
                        );
                    }
                    Structure::Block(block) => self.collect_block(scope, file, block),
                }
            }
        }
    }

    fn collect_block<'m>(
        &mut self,
        scope: &mut Scope<'m>,
        file: &Arc<SourceFile>,
        block: &'m Block,
    ) {
        let kind = block.ident.as_str();
        let header = header_span(file, block);
        let Some(spec) = schema::top_level(kind) else {
            let kinds = schema::TOP_LEVEL.iter().map(|s| s.kind);
            let mut d = Diag::error(
                "config::unknown_block",
                format!("unknown block type `{kind}`"),
            )
            .label(&header, "not a sparkform block");
            d = match did_you_mean(kind, kinds) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None => d.help(format!(
                    "blocks are {}",
                    schema::TOP_LEVEL
                        .iter()
                        .map(|s| s.kind)
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            };
            self.diags.push(d);
            return;
        };
        if !self.check_labels(file, block, spec) {
            return;
        }
        if kind == "locals" {
            self.check_nested(file, &block.body, spec, &header);
            for attr in block.body.attributes() {
                let name = attr.key.as_str().to_string();
                let span = span_of(file, attr.span());
                let collected = refs::collect(&attr.value);
                let funcs_ok = self.check_funcs(file, &collected.funcs);
                self.add_item(
                    scope,
                    Item {
                        root: Root::Local,
                        name,
                        file: file.clone(),
                        block: None,
                        local: Some(attr),
                        header: span,
                        calls_functions: !collected.funcs.is_empty(),
                        refs: collected.refs,
                        edge_refs: Vec::new(),
                        broken: !funcs_ok,
                    },
                );
            }
            return;
        }
        if kind == "import" {
            self.check_nested(file, &block.body, spec, &header);
            self.lower_import(file, block, header);
            return;
        }
        let Some(root) = Root::from_block(kind) else {
            return;
        };
        let name = block.labels[0].as_str().to_string();
        self.check_nested(file, &block.body, spec, &header);
        let mut item_refs = Vec::new();
        let mut edge_refs = Vec::new();
        let mut funcs_ok = true;
        // A variable's validations and default are not scanned here: let them call functions.
        let mut calls_functions = root == Root::Var;
        // A variable's validations refer only to itself and its default to nothing (both
        // checked when it is evaluated); they are not dependencies.
        if root != Root::Var {
            funcs_ok = self.block_refs(
                file,
                &block.body,
                spec,
                &mut item_refs,
                &mut edge_refs,
                &mut calls_functions,
            );
        }
        self.add_item(
            scope,
            Item {
                root,
                name,
                file: file.clone(),
                block: Some(block),
                local: None,
                header,
                refs: item_refs,
                edge_refs,
                broken: !funcs_ok,
                calls_functions,
            },
        );
    }

    fn block_refs(
        &mut self,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
        item_refs: &mut Vec<Ref>,
        edge_refs: &mut Vec<Ref>,
        calls_functions: &mut bool,
    ) -> bool {
        let mut ok = true;
        for attr in body.attributes() {
            let key = attr.key.as_str();
            let kind = spec.attr(key).map(|a| a.kind);
            match kind {
                Some(Kind::TypeExpr) => {}
                Some(Kind::RefList) => {
                    let c = refs::collect(&attr.value);
                    edge_refs.extend(c.refs);
                }
                _ if spec.kind == "module" && key == "source" => {}
                _ => {
                    let c = refs::collect(&attr.value);
                    ok &= self.check_funcs(file, &c.funcs);
                    *calls_functions |= !c.funcs.is_empty();
                    item_refs.extend(c.refs);
                }
            }
        }
        for child in body.blocks() {
            if let Some(c) = spec.child(child.ident.as_str()) {
                ok &= self.block_refs(
                    file,
                    &child.body,
                    c.spec,
                    item_refs,
                    edge_refs,
                    calls_functions,
                );
            }
        }
        ok
    }

    /// Report calls of unknown functions; false when there was one.
    fn check_funcs(&mut self, file: &Arc<SourceFile>, funcs: &[refs::FuncRef]) -> bool {
        let mut ok = true;
        for f in funcs {
            if !crate::config::functions::FUNCTION_NAMES.contains(&f.name.as_str()) {
                let span = Span::new(file, f.span.clone());
                let mut d = Diag::error(
                    "config::unknown_function",
                    format!("unknown function `{}`", f.name),
                )
                .label(&span, "no such function");
                d = match did_you_mean(
                    &f.name,
                    crate::config::functions::FUNCTION_NAMES.iter().copied(),
                ) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help("see `sparkform validate --help` for the function list"),
                };
                self.diags.push(d);
                ok = false;
            }
        }
        ok
    }

    fn check_labels(&mut self, file: &Arc<SourceFile>, block: &Block, spec: &BlockSpec) -> bool {
        let header = header_span(file, block);
        if block.labels.len() != spec.labels.len() {
            let want = match spec.labels.len() {
                0 => format!("`{}` takes no label", spec.kind),
                _ => format!("`{} \"NAME\" {{ … }}` takes one label, its name", spec.kind),
            };
            self.diags.push(
                Diag::error(
                    "config::labels",
                    format!(
                        "`{}` block has {} label{}; expected {}",
                        spec.kind,
                        block.labels.len(),
                        if block.labels.len() == 1 { "" } else { "s" },
                        spec.labels.len()
                    ),
                )
                .label(&header, "here")
                .help(want),
            );
            return false;
        }
        for label in &block.labels {
            if !valid_name(label.as_str()) {
                let span = span_of(file, label.span());
                self.diags.push(
                    Diag::error(
                        "config::invalid_name",
                        format!("invalid {} name {:?}", spec.kind, label.as_str()),
                    )
                    .label(&span, "names become parts of container names, addresses and paths")
                    .help("use letters, digits, `_` and `-`, starting with a letter or `_` (at most 63 characters)"),
                );
                return false;
            }
        }
        true
    }

    /// Unknown and missing attributes and nested blocks, recursively.
    fn check_nested(
        &mut self,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
        header: &Span,
    ) {
        let mut seen_blocks: HashMap<&str, Span> = HashMap::new();
        for structure in body.iter() {
            match structure {
                Structure::Attribute(attr) => {
                    let key = attr.key.as_str();
                    if spec.attr(key).is_none() && !spec.open {
                        let span = span_of(file, attr.key.span());
                        let is_block = spec.child(key).is_some();
                        let mut d = Diag::error(
                            "config::unknown_attribute",
                            format!("unknown attribute `{key}` in `{}`", spec.kind),
                        )
                        .label(
                            &span,
                            if is_block {
                                "this is a block, not an attribute"
                            } else {
                                "not expected here"
                            },
                        );
                        d = if is_block {
                            d.help(format!("write it as a block: `{key} {{ … }}`"))
                        } else {
                            match did_you_mean(key, spec.names()) {
                                Some(s) => d.help(format!("did you mean `{s}`?")),
                                None => d.help(format!(
                                    "`{}` takes: {}",
                                    spec.kind,
                                    spec.names().collect::<Vec<_>>().join(", ")
                                )),
                            }
                        };
                        self.diags.push(d);
                    }
                }
                Structure::Block(child) => {
                    let name = child.ident.as_str();
                    let child_header = header_span(file, child);
                    match spec.child(name) {
                        None => {
                            let mut d = Diag::error(
                                "config::unknown_block",
                                format!("unknown block `{name}` in `{}`", spec.kind),
                            )
                            .label(&child_header, "not expected here");
                            if let Some(s) = did_you_mean(name, spec.names()) {
                                d = d.help(format!("did you mean `{s}`?"));
                            } else if spec.attr(name).is_some() {
                                d = d.help(format!("`{name}` is an attribute: write `{name} = …`"));
                            }
                            self.diags.push(d);
                        }
                        Some(c) => {
                            if self.check_labels(file, child, c.spec) {
                                self.check_nested(file, &child.body, c.spec, &child_header);
                            }
                            if !c.multiple {
                                if let Some(first) = seen_blocks.get(name) {
                                    self.diags.push(
                                        Diag::error(
                                            "config::duplicate_block",
                                            format!("`{}` takes one `{name}` block", spec.kind),
                                        )
                                        .label(&child_header, "second block")
                                        .label(first, "first block"),
                                    );
                                }
                                seen_blocks.insert(name, child_header);
                            }
                        }
                    }
                }
            }
        }
        for a in spec.attrs.iter().filter(|a| a.required) {
            if !body.has_attribute(a.name) {
                self.diags.push(
                    Diag::error(
                        "config::missing_attribute",
                        format!(
                            "`{}` is missing the required attribute `{}`",
                            spec.kind, a.name
                        ),
                    )
                    .label(
                        header,
                        format!("needs `{} = …` ({})", a.name, a.kind.describe()),
                    ),
                );
            }
        }
    }

    fn add_item<'m>(&mut self, scope: &mut Scope<'m>, item: Item<'m>) {
        let key = (item.root, item.name.clone());
        if let Some(&first) = scope.index.get(&key) {
            let other: &Item = &scope.items[first];
            let what = match item.root {
                Root::Var => "variable",
                Root::Local => "local value",
                r => r.ident(),
            };
            self.diags.push(
                Diag::error(
                    "config::duplicate",
                    format!("duplicate {what} `{}`", item.name),
                )
                .label(&item.header, "declared again here")
                .label(&other.header, "first declared here")
                .help("names must be unique per block type within a module; rename one of them"),
            );
            return;
        }
        scope.index.insert(key, scope.items.len());
        scope.items.push(item);
    }

    /// Resolve references to items, report unknown ones and cycles; return the evaluation order.
    fn order(&mut self, scope: &mut Scope<'_>) -> Vec<usize> {
        let n = scope.items.len();
        let mut graph: DiGraph<usize, Span> = DiGraph::with_capacity(n, n * 2);
        let nodes: Vec<NodeIndex> = (0..n).map(|i| graph.add_node(i)).collect();
        for i in 0..n {
            let item = &scope.items[i];
            let has_for_each = item.block.is_some_and(|b| b.body.has_attribute("for_each"));
            let mut broken = false;
            let mut edges = Vec::new();
            for r in item.refs.iter().chain(item.edge_refs.iter()) {
                match self.resolve_ref_target(scope, item, r, has_for_each) {
                    Ok(Some(target)) => edges.push((target, Span::new(&item.file, r.span.clone()))),
                    Ok(None) => {}
                    Err(d) => {
                        self.diags.push(*d);
                        broken = true;
                    }
                }
            }
            if broken {
                scope.items[i].broken = true;
            }
            for (t, span) in edges {
                graph.add_edge(nodes[i], nodes[t], span);
            }
        }
        // Cycles: every strongly connected component with more than one member, or a self-loop.
        for comp in petgraph::algo::tarjan_scc(&graph) {
            let self_loop = comp.len() == 1 && graph.contains_edge(comp[0], comp[0]);
            if comp.len() < 2 && !self_loop {
                continue;
            }
            let members: BTreeSet<NodeIndex> = comp.iter().copied().collect();
            let cycle = walk_cycle(&graph, &members);
            let names: Vec<String> = cycle
                .iter()
                .map(|&ix| scope.address_of(graph[ix]))
                .collect();
            let mut shown = names.clone();
            if let Some(first) = names.first() {
                shown.push(first.clone());
            }
            let mut d = Diag::error(
                "config::cycle",
                format!("dependency cycle: {}", shown.join(" → ")),
            )
            .help("break the cycle: one of these must not refer to the next (check depends_on and references through locals and modules)");
            for (k, &ix) in cycle.iter().enumerate() {
                let next = cycle[(k + 1) % cycle.len()];
                let label_span = graph
                    .edges_connecting(ix, next)
                    .next()
                    .map(|e| e.weight().clone())
                    .unwrap_or_else(|| scope.items[graph[ix]].header.clone());
                d = d.label(
                    &label_span,
                    format!("{} refers to {}", names[k], scope.address_of(graph[next])),
                );
            }
            self.diags.push(d);
            for ix in comp {
                scope.items[graph[ix]].broken = true;
            }
        }
        // Evaluation order: dependencies first. Cycle members are broken and skipped.
        let mut order = Vec::with_capacity(n);
        let mut state = vec![0u8; n];
        for start in 0..n {
            visit_post(&graph, &nodes, start, &mut state, &mut order);
        }
        order
    }

    /// The item a reference points at, `None` for references that need no item (`each`).
    fn resolve_ref_target(
        &self,
        scope: &Scope<'_>,
        item: &Item<'_>,
        r: &Ref,
        has_for_each: bool,
    ) -> Result<Option<usize>, Box<Diag>> {
        let span = Span::new(&item.file, r.span.clone());
        if r.root == "each" {
            if has_for_each {
                return Ok(None);
            }
            return Err(Box::new(
                Diag::error(
                    "config::each_outside_for_each",
                    "`each` is only available in a block with `for_each`",
                )
                .label(&span, "no for_each here")
                .help("add `for_each = …` to this block, or refer to a value directly"),
            ));
        }
        let Some(root) = Root::referable(&r.root) else {
            let mut d = Diag::error(
                "config::unknown_reference",
                format!("unknown reference `{}`", r.display(1)),
            )
            .label(
                &span,
                format!("`{}` is not something that can be referred to", r.root),
            );
            d = match did_you_mean(&r.root, referable()) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None if r.root == "output" => {
                    d.help("a module's outputs are read as module.NAME.OUTPUT")
                }
                None => {
                    let kinds: Vec<String> = KindId::ALL
                        .iter()
                        .map(|k| format!("{}.", k.top_block().kind))
                        .collect();
                    d.help(format!(
                        "references start with var., local., node., jump., {} or module.",
                        kinds.join(", ")
                    ))
                }
            };
            return Err(Box::new(d));
        };
        let Some(name) = r.first_key() else {
            return Err(Box::new(
                Diag::error(
                    "config::incomplete_reference",
                    format!("`{}` needs a name after it", r.root),
                )
                .label(&span, format!("write {}.NAME", r.root)),
            ));
        };
        match scope.index.get(&(root, name.to_string())) {
            Some(&i) => Ok(Some(i)),
            None => {
                let candidates: Vec<&str> = scope
                    .items
                    .iter()
                    .filter(|it| it.root == root)
                    .map(|it| it.name.as_str())
                    .collect();
                let what = match root {
                    Root::Var => "variable",
                    Root::Local => "local value",
                    r => r.ident(),
                };
                let name_span = r
                    .step_spans
                    .get(1)
                    .map(|s| Span::new(&item.file, s.clone()))
                    .unwrap_or(span.clone());
                let mut d = Diag::error(
                    "config::unknown_reference",
                    format!(
                        "unknown reference `{}`: no {what} named `{name}`",
                        r.display(1)
                    ),
                )
                .label(&name_span, format!("no {what} `{name}` in this module"));
                d = match did_you_mean(name, candidates.iter().copied()) {
                    Some(s) => d.help(format!("did you mean `{}.{s}`?", r.root)),
                    None if candidates.is_empty() => {
                        d.help(format!("this module declares no {what}"))
                    }
                    None => d.help(format!("declared: {}", candidates.join(", "))),
                };
                Err(Box::new(d))
            }
        }
    }

    fn eval_item<'m>(
        &mut self,
        scope: &mut Scope<'m>,
        i: usize,
        result: &mut ModuleResult,
    ) -> Option<Evaluated> {
        let root = scope.items[i].root;
        match root {
            Root::Var => self.eval_variable(scope, i),
            Root::Local => self.eval_local(scope, i),
            Root::Jump => self.eval_jump(scope, i),
            Root::Node => self.eval_node(scope, i),
            Root::Resource(k) => crate::kinds::lower::lower(k)(&mut Lowering {
                loader: self,
                scope,
                i,
            }),
            Root::Module => self.eval_module_call(scope, i),
            Root::Check => {
                self.eval_check(scope, i);
                None
            }
            Root::Output => {
                self.eval_output(scope, i, result);
                None
            }
        }
    }

    /// A context holding the referenced parts of other items. `None` when a referenced item failed
    /// (its error is already reported).
    /// The context of item `i`: `context_for` its references, with the function table only when
    /// the item calls a function.
    fn item_context(&self, scope: &Scope<'_>, i: usize) -> Option<Ctx> {
        let item = &scope.items[i];
        let mut ctx = self.context_for(scope, &item.refs)?;
        ctx.skip_functions = !item.calls_functions;
        Some(ctx)
    }

    fn context_for(&self, scope: &Scope<'_>, refs: &[Ref]) -> Option<Ctx> {
        let mut roots: BTreeMap<&'static str, Value> = BTreeMap::new();
        let mut deps = BTreeSet::new();
        let mut sensitive = false;
        for r in refs {
            if r.root == "each" {
                continue;
            }
            let root = Root::referable(&r.root)?;
            let name = r.first_key()?;
            let &target = scope.index.get(&(root, name.to_string()))?;
            let ev = scope.values[target].as_ref()?;
            let rest = &r.path[1..];
            ev.deps.resolve(rest, &mut deps);
            if root == Root::Module {
                match rest.first() {
                    Some(Step::Key(k)) => sensitive |= ev.sensitive_keys.contains(k),
                    _ => sensitive |= !ev.sensitive_keys.is_empty(),
                }
            } else {
                sensitive |= ev.sensitive;
            }
            let slot = roots
                .entry(root.ident())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = slot {
                let dst = m.entry(name.to_string()).or_insert(Value::Null);
                project(dst, &ev.value, rest);
            }
        }
        Some(Ctx {
            vars: roots,
            each: None,
            deps,
            sensitive,
            skip_functions: false,
        })
    }

    // ----- variables, locals -----

    fn eval_variable(&mut self, scope: &mut Scope<'_>, i: usize) -> Option<Evaluated> {
        let item = &scope.items[i];
        let block = item.block?;
        let file = item.file.clone();
        let ty = match block.body.get_attribute("type") {
            Some(a) => match types::parse_type(&a.value) {
                Ok(t) => t,
                Err(msg) => {
                    let span = span_of(&file, a.value.span());
                    self.diags.push(
                        Diag::error(
                            "config::type",
                            format!("invalid type for variable `{}`", item.name),
                        )
                        .label(&span, msg),
                    );
                    return None;
                }
            },
            None => Type::Any,
        };
        let declared_sensitive = self
            .literal_bool(&file, block.body.get_attribute("sensitive"))
            .unwrap_or(false);
        let name = item.name.clone();
        let header = item.header.clone();
        let (value, sensitive, deps) = if let Some(input) = scope.inputs.get(&name) {
            match types::convert(&input.value, &ty) {
                Ok(v) => (v, input.sensitive || declared_sensitive, input.deps.clone()),
                Err(msg) => {
                    let shown = if declared_sensitive || input.sensitive {
                        format!("expected {ty}")
                    } else {
                        msg
                    };
                    let d = Diag::error(
                        "config::type",
                        format!("wrong type for variable `{name}` (set by {})", input.origin),
                    )
                    .maybe_label(input.span.as_ref(), shown.clone())
                    .label(&header, format!("declared as {ty}"));
                    self.diags.push(d);
                    return None;
                }
            }
        } else if let Some(a) = block.body.get_attribute("default") {
            if !refs::collect(&a.value).refs.is_empty() {
                let span = span_of(&file, a.value.span());
                self.diags.push(
                    Diag::error(
                        "config::variable_default",
                        format!("the default of variable `{name}` refers to other values"),
                    )
                    .label(&span, "defaults must be literal values")
                    .help("compute derived values in a `locals` block instead"),
                );
                return None;
            }
            let ctx = Ctx::default();
            let v = self.eval_expr(&ctx, &file, &a.value)?;
            match types::convert(&v, &ty) {
                Ok(v) => (v, declared_sensitive, BTreeSet::new()),
                Err(msg) => {
                    let span = span_of(&file, a.value.span());
                    self.diags.push(
                        Diag::error(
                            "config::type",
                            format!("the default of variable `{name}` does not match its type"),
                        )
                        .label(&span, msg),
                    );
                    return None;
                }
            }
        } else {
            let mut d = Diag::error(
                "config::missing_variable",
                format!("no value for the required variable `{name}`"),
            )
            .label(&header, "declared here without a default");
            d = match &scope.caller {
                Some(call) => d
                    .label(call, format!("set `{name} = …` in this module block"))
                    .help(format!("the module call must set `{name}`")),
                None => d.help(format!(
                    "set it with `-var {name}=VALUE`, in a `-var-file`, or with the environment variable SPARKFORM_VAR_{name}"
                )),
            };
            self.diags.push(d);
            return None;
        };
        if sensitive {
            note_secrets(&value);
        }
        // validation blocks see only this variable.
        let mut self_ctx = Ctx::default();
        let mut obj = Map::new();
        obj.insert(name.clone(), value.clone());
        self_ctx.vars.insert("var", Value::Object(obj));
        let mut ok = true;
        for v in block.body.get_blocks("validation") {
            let Some(cond) = v.body.get_attribute("condition") else {
                continue;
            };
            for r in refs::collect(&cond.value).refs {
                if r.root != "var" || r.first_key() != Some(name.as_str()) {
                    let span = Span::new(&file, r.span.clone());
                    self.diags.push(
                        Diag::error(
                            "config::validation",
                            format!("a validation of `{name}` may only refer to var.{name}"),
                        )
                        .label(&span, "refers to something else"),
                    );
                    ok = false;
                }
            }
            if !ok {
                continue;
            }
            let Some(passed) = self.eval_expr(&self_ctx, &file, &cond.value) else {
                ok = false;
                continue;
            };
            if passed != Value::Bool(true) {
                let message = v
                    .body
                    .get_attribute("error_message")
                    .and_then(|m| self.eval_expr(&self_ctx, &file, &m.value))
                    .map(|m| value_text(&m))
                    .unwrap_or_else(|| "validation failed".into());
                let cond_span = span_of(&file, cond.value.span());
                let mut d = Diag::error(
                    "config::validation",
                    format!("invalid value for variable `{name}`: {message}"),
                )
                .label(&cond_span, "this condition is false");
                if let Some(input) = scope.inputs.get(&name) {
                    d = d.maybe_label(
                        input.span.as_ref(),
                        format!("value set here ({})", input.origin),
                    );
                    if input.span.is_none() {
                        d = d.help(format!("the value came from {}", input.origin));
                    }
                }
                self.diags.push(d);
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        Some(Evaluated {
            value,
            sensitive,
            sensitive_keys: HashSet::new(),
            deps: DepTree::Leaf(deps),
            all_resources: BTreeSet::new(),
        })
    }

    fn literal_bool(&mut self, file: &Arc<SourceFile>, attr: Option<&Attribute>) -> Option<bool> {
        let attr = attr?;
        match &attr.value {
            Expression::Bool(b) => Some(*b.value()),
            other => {
                let span = span_of(file, other.span());
                self.diags.push(
                    Diag::error(
                        "config::type",
                        format!("`{}` must be true or false", attr.key.as_str()),
                    )
                    .label(&span, "expected a literal bool"),
                );
                None
            }
        }
    }

    fn eval_local(&mut self, scope: &mut Scope<'_>, i: usize) -> Option<Evaluated> {
        let item = &scope.items[i];
        let attr = item.local?;
        let ctx = self.item_context(scope, i)?;
        let file = item.file.clone();
        let value = self.eval_expr(&ctx, &file, &attr.value)?;
        Some(Evaluated {
            value,
            sensitive: ctx.sensitive,
            sensitive_keys: HashSet::new(),
            deps: DepTree::Leaf(ctx.deps),
            all_resources: BTreeSet::new(),
        })
    }

    // ----- attribute evaluation -----

    fn eval_expr(&mut self, ctx: &Ctx, file: &Arc<SourceFile>, expr: &Expression) -> Option<Value> {
        let hctx = ctx.hcl();
        self.eval_in(&hctx, ctx.sensitive, file, expr)
    }

    /// Evaluate with a prepared context: blocks build one for all their attributes, since
    /// declaring the variables and the function table costs more than most expressions.
    fn eval_in(
        &mut self,
        hctx: &Context<'_>,
        sensitive: bool,
        file: &Arc<SourceFile>,
        expr: &Expression,
    ) -> Option<Value> {
        let converted = super::arith::guard(expr.clone().into());
        match converted.evaluate(hctx) {
            Ok(v) => Some(v),
            Err(e) => {
                let span = span_of(file, expr.span());
                // Static taint: an expression over a sensitive value gets a message that
                // says what failed without the values (a function's message quotes them).
                let msg = if sensitive {
                    super::arith::sensitive_message(&e)
                } else {
                    super::arith::message(&e)
                };
                self.diags.push(
                    Diag::error("config::eval", format!("cannot evaluate expression: {msg}"))
                        .label(&span, msg),
                );
                None
            }
        }
    }

    /// Evaluate every attribute of a block body against its schema. Returns converted values by
    /// name, and the names whose values are sensitive; `None` if any failed.
    fn eval_body(
        &mut self,
        ctx: &Ctx,
        scope: &Scope<'_>,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
    ) -> Option<Attrs> {
        let mut out = Attrs::default();
        let mut ok = true;
        let hctx = ctx.hcl();
        for attr in body.attributes() {
            let key = attr.key.as_str();
            let Some(a) = spec.attr(key) else { continue };
            if matches!(a.kind, Kind::RefList | Kind::TypeExpr | Kind::ForEach) {
                continue;
            }
            let tainted = ctx.sensitive && scope.refs_sensitive(&refs::collect(&attr.value).refs);
            let Some(v) = self.eval_in(&hctx, tainted, file, &attr.value) else {
                ok = false;
                continue;
            };

            let span = span_of(file, attr.value.span());
            match self.convert_kind(&v, a.kind) {
                Ok(converted) => {
                    if tainted {
                        let before = out.sensitive.len();
                        self.mark_sensitive(scope, attr, &mut out);
                        for path in &out.sensitive[before..] {
                            let part = path[1..]
                                .iter()
                                .try_fold(&v, |cur, k| cur.as_object()?.get(k));
                            part.into_iter().for_each(note_secrets);
                        }
                    }
                    if matches!(a.kind, Kind::Node | Kind::Jump | Kind::Container) {
                        out.raw.insert(key.to_string(), v);
                    }
                    let v = converted;
                    out.values.insert(key.to_string(), v);
                    out.spans.insert(key.to_string(), span);
                }
                Err(msg) => {
                    let msg = if tainted {
                        format!("expected {}", a.kind.describe())
                    } else {
                        msg
                    };
                    self.diags.push(
                        Diag::error(
                            "config::type",
                            format!("wrong type for `{key}` in `{}`", spec.kind),
                        )
                        .label(&span, msg),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn mark_sensitive(&self, scope: &Scope<'_>, attr: &Attribute, out: &mut Attrs) {
        let key = attr.key.as_str().to_string();
        if let Expression::Object(obj) = &attr.value {
            // A key derived from a secret hides the whole object: keys show in plans.
            let secret_key = obj.iter().any(|(k, _)| match k {
                hcl_edit::expr::ObjectKey::Expression(e) => {
                    scope.refs_sensitive(&refs::collect(e).refs)
                }
                hcl_edit::expr::ObjectKey::Ident(_) => false,
            });
            if secret_key {
                out.sensitive.push(vec![key]);
                return;
            }
            for (k, v) in obj.iter() {
                let c = refs::collect(v.expr());
                if scope.refs_sensitive(&c.refs) {
                    let kname = match k {
                        hcl_edit::expr::ObjectKey::Ident(id) => id.as_str().to_string(),
                        hcl_edit::expr::ObjectKey::Expression(Expression::String(s)) => {
                            s.value().to_string()
                        }
                        _ => {
                            out.sensitive.push(vec![key.clone()]);
                            continue;
                        }
                    };
                    out.sensitive.push(vec![key.clone(), kname]);
                }
            }
        } else {
            let c = refs::collect(&attr.value);
            if scope.refs_sensitive(&c.refs) {
                out.sensitive.push(vec![key]);
            }
        }
    }

    fn convert_kind(&self, v: &Value, kind: Kind) -> Result<Value, String> {
        // An attribute set to null is an attribute not set.
        if v.is_null() {
            return Ok(Value::Null);
        }
        let reference = |what: &str| -> Result<Value, String> {
            match v {
                Value::Object(o) if o.get("kind").and_then(Value::as_str) == Some(what) => {
                    Ok(o.get("id").cloned().unwrap_or(Value::Null))
                }
                Value::Null => Ok(Value::Null),
                other => Err(format!(
                    "expected a {what} reference such as {what}.NAME, found {}",
                    types::describe(other)
                )),
            }
        };
        match kind {
            Kind::Any | Kind::RefList | Kind::Address | Kind::TypeExpr | Kind::ForEach => {
                Ok(v.clone())
            }
            Kind::Str => types::convert(v, &Type::String),
            Kind::Num => types::convert(v, &Type::Number),
            Kind::Bool => types::convert(v, &Type::Bool),
            Kind::ListStr => types::convert(v, &Type::List(Box::new(Type::String))),
            Kind::MapStr => types::convert(v, &Type::Map(Box::new(Type::String))),
            Kind::Node => reference("node"),
            Kind::Jump => reference("jump"),
            Kind::Container => reference("container"),
            Kind::Duration => match v {
                Value::Number(n) => Ok(Value::Number(*n)),
                Value::String(s) => parse_duration(s)
                    .map(Value::from)
                    .ok_or_else(|| format!("expected {}, found {:?}", kind.describe(), s)),
                other => Err(format!(
                    "expected {}, found {}",
                    kind.describe(),
                    types::describe(other)
                )),
            },
            Kind::Size => match v {
                Value::Number(n) => Ok(Value::Number(*n)),
                Value::String(s) => parse_size(s)
                    .map(Value::from)
                    .ok_or_else(|| format!("expected {}, found {:?}", kind.describe(), s)),
                other => Err(format!(
                    "expected {}, found {}",
                    kind.describe(),
                    types::describe(other)
                )),
            },
            Kind::Gpus => match v {
                Value::Number(n) if n.as_u64().is_some() => Ok(v.clone()),
                Value::String(s) if s == "all" => Ok(v.clone()),
                Value::String(s) if s.parse::<u32>().is_ok() => types::convert(v, &Type::Number),
                other => Err(format!(
                    "expected {}, found {}",
                    kind.describe(),
                    types::describe(other)
                )),
            },
        }
    }

    // ----- jump, node -----

    fn simple_block(
        &mut self,
        scope: &Scope<'_>,
        i: usize,
        spec: &BlockSpec,
    ) -> Option<(Attrs, Ctx)> {
        let item = &scope.items[i];
        let block = item.block?;
        let ctx = self.item_context(scope, i)?;
        let file = item.file.clone();
        let attrs = self.eval_body(&ctx, scope, &file, &block.body, spec)?;
        Some((attrs, ctx))
    }

    fn value_error(&mut self, attrs: &Attrs, key: &str, message: String, help: &str) {
        let d = Diag::error(
            "config::invalid_value",
            format!("invalid `{key}`: {message}"),
        )
        .maybe_label(attrs.spans.get(key), message)
        .help(help);
        self.diags.push(d);
    }

    /// A `for_each` over a value derived from a sensitive variable would put it in resource
    /// addresses (plans, state keys, graphs): an error, as in Terraform. `None` when refused.
    fn refuse_sensitive_for_each(
        &mut self,
        scope: &Scope<'_>,
        file: &Arc<SourceFile>,
        fe: &Attribute,
        what: &str,
    ) -> Option<()> {
        if !scope.refs_sensitive(&refs::collect(&fe.value).refs) {
            return Some(());
        }
        let span = span_of(file, fe.value.span());
        self.diags.push(
            Diag::error(
                "config::sensitive_for_each",
                format!("the for_each of {what} is derived from a sensitive value"),
            )
            .label(&span, "its keys would show in resource addresses, plans and the state")
            .help("iterate over values that are not secret (node names, say) and look the secrets up inside the block"),
        );
        None
    }

    /// A name derived from a sensitive value would be shown everywhere the resource is: an
    /// error. False when refused.
    fn refuse_sensitive_name(&mut self, attrs: &Attrs, key: &str) -> bool {
        if !attrs.is_sensitive(key) {
            return true;
        }
        self.diags.push(
            Diag::error(
                "config::sensitive_name",
                format!("`{key}` is derived from a sensitive value"),
            )
            .maybe_label(
                attrs.spans.get(key),
                "names show in plans, on the machines and in `docker ps`",
            )
            .help("name it from values that are not secret"),
        );
        false
    }

    /// Resources named by `depends_on` / `replace_triggered_by`.
    fn edge_deps(
        &mut self,
        scope: &Scope<'_>,
        i: usize,
        attr_name: &str,
    ) -> Option<BTreeSet<String>> {
        let item = &scope.items[i];
        let block = item.block?;
        let mut out = BTreeSet::new();
        let Some(attr) = block.body.get_attribute(attr_name) else {
            return Some(out);
        };
        let items: Vec<&Expression> = match &attr.value {
            Expression::Array(a) => a.iter().collect(),
            other => {
                let span = span_of(&item.file, other.span());
                self.diags.push(
                    Diag::error(
                        "config::type",
                        format!("`{attr_name}` must be a list of references"),
                    )
                    .label(&span, "expected [container.x, probe.y, …]"),
                );
                return None;
            }
        };
        for e in items {
            let c = refs::collect(e);
            let plain = matches!(e, Expression::Traversal(_) | Expression::Variable(_))
                && c.refs.len() == 1;
            if !plain {
                let span = span_of(&item.file, e.span());
                self.diags.push(
                    Diag::error("config::type", format!("`{attr_name}` entries must be plain references"))
                        .label(&span, "expected a reference such as container.ray_head")
                        .help("depends_on and replace_triggered_by name resources; they are not evaluated"),
                );
                return None;
            }
            for r in &c.refs {
                let Some(root) = Root::referable(&r.root) else {
                    continue;
                };
                let Some(name) = r.first_key() else { continue };
                let Some(&t) = scope.index.get(&(root, name.to_string())) else {
                    continue;
                };
                let ev = scope.values[t].as_ref()?;
                if root == Root::Module && r.path.len() == 1 {
                    out.extend(ev.all_resources.iter().cloned());
                } else {
                    ev.deps.resolve(&r.path[1..], &mut out);
                }
                if !matches!(root, Root::Resource(_) | Root::Module) {
                    let span = Span::new(&item.file, r.span.clone());
                    self.diags.push(
                        Diag::error("config::type", format!("`{attr_name}` must name resources"))
                            .label(&span, format!("`{}` is not a resource", r.display(1)))
                            .help(
                                "name containers, probes, networks (their attachments) or modules",
                            ),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    // ----- probes -----
}

struct Scope<'m> {
    /// Module names from the root, e.g. ["qwen"].
    path: Vec<String>,
    /// Address prefix, e.g. "module.qwen.".
    prefix: String,
    items: Vec<Item<'m>>,
    index: HashMap<(Root, String), usize>,
    values: Vec<Option<Evaluated>>,
    inputs: HashMap<String, InputValue>,
    extra_deps: BTreeSet<String>,
    caller: Option<Span>,
    dir: PathBuf,
    all_resources: BTreeSet<String>,
}

impl Scope<'_> {
    fn address_of(&self, i: usize) -> String {
        let it = &self.items[i];
        format!("{}{}.{}", self.prefix, it.root.ident(), it.name)
    }

    fn refs_sensitive(&self, refs: &[Ref]) -> bool {
        refs.iter().any(|r| {
            let (Some(root), Some(name)) = (Root::referable(&r.root), r.first_key()) else {
                return false;
            };
            let Some(&t) = self.index.get(&(root, name.to_string())) else {
                return false;
            };
            match &self.values[t] {
                Some(ev) if root == Root::Module => match r.path.get(1) {
                    Some(Step::Key(k)) => ev.sensitive_keys.contains(k),
                    _ => !ev.sensitive_keys.is_empty(),
                },
                Some(ev) => ev.sensitive,
                None => false,
            }
        })
    }
}

/// One item as the lowering of a resource kind's block sees the engine.
struct Lowering<'l, 's, 'm> {
    loader: &'l mut Loader,
    scope: &'s mut Scope<'m>,
    i: usize,
}

impl<'m> Engine<'m> for Lowering<'_, '_, 'm> {
    fn item(&self) -> ItemRef<'m> {
        let it = &self.scope.items[self.i];
        ItemRef {
            block: it.block,
            file: it.file.clone(),
            name: it.name.clone(),
            header: it.header.clone(),
        }
    }
    fn prefix(&self) -> &str {
        &self.scope.prefix
    }
    fn path(&self) -> &[String] {
        &self.scope.path
    }
    fn extra_deps(&self) -> &BTreeSet<String> {
        &self.scope.extra_deps
    }
    fn diag(&mut self, d: Diag) {
        self.loader.diags.push(d);
    }
    fn item_context(&self) -> Option<Ctx> {
        self.loader.item_context(self.scope, self.i)
    }
    fn body_context(&self, body: &Body) -> Option<Ctx> {
        // Each nested block is evaluated with the parts of other blocks it refers to, not the
        // whole item's references: with N nested blocks that would cost N² copies.
        let mut refs = Vec::new();
        let mut calls = false;
        for attr in body.attributes() {
            let c = refs::collect(&attr.value);
            calls |= !c.funcs.is_empty();
            refs.extend(c.refs);
        }
        let mut ctx = self.loader.context_for(self.scope, &refs)?;
        ctx.skip_functions = !calls;
        Some(ctx)
    }
    fn simple_block(&mut self, spec: &BlockSpec) -> Option<(Attrs, Ctx)> {
        self.loader.simple_block(self.scope, self.i, spec)
    }
    fn edge_deps(&mut self, attr_name: &str) -> Option<BTreeSet<String>> {
        self.loader.edge_deps(self.scope, self.i, attr_name)
    }
    fn eval_expr(&mut self, ctx: &Ctx, file: &Arc<SourceFile>, expr: &Expression) -> Option<Value> {
        self.loader.eval_expr(ctx, file, expr)
    }
    fn eval_body(
        &mut self,
        ctx: &Ctx,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
    ) -> Option<Attrs> {
        self.loader.eval_body(ctx, self.scope, file, body, spec)
    }
    fn value_error(&mut self, attrs: &Attrs, key: &str, message: String, help: &str) {
        self.loader.value_error(attrs, key, message, help);
    }
    fn for_each_instances(&self, v: &Value) -> Result<Vec<(String, Value)>, String> {
        for_each_instances(v)
    }
    fn refuse_sensitive_for_each(&mut self, fe: &Attribute, what: &str) -> Option<()> {
        let file = self.scope.items[self.i].file.clone();
        self.loader
            .refuse_sensitive_for_each(self.scope, &file, fe, what)
    }
    fn refuse_sensitive_name(&mut self, attrs: &Attrs, key: &str) -> bool {
        self.loader.refuse_sensitive_name(attrs, key)
    }
    fn node_host(&self, node: &str) -> Option<String> {
        self.loader.config.nodes.get(node).map(|n| n.host.clone())
    }
    fn observed(&self) -> &crate::config::Observed {
        &self.loader.observed
    }
    fn add_resource(&mut self, r: Resource) {
        self.scope.all_resources.insert(r.address.clone());
        self.loader.config.resources.push(r);
    }
    fn add_network(&mut self, n: Network) {
        self.loader.config.networks.insert(n.address.clone(), n);
    }
}

impl Ctx {
    /// The hcl-rs evaluation context: the projected variables, `each`, and the functions.
    fn hcl(&self) -> Context<'static> {
        thread_local! {
            // Declaring the function table costs more than most expressions: build it once.
            static FUNCTIONS: Context<'static> = {
                let mut c = Context::new();
                crate::config::functions::declare_all(&mut c);
                c
            };
        }
        let mut hctx = if self.skip_functions {
            super::arith::context()
        } else {
            FUNCTIONS.with(Context::clone)
        };
        for (k, v) in &self.vars {
            hctx.declare_var(*k, v.clone());
        }
        if let Some(each) = &self.each {
            hctx.declare_var("each", each.clone());
        }
        hctx
    }
}

pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Build into `dst` the part of `src` that `path` reaches (whole subtrees past the path's end).
fn project(dst: &mut Value, src: &Value, path: &[Step]) {
    match (path.first(), src) {
        (Some(Step::Key(k)), Value::Object(m)) if m.contains_key(k) => {
            if !matches!(dst, Value::Object(_)) {
                *dst = Value::Object(Map::new());
            }
            if let (Value::Object(d), Some(child)) = (dst, m.get(k)) {
                let slot = d.entry(k.clone()).or_insert(Value::Null);
                project(slot, child, &path[1..]);
            }
        }
        _ => *dst = src.clone(),
    }
}

/// Walk one cycle through the members of a strongly connected component.
fn walk_cycle(graph: &DiGraph<usize, Span>, members: &BTreeSet<NodeIndex>) -> Vec<NodeIndex> {
    let Some(&start) = members.iter().next() else {
        return Vec::new();
    };
    let mut path = vec![start];
    let mut seen = HashSet::from([start]);
    let mut cur = start;
    loop {
        let next = graph
            .neighbors(cur)
            .filter(|n| members.contains(n))
            .min_by_key(|n| (if *n == start { 0 } else { 1 }, n.index()));
        match next {
            Some(n) if n == start => return path,
            Some(n) if seen.contains(&n) => {
                // Reached a loop not through `start`: cut the path to that loop.
                let pos = path.iter().position(|p| *p == n).unwrap_or(0);
                return path.split_off(pos);
            }
            Some(n) => {
                seen.insert(n);
                path.push(n);
                cur = n;
            }
            None => return path,
        }
    }
}

/// Depth-first post-order (dependencies before dependents), iterative so deep chains can't overflow.
fn visit_post(
    graph: &DiGraph<usize, Span>,
    nodes: &[NodeIndex],
    start: usize,
    state: &mut [u8],
    order: &mut Vec<usize>,
) {
    if state[start] != 0 {
        return;
    }
    let mut stack: Vec<(usize, Vec<usize>)> = Vec::new();
    state[start] = 1;
    let succ = |i: usize| -> Vec<usize> {
        let mut v: Vec<usize> = graph.neighbors(nodes[i]).map(|n| graph[n]).collect();
        v.sort_unstable();
        v.reverse();
        v
    };
    stack.push((start, succ(start)));
    while let Some((node, pending)) = stack.last_mut() {
        match pending.pop() {
            Some(next) if state[next] == 0 => {
                state[next] = 1;
                let s = succ(next);
                stack.push((next, s));
            }
            Some(_) => {}
            None => {
                state[*node] = 2;
                order.push(*node);
                stack.pop();
            }
        }
    }
}

fn for_each_instances(v: &Value) -> Result<Vec<(String, Value)>, String> {
    super::limits::check_instances(v)?;
    let list = match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>(),
        Value::Array(a) => {
            let mut out = Vec::new();
            for x in a {
                match x {
                    Value::String(s) => {
                        if !out.iter().any(|(k, _): &(String, Value)| k == s) {
                            out.push((s.clone(), Value::String(s.clone())));
                        }
                    }
                    other => {
                        return Err(format!(
                            "a set for for_each must hold strings, found {}",
                            types::describe(other)
                        ))
                    }
                }
            }
            out
        }
        other => {
            return Err(format!(
                "expected a map or a set of strings, found {}",
                types::describe(other)
            ))
        }
    };
    for (k, _) in &list {
        if k.is_empty()
            || k.len() > 63
            || !k
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(format!("the key {k:?} would become part of a container name; keys are letters, digits, `_`, `-` and `.`"));
        }
    }
    Ok(list)
}

pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut any = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
        } else {
            let n: u64 = num.parse().ok()?;
            num.clear();
            let mult = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86400,
                _ => return None,
            };
            total = total.checked_add(n.checked_mul(mult)?)?;
            any = true;
        }
    }
    (num.is_empty() && any).then_some(total)
}

pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let s = s
        .strip_suffix("ib")
        .or_else(|| s.strip_suffix('b'))
        .unwrap_or(&s)
        .to_string();
    let (digits, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        't' => (&s[..s.len() - 1], 1 << 40),
        _ => (&s[..], 1),
    };
    let n: f64 = digits.trim().parse().ok()?;
    if !(n.is_finite() && n >= 0.0) {
        return None;
    }
    let bytes = n * mult as f64;
    (bytes < 1e18).then_some(bytes as u64)
}

/// Tell the diagnostics the text of every part of a sensitive value, keys included, so that no
/// message built afterwards shows it (see [`crate::diag::note_secret`]).
fn note_secrets(v: &Value) {
    match v {
        Value::String(s) => crate::diag::note_secret(s),
        Value::Number(n) => crate::diag::note_secret(&n.to_string()),
        Value::Array(a) => a.iter().for_each(note_secrets),
        Value::Object(m) => {
            for (k, v) in m {
                crate::diag::note_secret(k);
                note_secrets(v);
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `a/b/../../c` → `c`, without touching the file system, so paths in messages read well.
fn normalize_path(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component> = Vec::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {}
                _ => out.push(c),
            },
            other => out.push(other),
        }
    }
    if out.is_empty() {
        return PathBuf::from(".");
    }
    out.iter().collect()
}

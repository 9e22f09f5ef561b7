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
use super::model::{Config, Jump, Node, OutputBlock};
use super::parse::{read_folder, ModuleFiles};
use super::refs::{self, Ref, RefStep};
use super::schema::{self, BlockSpec, ValueType};
use super::types::{self, Type};
use crate::diag::{did_you_mean, Diag, Diagnostics, SourceFile, Span};
use crate::kind::Registered;
use crate::vocabulary::KindId;

// The lowering of each block that is no resource kind, one file each; the engine is this file.
// The resource kinds lower their own blocks (`kinds::<kind>::lower`).
mod collect;
mod lower_hosts;
mod lower_import;
mod lower_module;
mod lower_moved;
mod lower_outputs;
mod lower_variable;
mod order;

/// The value of a variable handed to a module (or to the root from the command line).
#[derive(Debug, Clone)]
pub struct InputValue {
    pub value: Value,
    pub sensitive: bool,
    /// Derived from an ephemeral value: the variable it sets must be `ephemeral = true`.
    pub ephemeral: bool,
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
            other => Root::Resource(crate::kind::declared_by(other)?),
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
    fn resolve(&self, path: &[RefStep], out: &mut BTreeSet<String>) {
        match (self, path.first()) {
            (DepTree::Keyed(m), Some(RefStep::Key(k))) => match m.get(k) {
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
    pub output_items: Vec<OutputBlock>,
}

pub struct Loader {
    pub diags: Diagnostics,
    cache: HashMap<PathBuf, Rc<ModuleFiles>>,
    stack: Vec<PathBuf>,
    pub config: Config,
    pub readings: crate::config::Readings,
    /// Where the root module's `state` block is, once one was read.
    state_block: Option<String>,
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
                readings: Default::default(),
                jumps: BTreeMap::new(),
                nodes: BTreeMap::new(),
                networks: BTreeMap::new(),
                resources: Vec::new(),
                outputs: Vec::new(),
                warnings: Vec::new(),
                imports: Vec::new(),
                moves: Vec::new(),
                removals: Vec::new(),
                secrets: Default::default(),
            },
            readings: Default::default(),
            state_block: None,
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

    fn eval_item<'m>(
        &mut self,
        scope: &mut Scope<'m>,
        i: usize,
        result: &mut ModuleResult,
    ) -> Option<ItemValue> {
        let root = scope.items[i].root;
        match root {
            Root::Var => self.eval_variable(scope, i),
            Root::Local => self.eval_local(scope, i),
            Root::Jump => self.eval_jump(scope, i),
            Root::Node => self.eval_node(scope, i),
            Root::Resource(k) => super::lowering::lower(k)(&mut Lowering {
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

    /// The resources item `i` depends on in its instance `key` of a `for_each`: a reference
    /// indexed by `[each.key]` names that key's instance only.
    fn instance_deps(&self, scope: &Scope<'_>, i: usize, key: &str) -> BTreeSet<String> {
        let mut deps = BTreeSet::new();
        for r in &scope.items[i].refs {
            if r.root == "each" {
                continue;
            }
            let Some(root) = Root::referable(&r.root) else {
                continue;
            };
            let Some(name) = r.first_key() else {
                continue;
            };
            let Some(ev) = scope
                .index
                .get(&(root, name.to_string()))
                .and_then(|&t| scope.values[t].as_ref())
            else {
                continue;
            };
            let mut rest = r.path[1..].to_vec();
            if r.each_key_next {
                rest.push(crate::config::refs::RefStep::Key(key.to_string()));
            }
            ev.deps.resolve(&rest, &mut deps);
        }
        deps
    }

    fn context_for(&self, scope: &Scope<'_>, refs: &[Ref]) -> Option<Ctx> {
        let mut roots: BTreeMap<&'static str, Value> = BTreeMap::new();
        let mut deps = BTreeSet::new();
        let mut sensitive = false;
        let mut ephemeral = false;
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
                    Some(RefStep::Key(k)) => sensitive |= ev.sensitive_keys.contains(k),
                    _ => sensitive |= !ev.sensitive_keys.is_empty(),
                }
            } else {
                sensitive |= ev.sensitive;
                ephemeral |= ev.ephemeral;
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
            ephemeral,
            skip_functions: false,
        })
    }

    // ----- variables, locals -----

    fn eval_local(&mut self, scope: &mut Scope<'_>, i: usize) -> Option<ItemValue> {
        let item = &scope.items[i];
        let attr = item.local?;
        let ctx = self.item_context(scope, i)?;
        let file = item.file.clone();
        let value = self.eval_expr(&ctx, &file, &attr.value)?;
        Some(ItemValue {
            value,
            sensitive: ctx.sensitive,
            ephemeral: ctx.ephemeral,
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
            if matches!(
                a.kind,
                ValueType::RefList | ValueType::TypeExpr | ValueType::ForEach
            ) {
                continue;
            }
            let refs = refs::collect(&attr.value).refs;
            let tainted = ctx.sensitive && scope.refs_sensitive(&refs);
            let Some(v) = self.eval_in(&hctx, tainted, file, &attr.value) else {
                ok = false;
                continue;
            };

            let span = span_of(file, attr.value.span());
            if ctx.ephemeral && scope.refs_ephemeral(&refs) {
                if !a.takes_ephemeral {
                    self.refuse_ephemeral_attribute(spec, key, &span);
                    ok = false;
                    continue;
                }
                out.ephemeral.push(key.to_string());
            }
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
                    if matches!(
                        a.kind,
                        ValueType::Node | ValueType::Jump | ValueType::Container
                    ) {
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

    /// An ephemeral value set on an attribute the kind records (in the state, the plan): refused,
    /// with the attributes of the block that take one.
    fn refuse_ephemeral_attribute(&mut self, spec: &BlockSpec, key: &str, span: &Span) {
        let takers: Vec<String> = spec
            .attrs
            .iter()
            .filter(|a| a.takes_ephemeral)
            .map(|a| format!("`{}`", a.name))
            .collect();
        let help = if takers.is_empty() {
            format!("nothing in a `{}` block takes an ephemeral value: use a variable with `sensitive = true` (recorded as a keyed hash) instead", spec.kind)
        } else {
            format!(
                "in a `{}` block only {} takes an ephemeral value; here use a variable with `sensitive = true` (recorded as a keyed hash) instead",
                spec.kind,
                takers.join(", ")
            )
        };
        self.diags.push(
            Diag::error(
                "config::ephemeral_stored",
                format!(
                    "`{key}` of a `{}` block is recorded in the state and in plans, and its value is ephemeral",
                    spec.kind
                ),
            )
            .label(span, "derived from an ephemeral variable")
            .help(help),
        );
    }

    fn mark_sensitive(&self, scope: &Scope<'_>, attr: &Attribute, out: &mut Attrs) {
        let key = attr.key.as_str().to_string();
        match &attr.value {
            Expression::Object(obj) => self.mark_object(scope, &key, obj, out),
            // `merge(a, { K = secret })`: an object literal among merge's arguments is marked
            // key by key, as if it were written alone (a launcher adds one secret to a map of
            // plain settings, and the plan still shows the settings); any other argument that
            // is derived from a secret hides the whole value.
            Expression::FuncCall(call)
                if call.name.namespace.is_empty() && call.name.name.as_str() == "merge" =>
            {
                for arg in call.args.iter() {
                    match arg {
                        Expression::Object(obj) => self.mark_object(scope, &key, obj, out),
                        other if scope.refs_sensitive(&refs::collect(other).refs) => {
                            out.sensitive.push(vec![key.clone()]);
                        }
                        _ => {}
                    }
                }
            }
            other => {
                if scope.refs_sensitive(&refs::collect(other).refs) {
                    out.sensitive.push(vec![key]);
                }
            }
        }
    }

    /// The sensitive parts of an object literal written for attribute `key`: each value derived
    /// from a secret, or the whole attribute when a key is.
    fn mark_object(
        &self,
        scope: &Scope<'_>,
        key: &str,
        obj: &hcl_edit::expr::Object,
        out: &mut Attrs,
    ) {
        // A key derived from a secret hides the whole object: keys show in plans.
        let secret_key = obj.iter().any(|(k, _)| match k {
            hcl_edit::expr::ObjectKey::Expression(e) => {
                scope.refs_sensitive(&refs::collect(e).refs)
            }
            hcl_edit::expr::ObjectKey::Ident(_) => false,
        });
        if secret_key {
            out.sensitive.push(vec![key.to_string()]);
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
                        out.sensitive.push(vec![key.to_string()]);
                        continue;
                    }
                };
                out.sensitive.push(vec![key.to_string(), kname]);
            }
        }
    }

    fn convert_kind(&self, v: &Value, kind: ValueType) -> Result<Value, String> {
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
            ValueType::Any
            | ValueType::RefList
            | ValueType::Address
            | ValueType::TypeExpr
            | ValueType::ForEach => Ok(v.clone()),
            ValueType::Str => types::convert(v, &Type::String),
            ValueType::Num => types::convert(v, &Type::Number),
            ValueType::Bool => types::convert(v, &Type::Bool),
            ValueType::ListStr => types::convert(v, &Type::List(Box::new(Type::String))),
            ValueType::MapStr => types::convert(v, &Type::Map(Box::new(Type::String))),
            ValueType::Node => reference("node"),
            ValueType::Jump => reference("jump"),
            ValueType::Container => reference("container"),
            ValueType::Duration => match v {
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
            ValueType::Size => match v {
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
            ValueType::Gpus => match v {
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
    values: Vec<Option<ItemValue>>,
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

    /// Whether one of `refs` names an ephemeral value (a module's value never is).
    fn refs_ephemeral(&self, refs: &[Ref]) -> bool {
        refs.iter().any(|r| {
            let (Some(root), Some(name)) = (Root::referable(&r.root), r.first_key()) else {
                return false;
            };
            self.index
                .get(&(root, name.to_string()))
                .and_then(|&t| self.values[t].as_ref())
                .is_some_and(|ev| ev.ephemeral)
        })
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
                    Some(RefStep::Key(k)) => ev.sensitive_keys.contains(k),
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
    fn instance_deps(&self, key: &str) -> BTreeSet<String> {
        self.loader.instance_deps(self.scope, self.i, key)
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
    fn address_before_moves(&self, address: &str) -> String {
        crate::config::model::address_before_moves(&self.loader.config.moves, address)
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
    fn readings(&self) -> &crate::config::Readings {
        &self.loader.readings
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
fn project(dst: &mut Value, src: &Value, path: &[RefStep]) {
    match (path.first(), src) {
        (Some(RefStep::Key(k)), Value::Object(m)) if m.contains_key(k) => {
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

//! What the evaluation engine (`config::eval`) hands the lowering of a resource kind's block
//! (`kinds::<kind>::lower`): the evaluated attributes, evaluation contexts, values with their
//! dependencies, and [`Engine`], the engine's operations on the item being lowered. It sits
//! between the model and the engine so that the kinds lower their blocks with the engine and
//! the engine dispatches to them, without an import cycle (`tests/fake/layering.rs`).

pub use crate::vocabulary::KindId;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use hcl::{Map, Value};
use hcl_edit::expr::Expression;
use hcl_edit::structure::{Block, Body};
use hcl_edit::Span as _;

pub use super::model::{Network, Readings, Resource};
use crate::diag::{Diag, SourceFile, Span};
use crate::schema::BlockSpec;

impl ItemValue {
    /// A value that depends on `resources` as a whole, with nothing sensitive in it (the value
    /// a kind's block gives the blocks that reference it).
    pub fn of_resources(value: Value, resources: BTreeSet<String>) -> ItemValue {
        ItemValue {
            value,
            sensitive: false,
            ephemeral: false,
            sensitive_keys: HashSet::new(),
            deps: DepTree::Leaf(resources),
            all_resources: BTreeSet::new(),
        }
    }
}

/// Which resources a part of a value depends on.
#[derive(Debug, Clone)]
pub enum DepTree {
    Leaf(BTreeSet<String>),
    Keyed(BTreeMap<String, DepTree>),
}

impl DepTree {
    pub fn collect_all(&self, out: &mut BTreeSet<String>) {
        match self {
            DepTree::Leaf(s) => out.extend(s.iter().cloned()),
            DepTree::Keyed(m) => m.values().for_each(|t| t.collect_all(out)),
        }
    }
}

/// An item's value as other items see it.
#[derive(Debug, Clone)]
pub struct ItemValue {
    pub value: Value,
    pub sensitive: bool,
    /// Derived from an ephemeral variable (which is sensitive too): usable during a plan and an
    /// apply, never recorded. A module's value is never ephemeral (no output may be).
    pub ephemeral: bool,
    /// For modules: which outputs are sensitive.
    pub sensitive_keys: HashSet<String>,
    pub deps: DepTree,
    /// For modules: every resource inside, for `depends_on = [module.x]`.
    pub all_resources: BTreeSet<String>,
}

/// What an expression is evaluated with: the referenced parts of other items.
#[derive(Default)]
pub struct Ctx {
    pub vars: BTreeMap<&'static str, Value>,
    pub each: Option<Value>,
    pub deps: BTreeSet<String>,
    pub sensitive: bool,
    /// Whether a referenced item is ephemeral ([`Evaluated::ephemeral`]).
    pub ephemeral: bool,
    /// Set when the expressions call no function: most blocks do not, and the function table
    /// is the costliest part of a context. Off by default, so a context has the functions.
    pub skip_functions: bool,
}

/// Evaluated attributes of one block.
#[derive(Default)]
pub struct Attrs {
    /// Converted values (references replaced by the address they name).
    pub values: Map<String, Value>,
    /// The values as evaluated, before reference conversion (node objects and the like).
    pub raw: Map<String, Value>,
    pub spans: HashMap<String, Span>,
    pub sensitive: Vec<Vec<String>>,
    /// The attributes whose values are ephemeral: only those whose schema takes one
    /// (`schema::Attr::takes_ephemeral`; the engine refuses the others).
    pub ephemeral: Vec<String>,
}

impl Attrs {
    pub fn string(&self, k: &str) -> Option<String> {
        self.values
            .get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
    }
    pub fn number(&self, k: &str) -> Option<f64> {
        match self.values.get(k) {
            Some(Value::Number(n)) => n.as_f64(),
            _ => None,
        }
    }
    pub fn string_map(&self, k: &str) -> BTreeMap<String, String> {
        match self.values.get(k) {
            Some(Value::Object(m)) => m
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect(),
            _ => BTreeMap::new(),
        }
    }
    pub fn is_ephemeral(&self, k: &str) -> bool {
        self.ephemeral.iter().any(|e| e == k)
    }
    pub fn is_sensitive(&self, k: &str) -> bool {
        self.sensitive
            .iter()
            .any(|p| p.first().is_some_and(|f| f == k))
    }
    pub fn to_object(&self) -> Map<String, Value> {
        let mut m = self.values.clone();
        for (k, v) in &self.raw {
            m.insert(k.clone(), v.clone());
        }
        m
    }
}

/// The block being lowered, and where it is.
pub struct ItemRef<'m> {
    pub block: Option<&'m Block>,
    pub file: Arc<SourceFile>,
    pub name: String,
    pub header: Span,
}

/// The evaluation engine, as the lowering of one item (one top-level block) uses it.
pub trait Engine<'m> {
    fn item(&self) -> ItemRef<'m>;
    /// The module instance's address prefix: `module.qwen.`, or nothing at the root.
    fn prefix(&self) -> &str;
    /// Module names from the root, e.g. `["qwen"]`.
    fn path(&self) -> &[String];
    /// Resources everything in the module instance depends on (its caller's `depends_on`).
    fn extra_deps(&self) -> &BTreeSet<String>;
    fn diag(&mut self, d: Diag);
    /// The item's context: the parts of other items its references name. `None` when one of
    /// them failed (its error is already reported).
    fn item_context(&self) -> Option<Ctx>;
    /// The resources the item depends on in its `for_each` instance `key` (what
    /// `item_context`'s `deps` hold for all instances together).
    fn instance_deps(&self, key: &str) -> BTreeSet<String>;
    /// The context of a nested block: only what its own attributes reference.
    fn body_context(&self, body: &Body) -> Option<Ctx>;
    /// The item's context and its evaluated attributes.
    fn simple_block(&mut self, spec: &BlockSpec) -> Option<(Attrs, Ctx)>;
    /// Resources named by the item's `depends_on` / `replace_triggered_by`.
    fn edge_deps(&mut self, attr_name: &str) -> Option<BTreeSet<String>>;
    fn eval_expr(&mut self, ctx: &Ctx, file: &Arc<SourceFile>, expr: &Expression) -> Option<Value>;
    /// Every attribute of a body, evaluated and converted to its schema's type.
    fn eval_body(
        &mut self,
        ctx: &Ctx,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
    ) -> Option<Attrs>;
    fn value_error(&mut self, attrs: &Attrs, key: &str, message: String, help: &str);
    /// The instances a `for_each` value makes, by key.
    fn for_each_instances(&self, v: &Value) -> Result<Vec<(String, Value)>, String>;
    /// Refuse a `for_each` derived from a sensitive value (its keys would be addresses).
    /// `None` when refused.
    fn refuse_sensitive_for_each(
        &mut self,
        fe: &hcl_edit::structure::Attribute,
        what: &str,
    ) -> Option<()>;
    /// Refuse an attribute that names something and is derived from a sensitive value.
    /// False when refused.
    fn refuse_sensitive_name(&mut self, attrs: &Attrs, key: &str) -> bool;
    /// The SSH host of a node (`node.a`), when that node is known.
    fn node_host(&self, node: &str) -> Option<String>;
    /// What the machines said before this evaluation (empty when nothing was observed).
    #[allow(dead_code)] // the seam for kinds whose values come from the machines (model revisions)
    fn readings(&self) -> &Readings;
    /// The address `address` had before the root module's `moved` blocks renamed it (itself
    /// when none did): what is derived from an address (a container's default name) stays
    /// what it was, so the move restarts nothing.
    fn address_before_moves(&self, address: &str) -> String;
    /// A resource of the module instance.
    fn add_resource(&mut self, r: Resource);
    fn add_network(&mut self, n: Network);
}

/// A kind's lowering: one top-level block into its resources and the value others reference.
pub type Lower = fn(&mut dyn Engine<'_>) -> Option<ItemValue>;

/// One kind's entry in the evaluation's list of lowerings: each kind's folder makes its own
/// (`kinds::register!`), so the evaluation names no kind.
pub struct LoweringRegistration {
    pub id: KindId,
    pub lower: Lower,
}

/// Every kind's lowering, gathered at link time from the kinds' folders.
#[linkme::distributed_slice]
pub static LOWERINGS: [LoweringRegistration];

/// How a kind's top-level block becomes resources. Every kind of `KindId::ALL` has a lowering
/// (the test `every_kind_has_one_lowering` guards it); one missing is a bug in the build.
pub fn lower(kind: KindId) -> Lower {
    match LOWERINGS.iter().find(|r| r.id == kind) {
        Some(r) => r.lower,
        None => panic!(
            "resource kind `{}` has no lowering: a bug in sparkform",
            kind.as_str()
        ),
    }
}

pub fn span_of(file: &Arc<SourceFile>, range: Option<std::ops::Range<usize>>) -> Span {
    Span::new(file, range.unwrap_or(0..0))
}

/// The span of `kind "label" {`, which reads better in a report than the whole block.
pub fn header_span(file: &Arc<SourceFile>, block: &Block) -> Span {
    let start = block
        .ident
        .span()
        .map(|r| r.start)
        .or_else(|| block.span().map(|r| r.start))
        .unwrap_or(0);
    let end = block
        .labels
        .last()
        .and_then(|l| l.span())
        .map(|r| r.end)
        .or_else(|| block.ident.span().map(|r| r.end))
        .unwrap_or(start);
    Span::new(file, start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind enters its lowering from its folder (`kinds::register!`), once.
    #[test]
    fn every_kind_has_one_lowering() {
        for k in KindId::ALL {
            let n = LOWERINGS.iter().filter(|r| r.id == *k).count();
            assert_eq!(n, 1, "{k}: lowerings");
        }
        assert_eq!(LOWERINGS.len(), KindId::ALL.len());
    }
}

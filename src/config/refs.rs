//! Finding the references and function calls in an expression, with their spans.

use std::ops::Range;

use hcl_edit::expr::{Expression, ForExpr, FuncCall, Traversal, TraversalOperator};
use hcl_edit::template::ForDirective;
use hcl_edit::visit::{self, Visit};
use hcl_edit::Span as _;

/// One step of a reference path that is known without evaluating anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefStep {
    /// `.name` or `["name"]`
    Key(String),
    /// `[0]` or `.0`
    Index(u64),
}

/// A reference such as `network.roce.attach.spark1.address`.
#[derive(Debug, Clone)]
pub struct Ref {
    pub root: String,
    /// The static prefix of the path; it stops at the first step that needs evaluation.
    pub path: Vec<RefStep>,
    /// Whether the path continues past `path` with dynamic steps (an index expression, a splat).
    pub dynamic_tail: bool,
    /// Whether that dynamic step is `[each.key]`: within one instance of a `for_each` block
    /// the reference names that key's instance alone (its dependencies are that instance's).
    pub each_key_next: bool,
    /// Byte range of the whole traversal.
    pub span: Range<usize>,
    /// Byte ranges of the root and of each static step, for precise labels.
    pub step_spans: Vec<Range<usize>>,
}

impl Ref {
    /// The reference written out, as far as it is static: `node.spark1.address`.
    pub fn display(&self, steps: usize) -> String {
        let mut s = self.root.clone();
        for step in self.path.iter().take(steps) {
            match step {
                RefStep::Key(k) if is_ident(k) => {
                    s.push('.');
                    s.push_str(k);
                }
                RefStep::Key(k) => s.push_str(&format!("[{k:?}]")),
                RefStep::Index(i) => s.push_str(&format!("[{i}]")),
            }
        }
        s
    }

    pub fn first_key(&self) -> Option<&str> {
        match self.path.first() {
            Some(RefStep::Key(k)) => Some(k),
            _ => None,
        }
    }
}

/// Whether `e` is `each.key`.
fn is_each_key(e: &Expression) -> bool {
    let Expression::Traversal(t) = e else {
        return false;
    };
    matches!(&t.expr, Expression::Variable(v) if v.as_str() == "each")
        && t.operators.len() == 1
        && matches!(t.operators[0].value(), TraversalOperator::GetAttr(id) if id.as_str() == "key")
}

pub fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[derive(Debug, Clone)]
pub struct FuncRef {
    pub name: String,
    pub span: Range<usize>,
}

#[derive(Debug, Default)]
pub struct Collected {
    pub refs: Vec<Ref>,
    pub funcs: Vec<FuncRef>,
}

/// Collect every free reference (not bound by a `for`) and every function call of an expression.
pub fn collect(expr: &Expression) -> Collected {
    let mut c = Collector::default();
    c.visit_expr(expr);
    c.out
}

#[derive(Default)]
struct Collector {
    out: Collected,
    bound: Vec<String>,
}

impl Collector {
    fn is_bound(&self, name: &str) -> bool {
        self.bound.iter().any(|b| b == name)
    }
}

impl Visit for Collector {
    fn visit_expr(&mut self, expr: &Expression) {
        if let Expression::Variable(v) = expr {
            if !self.is_bound(v.as_str()) {
                let span = v.span().unwrap_or(0..0);
                self.out.refs.push(Ref {
                    root: v.as_str().to_string(),
                    path: Vec::new(),
                    dynamic_tail: false,
                    each_key_next: false,
                    span: span.clone(),
                    step_spans: vec![span],
                });
            }
            return;
        }
        visit::visit_expr(self, expr);
    }

    fn visit_traversal(&mut self, t: &Traversal) {
        let Expression::Variable(root) = &t.expr else {
            visit::visit_traversal(self, t);
            return;
        };
        for op in &t.operators {
            if let TraversalOperator::Index(e) = op.value() {
                self.visit_expr(e);
            }
        }
        if self.is_bound(root.as_str()) {
            return;
        }
        let root_span = root.span().unwrap_or(0..0);
        let mut r = Ref {
            root: root.as_str().to_string(),
            path: Vec::new(),
            dynamic_tail: false,
            each_key_next: false,
            span: t.span().unwrap_or(root_span.clone()),
            step_spans: vec![root_span],
        };
        for op in &t.operators {
            let span = op.span().unwrap_or(0..0);
            let step = match op.value() {
                TraversalOperator::GetAttr(id) => Some(RefStep::Key(id.as_str().to_string())),
                TraversalOperator::Index(Expression::String(s)) => {
                    Some(RefStep::Key(s.value().to_string()))
                }
                TraversalOperator::Index(Expression::Number(n)) => {
                    n.value().as_u64().map(RefStep::Index)
                }
                TraversalOperator::LegacyIndex(i) => Some(RefStep::Index(*i.value())),
                _ => None,
            };
            match step {
                Some(step) => {
                    r.path.push(step);
                    r.step_spans.push(span);
                }
                None => {
                    r.dynamic_tail = true;
                    r.each_key_next =
                        matches!(op.value(), TraversalOperator::Index(e) if is_each_key(e));
                    break;
                }
            }
        }
        self.out.refs.push(r);
    }

    fn visit_func_call(&mut self, call: &FuncCall) {
        self.out.funcs.push(FuncRef {
            name: call.name.name.as_str().to_string(),
            span: call.name.name.span().unwrap_or(0..0),
        });
        visit::visit_func_call(self, call);
    }

    fn visit_for_expr(&mut self, f: &ForExpr) {
        self.visit_expr(&f.intro.collection_expr);
        let n = self.bound.len();
        if let Some(k) = &f.intro.key_var {
            self.bound.push(k.as_str().to_string());
        }
        self.bound.push(f.intro.value_var.as_str().to_string());
        if let Some(k) = &f.key_expr {
            self.visit_expr(k);
        }
        self.visit_expr(&f.value_expr);
        if let Some(c) = &f.cond {
            self.visit_expr(&c.expr);
        }
        self.bound.truncate(n);
    }

    fn visit_for_directive(&mut self, d: &ForDirective) {
        let f = &d.for_expr;
        self.visit_expr(&f.collection_expr);
        let n = self.bound.len();
        if let Some(k) = &f.key_var {
            self.bound.push(k.as_str().to_string());
        }
        self.bound.push(f.value_var.as_str().to_string());
        self.visit_template(&f.template);
        self.bound.truncate(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(src: &str) -> Vec<String> {
        let e = hcl_edit::parser::parse_expr(src).unwrap();
        collect(&e)
            .refs
            .iter()
            .map(|r| format!("{}{}", r.display(99), if r.dynamic_tail { "…" } else { "" }))
            .collect()
    }

    #[test]
    fn static_and_dynamic_paths() {
        assert_eq!(
            refs("network.roce.attach.spark1.address"),
            ["network.roce.attach.spark1.address"]
        );
        assert_eq!(
            refs("var.net.attach[var.head.name].address"),
            ["var.head.name", "var.net.attach…"]
        );
        assert_eq!(refs("x[\"a b\"][0]"), ["x[\"a b\"][0]"]);
    }

    #[test]
    fn for_variables_are_not_references() {
        assert_eq!(
            refs("{ for k, n in var.workers : n.name => k if n.gpus > 0 }"),
            ["var.workers"]
        );
        assert_eq!(
            refs("\"%{ for w in var.ws }${w}-${local.s}%{ endfor }\""),
            ["var.ws", "local.s"]
        );
    }

    #[test]
    fn functions_are_collected() {
        let e = hcl_edit::parser::parse_expr("cidrhost(var.subnet, length(var.x))").unwrap();
        let c = collect(&e);
        let names: Vec<_> = c.funcs.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["cidrhost", "length"]);
    }
}

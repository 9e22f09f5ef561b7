//! Guarding an expression before hcl-rs evaluates it.
//!
//! hcl-rs does arithmetic inside its evaluator with unchecked integer operations (a product
//! wraps, `x % 0` panics, `0/0` gives NaN) and copies values without limit. [`guard`] rewrites
//! the expression tree so that each arithmetic operation becomes a call of a checked internal
//! function, and each reference, function result, template and `for` collection passes through
//! one that charges the evaluation budget of [`super::limits`]. Evaluation itself stays hcl-rs's.

use hcl::eval::{Context, Error as EvalError, ErrorKind, FuncArgs, FuncDef, ParamType};
use hcl::expr::{
    BinaryOp, BinaryOperator, Conditional, Expression, ForExpr, FuncCall, FuncName, ObjectKey,
    Operation, TemplateExpr, Traversal, TraversalOperator,
};
use hcl::template::{Directive, Element, Template};
use hcl::{Number, Value};

use super::limits;

/// Every internal name starts with this; no user function can (they are checked against the
/// function table before evaluation), and messages drop the wrapper.
const PREFIX: &str = "__sf_";
const VAL: &str = "__sf_val";
const ITER: &str = "__sf_iter";

/// The guarded form of `expr`: same value where hcl-rs is right, an error where it would wrap,
/// panic, produce NaN or exceed a budget.
pub fn guard(expr: Expression) -> Expression {
    rewrite(expr)
}

/// The message of an evaluation error, without the internal wrappers' names.
pub fn message(e: &EvalError) -> String {
    match e.kind() {
        ErrorKind::FuncCall(name, msg) if name.name.as_str().starts_with(PREFIX) => msg.clone(),
        other => other.to_string(),
    }
}

/// The message of an evaluation error in an expression that uses a sensitive value: what went
/// wrong, never the values involved (a function's own message quotes its arguments).
pub fn sensitive_message(e: &EvalError) -> String {
    const S: &str = crate::diag::SENSITIVE_VALUE;
    match e.kind() {
        // Budget, overflow and division messages name the source text, not values.
        ErrorKind::FuncCall(name, msg) if name.name.as_str().starts_with(PREFIX) => msg.clone(),
        ErrorKind::FuncCall(name, _) => format!(
            "`{name}()` failed on an argument derived from a sensitive value (its message would show it)"
        ),
        ErrorKind::UndefinedVar(_) | ErrorKind::UndefinedFunc(_) | ErrorKind::Index(_) => {
            e.kind().to_string()
        }
        ErrorKind::Unexpected(_, expected) => format!("unexpected {S}, expected {expected}"),
        ErrorKind::UnaryOp(op, _) => format!("unary operator `{op}` is not applicable to {S}"),
        ErrorKind::BinaryOp(_, op, _) => {
            format!("operator `{op}` is not applicable to its operands ({S})")
        }
        ErrorKind::NoSuchKey(_) => format!("no such key: {S}"),
        ErrorKind::KeyExists(_) => format!("duplicate key: {S}"),
        _ => format!("the expression failed on {S}"),
    }
}

/// A context with only the internal functions, for blocks that call no function of their own.
pub fn context() -> Context<'static> {
    thread_local! {
        static INTERNAL: Context<'static> = {
            let mut c = Context::new();
            declare(&mut c);
            c
        };
    }
    INTERNAL.with(Context::clone)
}

type Func = fn(FuncArgs) -> Result<Value, String>;

const INTERNAL: &[(&str, Func)] = &[
    (VAL, val),
    (ITER, iter),
    ("__sf_add", |a| binary(a, Op::Add)),
    ("__sf_sub", |a| binary(a, Op::Sub)),
    ("__sf_mul", |a| binary(a, Op::Mul)),
    ("__sf_div", |a| binary(a, Op::Div)),
    ("__sf_mod", |a| binary(a, Op::Mod)),
];

/// Declare the internal functions on `ctx` (the full function table includes them).
pub fn declare(ctx: &mut Context<'_>) {
    for (name, f) in INTERNAL {
        ctx.declare_func(
            *name,
            FuncDef::builder()
                .params([ParamType::String, ParamType::Any])
                .variadic_param(ParamType::Any)
                .build(*f),
        );
    }
}

fn call(name: &str, what: String, args: impl IntoIterator<Item = Expression>) -> Expression {
    let mut b = FuncCall::builder(FuncName::new(name)).arg(Expression::String(what));
    for a in args {
        b = b.arg(a);
    }
    Expression::FuncCall(Box::new(b.build()))
}

/// Source text of an expression for messages, at most 60 characters.
fn text(e: &Expression) -> String {
    let full = hcl::format::to_string(e).unwrap_or_else(|_| "expression".into());
    let one_line: String = full.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::diag::clip(&one_line, 60)
}

fn rewrite(e: Expression) -> Expression {
    match e {
        Expression::Array(items) => Expression::Array(items.into_iter().map(rewrite).collect()),
        Expression::Object(obj) => Expression::Object(
            obj.into_iter()
                .map(|(k, v)| {
                    let k = match k {
                        ObjectKey::Expression(k) => ObjectKey::Expression(rewrite(k)),
                        other => other,
                    };
                    (k, rewrite(v))
                })
                .collect(),
        ),
        Expression::TemplateExpr(t) => rewrite_template(*t),
        Expression::Variable(v) => {
            let what = format!("`{}`", v.as_str());
            call(VAL, what, [Expression::Variable(v)])
        }
        Expression::Traversal(t) => {
            let Traversal { expr, operators } = *t;
            // `local.a.b`: hcl-rs copies `local` first, but an item's context holds only the
            // parts it references, so the result is what the reference costs.
            let named = match &expr {
                Expression::Variable(v) => Some(traversal_text(v.as_str(), &operators)),
                _ => None,
            };
            let operators = operators
                .into_iter()
                .map(|op| match op {
                    TraversalOperator::Index(i) => TraversalOperator::Index(rewrite(i)),
                    other => other,
                })
                .collect();
            match named {
                Some(what) => call(
                    VAL,
                    what,
                    [Expression::Traversal(Box::new(Traversal {
                        expr,
                        operators,
                    }))],
                ),
                None => Expression::Traversal(Box::new(Traversal {
                    expr: rewrite(expr),
                    operators,
                })),
            }
        }
        Expression::FuncCall(f) => {
            let mut f = *f;
            let what = format!("`{}()`", f.name.name.as_str());
            f.args = f.args.into_iter().map(rewrite).collect();
            call(VAL, what, [Expression::FuncCall(Box::new(f))])
        }
        Expression::Parenthesis(p) => Expression::Parenthesis(Box::new(rewrite(*p))),
        Expression::Conditional(c) => {
            let c = *c;
            Expression::Conditional(Box::new(Conditional {
                cond_expr: rewrite(c.cond_expr),
                true_expr: rewrite(c.true_expr),
                false_expr: rewrite(c.false_expr),
            }))
        }
        Expression::Operation(op) => match *op {
            Operation::Unary(mut u) => {
                u.expr = rewrite(u.expr);
                Expression::Operation(Box::new(Operation::Unary(u)))
            }
            Operation::Binary(b) => rewrite_binary(b),
        },
        Expression::ForExpr(f) => {
            let f = *f;
            let what = format!("`for` over `{}`", text(&f.collection_expr));
            let out = ForExpr {
                key_var: f.key_var,
                value_var: f.value_var,
                collection_expr: call(ITER, what.clone(), [rewrite(f.collection_expr)]),
                key_expr: f.key_expr.map(rewrite),
                value_expr: rewrite(f.value_expr),
                grouping: f.grouping,
                cond_expr: f.cond_expr.map(rewrite),
            };
            call(VAL, what, [Expression::ForExpr(Box::new(out))])
        }
        other => other,
    }
}

/// `` `local.a.b[…]` `` for messages, without formatting the whole expression.
fn traversal_text(root: &str, ops: &[TraversalOperator]) -> String {
    let mut out = format!("`{root}");
    for op in ops.iter().take(8) {
        match op {
            TraversalOperator::GetAttr(id) => {
                out.push('.');
                out.push_str(id.as_str());
            }
            TraversalOperator::LegacyIndex(i) => out.push_str(&format!(".{i}")),
            TraversalOperator::AttrSplat | TraversalOperator::FullSplat => out.push_str("[*]"),
            TraversalOperator::Index(_) => out.push_str("[…]"),
        }
    }
    out.push('`');
    crate::diag::clip(&out, 80)
}

fn rewrite_binary(b: BinaryOp) -> Expression {
    let name = match b.operator {
        BinaryOperator::Plus => "__sf_add",
        BinaryOperator::Minus => "__sf_sub",
        BinaryOperator::Mul => "__sf_mul",
        BinaryOperator::Div => "__sf_div",
        BinaryOperator::Mod => "__sf_mod",
        _ => {
            return Expression::Operation(Box::new(Operation::Binary(BinaryOp {
                lhs_expr: rewrite(b.lhs_expr),
                operator: b.operator,
                rhs_expr: rewrite(b.rhs_expr),
            })))
        }
    };
    let what = format!(
        "`{}`",
        text(&Expression::Operation(Box::new(Operation::Binary(
            b.clone()
        ))))
    );
    call(name, what, [rewrite(b.lhs_expr), rewrite(b.rhs_expr)])
}

fn rewrite_template(t: TemplateExpr) -> Expression {
    // A template that does not parse is left for hcl-rs to report.
    let Ok(mut template) = Template::from_expr(&t) else {
        return Expression::TemplateExpr(Box::new(t));
    };
    rewrite_elements(&mut template);
    let raw = template.to_string();
    let t = match t {
        TemplateExpr::QuotedString(_) => TemplateExpr::QuotedString(raw),
        TemplateExpr::Heredoc(mut h) => {
            h.template = raw;
            TemplateExpr::Heredoc(h)
        }
    };
    call(
        VAL,
        "a string template".into(),
        [Expression::TemplateExpr(Box::new(t))],
    )
}

fn rewrite_elements(t: &mut Template) {
    for el in t.elements_mut() {
        match el {
            Element::Literal(_) => {}
            Element::Interpolation(i) => take_rewrite(&mut i.expr),
            Element::Directive(d) => match &mut **d {
                Directive::If(d) => {
                    take_rewrite(&mut d.cond_expr);
                    rewrite_elements(&mut d.true_template);
                    if let Some(f) = &mut d.false_template {
                        rewrite_elements(f);
                    }
                }
                Directive::For(d) => {
                    let what = format!("`for` over `{}`", text(&d.collection_expr));
                    let coll = std::mem::replace(&mut d.collection_expr, Expression::Null);
                    d.collection_expr = call(ITER, what, [rewrite(coll)]);
                    rewrite_elements(&mut d.template);
                }
            },
        }
    }
}

fn take_rewrite(e: &mut Expression) {
    let inner = std::mem::replace(e, Expression::Null);
    *e = rewrite(inner);
}

/// `(what, value)`: what the value is, for messages.
fn what_and_value(args: FuncArgs) -> (String, Value) {
    let mut values = args.into_values().into_iter();
    let what = match values.next() {
        Some(Value::String(s)) => s,
        _ => String::from("an expression"),
    };
    (what, values.next().unwrap_or(Value::Null))
}

fn val(args: FuncArgs) -> Result<Value, String> {
    let (what, v) = what_and_value(args);
    limits::admit(&what, &v, 1)?;
    Ok(v)
}

fn iter(args: FuncArgs) -> Result<Value, String> {
    let (what, v) = what_and_value(args);
    let n = match &v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 1,
    };
    limits::admit(&what, &v, n as u64 + 1)?;
    Ok(v)
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

impl Op {
    fn symbol(self) -> &'static str {
        match self {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "*",
            Op::Div => "/",
            Op::Mod => "%",
        }
    }
}

fn binary(args: FuncArgs, op: Op) -> Result<Value, String> {
    let mut it = args.into_values().into_iter();
    let what = match it.next() {
        Some(Value::String(s)) => s,
        _ => String::from("an operation"),
    };
    limits::charge_steps(&what, 1)?;
    match (it.next(), it.next()) {
        (Some(Value::Number(a)), Some(Value::Number(b))) => {
            checked(&what, op, a, b).map(Value::Number)
        }
        (a, b) => Err(format!(
            "{what}: `{}` needs two numbers, got {} and {}",
            op.symbol(),
            kind(a.as_ref()),
            kind(b.as_ref())
        )),
    }
}

fn kind(v: Option<&Value>) -> &'static str {
    match v {
        None | Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "a bool",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "a list",
        Some(Value::Object(_)) => "an object",
    }
}

fn int(n: &Number) -> Option<i128> {
    if n.is_f64() {
        return None;
    }
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

fn from_int(what: &str, i: i128) -> Result<Number, String> {
    if let Ok(v) = i64::try_from(i) {
        return Ok(Number::from(v));
    }
    if let Ok(v) = u64::try_from(i) {
        return Ok(Number::from(v));
    }
    Err(format!(
        "{what}: integer overflow (the result is outside the 64-bit range)"
    ))
}

fn from_float(what: &str, x: f64) -> Result<Number, String> {
    Number::from_f64(x)
        .ok_or_else(|| format!("{what}: the result is not a finite number (NaN or infinity)"))
}

/// hcl-rs's semantics (integers stay integers, `/` of integers that do not divide is a float),
/// with every overflow, division by zero and non-finite result an error.
fn checked(what: &str, op: Op, a: Number, b: Number) -> Result<Number, String> {
    let zero = |x: &Number| int(x) == Some(0) || x.as_f64() == Some(0.0);
    if matches!(op, Op::Div | Op::Mod) && zero(&b) {
        let verb = if op == Op::Div { "division" } else { "modulo" };
        return Err(format!("{what}: {verb} by zero"));
    }
    if let (Some(x), Some(y)) = (int(&a), int(&b)) {
        let r = match op {
            Op::Add => x.checked_add(y),
            Op::Sub => x.checked_sub(y),
            Op::Mul => x.checked_mul(y),
            Op::Mod => x.checked_rem(y),
            Op::Div => match x.checked_rem(y) {
                Some(0) => x.checked_div(y),
                // Not a whole quotient: a float, as hcl-rs computes it.
                _ => {
                    #[allow(clippy::cast_precision_loss)]
                    let q = x as f64 / y as f64;
                    return from_float(what, q);
                }
            },
        };
        return from_int(what, r.unwrap_or(i128::MAX));
    }
    let (x, y) = (
        a.as_f64().unwrap_or(f64::NAN),
        b.as_f64().unwrap_or(f64::NAN),
    );
    let r = match op {
        Op::Add => x + y,
        Op::Sub => x - y,
        Op::Mul => x * y,
        Op::Div => x / y,
        Op::Mod => x % y,
    };
    from_float(what, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcl::eval::Evaluate;

    fn ctx() -> Context<'static> {
        let mut c = Context::new();
        crate::config::functions::declare_all(&mut c);
        c.declare_var("big", Value::from(u64::MAX));
        c
    }

    fn eval(src: &str, guarded: bool) -> Result<Value, String> {
        let _b = limits::Budget::begin();
        let expr: Expression = src.parse().map_err(|e| format!("{e}"))?;
        let expr = if guarded { guard(expr) } else { expr };
        expr.evaluate(&ctx()).map_err(|e| message(&e))
    }

    #[test]
    fn guarded_expressions_keep_their_values() {
        let cases = [
            "1 + 2 * 3 - 4",
            "7 / 2",
            "6 / 3",
            "-5 % 3",
            "2.5 * 2",
            "(1 + 2) == 3 && !false",
            "\"a${1 + 1}b\"",
            "\"${1 + 1}\"",
            "\"q\\\"uote\\\\ $${x} %%{y} \\n\"",
            "\"%{ if 1 + 1 == 2 }yes%{ else }no%{ endif }\"",
            "\"%{ for i in [1, 2] }${i * 10},%{ endfor }\"",
            "\"a ${~ \"b\" ~} c\"",
            "<<EOT\nsay \"hi\" \\n ${1 + 2} $${x}\n%{ for i in [1, 2] }<${i}>%{ endfor }\nEOT",
            "<<-EOT\n    indented ${upper(\"x\")}\n      more\n    EOT",
            "[for x in [1, 2, 3] : x * 2 if x > 1]",
            "{ for k, v in { a = 1, b = 2 } : k => v + 1 }",
            "{ for v in [1, 1, 2] : v => v... }",
            "[{ a = 1 }, { a = 2 }][*].a",
            "{ a = { b = [1, 2] } }.a.b[1 + 0]",
            "true ? upper(\"x\") : lower(\"Y\")",
            "big - 1",
            "-big",
            "9223372036854775807 + 1",
            "join(\",\", [for i in range(3) : format(\"%d\", i)])",
        ];
        for src in cases {
            let plain = eval(src, false);
            assert!(plain.is_ok(), "{src}: {plain:?}");
            assert_eq!(eval(src, true), plain, "{src}");
        }
    }

    fn small_expr() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            (-9i64..10).prop_map(|n| n.to_string()),
            Just("2.5".to_string()),
            "[a-z \\\\\"$%{}~]{0,6}".prop_map(|s| format!("{s:?}")),
            Just("true".to_string()),
            Just("[1, 2]".to_string()),
            Just("{ a = 1 }".to_string()),
        ];
        leaf.prop_recursive(3, 24, 3, |inner| {
            let op = prop_oneof![Just("+"), Just("-"), Just("*"), Just("=="), Just("<")];
            prop_oneof![
                (inner.clone(), op, inner.clone()).prop_map(|(a, o, b)| format!("({a} {o} {b})")),
                inner
                    .clone()
                    .prop_map(|e| format!("\"<${{{e}}}> $${{x}} %%{{y}}\"")),
                inner
                    .clone()
                    .prop_map(|e| format!("<<EOT\n  \"q\" ${{{e}}} \\n\nEOT\n")),
                inner
                    .clone()
                    .prop_map(|e| format!("<<-EOT\n    a ${{~ {e} ~}} b\n    EOT\n")),
                (inner.clone(), inner.clone()).prop_map(|(c, e)| format!("[for x in [{c}] : {e}]")),
                inner.clone().prop_map(|e| format!(
                    "\"%{{ for i in [1, 2] }}${{i}}:${{{e}}}%{{ endfor }}\""
                )),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!(
                    "\"%{{ if {a} == {b} }}y%{{ else }}n%{{ endif }}\""
                )),
                inner.clone().prop_map(|e| format!("tostring({e})")),
                inner.prop_map(|e| format!("{{ k = {e} }}.k")),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, failure_persistence: None, ..Default::default() })]

        /// Wherever hcl-rs gives a value (small numbers: nothing overflows), the guarded
        /// expression gives the same one: templates and heredocs survive the round trip.
        #[test]
        fn guarding_never_changes_a_value(src in small_expr()) {
            if let Ok(plain) = eval(&src, false) {
                proptest::prop_assert_eq!(eval(&src, true), Ok(plain), "{}", src);
            }
        }
    }

    #[test]
    fn arithmetic_errors_instead_of_wrapping_panicking_or_nan() {
        for (src, needle) in [
            ("7 % 0", "`7 % 0`: modulo by zero"),
            ("7 / 0", "division by zero"),
            ("0 / 0", "division by zero"),
            ("1.5 % 0.0", "modulo by zero"),
            ("big * big + 22", "integer overflow"),
            ("big + 1", "integer overflow"),
            ("-9223372036854775807 - 10 - big", "integer overflow"),
            ("1e308 * 10", "not a finite number"),
            (
                "\"a\" + 1",
                "`+` needs two numbers, got a string and a number",
            ),
            ("\"${5 % 0}\"", "modulo by zero"),
            ("[for x in [0] : 1 / x]", "division by zero"),
            ("{ a = 1 % 0 }", "modulo by zero"),
        ] {
            let e = eval(src, true).expect_err(src);
            assert!(e.contains(needle), "{src}: {e}");
            assert!(!e.contains(PREFIX), "{src}: internal name in {e}");
        }
    }

    #[test]
    fn budgets_stop_amplifying_expressions() {
        let doubling = "[for i in range(1000) : join(\"\", [for j in range(1000) : format(\"%1000s\", \"x\")])]";
        let e = eval(doubling, true).expect_err("doubling");
        assert!(e.contains("limit"), "{e}");
    }
}

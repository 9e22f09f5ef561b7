//! Built-in functions available in sparkform HCL expressions.
//!
//! The functions follow Terraform's semantics where practical. Every function
//! is declared with `ParamType::Any` parameters and checks its own argument
//! types, so that type errors carry a message naming the function and what it
//! expected (e.g. `cidrhost: "192.168.300.0/24" is not a valid CIDR prefix`).
//! Like Terraform, primitive values are converted where a different primitive
//! is expected: a number or bool is accepted where a string is expected, and a
//! numeric string where a number is expected.
//!
//! No function panics on any input: bad types or values yield `Err(String)`.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use hcl::eval::{Context, FuncArgs, FuncDef, ParamType};
use hcl::{Map, Number, Value};
use ipnet::IpNet;
use regex::Regex;
use sha2::{Digest, Sha256};

use super::limits;

mod collections;
mod encoding;
mod network;
mod numbers;
mod strings;

use collections::*;
use encoding::*;
use network::*;
use numbers::*;
use strings::*;

type Func = fn(FuncArgs) -> Result<Value, String>;

/// How a function is declared: `required` positional parameters, plus any
/// number of extra arguments when `variadic` is set (functions with optional
/// parameters check the upper bound themselves).
struct Spec {
    name: &'static str,
    func: Func,
    required: usize,
    variadic: bool,
}

const fn spec(name: &'static str, func: Func, required: usize, variadic: bool) -> Spec {
    Spec {
        name,
        func,
        required,
        variadic,
    }
}

const SPECS: &[Spec] = &[
    spec("abs", abs, 1, false),
    spec("base64decode", base64decode, 1, false),
    spec("base64encode", base64encode, 1, false),
    spec("ceil", ceil, 1, false),
    spec("chomp", chomp, 1, false),
    spec("cidrcontains", cidrcontains, 2, false),
    spec("cidrhost", cidrhost, 2, false),
    spec("cidrnetmask", cidrnetmask, 1, false),
    spec("cidrsubnet", cidrsubnet, 3, false),
    spec("coalesce", coalesce, 0, true),
    spec("compact", compact, 1, false),
    spec("concat", concat, 0, true),
    spec("contains", contains, 2, false),
    spec("distinct", distinct, 1, false),
    spec("element", element, 2, false),
    spec("endswith", endswith, 2, false),
    spec("file", file, 1, false),
    spec("flatten", flatten, 1, false),
    spec("floor", floor, 1, false),
    spec("format", format, 1, true),
    spec("index", index, 2, false),
    spec("join", join, 1, true),
    spec("jsondecode", jsondecode, 1, false),
    spec("jsonencode", jsonencode, 1, false),
    spec("keys", keys, 1, false),
    spec("length", length, 1, false),
    spec("lookup", lookup, 2, true),
    spec("lower", lower, 1, false),
    spec("max", max, 0, true),
    spec("merge", merge, 0, true),
    spec("min", min, 0, true),
    spec("range", range, 1, true),
    spec("regex", regex, 2, false),
    spec("regexall", regexall, 2, false),
    spec("replace", replace, 3, false),
    spec("reverse", reverse, 1, false),
    spec("sha256", sha256, 1, false),
    spec("slice", slice, 3, false),
    spec("split", split, 2, false),
    spec("startswith", startswith, 2, false),
    spec("substr", substr, 3, false),
    spec("sum", sum, 1, false),
    spec("tobool", tobool, 1, false),
    spec("tolist", tolist, 1, false),
    spec("tomap", tomap, 1, false),
    spec("tonumber", tonumber, 1, false),
    spec("toset", toset, 1, false),
    spec("tostring", tostring, 1, false),
    spec("trim", trim, 2, false),
    spec("trimprefix", trimprefix, 2, false),
    spec("trimspace", trimspace, 1, false),
    spec("trimsuffix", trimsuffix, 2, false),
    spec("upper", upper, 1, false),
    spec("values", values, 1, false),
    spec("zipmap", zipmap, 2, false),
];

/// Names of all functions, for did-you-mean suggestions (sorted).
pub const FUNCTION_NAMES: &[&str] = &[
    "abs",
    "base64decode",
    "base64encode",
    "ceil",
    "chomp",
    "cidrcontains",
    "cidrhost",
    "cidrnetmask",
    "cidrsubnet",
    "coalesce",
    "compact",
    "concat",
    "contains",
    "distinct",
    "element",
    "endswith",
    "file",
    "flatten",
    "floor",
    "format",
    "index",
    "join",
    "jsondecode",
    "jsonencode",
    "keys",
    "length",
    "lookup",
    "lower",
    "max",
    "merge",
    "min",
    "range",
    "regex",
    "regexall",
    "replace",
    "reverse",
    "sha256",
    "slice",
    "split",
    "startswith",
    "substr",
    "sum",
    "tobool",
    "tolist",
    "tomap",
    "tonumber",
    "toset",
    "tostring",
    "trim",
    "trimprefix",
    "trimspace",
    "trimsuffix",
    "upper",
    "values",
    "zipmap",
];

/// Declare every function on the context.
pub fn declare_all(ctx: &mut Context<'_>) {
    for s in SPECS {
        let mut builder =
            FuncDef::builder().params(std::iter::repeat_n(ParamType::Any, s.required));
        if s.variadic {
            builder = builder.variadic_param(ParamType::Any);
        }
        ctx.declare_func(s.name, builder.build(s.func));
    }
    super::arith::declare(ctx);
}

thread_local! {
    static BASE_DIR: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
}

/// Run `f` with `dir` as the folder that `file()` resolves relative paths
/// against. The previous folder is restored afterwards, even if `f` panics.
pub fn with_base_dir<T>(dir: &Path, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<PathBuf>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            BASE_DIR.with(|b| *b.borrow_mut() = prev);
        }
    }
    let prev = BASE_DIR.with(|b| b.replace(Some(dir.to_path_buf())));
    let _restore = Restore(prev);
    f()
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Upper bound for `range()` results and `format()` widths, so that a typo
/// cannot make us allocate gigabytes.
const MAX_RANGE: usize = 1024;
const MAX_WIDTH: usize = 1000;

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// A short description of a value for error messages: `string "abc"`,
/// `list [1,2]`, `null`.
fn describe(v: &Value) -> String {
    if v.is_null() {
        return "null".to_string();
    }
    let mut json = String::new();
    json_encode(v, &mut json);
    const LIMIT: usize = 60;
    if json.chars().count() > LIMIT {
        json = json.chars().take(LIMIT).collect::<String>() + "...";
    }
    format!("{} {}", type_name(v), json)
}

fn quote(s: &str) -> String {
    let mut out = String::new();
    json_string(s, &mut out);
    out
}

fn type_err(f: &str, what: &str, expected: &str, v: &Value) -> String {
    format!("{f}: {what} must be {expected}, got {}", describe(v))
}

fn arg<'a>(args: &'a FuncArgs, f: &str, i: usize) -> Result<&'a Value, String> {
    args.get(i)
        .ok_or_else(|| format!("{f}: missing argument {}", i + 1))
}

fn check_arity(args: &FuncArgs, f: &str, min: usize, max: usize) -> Result<(), String> {
    let n = args.len();
    if n < min || n > max {
        let expected = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(format!("{f}: expected {expected} arguments, got {n}"));
    }
    Ok(())
}

/// Terraform-style conversion of a primitive to a string.
fn prim_to_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn want_str(f: &str, what: &str, v: &Value) -> Result<String, String> {
    prim_to_string(v).ok_or_else(|| type_err(f, what, "a string", v))
}

fn parse_number(s: &str) -> Option<Number> {
    if let Ok(i) = s.parse::<i64>() {
        return Some(Number::from(i));
    }
    if let Ok(u) = s.parse::<u64>() {
        return Some(Number::from(u));
    }
    // Rust also parses "inf"/"nan"; `from_f64` rejects non-finite values.
    s.parse::<f64>().ok().and_then(Number::from_f64)
}

fn want_number(f: &str, what: &str, v: &Value) -> Result<Number, String> {
    match v {
        Value::Number(n) => Ok(*n),
        Value::String(s) => parse_number(s).ok_or_else(|| type_err(f, what, "a number", v)),
        _ => Err(type_err(f, what, "a number", v)),
    }
}

fn number_to_int(n: &Number) -> Option<i128> {
    if n.is_f64() {
        return None;
    }
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

fn want_int(f: &str, what: &str, v: &Value) -> Result<i128, String> {
    let n = want_number(f, what, v)?;
    number_to_int(&n).ok_or_else(|| type_err(f, what, "a whole number", v))
}

fn want_index(f: &str, what: &str, v: &Value) -> Result<usize, String> {
    let i = want_int(f, what, v)?;
    usize::try_from(i).map_err(|_| type_err(f, what, "a non-negative whole number", v))
}

fn number_f64(n: &Number) -> f64 {
    n.as_f64().unwrap_or(0.0)
}

fn int_to_number(f: &str, i: i128) -> Result<Number, String> {
    if let Ok(v) = i64::try_from(i) {
        return Ok(Number::from(v));
    }
    if let Ok(v) = u64::try_from(i) {
        return Ok(Number::from(v));
    }
    // Precision loss is acceptable here: the value is beyond 64 bits.
    #[allow(clippy::cast_precision_loss)]
    let float = i as f64;
    Number::from_f64(float).ok_or_else(|| format!("{f}: result {i} is out of range"))
}

fn float_to_number(f: &str, x: f64) -> Result<Number, String> {
    Number::from_f64(x).ok_or_else(|| format!("{f}: result is not a finite number"))
}

fn want_list<'a>(f: &str, what: &str, v: &'a Value) -> Result<&'a Vec<Value>, String> {
    v.as_array().ok_or_else(|| type_err(f, what, "a list", v))
}

fn want_object<'a>(f: &str, what: &str, v: &'a Value) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| type_err(f, what, "an object", v))
}

fn sorted_keys(obj: &Map<String, Value>) -> Vec<&String> {
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    keys
}

/// Keeps the first of equal items. Values are not hashable, so their JSON text stands in for
/// them: comparing each item with every earlier one is quadratic, and lists can be long.
fn dedupe(items: &[Value]) -> Vec<Value> {
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    for item in items {
        let mut key = String::new();
        json_encode(item, &mut key);
        if seen.insert(key) {
            out.push(item.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcl::eval::Evaluate;

    fn eval_in(src: &str, vars: &[(&str, Value)]) -> Result<Value, String> {
        let expr: hcl::Expression = src
            .parse()
            .unwrap_or_else(|e| panic!("cannot parse {src}: {e}"));
        let mut ctx = Context::new();
        declare_all(&mut ctx);
        for (name, value) in vars {
            ctx.declare_var(*name, value.clone());
        }
        expr.evaluate(&ctx).map_err(|e| e.to_string())
    }

    fn eval(src: &str) -> Result<Value, String> {
        eval_in(src, &[])
    }

    /// Parse a literal HCL expression (no functions) as the expected value.
    fn lit(src: &str) -> Value {
        let expr: hcl::Expression = src.parse().expect("literal parses");
        expr.evaluate(&Context::new()).expect("literal evaluates")
    }

    #[track_caller]
    fn check(src: &str, expected: &str) {
        match eval(src) {
            Ok(v) => assert_eq!(v, lit(expected), "{src}"),
            Err(e) => panic!("{src} failed: {e}"),
        }
    }

    #[track_caller]
    fn check_err(src: &str, needle: &str) {
        match eval(src) {
            Ok(v) => panic!("{src} should fail, got {v:?}"),
            Err(e) => assert!(e.contains(needle), "{src}: error {e:?} lacks {needle:?}"),
        }
    }

    fn is_int(v: &Value) -> bool {
        matches!(v, Value::Number(n) if !n.is_f64())
    }

    #[test]
    fn names_match_declarations() {
        let names: Vec<&str> = SPECS.iter().map(|s| s.name).collect();
        assert_eq!(names, FUNCTION_NAMES);
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, names);
    }

    #[test]
    fn wrong_types_never_panic() {
        let samples = [
            "null",
            "true",
            "-3",
            "2.5",
            "\"\"",
            "\"x\"",
            "[]",
            "[1, \"a\", null]",
            "{}",
            "{a = [1]}",
        ];
        for name in FUNCTION_NAMES {
            if *name == "file" {
                continue;
            }
            for a in samples {
                let _ = eval(&format!("{name}({a})"));
                for b in samples {
                    let _ = eval(&format!("{name}({a}, {b})"));
                    let _ = eval(&format!("{name}({a}, {b}, {b})"));
                }
            }
        }
    }

    #[test]
    fn cidr_functions() {
        check(r#"cidrhost("192.168.200.0/24", 2)"#, r#""192.168.200.2""#);
        check(
            r#"cidrhost("192.168.200.0/24", -1)"#,
            r#""192.168.200.255""#,
        );
        check(r#"cidrhost("192.168.200.0/24", "5")"#, r#""192.168.200.5""#);
        check(r#"cidrhost("10.1.2.3/16", 258)"#, r#""10.1.1.2""#);
        check(r#"cidrhost("fd00::/64", 17)"#, r#""fd00::11""#);
        check(
            r#"cidrhost("::/0", -1)"#,
            r#""ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff""#,
        );
        check_err(
            r#"cidrhost("192.168.300.0/24", 2)"#,
            r#"cidrhost: "192.168.300.0/24" is not a valid CIDR prefix"#,
        );
        check_err(r#"cidrhost("10.0.0.0/30", 4)"#, "does not accommodate");
        check_err(r#"cidrhost("10.0.0.0/30", -5)"#, "does not accommodate");
        check_err(
            r#"cidrhost("10.0.0.0/24", 1.5)"#,
            "hostnum must be a whole number",
        );
        check_err(
            r#"cidrhost(["10.0.0.0/24"], 1)"#,
            "cidrhost: the prefix must be",
        );

        check(r#"cidrnetmask("10.0.0.0/24")"#, r#""255.255.255.0""#);
        check(r#"cidrnetmask("172.16.0.0/12")"#, r#""255.240.0.0""#);
        check_err(r#"cidrnetmask("fd00::/64")"#, "only IPv4");
        check_err(r#"cidrnetmask(1)"#, "cidrnetmask: the prefix must be");

        check(r#"cidrsubnet("10.0.0.0/16", 8, 2)"#, r#""10.0.2.0/24""#);
        check(
            r#"cidrsubnet("172.16.0.0/12", 4, 15)"#,
            r#""172.31.0.0/16""#,
        );
        check(r#"cidrsubnet("10.0.0.0/16", 0, 0)"#, r#""10.0.0.0/16""#);
        check(
            r#"cidrsubnet("fd00::/56", 8, 255)"#,
            r#""fd00:0:0:ff::/64""#,
        );
        check(r#"cidrsubnet("0.0.0.0/0", 32, 1)"#, r#""0.0.0.1/32""#);
        check_err(
            r#"cidrsubnet("10.0.0.0/16", 8, 256)"#,
            "does not accommodate",
        );
        check_err(
            r#"cidrsubnet("10.0.0.0/30", 4, 0)"#,
            "not enough address space",
        );
        check_err(
            r#"cidrsubnet("10.0.0.0/16", -1, 0)"#,
            "must not be negative",
        );
        check_err(
            r#"cidrsubnet("10.0.0.0/16", 8, -1)"#,
            "does not accommodate",
        );
        check_err(r#"cidrsubnet("nope", 8, 1)"#, "not a valid CIDR prefix");

        check(r#"cidrcontains("10.0.0.0/8", "10.2.3.4")"#, "true");
        check(r#"cidrcontains("10.0.0.0/8", "11.2.3.4")"#, "false");
        check(r#"cidrcontains("10.0.0.0/8", "10.1.0.0/16")"#, "true");
        check(r#"cidrcontains("10.1.0.0/16", "10.0.0.0/8")"#, "false");
        check(r#"cidrcontains("fd00::/8", "fd12::1")"#, "true");
        check_err(r#"cidrcontains("10.0.0.0/8", "fd00::1")"#, "address family");
        check_err(
            r#"cidrcontains("10.0.0.0/8", "10.0.0.300")"#,
            "not a valid IP address",
        );
        check_err(
            r#"cidrcontains("10.0.0.0/8", 5)"#,
            "cidrcontains: the second argument",
        );
    }

    #[test]
    fn collections() {
        check(
            "merge({a = 1, b = 2}, {b = 3, c = 4}, null)",
            "{a = 1, b = 3, c = 4}",
        );
        check("merge()", "{}");
        check_err(
            "merge({a = 1}, [1])",
            "merge: argument 2 must be an object, got list [1]",
        );

        check("concat([1, 2], [], [\"a\"])", "[1, 2, \"a\"]");
        check_err("concat([1], \"a\")", "concat: argument 2 must be a list");

        check("length([1, 2, 3])", "3");
        check("length({a = 1})", "1");
        check("length(\"héllo\")", "5");
        check_err(
            "length(5)",
            "length: the argument must be a list, object or string",
        );
        check_err("length(null)", "got null");

        check("keys({b = 1, a = 2, c = 3})", r#"["a", "b", "c"]"#);
        check("values({b = 1, a = 2, c = 3})", "[2, 1, 3]");
        check_err("keys([1])", "keys: the argument must be an object");
        check_err("values(\"x\")", "values: the argument must be an object");

        check("lookup({a = 1}, \"a\")", "1");
        check("lookup({a = 1}, \"b\", 7)", "7");
        check("lookup({a = null}, \"a\", 7)", "null");
        check_err("lookup({a = 1}, \"b\")", "lookup: key \"b\" not found");
        check_err(
            "lookup([1], \"b\", 2)",
            "lookup: the first argument must be an object",
        );
        check_err(
            "lookup({}, \"a\", 1, 2)",
            "lookup: expected 2 to 3 arguments, got 4",
        );

        check("contains([1, 2], 2)", "true");
        check("contains([\"a\"], \"b\")", "false");
        check_err(
            "contains(\"abc\", \"a\")",
            "contains: the first argument must be a list",
        );

        check("tolist([1, 2])", "[1, 2]");
        check_err("tolist({a = 1})", "tolist:");
        check("toset([\"b\", \"a\", \"b\"])", r#"["b", "a"]"#);
        check_err("toset(1)", "toset:");
        check("tomap({a = 1})", "{a = 1}");
        check_err("tomap([1])", "tomap:");

        check("range(3)", "[0, 1, 2]");
        check("range(1, 4)", "[1, 2, 3]");
        check("range(4, 1)", "[4, 3, 2]");
        check("range(0, 10, 3)", "[0, 3, 6, 9]");
        check("range(0, 1, 0.25)", "[0, 0.25, 0.5, 0.75]");
        check("range(0, 5, -1)", "[]");
        check_err("range(0, 5, 0)", "range: step must not be zero");
        check_err("range(\"a\")", "range: argument 1 must be a number");
        check_err("range(100000)", "too many elements");
        check_err("range(1, 2, 3, 4)", "expected 1 to 3 arguments");

        check("element([\"a\", \"b\", \"c\"], 1)", "\"b\"");
        check("element([\"a\", \"b\", \"c\"], 4)", "\"b\"");
        check_err("element([], 0)", "empty list");
        check_err("element([1], -1)", "non-negative whole number");

        check("flatten([[1, [2]], [], 3])", "[1, 2, 3]");
        check_err("flatten(1)", "flatten:");
        check("distinct([1, 2, 1, 3, 2])", "[1, 2, 3]");
        check_err("distinct({})", "distinct:");

        check("coalesce(null, \"\", \"a\", \"b\")", "\"a\"");
        check("coalesce(null, 0)", "0");
        check_err("coalesce(null, \"\")", "coalesce: all arguments are null");
        check_err("coalesce()", "coalesce: at least one argument");

        check("compact([\"a\", \"\", null, \"b\"])", r#"["a", "b"]"#);
        check_err("compact([[1]])", "compact: element 0 must be a string");
        check("reverse([1, 2, 3])", "[3, 2, 1]");
        check_err("reverse(\"abc\")", "reverse:");
        check("slice([1, 2, 3, 4], 1, 3)", "[2, 3]");
        check_err("slice([1, 2], 1, 3)", "out of range");
        check("index([\"a\", \"b\"], \"b\")", "1");
        check_err("index([\"a\"], \"z\")", "not in the list");
        check("zipmap([\"a\", \"b\"], [1, 2])", "{a = 1, b = 2}");
        check_err("zipmap([\"a\"], [1, 2])", "same length");
        check_err("zipmap([[1]], [1])", "zipmap: key 0 must be a string");
    }

    #[test]
    fn strings() {
        check(r#"join(", ", ["a", 1, true])"#, r#""a, 1, true""#);
        check(r#"join("-", ["a"], ["b", "c"])"#, r#""a-b-c""#);
        check(r#"join(",", [])"#, r#""""#);
        check_err(
            r#"join(",", [null])"#,
            "join: element 0 must be a string, number or bool",
        );
        check_err(r#"join(",", "abc")"#, "must be a list");
        check_err(r#"join(",")"#, "at least one list");

        check(r#"split(",", "a,b,,c")"#, r#"["a", "b", "", "c"]"#);
        check(r#"split(",", "")"#, r#"[""]"#);
        check(r#"split("", "ab")"#, r#"["a", "b"]"#);
        check_err(r#"split(",", ["a"])"#, "split: the string must be a string");

        check(r#"upper("abc")"#, r#""ABC""#);
        check(r#"lower("ÀBC")"#, r#""àbc""#);
        check_err(
            "upper([\"a\"])",
            "upper: the argument must be a string, got list [\"a\"]",
        );
        check_err(
            "lower(null)",
            "lower: the argument must be a string, got null",
        );

        check(r#"trimspace("  a b \n")"#, r#""a b""#);
        check_err("trimspace({})", "trimspace:");
        check(r#"startswith("hello", "he")"#, "true");
        check(r#"startswith("hello", "lo")"#, "false");
        check(r#"endswith("hello", "lo")"#, "true");
        check_err("startswith([], \"a\")", "startswith:");
        check_err("endswith(\"a\", {})", "endswith: the suffix");
        check(r#"trim("?!hello?!", "!?")"#, r#""hello""#);
        check(r#"trimprefix("helloworld", "hello")"#, r#""world""#);
        check(r#"trimsuffix("helloworld", "world")"#, r#""hello""#);
        check(r#"trimprefix("abc", "x")"#, r#""abc""#);
        check_err("trim([], \"a\")", "trim:");
        check(r#"chomp("hello\r\n\n")"#, r#""hello""#);
        check_err("chomp([])", "chomp:");
        check(r#"substr("hello world", 1, 4)"#, r#""ello""#);
        check(r#"substr("hello world", -5, -1)"#, r#""world""#);
        check(r#"substr("héllo", 1, 100)"#, r#""éllo""#);
        check(r#"substr("abc", 10, 1)"#, r#""""#);
        check_err(r#"substr("abc", 0, -2)"#, "length must be");
        check_err(
            r#"substr("abc", "x", 1)"#,
            "substr: offset must be a number",
        );

        check(r#"replace("a-b-c", "-", "+")"#, r#""a+b+c""#);
        check(r##"replace("a1b22c", "/[0-9]+/", "#")"##, r##""a#b#c""##);
        check(
            r#"replace("key=val", "/(\\w+)=(\\w+)/", "$2=$1")"#,
            r#""val=key""#,
        );
        check_err(
            r#"replace("abc", "/(/", "x")"#,
            "replace: invalid regular expression",
        );
        check_err(r#"replace("abc", "", "x")"#, "must not be empty");
        check_err(r#"replace([], "a", "b")"#, "replace: the string");

        check(r#"regex("[a-z]+", "123abc456")"#, r#""abc""#);
        check(r#"regex("(\\d+)-(\\d+)", "10-20")"#, r#"["10", "20"]"#);
        check(
            r#"regex("(?P<major>\\d+)\\.(?P<minor>\\d+)", "v1.22")"#,
            r#"{major = "1", minor = "22"}"#,
        );
        check_err(r#"regex("[0-9]+", "abc")"#, "does not match");
        check_err(r#"regex("[", "abc")"#, "invalid regular expression");
        check_err(r#"regex("a", [])"#, "regex: the string");
        check(r#"regexall("\\d", "a1b2")"#, r#"["1", "2"]"#);
        check(r#"regexall("\\d", "ab")"#, "[]");
        check_err(r#"regexall(1, {})"#, "regexall:");

        check(r#"base64encode("")"#, r#""""#);
        check(r#"base64encode("f")"#, r#""Zg==""#);
        check(r#"base64encode("fo")"#, r#""Zm8=""#);
        check(r#"base64encode("foobar")"#, r#""Zm9vYmFy""#);
        check(r#"base64encode("héllo")"#, r#""aMOpbGxv""#);
        check_err("base64encode([])", "base64encode:");
        check(r#"base64decode("aMOpbGxv")"#, r#""héllo""#);
        check(r#"base64decode("Zg==")"#, r#""f""#);
        check(r#"base64decode("Zm8=")"#, r#""fo""#);
        check_err(r#"base64decode("Zg=")"#, "not valid base64");
        check_err(r#"base64decode("Z=g=")"#, "not valid base64");
        check_err(r#"base64decode("/w==")"#, "not valid UTF-8");

        check(
            r#"sha256("hello")"#,
            r#""2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824""#,
        );
        check_err("sha256(null)", "sha256:");
    }

    #[test]
    fn format_function() {
        check(r#"format("Hello, %s!", "Ander")"#, r#""Hello, Ander!""#);
        check(r#"format("%d items", 3)"#, r#""3 items""#);
        check(
            r#"format("%5d|%-5d|%05d", 42, 42, -42)"#,
            r#""   42|42   |-0042""#,
        );
        check(r#"format("%.2f", 3.14159)"#, r#""3.14""#);
        check(r#"format("%f", 2)"#, r#""2.000000""#);
        check(
            r#"format("%+d %x %X %o %b", 5, 255, 255, 8, 5)"#,
            r#""+5 ff FF 10 101""#,
        );
        check(
            r#"format("%v %v %v", "s", 1.5, [1, "a"])"#,
            r#""s 1.5 [1,\"a\"]""#,
        );
        check(r#"format("%q", "a\"b")"#, r#""\"a\\\"b\"""#);
        check(r#"format("%t", true)"#, r#""true""#);
        check(r#"format("100%%")"#, r#""100%""#);
        check(r#"format("%.3s|%6s", "abcdef", "ab")"#, r#""abc|    ab""#);
        check(r#"format("%d", "12")"#, r#""12""#);
        check_err(
            r#"format("%d", 1.5)"#,
            "format: the argument for %d must be a whole number",
        );
        check_err(r#"format("%d", "x")"#, "must be a number");
        check_err(
            r#"format("%s", [1])"#,
            "format: the argument for %s must be a string",
        );
        check_err(r#"format("%s %s", "a")"#, "not enough arguments");
        check_err(r#"format("%s", "a", "b")"#, "too many arguments");
        check_err(r#"format("%y", 1)"#, "unsupported verb %y");
        check_err(r#"format("abc %")"#, "incomplete verb");
        check_err(r#"format("%99999d", 1)"#, "at most");
        check_err(
            r#"format(["x"])"#,
            "format: the format string must be a string",
        );
    }

    #[test]
    fn conversions() {
        check("tostring(\"a\")", "\"a\"");
        check("tostring(5)", "\"5\"");
        check("tostring(1.5)", "\"1.5\"");
        check("tostring(true)", "\"true\"");
        check_err(
            "tostring(null)",
            "tostring: the argument must be a string, number or bool, got null",
        );
        check_err("tostring([1])", "tostring:");

        let three = eval("tonumber(\"3\")").expect("tonumber");
        assert_eq!(three, lit("3"));
        assert!(is_int(&three));
        check("tonumber(\"-2.5\")", "-2.5");
        check("tonumber(7)", "7");
        check("tonumber(\"18446744073709551615\")", "18446744073709551615");
        check_err(
            "tonumber(\"abc\")",
            "tonumber: the argument must be a number, got string \"abc\"",
        );
        check_err("tonumber(\"inf\")", "must be a number");
        check_err("tonumber(null)", "tonumber:");
        check_err("tonumber(true)", "tonumber:");

        check("tobool(true)", "true");
        check("tobool(\"false\")", "false");
        check_err("tobool(\"yes\")", "tobool:");
    }

    #[test]
    fn numbers() {
        let m = eval("max(1, 7, 3)").expect("max");
        assert_eq!(m, lit("7"));
        assert!(is_int(&m));
        check("max(1, 7.5, 3)", "7.5");
        check("min(4, -2, 3)", "-2");
        check("min(\"4\", 5)", "4");
        check("max([3, 9, 2])", "9");
        check_err("max()", "max: at least one number");
        check_err("min(1, \"a\")", "min: argument 2 must be a number");
        check_err("max([])", "at least one number");

        let xs = lit("[4, 11, 2]");
        assert_eq!(eval_in("max(xs...)", &[("xs", xs.clone())]), Ok(lit("11")));
        assert_eq!(eval_in("min(xs...)", &[("xs", xs.clone())]), Ok(lit("2")));
        assert_eq!(eval_in("max(20, xs...)", &[("xs", xs)]), Ok(lit("20")));
        assert_eq!(
            eval_in("concat(ls...)", &[("ls", lit("[[1], [2]]"))]),
            Ok(lit("[1, 2]"))
        );

        let s = eval("sum([1, 2, 3])").expect("sum");
        assert_eq!(s, lit("6"));
        assert!(is_int(&s));
        check("sum([1, -2.5])", "-1.5");
        check("sum([9223372036854775807, 1])", "9223372036854775808");
        check_err("sum([])", "cannot sum an empty list");
        check_err("sum([1, \"x\"])", "sum: element 1 must be a number");
        check_err("sum(1)", "sum: the argument must be a list");

        check("abs(-3)", "3");
        check("abs(2.5)", "2.5");
        check("abs(-9223372036854775808)", "9223372036854775808");
        check_err("abs(\"x\")", "abs:");
        check("floor(2.7)", "2");
        check("floor(-2.5)", "-3");
        check("floor(4)", "4");
        assert!(is_int(&eval("floor(2.7)").expect("floor")));
        check("ceil(2.1)", "3");
        check("ceil(-2.5)", "-2");
        check_err("ceil([])", "ceil:");
        check_err("floor(null)", "floor:");
    }

    #[test]
    fn json() {
        check(
            r#"jsonencode({b = [1, 2.5, true, null], a = "x<y"})"#,
            r#""{\"a\":\"x\\u003cy\",\"b\":[1,2.5,true,null]}""#,
        );
        check(r#"jsonencode("a\nb")"#, r#""\"a\\nb\"""#);
        check("jsonencode(null)", r#""null""#);
        check(
            r#"jsondecode("{\"a\": [1, 2.5, \"x\", null, false]}")"#,
            r#"{a = [1, 2.5, "x", null, false]}"#,
        );
        check(r#"jsondecode("3")"#, "3");
        check_err(r#"jsondecode("{oops")"#, "jsondecode: invalid JSON");
        check_err("jsondecode(3)", "jsondecode: the argument must be a string");
        check_err(r#"jsondecode("1e999")"#, "jsondecode");
        let v = lit(r#"{k = ["a", 1, {z = null}], e = {}}"#);
        let round = eval_in("jsondecode(jsonencode(v))", &[("v", v.clone())]);
        assert_eq!(round, Ok(v));
    }

    #[test]
    fn file_function() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("hello.txt"), "hi there\n").expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/x.txt"), "x").expect("write");
        std::fs::write(dir.path().join("bin"), [0xff, 0xfe]).expect("write");

        with_base_dir(dir.path(), || {
            check(r#"file("hello.txt")"#, r#""hi there\n""#);
            check(r#"file("sub/x.txt")"#, r#""x""#);
            check_err(
                r#"file("missing.txt")"#,
                "file: cannot read \"missing.txt\"",
            );
            check_err(r#"file("missing.txt")"#, "no such file");
            check_err(r#"file("bin")"#, "not valid UTF-8");
            check_err(r#"file(1)"#, "file: the path must be a non-empty string");
            check_err(r#"file("")"#, "non-empty string");
            // Nested base dirs restore the outer one.
            with_base_dir(&dir.path().join("sub"), || {
                check(r#"file("x.txt")"#, r#""x""#)
            });
            check(r#"file("hello.txt")"#, r#""hi there\n""#);
        });

        let abs = dir.path().join("hello.txt");
        let src = format!("file({})", quote(&abs.to_string_lossy()));
        with_base_dir(dir.path(), || {
            assert_eq!(eval(&src), Ok(Value::from("hi there\n")))
        });
        // Outside the module folder: an absolute path, `..`, a symbolic link, a device.
        let inner = dir.path().join("sub");
        std::os::unix::fs::symlink(&abs, inner.join("link")).expect("symlink");
        with_base_dir(&inner, || {
            for outside in [
                src.as_str(),
                r#"file("../hello.txt")"#,
                r#"file("link")"#,
                r#"file("/dev/zero")"#,
            ] {
                check_err(outside, "is outside the module folder");
            }
            check_err(r#"file("/etc/passwd")"#, "SPARKFORM_FILE_OUTSIDE_MODULE=1");
        });
        with_base_dir(dir.path(), || {
            check_err(r#"file("sub")"#, "is not a regular file")
        });
        let big = dir.path().join("big.txt");
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(limits::MAX_FILE_BYTES + 1).expect("set_len");
        with_base_dir(dir.path(), || {
            check_err(r#"file("big.txt")"#, "is larger than 16 MiB")
        });
    }

    #[test]
    fn arity_errors_name_the_function() {
        check_err(r#"upper("a", "b")"#, "upper");
        check_err("cidrhost(\"10.0.0.0/8\")", "cidrhost");
    }
}

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

// ---------------------------------------------------------------------------
// Network functions
// ---------------------------------------------------------------------------

fn want_prefix(f: &str, v: &Value) -> Result<IpNet, String> {
    let s = match v {
        Value::String(s) => s,
        _ => return Err(type_err(f, "the prefix", "a CIDR prefix string", v)),
    };
    s.parse::<IpNet>()
        .map(|net| net.trunc())
        .map_err(|_| format!("{f}: {} is not a valid CIDR prefix", quote(s)))
}

fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn bits_addr(like: &IpNet, bits: u128) -> Result<IpAddr, String> {
    match like {
        IpNet::V4(_) => u32::try_from(bits)
            .map(|b| IpAddr::V4(b.into()))
            .map_err(|_| "address out of range".to_string()),
        IpNet::V6(_) => Ok(IpAddr::V6(bits.into())),
    }
}

fn cidrcontains(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrcontains";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    let other = arg(&args, F, 1)?;
    let s = match other {
        Value::String(s) => s,
        _ => {
            return Err(type_err(
                F,
                "the second argument",
                "an IP address or CIDR prefix string",
                other,
            ))
        }
    };
    let (is_v4, contained) = if s.contains('/') {
        let inner = s
            .parse::<IpNet>()
            .map_err(|_| format!("{F}: {} is not a valid CIDR prefix", quote(s)))?;
        (matches!(inner, IpNet::V4(_)), net.contains(&inner))
    } else {
        let ip = s
            .parse::<IpAddr>()
            .map_err(|_| format!("{F}: {} is not a valid IP address", quote(s)))?;
        (ip.is_ipv4(), net.contains(&ip))
    };
    if is_v4 != matches!(net, IpNet::V4(_)) {
        return Err(format!(
            "{F}: address family of {} does not match prefix {net}",
            quote(s)
        ));
    }
    Ok(Value::Bool(contained))
}

/// Offset of host number `hostnum` inside a block with `host_bits` host bits;
/// negative numbers count back from the end (-1 is the last address).
fn host_offset(host_bits: u8, hostnum: i128) -> Option<u128> {
    let count = 1u128.checked_shl(u32::from(host_bits)); // None means 2^128
    if hostnum >= 0 {
        let n = u128::try_from(hostnum).ok()?;
        match count {
            Some(c) if n >= c => None,
            _ => Some(n),
        }
    } else {
        let mag = hostnum.unsigned_abs();
        match count {
            Some(c) => c.checked_sub(mag),
            None => Some(u128::MAX - (mag - 1)),
        }
    }
}

fn cidrhost(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrhost";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    let hostnum = want_int(F, "hostnum", arg(&args, F, 1)?)?;
    let host_bits = net.max_prefix_len() - net.prefix_len();
    let offset = host_offset(host_bits, hostnum).ok_or_else(|| {
        format!("{F}: prefix {net} does not accommodate a host numbered {hostnum}")
    })?;
    let addr =
        bits_addr(&net, addr_bits(net.network()) | offset).map_err(|e| format!("{F}: {e}"))?;
    Ok(Value::String(addr.to_string()))
}

fn cidrnetmask(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrnetmask";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    match net {
        IpNet::V4(v4) => Ok(Value::String(v4.netmask().to_string())),
        IpNet::V6(_) => Err(format!("{F}: only IPv4 prefixes have a netmask, got {net}")),
    }
}

fn cidrsubnet(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "cidrsubnet";
    let net = want_prefix(F, arg(&args, F, 0)?)?;
    let newbits = want_int(F, "newbits", arg(&args, F, 1)?)?;
    let netnum = want_int(F, "netnum", arg(&args, F, 2)?)?;
    let max = i128::from(net.max_prefix_len());
    let len = i128::from(net.prefix_len());
    if newbits < 0 {
        return Err(format!("{F}: newbits must not be negative, got {newbits}"));
    }
    let new_len = len + newbits;
    if new_len > max {
        return Err(format!(
            "{F}: not enough address space to extend prefix {net} by {newbits} bits (at most {} bits available)",
            max - len
        ));
    }
    let new_len = u8::try_from(new_len).map_err(|_| format!("{F}: prefix length out of range"))?;
    let newbits = u32::try_from(newbits).map_err(|_| format!("{F}: newbits out of range"))?;
    let fits = match (u128::try_from(netnum), 1u128.checked_shl(newbits)) {
        (Ok(n), Some(limit)) => n < limit,
        (Ok(_), None) => true,
        (Err(_), _) => false,
    };
    if !fits {
        return Err(format!(
            "{F}: prefix extension of {newbits} bits does not accommodate a subnet numbered {netnum}"
        ));
    }
    let netnum = u128::try_from(netnum).map_err(|_| format!("{F}: netnum out of range"))?;
    let shift = u32::from(net.max_prefix_len() - new_len);
    let offset = if netnum == 0 {
        0
    } else {
        netnum
            .checked_shl(shift)
            .ok_or_else(|| format!("{F}: netnum out of range"))?
    };
    let addr =
        bits_addr(&net, addr_bits(net.network()) | offset).map_err(|e| format!("{F}: {e}"))?;
    Ok(Value::String(format!("{addr}/{new_len}")))
}

// ---------------------------------------------------------------------------
// Collection functions
// ---------------------------------------------------------------------------

fn merge(args: FuncArgs) -> Result<Value, String> {
    let mut out = Map::new();
    for (i, v) in args.iter().enumerate() {
        match v {
            Value::Null => {}
            Value::Object(obj) => {
                for (k, val) in obj {
                    out.insert(k.clone(), val.clone());
                }
            }
            _ => {
                return Err(type_err(
                    "merge",
                    &format!("argument {}", i + 1),
                    "an object",
                    v,
                ))
            }
        }
    }
    Ok(Value::Object(out))
}

fn concat(args: FuncArgs) -> Result<Value, String> {
    let mut out = Vec::new();
    for (i, v) in args.iter().enumerate() {
        let list = want_list("concat", &format!("argument {}", i + 1), v)?;
        limits::check_elements("`concat()`", out.len() + list.len())?;
        out.extend(list.iter().cloned());
    }
    Ok(Value::Array(out))
}

fn length(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "length";
    let v = arg(&args, F, 0)?;
    let n = match v {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        Value::String(s) => s.chars().count(),
        _ => return Err(type_err(F, "the argument", "a list, object or string", v)),
    };
    Ok(Value::from(n))
}

fn keys(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "keys";
    let obj = want_object(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(
        sorted_keys(obj)
            .into_iter()
            .map(|k| Value::String(k.clone()))
            .collect(),
    ))
}

fn values(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "values";
    let obj = want_object(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(
        sorted_keys(obj)
            .into_iter()
            .filter_map(|k| obj.get(k).cloned())
            .collect(),
    ))
}

fn lookup(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "lookup";
    check_arity(&args, F, 2, 3)?;
    let obj = want_object(F, "the first argument", arg(&args, F, 0)?)?;
    let key = want_str(F, "the key", arg(&args, F, 1)?)?;
    match (obj.get(&key), args.get(2)) {
        (Some(v), _) => Ok(v.clone()),
        (None, Some(default)) => Ok(default.clone()),
        (None, None) => {
            let mut known: Vec<String> = sorted_keys(obj).into_iter().map(|k| quote(k)).collect();
            if known.is_empty() {
                known.push("none".to_string());
            }
            Err(format!(
                "{F}: key {} not found and no default given (keys: {})",
                quote(&key),
                known.join(", ")
            ))
        }
    }
}

fn contains(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "contains";
    let list = want_list(F, "the first argument", arg(&args, F, 0)?)?;
    let needle = arg(&args, F, 1)?;
    Ok(Value::Bool(list.contains(needle)))
}

fn tolist(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tolist";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(list.clone()))
}

fn toset(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "toset";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(dedupe(list)))
}

fn tomap(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tomap";
    let obj = want_object(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Object(obj.clone()))
}

fn range(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "range";
    check_arity(&args, F, 1, 3)?;
    let mut nums = Vec::with_capacity(args.len());
    for (i, v) in args.iter().enumerate() {
        nums.push(want_number(F, &format!("argument {}", i + 1), v)?);
    }
    let zero = Number::from(0);
    let one = Number::from(1);
    let (start, end, step) = match nums.as_slice() {
        [end] => (zero, *end, one),
        [start, end] => (*start, *end, if start > end { -one } else { one }),
        [start, end, step] => (*start, *end, *step),
        _ => {
            return Err(format!(
                "{F}: expected 1 to 3 arguments, got {}",
                nums.len()
            ))
        }
    };
    if step == zero {
        return Err(format!("{F}: step must not be zero"));
    }
    let too_many = || format!("{F}: too many elements (the limit is {MAX_RANGE})");
    let mut out = Vec::new();
    match (
        number_to_int(&start),
        number_to_int(&end),
        number_to_int(&step),
    ) {
        (Some(s), Some(e), Some(st)) => {
            let mut cur = s;
            while (st > 0 && cur < e) || (st < 0 && cur > e) {
                if out.len() >= MAX_RANGE {
                    return Err(too_many());
                }
                out.push(Value::Number(int_to_number(F, cur)?));
                cur = cur.checked_add(st).ok_or_else(too_many)?;
            }
        }
        _ => {
            let (s, e, st) = (number_f64(&start), number_f64(&end), number_f64(&step));
            let mut i = 0u32;
            loop {
                let cur = s + f64::from(i) * st;
                if !((st > 0.0 && cur < e) || (st < 0.0 && cur > e)) {
                    break;
                }
                if out.len() >= MAX_RANGE {
                    return Err(too_many());
                }
                out.push(Value::Number(float_to_number(F, cur)?));
                i += 1;
            }
        }
    }
    Ok(Value::Array(out))
}

fn element(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "element";
    let list = want_list(F, "the first argument", arg(&args, F, 0)?)?;
    let idx = want_index(F, "the index", arg(&args, F, 1)?)?;
    if list.is_empty() {
        return Err(format!("{F}: cannot take an element of an empty list"));
    }
    list.get(idx % list.len())
        .cloned()
        .ok_or_else(|| format!("{F}: index {idx} out of range"))
}

fn flatten_into(items: &[Value], out: &mut Vec<Value>) -> Result<(), String> {
    for item in items {
        match item {
            Value::Array(inner) => flatten_into(inner, out)?,
            other => {
                limits::check_elements("`flatten()`", out.len() + 1)?;
                out.push(other.clone());
            }
        }
    }
    Ok(())
}

fn flatten(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "flatten";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    let mut out = Vec::new();
    flatten_into(list, &mut out)?;
    Ok(Value::Array(out))
}

fn distinct(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "distinct";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(dedupe(list)))
}

fn coalesce(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "coalesce";
    if args.is_empty() {
        return Err(format!("{F}: at least one argument is required"));
    }
    args.iter()
        .find(|v| match v {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            _ => true,
        })
        .cloned()
        .ok_or_else(|| format!("{F}: all arguments are null or empty strings"))
}

fn compact(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "compact";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    let mut out = Vec::new();
    for (i, v) in list.iter().enumerate() {
        match v {
            Value::Null => {}
            Value::String(s) if s.is_empty() => {}
            other => out.push(Value::String(want_str(F, &format!("element {i}"), other)?)),
        }
    }
    Ok(Value::Array(out))
}

fn reverse(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "reverse";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(list.iter().rev().cloned().collect()))
}

fn slice(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "slice";
    let list = want_list(F, "the first argument", arg(&args, F, 0)?)?;
    let start = want_index(F, "start_index", arg(&args, F, 1)?)?;
    let end = want_index(F, "end_index", arg(&args, F, 2)?)?;
    if start > end || end > list.len() {
        return Err(format!(
            "{F}: indices {start}..{end} are out of range for a list of length {}",
            list.len()
        ));
    }
    Ok(Value::Array(
        list.get(start..end).unwrap_or_default().to_vec(),
    ))
}

fn index(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "index";
    let list = want_list(F, "the first argument", arg(&args, F, 0)?)?;
    let needle = arg(&args, F, 1)?;
    list.iter()
        .position(|v| v == needle)
        .map(Value::from)
        .ok_or_else(|| format!("{F}: {} is not in the list", describe(needle)))
}

fn zipmap(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "zipmap";
    let keys = want_list(F, "the keys", arg(&args, F, 0)?)?;
    let vals = want_list(F, "the values", arg(&args, F, 1)?)?;
    if keys.len() != vals.len() {
        return Err(format!(
            "{F}: got {} keys but {} values; the lists must have the same length",
            keys.len(),
            vals.len()
        ));
    }
    let mut out = Map::new();
    for (i, (k, v)) in keys.iter().zip(vals).enumerate() {
        out.insert(want_str(F, &format!("key {i}"), k)?, v.clone());
    }
    Ok(Value::Object(out))
}

// ---------------------------------------------------------------------------
// String functions
// ---------------------------------------------------------------------------

fn join(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "join";
    let sep = want_str(F, "the separator", arg(&args, F, 0)?)?;
    if args.len() < 2 {
        return Err(format!("{F}: expected a separator and at least one list"));
    }
    let mut parts = Vec::new();
    let mut total = 0usize;
    for list in args.iter().skip(1) {
        for (i, v) in want_list(F, "the second argument", list)?
            .iter()
            .enumerate()
        {
            let part = prim_to_string(v).ok_or_else(|| {
                type_err(F, &format!("element {i}"), "a string, number or bool", v)
            })?;
            total = total.saturating_add(part.len() + sep.len());
            limits::check_string("`join()`", total)?;
            parts.push(part);
        }
    }
    Ok(Value::String(parts.join(&sep)))
}

fn split(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "split";
    let sep = want_str(F, "the separator", arg(&args, F, 0)?)?;
    let s = want_str(F, "the string", arg(&args, F, 1)?)?;
    let pieces: Box<dyn Iterator<Item = String>> = if sep.is_empty() {
        Box::new(s.chars().map(|c| c.to_string()))
    } else {
        Box::new(s.split(sep.as_str()).map(str::to_string))
    };
    let mut parts = Vec::new();
    for p in pieces {
        limits::check_elements("`split()`", parts.len() + 1)?;
        parts.push(Value::String(p));
    }
    Ok(Value::Array(parts))
}

fn string_fn(args: &FuncArgs, f: &str, op: impl FnOnce(&str) -> String) -> Result<Value, String> {
    let s = want_str(f, "the argument", arg(args, f, 0)?)?;
    Ok(Value::String(op(&s)))
}

fn upper(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "upper", str::to_uppercase)
}

fn lower(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "lower", str::to_lowercase)
}

fn trimspace(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "trimspace", |s| s.trim().to_string())
}

fn chomp(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "chomp", |s| {
        s.trim_end_matches(['\n', '\r']).to_string()
    })
}

fn two_strings(args: &FuncArgs, f: &str, second: &str) -> Result<(String, String), String> {
    Ok((
        want_str(f, "the string", arg(args, f, 0)?)?,
        want_str(f, second, arg(args, f, 1)?)?,
    ))
}

fn startswith(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "startswith", "the prefix")?;
    Ok(Value::Bool(s.starts_with(&p)))
}

fn endswith(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "endswith", "the suffix")?;
    Ok(Value::Bool(s.ends_with(&p)))
}

fn trim(args: FuncArgs) -> Result<Value, String> {
    let (s, cutset) = two_strings(&args, "trim", "the set of characters")?;
    Ok(Value::String(
        s.trim_matches(|c: char| cutset.contains(c)).to_string(),
    ))
}

fn trimprefix(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "trimprefix", "the prefix")?;
    Ok(Value::String(
        s.strip_prefix(p.as_str()).unwrap_or(&s).to_string(),
    ))
}

fn trimsuffix(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "trimsuffix", "the suffix")?;
    Ok(Value::String(
        s.strip_suffix(p.as_str()).unwrap_or(&s).to_string(),
    ))
}

fn substr(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "substr";
    let s = want_str(F, "the string", arg(&args, F, 0)?)?;
    let offset = want_int(F, "offset", arg(&args, F, 1)?)?;
    let length = want_int(F, "length", arg(&args, F, 2)?)?;
    let chars: Vec<char> = s.chars().collect();
    let total = i128::try_from(chars.len()).map_err(|_| format!("{F}: string too long"))?;
    let start = if offset < 0 {
        (total + offset).max(0)
    } else {
        offset.min(total)
    };
    let end = match length {
        -1 => total,
        l if l < 0 => {
            return Err(format!(
                "{F}: length must be -1 (the rest of the string) or non-negative, got {l}"
            ))
        }
        l => start.saturating_add(l).min(total),
    };
    let (start, end) = (
        usize::try_from(start).unwrap_or(0),
        usize::try_from(end).unwrap_or(0),
    );
    Ok(Value::String(
        chars.get(start..end).unwrap_or_default().iter().collect(),
    ))
}

fn replace(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "replace";
    let s = want_str(F, "the string", arg(&args, F, 0)?)?;
    let substr = want_str(F, "the substring", arg(&args, F, 1)?)?;
    let repl = want_str(F, "the replacement", arg(&args, F, 2)?)?;
    if substr.len() >= 2 && substr.starts_with('/') && substr.ends_with('/') {
        let pattern = &substr[1..substr.len() - 1];
        let re = compile_regex(F, pattern)?;
        // Built match by match: `$0$0…` in the replacement multiplies the length.
        let mut out = String::new();
        let mut last = 0;
        for caps in re.captures_iter(&s) {
            let Some(m) = caps.get(0) else { continue };
            out.push_str(&s[last..m.start()]);
            caps.expand(&repl, &mut out);
            last = m.end();
            limits::check_string("`replace()`", out.len() + s.len() - last)?;
        }
        out.push_str(&s[last..]);
        return Ok(Value::String(out));
    }
    if substr.is_empty() {
        return Err(format!("{F}: the substring to replace must not be empty"));
    }
    let count = s.matches(substr.as_str()).count();
    let len = (s.len() - count * substr.len()).saturating_add(count.saturating_mul(repl.len()));
    limits::check_string("`replace()`", len)?;
    Ok(Value::String(s.replace(&substr, &repl)))
}

fn compile_regex(f: &str, pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern)
        .map_err(|e| format!("{f}: invalid regular expression {}: {e}", quote(pattern)))
}

/// The result of one regex match, Terraform-style: the matched string when the
/// pattern has no capture groups, an object for named groups, otherwise a list
/// of the groups (unmatched groups are null).
fn match_value(re: &Regex, caps: &regex::Captures<'_>) -> Value {
    let group = |m: Option<regex::Match<'_>>| {
        m.map_or(Value::Null, |m| Value::String(m.as_str().to_string()))
    };
    if re.captures_len() == 1 {
        return group(caps.get(0));
    }
    if re.capture_names().flatten().next().is_some() {
        let mut obj = Map::new();
        for name in re.capture_names().flatten() {
            obj.insert(name.to_string(), group(caps.name(name)));
        }
        return Value::Object(obj);
    }
    Value::Array((1..re.captures_len()).map(|i| group(caps.get(i))).collect())
}

fn regex(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "regex";
    let pattern = want_str(F, "the pattern", arg(&args, F, 0)?)?;
    let s = want_str(F, "the string", arg(&args, F, 1)?)?;
    let re = compile_regex(F, &pattern)?;
    let caps = re.captures(&s).ok_or_else(|| {
        format!(
            "{F}: pattern {} does not match {}",
            quote(&pattern),
            quote(&s)
        )
    })?;
    Ok(match_value(&re, &caps))
}

fn regexall(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "regexall";
    let pattern = want_str(F, "the pattern", arg(&args, F, 0)?)?;
    let s = want_str(F, "the string", arg(&args, F, 1)?)?;
    let re = compile_regex(F, &pattern)?;
    let mut out = Vec::new();
    for caps in re.captures_iter(&s) {
        limits::check_elements("`regexall()`", out.len() + 1)?;
        out.push(match_value(&re, &caps));
    }
    Ok(Value::Array(out))
}

fn format(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "format";
    let spec = want_str(F, "the format string", arg(&args, F, 0)?)?;
    let rest = args.get(1..).unwrap_or_default();
    let mut out = String::new();
    let mut next = 0usize;
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let (mut minus, mut plus, mut zero, mut space) = (false, false, false, false);
        while let Some(&flag) = chars.peek() {
            match flag {
                '-' => minus = true,
                '+' => plus = true,
                '0' => zero = true,
                ' ' => space = true,
                _ => break,
            }
            chars.next();
        }
        let width = read_num(&mut chars);
        let precision = if chars.peek() == Some(&'.') {
            chars.next();
            Some(read_num(&mut chars).unwrap_or(0))
        } else {
            None
        };
        if width.unwrap_or(0) > MAX_WIDTH || precision.unwrap_or(0) > MAX_WIDTH {
            return Err(format!(
                "{F}: width and precision may be at most {MAX_WIDTH}"
            ));
        }
        let verb = chars
            .next()
            .ok_or_else(|| format!("{F}: format string ends with an incomplete verb"))?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let value = rest.get(next).ok_or_else(|| {
            format!(
                "{F}: not enough arguments: verb %{verb} needs argument {} but only {} given",
                next + 1,
                rest.len()
            )
        })?;
        next += 1;
        let what = format!("the argument for %{verb}");
        // (sign, body, numeric)
        let (negative, body, numeric) = match verb {
            'v' => (false, format_v(value), false),
            's' => {
                let s = want_str(F, &what, value)?;
                let s = match precision {
                    Some(p) => s.chars().take(p).collect(),
                    None => s,
                };
                (false, s, false)
            }
            'q' => (false, quote(&want_str(F, &what, value)?), false),
            't' => {
                let b = match value {
                    Value::Bool(b) => *b,
                    Value::String(s) if s == "true" => true,
                    Value::String(s) if s == "false" => false,
                    _ => return Err(type_err(F, &what, "a bool", value)),
                };
                (false, b.to_string(), false)
            }
            'd' | 'b' | 'o' | 'x' | 'X' => {
                let i = want_int(F, &what, value)?;
                let m = i.unsigned_abs();
                let body = match verb {
                    'b' => format!("{m:b}"),
                    'o' => format!("{m:o}"),
                    'x' => format!("{m:x}"),
                    'X' => format!("{m:X}"),
                    _ => m.to_string(),
                };
                (i < 0, body, true)
            }
            'f' => {
                let x = number_f64(&want_number(F, &what, value)?);
                let p = precision.unwrap_or(6);
                (x < 0.0, format!("{:.*}", p, x.abs()), true)
            }
            _ => {
                return Err(format!(
                    "{F}: unsupported verb %{verb} (supported: %v %s %q %t %d %b %o %x %X %f %%)"
                ))
            }
        };
        let sign = if !numeric {
            ""
        } else if negative {
            "-"
        } else if plus {
            "+"
        } else if space {
            " "
        } else {
            ""
        };
        let len = sign.chars().count() + body.chars().count();
        let pad = width.unwrap_or(0).saturating_sub(len);
        if minus {
            out.push_str(sign);
            out.push_str(&body);
            out.extend(std::iter::repeat_n(' ', pad));
        } else if zero && numeric {
            out.push_str(sign);
            out.extend(std::iter::repeat_n('0', pad));
            out.push_str(&body);
        } else {
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(sign);
            out.push_str(&body);
        }
        limits::check_string("`format()`", out.len())?;
    }
    if next < rest.len() {
        return Err(format!(
            "{F}: too many arguments: the format string uses {next} but {} were given",
            rest.len()
        ));
    }
    Ok(Value::String(out))
}

/// Read an optional decimal number (a width or precision) from a format spec.
fn read_num(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<usize> {
    let mut n: Option<usize> = None;
    while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
        let d = usize::try_from(d).unwrap_or(0);
        n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d));
        chars.next();
    }
    n
}

fn format_v(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            json_encode(other, &mut out);
            out
        }
    }
}

fn base64encode(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "base64encode", |s| base64_encode(s.as_bytes()))
}

fn base64decode(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "base64decode";
    let s = want_str(F, "the argument", arg(&args, F, 0)?)?;
    let bytes =
        base64_decode(&s).ok_or_else(|| format!("{F}: {} is not valid base64", quote(&s)))?;
    String::from_utf8(bytes)
        .map(Value::String)
        .map_err(|_| format!("{F}: the decoded bytes are not valid UTF-8"))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let idx = usize::try_from((n >> (18 - 6 * i)) & 0x3f).unwrap_or(0);
                out.push(char::from(B64.get(idx).copied().unwrap_or(b'A')));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.len() / 4;
    for (ci, chunk) in bytes.chunks(4).enumerate() {
        let last = ci + 1 == chunks;
        let mut n = 0u32;
        let mut pad = 0usize;
        for (i, &c) in chunk.iter().enumerate() {
            let v = if c == b'=' {
                // Padding only in the last two positions of the last chunk.
                if !last || i < 2 {
                    return None;
                }
                pad += 1;
                0
            } else {
                if pad > 0 {
                    return None;
                }
                u32::try_from(B64.iter().position(|&b| b == c)?).ok()?
            };
            n = (n << 6) | v;
        }
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(decoded.get(..3 - pad)?);
    }
    Some(out)
}

fn sha256(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "sha256", |s| {
        let digest = Sha256::digest(s.as_bytes());
        let mut hex = String::with_capacity(64);
        for b in digest.iter() {
            let _ = write!(hex, "{b:02x}");
        }
        hex
    })
}

// ---------------------------------------------------------------------------
// Type conversion
// ---------------------------------------------------------------------------

fn tostring(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tostring";
    let v = arg(&args, F, 0)?;
    prim_to_string(v)
        .map(Value::String)
        .ok_or_else(|| type_err(F, "the argument", "a string, number or bool", v))
}

fn tonumber(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tonumber";
    let v = arg(&args, F, 0)?;
    want_number(F, "the argument", v).map(Value::Number)
}

fn tobool(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tobool";
    let v = arg(&args, F, 0)?;
    match v {
        Value::Bool(b) => Ok(Value::Bool(*b)),
        Value::String(s) if s == "true" => Ok(Value::Bool(true)),
        Value::String(s) if s == "false" => Ok(Value::Bool(false)),
        _ => Err(type_err(
            F,
            "the argument",
            "a bool or \"true\"/\"false\"",
            v,
        )),
    }
}

// ---------------------------------------------------------------------------
// Numeric functions
// ---------------------------------------------------------------------------

/// Arguments of min/max: the variadic numbers, or the elements of a single
/// list argument (as a convenience; `max(xs...)` works too).
fn number_args(args: &FuncArgs, f: &str) -> Result<Vec<Number>, String> {
    let items: &[Value] = match args.as_slice() {
        [Value::Array(list)] => list,
        all => all,
    };
    if items.is_empty() {
        return Err(format!("{f}: at least one number is required"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| want_number(f, &format!("argument {}", i + 1), v))
        .collect()
}

fn max(args: FuncArgs) -> Result<Value, String> {
    let nums = number_args(&args, "max")?;
    let best = nums
        .iter()
        .copied()
        .reduce(|a, b| if b > a { b } else { a });
    best.map(Value::Number)
        .ok_or_else(|| "max: at least one number is required".to_string())
}

fn min(args: FuncArgs) -> Result<Value, String> {
    let nums = number_args(&args, "min")?;
    let best = nums
        .iter()
        .copied()
        .reduce(|a, b| if b < a { b } else { a });
    best.map(Value::Number)
        .ok_or_else(|| "min: at least one number is required".to_string())
}

fn sum(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "sum";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    if list.is_empty() {
        return Err(format!("{F}: cannot sum an empty list"));
    }
    let mut nums = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        nums.push(want_number(F, &format!("element {i}"), v)?);
    }
    let ints: Option<Vec<i128>> = nums.iter().map(number_to_int).collect();
    let total = match ints {
        Some(ints) => {
            let mut acc = 0i128;
            for i in ints {
                acc = acc
                    .checked_add(i)
                    .ok_or_else(|| format!("{F}: result is out of range"))?;
            }
            int_to_number(F, acc)?
        }
        None => float_to_number(F, nums.iter().map(number_f64).sum())?,
    };
    Ok(Value::Number(total))
}

fn abs(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "abs";
    let n = want_number(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Number(if n < Number::from(0) { -n } else { n }))
}

fn round_fn(args: &FuncArgs, f: &str, op: fn(f64) -> f64) -> Result<Value, String> {
    let n = want_number(f, "the argument", arg(args, f, 0)?)?;
    if !n.is_f64() {
        return Ok(Value::Number(n));
    }
    float_to_number(f, op(number_f64(&n))).map(Value::Number)
}

fn floor(args: FuncArgs) -> Result<Value, String> {
    round_fn(&args, "floor", f64::floor)
}

fn ceil(args: FuncArgs) -> Result<Value, String> {
    round_fn(&args, "ceil", f64::ceil)
}

// ---------------------------------------------------------------------------
// Encoding and files
// ---------------------------------------------------------------------------

fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // Like Terraform (Go's encoding/json), escape HTML-sensitive
            // characters and the JavaScript line separators.
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Compact JSON with object keys sorted, like Terraform's `jsonencode`.
fn json_encode(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_encode(item, out);
            }
            out.push(']');
        }
        Value::Object(obj) => {
            out.push('{');
            for (i, k) in sorted_keys(obj).into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(k, out);
                out.push(':');
                if let Some(val) = obj.get(k) {
                    json_encode(val, out);
                }
            }
            out.push('}');
        }
    }
}

fn jsonencode(args: FuncArgs) -> Result<Value, String> {
    let v = arg(&args, "jsonencode", 0)?;
    let mut out = String::new();
    json_encode(v, &mut out);
    Ok(Value::String(out))
}

fn from_json(v: serde_json::Value) -> Result<Value, String> {
    Ok(match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => {
            let num = if let Some(i) = n.as_i64() {
                Number::from(i)
            } else if let Some(u) = n.as_u64() {
                Number::from(u)
            } else {
                n.as_f64()
                    .and_then(Number::from_f64)
                    .ok_or_else(|| format!("jsondecode: number {n} is out of range"))?
            };
            Value::Number(num)
        }
        serde_json::Value::String(s) => Value::String(s),
        serde_json::Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(from_json)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        serde_json::Value::Object(obj) => {
            let mut out = Map::new();
            for (k, val) in obj {
                out.insert(k, from_json(val)?);
            }
            Value::Object(out)
        }
    })
}

fn jsondecode(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "jsondecode";
    let v = arg(&args, F, 0)?;
    let s = match v {
        Value::String(s) => s,
        _ => return Err(type_err(F, "the argument", "a string", v)),
    };
    let parsed: serde_json::Value =
        serde_json::from_str(s).map_err(|e| format!("{F}: invalid JSON: {e}"))?;
    from_json(parsed)
}

fn file(args: FuncArgs) -> Result<Value, String> {
    use std::io::Read as _;
    const F: &str = "file";
    let v = arg(&args, F, 0)?;
    let path = match v {
        Value::String(s) if !s.is_empty() => s,
        _ => return Err(type_err(F, "the path", "a non-empty string", v)),
    };
    let shown = crate::diag::clip(path, 120);
    let base = BASE_DIR
        .with(|b| b.borrow().clone())
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."));
    let resolved = base.join(path);
    let cannot = |e: std::io::Error| {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            _ => e.to_string(),
        };
        format!(
            "{F}: cannot read \"{shown}\" (resolved to {}): {reason}",
            crate::diag::clip(&resolved.display().to_string(), 200)
        )
    };
    // Symbolic links and `..` are resolved first, so neither leads outside the folder.
    let real = resolved.canonicalize().map_err(cannot)?;
    if !limits::file_anywhere() {
        let root = base.canonicalize().unwrap_or(base.clone());
        if !real.starts_with(&root) {
            return Err(format!(
                "{F}: \"{shown}\" is outside the module folder {}; definitions read only their own files \
                 (set {}=1 to allow files elsewhere)",
                crate::diag::display_path(&root),
                limits::FILE_ANYWHERE_ENV
            ));
        }
    }
    let meta = std::fs::metadata(&real).map_err(cannot)?;
    if !meta.is_file() {
        // A device or a FIFO would block or never end.
        return Err(format!("{F}: \"{shown}\" is not a regular file"));
    }
    let too_big = || {
        format!(
            "{F}: \"{shown}\" is larger than {} (the limit for file(); see docs/limits.md)",
            limits::size_text(limits::MAX_FILE_BYTES)
        )
    };
    if meta.len() > limits::MAX_FILE_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    // Read at most one byte past the limit: the file may grow after the size check.
    std::fs::File::open(&real)
        .and_then(|f| f.take(limits::MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > limits::MAX_FILE_BYTES {
        return Err(too_big());
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{F}: \"{shown}\" is not valid UTF-8 text"))?;
    crate::diag::note_file_contents(&shown, &text);
    Ok(Value::String(text))
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

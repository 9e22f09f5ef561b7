//! Type conversion and numeric functions.

use super::*;

pub(super) fn tostring(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tostring";
    let v = arg(&args, F, 0)?;
    prim_to_string(v)
        .map(Value::String)
        .ok_or_else(|| type_err(F, "the argument", "a string, number or bool", v))
}

pub(super) fn tonumber(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tonumber";
    let v = arg(&args, F, 0)?;
    want_number(F, "the argument", v).map(Value::Number)
}

pub(super) fn tobool(args: FuncArgs) -> Result<Value, String> {
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
pub(super) fn number_args(args: &FuncArgs, f: &str) -> Result<Vec<Number>, String> {
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

pub(super) fn max(args: FuncArgs) -> Result<Value, String> {
    let nums = number_args(&args, "max")?;
    let best = nums
        .iter()
        .copied()
        .reduce(|a, b| if b > a { b } else { a });
    best.map(Value::Number)
        .ok_or_else(|| "max: at least one number is required".to_string())
}

pub(super) fn min(args: FuncArgs) -> Result<Value, String> {
    let nums = number_args(&args, "min")?;
    let best = nums
        .iter()
        .copied()
        .reduce(|a, b| if b < a { b } else { a });
    best.map(Value::Number)
        .ok_or_else(|| "min: at least one number is required".to_string())
}

pub(super) fn sum(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn abs(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "abs";
    let n = want_number(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Number(if n < Number::from(0) { -n } else { n }))
}

pub(super) fn round_fn(args: &FuncArgs, f: &str, op: fn(f64) -> f64) -> Result<Value, String> {
    let n = want_number(f, "the argument", arg(args, f, 0)?)?;
    if !n.is_f64() {
        return Ok(Value::Number(n));
    }
    float_to_number(f, op(number_f64(&n))).map(Value::Number)
}

pub(super) fn floor(args: FuncArgs) -> Result<Value, String> {
    round_fn(&args, "floor", f64::floor)
}

pub(super) fn ceil(args: FuncArgs) -> Result<Value, String> {
    round_fn(&args, "ceil", f64::ceil)
}

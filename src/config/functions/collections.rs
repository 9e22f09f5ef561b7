//! Collection functions: lists, sets, maps and objects.

use super::*;

pub(super) fn merge(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn concat(args: FuncArgs) -> Result<Value, String> {
    let mut out = Vec::new();
    for (i, v) in args.iter().enumerate() {
        let list = want_list("concat", &format!("argument {}", i + 1), v)?;
        limits::check_elements("`concat()`", out.len() + list.len())?;
        out.extend(list.iter().cloned());
    }
    Ok(Value::Array(out))
}

pub(super) fn length(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn keys(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "keys";
    let obj = want_object(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(
        sorted_keys(obj)
            .into_iter()
            .map(|k| Value::String(k.clone()))
            .collect(),
    ))
}

pub(super) fn values(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "values";
    let obj = want_object(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(
        sorted_keys(obj)
            .into_iter()
            .filter_map(|k| obj.get(k).cloned())
            .collect(),
    ))
}

pub(super) fn lookup(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn contains(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "contains";
    let list = want_list(F, "the first argument", arg(&args, F, 0)?)?;
    let needle = arg(&args, F, 1)?;
    Ok(Value::Bool(list.contains(needle)))
}

pub(super) fn tolist(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tolist";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(list.clone()))
}

pub(super) fn toset(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "toset";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(dedupe(list)))
}

pub(super) fn tomap(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "tomap";
    let obj = want_object(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Object(obj.clone()))
}

pub(super) fn range(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn element(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn flatten_into(items: &[Value], out: &mut Vec<Value>) -> Result<(), String> {
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

pub(super) fn flatten(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "flatten";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    let mut out = Vec::new();
    flatten_into(list, &mut out)?;
    Ok(Value::Array(out))
}

pub(super) fn distinct(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "distinct";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(dedupe(list)))
}

pub(super) fn coalesce(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn compact(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn reverse(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "reverse";
    let list = want_list(F, "the argument", arg(&args, F, 0)?)?;
    Ok(Value::Array(list.iter().rev().cloned().collect()))
}

pub(super) fn slice(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn index(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "index";
    let list = want_list(F, "the first argument", arg(&args, F, 0)?)?;
    let needle = arg(&args, F, 1)?;
    list.iter()
        .position(|v| v == needle)
        .map(Value::from)
        .ok_or_else(|| format!("{F}: {} is not in the list", describe(needle)))
}

pub(super) fn zipmap(args: FuncArgs) -> Result<Value, String> {
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

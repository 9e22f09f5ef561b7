//! Type constraints (`type = map(string)`) and the conversions they allow.

use hcl::Value;
use hcl_edit::expr::Expression;

#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    Any,
    String,
    Number,
    Bool,
    List(Box<Type>),
    Set(Box<Type>),
    Map(Box<Type>),
    Object(Vec<(String, Type, bool)>),
    Tuple(Vec<Type>),
}

impl std::fmt::Display for Type {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Type::Any => f.write_str("any"),
            Type::String => f.write_str("string"),
            Type::Number => f.write_str("number"),
            Type::Bool => f.write_str("bool"),
            Type::List(t) => write!(f, "list({t})"),
            Type::Set(t) => write!(f, "set({t})"),
            Type::Map(t) => write!(f, "map({t})"),
            Type::Object(fields) => {
                f.write_str("object({")?;
                for (i, (k, t, opt)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if *opt {
                        write!(f, "{k} = optional({t})")?;
                    } else {
                        write!(f, "{k} = {t}")?;
                    }
                }
                f.write_str("})")
            }
            Type::Tuple(ts) => {
                f.write_str("tuple([")?;
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str("])")
            }
        }
    }
}

pub const TYPE_NAMES: &[&str] = &[
    "any", "string", "number", "bool", "list", "set", "map", "object", "tuple",
];

/// Read a type constraint written as an expression. Errors are a message for the expression's span.
pub fn parse_type(expr: &Expression) -> Result<Type, String> {
    match expr {
        Expression::Variable(v) => match v.as_str() {
            "any" => Ok(Type::Any),
            "string" => Ok(Type::String),
            "number" => Ok(Type::Number),
            "bool" => Ok(Type::Bool),
            "list" | "set" | "map" => Ok(wrap(v.as_str(), Type::Any)),
            other => Err(unknown_type(other)),
        },
        Expression::FuncCall(call) => {
            let name = call.name.name.as_str();
            let args: Vec<&Expression> = call.args.iter().collect();
            match (name, args.as_slice()) {
                ("list" | "set" | "map", [inner]) => Ok(wrap(name, parse_type(inner)?)),
                ("object", [Expression::Object(obj)]) => {
                    let mut fields = Vec::new();
                    for (key, value) in obj.iter() {
                        let k = match key {
                            hcl_edit::expr::ObjectKey::Ident(id) => id.as_str().to_string(),
                            hcl_edit::expr::ObjectKey::Expression(Expression::String(s)) => {
                                s.value().to_string()
                            }
                            _ => return Err("object type keys must be names".into()),
                        };
                        let (t, optional) = match value.expr() {
                            Expression::FuncCall(c) if c.name.name.as_str() == "optional" => {
                                match c.args.iter().next() {
                                    Some(inner) => (parse_type(inner)?, true),
                                    None => return Err("optional() needs a type".into()),
                                }
                            }
                            e => (parse_type(e)?, false),
                        };
                        fields.push((k, t, optional));
                    }
                    Ok(Type::Object(fields))
                }
                ("tuple", [Expression::Array(arr)]) => Ok(Type::Tuple(
                    arr.iter().map(parse_type).collect::<Result<_, _>>()?,
                )),
                ("list" | "set" | "map", _) => Err(format!("{name}(...) takes one element type")),
                ("object", _) => Err("object(...) takes one object of attribute types".into()),
                ("tuple", _) => Err("tuple(...) takes one list of element types".into()),
                (other, _) => Err(unknown_type(other)),
            }
        }
        _ => Err("a type constraint is a type name such as string, list(string) or object({...}), not a value".into()),
    }
}

fn wrap(name: &str, t: Type) -> Type {
    match name {
        "list" => Type::List(Box::new(t)),
        "set" => Type::Set(Box::new(t)),
        _ => Type::Map(Box::new(t)),
    }
}

fn unknown_type(name: &str) -> String {
    match crate::diag::did_you_mean(name, TYPE_NAMES.iter().copied()) {
        Some(s) => format!("unknown type `{name}`; did you mean `{s}`?"),
        None => format!("unknown type `{name}`; types are {}", TYPE_NAMES.join(", ")),
    }
}

/// A short description of a value for error messages: `string "abc"`, `list of 2 elements`.
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("bool {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => {
            let short: String = s.chars().take(40).collect();
            if short.len() < s.len() {
                format!("string {short:?}…")
            } else {
                format!("string {s:?}")
            }
        }
        Value::Array(a) => format!("list of {} element{}", a.len(), plural(a.len())),
        Value::Object(o) => {
            let keys: Vec<&str> = o.keys().map(String::as_str).take(5).collect();
            format!(
                "object {{{}{}}}",
                keys.join(", "),
                if o.len() > 5 { ", …" } else { "" }
            )
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Convert a value to a type, as Terraform does: numbers and bools become strings where a string
/// is wanted, numeric strings become numbers. The error names the path inside the value.
pub fn convert(v: &Value, t: &Type) -> Result<Value, String> {
    convert_at(v, t, "")
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" at {path}")
    }
}

fn convert_at(v: &Value, t: &Type, path: &str) -> Result<Value, String> {
    let mismatch = || format!("expected {t}, found {}{}", describe(v), at(path));
    match (t, v) {
        (Type::Any, _) => Ok(v.clone()),
        (_, Value::Null) => Ok(Value::Null),
        (Type::String, Value::String(_)) => Ok(v.clone()),
        (Type::String, Value::Number(n)) => Ok(Value::String(n.to_string())),
        (Type::String, Value::Bool(b)) => Ok(Value::String(b.to_string())),
        (Type::Number, Value::Number(_)) => Ok(v.clone()),
        (Type::Number, Value::String(s)) => parse_number(s).ok_or_else(mismatch),
        (Type::Bool, Value::Bool(_)) => Ok(v.clone()),
        (Type::Bool, Value::String(s)) if s == "true" || s == "false" => {
            Ok(Value::Bool(s == "true"))
        }
        (Type::List(inner), Value::Array(items)) => Ok(Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| convert_at(x, inner, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        )),
        (Type::Set(inner), Value::Array(items)) => {
            let mut out: Vec<Value> = Vec::new();
            for (i, x) in items.iter().enumerate() {
                let c = convert_at(x, inner, &format!("{path}[{i}]"))?;
                if !out.contains(&c) {
                    out.push(c);
                }
            }
            Ok(Value::Array(out))
        }
        (Type::Map(inner), Value::Object(items)) => {
            let mut out = hcl::Map::new();
            for (k, x) in items {
                out.insert(k.clone(), convert_at(x, inner, &join_key(path, k))?);
            }
            Ok(Value::Object(out))
        }
        (Type::Object(fields), Value::Object(items)) => {
            let mut out = hcl::Map::new();
            for (k, ft, optional) in fields {
                match items.get(k) {
                    Some(x) => {
                        out.insert(k.clone(), convert_at(x, ft, &join_key(path, k))?);
                    }
                    None if *optional => {
                        out.insert(k.clone(), Value::Null);
                    }
                    None => return Err(format!("attribute `{k}` is required by {t}{}", at(path))),
                }
            }
            for k in items.keys() {
                if !fields.iter().any(|(f, _, _)| f == k) {
                    return Err(format!(
                        "unexpected attribute `{k}`{}; {t} has {}",
                        at(path),
                        fields
                            .iter()
                            .map(|f| f.0.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
            Ok(Value::Object(out))
        }
        (Type::Tuple(ts), Value::Array(items)) if ts.len() == items.len() => Ok(Value::Array(
            items
                .iter()
                .zip(ts)
                .enumerate()
                .map(|(i, (x, t))| convert_at(x, t, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        )),
        _ => Err(mismatch()),
    }
}

fn join_key(path: &str, k: &str) -> String {
    if crate::config::refs::is_ident(k) {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    } else {
        format!("{path}[{k:?}]")
    }
}

pub fn parse_number(s: &str) -> Option<Value> {
    let s = s.trim();
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::Number(hcl::Number::from(i)));
    }
    s.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .and_then(hcl::Number::from_f64)
        .map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(s: &str) -> Type {
        parse_type(&hcl_edit::parser::parse_expr(s).unwrap()).unwrap()
    }

    #[test]
    fn parses_nested_types() {
        assert_eq!(ty("map(list(string))").to_string(), "map(list(string))");
        assert_eq!(
            ty("object({ a = string, b = optional(number) })").to_string(),
            "object({a = string, b = optional(number)})"
        );
        let err = parse_type(&hcl_edit::parser::parse_expr("strng").unwrap()).unwrap_err();
        assert!(err.contains("did you mean `string`"), "{err}");
    }

    #[test]
    fn converts_like_terraform() {
        let v = Value::from(3);
        assert_eq!(convert(&v, &Type::String).unwrap(), Value::from("3"));
        assert_eq!(
            convert(&Value::from("2.5"), &Type::Number).unwrap(),
            Value::Number(hcl::Number::from_f64(2.5).unwrap())
        );
        let err = convert(&Value::from("x"), &Type::Number).unwrap_err();
        assert!(err.contains("expected number, found string \"x\""), "{err}");
        let list = Value::Array(vec![Value::from("a"), Value::Object(hcl::Map::new())]);
        let err = convert(&list, &Type::List(Box::new(Type::String))).unwrap_err();
        assert!(err.contains("at [1]"), "{err}");
    }
}

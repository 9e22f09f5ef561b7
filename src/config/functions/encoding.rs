//! Encoding and files: JSON in and out, `file()` relative to the module folder.

use super::*;

pub(super) fn json_string(s: &str, out: &mut String) {
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
pub(super) fn json_encode(v: &Value, out: &mut String) {
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

pub(super) fn jsonencode(args: FuncArgs) -> Result<Value, String> {
    let v = arg(&args, "jsonencode", 0)?;
    let mut out = String::new();
    json_encode(v, &mut out);
    Ok(Value::String(out))
}

pub(super) fn from_json(v: serde_json::Value) -> Result<Value, String> {
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

pub(super) fn jsondecode(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn file(args: FuncArgs) -> Result<Value, String> {
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

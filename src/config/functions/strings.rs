//! String functions: case, trimming, splitting, regular expressions, `format`, base64,
//! sha256.

use super::*;

pub(super) fn join(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn split(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn string_fn(
    args: &FuncArgs,
    f: &str,
    op: impl FnOnce(&str) -> String,
) -> Result<Value, String> {
    let s = want_str(f, "the argument", arg(args, f, 0)?)?;
    Ok(Value::String(op(&s)))
}

pub(super) fn upper(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "upper", str::to_uppercase)
}

pub(super) fn lower(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "lower", str::to_lowercase)
}

pub(super) fn trimspace(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "trimspace", |s| s.trim().to_string())
}

pub(super) fn chomp(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "chomp", |s| {
        s.trim_end_matches(['\n', '\r']).to_string()
    })
}

pub(super) fn two_strings(
    args: &FuncArgs,
    f: &str,
    second: &str,
) -> Result<(String, String), String> {
    Ok((
        want_str(f, "the string", arg(args, f, 0)?)?,
        want_str(f, second, arg(args, f, 1)?)?,
    ))
}

pub(super) fn startswith(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "startswith", "the prefix")?;
    Ok(Value::Bool(s.starts_with(&p)))
}

pub(super) fn endswith(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "endswith", "the suffix")?;
    Ok(Value::Bool(s.ends_with(&p)))
}

pub(super) fn trim(args: FuncArgs) -> Result<Value, String> {
    let (s, cutset) = two_strings(&args, "trim", "the set of characters")?;
    Ok(Value::String(
        s.trim_matches(|c: char| cutset.contains(c)).to_string(),
    ))
}

pub(super) fn trimprefix(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "trimprefix", "the prefix")?;
    Ok(Value::String(
        s.strip_prefix(p.as_str()).unwrap_or(&s).to_string(),
    ))
}

pub(super) fn trimsuffix(args: FuncArgs) -> Result<Value, String> {
    let (s, p) = two_strings(&args, "trimsuffix", "the suffix")?;
    Ok(Value::String(
        s.strip_suffix(p.as_str()).unwrap_or(&s).to_string(),
    ))
}

pub(super) fn substr(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn replace(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn compile_regex(f: &str, pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern)
        .map_err(|e| format!("{f}: invalid regular expression {}: {e}", quote(pattern)))
}

/// The result of one regex match, Terraform-style: the matched string when the
/// pattern has no capture groups, an object for named groups, otherwise a list
/// of the groups (unmatched groups are null).
pub(super) fn match_value(re: &Regex, caps: &regex::Captures<'_>) -> Value {
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

pub(super) fn regex(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn regexall(args: FuncArgs) -> Result<Value, String> {
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

pub(super) fn format(args: FuncArgs) -> Result<Value, String> {
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
pub(super) fn read_num(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<usize> {
    let mut n: Option<usize> = None;
    while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
        let d = usize::try_from(d).unwrap_or(0);
        n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d));
        chars.next();
    }
    n
}

pub(super) fn format_v(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            json_encode(other, &mut out);
            out
        }
    }
}

pub(super) fn base64encode(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "base64encode", |s| base64_encode(s.as_bytes()))
}

pub(super) fn base64decode(args: FuncArgs) -> Result<Value, String> {
    const F: &str = "base64decode";
    let s = want_str(F, "the argument", arg(&args, F, 0)?)?;
    let bytes =
        base64_decode(&s).ok_or_else(|| format!("{F}: {} is not valid base64", quote(&s)))?;
    String::from_utf8(bytes)
        .map(Value::String)
        .map_err(|_| format!("{F}: the decoded bytes are not valid UTF-8"))
}

pub(super) const B64: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub(super) fn base64_encode(bytes: &[u8]) -> String {
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

pub(super) fn base64_decode(s: &str) -> Option<Vec<u8>> {
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

pub(super) fn sha256(args: FuncArgs) -> Result<Value, String> {
    string_fn(&args, "sha256", |s| {
        let digest = Sha256::digest(s.as_bytes());
        let mut hex = String::with_capacity(64);
        for b in digest.iter() {
            let _ = write!(hex, "{b:02x}");
        }
        hex
    })
}

//! Values as a reviewer reads them: expanded one list element or map entry per line, never cut,
//! strings with newlines as heredocs, recorded secrets as `(sensitive)`, and in an update only
//! what changed inside a list, map or object, with the unchanged rest folded into a count.
//!
//! Every function returns text whose first line continues the line the caller has started
//! (`  ~ command = `) and whose further lines carry their own indentation, so values nest to any
//! depth. `col` is the column of the sign of the line the value belongs to: its elements put their
//! sign at `col + 4` and its closing bracket at `col + 2`, as Terraform lays them out.

use serde_json::Value;
use similar::{capture_diff_slices, Algorithm, DiffOp};

/// Unchanged list elements kept visible on each side of a change: enough to show the flag an
/// argument belongs to (`"--max-model-len"` above `- "8192"`).
const CONTEXT: usize = 1;

/// Written where a value derived from a sensitive variable would be.
pub const SENSITIVE: &str = "(sensitive)";

/// What a line says happens to the value it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sign {
    Add,
    Remove,
    Change,
    Keep,
}

impl Sign {
    pub fn char(self) -> char {
        match self {
            Sign::Add => '+',
            Sign::Remove => '-',
            Sign::Change => '~',
            Sign::Keep => ' ',
        }
    }
}

/// How a folded run of unchanged entries is counted: lists and maps have elements, objects (a
/// `ready` block, a request body) attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noun {
    Elements,
    Attributes,
}

/// `# (3 unchanged elements hidden)`.
pub fn hidden(n: usize, noun: Noun) -> String {
    let word = match (noun, n) {
        (Noun::Elements, 1) => "element",
        (Noun::Elements, _) => "elements",
        (Noun::Attributes, 1) => "attribute",
        (Noun::Attributes, _) => "attributes",
    };
    format!("# ({n} unchanged {word} hidden)")
}

/// A value the state and plan hold only as its hash: a secret.
pub fn is_hash(v: &Value) -> bool {
    v.as_str().is_some_and(crate::state::is_sensitive_hash)
}

fn pad(n: usize) -> String {
    " ".repeat(n)
}

/// A map key as written in HCL: bare when it is an identifier, quoted otherwise.
pub fn key(k: &str) -> String {
    let mut chars = k.chars();
    let ident = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ident {
        k.to_string()
    } else {
        serde_json::to_string(k).unwrap_or_else(|_| k.to_string())
    }
}

/// The heredoc delimiter: `EOT`, lengthened until no line of the text is the delimiter itself.
fn delimiter<'a>(lines: impl Iterator<Item = &'a str> + Clone) -> String {
    let mut d = String::from("EOT");
    while lines.clone().any(|l| l.trim() == d) {
        d.push('_');
    }
    d
}

/// `v` in full. `sign` marks every nested element (a created list shows `+` on each element).
pub fn value(v: &Value, sign: Sign, col: usize) -> String {
    match v {
        _ if is_hash(v) => SENSITIVE.to_string(),
        Value::String(s) if s.contains('\n') => heredoc(s, col),
        Value::Array(items) if items.is_empty() => "[]".into(),
        Value::Object(map) if map.is_empty() => "{}".into(),
        Value::Array(items) => {
            let mut out = String::from("[\n");
            for item in items {
                out.push_str(&format!(
                    "{}{} {},\n",
                    pad(col + 4),
                    sign.char(),
                    value(item, sign, col + 4)
                ));
            }
            out.push_str(&pad(col + 2));
            out.push(']');
            out
        }
        Value::Object(map) => block(
            map.iter()
                .map(|(k, item)| (sign, k.as_str(), value(item, sign, col + 4)))
                .collect(),
            None,
            col,
        ),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// A value that must not be shown, whatever its shape, except that an object keeps the entries
/// that are not secrets: its secrets are already hashes (`recorded_config`), so a map with one
/// token among plain settings shows the settings.
pub fn sensitive_value(v: &Value, sign: Sign, col: usize) -> String {
    match v {
        Value::Object(map) if !map.is_empty() => value(v, sign, col),
        _ => SENSITIVE.to_string(),
    }
}

fn heredoc(s: &str, col: usize) -> String {
    let body = s.strip_suffix('\n').unwrap_or(s);
    let d = delimiter(body.lines());
    let mut out = format!("<<-{d}\n");
    for line in body.lines() {
        // No trailing blanks on an empty line of the text.
        if !line.is_empty() {
            out.push_str(&pad(col + 6));
            out.push_str(line);
        }
        out.push('\n');
    }
    out.push_str(&pad(col + 2));
    out.push_str(&d);
    out
}

/// What changed from `before` to `after` (which differ).
pub fn diff(before: &Value, after: &Value, col: usize) -> String {
    match (before, after) {
        _ if is_hash(before) || is_hash(after) => format!("{SENSITIVE} → {SENSITIVE}"),
        (Value::Array(b), Value::Array(a)) if !b.is_empty() && !a.is_empty() => {
            list_diff(b, a, col)
        }
        (Value::Object(b), Value::Object(a)) if !b.is_empty() && !a.is_empty() => {
            object_diff(b, a, col)
        }
        (Value::String(b), Value::String(a)) if b.contains('\n') || a.contains('\n') => {
            heredoc_diff(b, a, col)
        }
        _ => format!(
            "{} → {}",
            value(before, Sign::Keep, col),
            value(after, Sign::Keep, col)
        ),
    }
}

/// Two elements at the same place whose insides are worth diffing rather than printing twice:
/// blocks, lists, and texts of several lines (a script).
fn paired(b: &Value, a: &Value) -> bool {
    let composite = |v: &Value| matches!(v, Value::Array(_) | Value::Object(_));
    let text = |v: &Value| v.as_str().is_some_and(|s| s.contains('\n'));
    !is_hash(b) && !is_hash(a) && ((composite(b) && composite(a)) || (text(b) && text(a)))
}

/// One line of a list diff before folding.
enum Item<'a> {
    Same(&'a Value),
    Removed(&'a Value),
    Added(&'a Value),
    /// An element whose insides changed (a `ready` block whose timeout changed).
    Changed(&'a Value, &'a Value),
}

fn list_diff(before: &[Value], after: &[Value], col: usize) -> String {
    // Elements compare by their JSON text: `similar` wants hashable items.
    let keys = |vs: &[Value]| -> Vec<String> {
        vs.iter()
            .map(|v| serde_json::to_string(v).unwrap_or_default())
            .collect()
    };
    let (bk, ak) = (keys(before), keys(after));
    let mut items = Vec::new();
    for op in capture_diff_slices(Algorithm::Myers, &bk, &ak) {
        match op {
            DiffOp::Equal { new_index, len, .. } => {
                items.extend(after[new_index..new_index + len].iter().map(Item::Same));
            }
            DiffOp::Delete {
                old_index, old_len, ..
            } => items.extend(
                before[old_index..old_index + old_len]
                    .iter()
                    .map(Item::Removed),
            ),
            DiffOp::Insert {
                new_index, new_len, ..
            } => items.extend(
                after[new_index..new_index + new_len]
                    .iter()
                    .map(Item::Added),
            ),
            DiffOp::Replace {
                old_index,
                old_len,
                new_index,
                new_len,
            } => {
                let (b, a) = (
                    &before[old_index..old_index + old_len],
                    &after[new_index..new_index + new_len],
                );
                if old_len == new_len && b.iter().zip(a).all(|(x, y)| paired(x, y)) {
                    items.extend(b.iter().zip(a).map(|(x, y)| Item::Changed(x, y)));
                } else {
                    items.extend(b.iter().map(Item::Removed));
                    items.extend(a.iter().map(Item::Added));
                }
            }
        }
    }
    let changed: Vec<bool> = items.iter().map(|i| !matches!(i, Item::Same(_))).collect();
    let near_change = |i: usize| {
        let lo = i.saturating_sub(CONTEXT);
        let hi = (i + CONTEXT).min(changed.len() - 1);
        changed[lo..=hi].iter().any(|c| *c)
    };
    let mut out = String::from("[\n");
    let mut i = 0;
    while i < items.len() {
        if let Item::Same(_) = items[i] {
            if !near_change(i) {
                let start = i;
                while i < items.len() && matches!(items[i], Item::Same(_)) && !near_change(i) {
                    i += 1;
                }
                // Folding a single element into a comment line would hide it for nothing.
                if i - start > 1 {
                    out.push_str(&format!(
                        "{}{}\n",
                        pad(col + 6),
                        hidden(i - start, Noun::Elements)
                    ));
                    continue;
                }
                i = start;
            }
        }
        let line = match &items[i] {
            Item::Same(v) => (Sign::Keep, value(v, Sign::Keep, col + 4)),
            Item::Removed(v) => (Sign::Remove, value(v, Sign::Remove, col + 4)),
            Item::Added(v) => (Sign::Add, value(v, Sign::Add, col + 4)),
            Item::Changed(b, a) => (Sign::Change, diff(b, a, col + 4)),
        };
        out.push_str(&format!("{}{} {},\n", pad(col + 4), line.0.char(), line.1));
        i += 1;
    }
    out.push_str(&pad(col + 2));
    out.push(']');
    out
}

fn object_diff(
    before: &serde_json::Map<String, Value>,
    after: &serde_json::Map<String, Value>,
    col: usize,
) -> String {
    let mut keys: Vec<&String> = after.keys().collect();
    keys.extend(before.keys().filter(|k| !after.contains_key(*k)));
    let mut lines = Vec::new();
    let mut unchanged = 0;
    for k in keys {
        match (before.get(k), after.get(k)) {
            (Some(b), Some(a)) if b == a => unchanged += 1,
            (Some(b), Some(a)) => lines.push((Sign::Change, k.as_str(), diff(b, a, col + 4))),
            (None, Some(a)) => lines.push((Sign::Add, k.as_str(), value(a, Sign::Add, col + 4))),
            (Some(b), None) => {
                lines.push((Sign::Remove, k.as_str(), value(b, Sign::Remove, col + 4)))
            }
            (None, None) => {}
        }
    }
    let folded = (unchanged > 0).then(|| hidden(unchanged, Noun::Attributes));
    block(lines, folded, col)
}

/// `{`, one `sign key = value` line per entry with the `=` aligned, an optional comment for
/// what is folded, `}`: maps and objects, whole or as a diff.
pub fn block(entries: Vec<(Sign, &str, String)>, folded: Option<String>, col: usize) -> String {
    let width = entries
        .iter()
        .map(|(_, k, _)| key(k).chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::from("{\n");
    for (sign, k, text) in entries {
        out.push_str(&format!(
            "{}{} {:width$} = {text}\n",
            pad(col + 4),
            sign.char(),
            key(k)
        ));
    }
    if let Some(comment) = folded {
        out.push_str(&format!("{}{comment}\n", pad(col + 6)));
    }
    out.push_str(&pad(col + 2));
    out.push('}');
    out
}

/// Two texts with newlines: the lines removed and added, unchanged ones as context.
fn heredoc_diff(before: &str, after: &str, col: usize) -> String {
    let b: Vec<&str> = before
        .strip_suffix('\n')
        .unwrap_or(before)
        .lines()
        .collect();
    let a: Vec<&str> = after.strip_suffix('\n').unwrap_or(after).lines().collect();
    let d = delimiter(b.iter().chain(a.iter()).copied());
    let mut out = format!("<<-{d}\n");
    let mut line = |sign: Sign, text: &str| {
        let line = format!("{}{} {}", pad(col + 4), sign.char(), text);
        out.push_str(line.trim_end());
        out.push('\n');
    };
    for op in capture_diff_slices(Algorithm::Myers, &b, &a) {
        for (tag, old, new) in op
            .iter_changes(&b, &a)
            .map(|c| (c.tag(), c.old_index(), c.new_index()))
        {
            match (tag, old, new) {
                (similar::ChangeTag::Equal, _, Some(n)) => line(Sign::Keep, a[n]),
                (similar::ChangeTag::Delete, Some(o), _) => line(Sign::Remove, b[o]),
                (similar::ChangeTag::Insert, _, Some(n)) => line(Sign::Add, a[n]),
                _ => {}
            }
        }
    }
    out.push_str(&pad(col + 2));
    out.push_str(&d);
    out
}

/// Put `marker` at the end of the first line of `text` (after `[` for a list, so the mark sits
/// on the attribute it is about).
pub fn mark_first_line(text: &str, marker: &str) -> String {
    match text.split_once('\n') {
        Some((first, rest)) => format!("{first}{marker}\n{rest}"),
        None => format!("{text}{marker}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strings(xs: &[&str]) -> Value {
        json!(xs)
    }

    #[test]
    fn a_changed_value_in_a_long_list_shows_its_flag_and_folds_the_rest() {
        let mut b: Vec<String> = (0..14).map(|i| format!("a{i}")).collect();
        b.extend(["--max-model-len".into(), "8192".into(), "--x".into()]);
        let mut a = b.clone();
        a[15] = "4096".into();
        let expected = [
            "[",
            "            # (14 unchanged elements hidden)",
            "            \"--max-model-len\",",
            "          - \"8192\",",
            "          + \"4096\",",
            "            \"--x\",",
            "        ]",
        ];
        assert_eq!(diff(&json!(b), &json!(a), 6), expected.join("\n"));
    }

    #[test]
    fn a_single_hidden_element_is_shown_instead() {
        let out = diff(&strings(&["x", "b", "c"]), &strings(&["x", "b", "d"]), 0);
        assert!(!out.contains("hidden"), "{out}");
        assert!(out.contains("  \"x\",") && out.contains("- \"c\"") && out.contains("+ \"d\""));
    }

    #[test]
    fn nested_objects_show_only_what_changed() {
        let b = json!([{"http": "u", "timeout": 600, "interval": 2}]);
        let a = json!([{"http": "u", "timeout": 300, "interval": 2}]);
        let out = diff(&b, &a, 0);
        assert!(out.contains("~ timeout = 600 → 300"), "{out}");
        assert!(out.contains("# (2 unchanged attributes hidden)"), "{out}");
        assert!(!out.contains("\"u\""), "{out}");
    }

    #[test]
    fn secrets_stay_hidden_and_heredocs_keep_their_lines() {
        let h = hash_of("s");
        assert_eq!(value(&h, Sign::Add, 0), SENSITIVE);
        assert_eq!(diff(&h, &hash_of("t"), 0), "(sensitive) → (sensitive)");
        let v = json!({"A": "1", "TOKEN": h});
        assert!(value(&v, Sign::Add, 0).contains("+ TOKEN = (sensitive)"));
        assert_eq!(sensitive_value(&json!(["x"]), Sign::Add, 0), SENSITIVE);
        let text = value(&json!("one\nEOT\n"), Sign::Add, 0);
        assert_eq!(text, "<<-EOT_\n      one\n      EOT\n  EOT_");
        let d = diff(&json!("a\nb\n"), &json!("a\nc\n"), 0);
        assert_eq!(d, "<<-EOT\n      a\n    - b\n    + c\n  EOT");
    }

    fn hash_of(s: &str) -> Value {
        let key = crate::state::HashKey::from_bytes([3; 32]);
        crate::state::hash_sensitive(Some(&key), &json!(s))
    }

    #[test]
    fn marker_goes_on_the_first_line() {
        assert_eq!(mark_first_line("[\n]", " # m"), "[ # m\n]");
        assert_eq!(mark_first_line("1 → 2", " # m"), "1 → 2 # m");
    }
}

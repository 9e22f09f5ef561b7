//! `sparkform.lock.hcl`: what the definitions' values left to the world resolved to when they
//! were last applied (or `sparkform lock`), kept beside them and committed with them, as
//! Terraform's `.terraform.lock.hcl` is. One block per locked thing, named by the kind's block
//! type and the block's address (`model "model.qwen" { … }`); its attributes are the kind's
//! (the kinds write and read their own entries: `Kind::lock_entry`, their plan-time read). Pure:
//! parsing and printing; `ops` reads and writes the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::diag::{Diag, SourceFile, Span};

/// The file's name, beside the definitions.
pub const FILE: &str = "sparkform.lock.hcl";

/// A lock file's larger than this is refused (a lock holds a few lines per model block).
const MAX_BYTES: u64 = 1 << 20;

const HEADER: &str = "# sparkform.lock.hcl: what this deployment's definitions resolved to when they were last\n# applied (or `sparkform lock`). Commit it with them; sparkform rewrites it, so edits are lost.\n";

/// The attributes of one entry: texts, numbers, booleans and lists of them.
pub type Entry = BTreeMap<String, serde_json::Value>;

/// The entries, by (block type, label).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LockFile {
    pub entries: BTreeMap<(String, String), Entry>,
}

impl LockFile {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// The lock beside the definitions in `dir`; `None` when there is none.
    pub fn load(dir: &Path) -> Result<Option<LockFile>, Box<Diag>> {
        let path = LockFile::path(dir);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Box::new(io_error(&path, &e))),
        };
        if meta.len() > MAX_BYTES {
            return Err(Box::new(
                Diag::error(
                    "lock::too_large",
                    format!(
                        "{} is {} bytes, more than a lock file holds",
                        path.display(),
                        meta.len()
                    ),
                )
                .help("it is written by sparkform: remove it and run `sparkform lock`"),
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Box::new(io_error(&path, &e)))?;
        LockFile::parse(&path, text).map(Some)
    }

    /// Read a lock file's text; errors point at the line.
    pub fn parse(path: &Path, text: String) -> Result<LockFile, Box<Diag>> {
        let file = Arc::new(SourceFile::new(path, text.clone()));
        let located = |range: std::ops::Range<usize>, message: String, label: &str| {
            Box::new(
                Diag::error("lock::invalid", format!("{}: {message}", FILE))
                    .label(&Span::new(&file, range), label.to_string())
                    .help("the lock file is written by sparkform: restore it from version control, or remove it and run `sparkform lock`"),
            )
        };
        let body = hcl_edit::parser::parse_body(&text).map_err(|e| {
            let at = offset_of(&text, e.location().line(), e.location().column());
            located(at..at, e.message().to_string(), "here")
        })?;
        let mut lock = LockFile::default();
        for structure in body.iter() {
            let span = hcl_edit::Span::span(structure).unwrap_or(0..0);
            let Some(block) = structure.as_block() else {
                return Err(located(
                    span,
                    "a top-level attribute".into(),
                    "only blocks belong here",
                ));
            };
            let label = match block.labels.as_slice() {
                [l] => match l {
                    hcl_edit::structure::BlockLabel::String(s) => s.value().to_string(),
                    hcl_edit::structure::BlockLabel::Ident(i) => i.as_str().to_string(),
                },
                _ => {
                    return Err(located(
                        span,
                        format!("block `{}` needs exactly one label", block.ident.as_str()),
                        "one label: the locked block's address",
                    ))
                }
            };
            let mut entry = Entry::new();
            for item in block.body.iter() {
                let item_span = hcl_edit::Span::span(item).unwrap_or(span.clone());
                let Some(attr) = item.as_attribute() else {
                    return Err(located(
                        item_span,
                        "a nested block".into(),
                        "entries hold attributes only",
                    ));
                };
                let value = literal(&attr.value).ok_or_else(|| {
                    located(
                        item_span.clone(),
                        format!("`{}` is not a literal value", attr.key.as_str()),
                        "texts, numbers, booleans and lists of them",
                    )
                })?;
                entry.insert(attr.key.as_str().to_string(), value);
            }
            let key = (block.ident.as_str().to_string(), label);
            if lock.entries.insert(key.clone(), entry).is_some() {
                return Err(located(
                    span,
                    format!("{} \"{}\" twice", key.0, key.1),
                    "the second",
                ));
            }
        }
        Ok(lock)
    }

    /// The file's text: blocks in order, attributes in order, aligned as `sparkform fmt`
    /// aligns them.
    pub fn render(&self) -> String {
        let mut out = String::from(HEADER);
        for ((kind, label), entry) in &self.entries {
            out.push('\n');
            out.push_str(&format!("{kind} {} {{\n", quote(label)));
            let width = entry.keys().map(|k| k.len()).max().unwrap_or(0);
            for (k, v) in entry {
                out.push_str(&format!("  {k:width$} = {}\n", expression(v)));
            }
            out.push_str("}\n");
        }
        out
    }

    /// Write it beside the definitions, atomically (a temporary file renamed over it).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let path = LockFile::path(dir);
        let tmp = dir.join(format!(".{FILE}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    pub fn entry(&self, kind: &str, label: &str) -> Option<&Entry> {
        self.entries.get(&(kind.to_string(), label.to_string()))
    }

    /// What changes from `self` to `new`, one line per entry, in the plan's words.
    pub fn changes(&self, new: &LockFile) -> Vec<String> {
        let mut out = Vec::new();
        // A model's label is its address (`model.qwen`); an image's, its reference.
        let named = |(kind, label): &(String, String)| {
            if label.starts_with(kind.as_str()) {
                label.clone()
            } else {
                format!("{kind} {label}")
            }
        };
        for (key, after) in &new.entries {
            let name = named(key);
            match self.entries.get(key) {
                None => out.push(format!("{name}: locked ({})", summary(after))),
                Some(before) if before != after => out.push(format!(
                    "{name}: {} (was {})",
                    summary(after),
                    summary(before)
                )),
                Some(_) => {}
            }
        }
        for key in self
            .entries
            .keys()
            .filter(|k| !new.entries.contains_key(*k))
        {
            out.push(format!("{}: no longer locked", named(key)));
        }
        out
    }
}

/// An entry in a few words: its `revision` and `commit` when it has them.
fn summary(e: &Entry) -> String {
    let text = |k: &str| e.get(k).and_then(|v| v.as_str()).map(str::to_string);
    match (text("revision"), text("commit")) {
        (Some(r), Some(c)) => format!("{r} at {}", &c[..c.len().min(12)]),
        _ => e
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(text) => format!("{k} = {}", short_digest(text)),
                None => format!("{k} = {v}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// A digest as people compare them: `sha256:` and 12 hex digits (a registry digest keeps its
/// repository); other texts as they are.
fn short_digest(text: &str) -> String {
    match text.split_once("sha256:") {
        Some((before, hex)) if hex.len() > 12 && hex.chars().all(|c| c.is_ascii_hexdigit()) => {
            format!("{before}sha256:{}", &hex[..12])
        }
        _ => text.to_string(),
    }
}

fn io_error(path: &Path, e: &std::io::Error) -> Diag {
    Diag::error("lock::io", format!("cannot read {}: {e}", path.display()))
}

/// Byte offset of a 1-based line and column.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + column.saturating_sub(1)).min(text.len())
}

/// A literal's value: a string without interpolation, a number, a boolean, null, or a list of
/// them; anything else is `None`.
fn literal(e: &hcl_edit::expr::Expression) -> Option<serde_json::Value> {
    use hcl_edit::expr::Expression as E;
    Some(match e {
        E::String(s) => serde_json::Value::String(s.value().to_string()),
        E::Number(n) => serde_json::to_value(n.value()).ok()?,
        E::Bool(b) => serde_json::Value::Bool(*b.value()),
        E::Null(_) => serde_json::Value::Null,
        E::Array(a) => serde_json::Value::Array(a.iter().map(literal).collect::<Option<_>>()?),
        _ => return None,
    })
}

/// A value as an HCL expression (what [`literal`] reads back).
fn expression(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => quote(s),
        serde_json::Value::Array(a) => {
            format!(
                "[{}]",
                a.iter().map(expression).collect::<Vec<_>>().join(", ")
            )
        }
        // Objects are written as their JSON text: a lock holds no nested blocks.
        serde_json::Value::Object(_) => quote(&v.to_string()),
        other => other.to_string(),
    }
}

/// An HCL string literal: JSON's escapes, and `${` / `%{` doubled so nothing interpolates.
fn quote(s: &str) -> String {
    let json = serde_json::Value::String(s.to_string()).to_string();
    json.replace("${", "$${").replace("%{", "%%{")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LockFile {
        let mut lock = LockFile::default();
        let mut e = Entry::new();
        e.insert("repo".into(), "org/model".into());
        e.insert("revision".into(), "main".into());
        e.insert(
            "commit".into(),
            "0123456789abcdef0123456789abcdef01234567".into(),
        );
        e.insert("total_bytes".into(), 3000.into());
        e.insert(
            "architectures".into(),
            serde_json::json!(["Qwen3ForCausalLM"]),
        );
        e.insert(
            "facts".into(),
            serde_json::json!({"a": "${x}"}).to_string().into(),
        );
        lock.entries.insert(("model".into(), "model.m".into()), e);
        lock
    }

    #[test]
    fn it_reads_back_what_it_writes_and_is_fmt_clean() {
        let lock = sample();
        let text = lock.render();
        // `sparkform fmt` leaves it as it is: tests/fake/prepare.rs checks a written one.
        assert_eq!(
            LockFile::parse(Path::new(FILE), text.clone()).unwrap(),
            lock
        );
        assert!(text.contains("model \"model.m\" {"), "{text}");
    }

    #[test]
    fn a_malformed_lock_is_a_located_error() {
        for bad in [
            "model \"m\" {\n  commit = \n}\n",
            "commit = \"x\"\n",
            "model {\n}\n",
            "model \"m\" {\n  commit = var.x\n}\n",
            "model \"m\" {\n}\nmodel \"m\" {\n}\n",
        ] {
            let e = LockFile::parse(Path::new(FILE), bad.into()).unwrap_err();
            assert_eq!(e.code, "lock::invalid", "{bad}: {e:?}");
            assert!(!e.labels.is_empty(), "located: {bad}");
        }
    }

    #[test]
    fn changes_say_what_moved() {
        let before = sample();
        let mut after = sample();
        if let Some(e) = after.entries.values_mut().next() {
            e.insert(
                "commit".into(),
                "89abcdef0123456789abcdef0123456789abcdef".into(),
            );
        }
        assert_eq!(
            before.changes(&after),
            ["model.m: main at 89abcdef0123 (was main at 0123456789ab)"]
        );
        assert!(before.changes(&before).is_empty());
        let image = |digest: &str| {
            let mut lock = LockFile::default();
            let mut e = Entry::new();
            e.insert("node2".into(), digest.into());
            lock.entries.insert(("image".into(), "ray:1".into()), e);
            lock
        };
        let (a, b) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        assert_eq!(
            image(&a).changes(&image(&b)),
            ["image ray:1: node2 = sha256:bbbbbbbbbbbb (was node2 = sha256:aaaaaaaaaaaa)"]
        );
    }
}

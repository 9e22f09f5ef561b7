//! The language reference (docs/language.md) lists exactly the blocks, attributes and functions
//! the schema accepts, with the same types and the same required flags.

use std::collections::{BTreeMap, BTreeSet};

use sparkform::config::schema::{top_level_blocks, BlockSpec, ValueType};

/// The name the reference uses for a schema type. A new `ValueType` fails to compile here until the
/// reference says how to write it.
fn type_name(kind: ValueType) -> &'static str {
    match kind {
        ValueType::Any => "any",
        ValueType::Str => "string",
        ValueType::Num => "number",
        ValueType::Bool => "bool",
        ValueType::ListStr => "list(string)",
        ValueType::MapStr => "map(string)",
        ValueType::Node => "node reference",
        ValueType::Jump => "jump reference",
        ValueType::Container => "container reference",
        ValueType::Duration => "duration",
        ValueType::Size => "size",
        ValueType::Gpus => "number or \"all\"",
        ValueType::RefList => "list of references",
        ValueType::Address => "resource address",
        ValueType::TypeExpr => "type",
        ValueType::ForEach => "map or set(string)",
    }
}

/// (type, required) of every attribute, by block path (`container`, `container.ready`).
type Attrs = BTreeMap<String, (String, bool)>;

fn schema_blocks() -> BTreeMap<String, Attrs> {
    fn walk(path: String, spec: &BlockSpec, out: &mut BTreeMap<String, Attrs>) {
        let attrs = spec
            .attrs
            .iter()
            .map(|a| {
                (
                    a.name.to_string(),
                    (type_name(a.kind).to_string(), a.required),
                )
            })
            .collect();
        out.insert(path.clone(), attrs);
        for child in spec.blocks {
            walk(format!("{path}.{}", child.name), child.spec, out);
        }
    }
    let mut out = BTreeMap::new();
    for spec in top_level_blocks() {
        walk(spec.kind.to_string(), spec, &mut out);
    }
    out
}

fn unquote(cell: &str) -> Option<String> {
    let cell = cell.trim();
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    Some(inner.to_string())
}

fn table_cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

/// The blocks the reference documents: headings "### `x`" / "#### `x.y`" and their attribute
/// tables (rows under a "| attribute | type | required | …" header).
fn documented_blocks(doc: &str) -> BTreeMap<String, Attrs> {
    let mut out: BTreeMap<String, Attrs> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_table = false;
    for line in doc.lines() {
        if let Some(h) = line
            .strip_prefix("#### ")
            .or_else(|| line.strip_prefix("### "))
        {
            current = unquote(h);
            in_table = false;
            continue;
        }
        if line.starts_with("## ") {
            current = None;
            in_table = false;
            continue;
        }
        let Some(block) = &current else { continue };
        if line.starts_with("| attribute | type | required |") {
            in_table = true;
            out.entry(block.clone()).or_default();
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if line.starts_with("|---") {
            continue;
        }
        let cells = table_cells(line);
        let name =
            unquote(&cells[0]).unwrap_or_else(|| panic!("attribute cell not quoted: {line}"));
        let required = match cells.get(2).map(String::as_str) {
            Some("yes") => true,
            Some("no") => false,
            other => panic!("required must be yes or no in {line}: {other:?}"),
        };
        let ty = cells.get(1).cloned().unwrap_or_default();
        let prev = out
            .entry(block.clone())
            .or_default()
            .insert(name.clone(), (ty, required));
        assert!(prev.is_none(), "{block}.{name} documented twice");
    }
    out
}

fn reference() -> String {
    std::fs::read_to_string("docs/language.md").expect("docs/language.md")
}

#[test]
fn every_block_and_attribute_is_documented_with_its_type() {
    let schema = schema_blocks();
    let doc = documented_blocks(&reference());
    let schema_names: BTreeSet<&String> = schema.keys().collect();
    let doc_names: BTreeSet<&String> = doc.keys().collect();
    assert_eq!(
        schema_names, doc_names,
        "blocks in the schema vs in docs/language.md"
    );
    for (block, attrs) in &schema {
        assert_eq!(
            attrs, &doc[block],
            "attributes of `{block}`: schema (left) vs docs/language.md (right)"
        );
    }
}

#[test]
fn every_function_is_documented() {
    let doc = reference();
    let section = doc
        .split("\n## Functions")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Functions section");
    let mut documented = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        // "`range(end)`, `range(start, end, step)`": every quoted call names the function.
        let cell = &table_cells(line)[0];
        for call in cell.split('`').skip(1).step_by(2) {
            if let Some(name) = call.split('(').next() {
                documented.insert(name.to_string());
            }
        }
    }
    let library: BTreeSet<String> = sparkform::config::functions::FUNCTION_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        library, documented,
        "functions in the library (left) vs in docs/language.md (right)"
    );
}

#[test]
fn the_reference_parser_sees_a_missing_attribute() {
    // Guards the test itself: dropping a row must make the comparison fail.
    let doc = reference().replace("| `mtu` | number | no |", "| `mtu_typo` | number | no |");
    let documented = documented_blocks(&doc);
    assert_ne!(schema_blocks()["network"], documented["network"]);
}

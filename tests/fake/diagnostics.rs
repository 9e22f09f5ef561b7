//! Every diagnostic kind, rendered, against a snapshot: file, line, column, labels, help.

use crate::common;

use std::path::Path;

#[test]
fn every_diagnostic_fixture_matches_its_snapshot() {
    let root = Path::new("tests/fixtures/diagnostics");
    let mut names: Vec<String> = std::fs::read_dir(root)
        .expect("fixtures")
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert!(names.len() >= 14, "fixtures missing: {names:?}");
    for name in names {
        let out = common::diagnostics(&root.join(&name));
        insta::assert_snapshot!(format!("diag_{name}"), out);
    }
}

#[test]
fn errors_carry_file_line_and_column() {
    let out = common::diagnostics(Path::new("tests/fixtures/diagnostics/unknown_reference"));
    assert!(
        out.contains("tests/fixtures/diagnostics/unknown_reference/main.hcl:6:15"),
        "{out}"
    );
    assert!(out.contains("did you mean `node.spark1`?"), "{out}");
}

#[test]
fn independent_errors_are_all_reported() {
    let err = sparkform::config::load(
        Path::new("tests/fixtures/diagnostics/invalid_names"),
        &Default::default(),
    )
    .unwrap_err();
    let codes: Vec<&str> = err.0.iter().map(|d| d.code).collect();
    assert_eq!(err.error_count(), 8, "{codes:?}");
}

#[test]
fn a_cycle_labels_every_member() {
    let err = sparkform::config::load(
        Path::new("tests/fixtures/diagnostics/cycle"),
        &Default::default(),
    )
    .unwrap_err();
    let cycle = err
        .0
        .iter()
        .find(|d| d.message.contains("local.a"))
        .expect("the locals cycle");
    assert_eq!(cycle.labels.len(), 3);
    for member in ["local.a", "local.b", "local.c"] {
        assert!(
            cycle.labels.iter().any(|(_, l)| l.starts_with(member)),
            "{member} not labelled"
        );
    }
}

#[test]
fn sensitive_values_never_appear_in_errors() {
    let dir = common::write_config(&[(
        "main.hcl",
        r#"
variable "token" {
  type      = string
  default   = "sk-verysecret-42"
  sensitive = true
}
node "n" {
  address = "local"
}
container "c" {
  node    = node.n
  image   = "x:latest"
  restart = var.token
}
"#,
    )]);
    let out = common::diagnostics(dir.path());
    assert!(out.contains("invalid `restart`"), "{out}");
    assert!(!out.contains("sk-verysecret-42"), "{out}");
}

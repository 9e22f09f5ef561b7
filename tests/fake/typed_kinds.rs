//! Typed kinds: every resource the examples and fixtures lower to is its kind's typed
//! `Desired`, read back and written again unchanged (the JSON plans diff, the state records and
//! the container's label hashes must not move when the types do), and no kind reads its own
//! configuration by string key.

use sparkform::kind::Registered;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common;
use sparkform::config::VarInputs;
use sparkform::vocabulary::KindId;

fn definition_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = Vec::new();
    for parent in [
        "examples",
        "tests/fixtures/plan",
        "tests/fixtures/render",
        "tests/fixtures/launchers",
    ] {
        for e in std::fs::read_dir(root.join(parent)).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            }
        }
    }
    dirs.push(root.join("tests/fixtures/serving"));
    dirs.push(root.join("tests/fixtures/hostile/secrets_ok"));
    dirs
}

#[test]
fn every_lowered_configuration_is_its_kinds_typed_desired() {
    let mut kinds = BTreeSet::new();
    let mut checked = 0;
    for dir in definition_dirs() {
        let Ok(config) = sparkform::config::load(&dir, &VarInputs::default()) else {
            continue;
        };
        for r in &config.resources {
            let typed = r.kind.typed_config(&r.config).unwrap_or_else(|e| {
                panic!(
                    "{}: {}: not a typed {}: {e}",
                    dir.display(),
                    r.address,
                    r.kind
                )
            });
            assert_eq!(typed, *r.config.json(), "{}: {}", dir.display(), r.address);
            // Typed where it was made: the lowering's value, not JSON a hook reads late.
            assert!(r.config.is_typed(), "{}: {}", dir.display(), r.address);
            kinds.insert(r.kind);
            checked += 1;
        }
    }
    // The resolved seed example too: a model with its commit, size and facts filled in.
    let (resolved, _) = common::load_resolved(&common::fixture("../../examples/testbed-standin"));
    for r in &resolved.resources {
        assert_eq!(
            r.kind.typed_config(&r.config).as_ref(),
            Ok(r.config.json()),
            "{}",
            r.address
        );
    }
    let every: BTreeSet<KindId> = KindId::ALL.iter().copied().collect();
    assert_eq!(
        kinds, every,
        "every kind is lowered somewhere ({checked} resources)"
    );
}

#[test]
fn a_configuration_of_another_kind_is_refused_by_the_type() {
    let probe = serde_json::json!({"form": "tcp", "tcp": {"via": "node.a", "address": "h:1"}});
    assert!(KindId::Probe.typed_config(&probe).is_ok());
    assert!(KindId::Container
        .typed_config(&serde_json::json!({"image": 3}))
        .is_err());
    assert!(KindId::Attachment.typed_config(&probe).is_err());
}

/// What reading a configuration, a record's facts or an undo by key looks like; a kind that
/// did it would pass whatever the key's spelling.
const BY_KEY: &[&str] = &[
    "config.get(\"",
    "config[\"",
    "desired.get(\"",
    "desired_str(",
    "attributes.get(\"",
    "attributes[\"",
    "attributes.insert(\"",
    "undo.get(\"",
    "undo[\"",
];

/// Every kind's configuration, recorded facts and undo are its types: the adapter the registry
/// makes (`AnyKind`, `AnyMachine`) reads the JSON once, and no kind reads a key.
#[test]
fn no_kind_reads_its_configuration_by_string_key() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kinds");
    let mut offenders = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, line) in text.lines().enumerate() {
                    if BY_KEY.iter().any(|k| line.contains(k)) {
                        offenders.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "read the kind's typed Desired, Recorded or Undo instead:\n{}",
        offenders.join("\n")
    );
}

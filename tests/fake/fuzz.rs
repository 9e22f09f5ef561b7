//! Fuzzing `config::load` and the diagnostic renderer with proptest: arbitrary bytes, and
//! random HCL shaped by the grammar (operators on extreme numbers, every function with odd
//! arguments, templates, `for`, traversals, control characters in strings). Whatever the input,
//! loading returns a value or diagnostics, never panics, and the rendered diagnostics hold no
//! control byte. Bounded cases, so CI runs it in seconds (`PROPTEST_CASES` raises the count).

use std::path::Path;

use proptest::prelude::*;
use sparkform::config::{self, functions::FUNCTION_NAMES, VarInputs};

fn load_text(dir: &Path, text: &[u8]) -> String {
    std::fs::write(dir.join("main.hcl"), text).expect("write");
    match config::load(dir, &VarInputs::default()) {
        Ok(_) => String::new(),
        Err(diags) => sparkform::diag::render_plain(&diags.0),
    }
}

fn assert_clean(rendered: &str) {
    let bad = rendered
        .chars()
        .find(|&c| c.is_control() && c != '\n' && c != '\t');
    assert_eq!(bad, None, "control character in\n{rendered:?}");
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("9223372036854775807".to_string()),
        Just("18446744073709551615".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("1e308".to_string()),
        Just("0.5".to_string()),
        (-1000i64..1000).prop_map(|n| n.to_string()),
    ]
}

fn string_lit() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z0-9./:-]{0,12}",
        Just("\\n".to_string()),
        Just("\\u001b[31m".to_string()),
        Just("\u{202e}".to_string()),
        Just("\u{1b}]0;x\u{7}".to_string()),
        Just("$${x}".to_string()),
        Just("10.0.0.1/24".to_string()),
        Just("%s %d %v %q %999d".to_string()),
    ];
    prop::collection::vec(piece, 0..4).prop_map(|p| format!("\"{}\"", p.concat()))
}

fn leaf() -> impl Strategy<Value = String> {
    prop_oneof![
        number(),
        string_lit(),
        Just("true".to_string()),
        Just("null".to_string()),
        Just("local.a".to_string()),
        Just("local.b".to_string()),
        Just("local.l".to_string()),
        Just("var.v".to_string()),
        Just("node.n.address".to_string()),
        Just("[]".to_string()),
    ]
}

fn expr() -> impl Strategy<Value = String> {
    leaf().prop_recursive(4, 48, 4, |inner| {
        let op = prop_oneof![
            Just("+"),
            Just("-"),
            Just("*"),
            Just("/"),
            Just("%"),
            Just("=="),
            Just("<"),
            Just("&&")
        ];
        prop_oneof![
            (inner.clone(), op, inner.clone()).prop_map(|(a, o, b)| format!("({a} {o} {b})")),
            (
                prop::sample::select(FUNCTION_NAMES),
                prop::collection::vec(inner.clone(), 0..4)
            )
                .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            (inner.clone(), inner.clone()).prop_map(|(k, v)| format!("{{ k = {k}, v = {v} }}")),
            inner.clone().prop_map(|e| format!("\"pre-${{{e}}}-post\"")),
            (inner.clone(), inner.clone()).prop_map(|(c, e)| format!("[for x in {c} : {e}]")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(c, a, b)| format!("{c} ? {a} : {b}")),
            (inner.clone(), inner.clone()).prop_map(|(c, i)| format!("{c}[{i}]")),
            inner.clone().prop_map(|e| format!("-{e}")),
            inner.prop_map(|e| format!("\"%{{ for i in {e} }}${{i}}%{{ endfor }}\"")),
        ]
    })
}

/// A definition around random expressions: locals, a variable default, node attributes and an
/// output, so that evaluation, type conversion and value checks all see them.
fn definition() -> impl Strategy<Value = String> {
    (expr(), expr(), expr(), expr(), expr()).prop_map(|(a, b, l, addr, gpus)| {
        format!(
            "variable \"v\" {{\n  default = {a}\n}}\nlocals {{\n  a = {a}\n  b = {b}\n  l = [{l}]\n}}\n\
             node \"n\" {{\n  address = {addr}\n  gpus    = {gpus}\n}}\noutput \"o\" {{\n  value = local.b\n}}\n"
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_clean(&load_text(dir.path(), &bytes));
    }

    #[test]
    fn bytes_around_valid_hcl_never_panic(
        prefix in prop::collection::vec(any::<u8>(), 0..16),
        cut in 0usize..200,
        suffix in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        // A real definition cut anywhere, with noise before and after it.
        let valid = "node \"n\" {\n  address = \"10.0.0.1\"\n  gpus = 1\n}\nlocals { x = [for i in range(3) : \"${i}\"] }\n";
        let mut text = prefix;
        text.extend_from_slice(&valid.as_bytes()[..cut.min(valid.len())]);
        text.extend_from_slice(&suffix);
        let dir = tempfile::tempdir().expect("tempdir");
        assert_clean(&load_text(dir.path(), &text));
    }

    #[test]
    fn grammar_shaped_definitions_never_panic(text in definition()) {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_clean(&load_text(dir.path(), text.as_bytes()));
    }
}

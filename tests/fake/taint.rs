//! Taint: whatever expression derives a value from a sensitive variable (string functions,
//! templates, conditionals, lists, a module in between) and wherever it is used (an env value,
//! a probe header, a node address, a check's message, a for_each, a container name), no output
//! of the load, plan, plan JSON or graph holds the secret or a six-character part of it.

use proptest::prelude::*;
use sparkform::config::{self, VarInputs};
use sparkform::graph::Graph;
use sparkform::plan::{self, PlanOptions};
use sparkform::state::{HashKey, State};

/// Expressions over `S`, the secret's reference.
fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("S".to_string()),
        Just("\"${S}\"".to_string()),
        Just("\"x-${S}-y\"".to_string()),
    ];
    leaf.prop_recursive(3, 24, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| format!("upper({e})")),
            inner.clone().prop_map(|e| format!("lower({e})")),
            inner.clone().prop_map(|e| format!("trimspace({e})")),
            inner.clone().prop_map(|e| format!("format(\"%s!\", {e})")),
            inner.clone().prop_map(|e| format!("\"pre ${{{e}}} post\"")),
            inner
                .clone()
                .prop_map(|e| format!("join(\",\", [{e}, \"b\"])")),
            inner.clone().prop_map(|e| format!("split(\",\", {e})[0]")),
            inner
                .clone()
                .prop_map(|e| format!("replace({e}, \"Q\", \"QQ\")")),
            inner.clone().prop_map(|e| format!("tonumber({e})")),
            inner.clone().prop_map(|e| format!("cidrhost({e}, 1)")),
            inner.clone().prop_map(|e| format!("base64decode({e})")),
            inner.clone().prop_map(|e| format!("base64encode({e})")),
            inner
                .clone()
                .prop_map(|e| format!("regex(\"^[0-9]+$\", {e})")),
            inner
                .clone()
                .prop_map(|e| format!("jsonencode({{ k = {e} }})")),
            inner.clone().prop_map(|e| format!("{{ a = 1 }}[{e}]")),
            inner.clone().prop_map(|e| format!("[{e}, \"z\"][0]")),
            inner
                .clone()
                .prop_map(|e| format!("(length({e}) > 3 ? {e} : \"short\")")),
            inner.prop_map(|e| format!("substr({e}, 1, 30)")),
        ]
    })
}

/// Where the derived value `local.x` is used.
fn usage() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("container \"c\" {\n  node  = node.a\n  image = \"busybox\"\n  env   = { A = local.x, B = \"plain\" }\n}\n"),
        Just("container \"c\" {\n  node  = node.a\n  image = \"busybox\"\n  env   = { (local.x) = \"v\" }\n}\n"),
        Just("container \"c\" {\n  node  = node.a\n  image = \"busybox\"\n  name  = local.x\n}\n"),
        Just("container \"c\" {\n  for_each = toset([local.x])\n  node     = node.a\n  image    = \"busybox\"\n}\n"),
        Just("probe \"p\" {\n  http {\n    via     = node.a\n    url     = \"http://127.0.0.1:8000/${local.x}\"\n    headers = { Authorization = local.x }\n  }\n  expect {\n    status    = 200\n    json_path = local.x\n  }\n}\n"),
        Just("node \"b\" {\n  address = local.x\n  gpus    = 1\n}\n"),
        Just("check \"c\" {\n  condition     = local.x == \"\"\n  error_message = \"bad: ${local.x}\"\n}\n"),
        Just("output \"o\" {\n  value     = local.x\n  sensitive = true\n}\n"),
    ]
}

/// Everything a user could see of this definition: diagnostics, or plan text, plan JSON, graph.
fn outputs(dir: &std::path::Path, secret: &str) -> String {
    let vars = VarInputs {
        cli: vec![("secret".into(), secret.into())],
        ..VarInputs::default()
    };
    let config = match config::load(dir, &vars) {
        Ok(c) => c,
        Err(d) => return sparkform::diag::render_plain(&d.0),
    };
    let mut out = sparkform::diag::render_plain(&config.warnings);
    let graph = match Graph::build(&config) {
        Ok(g) => g,
        Err(d) => return out + &sparkform::diag::render_plain(&[*d]),
    };
    out += &graph.to_dot();
    for key in [None, Some(HashKey::from_bytes([9; 32]))] {
        let opts = PlanOptions {
            key,
            ..PlanOptions::default()
        };
        match plan::plan(&config, &graph, &State::new(), &opts) {
            Ok(p) => {
                out += &plan::render::render(&p);
                out += &serde_json::to_string(&p).unwrap_or_default();
            }
            Err(d) => out += &sparkform::diag::render_plain(&[*d]),
        }
    }
    out
}

fn leaked(output: &str, secret: &str) -> Option<String> {
    let hay = output.to_lowercase();
    let s: Vec<char> = secret.to_lowercase().chars().collect();
    (0..=s.len().saturating_sub(6))
        .map(|i| s[i..(i + 6).min(s.len())].iter().collect::<String>())
        .find(|part| part.len() == 6 && hay.contains(part.as_str()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_output_shows_a_part_of_the_secret(
        // Letters no message, hash or address is made of, so a match is a leak.
        secret in "[QXZJKWVqxzjkwv]{16,40}",
        e in expr(),
        through_module in any::<bool>(),
        used in usage(),
    ) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let source = if through_module {
            std::fs::create_dir(dir.join("inner")).expect("mkdir");
            std::fs::write(
                dir.join("inner/main.hcl"),
                format!("variable \"v\" {{\n  type = any\n}}\n\noutput \"x\" {{\n  value     = {}\n  sensitive = true\n}}\n", e.replace('S', "var.v")),
            ).expect("write");
            "module \"m\" {\n  source = \"./inner\"\n  v      = var.secret\n}\nlocals {\n  x = module.m.x\n}\n".to_string()
        } else {
            format!("locals {{\n  x = {}\n}}\n", e.replace('S', "var.secret"))
        };
        let text = format!(
            "variable \"secret\" {{\n  type      = string\n  sensitive = true\n}}\n\nnode \"a\" {{\n  address = \"10.0.0.1\"\n  gpus    = 1\n}}\n\n{source}\n{used}"
        );
        std::fs::write(dir.join("main.hcl"), &text).expect("write");
        let out = outputs(dir, &secret);
        if let Some(part) = leaked(&out, &secret) {
            panic!("{part:?} of the secret shown for\n{text}\n---\n{out}");
        }
    }
}

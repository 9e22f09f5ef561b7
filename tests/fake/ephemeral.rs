//! `ephemeral = true` variables: the value reaches what uses it during an apply (a model's hub
//! token) and is recorded nowhere, not in the state, a plan or a plan file, not even as a hash;
//! a new value is no change. Where it would be recorded (another attribute, an output, a
//! module variable that is not ephemeral) `validate` refuses it, with the file, the line and
//! the fix.

use crate::common;

use sparkform::config::{self, ModelReadings, Readings, VarInputs};
use sparkform::diag::render_plain;
use sparkform::graph::Graph;
use sparkform::plan::{self, PlanOptions};
use sparkform::state::State;

const TOKEN: &str = "hf_ephemeral_secret_one";
const OTHER_TOKEN: &str = "hf_ephemeral_secret_two";
const COMMIT: &str = "cccccccccccccccccccccccccccccccccccccccc";

/// Two nodes, a fabric and `rest` (blocks using `var.hf_token`).
fn definitions(rest: &str) -> String {
    format!(
        r#"
variable "hf_token" {{
  type      = string
  ephemeral = true
}}
node "a" {{
  address = "10.0.0.1"
}}
node "b" {{
  address = "10.0.0.2"
}}
network "roce" {{
  subnet = "192.168.200.0/24"
  attach "a" {{
    node      = node.a
    interface = "eth1"
    address   = "192.168.200.1"
  }}
  attach "b" {{
    node      = node.b
    interface = "eth1"
    address   = "192.168.200.2"
  }}
}}
{rest}"#
    )
}

const MODEL: &str = r#"
locals {
  token = var.hf_token
}
model "m" {
  repo    = "org/name"
  nodes   = [node.a, node.b]
  cache   = "/data/hf"
  network = network.roce
  token   = local.token
}
"#;

fn token_from_env(token: &str) -> VarInputs {
    VarInputs {
        env: vec![("hf_token".to_string(), token.to_string())],
        ..VarInputs::default()
    }
}

fn observed() -> Readings {
    let mut o = Readings::default();
    o.models.insert(
        "model.m".into(),
        ModelReadings {
            revision: "main".into(),
            commit: COMMIT.into(),
            manifest: serde_json::json!({"total_bytes": 3000, "files": [{"path": "a"}]}),
            config: serde_json::json!({"architectures": ["Qwen3ForCausalLM"]}),
        },
    );
    o
}

fn load(text: &str, token: &str) -> (config::Config, Graph) {
    let dir = common::write_config(&[("main.hcl", text)]);
    match config::load_with_readings(dir.path(), &token_from_env(token), &observed()) {
        Ok(c) => {
            let g = Graph::build(&c).expect("graph");
            (c, g)
        }
        Err(d) => panic!("{}", render_plain(&d.0)),
    }
}

fn errors(text: &str) -> String {
    let dir = common::write_config(&[("main.hcl", text)]);
    match config::load(dir.path(), &token_from_env(TOKEN)) {
        Ok(_) => panic!("loaded without errors:\n{text}"),
        Err(d) => render_plain(&d.0),
    }
}

#[test]
fn an_ephemeral_token_reaches_the_download_and_is_recorded_nowhere() {
    let (c, g) = load(&definitions(MODEL), TOKEN);
    let download = c.resource("model.m[\"a\"]").expect("the download node's");
    // The apply has it: the download's configuration carries it (through a local).
    assert_eq!(download.config["token"], TOKEN);
    assert_eq!(download.ephemeral, vec![vec!["token".to_string()]]);
    assert!(download.sensitive.is_empty(), "{:?}", download.sensitive);

    // No key for hashes is asked for: there is nothing to hash.
    let p = plan::plan(&c, &g, &State::new(), &PlanOptions::default()).expect("plan");
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    let after = p
        .change("model.m[\"a\"]")
        .and_then(|ch| ch.after.clone())
        .expect("a recorded configuration");
    assert!(after.get("token").is_none(), "{after}");
    assert_eq!(after["repo"], "org/name", "{after}");

    // Not in the plan, its rendering, a plan file or the state, in clear or hashed.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saved.plan");
    plan::planfile::PlanFile::new(p.clone(), dir.path(), &dir.path().join("state.json"), None)
        .write(&file)
        .expect("write the plan file");
    let mut state = State::new();
    plan::record(&p, &mut state);
    for (what, text) in [
        ("the plan", serde_json::to_string(&p).unwrap()),
        ("the rendered plan", plan::render::render(&p)),
        ("the plan file", std::fs::read_to_string(&file).unwrap()),
        ("the state", serde_json::to_string(&state).unwrap()),
    ] {
        assert!(!text.contains(TOKEN), "{what} holds the token: {text}");
        assert!(
            !text.contains("hmac-sha256:"),
            "{what} holds a hash: {text}"
        );
        assert!(!text.contains("\"token\""), "{what} names a token: {text}");
    }

    // A new token is no change, with or without the deployment's key.
    let (c, g) = load(&definitions(MODEL), OTHER_TOKEN);
    for opts in [
        PlanOptions::default(),
        PlanOptions::with_key(sparkform::state::HashKey::from_bytes([3; 32])),
    ] {
        let p = plan::plan(&c, &g, &state, &opts).expect("plan");
        assert!(!p.has_changes(), "{}", plan::render::render(&p));
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }
}

/// The same token from a `sensitive` variable is recorded as its keyed hash, as before: the
/// line between the two is the variable's declaration.
#[test]
fn a_sensitive_token_is_still_recorded_as_a_keyed_hash() {
    let text = definitions(MODEL).replace("ephemeral = true", "sensitive = true");
    let (c, g) = load(&text, TOKEN);
    let download = c.resource("model.m[\"a\"]").expect("the download node's");
    assert!(download.ephemeral.is_empty());
    assert_eq!(download.sensitive, vec![vec!["token".to_string()]]);
    let p = common::plan(&c, &g, &State::new());
    let after = p
        .change("model.m[\"a\"]")
        .and_then(|ch| ch.after.clone())
        .unwrap();
    assert!(
        after["token"]
            .as_str()
            .is_some_and(|t| t.starts_with("hmac-sha256:")),
        "{after}"
    );
}

/// A module passes an ephemeral value on only through a variable that is ephemeral itself.
#[test]
fn a_module_takes_an_ephemeral_value_through_an_ephemeral_variable() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("modules/weights");
    std::fs::create_dir_all(&module).unwrap();
    std::fs::write(
        module.join("main.hcl"),
        r#"
variable "token" {
  type      = string
  ephemeral = true
}
variable "nodes" {}
variable "network" {}
model "m" {
  repo    = "org/name"
  nodes   = var.nodes
  cache   = "/data/hf"
  network = var.network
  token   = var.token
}
"#,
    )
    .unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("main.hcl"),
        definitions(
            r#"
module "weights" {
  source  = "../modules/weights"
  token   = var.hf_token
  nodes   = [node.a, node.b]
  network = network.roce
}
"#,
        ),
    )
    .unwrap();
    let c = config::load(&root, &token_from_env(TOKEN))
        .unwrap_or_else(|d| panic!("{}", render_plain(&d.0)));
    let download = c
        .resources
        .iter()
        .find(|r| r.address.starts_with("module.weights.model.m") && r.config["token"] == TOKEN)
        .expect("the module's download node carries the token");
    assert_eq!(download.ephemeral, vec![vec!["token".to_string()]]);

    // The same module with a variable that is not ephemeral: refused at the call.
    let text = std::fs::read_to_string(module.join("main.hcl")).unwrap();
    std::fs::write(
        module.join("main.hcl"),
        text.replacen("ephemeral = true", "sensitive = true", 1),
    )
    .unwrap();
    let err = match config::load(&root, &token_from_env(TOKEN)) {
        Ok(_) => panic!("a non-ephemeral module variable took an ephemeral value"),
        Err(d) => render_plain(&d.0),
    };
    assert!(err.contains("config::ephemeral_input"), "{err}");
    assert!(
        err.contains("variable `token` is set from an ephemeral value (module `weights`), and is not ephemeral"),
        "{err}"
    );
    assert!(
        err.contains("add `ephemeral = true` to variable `token`"),
        "{err}"
    );
    assert!(err.contains("main.hcl:"), "no file and line: {err}");
    assert!(!err.contains(TOKEN), "the error shows the token: {err}");
}

#[test]
fn where_it_would_be_recorded_an_ephemeral_value_is_refused_with_the_line_and_the_fix() {
    // In a container's environment (the state keeps it, hashed when sensitive).
    let err = errors(&definitions(
        r#"
container "c" {
  node  = node.a
  image = "img:1"
  env = {
    HF_TOKEN = var.hf_token
  }
}
"#,
    ));
    assert!(err.contains("config::ephemeral_stored"), "{err}");
    assert!(
        err.contains("`env` of a `container` block is recorded in the state and in plans, and its value is ephemeral"),
        "{err}"
    );
    assert!(
        err.contains("nothing in a `container` block takes an ephemeral value"),
        "{err}"
    );
    // Line 29 of the file: `env = {`, where the value starts.
    assert!(err.contains("main.hcl:29:"), "no file and line: {err}");
    assert!(!err.contains(TOKEN), "the error shows the token: {err}");

    // On a model's other attribute, through a local: the help names the one that takes it.
    let err = errors(&definitions(
        &MODEL.replace("repo    = \"org/name\"", "repo    = \"org/${local.token}\""),
    ));
    assert!(
        err.contains("`repo` of a `model` block is recorded"),
        "{err}"
    );
    assert!(
        err.contains("in a `model` block only `token` takes an ephemeral value"),
        "{err}"
    );

    // In an output.
    let err = errors(&definitions(
        "output \"t\" {\n  value     = var.hf_token\n  sensitive = true\n}\n",
    ));
    assert!(err.contains("config::ephemeral_output"), "{err}");
    assert!(
        err.contains("output `t` is derived from an ephemeral value"),
        "{err}"
    );
    assert!(err.contains("main.hcl:"), "no file and line: {err}");
}

/// An ephemeral value is a secret: given as `-var` (in the process arguments) it is warned
/// about as a sensitive one is, without showing it.
#[test]
fn an_ephemeral_variable_on_the_command_line_is_warned_about() {
    let dir = common::write_config(&[("main.hcl", &definitions(MODEL))]);
    let vars = VarInputs {
        cli: vec![("hf_token".to_string(), TOKEN.to_string())],
        ..VarInputs::default()
    };
    let c = config::load(dir.path(), &vars).unwrap_or_else(|d| panic!("{}", render_plain(&d.0)));
    let warnings = render_plain(&c.warnings);
    assert!(
        warnings.contains("the sensitive variable `hf_token` was given as `-var hf_token=…`"),
        "{warnings}"
    );
    assert!(!warnings.contains(TOKEN), "{warnings}");
}

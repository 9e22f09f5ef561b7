//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod pg;
pub mod procs;
pub mod testbed;

use std::path::{Path, PathBuf};

use sparkform::config::{self, Config, VarInputs};
use sparkform::graph::Graph;
use sparkform::plan::{self, Plan, PlanOptions};
use sparkform::state::State;

pub fn fixture(rel: &str) -> PathBuf {
    Path::new("tests/fixtures").join(rel)
}

/// Load a configuration folder; panics with the rendered diagnostics if it has errors.
/// `-var NAME=VALUE` for each pair.
pub fn var_inputs(vars: &[(&str, &str)]) -> VarInputs {
    VarInputs {
        cli: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..VarInputs::default()
    }
}

pub fn load(dir: &Path) -> (Config, Graph) {
    load_with(dir, &VarInputs::default())
}

pub fn load_with(dir: &Path, vars: &VarInputs) -> (Config, Graph) {
    match config::load(dir, vars) {
        Ok(c) => {
            let g = Graph::build(&c).expect("graph");
            (c, g)
        }
        Err(d) => panic!(
            "{} failed to load:\n{}",
            dir.display(),
            sparkform::diag::render_plain(&d.0)
        ),
    }
}

/// The commit `load_resolved` gives every model block: what a plan's resolve on the download
/// node would answer, without a machine or a hub.
pub const RESOLVED_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Load a configuration with every model block's revision resolved to `RESOLVED_COMMIT` (a
/// manifest of two files, 111 GiB, a Qwen3.5 MoE `config.json`), as a plan with refresh loads it.
pub fn load_resolved(dir: &Path) -> (Config, Graph) {
    let (unresolved, _) = load(dir);
    let mut observed = config::Readings::default();
    for r in &unresolved.resources {
        if r.config.get("role").and_then(|v| v.as_str()) != Some("download") {
            continue;
        }
        let (Some(block), Some(revision)) = (
            r.config.get("block").and_then(|v| v.as_str()),
            r.config.get("revision").and_then(|v| v.as_str()),
        ) else {
            continue;
        };
        observed.models.insert(
            block.to_string(),
            config::ModelReadings {
                revision: revision.to_string(),
                commit: RESOLVED_COMMIT.to_string(),
                manifest: serde_json::json!({
                    "total_bytes": 111u64 << 30,
                    "files": [{"path": "config.json"}, {"path": "model.safetensors"}],
                }),
                config: serde_json::json!({
                    "architectures": ["Qwen3_5MoeForCausalLM"],
                    "model_type": "qwen3_5_moe",
                }),
            },
        );
    }
    match config::load_with_readings(dir, &VarInputs::default(), &observed) {
        Ok(c) => {
            let g = Graph::build(&c).expect("graph");
            (c, g)
        }
        Err(d) => panic!(
            "{} failed to load:\n{}",
            dir.display(),
            sparkform::diag::render_plain(&d.0)
        ),
    }
}

/// The diagnostics of a configuration that must fail (its loading, or its resource graph as
/// `validate` builds it), rendered without colour.
pub fn diagnostics(dir: &Path) -> String {
    match config::load(dir, &VarInputs::default()) {
        Ok(c) => match Graph::build(&c) {
            Ok(_) => panic!("{} loaded without errors", dir.display()),
            Err(d) => sparkform::diag::render_plain(&[*d]),
        },
        Err(d) => sparkform::diag::render_plain(&d.0),
    }
}

pub fn plan(config: &Config, graph: &Graph, state: &State) -> Plan {
    plan::plan(
        config,
        graph,
        state,
        &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
    )
    .expect("plan")
}

/// The state after applying `dir` from empty.
pub fn applied(dir: &Path) -> State {
    let (c, g) = load(dir);
    let mut state = State::new();
    let p = plan(&c, &g, &state);
    plan::record(&p, &mut state);
    state
}

/// Write files into a fresh temp dir: (relative path, contents).
pub fn write_config(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        let p = dir.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(p, text).expect("write");
    }
    dir
}

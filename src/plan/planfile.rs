//! `plan -out FILE`: a saved plan that a later apply can check against the state it was made from,
//! with the node facts the plan's evaluation used, so the apply evaluates the definitions as the
//! plan did.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Plan;
use crate::config::{NodeReadings, Readings};
use crate::kind::Registered;
use crate::state::State;

pub const FORMAT: &str = "sparkform-plan";
/// 2 added `node_facts`, 3 `destroy`. A plan file carries each change's configuration in the
/// shape of the sparkform that made it, and lives minutes: one of another version is refused
/// (an older one saying to make it again), never read into this version's shapes.
pub const FORMAT_VERSION: u32 = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanFile {
    pub format: String,
    pub format_version: u32,
    pub sparkform_version: String,
    pub created: String,
    pub config_dir: String,
    pub state_path: String,
    /// Lineage and serial of the state the plan was made against; `None` when there was none.
    pub state_lineage: Option<String>,
    pub state_serial: u64,
    pub plan: Plan,
    /// The node facts the plan's evaluation used, by node name (`Readings::nodes`); empty when it
    /// read none (`-refresh=false`, or every node sets its values).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_facts: BTreeMap<String, NodeFacts>,
    /// Made by `plan -destroy`: it removes what the state records, and an apply of it checks
    /// only that the state is the one it was made from (the definitions made none of it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destroy: bool,
}

/// A node's `gpus`, `memory_gib` and `unified_memory` as the plan read them (`null`: the node
/// did not say). Its own type, so the file's format does not follow the engine's structs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub gpus: Option<u32>,
    pub memory_gib: Option<f64>,
    pub unified_memory: Option<bool>,
}

impl From<&NodeReadings> for NodeFacts {
    fn from(o: &NodeReadings) -> Self {
        NodeFacts {
            gpus: o.gpus,
            memory_gib: o.memory_gib,
            unified_memory: o.unified_memory,
        }
    }
}

impl From<&NodeFacts> for NodeReadings {
    fn from(f: &NodeFacts) -> Self {
        NodeReadings {
            gpus: f.gpus,
            memory_gib: f.memory_gib,
            unified_memory: f.unified_memory,
        }
    }
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PlanFileError {
    #[error("cannot read the plan file {path}: {message}")]
    #[diagnostic(code(sparkform::planfile::read))]
    Read { path: PathBuf, message: String },
    #[error("{path} is not a sparkform plan file ({message})")]
    #[diagnostic(
        code(sparkform::planfile::format),
        help("make one with `sparkform plan -out FILE`")
    )]
    Format { path: PathBuf, message: String },
    #[error("the plan file {path} was written by a newer sparkform (plan format {found}, this one reads {supported})")]
    #[diagnostic(
        code(sparkform::planfile::newer),
        help("upgrade sparkform, or make a new plan with this version")
    )]
    Newer {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("the plan file {path} was made by an older sparkform (plan format {found}, this one reads {supported}): the configurations it carries are in that version's shapes")]
    #[diagnostic(
        code(sparkform::planfile::older),
        help("make the plan again with this version (`sparkform plan -out FILE`), review it, and apply that")
    )]
    Older {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("the plan file {path} is stale: {reason}")]
    #[diagnostic(
        code(sparkform::planfile::stale),
        help("the state changed after this plan was made; run `sparkform plan -out FILE` again and review it")
    )]
    Stale { path: PathBuf, reason: String },
    #[error("cannot write the plan file {path}: {message}")]
    #[diagnostic(code(sparkform::planfile::write))]
    Write { path: PathBuf, message: String },
}

impl PlanFile {
    pub fn new(plan: Plan, config_dir: &Path, state_path: &Path, state: Option<&State>) -> Self {
        PlanFile {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            sparkform_version: env!("CARGO_PKG_VERSION").into(),
            created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            config_dir: config_dir.display().to_string(),
            state_path: state_path.display().to_string(),
            state_lineage: state.map(|s| s.lineage.clone()),
            state_serial: state.map_or(0, |s| s.serial),
            plan,
            node_facts: BTreeMap::new(),
            destroy: false,
        }
    }

    /// Record the node facts the plan was made with (`ops::prepare::Prepared::readings`).
    pub fn with_readings(mut self, readings: &Readings) -> Self {
        self.node_facts = readings
            .nodes
            .iter()
            .map(|(name, o)| (name.clone(), NodeFacts::from(o)))
            .collect();
        self
    }

    /// What the plan observed, for evaluating the definitions again as it did.
    pub fn readings(&self) -> Readings {
        Readings {
            nodes: self
                .node_facts
                .iter()
                .map(|(name, f)| (name.clone(), NodeReadings::from(f)))
                .collect(),
            ..Readings::default()
        }
    }

    /// Refuse a plan made against another state than `current`.
    pub fn check_fresh(&self, path: &Path, current: Option<&State>) -> Result<(), PlanFileError> {
        let stale = |reason: String| PlanFileError::Stale {
            path: path.to_path_buf(),
            reason,
        };
        match (&self.state_lineage, current) {
            (None, None) => Ok(()),
            (None, Some(s)) => Err(stale(format!(
                "it was made when there was no state, and the state now exists (serial {})",
                s.serial
            ))),
            (Some(_), None) => Err(stale(
                "the state it was made against no longer exists".into(),
            )),
            (Some(l), Some(s)) if *l != s.lineage => Err(stale(format!(
                "it was made for state lineage {l}, but the state is lineage {}",
                s.lineage
            ))),
            (Some(_), Some(s)) if s.serial != self.state_serial => Err(stale(format!(
                "it was made at state serial {}, and the state is now at serial {}",
                self.state_serial, s.serial
            ))),
            _ => Ok(()),
        }
    }

    /// Written whole to a temporary file and renamed, so a crash never leaves half a plan.
    pub fn write(&self, path: &Path) -> Result<(), PlanFileError> {
        let err = |e: &dyn std::fmt::Display| PlanFileError::Write {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let text = serde_json::to_vec_pretty(self).map_err(|e| err(&e))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("plan"),
            std::process::id()
        ));
        std::fs::write(&tmp, text).map_err(|e| err(&e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(&e)
        })
    }

    pub fn read(path: &Path) -> Result<PlanFile, PlanFileError> {
        let bytes = std::fs::read(path).map_err(|e| PlanFileError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let format_err = |message: String| PlanFileError::Format {
            path: path.to_path_buf(),
            message,
        };
        let raw: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format_err(format!("not JSON: {e}")))?;
        if raw.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(format_err("no \"format\": \"sparkform-plan\" field".into()));
        }
        let found = raw
            .get("format_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if found > u64::from(FORMAT_VERSION) {
            return Err(PlanFileError::Newer {
                path: path.to_path_buf(),
                found: u32::try_from(found).unwrap_or(u32::MAX),
                supported: FORMAT_VERSION,
            });
        }
        if found < u64::from(FORMAT_VERSION) {
            return Err(PlanFileError::Older {
                path: path.to_path_buf(),
                found: u32::try_from(found).unwrap_or(0),
                supported: FORMAT_VERSION,
            });
        }
        let mut file: PlanFile =
            serde_json::from_value(raw).map_err(|e| format_err(e.to_string()))?;
        decode_configurations(&mut file.plan);
        Ok(file)
    }
}

/// Decode, by their kinds, the configurations a saved plan file brings in: where they
/// enter the engine, once.
fn decode_configurations(plan: &mut Plan) {
    for c in &mut plan.changes {
        if let Some(after) = c.after.take() {
            c.after = Some(c.kind.configuration(after.into_json()));
        }
        if let Some(restores) = c.restores.take() {
            c.restores = Some(c.kind.kind().decode_facts(restores.into_map()));
        }
    }
    for i in plan.imports.iter_mut().chain(&mut plan.generated) {
        let json = std::mem::take(&mut i.config).into_json();
        i.config = i.kind.configuration(json);
        let facts = std::mem::take(&mut i.attributes).into_map();
        i.attributes = i.kind.kind().decode_facts(facts);
    }
}

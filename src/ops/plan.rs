//! `sparkform plan` as one operation ([`plan`]): the state and its lock's note, the key, the
//! read and refresh (`ops::prepare`), the lock file's changes, the plan file and the generated
//! files.

use std::path::{Path, PathBuf};

use crate::diag::Diag;
use crate::events::{emit, Event, Sender};
use crate::hosts::{HostOptions, RoundTrips};
use crate::kinds::machine::ReadMode;
use crate::plan::planfile::PlanFile;
use crate::plan::{Plan, PlanOptions};
use crate::state::StateError;
use crate::workspace::Workspace;

use super::definitions::Evaluated;
use super::OpError;

/// `sparkform plan`: what to plan and what to write.
pub struct PlanCommand<'a> {
    pub workspace: &'a Workspace,
    pub evaluated: Evaluated,
    pub refresh: ReadMode,
    /// Targets, replacements, `-generate-config-out`; the key is the workspace's.
    pub options: PlanOptions,
    pub hosts: HostOptions,
    /// `-out`: the plan file to write.
    pub out: Option<&'a Path>,
    /// `-generate-config-out`: a new file for the blocks of imports without one.
    pub generate_config_out: Option<&'a Path>,
    /// `-generate-import-out`: a new file for the `import` blocks that adopt what runs under
    /// another state's lineage.
    pub generate_import_out: Option<&'a Path>,
    /// `-destroy`: plan the removal of what the state records (`options`' targets and
    /// exclusions say which) instead of the definitions' changes.
    pub destroy: bool,
}

/// What `sparkform plan` made.
pub struct Planned {
    pub plan: Plan,
    /// Every warning of the evaluation the plan was made from; `new_warnings`: those the first
    /// evaluation (shown already) did not have.
    pub warnings: Vec<Diag>,
    pub new_warnings: Vec<Diag>,
    /// What the state lock says, when a run holds it or left it.
    pub state_lock_note: Option<String>,
    /// The state planned against: (lineage, serial).
    pub state: Option<(String, u64)>,
    /// How `sparkform.lock.hcl` changes when an apply writes it.
    pub lock_file_changes: Vec<String>,
    /// Per node the plan connected: commands and Docker API requests it made there.
    pub round_trips: std::collections::BTreeMap<String, RoundTrips>,
    /// The files written: the plan file, the generated blocks (with how many) and the import
    /// blocks (with how many; `Some((path, 0))` when there was nothing to write).
    pub plan_file: Option<PathBuf>,
    pub generated_config: Option<(PathBuf, usize)>,
    pub generated_imports: Option<(PathBuf, usize)>,
    /// Imports whose blocks could not be generated, with why.
    pub not_generated: Vec<String>,
}

/// `sparkform plan`: read the state, plan (reading and refreshing the machines as `refresh`
/// says), and write what was asked for.
pub async fn plan(req: PlanCommand<'_>, events: &Sender) -> Result<Planned, OpError> {
    let ws = req.workspace;
    let lock_before = req.evaluated.lock().cloned();
    let upgrade = req.evaluated.upgrade();
    let recorded = ws.state()?;
    // An apply running beside this plan changes what it looks at; a killed one left work.
    let state_lock_note = ws.store().lock_status().ok().and_then(|s| s.note());
    if let Some(note) = &state_lock_note {
        emit(events, Event::StateLockHeld { note: note.clone() });
    }
    // A plan file records hashes under the key, so writing one creates it.
    let key = ws.key(req.out.is_some())?;
    if req.destroy {
        return plan_destroy(req, recorded, state_lock_note, events).await;
    }
    let mut prepared = super::prepare::prepare(
        super::prepare::PrepareRequest {
            evaluated: req.evaluated,
            recorded: recorded.as_ref(),
            refresh: req.refresh,
            options: PlanOptions { key, ..req.options },
            hosts: req.hosts,
        },
        events,
    )
    .await?;
    prepared.close().await;
    let lock_file_changes = super::lock_file::LockUpdate::new(
        &prepared.config,
        lock_before.as_ref(),
        upgrade,
        &prepared.images,
        recorded.as_ref(),
    )
    .changes();
    let mut warnings = prepared.config.warnings.clone();
    for w in &prepared.warnings {
        if !warnings.iter().any(|a| a.message == w.message) {
            warnings.push(w.clone());
        }
    }
    let plan = prepared.plan;
    let mut planned = Planned {
        warnings,
        new_warnings: prepared.warnings,
        state_lock_note,
        state: recorded.as_ref().map(|s| (s.lineage.clone(), s.serial)),
        lock_file_changes,
        round_trips: prepared.round_trips,
        plan_file: None,
        generated_config: None,
        generated_imports: None,
        not_generated: Vec::new(),
        plan,
    };
    if let Some(out) = req.generate_config_out {
        let (text, skipped) = super::import::generated_hcl(&planned.plan.generated);
        if !text.is_empty() {
            write_new(out, &text)?;
            let n = planned.plan.generated.len() - skipped.len();
            planned.generated_config = Some((out.to_path_buf(), n));
        }
        planned.not_generated = skipped;
    }
    if let Some(out) = req.generate_import_out {
        let text = crate::plan::import_blocks(&planned.plan.foreign);
        if !text.is_empty() {
            write_new(out, &text)?;
        }
        let n = text.matches("\nimport {").count();
        planned.generated_imports = Some((out.to_path_buf(), n));
    }
    if let Some(out) = req.out {
        PlanFile::new(
            planned.plan.clone(),
            &ws.dir,
            &ws.state_path,
            recorded.as_ref(),
        )
        .with_readings(&prepared.readings)
        .write(out)?;
        planned.plan_file = Some(out.to_path_buf());
    }
    Ok(planned)
}

/// `plan -destroy`: what `destroy` would remove, written to `-out` as a destroy's plan.
async fn plan_destroy(
    req: PlanCommand<'_>,
    recorded: Option<crate::state::State>,
    state_lock_note: Option<String>,
    events: &Sender,
) -> Result<Planned, OpError> {
    let ws = req.workspace;
    let state = recorded.clone().unwrap_or_default();
    let scope = super::apply::DestroyScope {
        targets: req.options.targets.clone(),
        exclude: req.options.exclude.clone(),
        purge_caches: false,
    };
    let mut d = super::apply::planned_destroy(
        req.evaluated,
        &state,
        recorded.is_some(),
        scope,
        req.refresh,
        &req.hosts,
        events,
    )
    .await?;
    let round_trips = d.pool.as_ref().map(|p| p.round_trips()).unwrap_or_default();
    if let Some(pool) = d.pool.take() {
        pool.close().await;
    }
    let mut planned = Planned {
        warnings: d.warnings,
        new_warnings: Vec::new(),
        state_lock_note,
        state: recorded.as_ref().map(|s| (s.lineage.clone(), s.serial)),
        lock_file_changes: Vec::new(),
        round_trips,
        plan_file: None,
        generated_config: None,
        generated_imports: None,
        not_generated: Vec::new(),
        plan: d.plan,
    };
    if let Some(out) = req.out {
        let mut file = PlanFile::new(
            planned.plan.clone(),
            &ws.dir,
            &ws.state_path,
            recorded.as_ref(),
        );
        file.destroy = true;
        file.write(out)?;
        planned.plan_file = Some(out.to_path_buf());
    }
    Ok(planned)
}

/// A plan saved by `sparkform plan -out FILE` (`show`, `apply FILE`).
pub fn saved(path: &Path) -> Result<PlanFile, crate::plan::planfile::PlanFileError> {
    PlanFile::read(path)
}

/// Write `text` to `out`, a new file.
fn write_new(out: &Path, text: &str) -> Result<(), StateError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .map_err(|e| StateError::Io {
            path: out.to_path_buf(),
            source: e,
        })
}

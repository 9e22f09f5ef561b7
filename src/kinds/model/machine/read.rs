//! The model kind's plan-time read (`Machine::read`): each model block's revision resolved to
//! a commit on its download node (as the hub answers that node), or pinned by the state or by
//! a saved plan, as the [`ReadMode`] says. What it reads goes into `config::Readings.models`;
//! the second evaluation hands it to the lowering (`kinds::model::lower`), so plans show the
//! commit and the modules see the real size and `config.json` facts.

use crate::vocabulary::KindId;
use std::collections::BTreeMap;

use super::{resolve, Desired, ResolveRequest};
use crate::config::{Config, ModelReadings, Readings};
use crate::diag::{Diag, Diagnostics};
use crate::hosts::HostPool;
use crate::kinds::machine::{ReadCx, ReadError, ReadMode};
use crate::state::State;

/// One model block, as its download node's resource describes it.
struct Block {
    node: String,
    config: Desired,
    span: crate::diag::Span,
}

fn blocks(config: &Config) -> BTreeMap<String, Block> {
    let mut out = BTreeMap::new();
    for r in &config.resources {
        if r.kind != KindId::Model {
            continue;
        }
        let Ok(config) = r.config.typed::<Desired>() else {
            continue;
        };
        if !config.is_download() || config.block.is_empty() {
            continue;
        }
        out.insert(
            config.block.clone(),
            Block {
                node: r.node.clone().unwrap_or_default(),
                config,
                span: r.span.clone(),
            },
        );
    }
    out
}

/// The download nodes: where the revisions are resolved.
pub(super) fn nodes(config: &Config) -> Vec<String> {
    let mut n: Vec<String> = blocks(config).into_values().map(|b| b.node).collect();
    n.sort();
    n.dedup();
    n
}

/// What the world says about the models of `cx.config`, as `cx.mode` reads it.
pub(super) async fn read(cx: &ReadCx<'_>) -> Result<Readings, ReadError> {
    let blocks = blocks(cx.config);
    if blocks.is_empty() {
        return Ok(Readings::default());
    }
    // What the lock pins stands, unless `-upgrade`: the rest is read as the mode says.
    let locked = match (cx.lock, cx.mode) {
        (_, ReadMode::Planned | ReadMode::None) => Readings::default(),
        (_, _) if cx.upgrade => Readings::default(),
        (Some(lock), _) => locked_in(&blocks, lock),
        (None, _) => Readings::default(),
    };
    let rest: BTreeMap<String, Block> = blocks
        .into_iter()
        .filter(|(address, _)| !locked.models.contains_key(address))
        .collect();
    let mut observed = match cx.mode {
        _ if rest.is_empty() => Readings::default(),
        ReadMode::Normal | ReadMode::Deep => resolve_on(&rest, cx.pool).await?,
        ReadMode::Recorded if cx.complete => pinned_by_state(&rest, cx.state)?,
        ReadMode::Recorded => recorded(&rest, cx.state),
        ReadMode::Planned => cx.plan.map(planned).unwrap_or_default(),
        ReadMode::None => Readings::default(),
    };
    observed.models.extend(locked.models);
    Ok(observed)
}

/// The blocks the lock pins at their revision as written, with what it recorded of them.
fn locked_in(blocks: &BTreeMap<String, Block>, lock: &crate::lock_file::LockFile) -> Readings {
    let mut observed = Readings::default();
    for (address, b) in blocks {
        let Some(e) = lock.entry("model", address) else {
            continue;
        };
        let text = |k: &str| e.get(k).and_then(|v| v.as_str());
        let (Some(revision), Some(commit)) = (text("revision"), text("commit")) else {
            continue;
        };
        if revision != b.config.revision || text("repo") != Some(b.config.repo.as_str()) {
            continue;
        }
        let facts = text("facts")
            .and_then(|f| serde_json::from_str(f).ok())
            .unwrap_or_default();
        observed.models.insert(
            address.clone(),
            ModelReadings {
                revision: revision.to_string(),
                commit: commit.to_string(),
                manifest: serde_json::json!({
                    "total_bytes": e.get("total_bytes").cloned().unwrap_or_default(),
                    "files": e.get("files").cloned().unwrap_or_default(),
                }),
                config: facts,
            },
        );
    }
    observed
}

/// The commit a state pins for a block at a revision, with what was recorded about it.
fn pinned(state: Option<&State>, block: &str, revision: &str) -> Option<ModelReadings> {
    pinned_in(
        state?
            .resources
            .values()
            .filter(|r| r.kind == KindId::Model)
            .map(|r| &r.config),
        block,
        revision,
    )
}

fn pinned_in<'a>(
    mut configs: impl Iterator<Item = &'a crate::kind::Configuration>,
    block: &str,
    revision: &str,
) -> Option<ModelReadings> {
    configs.find_map(|c| {
        let c = c.typed::<Desired>().ok()?;
        (c.block == block && c.revision == revision).then_some(())?;
        Some(ModelReadings {
            revision: revision.to_string(),
            commit: c.commit?,
            manifest: serde_json::json!({
                "total_bytes": c.total_bytes,
                "files": c.files,
            }),
            config: c.facts,
        })
    })
}

/// The commits the state pins for the revisions of `blocks`; an error for each revision it
/// has none for (a branch or tag needs the hub, a commit is its own).
fn pinned_by_state(
    blocks: &BTreeMap<String, Block>,
    state: Option<&State>,
) -> Result<Readings, ReadError> {
    let mut observed = Readings::default();
    let mut diags = Vec::new();
    for (address, b) in blocks {
        let revision = b.config.revision.clone();
        match pinned(state, address, &revision) {
            Some(o) => {
                observed.models.insert(address.clone(), o);
            }
            None if crate::kinds::model::is_commit(&revision) => {}
            None => diags.push(
                Diag::error(
                    "plan::model_unresolved",
                    format!("{address}: revision {revision:?} cannot be resolved without a refresh"),
                )
                .label(&b.span, "no commit for this revision in the state")
                .help("plan with refresh (the default) to resolve it on the download node, or pin `revision` to a 40-hex commit"),
            ),
        }
    }
    if !diags.is_empty() {
        return Err(ReadError::Config(Diagnostics(diags)));
    }
    Ok(observed)
}

/// The commits the state pins for the models whose revision is unchanged; the others are left
/// out (unresolved), never an error: for commands that look at or remove what is deployed.
fn recorded(blocks: &BTreeMap<String, Block>, state: Option<&State>) -> Readings {
    let mut observed = Readings::default();
    for (address, b) in blocks {
        if let Some(o) = pinned(state, address, &b.config.revision) {
            observed.models.insert(address.clone(), o);
        }
    }
    observed
}

/// Each model of `blocks` resolved on its download node, connected in `pool` (tests hand it
/// fake nodes). A node not connected is a refresh error; a failed resolution stops at once
/// with the model block's place and transfer.py's hint.
async fn resolve_on(
    blocks: &BTreeMap<String, Block>,
    pool: &HostPool,
) -> Result<Readings, ReadError> {
    let mut observed = Readings::default();
    let mut errors = Vec::new();
    for (address, b) in blocks {
        let host = match pool.get(&b.node) {
            Ok(h) => h,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let c = &b.config;
        let revision = c.revision.clone();
        let req = ResolveRequest {
            block: address,
            repo: &c.repo,
            revision: &revision,
            image: &c.image,
            cache: &c.cache,
            endpoint: c.endpoint(),
            token: c.token(),
            include: &c.include,
            exclude: &c.exclude,
            offline: true,
        };
        match resolve(host.as_ref(), &req).await {
            Ok(manifest) => {
                let commit = manifest
                    .get("commit")
                    .and_then(|c| c.as_str())
                    .unwrap_or_default()
                    .to_string();
                let facts = manifest.get("config").cloned().unwrap_or_default();
                if let Some(why) = manifest.get("offline").and_then(|w| w.as_str()) {
                    observed.warnings.push(
                        Diag::warning(
                            "plan::model_offline",
                            format!(
                                "{address}: the hub cannot be reached, so revision {revision:?} stays at commit {commit}, which {} keeps ({why})",
                                b.node
                            ),
                        )
                        .label(&b.span, "resolved from what its download node keeps")
                        .help("a newer commit of this revision on the hub is seen once the hub answers again; a revision no node keeps needs it"),
                    );
                }
                observed.models.insert(
                    address.clone(),
                    ModelReadings {
                        revision,
                        commit,
                        manifest,
                        config: facts,
                    },
                );
            }
            Err(e) => {
                return Err(ReadError::Config(Diagnostics(vec![Diag::error(
                    "plan::model_unresolved",
                    format!("{address}: {}", e.message),
                )
                .label(&b.span, "resolved on its download node")
                .help(e.help.unwrap_or_default())])));
            }
        }
    }
    if !errors.is_empty() {
        return Err(ReadError::Hosts(errors));
    }
    Ok(observed)
}

/// The commits a plan's model changes carry.
fn planned(plan: &crate::plan::Plan) -> Readings {
    let mut observed = Readings::default();
    for c in &plan.changes {
        let Some(after) = c.after.as_ref() else {
            continue;
        };
        if c.kind != KindId::Model {
            continue;
        }
        let Ok(d) = after.typed::<Desired>() else {
            continue;
        };
        let (block, revision) = (d.block.as_str(), d.revision.as_str());
        if let Some(o) = pinned_in(std::iter::once(after), block, revision) {
            observed.models.insert(block.to_string(), o);
        }
    }
    observed
}

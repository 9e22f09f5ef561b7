//! The model kind's plan-time read (`Machine::read`): each model block's revision resolved to
//! a commit on its download node (as the hub answers that node), or pinned by the state or by
//! a saved plan, as the [`ReadMode`] says. What it reads goes into `config::Observed.models`;
//! the second evaluation hands it to the lowering (`kinds::model::lower`), so plans show the
//! commit and the modules see the real size and `config.json` facts.

use std::collections::BTreeMap;

use super::{list, resolve, ResolveRequest};
use crate::config::{Config, ModelObserved, Observed, ResourceKind};
use crate::diag::{Diag, Diagnostics};
use crate::hosts::HostPool;
use crate::kinds::machine::{ReadCx, ReadError, ReadMode};
use crate::state::State;

/// One model block, as its download node's resource describes it.
struct Block {
    node: String,
    config: serde_json::Value,
    span: crate::diag::Span,
}

fn blocks(config: &Config) -> BTreeMap<String, Block> {
    let mut out = BTreeMap::new();
    for r in &config.resources {
        if r.kind != ResourceKind::Model {
            continue;
        }
        if r.config.get("role").and_then(|v| v.as_str()) != Some("download") {
            continue;
        }
        let Some(block) = r.config.get("block").and_then(|v| v.as_str()) else {
            continue;
        };
        out.insert(
            block.to_string(),
            Block {
                node: r.node.clone().unwrap_or_default(),
                config: r.config.clone(),
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
pub(super) async fn read(cx: &ReadCx<'_>) -> Result<Observed, ReadError> {
    let blocks = blocks(cx.config);
    if blocks.is_empty() {
        return Ok(Observed::default());
    }
    match cx.mode {
        ReadMode::Normal | ReadMode::Deep => resolve_on(&blocks, cx.pool).await,
        ReadMode::Recorded if cx.complete => pinned_by_state(&blocks, cx.state),
        ReadMode::Recorded => Ok(recorded(&blocks, cx.state)),
        ReadMode::Planned => Ok(cx.plan.map(planned).unwrap_or_default()),
        ReadMode::None => Ok(Observed::default()),
    }
}

/// The commit a state pins for a block at a revision, with what was recorded about it.
fn pinned(state: Option<&State>, block: &str, revision: &str) -> Option<ModelObserved> {
    pinned_in(
        state?.resources.values().map(|r| &r.config),
        block,
        revision,
    )
}

fn pinned_in<'a>(
    mut configs: impl Iterator<Item = &'a serde_json::Value>,
    block: &str,
    revision: &str,
) -> Option<ModelObserved> {
    configs.find_map(|c| {
        (c.get("block").and_then(|v| v.as_str()) == Some(block)
            && c.get("revision").and_then(|v| v.as_str()) == Some(revision))
        .then_some(())?;
        let commit = c.get("commit")?.as_str()?.to_string();
        Some(ModelObserved {
            revision: revision.to_string(),
            commit,
            manifest: serde_json::json!({
                "total_bytes": c.get("total_bytes").cloned().unwrap_or_default(),
                "files": c.get("files").cloned().unwrap_or_default(),
            }),
            config: c.get("facts").cloned().unwrap_or_default(),
        })
    })
}

/// The commits the state pins for the revisions of `blocks`; an error for each revision it
/// has none for (a branch or tag needs the hub, a commit is its own).
fn pinned_by_state(
    blocks: &BTreeMap<String, Block>,
    state: Option<&State>,
) -> Result<Observed, ReadError> {
    let mut observed = Observed::default();
    let mut diags = Vec::new();
    for (address, b) in blocks {
        let revision = str_of(b, "revision").unwrap_or_default();
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
fn recorded(blocks: &BTreeMap<String, Block>, state: Option<&State>) -> Observed {
    let mut observed = Observed::default();
    for (address, b) in blocks {
        let revision = str_of(b, "revision").unwrap_or_default();
        if let Some(o) = pinned(state, address, &revision) {
            observed.models.insert(address.clone(), o);
        }
    }
    observed
}

fn str_of(b: &Block, k: &str) -> Option<String> {
    b.config.get(k).and_then(|v| v.as_str()).map(str::to_string)
}

/// Each model of `blocks` resolved on its download node, connected in `pool` (tests hand it
/// fake nodes). A node not connected is a refresh error; a failed resolution stops at once
/// with the model block's place and transfer.py's hint.
async fn resolve_on(
    blocks: &BTreeMap<String, Block>,
    pool: &HostPool,
) -> Result<Observed, ReadError> {
    let mut observed = Observed::default();
    let mut errors = Vec::new();
    for (address, b) in blocks {
        let host = match pool.get(&b.node) {
            Ok(h) => h,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let (include, exclude) = (list(&b.config, "include"), list(&b.config, "exclude"));
        let (repo, revision) = (
            str_of(b, "repo").unwrap_or_default(),
            str_of(b, "revision").unwrap_or_default(),
        );
        let (image, cache) = (
            str_of(b, "image").unwrap_or_default(),
            str_of(b, "cache").unwrap_or_default(),
        );
        let (endpoint, token) = (str_of(b, "endpoint"), str_of(b, "token"));
        let req = ResolveRequest {
            block: address,
            repo: &repo,
            revision: &revision,
            image: &image,
            cache: &cache,
            endpoint: endpoint.as_deref(),
            token: token.as_deref(),
            include: &include,
            exclude: &exclude,
        };
        match resolve(host.as_ref(), &req).await {
            Ok(manifest) => {
                let commit = manifest
                    .get("commit")
                    .and_then(|c| c.as_str())
                    .unwrap_or_default()
                    .to_string();
                let facts = manifest.get("config").cloned().unwrap_or_default();
                observed.models.insert(
                    address.clone(),
                    ModelObserved {
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
fn planned(plan: &crate::plan::Plan) -> Observed {
    let mut observed = Observed::default();
    for c in &plan.changes {
        let Some(after) = c.after.as_ref() else {
            continue;
        };
        let (Some(block), Some(revision)) = (
            after.get("block").and_then(|v| v.as_str()),
            after.get("revision").and_then(|v| v.as_str()),
        ) else {
            continue;
        };
        if c.kind != ResourceKind::Model {
            continue;
        }
        if let Some(o) = pinned_in(std::iter::once(after), block, revision) {
            observed.models.insert(block.to_string(), o);
        }
    }
    observed
}

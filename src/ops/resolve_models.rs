//! Plan-time resolution of model revisions: a branch or tag is resolved to a commit on each
//! model's download node (as the hub answers that node), the commit and the manifest go into
//! `config::Observed`, and the definitions are evaluated again with them, so plans show the
//! commit and the modules see the real size and `config.json` facts.
//!
//! Without a refresh (`-refresh=false`), the commit the state pins is used when the revision
//! is unchanged; otherwise the plan stops and says the revision needs a refresh. The commands
//! reach this only through `ops::definitions`, which evaluates the definitions again with it.

use std::collections::BTreeMap;

use crate::config::{Config, ModelObserved, Observed, ResourceKind};
use crate::diag::{Diag, Diagnostics};
use crate::events::{emit, Event, Sender};
use crate::hosts::{HostOptions, HostPool};
use crate::kinds::model::machine::{resolve, ResolveRequest};
use crate::state::State;

use super::OpError;

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

/// What the machines say about the models of `config`: resolved on the download nodes when
/// `refresh` (connected for it, closed after), else pinned by the state.
pub async fn resolve_models(
    config: &Config,
    state: Option<&State>,
    refresh: bool,
    hosts: &HostOptions,
    events: &Sender,
) -> Result<Observed, OpError> {
    let blocks = blocks(config);
    if blocks.is_empty() {
        return Ok(Observed::default());
    }
    if !refresh {
        return pinned_by_state(&blocks, state);
    }
    let nodes: Vec<String> = {
        let mut n: Vec<String> = blocks.values().map(|b| b.node.clone()).collect();
        n.sort();
        n.dedup();
        n
    };
    emit(events, Event::Refreshing { nodes: nodes.len() });
    let pool = HostPool::connect(config, &nodes, hosts).await;
    let resolved = resolve_on(config, &pool).await;
    pool.close().await;
    resolved
}

/// The commits the state pins for the revisions of `blocks`; an error for each revision it
/// has none for (a branch or tag needs the hub, a commit is its own).
fn pinned_by_state(
    blocks: &BTreeMap<String, Block>,
    state: Option<&State>,
) -> Result<Observed, OpError> {
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
        return Err(OpError::Config(Diagnostics(diags)));
    }
    Ok(observed)
}

/// The commits the state pins for the models whose revision is unchanged; the others are left
/// out (unresolved), never an error: for commands that look at or remove what is deployed.
pub fn recorded(config: &Config, state: Option<&State>) -> Observed {
    let mut observed = Observed::default();
    for (address, b) in &blocks(config) {
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

/// Each model of `config` resolved on its download node, connected in `pool` (tests hand it
/// fake nodes). A node not connected is a refresh error; a failed resolution stops at once
/// with the model block's place and transfer.py's hint.
pub async fn resolve_on(config: &Config, pool: &HostPool) -> Result<Observed, OpError> {
    let mut observed = Observed::default();
    let mut errors = Vec::new();
    for (address, b) in &blocks(config) {
        let host = match pool.get(&b.node) {
            Ok(h) => h,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let list = |k: &str| -> Vec<String> {
            b.config
                .get(k)
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (include, exclude) = (list("include"), list("exclude"));
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
                return Err(OpError::Config(Diagnostics(vec![Diag::error(
                    "plan::model_unresolved",
                    format!("{address}: {}", e.message),
                )
                .label(&b.span, "resolved on its download node")
                .help(e.help.unwrap_or_default())])));
            }
        }
    }
    if !errors.is_empty() {
        return Err(OpError::Refresh(errors));
    }
    Ok(observed)
}

/// Whether a configuration has a model to resolve.
pub fn has_models(config: &Config) -> bool {
    !blocks(config).is_empty()
}

/// The commits a plan's model changes carry.
pub fn planned(plan: &crate::plan::Plan) -> Observed {
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

//! A container's cache folder (`cache`) on the machines: at plan time, whether the node's folder
//! for the image a new container would start holds anything (warm) or not, for the plan's
//! expected durations; and its removal when `destroy -purge-caches` deletes the container.

use super::*;
use crate::kinds::container::{CacheFound, FolderFound};

/// The containers with a cache folder, with their node's address.
fn cached(
    config: &Config,
) -> impl Iterator<Item = (&str, &Resource, super::super::CacheMount, String)> {
    config.resources.iter().filter_map(|r| {
        if r.kind != crate::vocabulary::KindId::Container {
            return None;
        }
        let d = r.config.typed::<Desired>().ok()?;
        Some((r.node.as_deref()?, r, d.cache?, d.image))
    })
}

/// The nodes whose cache folders the plan looks at.
pub(super) fn cache_nodes(config: &Config) -> Vec<String> {
    let mut nodes: Vec<String> = cached(config).map(|(n, ..)| n.to_string()).collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// What the plan knows of each cached container's folder, by address, as the kind's observed
/// value: `{ "cache": { "image_id", "folder", "warm" } }`. A node that cannot be reached, or an
/// image the node does not have yet, says `warm = false` without a folder.
pub(super) async fn read_caches(
    config: &Config,
    pool: &HostPool,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let reads = cached(config).map(|(node, r, cache, image)| async move {
        let seen = async {
            let host = pool.get(node).ok()?;
            // The lock file's read inspects the same reference: the pool inspects it once.
            let id = crate::runtime::image::image(host.as_ref(), &image)
                .await?
                .id;
            let folder = cache.folder(&id)?;
            let warm = holds_anything(host.as_ref(), &folder).await;
            Some(FolderFound {
                image_id: Some(id),
                folder: Some(folder),
                warm,
            })
        }
        .await
        .unwrap_or_default();
        let found = CacheFound { cache: Some(seen) };
        (
            r.address.clone(),
            serde_json::to_value(found).unwrap_or_default(),
        )
    });
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .collect()
}

/// Whether a cache folder on the node holds anything: what the image's last container compiled.
/// A folder that cannot be read counts as cold.
pub(super) async fn holds_anything(host: &dyn crate::hosts::Host, folder: &str) -> bool {
    let find = crate::hosts::Cmd::new("find")
        .args([
            folder,
            "-mindepth",
            "1",
            "-maxdepth",
            "1",
            "-print",
            "-quit",
        ])
        .timeout(Duration::from_secs(20));
    host.exec(&find)
        .await
        .is_ok_and(|o| o.success() && !o.stdout.trim().is_empty())
}

/// The phases of the latest start from a cold folder and of the latest from a warm one
/// (`{ "cold": {phase: secs}, "warm": {…} }`): this start's replaces its kind's, the other is
/// carried over from the recorded state. The plan's expected time for a warm replacement after
/// a cold start is then what a warm start took, not the cold start less a guess: a CPU build
/// of vLLM compiles again on a warm cache, only faster.
pub(super) fn phases_by_cache(
    recorded: Option<&Recorded>,
    warm: bool,
    phases: &PhaseSecs,
) -> PhasesByCache {
    let mut by_cache = recorded
        .and_then(|r| r.phase_secs_by_cache.clone())
        .unwrap_or_default();
    if warm {
        by_cache.warm = Some(phases.clone());
    } else {
        by_cache.cold = Some(phases.clone());
    }
    by_cache
}

/// Remove a deleted container's cache folder (`destroy -purge-caches`): a one-shot container of
/// the image it ran, with the folder's parent mounted, since the folder is Docker's (root's)
/// and the node's user may not be. The folder's name is the image's ID, checked to be one.
pub(super) async fn purge(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    recorded: &Recorded,
) -> Result<Option<String>, StepError> {
    let (Some(folder), Some(image)) = (&recorded.cache_folder, &recorded.image_id) else {
        return Ok(None);
    };
    let Some((parent, key)) = folder.rsplit_once('/') else {
        return Ok(None);
    };
    if parent.is_empty() || key.is_empty() || !key.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(StepError::new(format!(
            "the recorded cache folder {folder:?} is not one sparkform names; left as it is"
        )));
    }
    let node = cx.change.node.clone().unwrap_or_default();
    let name = format!("sparkform-purge-{}", &key[..key.len().min(12)]);
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec!["rm".into()]),
        cmd: Some(vec!["-rf".into(), "--".into(), format!("/purge/{key}")]),
        labels: Some(HashMap::from([(
            "sparkform.purge".to_string(),
            cx.lineage.to_string(),
        )])),
        host_config: Some(HostConfig {
            binds: Some(vec![format!("{parent}:/purge")]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let failed = || format!("{node}: cannot remove the cache folder {folder}");
    let id = crate::runtime::one_shot::start(docker, &name, body, None)
        .await
        .map_err(|e| docker_err(&failed(), e.error))?;
    // Its log ends when it does; then its exit code says whether the folder went.
    let mut said = String::new();
    let drained = tokio::time::timeout(
        Duration::from_secs(300),
        crate::runtime::one_shot::follow(docker, &id, &mut |_, text| {
            if said.len() < 4096 {
                said.push_str(text);
            }
            true
        }),
    )
    .await;
    let code = crate::runtime::one_shot::exit_code(docker, &id).await;
    let _ = remove(docker, &id).await;
    match (drained, code) {
        (Ok(()), Some(0)) => Ok(Some(format!("removed the cache folder {folder}"))),
        _ => Err(StepError::new(format!(
            "{node}: removing the cache folder {folder} did not finish (exit code {code:?}): {}",
            said.trim()
        ))),
    }
}

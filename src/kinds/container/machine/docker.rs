//! Docker plumbing: the create body, images (inspect, load, pull), exec, logs, removal.

use super::*;
use crate::kinds::known;
use crate::runtime::image::short_id;
use crate::runtime::spec::ContainerSpec;
pub(super) use crate::runtime::spec::{device_triple, restart_policy, ulimit_pair};

/// Docker answers 304 when a container is already in the asked state: that is success.
pub(super) fn already_so(
    r: Result<(), bollard::errors::Error>,
) -> Result<(), bollard::errors::Error> {
    match r {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 304, ..
        }) => Ok(()),
        other => other,
    }
}

pub(super) use crate::kinds::machine::docker_connection_lost as connection_lost;

pub(super) fn docker_err(what: &str, e: bollard::errors::Error) -> StepError {
    crate::kinds::machine::docker_error(what, e)
}

pub(super) fn strs(v: Option<&serde_json::Value>) -> Option<Vec<String>> {
    v.and_then(|v| v.as_array()).map(|a| {
        a.iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    })
}

/// The runtime's spec of a desired container, with sparkform's labels.
pub fn spec_of(
    desired: &Desired,
    lineage: &str,
    address: &str,
    config_hash: &str,
) -> ContainerSpec {
    let mut labels: HashMap<String, String> = desired
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(LABEL_LINEAGE.into(), lineage.into());
    labels.insert(LABEL_ADDRESS.into(), address.into());
    labels.insert(LABEL_CONFIG_HASH.into(), config_hash.into());
    ContainerSpec {
        image: desired.image.clone(),
        command: desired.command.as_deref().map(known),
        entrypoint: desired.entrypoint.as_deref().map(known),
        env: desired.env.clone(),
        labels,
        user: desired.user.clone(),
        working_dir: desired.working_dir.clone(),
        stop_timeout: desired.stop_timeout.as_ref().and_then(|n| n.as_i64()),
        network_mode: desired.network_mode.clone(),
        ipc_mode: desired.ipc_mode.clone(),
        pid_mode: desired.pid_mode.clone(),
        shm_size: desired.shm_size.as_ref().and_then(|n| n.as_i64()),
        gpus: desired.gpu_count(),
        devices: desired.devices.as_deref().map(known),
        volumes: desired.volumes.as_deref().map(known),
        ulimits: desired.ulimits.clone(),
        cap_add: desired.cap_add.as_deref().map(known),
        privileged: desired.privileged,
        restart: desired.restart.clone(),
    }
}

/// The Docker API body for a desired configuration, with sparkform's labels.
pub fn create_body(
    desired: &Desired,
    lineage: &str,
    address: &str,
    config_hash: &str,
) -> ContainerCreateBody {
    spec_of(desired, lineage, address, config_hash).body()
}

/// The image a new container runs: its ID, what a lock file pins its reference to, and what
/// the container is created from (the reference, or the ID itself when a rollback runs an
/// image the reference no longer names).
pub(super) struct ImageToRun {
    pub id: String,
    pub digest: String,
    pub create_from: String,
}

impl ImageToRun {
    fn by_reference(reference: &str, image: bollard::models::ImageInspect) -> Self {
        let (id, digest) = id_and_digest(reference, image);
        ImageToRun {
            id,
            digest,
            create_from: reference.to_string(),
        }
    }
}

/// The image `desired` runs, on the node: with `restoring` (a rollback's recorded image ID),
/// that image wherever its reference points now, while the node has it; else the reference,
/// loaded from its archive or pulled when the node lacks it.
pub(super) async fn ensure_image(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &Desired,
    restoring: Option<&str>,
) -> Result<ImageToRun, StepError> {
    if let Some(id) = restoring {
        if let Some(run) = restored_image(cx, docker, desired, id).await? {
            return Ok(run);
        }
    }
    let run = reference_image(cx, docker, desired).await?;
    if let Some(id) = restoring.filter(|id| *id != run.id) {
        cx.progress(
            format!(
                "{} is no longer on {}: running what {} names there now ({})",
                short_id(id),
                cx.change.node.as_deref().unwrap_or_default(),
                desired.image,
                short_id(&run.id)
            ),
            None,
            None,
        );
    }
    Ok(run)
}

/// A rollback's image, by the ID the generation recorded: `None` when the node no longer has
/// it (the plan said so, with the fix).
async fn restored_image(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &Desired,
    id: &str,
) -> Result<Option<ImageToRun>, StepError> {
    let node = cx.change.node.clone().unwrap_or_default();
    let reference = desired.image.as_str();
    match docker.inspect_image(reference).await {
        Ok(i) if i.id.as_deref() == Some(id) => {
            return Ok(Some(ImageToRun::by_reference(reference, i)))
        }
        Ok(i) => cx.progress(
            format!(
                "{reference} on {node} now names {}: running {} by its ID, as the generation did",
                short_id(i.id.as_deref().unwrap_or_default()),
                short_id(id)
            ),
            None,
            None,
        ),
        Err(e) => image_missing(&node, reference, e)?,
    }
    match docker.inspect_image(id).await {
        Ok(i) => {
            let (id, digest) = id_and_digest(reference, i);
            Ok(Some(ImageToRun {
                create_from: id.clone(),
                id,
                digest,
            }))
        }
        Err(e) => image_missing(&node, id, e).map(|()| None),
    }
}

/// The image the reference names on the node, loaded from `image_archive` or pulled when the
/// node lacks it and the block says so.
async fn reference_image(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &Desired,
) -> Result<ImageToRun, StepError> {
    let node = cx.change.node.clone().unwrap_or_default();
    let image = desired.image.as_str();
    match docker.inspect_image(image).await {
        Ok(i) => return Ok(ImageToRun::by_reference(image, i)),
        Err(e) => image_missing(&node, image, e)?,
    }
    if let Some(archive) = desired.image_archive.as_deref() {
        let path = cx.config_dir.join(archive);
        cx.progress(
            format!("loading {} into {node}", path.display()),
            None,
            None,
        );
        load_archive(docker, &path).await?;
    } else if desired.pull == Some(true) {
        cx.progress(format!("pulling {image} on {node}"), None, None);
        let mut stream = docker.create_image(
            Some(q::CreateImageOptions {
                from_image: Some(image.to_string()),
                ..Default::default()
            }),
            None,
            None,
        );
        // Bytes done and total per layer, summed: the engine reports each layer apart.
        let mut layers: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        let mut last_report: Option<Instant> = None;
        while let Some(item) = stream.next().await {
            let info =
                item.map_err(|e| StepError::new(format!("{node}: pulling {image} failed: {e}")))?;
            // Extracting reports its own bytes for the same layer: only downloads count.
            let downloading = info
                .status
                .as_deref()
                .is_some_and(|s| s.starts_with("Downloading"));
            if let (Some(id), Some(d), true) = (&info.id, &info.progress_detail, downloading) {
                if let (Some(cur), Some(total)) = (d.current, d.total) {
                    if total > 0 {
                        layers.insert(id.clone(), (cur.min(total), total));
                    }
                }
            }
            if let (Some(id), Some(status)) = (&info.id, &info.status) {
                // A finished layer reports no detail any more: count it as whole.
                if status.starts_with("Download complete") || status.starts_with("Pull complete") {
                    if let Some(l) = layers.get_mut(id) {
                        l.0 = l.1;
                    }
                }
            }
            // An event a second is enough for a line, and keeps `--json` readable.
            if last_report.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                continue;
            }
            last_report = Some(Instant::now());
            let message = if layers.is_empty() {
                format!(
                    "pulling {image}: {}",
                    info.status.as_deref().unwrap_or("starting")
                )
            } else {
                pull_progress(image, &layers)
            };
            cx.progress(message, None, None);
        }
    } else {
        return Err(StepError::new(format!("image {image} is not on {node}"))
            .help("load it there (`docker load`), set `image_archive = \"image.tar\"` to have sparkform load a saved image, or `pull = true` to pull it from a registry"));
    }
    docker
        .inspect_image(image)
        .await
        .map(|i| ImageToRun::by_reference(image, i))
        .map_err(|e| {
            StepError::new(format!(
                "{node}: image {image} is still missing after loading it: {e}"
            ))
        })
}

/// An image's ID, and what a lock file pins its reference to (`hosts::image::ImageSeen::digest`).
pub(super) fn id_and_digest(
    reference: &str,
    image: bollard::models::ImageInspect,
) -> (String, String) {
    let seen = crate::runtime::image::ImageSeen {
        id: image.id.unwrap_or_default(),
        repo_digests: image.repo_digests.unwrap_or_default(),
    };
    let digest = seen.digest(reference);
    (seen.id, digest)
}

/// Only a 404 means the image is not there (and may be loaded or pulled); any other answer, or
/// none, is the engine or the connection failing, and loading the image would not help.
pub(super) fn image_missing(
    node: &str,
    image: &str,
    e: bollard::errors::Error,
) -> Result<(), StepError> {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        } => Ok(()),
        e if connection_lost(&e) => Err(docker_err(
            &format!("{node}: cannot inspect image {image}"),
            e,
        )),
        e => Err(StepError::new(format!(
            "{node}: the Docker Engine failed to inspect image {image}: {e}"
        ))
        .help("this is not a missing image: the engine answered an error; check it on the node (`docker info`, its disk and logs), then run apply again")),
    }
}

/// `pulling IMAGE: 1.20 GiB / 3.40 GiB (35%, 4 layers)`.
pub(super) fn pull_progress(
    image: &str,
    layers: &std::collections::BTreeMap<String, (i64, i64)>,
) -> String {
    let (done, total) = layers.values().fold((0u64, 0u64), |(d, t), (c, n)| {
        (d + (*c).max(0) as u64, t + (*n).max(0) as u64)
    });
    format!(
        "pulling {image}: {} / {} ({}%, {} layer{})",
        indicatif::BinaryBytes(done),
        indicatif::BinaryBytes(total),
        (done * 100).checked_div(total).unwrap_or(0),
        layers.len(),
        if layers.len() == 1 { "" } else { "s" }
    )
}

pub(super) async fn load_archive(
    docker: &bollard::Docker,
    path: &std::path::Path,
) -> Result<(), StepError> {
    let file = tokio::fs::File::open(path).await.map_err(|e| {
        StepError::new(format!(
            "cannot open the image archive {}: {e}",
            path.display()
        ))
    })?;
    let stream = tokio_util::io::ReaderStream::new(file);
    let mut out = docker.import_image_stream(
        q::ImportImageOptions {
            quiet: true,
            ..Default::default()
        },
        stream,
        None,
    );
    while let Some(item) = out.next().await {
        let info =
            item.map_err(|e| StepError::new(format!("loading {} failed: {e}", path.display())))?;
        if let Some(err) = info.error_detail.and_then(|d| d.message) {
            return Err(StepError::new(format!(
                "loading {} failed: {err}",
                path.display()
            )));
        }
    }
    Ok(())
}

pub(super) async fn remove(docker: &bollard::Docker, id: &str) -> Result<(), StepError> {
    match docker
        .remove_container(
            id,
            Some(q::RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(docker_err(&format!("cannot remove container {id}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_progress_sums_the_layers() {
        let mut layers = std::collections::BTreeMap::new();
        layers.insert("a".to_string(), (512 * 1024 * 1024, 1024 * 1024 * 1024));
        layers.insert("b".to_string(), (0, 1024 * 1024 * 1024));
        assert_eq!(
            pull_progress("vllm/vllm-openai:v0.21.0", &layers),
            "pulling vllm/vllm-openai:v0.21.0: 512.00 MiB / 2.00 GiB (25%, 2 layers)"
        );
    }

    #[test]
    fn only_a_404_from_image_inspect_is_a_missing_image() {
        use bollard::errors::Error as E;
        // Docker's answers, as its API gives them.
        let missing = E::DockerResponseServerError {
            status_code: 404,
            message: "No such image: ray:1".into(),
        };
        assert!(image_missing("node.node2", "ray:1", missing).is_ok());
        let broken = E::DockerResponseServerError {
            status_code: 500,
            message: "open /var/lib/docker/image/overlay2/repositories.json: input/output error"
                .into(),
        };
        let e = image_missing("node.node2", "ray:1", broken).unwrap_err();
        assert!(
            e.message.contains("failed to inspect image ray:1")
                && e.message.contains("input/output error"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("is not on"), "{}", e.message);
        assert!(!e.help.as_deref().unwrap_or("").contains("docker load"));
        // The forward of the node's socket ends when the node is cut off.
        let lost = E::IOError {
            err: std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "Connection reset by peer",
            ),
        };
        let e = image_missing("node.node2", "ray:1", lost).unwrap_err();
        assert!(
            e.message
                .contains("the node was lost: the connection to it broke"),
            "{}",
            e.message
        );
        assert!(image_missing("node.node2", "ray:1", E::RequestTimeoutError).is_err());
    }
}

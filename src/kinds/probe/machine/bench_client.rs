//! A `bench` probe on its node: the engine's benchmark client in a one-shot container of the
//! deployment's image, on the host network (it reaches the endpoint as the node does), the
//! tokenizer's folder mounted read-only, the API key and the fixed prompts put in as files
//! before it starts. Its report is parsed into figures; the container is removed however the
//! run ends, and one a killed run left carries the same name and goes before the next starts.

use std::time::Duration;

use crate::hosts::HostPool;
use crate::kinds::machine::{docker_name, remove_container, tar_of, StepError};
use crate::kinds::probe::bench::{self, Bench, Figures};
use crate::runtime::one_shot;
use crate::runtime::spec::ContainerSpec;

/// The label of the client's container, valued with the deployment's lineage (not the label
/// refresh observes containers by: it is no resource).
pub const LABEL_HELPER: &str = "sparkform.bench";

/// The report is the last few dozen lines; what comes before (warnings) is kept short.
const KEEP_BYTES: usize = 256 * 1024;

fn container_for(b: &Bench, lineage: &str) -> bollard::models::ContainerCreateBody {
    let mut command = vec![
        "sh".to_string(),
        "-c".into(),
        bench::RUNNER.into(),
        "bench".into(),
    ];
    command.extend(b.command());
    let volumes = b.tokenizer.as_deref().map(|t| {
        let folder = mounted_for(t);
        vec![format!("{folder}:{folder}:ro")]
    });
    // No telemetry or usage report: the client's run must not reach the internet.
    let mut env: std::collections::BTreeMap<String, String> = [
        ("PYTHONUNBUFFERED", "1"),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
        ("HF_HUB_DISABLE_TELEMETRY", "1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    if b.tokenizer.is_some() {
        // The tokenizer is on the node: a client that also looks the model's name up on the hub
        // (SGLang's checks its chat template so) would wait minutes for a hub a fabric's
        // nodes often cannot reach, retrying.
        env.insert("HF_HUB_OFFLINE".into(), "1".into());
        env.insert("TRANSFORMERS_OFFLINE".into(), "1".into());
    }
    let container = ContainerSpec {
        image: b.image.clone(),
        entrypoint: Some(command),
        env: Some(env),
        network_mode: Some("host".into()),
        volumes,
        ..Default::default()
    };
    container.helper_body(LABEL_HELPER, lineage)
}

/// The folder mounted for a tokenizer at `path`: a snapshot of a Hugging Face cache
/// (`…/models--ORG--NAME/snapshots/COMMIT`) holds links into the repository's `blobs`, so the
/// repository's folder goes in whole; any other folder alone.
pub fn mounted_for(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((parent, _)) if parent.ends_with("/snapshots") => {
            parent.trim_end_matches("/snapshots")
        }
        _ => trimmed,
    }
}

/// A file's name in the archive, which `tar_of` puts under `/sparkform/` itself.
fn file_name(path: &str) -> &str {
    path.trim_start_matches("/sparkform/")
}

/// The files the client gets: the key (read by the runner, then removed) and the prompts.
fn files(b: &Bench) -> Result<Option<Vec<u8>>, StepError> {
    let prompts = b.prompts_file();
    let mut files: Vec<(&str, &[u8], u32)> = Vec::new();
    if let Some(key) = &b.api_key {
        files.push((file_name(bench::KEY_FILE), key.as_bytes(), 0o600));
    }
    if let Some((path, content)) = &prompts {
        files.push((file_name(path), content.as_bytes(), 0o644));
    }
    if files.is_empty() {
        return Ok(None);
    }
    tar_of(&files).map(Some)
}

/// Run the client on its node to its end, within `limit`; its figures and the report's text.
pub async fn run(
    b: &Bench,
    pool: &HostPool,
    address: &str,
    lineage: &str,
    limit: Duration,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<Figures, StepError> {
    let node = b.node.as_str();
    let docker = pool
        .get(node)
        .map_err(StepError::from)?
        .docker()
        .await
        .map_err(StepError::from)?;
    let name = docker_name(&format!("sparkform-{address}-bench"));
    let id = one_shot::start(&docker, &name, container_for(b, lineage), files(b)?)
        .await
        .map_err(|e| {
            crate::kinds::machine::helper_not_started(
                node,
                "the benchmark's container",
                "the benchmark runs in the deployment's image (it has the engine's client): it must be on the node",
                e,
            )
        })?;
    let mut output = String::new();
    let followed = async {
        one_shot::follow(&docker, &id, &mut |_, text| {
            output.push_str(text);
            if output.len() > KEEP_BYTES {
                let cut = output.len() - KEEP_BYTES / 2;
                let cut = (cut..output.len())
                    .find(|i| output.is_char_boundary(*i))
                    .unwrap_or(output.len());
                output.drain(..cut);
            }
            true
        })
        .await;
        one_shot::exit_code(&docker, &id).await
    };
    let ended = tokio::select! {
        code = followed => Ok(code),
        _ = tokio::time::sleep(limit) => Err(StepError::new(format!(
            "the benchmark did not end within {} s", limit.as_secs()
        )).help("give the probe a longer timeout, or ask for fewer requests")),
        _ = cancel.cancelled() => Err(StepError::new("interrupted")),
    };
    remove_container(&docker, &id).await;
    let code = ended?;
    let tail = || -> Vec<String> {
        let lines: Vec<&str> = output.lines().collect();
        lines[lines.len().saturating_sub(12)..]
            .iter()
            .map(|l| l.to_string())
            .collect()
    };
    if code != Some(0) {
        return Err(StepError::new(format!(
            "the benchmark's client exited {}",
            code.map_or("without an exit code".into(), |c| c.to_string())
        ))
        .details(tail())
        .help("its last lines say why; `sparkform verify -target` runs it again"));
    }
    bench::parse(&output, b.requests).map_err(|why| {
        StepError::new(format!("the benchmark's report is not usable: {why}")).details(tail())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_snapshots_links_into_its_blobs_are_mounted_with_it() {
        assert_eq!(
            super::mounted_for("/m/models--a--b/snapshots/05f3a283/"),
            "/m/models--a--b"
        );
        assert_eq!(super::mounted_for("/models/tiny"), "/models/tiny");
    }
}

//! One-shot containers: a program run in an image on a node's Docker Engine to its end (the
//! NCCL probe of `nodes`, a model's transfer, a fabric test's rank, a cache folder's removal).
//! Made under a fixed name (one a killed run left is removed first), filled with its files,
//! started, followed; the caller removes it once done (`remove_container`), however it ended.

use bollard::query_parameters as q;
use futures_util::StreamExt;

use crate::hosts::remove_container;

/// Which step of starting one failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Create,
    Upload,
    Start,
}

/// Starting a one-shot container failed: at which step, and Docker's error. Nothing of it is
/// left on the node.
#[derive(Debug)]
pub struct StartError {
    pub stage: Stage,
    pub error: bollard::errors::Error,
}

/// Make `name` from `body` (removing one a killed run left), put `files` (a tar archive,
/// unpacked at `/`) into it, and start it; its ID.
pub async fn start(
    docker: &bollard::Docker,
    name: &str,
    body: bollard::models::ContainerCreateBody,
    files: Option<Vec<u8>>,
) -> Result<String, StartError> {
    remove_container(docker, name).await;
    let created = docker
        .create_container(
            Some(q::CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|error| StartError {
            stage: Stage::Create,
            error,
        })?;
    let id = created.id;
    let failed = |stage| move |error| StartError { stage, error };
    let ran = async {
        if let Some(tar) = files {
            docker
                .upload_to_container(
                    &id,
                    Some(q::UploadToContainerOptions {
                        path: "/".into(),
                        ..Default::default()
                    }),
                    bollard::body_full(tar.into()),
                )
                .await
                .map_err(failed(Stage::Upload))?;
        }
        docker
            .start_container(&id, None::<q::StartContainerOptions>)
            .await
            .map_err(failed(Stage::Start))
    }
    .await;
    match ran {
        Ok(()) => Ok(id),
        Err(e) => {
            remove_container(docker, &id).await;
            Err(e)
        }
    }
}

/// Follow its output until it ends, each chunk as it comes (`on_output(stderr, text)`); an
/// answer of `false` stops following (what the caller waited for came).
pub async fn follow(
    docker: &bollard::Docker,
    id: &str,
    on_output: &mut (dyn FnMut(bool, &str) -> bool + Send),
) {
    let mut stream = docker.logs(
        id,
        Some(q::LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            ..Default::default()
        }),
    );
    while let Some(Ok(chunk)) = stream.next().await {
        let stderr = matches!(chunk, bollard::container::LogOutput::StdErr { .. });
        if !on_output(stderr, &chunk.to_string()) {
            return;
        }
    }
}

/// Its exit code once it has ended (its output ends a moment before Docker says so: asked for
/// up to 2 s); `None` while it still runs, or when Docker cannot say.
pub async fn exit_code(docker: &bollard::Docker, id: &str) -> Option<i64> {
    for _ in 0..20 {
        let state = docker
            .inspect_container(id, None::<q::InspectContainerOptions>)
            .await
            .ok()?
            .state?;
        if state.running != Some(true) {
            return state.exit_code;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    None
}

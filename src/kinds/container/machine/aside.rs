//! Set-aside and restore: a replaced container renamed aside and stopped, and on rollback
//! renamed back and started.

use super::*;

/// Rename a container aside and stop it, so a new one can take its name and the old one can
/// come back on rollback. Returns the name it was given.
pub(super) async fn set_aside(
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    stop_secs: i32,
) -> Result<String, StepError> {
    let short: String = id.chars().take(12).collect();
    let aside = format!("{name}-sparkform-old-{short}");
    let current = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
        .ok()
        .and_then(|i| i.name)
        .map(|n| n.trim_start_matches('/').to_string());
    // An interrupted earlier run may already have set it aside.
    if current.as_deref() != Some(aside.as_str()) {
        docker
            .rename_container(
                id,
                q::RenameContainerOptions {
                    name: aside.clone(),
                },
            )
            .await
            .map_err(|e| docker_err(&format!("cannot rename {name} aside"), e))?;
    }
    let stopped = docker
        .stop_container(
            id,
            Some(q::StopContainerOptions {
                t: Some(stop_secs),
                ..Default::default()
            }),
        )
        .await;
    already_so(stopped).map_err(|e| docker_err(&format!("cannot stop {name}"), e))?;
    Ok(aside)
}

/// The container, other than `id`, that holds `name` on the node, if one does.
pub(super) async fn name_holder(docker: &bollard::Docker, id: &str, name: &str) -> Option<String> {
    let holder = docker
        .inspect_container(name, None::<q::InspectContainerOptions>)
        .await
        .ok()?
        .id?;
    (holder != id && !holder.starts_with(id)).then_some(holder)
}

pub(super) async fn restore(
    docker: &bollard::Docker,
    id: &str,
    name: &str,
) -> Result<(), StepError> {
    let current = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
        .ok()
        .and_then(|i| i.name)
        .map(|n| n.trim_start_matches('/').to_string());
    // Already under its name (an untracked copy found set aside keeps the name it had).
    if current.as_deref() != Some(name) {
        if let Some(holder) = name_holder(docker, id, name).await {
            return Err(StepError::new(format!(
                "cannot bring the previous {name} back: container {} holds the name",
                holder.chars().take(12).collect::<String>()
            ))
            .help("`sparkform plan` shows both; the next apply replaces what is not recorded"));
        }
        docker
            .rename_container(
                id,
                q::RenameContainerOptions {
                    name: name.to_string(),
                },
            )
            .await
            .map_err(|e| docker_err(&format!("cannot rename the previous {name} back"), e))?;
    }
    let started = docker
        .start_container(id, None::<q::StartContainerOptions>)
        .await;
    already_so(started).map_err(|e| docker_err(&format!("cannot start the previous {name}"), e))
}

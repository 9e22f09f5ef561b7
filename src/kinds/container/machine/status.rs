//! A recorded container as `sparkform status` shows it: running (for how long, how often Docker
//! restarted it, on which image), exited with its code, or gone.

use super::*;

/// The container `id` as Docker reports it now.
pub(super) async fn inspect(docker: &bollard::Docker, id: &str) -> Seen {
    let i = match docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
    {
        Ok(i) => i,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            return Seen::Missing {
                reason: format!("no container {}", &id[..id.len().min(12)]),
            }
        }
        Err(_) => return Seen::Unknown,
    };
    let restarts = i.restart_count.unwrap_or(0);
    let image_id = i.image.clone();
    let st = i.state.unwrap_or_default();
    if st.running == Some(true) {
        let uptime_secs = st
            .started_at
            .as_deref()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .and_then(|t| u64::try_from((chrono::Utc::now() - t.to_utc()).num_seconds()).ok());
        return Seen::Running {
            uptime_secs,
            restarts,
            image_id,
        };
    }
    match st.status {
        Some(bollard::models::ContainerStateStatusEnum::EXITED)
        | Some(bollard::models::ContainerStateStatusEnum::DEAD) => Seen::Exited {
            code: st.exit_code.unwrap_or(-1),
            restarts,
            image_id,
        },
        other => Seen::Other {
            status: other
                .map(|s| s.to_string())
                .unwrap_or_else(|| "unknown".into()),
        },
    }
}

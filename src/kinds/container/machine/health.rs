//! A running container's health as `sparkform watch` checks it every interval: running, not
//! restarted by Docker since the last check, and no line of its log since then that means it no
//! longer serves (its `watch_on_log`, and its ready checks' `fail_on_log`).

use super::*;
use crate::kinds::machine::{Health, HealthFailure};

/// The patterns that mean a running container no longer serves: its `watch_on_log`, and its
/// ready checks' `fail_on_log` (fatal at any time), as (regex, cause).
fn signatures(d: &Desired) -> Vec<(regex::Regex, String)> {
    let mut out = Vec::new();
    let watch = d.watch_on_log.iter().flatten();
    let ready = d.ready.iter().flat_map(|r| r.fail_on_log.iter().flatten());
    for (pattern, cause) in watch.chain(ready) {
        if let Ok(re) = regex::Regex::new(pattern) {
            out.push((re, cause.clone()));
        }
    }
    out
}

/// One recorded container on its node (`id`: its recorded ID): running, not restarted by
/// Docker since the last check (`before`), no signature in its log since `since`.
pub(super) async fn health(
    address: &str,
    r: &Record<'_, Container>,
    id: &str,
    pool: &HostPool,
    before: Option<i64>,
    since: i64,
) -> Health {
    let mut seen = Health::default();
    let d = r.config.clone().unwrap_or_default();
    let fail = |cause: String, restartable: bool| HealthFailure { cause, restartable };
    let node = r.state.node.clone().unwrap_or_default();
    let docker = match pool.get(&node) {
        Ok(h) => h.docker().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let docker = match docker {
        Ok(d) => d,
        Err(e) => {
            seen.failure = Some(fail(
                format!("{address}: {node} cannot be reached: {e}"),
                false,
            ));
            return seen;
        }
    };
    let Ok(info) = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
    else {
        let cause = format!("{address}: container {} is gone from {node}", d.name);
        seen.failure = Some(fail(cause, true));
        return seen;
    };
    let st = info.state.unwrap_or_default();
    let restarts = info.restart_count.unwrap_or(0);
    seen.restart_count = Some(restarts);
    if st.running != Some(true) {
        let status = st
            .status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "not running".into());
        let cause = format!(
            "{address}: container {} on {node} is {status} (exit code {})",
            d.name,
            st.exit_code.unwrap_or(-1)
        );
        seen.failure = Some(fail(cause, true));
        return seen;
    }
    if before.is_some_and(|b| restarts > b) {
        let cause = format!(
            "{address}: Docker restarted {} on {node} ({restarts} restarts in all): it crashed",
            d.name
        );
        seen.failure = Some(fail(cause, true));
        return seen;
    }
    let until = chrono::Utc::now().timestamp();
    let lines = log_lines(&docker, id, since).await;
    seen.log_until = Some(until);
    let sigs = signatures(&d);
    let found = lines.iter().find_map(|l| {
        sigs.iter()
            .find(|(re, _)| re.is_match(l))
            .map(|(_, c)| (l.clone(), c.clone()))
    });
    if let Some((line, cause)) = found {
        let line: String = line.chars().take(200).collect();
        seen.failure = Some(fail(format!("{address}: {cause} (log: {line})"), true));
    }
    seen
}

/// A container's log lines since `since` (Unix seconds), bounded.
async fn log_lines(docker: &bollard::Docker, id: &str, since: i64) -> Vec<String> {
    let mut out = Vec::new();
    let mut stream = docker.logs(
        id,
        Some(q::LogsOptions {
            follow: false,
            stdout: true,
            stderr: true,
            since: i32::try_from(since).unwrap_or(0),
            tail: "5000".into(),
            ..Default::default()
        }),
    );
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            for l in chunk.to_string().lines() {
                out.push(l.to_string());
            }
            if out.len() > 20_000 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), read).await;
    out
}

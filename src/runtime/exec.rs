//! What runs inside a container already there, for any kind: a command (`docker exec`) and
//! the last lines of its log.

use std::time::Duration;

use bollard::query_parameters as q;
use futures_util::StreamExt;

/// Run a command in a container; (exit code, stdout, stderr).
pub async fn exec_in(
    docker: &bollard::Docker,
    container: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<(i64, String, String), String> {
    let work = async {
        let exec = docker
            .create_exec(
                container,
                bollard::exec::CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(cmd.to_vec()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("cannot exec in {container}: {e}"))?;
        let mut stdout = String::new();
        let mut stderr = String::new();
        if let bollard::exec::StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| format!("cannot start exec in {container}: {e}"))?
        {
            while let Some(Ok(chunk)) = output.next().await {
                match chunk {
                    bollard::container::LogOutput::StdErr { message } => {
                        stderr.push_str(&String::from_utf8_lossy(&message))
                    }
                    other => stdout.push_str(&other.to_string()),
                }
            }
        }
        let code = docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| e.to_string())?
            .exit_code
            .unwrap_or(-1);
        Ok((code, stdout, stderr))
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        format!(
            "`{}` did not finish within {} s",
            cmd.join(" "),
            timeout.as_secs()
        )
    })?
}

/// The last `n` log lines of a container.
pub async fn log_tail(docker: &bollard::Docker, container: &str, n: usize) -> Vec<String> {
    log_tail_since(docker, container, n, 0).await
}

/// The last `n` log lines a container wrote since `since` (Unix seconds; 0: ever): a restarted
/// container's log still holds what its previous run wrote, fatal lines included.
pub async fn log_tail_since(
    docker: &bollard::Docker,
    container: &str,
    n: usize,
    since: i32,
) -> Vec<String> {
    let mut stream = docker.logs(
        container,
        Some(q::LogsOptions {
            stdout: true,
            stderr: true,
            tail: n.to_string(),
            since,
            ..Default::default()
        }),
    );
    let mut text = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(&chunk.to_string());
    }
    text.lines().map(str::to_string).collect()
}

//! A container's log for `sparkform logs`: found by its address label (else its name), read
//! from its node's Docker Engine with timestamps, and, following, found again when it is
//! replaced.

use super::*;
use crate::kinds::machine::{split_timestamp, LogEvent, LogLine, LogRead};

/// One container's log, found again by its address label when it is replaced (following).
pub(super) struct LogSource(pub LogRead);

impl std::ops::Deref for LogSource {
    type Target = LogRead;
    fn deref(&self) -> &LogRead {
        &self.0
    }
}

impl LogSource {
    pub(super) async fn run(self, docker: &bollard::Docker) {
        let mut last: Option<i64> = None;
        let mut current: Option<String> = None;
        let mut waiting_said = false;
        loop {
            let found = tokio::select! {
                f = find(docker, &self.address, &self.source.name, self.lineage.as_deref()) => f,
                _ = self.cancel.cancelled() => break,
            };
            match found {
                // The container we read has stopped: wait for it or its successor.
                Some((id, running))
                    if self.follow && !running && current.as_deref() == Some(&id) =>
                {
                    if !waiting_said {
                        let _ = self.notes.send(LogEvent::Note(format!(
                            "{}: the container stopped; waiting for it or its replacement",
                            self.address
                        )));
                    }
                    waiting_said = true;
                }
                Some((id, _)) => {
                    if current.is_some() && current.as_deref() != Some(&id) {
                        let _ = self.notes.send(LogEvent::Note(format!(
                            "{}: now following the new container {}",
                            self.address,
                            &id[..id.len().min(12)]
                        )));
                    }
                    waiting_said = false;
                    current = Some(id.clone());
                    let first = last.is_none();
                    if !self.stream(docker, &id, first, &mut last).await || !self.follow {
                        break;
                    }
                }
                None if !self.follow => {
                    let _ = self.notes.send(LogEvent::Note(format!(
                        "{}: no container on {}",
                        self.address, self.node
                    )));
                    break;
                }
                None => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.cancel.cancelled() => break,
            }
        }
        self.end(None).await;
    }

    /// Stream one container's log from after `last`; false when the merge is gone.
    async fn stream(
        &self,
        docker: &bollard::Docker,
        id: &str,
        first: bool,
        last: &mut Option<i64>,
    ) -> bool {
        let since = match *last {
            Some(ns) => i32::try_from(ns / 1_000_000_000).unwrap_or(0),
            None => self.since.and_then(|s| i32::try_from(s).ok()).unwrap_or(0),
        };
        let tail = match (first, self.tail) {
            (true, Some(n)) => n.to_string(),
            _ => "all".to_string(),
        };
        let mut stream = docker.logs(
            id,
            Some(q::LogsOptions {
                follow: self.follow,
                stdout: true,
                stderr: true,
                since,
                timestamps: true,
                tail,
                ..Default::default()
            }),
        );
        loop {
            let chunk = tokio::select! {
                c = stream.next() => c,
                _ = self.cancel.cancelled() => return false,
            };
            let Some(Ok(chunk)) = chunk else {
                return true;
            };
            let stderr = matches!(chunk, bollard::container::LogOutput::StdErr { .. });
            let text = chunk.to_string();
            for raw in text.lines() {
                let Some((time, body)) = split_timestamp(raw) else {
                    continue;
                };
                // Resuming by whole seconds repeats lines already shown.
                if last.is_some_and(|l| time <= l) {
                    continue;
                }
                *last = Some(time);
                let line = LogLine {
                    time,
                    address: self.address.clone(),
                    text: body.to_string(),
                    stderr,
                };
                if self.lines.send((self.index, Some(line))).await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// The container holding an address now: by its address label (the running one, else the
/// newest), else by its name; (id, running).
async fn find(
    docker: &bollard::Docker,
    address: &str,
    name: &str,
    lineage: Option<&str>,
) -> Option<(String, bool)> {
    let mut labels = vec![format!("{LABEL_ADDRESS}={address}")];
    if let Some(l) = lineage {
        labels.push(format!("{LABEL_LINEAGE}={l}"));
    }
    for filter in [("label", labels), ("name", vec![name.to_string()])] {
        let mut filters = HashMap::new();
        filters.insert(filter.0.to_string(), filter.1);
        let Ok(list) = docker
            .list_containers(Some(q::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
        else {
            return None;
        };
        let exact_name = |c: &&bollard::models::ContainerSummary| {
            filter.0 == "label"
                || c.names
                    .iter()
                    .flatten()
                    .any(|n| n.trim_start_matches('/') == name)
        };
        let best = list.iter().filter(exact_name).max_by_key(|c| {
            (
                matches!(
                    c.state,
                    Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                ),
                c.created.unwrap_or(0),
            )
        });
        if let Some(c) = best {
            let running = matches!(
                c.state,
                Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
            );
            return Some((c.id.clone()?, running));
        }
    }
    None
}

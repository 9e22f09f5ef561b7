//! Readiness: a starting container watched until its ready checks pass, it dies or the
//! timeout passes, with its log followed for progress, warnings and fatal lines.

use std::collections::BTreeMap;

use super::*;

/// Exit code, OOM kill and the last 40 log lines: the evidence for a failed container.
pub(super) async fn evidence(docker: &bollard::Docker, id: &str) -> (String, Vec<String>) {
    let mut summary = String::new();
    if let Ok(i) = docker
        .inspect_container(id, None::<q::InspectContainerOptions>)
        .await
    {
        if let Some(st) = i.state {
            if st.running == Some(true) {
                summary.push_str("still running");
            } else {
                summary.push_str(&format!("exited with code {}", st.exit_code.unwrap_or(-1)));
            }
            if st.oom_killed == Some(true) {
                summary.push_str(", killed for lack of memory (OOM)");
            }
        }
    }
    let mut logs = log_tail(docker, id, 40).await;
    if logs.is_empty() {
        logs.push("(no log output)".into());
    }
    (summary, logs)
}

/// What a look at a container found (during its start, or before a check that depends on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Liveness {
    running: bool,
    /// Docker is between two restarts of it (its restart policy brought it back after a crash).
    restarting: bool,
    /// Docker's `RestartCount`: how often its restart policy restarted it.
    restarts: i64,
    /// Docker's word for its state (`exited`, `paused`…); `None` when the engine has no such
    /// container.
    status: Option<bollard::models::ContainerStateStatusEnum>,
    /// The exit code of its last run (0 while it never exited).
    exit_code: i64,
    /// Its last run was killed for lack of memory.
    oom_killed: bool,
}

/// Whether the container runs and how often Docker restarted it; Err when the node does not
/// answer.
pub(super) async fn liveness(docker: &bollard::Docker, id: &str) -> Result<Liveness, String> {
    match tokio::time::timeout(
        Duration::from_secs(20),
        docker.inspect_container(id, None::<q::InspectContainerOptions>),
    )
    .await
    {
        Err(_) => Err("the node's Docker Engine did not answer for 20 s".into()),
        Ok(Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        })) => Ok(Liveness::default()),
        Ok(Err(e)) if connection_lost(&e) => Err(format!(
            "the node was lost: the connection to it broke ({e})"
        )),
        Ok(Err(e)) => Err(format!("the node's Docker Engine failed: {e}")),
        Ok(Ok(i)) => {
            let st = i.state.unwrap_or_default();
            Ok(Liveness {
                running: st.running.unwrap_or(false),
                restarting: st.restarting.unwrap_or(false),
                restarts: i.restart_count.unwrap_or(0),
                status: Some(
                    st.status
                        .unwrap_or(bollard::models::ContainerStateStatusEnum::EMPTY),
                ),
                exit_code: st.exit_code.unwrap_or(-1),
                oom_killed: st.oom_killed.unwrap_or(false),
            })
        }
    }
}

/// Why a container that something depends on does not serve now, as Docker shows it (`l`):
/// gone, exited with its code, restarting after a crash, paused; `None` while it runs.
pub(super) fn not_serving(l: &Liveness, name: &str, node: &str) -> Option<String> {
    use bollard::models::ContainerStateStatusEnum as S;
    let Some(status) = l.status else {
        return Some(format!("container {name} is gone from {node}"));
    };
    if l.running && !l.restarting && status != S::PAUSED {
        return None;
    }
    let word = match status {
        S::EMPTY if !l.running => "exited".to_string(),
        // Between two restarts Docker reports it running and restarting.
        _ if l.restarting => "restarting".to_string(),
        s => s.to_string(),
    };
    let how = match status {
        S::PAUSED | S::CREATED => String::new(),
        _ => {
            let oom = if l.oom_killed {
                ", killed for lack of memory"
            } else {
                ""
            };
            let restarts = match l.restarts {
                0 => String::new(),
                1 => ", restarted once by Docker".to_string(),
                n => format!(", restarted {n} times by Docker"),
            };
            format!(" (exit code {}{oom}{restarts})", l.exit_code)
        }
    };
    Some(format!("container {name} is {word}{how} on {node}"))
}

/// Why a container that is not ready yet will not become ready.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Doomed {
    Exited,
    /// Its restart policy keeps bringing it back after crashes; the text says how often.
    CrashLoop(String),
}

/// A new container has restarted 0 times, so any restart before it is ready is a crash, and
/// with `restart = "always"` Docker would go on restarting it for as long as sparkform waited.
/// `None` while it may still become ready.
pub(super) fn doomed(l: &Liveness) -> Option<Doomed> {
    if l.restarting || l.restarts > 0 {
        let times = match l.restarts {
            ..=1 => "once".to_string(),
            n => format!("{n} times"),
        };
        return Some(Doomed::CrashLoop(format!(
            "is crash-looping: Docker restarted it {times} before it was ready"
        )));
    }
    (!l.running).then_some(Doomed::Exited)
}

/// One attempt of a ready check; Err says why it did not pass yet.
pub(super) async fn check_once(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    check: &ReadyCheck,
) -> Result<(), String> {
    let per_try = Duration::from_secs(check.interval_secs().clamp(1, 30) + 10);
    if let ReadyKind::Exec(cmd) = check.probe() {
        let (code, out, err) = exec_in(docker, id, &cmd, per_try).await?;
        let want = check.want_exit_code();
        if code != want {
            let last = out
                .lines()
                .chain(err.lines())
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string();
            return Err(format!(
                "`{}` exited {code}, expected {want}{}",
                cmd.join(" "),
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            ));
        }
        if let Some(want) = check.output_contains.as_deref() {
            if !out.contains(want) {
                return Err(format!(
                    "`{}` output does not contain {want:?}",
                    cmd.join(" ")
                ));
            }
        }
        return Ok(());
    }
    let host = cx.host().map_err(|e| e.message)?;
    if let ReadyKind::Http(url) = check.probe() {
        let (h, port, _) = crate::http::parse_url(url)?;
        let ep = host.forward(&h, port).await.map_err(|e| e.to_string())?;
        let r = crate::http::send(
            &ep,
            &crate::http::Request {
                method: "GET".into(),
                url: url.into(),
                headers: Vec::new(),
                body: None,
                timeout: per_try,
            },
        )
        .await?;
        let want = check.want_status();
        if r.status != want {
            return Err(format!("GET {url} answered {}, expected {want}", r.status));
        }
        return Ok(());
    }
    if let ReadyKind::Tcp(addr) = check.probe() {
        let (h, p) = addr.rsplit_once(':').ok_or("bad tcp address")?;
        let port: u16 = p.parse().map_err(|_| "bad port")?;
        let ep = host.forward(h, port).await.map_err(|e| e.to_string())?;
        return ep.answers().await;
    }
    Err("the ready check has no exec, http or tcp".into())
}

/// Fail at once when the container's log shows a known fatal condition (a regex of
/// `fail_on_log`), with the fix that goes with it.
pub(super) async fn fail_on_log(
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    patterns: &BTreeMap<String, String>,
    since: i32,
) -> Result<(), StepError> {
    let Ok(lines) = tokio::time::timeout(
        Duration::from_secs(10),
        log_tail_since(docker, id, 200, since),
    )
    .await
    else {
        return Ok(());
    };
    for (pattern, fix) in patterns {
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        if let Some(line) = lines.iter().find(|l| re.is_match(l)) {
            let start = lines.len().saturating_sub(40);
            return Err(StepError::new(format!(
                "container {name} logged a fatal condition: {}",
                line.trim()
            ))
            .details(lines[start..].to_vec())
            .help(fix.clone()));
        }
    }
    Ok(())
}

/// The `warn_on_log` patterns (regex → what it means) that match one of `lines` and are not in
/// `seen` yet: the pattern, the line and its message. Each warns once per start.
pub(super) fn new_warnings(
    lines: &[String],
    patterns: &BTreeMap<String, String>,
    seen: &mut BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (pattern, help) in patterns {
        if seen.contains(pattern) {
            continue;
        }
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        if let Some(line) = lines.iter().find(|l| re.is_match(l)) {
            seen.insert(pattern.to_string());
            out.push((line.trim().to_string(), help.clone()));
        }
    }
    out
}

/// Report the log lines `warn_on_log` names (once each); the start goes on.
pub(super) async fn warn_on_log(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    patterns: &BTreeMap<String, String>,
    seen: &mut BTreeSet<String>,
    since: i32,
) {
    if patterns.len() == seen.len() {
        return;
    }
    let Ok(lines) = tokio::time::timeout(
        Duration::from_secs(10),
        log_tail_since(docker, id, 200, since),
    )
    .await
    else {
        return;
    };
    for (line, help) in new_warnings(&lines, patterns, seen) {
        cx.emit(crate::events::Event::StepWarning {
            address: cx.address.to_string(),
            message: format!("container {name} logged: {line}"),
            help,
        });
    }
}

/// At most this many values per `record_from_log` name, each at most `RECORDED_CHARS` long:
/// what a log says is bounded in the state however long the log is.
const RECORDED_VALUES: usize = 16;
const RECORDED_CHARS: usize = 240;
/// How much of a ready container's log `record_from_log` reads.
const RECORD_LINES: usize = 20_000;

/// What `record_from_log` (name → pattern) finds in `lines`: for each name the distinct values
/// of its matching lines in log order (the capture groups that matched, joined by a space; the
/// whole match without groups), bounded. Names that match nothing are left out. Pure.
pub(super) fn recorded_from_log(
    lines: &[String],
    patterns: &BTreeMap<String, String>,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (name, pattern) in patterns {
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        let mut values: Vec<String> = Vec::new();
        for line in lines {
            let Some(c) = re.captures(line) else {
                continue;
            };
            let groups: Vec<&str> = c.iter().skip(1).flatten().map(|m| m.as_str()).collect();
            let text = if groups.is_empty() {
                c.get(0).map_or("", |m| m.as_str()).to_string()
            } else {
                groups.join(" ")
            };
            let text: String = text.trim().chars().take(RECORDED_CHARS).collect();
            if !values.contains(&text) {
                values.push(text);
            }
            if values.len() == RECORDED_VALUES {
                break;
            }
        }
        if !values.is_empty() {
            out.insert(name.clone(), values);
        }
    }
    out
}

/// Once a container is ready: what its log since `since` says for every ready check's
/// `record_from_log`, each value passed through the configuration's secrets.
pub(super) async fn record_from_log(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    checks: &[ReadyCheck],
    since: i32,
) -> BTreeMap<String, Vec<String>> {
    let patterns: BTreeMap<String, String> = checks
        .iter()
        .filter_map(|c| c.record_from_log.as_ref())
        .flat_map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect();
    if patterns.is_empty() {
        return BTreeMap::new();
    }
    let Ok(lines) = tokio::time::timeout(
        Duration::from_secs(30),
        log_tail_since(docker, id, RECORD_LINES, since),
    )
    .await
    else {
        return BTreeMap::new();
    };
    let mut found = recorded_from_log(&lines, &patterns);
    for values in found.values_mut() {
        for v in values.iter_mut() {
            *v = cx.secrets.scrub(v).into_owned();
        }
    }
    found
}

/// Follows a starting container's log, so that every phase its `progress` patterns name is
/// seen (and reported as an event) even when it lasts less than a check interval.
pub(super) struct LogFollow<S> {
    stream: Option<S>,
    watch: super::super::progress::PhaseWatch,
    label: Option<String>,
    since: Instant,
    /// Seconds each phase took, from its first line to the next phase's (the last one until
    /// ready): what a plan's expected durations take out when a cache skips it.
    took: BTreeMap<String, f64>,
}

impl<S> LogFollow<S>
where
    S: futures_util::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>>
        + Unpin,
{
    /// Read what the log says until `deadline` or the apply is cancelled.
    async fn read_until(&mut self, cx: &StepCx<'_>, deadline: tokio::time::Instant) {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = cx.cancel.cancelled() => {}
                }
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = cx.cancel.cancelled() => return,
                chunk = stream.next() => match chunk {
                    Some(Ok(chunk)) => {
                        for p in self.watch.feed(&chunk.to_string()) {
                            // A phase's time runs from its first line, not its last percentage.
                            if self.label.as_deref() != Some(p.label.as_str()) {
                                self.close_phase();
                                self.label = Some(p.label.clone());
                                self.since = Instant::now();
                            }
                            cx.emit(crate::events::Event::Phase {
                                address: cx.address.to_string(),
                                phase: p.label,
                                percent: p.percent,
                                line: p.line,
                            });
                        }
                    }
                    // The container ended its log or the node dropped the stream: the checks
                    // that follow say which.
                    _ => self.stream = None,
                },
            }
        }
    }

    /// The current phase's time, added to what the phase took before (a label may come back).
    fn close_phase(&mut self) {
        if let Some(label) = &self.label {
            *self.took.entry(label.clone()).or_default() += self.since.elapsed().as_secs_f64();
        }
    }

    /// What the container does, for its progress line: the latest phase seen and since when.
    fn doing(&self) -> Option<String> {
        self.watch.current().map(|p| {
            format!(
                "{} ({} s)",
                crate::events::phase_text(&p.label, p.percent),
                self.since.elapsed().as_secs()
            )
        })
    }
}

/// Wait until every ready check passes, the container dies, the timeout passes or the apply is
/// cancelled. Only what the log says from `since` on counts (Unix seconds; 0 for a new
/// container). Once ready: the seconds each `progress` phase took, by label.
pub(super) async fn wait_ready(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    id: &str,
    name: &str,
    checks: &[ReadyCheck],
    since: i32,
) -> Result<BTreeMap<String, f64>, StepError> {
    // One follower for all the checks: the phases of a start run across them.
    let mut follow = LogFollow {
        stream: Some(Box::pin(docker.logs(
            id,
            Some(q::LogsOptions {
                follow: true,
                stdout: true,
                stderr: true,
                tail: "all".into(),
                since,
                ..Default::default()
            }),
        ))),
        // The patterns of all the checks: a later check's phases may start during an earlier
        // one.
        watch: super::super::progress::PhaseWatch::new(
            &checks
                .iter()
                .filter_map(|c| c.progress.as_ref())
                .flat_map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())))
                .collect(),
        ),
        label: None,
        since: Instant::now(),
        took: BTreeMap::new(),
    };
    for check in checks {
        let timeout = Duration::from_secs(check.timeout_secs());
        let interval = Duration::from_secs(check.interval_secs().max(1));
        let what = check.describe();
        let start = Instant::now();
        let mut backoff = Backoff::new(interval);
        let warn_patterns = check.warn_on_log.as_ref();
        let mut warned = BTreeSet::new();
        loop {
            if cx.cancel.is_cancelled() {
                return Err(StepError::new(format!(
                    "{name}: cancelled while waiting for `{what}`"
                )));
            }
            let last = match check_once(cx, docker, id, check).await {
                Ok(()) => {
                    // A start that is ready at the first attempt still reports what it logged.
                    if let Some(patterns) = warn_patterns {
                        warn_on_log(cx, docker, id, name, patterns, &mut warned, since).await;
                    }
                    break;
                }
                Err(e) => e,
            };
            if let Some(patterns) = &check.fail_on_log {
                fail_on_log(docker, id, name, patterns, since).await?;
            }
            if let Some(patterns) = warn_patterns {
                warn_on_log(cx, docker, id, name, patterns, &mut warned, since).await;
            }
            let seen = liveness(docker, id).await.map_err(|e| {
                StepError::new(format!("{name}: {e} while waiting for `{what}`"))
                    .help("the node or its network may be down; check it and run again")
            })?;
            match doomed(&seen) {
                Some(Doomed::CrashLoop(why)) => {
                    let (_, logs) = evidence(docker, id).await;
                    return Err(StepError::new(format!(
                        "container {name} {why} (check `{what}`: {last})"
                    ))
                    .details(logs)
                    .help("the log lines above are the container's last 40; its restart policy would keep restarting it, so sparkform does not wait for the ready timeout"));
                }
                Some(Doomed::Exited) => {
                    let (state, logs) = evidence(docker, id).await;
                    return Err(StepError::new(format!(
                        "container {name} {state} before it was ready (check `{what}`: {last})"
                    ))
                    .details(logs)
                    .help("the log lines above are the container's last 40"));
                }
                None => {}
            }
            if start.elapsed() >= timeout {
                let (state, logs) = evidence(docker, id).await;
                return Err(StepError::new(format!(
                    "container {name} was not ready after {} s: `{what}` kept failing ({last}); the container is {state}",
                    timeout.as_secs()
                ))
                .details(logs)
                .help("raise the ready block's timeout if it is only slow; the log lines above are the container's last 40"));
            }
            let log = match follow.watch.last_line() {
                Some(l) => Some(l.to_string()),
                None if follow.stream.is_none() => {
                    tokio::time::timeout(Duration::from_secs(10), log_tail(docker, id, 1))
                        .await
                        .ok()
                        .and_then(|mut l| l.pop())
                }
                None => None,
            };
            cx.progress(
                // What it is doing says more than the check that did not pass yet.
                follow
                    .doing()
                    .unwrap_or_else(|| format!("waiting for `{what}`: {last}")),
                log,
                Some(timeout.as_secs()),
            );
            follow
                .read_until(cx, tokio::time::Instant::now() + backoff.next_wait())
                .await;
        }
    }
    follow.close_phase();
    // Tenths of a second: what a plan shows.
    Ok(follow
        .took
        .into_iter()
        .map(|(k, v)| (k, (v * 10.0).round() / 10.0))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL's lines as real two-node RoCE runs print them (public reports), and a Ray driver's
    /// copy of a worker's line.
    const NCCL: [&str; 6] = [
        "spark-153d:7:19 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE; OOB enp1s0f0np0:192.168.100.1<0>",
        "spark-153d:7:19 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
        "spark-153d:7:19 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/0",
        "(RayWorkerWrapper pid=2211, ip=192.168.200.2) spark2:2211:2290 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.200.2<0>",
        "ubuntu:11610 [0] NCCL INFO NET/IB : Using [0]roceP3p1s0:1/RoCE [RO]; OOB enP3p1s0np0:10.99.0.1<0>",
        "INFO 07-14 10:12:44 [gpu_worker.py:298] Available KV cache memory: 2.26 GiB",
    ];

    #[test]
    fn record_from_log_keeps_each_distinct_value_of_the_groups_in_log_order() {
        let lines: Vec<String> = NCCL.iter().map(|l| l.to_string()).collect();
        let patterns: BTreeMap<String, String> = [
            (
                "net",
                r"([\w.-]+):\d+:\d+ \[\d+\] NCCL INFO (NET/(?:IB|Socket) : Using [^;]*)",
            ),
            (
                "path",
                r"([\w.-]+):\d+:\d+ \[\d+\] NCCL INFO Channel .* via (NET/\w+/\d+(?:/GDRDMA)?)",
            ),
            ("kv", r"Available KV cache memory: [\d.]+ GiB"),
            ("none", "never printed"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let found = recorded_from_log(&lines, &patterns);
        assert_eq!(
            found["net"],
            [
                "spark-153d NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE",
                "spark2 NET/Socket : Using [0]enp1s0f0np0:192.168.200.2<0>",
            ]
        );
        assert_eq!(found["path"], ["spark-153d NET/IB/0"]);
        assert_eq!(found["kv"], ["Available KV cache memory: 2.26 GiB"]);
        assert!(!found.contains_key("none"));
        // ubuntu:11610 has no thread id: the pattern does not take it.
        assert_eq!(found.len(), 3);
        // Bounded however long the log is.
        let many: Vec<String> = (0..100)
            .map(|i| format!("Available KV cache memory: {i} GiB {}", "x".repeat(500)))
            .collect();
        let found = recorded_from_log(&many, &patterns);
        assert_eq!(found["kv"].len(), RECORDED_VALUES);
    }

    #[test]
    fn a_warn_on_log_pattern_warns_once_with_its_line() {
        let patterns: BTreeMap<String, String> = serde_json::from_str(
            r#"{"NET/Socket : Using|Using network Socket": "NCCL runs over TCP sockets"}"#,
        )
        .unwrap();
        // NCCL's line when it falls back to sockets (NCCL_DEBUG=INFO).
        let lines = vec![
            "spark1:1234:1300 [0] NCCL INFO NET/IB : No device found.".to_string(),
            "spark1:1234:1300 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:192.168.200.1<0>"
                .to_string(),
        ];
        let mut seen = BTreeSet::new();
        let first = new_warnings(&lines, &patterns, &mut seen);
        assert_eq!(first.len(), 1);
        assert!(first[0].0.contains("NET/Socket : Using"), "{first:?}");
        assert_eq!(first[0].1, "NCCL runs over TCP sockets");
        assert!(new_warnings(&lines, &patterns, &mut seen).is_empty());
        let rdma =
            vec!["spark1:1234:1300 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE".to_string()];
        assert!(new_warnings(&rdma, &patterns, &mut BTreeSet::new()).is_empty());
    }

    /// What a check that depends on a container is told about it: nothing while it runs; else
    /// its state, with the exit code where it has one.
    #[test]
    fn a_container_that_does_not_run_is_named_with_its_state_and_exit_code() {
        use bollard::models::ContainerStateStatusEnum as S;
        let seen = |status, running, restarting, exit_code, restarts| Liveness {
            running,
            restarting,
            restarts,
            status: Some(status),
            exit_code,
            oom_killed: false,
        };
        let down = |l: Liveness| not_serving(&l, "vllm-node1", "node.node1");
        assert_eq!(down(seen(S::RUNNING, true, false, 0, 0)), None);
        assert_eq!(
            down(seen(S::EXITED, false, false, 137, 0)).as_deref(),
            Some("container vllm-node1 is exited (exit code 137) on node.node1")
        );
        let mut oom = seen(S::EXITED, false, false, 137, 0);
        oom.oom_killed = true;
        assert_eq!(
            down(oom).as_deref(),
            Some("container vllm-node1 is exited (exit code 137, killed for lack of memory) on node.node1")
        );
        assert_eq!(
            down(seen(S::RESTARTING, true, true, 1, 4)).as_deref(),
            Some("container vllm-node1 is restarting (exit code 1, restarted 4 times by Docker) on node.node1")
        );
        assert_eq!(
            down(seen(S::PAUSED, true, false, 0, 0)).as_deref(),
            Some("container vllm-node1 is paused on node.node1")
        );
        assert_eq!(
            down(Liveness::default()).as_deref(),
            Some("container vllm-node1 is gone from node.node1")
        );
    }

    #[test]
    fn a_restart_before_ready_is_a_crash_loop_and_an_exit_is_an_exit() {
        let l = |running, restarting, restarts| Liveness {
            running,
            restarting,
            restarts,
            ..Liveness::default()
        };
        assert_eq!(doomed(&l(true, false, 0)), None);
        assert_eq!(doomed(&l(false, false, 0)), Some(Doomed::Exited));
        assert_eq!(
            doomed(&l(true, false, 8)),
            Some(Doomed::CrashLoop(
                "is crash-looping: Docker restarted it 8 times before it was ready".into()
            ))
        );
        // Between two restarts Docker reports it restarting (and running).
        assert!(
            matches!(doomed(&l(true, true, 1)), Some(Doomed::CrashLoop(m)) if m.contains("once"))
        );
    }
}

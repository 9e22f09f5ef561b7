//! A probe on the machine: an HTTP request or TCP connection through a node's tunnel, or a
//! command on a node or in a container, retried until it passes or times out.

mod bench_client;

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::desired::{Expect, ProbeForm};
use super::{parse_json_path, Desired, PathStep};
use crate::hosts::{Cmd, HostPool};
use crate::kinds::machine::{Backoff, ContainerIndex, Done, Machine, Step, StepError};
use crate::plan::Action;
use crate::runtime::exec::exec_in;

pub struct ProbeMachine;
pub static MACHINE: ProbeMachine = ProbeMachine;

/// The value at a JSON path, if any.
pub fn json_at<'a>(v: &'a serde_json::Value, path: &[PathStep]) -> Option<&'a serde_json::Value> {
    let mut cur = v;
    for step in path {
        cur = match step {
            PathStep::Key(k) => cur.get(k)?,
            PathStep::Index(i) => cur.get(*i)?,
        };
    }
    Some(cur)
}

fn excerpt(s: &str) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = one_line.chars().take(160).collect();
    if cut.len() < one_line.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// One attempt: Ok(summary of what it got) or Err(why it does not pass).
async fn attempt(
    config: &Desired,
    pool: &HostPool,
    containers: &ContainerIndex,
    per_try: Duration,
) -> Result<String, String> {
    let expect = &config.expect;
    match config.check() {
        Some(ProbeForm::Http(http)) => {
            let url = &http.url;
            let host = pool.get(&http.via).map_err(|e| e.to_string())?;
            let (h, port, _) = crate::http::parse_url(url)?;
            let ep = host.forward(&h, port).await.map_err(|e| e.to_string())?;
            let mut headers: Vec<(String, String)> = http
                .headers
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let payload = match (&http.json, &http.body) {
                (Some(j), _) => {
                    headers.push(("Content-Type".into(), "application/json".into()));
                    Some(serde_json::to_vec(j).unwrap_or_default())
                }
                (None, Some(b)) => Some(b.as_bytes().to_vec()),
                _ => None,
            };
            let method = http.method.clone().unwrap_or_else(|| {
                if payload.is_some() {
                    "POST".into()
                } else {
                    "GET".into()
                }
            });
            let r = crate::http::send(
                &ep,
                &crate::http::Request {
                    method: method.clone(),
                    url: url.clone(),
                    headers,
                    body: payload,
                    timeout: per_try,
                },
            )
            .await?;
            let text = String::from_utf8_lossy(&r.body).to_string();
            let want_status = expect.want_status();
            if r.status != want_status {
                return Err(format!(
                    "{method} {url} answered {} (expected {want_status}): {}",
                    r.status,
                    excerpt(&text)
                ));
            }
            let mut subject = text.clone();
            if let Some(path) = &expect.json_path {
                let steps = parse_json_path(path)?;
                let doc: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|_| format!("the answer is not JSON: {}", excerpt(&text)))?;
                let at = json_at(&doc, &steps)
                    .ok_or_else(|| format!("the answer has no {path}: {}", excerpt(&text)))?;
                if let Some(want) = &expect.equals {
                    if at != want {
                        return Err(format!("{path} is {at}, expected {want}"));
                    }
                }
                subject = at
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| at.to_string());
            }
            check_text(expect, &subject)?;
            // An OpenAI answer says how many tokens it generated: `watch` turns it into the
            // canary's tokens per second.
            let tokens = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|d| d.pointer("/usage/completion_tokens")?.as_u64())
                .map(|n| format!(" ({n} completion tokens)"))
                .unwrap_or_default();
            Ok(format!("{}: {}{tokens}", r.status, excerpt(&subject)))
        }
        Some(ProbeForm::Exec(exec)) => {
            let cmd = &crate::kinds::known(&exec.command);
            let (code, out, err) = if let Some(container) = &exec.container {
                let (node, name) = containers.get(container).cloned().ok_or_else(|| {
                    format!("{container} is not a container of this configuration")
                })?;
                let host = pool.get(&node).map_err(|e| e.to_string())?;
                let docker = host.docker().await.map_err(|e| e.to_string())?;
                exec_in(&docker, &name, cmd, per_try).await?
            } else {
                let node = exec.node.as_deref().unwrap_or_default();
                let host = pool.get(node).map_err(|e| e.to_string())?;
                let mut c =
                    Cmd::new(cmd.first().map(String::as_str).unwrap_or("true")).timeout(per_try);
                c.args.extend(cmd.iter().skip(1).cloned());
                let o = host.exec(&c).await.map_err(|e| e.to_string())?;
                (i64::from(o.code.unwrap_or(-1)), o.stdout, o.stderr)
            };
            let want = expect.want_exit_code();
            if code != want {
                return Err(format!(
                    "exited {code} (expected {want}): {}",
                    excerpt(&format!("{out} {err}"))
                ));
            }
            if let Some(want) = &expect.stdout_contains {
                if !out.contains(want.as_str()) {
                    return Err(format!(
                        "stdout does not contain {want:?}: {}",
                        excerpt(&out)
                    ));
                }
            }
            check_text(expect, &out)?;
            Ok(format!("exit {code}: {}", excerpt(&out)))
        }
        Some(ProbeForm::Tcp(tcp)) => {
            let addr = &tcp.address;
            let (h, p) = addr.rsplit_once(':').ok_or("bad address")?;
            let port: u16 = p.parse().map_err(|_| "bad port")?;
            let host = pool.get(&tcp.via).map_err(|e| e.to_string())?;
            let ep = host.forward(h, port).await.map_err(|e| e.to_string())?;
            ep.answers().await?;
            Ok(format!("{addr} accepts connections"))
        }
        None => Err(format!("the probe has no {} block", config.form)),
    }
}

fn check_text(expect: &Expect, subject: &str) -> Result<(), String> {
    if let Some(want) = &expect.contains {
        if !subject.contains(want.as_str()) {
            return Err(format!(
                "the answer does not contain {want:?}: {}",
                excerpt(subject)
            ));
        }
    }
    if let Some(re) = &expect.matches {
        let re = regex::Regex::new(re).map_err(|e| e.to_string())?;
        if !re.is_match(subject) {
            return Err(format!(
                "the answer does not match /{re}/: {}",
                excerpt(subject)
            ));
        }
    }
    Ok(())
}

/// How long a probe's failed attempts are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// For its own `timeout`: an apply waits for an engine that is still loading, and the last
    /// attempt gets what is left of it (at least 5 s).
    Timeout,
    /// Only for this long (`verify`, `watch`: the deployment passed once, nothing is loading),
    /// each attempt within what is left of it (at least 5 s): an engine that takes the request
    /// and never answers (a wedge: its core stopped while /health says 200) fails within the
    /// bound, not after the probe's load-time timeout.
    For(Duration),
}

/// Run a probe until it passes or its retries (`retry`) end; Ok((latency of the passing
/// attempt, summary)).
pub async fn run(
    config: &Desired,
    pool: &HostPool,
    containers: &ContainerIndex,
    retry: Retry,
    cancel: &tokio_util::sync::CancellationToken,
    mut progress: impl FnMut(String, u64),
) -> Result<(Duration, String), StepError> {
    let own = Duration::from_secs(config.timeout_secs());
    let interval = Duration::from_secs(config.interval_secs().max(1));
    let per_try = own.clamp(Duration::from_secs(5), Duration::from_secs(600));
    let window = match retry {
        Retry::Timeout => own,
        Retry::For(d) => d,
    };
    let start = Instant::now();
    let mut tries = 0u32;
    let mut backoff = Backoff::new(interval);
    loop {
        tries += 1;
        let t = Instant::now();
        let limit = match retry {
            // The last attempt still gets a fair chance to answer, so the error says what it
            // answered.
            Retry::Timeout => per_try.min(
                own.saturating_sub(start.elapsed())
                    .max(Duration::from_secs(5)),
            ),
            Retry::For(d) => per_try.min(
                d.saturating_sub(start.elapsed())
                    .max(Duration::from_secs(5)),
            ),
        };
        match attempt(config, pool, containers, limit).await {
            Ok(summary) => return Ok((t.elapsed(), summary)),
            Err(why) => {
                if start.elapsed() + backoff.peek() > window || cancel.is_cancelled() {
                    let e = StepError::new(format!(
                        "the probe failed after {tries} attempt{} in {:.1} s: {why}",
                        if tries == 1 { "" } else { "s" },
                        start.elapsed().as_secs_f64()
                    ));
                    return Err(match retry {
                        Retry::Timeout => e,
                        Retry::For(d) => e.help(format!(
                            "a failed attempt was tried again for {} s (--retry-for), not for the probe's timeout ({} s), which is how long an apply waits for an engine that is still loading; give a longer --retry-for to wait for one",
                            d.as_secs_f64(),
                            own.as_secs()
                        )),
                    });
                }
                progress(format!("attempt {tries}: {why}"), window.as_secs());
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_wait()) => {}
                    _ = cancel.cancelled() => {}
                }
            }
        }
    }
}

/// What a benchmark's progress line says while it runs.
fn bench_running(b: &super::bench::Bench) -> String {
    format!(
        "{} bench: {} requests, {} at once, {} tokens in, {} out",
        b.client, b.requests, b.concurrency, b.input_tokens, b.output_tokens
    )
}

/// A bench probe's step: the client run once; its figures recorded, and judged against the
/// last good generation's when the probe has a `regression` block and that generation ran the
/// same workload.
async fn bench_step(
    cx: &Step<'_, super::Probe>,
    config: &Desired,
    b: &super::bench::Bench,
) -> Result<Done<ProbeMachine>, StepError> {
    cx.progress(bench_running(b), None, Some(config.timeout_secs()));
    let limit = Duration::from_secs(config.timeout_secs());
    let figures = bench_client::run(b, cx.pool, cx.address, cx.lineage, limit, cx.cancel).await?;
    let workload = b.workload();
    let before = cx
        .recorded_facts()
        .and_then(|r| r.bench.clone())
        .filter(|m| m.workload == workload);
    let mut summary = figures.summary();
    if let (Some(rules), Some(before)) = (&config.regression, &before) {
        let worse = super::bench::regressions(rules, &before.figures, &figures);
        if !worse.is_empty() {
            return Err(StepError::new(format!(
                "the model is slower than in the last good generation: {}",
                worse.join("; ")
            ))
            .details(vec![
                format!("now:    {summary}"),
                format!("before: {}", before.figures.summary()),
            ])
            .help("the apply rolls back to what ran; `sparkform rollback` puts the last good generation back, or loosen the regression block if this is expected"));
        }
        summary.push_str("; within its regression rules");
    } else if config.regression.is_some() {
        summary.push_str("; no earlier run of this workload to compare with");
    }
    Ok(Done {
        recorded: super::Recorded {
            bench: Some(super::bench::Measured { workload, figures }),
        },
        undo: (),
        summary,
    })
}

/// Once it passed: keep checking it every soak interval until its soak has lasted; the first
/// failure fails it (and the apply rolls back). `None` when it has no soak.
async fn soak(
    config: &Desired,
    pool: &HostPool,
    containers: &ContainerIndex,
    cancel: &tokio_util::sync::CancellationToken,
    progress: impl Fn(String, u64),
) -> Result<Option<String>, StepError> {
    let Some(total) = config.soak_secs() else {
        return Ok(None);
    };
    let every = Duration::from_secs(config.soak_interval_secs());
    let per_try = Duration::from_secs(config.timeout_secs())
        .clamp(Duration::from_secs(5), Duration::from_secs(600));
    let start = Instant::now();
    let mut passes = 0u32;
    while start.elapsed() < Duration::from_secs(total) {
        progress(
            format!(
                "soaking: {:.0} s of {total} s, passed {passes} time{} since",
                start.elapsed().as_secs_f64(),
                if passes == 1 { "" } else { "s" }
            ),
            total,
        );
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = cancel.cancelled() => {
                return Err(StepError::new(format!(
                    "interrupted {:.0} s into its {total} s soak", start.elapsed().as_secs_f64()
                )));
            }
        }
        if let Err(why) = attempt(config, pool, containers, per_try).await {
            return Err(StepError::new(format!(
                "the probe failed {:.0} s into its {total} s soak, after passing {passes} time{} since: {why}",
                start.elapsed().as_secs_f64(),
                if passes == 1 { "" } else { "s" }
            ))
            .help("it passed once and then failed: the deployment does not hold; see `sparkform logs`"));
        }
        passes += 1;
    }
    Ok(Some(format!(
        "; kept passing for its {total} s soak ({passes} checks)"
    )))
}

#[async_trait]
impl Machine for ProbeMachine {
    type Kind = super::Probe;
    type Undo = ();

    async fn apply(
        &self,
        cx: &Step<'_, super::Probe>,
        action: Action,
    ) -> Result<Done<Self>, StepError> {
        if action == Action::Delete {
            return Ok(Done::summary(""));
        }
        let config = cx.desired()?;
        if let Some(b) = &config.bench {
            return bench_step(cx, config, b).await;
        }
        let (latency, summary) = run(
            config,
            cx.pool,
            cx.containers,
            Retry::Timeout,
            cx.cancel,
            |m, t| cx.progress(m, None, Some(t)),
        )
        .await?;
        let soaked = soak(config, cx.pool, cx.containers, cx.cancel, |m, t| {
            cx.progress(m, None, Some(t))
        })
        .await?
        .unwrap_or_default();
        Ok(Done::summary(format!(
            "passed in {:.2} s, {summary}{soaked}",
            latency.as_secs_f64()
        )))
    }

    async fn undo(
        &self,
        _cx: &Step<'_, super::Probe>,
        _action: Action,
        _done: &Done<Self>,
    ) -> Result<String, StepError> {
        Ok("nothing to undo".into())
    }

    async fn verify(
        &self,
        config: &Desired,
        pool: &HostPool,
        containers: &ContainerIndex,
        retry_for: Duration,
        cancel: &tokio_util::sync::CancellationToken,
        progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(Duration, String), StepError>> {
        if let Some(b) = &config.bench {
            progress(bench_running(b), config.timeout_secs());
            let t = Instant::now();
            let limit = Duration::from_secs(config.timeout_secs());
            // `verify` records nothing and has no lineage of its own to label with.
            let run = bench_client::run(b, pool, "verify", "verify", limit, cancel).await;
            return Some(run.map(|f| (t.elapsed(), f.summary())));
        }
        Some(
            run(
                config,
                pool,
                containers,
                Retry::For(retry_for),
                cancel,
                progress,
            )
            .await,
        )
    }
}

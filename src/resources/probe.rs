//! A probe: an HTTP request, a command or a TCP connection whose answer gates the apply.

use std::collections::BTreeMap;

use hcl::{Map, Value};

use super::container::to_json;
use super::Problem;

/// A probe changes nothing on a machine: any change to it is recorded in place (and it runs).
pub const IN_PLACE: &[&str] = &["http", "exec", "tcp", "expect", "timeout", "interval"];

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

fn problem(block: &'static str, attribute: &'static str, message: String, help: &str) -> Problem {
    Problem {
        block,
        attribute,
        message,
        help: help.to_string(),
    }
}

/// The canonical configuration of a probe and the node it runs through.
pub fn desired_config(
    attrs: &Map<String, Value>,
    parts: &BTreeMap<&str, &Map<String, Value>>,
) -> Result<(serde_json::Value, Option<String>), Problem> {
    let forms: Vec<&str> = ["http", "exec", "tcp"]
        .into_iter()
        .filter(|k| parts.contains_key(k))
        .collect();
    if forms.len() != 1 {
        return Err(problem(
            "",
            "",
            if forms.is_empty() {
                "no check: add one http { … }, exec { … } or tcp { … } block".into()
            } else {
                format!(
                    "{} blocks together; a probe has exactly one",
                    forms.join(" and ")
                )
            },
            "split it into several probes",
        ));
    }
    let form = forms[0];
    let body = parts.get(form).copied().cloned().unwrap_or_default();
    let node = match form {
        "http" => {
            let url = body.get("url").and_then(Value::as_str).unwrap_or_default();
            if !url.starts_with("http://") {
                return Err(problem("http", "url", format!("{url:?} is not an http:// URL"), "probes speak plain HTTP through the SSH tunnel of their `via` node, e.g. \"http://127.0.0.1:30000/health\""));
            }
            if let Some(m) = body.get("method").and_then(Value::as_str) {
                if !METHODS.contains(&m) {
                    return Err(problem(
                        "http",
                        "method",
                        format!("{m:?} is not an HTTP method"),
                        "use GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS (upper case)",
                    ));
                }
            }
            if body.get("json").is_some_and(|v| !v.is_null())
                && body.get("body").is_some_and(|v| !v.is_null())
            {
                return Err(problem(
                    "http",
                    "body",
                    "both json and body are set".into(),
                    "send either a JSON document (json = {…}) or a raw body",
                ));
            }
            body.get("via").and_then(Value::as_str).map(str::to_string)
        }
        "exec" => {
            let node = body.get("node").and_then(Value::as_str);
            let container = body.get("container").and_then(Value::as_str);
            if node.is_some() == container.is_some() {
                return Err(problem(
                    "exec",
                    "command",
                    "an exec probe runs either on a node or in a container".into(),
                    "set exactly one of node = node.x or container = container.y",
                ));
            }
            if body
                .get("command")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                return Err(problem(
                    "exec",
                    "command",
                    "the command is empty".into(),
                    "command = [\"program\", \"arg\", …]",
                ));
            }
            node.map(str::to_string)
        }
        _ => {
            let addr = body
                .get("address")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !addr
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            {
                return Err(problem(
                    "tcp",
                    "address",
                    format!("{addr:?} is not HOST:PORT"),
                    "e.g. \"192.168.200.1:6379\"",
                ));
            }
            body.get("via").and_then(Value::as_str).map(str::to_string)
        }
    };
    let expect = parts.get("expect").copied().cloned().unwrap_or_default();
    if let Some(re) = expect.get("matches").and_then(Value::as_str) {
        if let Err(e) = regex::Regex::new(re) {
            return Err(problem(
                "expect",
                "matches",
                format!("invalid regular expression: {e}"),
                "the syntax is Rust's regex crate (like RE2)",
            ));
        }
    }
    if let Some(path) = expect.get("json_path").and_then(Value::as_str) {
        if let Err(e) = parse_json_path(path) {
            return Err(problem(
                "expect",
                "json_path",
                e,
                "write a path like choices[0].message.content",
            ));
        }
    }
    let mut out = serde_json::Map::new();
    out.insert("form".into(), form.into());
    out.insert(form.to_string(), clean(&body));
    out.insert("expect".into(), clean(&expect));
    out.insert(
        "timeout".into(),
        attrs
            .get("timeout")
            .map(to_json)
            .unwrap_or(serde_json::json!(60)),
    );
    out.insert(
        "interval".into(),
        attrs
            .get("interval")
            .map(to_json)
            .unwrap_or(serde_json::json!(2)),
    );
    Ok((serde_json::Value::Object(out), node))
}

fn clean(m: &Map<String, Value>) -> serde_json::Value {
    serde_json::Value::Object(
        m.iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), to_json(v)))
            .collect(),
    )
}

/// A step of a JSON path: `choices[0].message.content` → Key, Index, Key, Key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathStep {
    Key(String),
    Index(usize),
}

pub fn parse_json_path(path: &str) -> Result<Vec<PathStep>, String> {
    let mut steps = Vec::new();
    let mut chars = path.chars().peekable();
    let mut key = String::new();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if key.is_empty() && !matches!(steps.last(), Some(PathStep::Index(_))) {
                    return Err(format!("empty key in json_path {path:?}"));
                }
                if !key.is_empty() {
                    steps.push(PathStep::Key(std::mem::take(&mut key)));
                }
            }
            '[' => {
                if !key.is_empty() {
                    steps.push(PathStep::Key(std::mem::take(&mut key)));
                }
                let mut num = String::new();
                loop {
                    match chars.next() {
                        Some(']') => break,
                        Some(d) if d.is_ascii_digit() => num.push(d),
                        _ => return Err(format!("expected a number and ] in json_path {path:?}")),
                    }
                }
                let i = num
                    .parse()
                    .map_err(|_| format!("bad index in json_path {path:?}"))?;
                steps.push(PathStep::Index(i));
            }
            c if c.is_whitespace() => return Err(format!("whitespace in json_path {path:?}")),
            c => key.push(c),
        }
    }
    if !key.is_empty() {
        steps.push(PathStep::Key(key));
    }
    if steps.is_empty() {
        return Err("json_path is empty".into());
    }
    Ok(steps)
}

// ----- running a probe -----

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Applied, Handler, StepCx, StepError};
use crate::hosts::{Cmd, HostPool};
use crate::plan::Action;

pub struct ProbeHandler;

/// Where a probe's exec runs when it names a container: node and Docker name, by address.
pub type ContainerIndex = std::collections::BTreeMap<String, (String, String)>;

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
    config: &serde_json::Value,
    pool: &HostPool,
    containers: &ContainerIndex,
    per_try: Duration,
) -> Result<String, String> {
    let expect = config.get("expect").cloned().unwrap_or_default();
    let form = config
        .get("form")
        .and_then(|f| f.as_str())
        .unwrap_or_default();
    let body = config.get(form).cloned().unwrap_or_default();
    let s = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    match form {
        "http" => {
            let via = s(&body, "via").unwrap_or_default();
            let url = s(&body, "url").unwrap_or_default();
            let host = pool.get(&via).map_err(|e| e.to_string())?;
            let (h, port, _) = crate::http::parse_url(&url)?;
            let ep = host.forward(&h, port).await.map_err(|e| e.to_string())?;
            let mut headers: Vec<(String, String)> = body
                .get("headers")
                .and_then(|h| h.as_object())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let payload = match (body.get("json"), body.get("body")) {
                (Some(j), _) => {
                    headers.push(("Content-Type".into(), "application/json".into()));
                    Some(serde_json::to_vec(j).unwrap_or_default())
                }
                (None, Some(b)) => Some(b.as_str().unwrap_or_default().as_bytes().to_vec()),
                _ => None,
            };
            let method = s(&body, "method").unwrap_or_else(|| {
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
            let want_status = expect.get("status").and_then(|v| v.as_u64()).unwrap_or(200) as u16;
            if r.status != want_status {
                return Err(format!(
                    "{method} {url} answered {} (expected {want_status}): {}",
                    r.status,
                    excerpt(&text)
                ));
            }
            let mut subject = text.clone();
            if let Some(path) = s(&expect, "json_path") {
                let steps = parse_json_path(&path)?;
                let doc: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|_| format!("the answer is not JSON: {}", excerpt(&text)))?;
                let at = json_at(&doc, &steps)
                    .ok_or_else(|| format!("the answer has no {path}: {}", excerpt(&text)))?;
                if let Some(want) = expect.get("equals") {
                    if at != want {
                        return Err(format!("{path} is {at}, expected {want}"));
                    }
                }
                subject = at
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| at.to_string());
            }
            check_text(&expect, &subject)?;
            Ok(format!("{}: {}", r.status, excerpt(&subject)))
        }
        "exec" => {
            let cmd: Vec<String> = body
                .get("command")
                .and_then(|c| c.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let (code, out, err) = if let Some(container) = s(&body, "container") {
                let (node, name) = containers.get(&container).cloned().ok_or_else(|| {
                    format!("{container} is not a container of this configuration")
                })?;
                let host = pool.get(&node).map_err(|e| e.to_string())?;
                let docker = host.docker().await.map_err(|e| e.to_string())?;
                super::container::exec_in(&docker, &name, &cmd, per_try).await?
            } else {
                let node = s(&body, "node").unwrap_or_default();
                let host = pool.get(&node).map_err(|e| e.to_string())?;
                let mut c =
                    Cmd::new(cmd.first().map(String::as_str).unwrap_or("true")).timeout(per_try);
                c.args.extend(cmd.iter().skip(1).cloned());
                let o = host.exec(&c).await.map_err(|e| e.to_string())?;
                (i64::from(o.code.unwrap_or(-1)), o.stdout, o.stderr)
            };
            let want = expect
                .get("exit_code")
                .and_then(|v| v.as_i64())
                .unwrap_or(0);
            if code != want {
                return Err(format!(
                    "exited {code} (expected {want}): {}",
                    excerpt(&format!("{out} {err}"))
                ));
            }
            if let Some(want) = s(&expect, "stdout_contains") {
                if !out.contains(&want) {
                    return Err(format!(
                        "stdout does not contain {want:?}: {}",
                        excerpt(&out)
                    ));
                }
            }
            check_text(&expect, &out)?;
            Ok(format!("exit {code}: {}", excerpt(&out)))
        }
        _ => {
            let via = s(&body, "via").unwrap_or_default();
            let addr = s(&body, "address").unwrap_or_default();
            let (h, p) = addr.rsplit_once(':').ok_or("bad address")?;
            let port: u16 = p.parse().map_err(|_| "bad port")?;
            let host = pool.get(&via).map_err(|e| e.to_string())?;
            let ep = host.forward(h, port).await.map_err(|e| e.to_string())?;
            super::container::tcp_open(&ep).await?;
            Ok(format!("{addr} accepts connections"))
        }
    }
}

fn check_text(expect: &serde_json::Value, subject: &str) -> Result<(), String> {
    if let Some(want) = expect.get("contains").and_then(|v| v.as_str()) {
        if !subject.contains(want) {
            return Err(format!(
                "the answer does not contain {want:?}: {}",
                excerpt(subject)
            ));
        }
    }
    if let Some(re) = expect.get("matches").and_then(|v| v.as_str()) {
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

/// Run a probe until it passes or its timeout ends; Ok((latency of the passing attempt, summary)).
pub async fn run(
    config: &serde_json::Value,
    pool: &HostPool,
    containers: &ContainerIndex,
    cancel: &tokio_util::sync::CancellationToken,
    mut progress: impl FnMut(String, u64),
) -> Result<(Duration, String), StepError> {
    let timeout = Duration::from_secs(config.get("timeout").and_then(|v| v.as_u64()).unwrap_or(60));
    let interval = Duration::from_secs(
        config
            .get("interval")
            .and_then(|v| v.as_u64())
            .unwrap_or(2)
            .max(1),
    );
    let per_try = timeout.clamp(Duration::from_secs(5), Duration::from_secs(600));
    let start = Instant::now();
    let mut tries = 0u32;
    let mut backoff = super::Backoff::new(interval);
    loop {
        tries += 1;
        let t = Instant::now();
        // The last attempt still gets a fair chance to answer, so the error says what it answered.
        let remaining = timeout
            .saturating_sub(start.elapsed())
            .max(Duration::from_secs(5));
        match attempt(config, pool, containers, per_try.min(remaining)).await {
            Ok(summary) => return Ok((t.elapsed(), summary)),
            Err(why) => {
                if start.elapsed() + backoff.peek() > timeout || cancel.is_cancelled() {
                    return Err(StepError::new(format!(
                        "the probe failed after {tries} attempt{} in {:.1} s: {why}",
                        if tries == 1 { "" } else { "s" },
                        start.elapsed().as_secs_f64()
                    )));
                }
                progress(format!("attempt {tries}: {why}"), timeout.as_secs());
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_wait()) => {}
                    _ = cancel.cancelled() => {}
                }
            }
        }
    }
}

#[async_trait]
impl Handler for ProbeHandler {
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError> {
        if action == Action::Delete {
            return Ok(Applied::default());
        }
        let config = cx
            .desired
            .ok_or_else(|| StepError::new("no probe configuration"))?;
        let (latency, summary) = run(config, cx.pool, cx.containers, cx.cancel, |m, t| {
            cx.progress(m, None, Some(t))
        })
        .await?;
        Ok(Applied {
            attributes: Default::default(),
            undo: serde_json::Value::Null,
            summary: format!("passed in {:.2} s, {summary}", latency.as_secs_f64()),
        })
    }

    async fn undo(
        &self,
        _cx: &StepCx<'_>,
        _action: Action,
        _applied: &Applied,
    ) -> Result<String, StepError> {
        Ok("nothing to undo".into())
    }

    async fn finalize(
        &self,
        _cx: &StepCx<'_>,
        _action: Action,
        _applied: &Applied,
    ) -> Result<(), StepError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths() {
        assert_eq!(
            parse_json_path("choices[0].message.content").unwrap(),
            vec![
                PathStep::Key("choices".into()),
                PathStep::Index(0),
                PathStep::Key("message".into()),
                PathStep::Key("content".into())
            ]
        );
        assert!(parse_json_path("a..b").is_err());
        assert!(parse_json_path("a[x]").is_err());
        assert!(parse_json_path("").is_err());
    }
}

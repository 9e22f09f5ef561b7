//! A probe: an HTTP request, a command or a TCP connection whose answer gates the apply.

pub mod bench;
pub mod desired;
pub(crate) mod lower;
pub mod machine;

pub use desired::{Desired, Recorded};

use crate::kind::Kind;
use crate::schema::{self, opt, req, spec, BlockSpec, Child};
use crate::vocabulary::{Lifecycle, OnDrift};

pub static PROBE_HTTP: BlockSpec = spec(
    "http",
    &[],
    &[
        req("via", schema::ValueType::Node),
        req("url", schema::ValueType::Str),
        opt("method", schema::ValueType::Str),
        opt("headers", schema::ValueType::MapStr),
        opt("json", schema::ValueType::Any),
        opt("body", schema::ValueType::Str),
    ],
    &[],
);

pub static PROBE_EXEC: BlockSpec = spec(
    "exec",
    &[],
    &[
        opt("node", schema::ValueType::Node),
        opt("container", schema::ValueType::Container),
        req("command", schema::ValueType::ListStr),
    ],
    &[],
);

pub static PROBE_TCP: BlockSpec = spec(
    "tcp",
    &[],
    &[
        req("via", schema::ValueType::Node),
        req("address", schema::ValueType::Str),
    ],
    &[],
);

pub static PROBE_BENCH: BlockSpec = spec(
    "bench",
    &[],
    &[
        opt("client", schema::ValueType::Str),
        req("node", schema::ValueType::Node),
        req("image", schema::ValueType::Str),
        req("url", schema::ValueType::Str),
        req("model", schema::ValueType::Str),
        opt("tokenizer", schema::ValueType::Str),
        opt("api_key", schema::ValueType::Str),
        req("requests", schema::ValueType::Num),
        req("concurrency", schema::ValueType::Num),
        req("input_tokens", schema::ValueType::Num),
        req("output_tokens", schema::ValueType::Num),
        opt("prompts", schema::ValueType::ListStr),
        opt("max_num_seqs", schema::ValueType::Num),
        opt("max_model_len", schema::ValueType::Num),
    ],
    &[],
);

pub static REGRESSION: BlockSpec = spec(
    "regression",
    &[],
    &[
        opt("throughput", schema::ValueType::Str),
        opt("ttft_p50", schema::ValueType::Str),
        opt("ttft_p99", schema::ValueType::Str),
        opt("itl_p50", schema::ValueType::Str),
        opt("itl_p99", schema::ValueType::Str),
    ],
    &[],
);

pub static EXPECT: BlockSpec = spec(
    "expect",
    &[],
    &[
        opt("status", schema::ValueType::Num),
        opt("contains", schema::ValueType::Str),
        opt("matches", schema::ValueType::Str),
        opt("json_path", schema::ValueType::Str),
        opt("equals", schema::ValueType::Any),
        opt("exit_code", schema::ValueType::Num),
        opt("stdout_contains", schema::ValueType::Str),
    ],
    &[],
);

pub static SOAK: BlockSpec = spec(
    "soak",
    &[],
    &[
        req("duration", schema::ValueType::Duration),
        opt("interval", schema::ValueType::Duration),
    ],
    &[],
);

/// The block that declares it.
pub static PROBE: BlockSpec = spec(
    "probe",
    &["name"],
    &[
        opt("timeout", schema::ValueType::Duration),
        opt("interval", schema::ValueType::Duration),
        opt("depends_on", schema::ValueType::RefList),
        opt("for_each", schema::ValueType::ForEach),
    ],
    &[
        Child {
            name: "http",
            spec: &PROBE_HTTP,
            multiple: false,
        },
        Child {
            name: "exec",
            spec: &PROBE_EXEC,
            multiple: false,
        },
        Child {
            name: "tcp",
            spec: &PROBE_TCP,
            multiple: false,
        },
        Child {
            name: "bench",
            spec: &PROBE_BENCH,
            multiple: false,
        },
        Child {
            name: "regression",
            spec: &REGRESSION,
            multiple: false,
        },
        Child {
            name: "expect",
            spec: &EXPECT,
            multiple: false,
        },
        Child {
            name: "soak",
            spec: &SOAK,
            multiple: false,
        },
    ],
);

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &PROBE;

use std::collections::BTreeMap;

use hcl::{Map, Value};

use super::to_json;
use super::Problem;
use crate::kind::DesiredConfig;

pub struct Probe;
pub static KIND: Probe = Probe;
super::register!(Probe, KIND, TOP_BLOCK, lower::lower);

impl Kind for Probe {
    type Desired = Desired;
    type Recorded = Recorded;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &PROBE,
        in_place: IN_PLACE,
        whole_attributes: &[],
        lifecycle: Lifecycle::Runs,
        on_drift: OnDrift::Ignore,
        service: false,
        disruption: None,
        found_untracked: false,
        dot_shape: "diamond",
    };
    fn placement(&self, desired: &Desired) -> crate::kind::Placement {
        crate::kind::Placement {
            reaches: desired.http.clone().map(|http| crate::kind::Reaches {
                via: http.via,
                url: http.url,
                authorization: http.headers.and_then(|h| h.get("Authorization").cloned()),
            }),
            enters_containers: true,
            ..Default::default()
        }
    }
    /// A benchmark loads the serving engine: `verify` and `watch` run it only when named.
    fn checking(&self, desired: &Desired) -> crate::kind::Checking {
        crate::kind::Checking {
            unnamed: desired.bench.is_none(),
            soak_secs: desired.soak_secs(),
            readiness: desired.bench.is_none(),
        }
    }
    fn holds(&self, recorded: &Recorded) -> crate::kind::Holds {
        crate::kind::Holds {
            measured: recorded
                .bench
                .as_ref()
                .map(|m| m.figures.named())
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// A probe changes nothing on a machine: any change to it is recorded in place (and it runs).
pub const IN_PLACE: &[&str] = &[
    "http",
    "exec",
    "tcp",
    "bench",
    "regression",
    "expect",
    "timeout",
    "interval",
    "soak",
];

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

fn problem(block: &'static str, attribute: &'static str, message: String, help: &str) -> Problem {
    Problem {
        block,
        attribute,
        message,
        help: help.to_string(),
    }
}

/// A `regression` block, checked: only beside a `bench` block, each rule a figure of the
/// benchmark with an allowance in the direction that makes it worse; `None` without rules.
fn regression_config(
    parts: &BTreeMap<&str, &Map<String, Value>>,
    form: &str,
) -> Result<Option<serde_json::Value>, Problem> {
    let Some(regression) = parts.get("regression") else {
        return Ok(None);
    };
    if form != "bench" {
        return Err(problem(
            "regression",
            "",
            "a regression block without a bench block: there are no figures to compare".into(),
            "move it into the probe with the bench { … } block",
        ));
    }
    for (name, v) in regression.iter().filter(|(_, v)| !v.is_null()) {
        let text = v.as_str().unwrap_or_default();
        if let Err(e) = bench::allowance(name, text) {
            return Err(problem(
                "regression",
                static_rule(name),
                e,
                "regression { throughput = \"-10%\", ttft_p99 = \"+25%\" }: how far a figure may move from the last good generation's",
            ));
        }
    }
    // Rules all left unset (a variable's empty map) compare nothing.
    let rules = clean(regression);
    Ok(rules
        .as_object()
        .is_some_and(|r| !r.is_empty())
        .then_some(rules))
}

/// A regression rule's name as the schema spells it, for the diagnostic's span.
fn static_rule(name: &str) -> &'static str {
    bench::RULES
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n == name)
        .unwrap_or("")
}

/// A `bench` block, checked: its client, its URL, a workload of at least one request, within
/// the engine's limits when the block gives them; the node it runs on.
fn bench_node(body: &Map<String, Value>) -> Result<Option<String>, Problem> {
    let client = body.get("client").and_then(Value::as_str).unwrap_or("vllm");
    if !bench::CLIENTS.contains(&client) {
        return Err(problem(
            "bench",
            "client",
            format!("{client:?} is no benchmark client sparkform runs"),
            "client = \"vllm\" (vllm bench serve) or \"sglang\" (sglang.bench_serving)",
        ));
    }
    let url = body.get("url").and_then(Value::as_str).unwrap_or_default();
    if !url.starts_with("http://") || schema::parse_url(url).is_err() {
        return Err(problem(
            "bench",
            "url",
            format!("{url:?} is not an http:// URL"),
            "the endpoint's base URL as the node reaches it, e.g. \"http://192.168.200.1:30000\"",
        ));
    }
    let num = |k: &str| {
        body.get(k)
            .and_then(Value::as_number)
            .and_then(|n| n.as_u64())
    };
    for k in ["requests", "concurrency", "output_tokens"] {
        if num(k).is_none_or(|n| n == 0) {
            return Err(problem(
                "bench",
                match k {
                    "requests" => "requests",
                    "concurrency" => "concurrency",
                    _ => "output_tokens",
                },
                format!("{k} must be a whole number of at least 1"),
                "e.g. requests = 8, concurrency = 2, input_tokens = 32, output_tokens = 16",
            ));
        }
    }
    let mut typed = clean(body);
    if let Some(o) = typed.as_object_mut() {
        o.entry("client").or_insert_with(|| client.into());
    }
    let b: bench::Bench = serde_json::from_value(typed).map_err(|e| {
        problem(
            "bench",
            "",
            format!("the bench block does not read: {e}"),
            "requests, concurrency, input_tokens and output_tokens are whole numbers",
        )
    })?;
    if let Some((attribute, message, help)) = b.beyond_limits() {
        return Err(problem("bench", attribute, message, &help));
    }
    Ok(Some(b.node))
}

/// The `expect` block's regular expression and JSON path, checked.
fn check_expect(expect: &Map<String, Value>) -> Result<(), Problem> {
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
    Ok(())
}

/// A `soak` block, checked: a duration, and an interval no longer than it.
fn soak_config(
    parts: &BTreeMap<&str, &Map<String, Value>>,
) -> Result<Option<serde_json::Value>, Problem> {
    let Some(soak) = parts.get("soak") else {
        return Ok(None);
    };
    let secs = |k: &str| {
        soak.get(k)
            .and_then(Value::as_number)
            .and_then(|n| n.as_u64())
    };
    let duration = secs("duration").unwrap_or(0);
    let interval = secs("interval").unwrap_or(desired::DEFAULT_SOAK_INTERVAL_SECS);
    if duration == 0 || interval == 0 || interval > duration {
        return Err(problem(
            "soak",
            "duration",
            format!("a soak of {duration} s checked every {interval} s"),
            "soak { duration = \"10m\", interval = \"15s\" }: the probe must keep passing for the duration, checked every interval (shorter than the duration)",
        ));
    }
    Ok(Some(clean(soak)))
}

/// The desired configuration of a probe and the node it runs through.
pub fn desired(
    attrs: &Map<String, Value>,
    parts: &BTreeMap<&str, &Map<String, Value>>,
) -> Result<(Desired, Option<String>), Problem> {
    let forms: Vec<&str> = ["http", "exec", "tcp", "bench"]
        .into_iter()
        .filter(|k| parts.contains_key(k))
        .collect();
    if forms.len() != 1 {
        return Err(problem(
            "",
            "",
            if forms.is_empty() {
                "no check: add one http { … }, exec { … }, tcp { … } or bench { … } block".into()
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
            if let Err(msg) = schema::parse_url(url) {
                return Err(problem("http", "url", msg, "write http://HOST:PORT/PATH with a port from 1 to 65535, spaces and control characters percent-encoded"));
            }
            if let Some(Value::Object(headers)) = body.get("headers") {
                for (k, v) in headers {
                    let bad = |s: &str| s.chars().any(|c| c.is_control());
                    if bad(k) || v.as_str().is_some_and(bad) || k.contains([':', ' ']) {
                        return Err(problem("http", "headers", format!("header {k:?} has a control character (or a colon or space in its name)"), "a header is one line: its name a token, its value without line breaks"));
                    }
                }
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
        "bench" => bench_node(&body)?,
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
    check_expect(&expect)?;
    let mut out = serde_json::Map::new();
    out.insert("form".into(), form.into());
    out.insert(form.to_string(), clean(&body));
    out.insert("expect".into(), clean(&expect));
    if let Some(soak) = soak_config(parts)? {
        out.insert("soak".into(), soak);
    }
    if let Some(rules) = regression_config(parts, form)? {
        out.insert("regression".into(), rules);
    }
    for k in ["timeout", "interval"] {
        if let Some(v) = attrs.get(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), to_json(v));
        }
    }
    // The schema's types make a failure unreachable; serde's message could quote a sensitive
    // value, so it is not shown.
    let desired = Desired::from_config(&serde_json::Value::Object(out)).map_err(|_| {
        problem(
            "",
            "",
            "its attributes do not fit a probe's configuration".into(),
            "this is a bug in sparkform: please report it with the block",
        )
    })?;
    Ok((desired, node))
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

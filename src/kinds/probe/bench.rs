//! A probe's `bench` block: the engine's own benchmark client (`vllm bench serve`,
//! `sglang.bench_serving`) run against the endpoint, its figures parsed, recorded with the
//! generation and judged against the last good ones (`regression`). Pure: the command line,
//! the parse and the judgement; `machine/bench_client.rs` runs it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the `bench` block asks, typed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bench {
    /// `vllm` or `sglang`: whose client runs.
    #[serde(default = "default_client")]
    pub client: String,
    /// The node the client runs on (the head node).
    pub node: String,
    /// The image it runs from: the deployment's, which has the engine's client.
    pub image: String,
    /// The endpoint's base URL as that node reaches it (`http://HOST:PORT`).
    pub url: String,
    /// The served model's name, as requests name it.
    pub model: String,
    /// A folder on the node with the model's tokenizer, mounted read-only at the same path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// The endpoint's API key (sensitive): it reaches the client as `OPENAI_API_KEY` from a
    /// file, never in its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    pub requests: u64,
    pub concurrency: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Fixed prompts instead of random ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<Vec<String>>,
    /// The engine's limits, checked at plan when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

pub const CLIENTS: &[&str] = &["vllm", "sglang"];

fn default_client() -> String {
    "vllm".into()
}

/// Where the files the client gets are put in its container.
pub const KEY_FILE: &str = "/sparkform/api_key";
/// vLLM's custom dataset: JSON lines of `{"prompt": …}`.
pub const PROMPTS_FILE: &str = "/sparkform/prompts.jsonl";
/// SGLang's client has no custom dataset: fixed prompts go as a ShareGPT file (a JSON list of
/// conversations whose first turn is the prompt), their output length set on its command line.
pub const SHAREGPT_FILE: &str = "/sparkform/prompts.json";

/// How the container starts the client: the key read from its file into the environment
/// (the file then removed), the client's arguments passed as `"$@"`, never pasted into a shell
/// line.
pub const RUNNER: &str = "if [ -f /sparkform/api_key ]; then OPENAI_API_KEY=$(cat /sparkform/api_key); export OPENAI_API_KEY; rm -f /sparkform/api_key; fi; exec \"$@\"";

/// The workload: what must be equal for two runs' figures to be compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    pub client: String,
    pub requests: u64,
    pub concurrency: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `random`, or `fixed:N` for N fixed prompts.
    pub dataset: String,
}

impl Bench {
    pub fn workload(&self) -> Workload {
        Workload {
            client: self.client.clone(),
            requests: self.requests,
            concurrency: self.concurrency,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            dataset: match &self.prompts {
                Some(p) => format!("fixed:{}", p.len()),
                None => "random".into(),
            },
        }
    }

    /// The client's command line (the key is not in it).
    pub fn command(&self) -> Vec<String> {
        let n = |v: u64| v.to_string();
        let mut c: Vec<String> = match self.client.as_str() {
            "sglang" => vec![
                "python3".into(),
                "-m".into(),
                "sglang.bench_serving".into(),
                "--backend".into(),
                "sglang-oai".into(),
            ],
            _ => vec![
                "vllm".into(),
                "bench".into(),
                "serve".into(),
                "--backend".into(),
                "openai".into(),
                "--endpoint".into(),
                "/v1/completions".into(),
                "--percentile-metrics".into(),
                "ttft,tpot,itl".into(),
                "--metric-percentiles".into(),
                "50,99".into(),
                "--ignore-eos".into(),
            ],
        };
        c.extend([
            "--base-url".into(),
            self.url.clone(),
            "--model".into(),
            self.model.clone(),
            "--num-prompts".into(),
            n(self.requests),
            "--max-concurrency".into(),
            n(self.concurrency),
            "--disable-tqdm".into(),
        ]);
        if let Some(t) = &self.tokenizer {
            c.extend(["--tokenizer".into(), t.clone()]);
        }
        match (&self.prompts, self.client.as_str()) {
            (Some(_), "sglang") => c.extend([
                "--dataset-name".into(),
                "sharegpt".into(),
                "--dataset-path".into(),
                SHAREGPT_FILE.into(),
                "--sharegpt-output-len".into(),
                n(self.output_tokens),
            ]),
            (Some(_), _) => c.extend([
                "--dataset-name".into(),
                "custom".into(),
                "--dataset-path".into(),
                PROMPTS_FILE.into(),
                "--custom-output-len".into(),
                n(self.output_tokens),
                "--skip-chat-template".into(),
            ]),
            (None, client) => {
                // SGLang's `random` samples ShareGPT's text, downloaded from the internet when
                // no file is given; `random-ids` needs only the tokenizer. Its lengths are
                // drawn from 1 to N unless the range ratio is 1.
                let sglang = client == "sglang";
                c.extend([
                    "--dataset-name".into(),
                    if sglang { "random-ids" } else { "random" }.into(),
                    "--random-input-len".into(),
                    n(self.input_tokens),
                    "--random-output-len".into(),
                    n(self.output_tokens),
                ]);
                if sglang {
                    c.extend(["--random-range-ratio".into(), "1".into()]);
                }
            }
        }
        c
    }

    /// The fixed prompts as the file the client reads them from: its path in the container
    /// and its content (vLLM's custom JSON lines, SGLang's ShareGPT list).
    pub fn prompts_file(&self) -> Option<(&'static str, String)> {
        let prompts = self.prompts.as_ref()?;
        Some(match self.client.as_str() {
            "sglang" => {
                // The second turn only has to exist (and be two tokens or more): the output
                // length is set on the command line.
                let conversations: Vec<serde_json::Value> = prompts
                    .iter()
                    .map(|p| {
                        serde_json::json!({ "conversations": [
                            { "from": "human", "value": p },
                            { "from": "gpt", "value": "a placeholder answer" },
                        ] })
                    })
                    .collect();
                (
                    SHAREGPT_FILE,
                    serde_json::Value::from(conversations).to_string(),
                )
            }
            _ => (
                PROMPTS_FILE,
                prompts
                    .iter()
                    .map(|p| format!("{}\n", serde_json::json!({ "prompt": p })))
                    .collect(),
            ),
        })
    }

    /// Why the workload cannot run on the engine its limits describe, if it cannot.
    pub fn beyond_limits(&self) -> Option<(&'static str, String, String)> {
        if let Some(max) = self.max_num_seqs {
            if self.concurrency > max {
                return Some((
                    "concurrency",
                    format!(
                        "a concurrency of {} is more than the engine's max_num_seqs ({max}): the extra requests would queue, and the benchmark would measure the queue",
                        self.concurrency
                    ),
                    format!("ask for at most {max} at once, or raise the engine's --max-num-seqs"),
                ));
            }
        }
        if let Some(max) = self.max_model_len {
            let total = self.input_tokens + self.output_tokens;
            if total > max {
                return Some((
                    "output_tokens",
                    format!(
                        "{} input and {} output tokens make {total}, beyond the engine's max_model_len ({max}): every request would be refused",
                        self.input_tokens, self.output_tokens
                    ),
                    format!("keep input_tokens + output_tokens at or under {max}"),
                ));
            }
        }
        None
    }
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub requests_ok: u64,
    pub throughput_tok_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
}

impl Figures {
    /// By name, as `status --json` and a regression rule name them.
    pub fn named(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([
            ("throughput".into(), self.throughput_tok_s),
            ("ttft_p50".into(), self.ttft_p50_ms),
            ("ttft_p99".into(), self.ttft_p99_ms),
            ("itl_p50".into(), self.itl_p50_ms),
            ("itl_p99".into(), self.itl_p99_ms),
        ])
    }

    pub fn summary(&self) -> String {
        format!(
            "{:.1} output tok/s; TTFT p50 {:.0} ms, p99 {:.0} ms; ITL p50 {:.1} ms, p99 {:.1} ms ({} requests)",
            self.throughput_tok_s,
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            self.itl_p50_ms,
            self.itl_p99_ms,
            self.requests_ok
        )
    }
}

/// A run's figures and the workload they measured, as the state records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub workload: Workload,
    pub figures: Figures,
}

/// The figures in the client's report (`vllm bench serve`'s and `sglang.bench_serving`'s
/// "Serving Benchmark Result" table) of a run of `requested` requests: `Err` says what is
/// missing, or that requests failed (SGLang's table has no line for them: fewer successful
/// requests than asked says it).
pub fn parse(output: &str, requested: u64) -> Result<Figures, String> {
    let mut values: BTreeMap<&str, f64> = BTreeMap::new();
    for line in output.lines() {
        let Some((label, value)) = line.rsplit_once(':') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        values.insert(label.trim(), v);
    }
    let get = |label: &str| {
        values
            .get(label)
            .copied()
            .ok_or_else(|| format!("its report has no {label:?} line"))
    };
    let ok = get("Successful requests")?;
    let failed = values
        .get("Failed requests")
        .copied()
        .unwrap_or(0.0)
        .max(requested as f64 - ok);
    if failed > 0.0 || ok < 1.0 {
        return Err(format!(
            "{failed:.0} of its requests failed and {ok:.0} succeeded"
        ));
    }
    // The median is printed by both clients; vLLM prints P50 too when asked.
    let p50 = |what: &str| {
        get(&format!("Median {what} (ms)")).or_else(|_| get(&format!("P50 {what} (ms)")))
    };
    Ok(Figures {
        requests_ok: ok as u64,
        throughput_tok_s: get("Output token throughput (tok/s)")?,
        ttft_p50_ms: p50("TTFT")?,
        ttft_p99_ms: get("P99 TTFT (ms)")?,
        itl_p50_ms: p50("ITL")?,
        itl_p99_ms: get("P99 ITL (ms)")?,
    })
}

/// The `regression` block: how far each figure may move from the last good generation's
/// before the apply fails (`"-10%"`: at most 10 % lower; `"+25%"`: at most 25 % higher).
pub type Regression = BTreeMap<String, String>;

/// The figures a rule may name, and whether a higher value is better.
pub const RULES: &[(&str, bool)] = &[
    ("throughput", true),
    ("ttft_p50", false),
    ("ttft_p99", false),
    ("itl_p50", false),
    ("itl_p99", false),
];

/// A rule's allowance, `"-10%"` → -10.0; `Err` says why it is not one, for the plan.
pub fn allowance(name: &str, text: &str) -> Result<f64, String> {
    let Some(&(_, higher_is_better)) = RULES.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = RULES.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "{name:?} is no figure of the benchmark (they are {})",
            names.join(", ")
        ));
    };
    let pct = text
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<f64>().ok())
        .filter(|p| p.is_finite())
        .ok_or_else(|| format!("{name} = {text:?} is not a percentage like \"-10%\""))?;
    if higher_is_better && pct > 0.0 || !higher_is_better && pct < 0.0 {
        return Err(format!(
            "{name} = {text:?} would fail an unchanged run: {name} may only {} ({})",
            if higher_is_better { "fall" } else { "rise" },
            if higher_is_better {
                "\"-10%\""
            } else {
                "\"+25%\""
            }
        ));
    }
    Ok(pct)
}

/// Each figure that moved beyond its rule from `before` to `now`, in words.
pub fn regressions(rules: &Regression, before: &Figures, now: &Figures) -> Vec<String> {
    let (b, n) = (before.named(), now.named());
    let mut out = Vec::new();
    for (name, text) in rules {
        let Ok(pct) = allowance(name, text) else {
            continue;
        };
        let (Some(&was), Some(&is)) = (b.get(name), n.get(name)) else {
            continue;
        };
        if was <= 0.0 {
            continue;
        }
        let change = (is - was) / was * 100.0;
        let higher_is_better = RULES.iter().any(|(r, h)| r == name && *h);
        let beyond = if higher_is_better {
            change < pct
        } else {
            change > pct
        };
        if beyond {
            out.push(format!(
                "{name} {is:.1} against {was:.1} in the last good generation ({change:+.1}%, allowed {text})"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench() -> Bench {
        Bench {
            client: "vllm".into(),
            node: "node1".into(),
            image: "img".into(),
            url: "http://10.0.0.1:30000".into(),
            model: "tiny".into(),
            tokenizer: Some("/models/tiny".into()),
            api_key: Some("sk-secret".into()),
            requests: 8,
            concurrency: 2,
            input_tokens: 32,
            output_tokens: 16,
            prompts: None,
            max_num_seqs: Some(4),
            max_model_len: Some(64),
        }
    }

    #[test]
    fn the_command_names_the_workload_and_never_the_key() {
        let c = bench().command().join(" ");
        for part in [
            "vllm bench serve",
            "--base-url http://10.0.0.1:30000",
            "--num-prompts 8",
            "--max-concurrency 2",
            "--random-input-len 32",
            "--random-output-len 16",
            "--tokenizer /models/tiny",
        ] {
            assert!(c.contains(part), "{part} not in {c}");
        }
        assert!(!c.contains("sk-secret"), "{c}");
        let mut fixed = bench();
        fixed.prompts = Some(vec!["say \"hi\"".into()]);
        let c = fixed.command().join(" ");
        assert!(c.contains("--dataset-name custom --dataset-path /sparkform/prompts.jsonl"));
        assert_eq!(
            fixed.prompts_file(),
            Some((
                PROMPTS_FILE,
                "{\"prompt\":\"say \\\"hi\\\"\"}\n".to_string()
            ))
        );
    }

    /// SGLang's client as its source has it: no custom dataset (fixed prompts go as a
    /// ShareGPT file), and a `random` dataset that downloads ShareGPT (`random-ids` does not).
    #[test]
    fn sglangs_command_downloads_nothing_and_takes_fixed_prompts_as_sharegpt() {
        let mut sglang = bench();
        sglang.client = "sglang".into();
        let c = sglang.command().join(" ");
        assert!(
            c.starts_with("python3 -m sglang.bench_serving --backend sglang-oai"),
            "{c}"
        );
        assert!(
            c.contains("--dataset-name random-ids --random-input-len 32 --random-output-len 16 --random-range-ratio 1"),
            "{c}"
        );
        assert!(
            !c.contains("sk-secret") && !c.contains("--ignore-eos"),
            "{c}"
        );
        sglang.prompts = Some(vec!["say \"hi\"".into()]);
        let c = sglang.command().join(" ");
        assert!(
            c.contains("--dataset-name sharegpt --dataset-path /sparkform/prompts.json --sharegpt-output-len 16"),
            "{c}"
        );
        let (path, content) = sglang.prompts_file().unwrap();
        assert_eq!(path, SHAREGPT_FILE);
        let file: serde_json::Value = serde_json::from_str(&content).unwrap();
        assert_eq!(file[0]["conversations"][0]["value"], "say \"hi\"");
        assert!(file[0]["conversations"][1]["value"].is_string());
    }

    /// SGLang's table (its labels as `sglang.bench_serving` prints them): no failed-requests
    /// line, a max ITL line; a run with fewer successful requests than asked failed some.
    const SGLANG_REPORT: &str = "
============ Serving Benchmark Result ============
Backend:                                 sglang-oai
Traffic request rate:                    inf
Max request concurrency:                 2
Successful requests:                     8
Benchmark duration (s):                  3.30
Total input tokens:                      256
Total generated tokens:                  128
Total generated tokens (retokenized):    128
Request throughput (req/s):              2.42
Input token throughput (tok/s):          77.58
Output token throughput (tok/s):         38.79
Total token throughput (tok/s):          116.36
Concurrency:                             1.98
----------------End-to-End Latency----------------
Mean E2E Latency (ms):                   810.10
Median E2E Latency (ms):                 800.00
---------------Time to First Token----------------
Mean TTFT (ms):                          130.00
Median TTFT (ms):                        120.50
P99 TTFT (ms):                           250.25
---------------Inter-Token Latency----------------
Mean ITL (ms):                           44.00
Median ITL (ms):                         42.75
P95 ITL (ms):                            70.00
P99 ITL (ms):                            81.50
Max ITL (ms):                            95.00
==================================================
";

    #[test]
    fn sglangs_report_gives_the_same_figures_and_a_short_count_fails() {
        let f = parse(SGLANG_REPORT, 8).unwrap();
        assert_eq!(f.requests_ok, 8);
        assert_eq!(f.throughput_tok_s, 38.79);
        assert_eq!((f.ttft_p50_ms, f.ttft_p99_ms), (120.5, 250.25));
        assert_eq!((f.itl_p50_ms, f.itl_p99_ms), (42.75, 81.5));
        assert!(parse(SGLANG_REPORT, 10)
            .unwrap_err()
            .contains("2 of its requests failed and 8 succeeded"));
    }

    #[test]
    fn a_workload_beyond_the_engines_limits_is_named_with_the_limit() {
        assert_eq!(bench().beyond_limits(), None);
        let mut b = bench();
        b.concurrency = 5;
        let (attr, msg, _) = b.beyond_limits().unwrap();
        assert_eq!(attr, "concurrency");
        assert!(msg.contains("max_num_seqs (4)"), "{msg}");
        let mut b = bench();
        b.output_tokens = 40;
        let (attr, msg, _) = b.beyond_limits().unwrap();
        assert_eq!(attr, "output_tokens");
        assert!(msg.contains("max_model_len (64)"), "{msg}");
    }

    const REPORT: &str = "============ Serving Benchmark Result ============
Successful requests:                     8
Failed requests:                         0
Maximum request concurrency:             2
Benchmark duration (s):                  3.21
Total input tokens:                      256
Total generated tokens:                  128
Request throughput (req/s):              2.49
Output token throughput (tok/s):         39.88
Total Token throughput (tok/s):          119.63
---------------Time to First Token----------------
Mean TTFT (ms):                          120.50
Median TTFT (ms):                        110.25
P50 TTFT (ms):                           110.25
P99 TTFT (ms):                           240.75
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          45.10
Median TPOT (ms):                        44.00
P99 TPOT (ms):                           60.00
---------------Inter-token Latency----------------
Mean ITL (ms):                           45.20
Median ITL (ms):                         43.50
P99 ITL (ms):                            80.25
==================================================
";

    #[test]
    fn the_report_gives_throughput_and_the_latencies() {
        let f = parse(REPORT, 8).unwrap();
        assert_eq!(f.requests_ok, 8);
        assert_eq!(f.throughput_tok_s, 39.88);
        assert_eq!((f.ttft_p50_ms, f.ttft_p99_ms), (110.25, 240.75));
        assert_eq!((f.itl_p50_ms, f.itl_p99_ms), (43.5, 80.25));
        let failed = REPORT.replace(
            "Failed requests:                         0",
            "Failed requests: 3",
        );
        assert!(parse(&failed, 8)
            .unwrap_err()
            .contains("3 of its requests failed"));
        let cut = REPORT.replace("P99 ITL (ms):", "");
        assert!(parse(&cut, 8).unwrap_err().contains("P99 ITL"));
    }

    #[test]
    fn a_rule_fails_a_figure_beyond_it_and_only_then() {
        let before = parse(REPORT, 8).unwrap();
        let rules = Regression::from([
            ("throughput".into(), "-10%".into()),
            ("ttft_p99".into(), "+25%".into()),
        ]);
        let mut now = before.clone();
        now.throughput_tok_s = 36.0; // -9.7 %
        now.ttft_p99_ms = 300.0; // +24.6 %
        assert!(regressions(&rules, &before, &now).is_empty());
        now.throughput_tok_s = 30.0;
        now.ttft_p99_ms = 400.0;
        let found = regressions(&rules, &before, &now);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("throughput 30.0 against 39.9"),
            "{found:?}"
        );
        assert!(found[1].contains("allowed +25%"), "{found:?}");
        assert!(allowance("throughput", "+10%").is_err());
        assert!(allowance("ttft_p99", "25").is_err());
        assert!(allowance("latency", "+25%").is_err());
    }
}

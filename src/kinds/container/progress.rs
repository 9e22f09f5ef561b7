//! The phases a starting container goes through, read from its log with the `progress`
//! patterns of a ready block (`{ "REGEX" = "label" }`; a capture group, when the pattern has
//! one, is a percentage).

use regex::Regex;

#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub label: String,
    pub percent: Option<f64>,
    /// The log line that showed it.
    pub line: String,
}

/// Why a `progress` pattern cannot be used, for a located error at validate time.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    let re = Regex::new(pattern)
        .map_err(|e| format!("progress pattern {pattern:?} is not a regular expression: {e}"))?;
    if re.captures_len() > 2 {
        return Err(format!(
            "progress pattern {pattern:?} has {} capture groups; it may have one, the percentage (write other groups as (?:…))",
            re.captures_len() - 1
        ));
    }
    Ok(())
}

/// Follows a log as it arrives and says when the phase changes.
pub struct PhaseWatch {
    patterns: Vec<(Regex, String)>,
    partial: String,
    current: Option<Phase>,
    last_line: Option<String>,
}

impl PhaseWatch {
    /// From a ready block's `progress` map; patterns that do not compile were rejected at
    /// validate time, so they are skipped here.
    pub fn new(progress: &std::collections::BTreeMap<String, String>) -> PhaseWatch {
        let patterns = progress
            .iter()
            .filter_map(|(p, label)| Some((Regex::new(p).ok()?, label.clone())))
            .collect();
        PhaseWatch {
            patterns,
            partial: String::new(),
            current: None,
            last_line: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn current(&self) -> Option<&Phase> {
        self.current.as_ref()
    }

    /// The latest non-empty log line seen.
    pub fn last_line(&self) -> Option<&str> {
        self.last_line.as_deref()
    }

    /// Take a chunk of log (any cut, lines may span chunks); the phases it changed to, in order.
    pub fn feed(&mut self, chunk: &str) -> Vec<Phase> {
        self.partial.push_str(chunk);
        let mut changes = Vec::new();
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            // A progress bar drawn for a terminal redraws itself after each \r: the last
            // drawing is the state.
            let line = line
                .trim_end_matches(['\n', '\r'])
                .rsplit('\r')
                .find(|s| !s.trim().is_empty())
                .unwrap_or("")
                .trim_end();
            if line.is_empty() {
                continue;
            }
            self.last_line = Some(line.to_string());
            if let Some(p) = self.matching(line) {
                let changed = self
                    .current
                    .as_ref()
                    .is_none_or(|c| c.label != p.label || c.percent != p.percent);
                if changed {
                    changes.push(p.clone());
                    self.current = Some(p);
                }
            }
        }
        changes
    }

    fn matching(&self, line: &str) -> Option<Phase> {
        self.patterns.iter().find_map(|(re, label)| {
            let caps = re.captures(line)?;
            let percent = caps
                .get(1)
                .and_then(|m| m.as_str().trim().parse::<f64>().ok());
            Some(Phase {
                label: label.clone(),
                percent,
                line: line.to_string(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patterns of `modules/vllm-serve`, so that the module's lines are the ones tested.
    fn vllm_patterns() -> std::collections::BTreeMap<String, String> {
        let text = include_str!("../../../modules/vllm-serve/outputs.hcl");
        let body: hcl::Body = hcl::from_str(text).expect("the module parses");
        let out = body
            .blocks()
            .find(|b| b.identifier() == "output" && b.labels()[0].as_str() == "progress")
            .expect("output progress");
        let value = out
            .body()
            .attributes()
            .find(|a| a.key() == "value")
            .expect("value");
        let v: hcl::Value = hcl::eval::Evaluate::evaluate(value.expr(), &hcl::eval::Context::new())
            .expect("a literal map");
        serde_json::from_value(serde_json::to_value(v).expect("json")).expect("a map of strings")
    }

    // Lines as vLLM prints them: tqdm bars with vLLM's plain bar format (one line per update,
    // through Ray's or the engine core's prefix), then its logger's lines.
    const VLLM_START: &[&str] = &[
        "INFO 12-01 10:00:01 [api_server.py:1880] vLLM API server version 0.21.0",
        "(EngineCore_DP0 pid=212) INFO 12-01 10:00:09 [gpu_model_runner.py:2338] Starting to load model Qwen/Qwen3.5-35B-A3B-FP8...",
        "(EngineCore_DP0 pid=212) Loading safetensors checkpoint shards:   0% Completed | 0/14 [00:00<?, ?it/s]",
        "(EngineCore_DP0 pid=212) Loading safetensors checkpoint shards:   7% Completed | 1/14 [00:41<08:53, 41.02s/it]",
        "(EngineCore_DP0 pid=212) Loading safetensors checkpoint shards: 100% Completed | 14/14 [09:31<00:00, 40.80s/it]",
        "(EngineCore_DP0 pid=212) INFO 12-01 10:09:41 [default_loader.py:267] Loading weights took 571.43 seconds",
        "(EngineCore_DP0 pid=212) INFO 12-01 10:09:42 [gpu_model_runner.py:2392] Model loading took 17.56 GiB memory and 572.118 seconds",
        "(EngineCore_DP0 pid=212) INFO 12-01 10:10:30 [gpu_worker.py:298] Available KV cache memory: 60.12 GiB",
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 [00:05<00:06,  5.81it/s]",
        "(EngineCore_DP0 pid=212) INFO 12-01 10:11:02 [gpu_model_runner.py:3480] Graph capturing finished in 31 secs, took 0.91 GiB",
        "INFO 12-01 10:11:04 [api_server.py:617] Starting vLLM server on http://0.0.0.0:8000",
        "INFO:     Application startup complete.",
    ];

    #[test]
    fn the_phases_of_a_vllm_start_in_order() {
        let p = vllm_patterns();
        let mut w = PhaseWatch::new(&p);
        assert!(!w.is_empty());
        let mut seen = Vec::new();
        for l in VLLM_START {
            for ph in w.feed(&format!("{l}\n")) {
                seen.push(crate::events::phase_text(&ph.label, ph.percent));
            }
        }
        assert_eq!(
            seen,
            [
                "loading the model",
                "loading weights 0%",
                "loading weights 7%",
                "loading weights 100%",
                "weights loaded",
                "memory profiled",
                "capturing CUDA graphs 45%",
                "CUDA graphs captured",
                "starting the API server",
                "API server up",
            ]
        );
    }

    #[test]
    fn lines_split_across_chunks_and_redrawn_bars() {
        let p = std::collections::BTreeMap::from([(
            "Loading safetensors checkpoint shards: +(\\d+)%".to_string(),
            "loading weights".to_string(),
        )]);
        let mut w = PhaseWatch::new(&p);
        assert!(w.feed("Loading safetensors checkpoint sh").is_empty());
        let ch = w.feed("ards:  12% Completed\nunrelated\n");
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].percent, Some(12.0));
        assert_eq!(w.last_line(), Some("unrelated"));
        // The same phase and percentage again is no change; a terminal-style redraw is read
        // from its last drawing.
        assert!(w
            .feed("Loading safetensors checkpoint shards:  12% Completed\n")
            .is_empty());
        let ch = w.feed("Loading safetensors checkpoint shards:  20%\rLoading safetensors checkpoint shards:  30%\r\n");
        assert_eq!(ch[0].percent, Some(30.0));
        assert_eq!(
            w.current().map(|c| c.label.as_str()),
            Some("loading weights")
        );
    }

    #[test]
    fn patterns_are_checked() {
        assert!(check_pattern("Loading (\\d+)%").is_ok());
        assert!(check_pattern("(unclosed")
            .unwrap_err()
            .contains("not a regular expression"));
        assert!(check_pattern("(a)(b)")
            .unwrap_err()
            .contains("2 capture groups"));
        assert!(check_pattern("(?:a)(\\d+)").is_ok());
    }
}

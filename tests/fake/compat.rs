//! The modules against the real vLLM and Ray releases, as `bench/compat` recorded them in
//! tests/fixtures/compat (issue 25): the fast half, no download. Every `vllm serve` flag of the
//! examples' containers is an option of every recorded vLLM release, every `ray start` and
//! `ray status` flag of the recorded Ray; every fail_on_log, warn_on_log, progress and watch_on_log pattern
//! matches the line recorded for it in each release (a line of that release's source) or is
//! recorded as another program's line; every VLLM_* variable the modules set is read by each
//! release. A module edit that fails here needs `bench/compat` run again (and, if the release
//! lacks the flag or line, a fix).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use sparkform::config::{Config, ResourceKind, VarInputs};

const FIXTURES: &str = "tests/fixtures/compat";
const EXAMPLES: [&str; 4] = [
    "testbed",
    "testbed-mp",
    "qwen35-two-sparks",
    "qwen35-two-sparks-mp",
];

/// What the modules use, each with where: flags by program (`vllm`, `ray start`, `ray status`),
/// log patterns, `VLLM_*` variables.
#[derive(Default)]
struct Used {
    flags: BTreeMap<String, BTreeMap<String, String>>,
    patterns: BTreeMap<String, String>,
    envs: BTreeMap<String, String>,
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn add_flags(used: &mut Used, program: &str, args: &[String], at: &str) {
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let flag = a.split('=').next().unwrap_or(a).to_string();
        used.flags
            .entry(program.to_string())
            .or_default()
            .entry(flag)
            .or_insert_with(|| at.to_string());
    }
}

fn collect(used: &mut Used, c: &Config, origin: &str) {
    for r in c
        .resources
        .iter()
        .filter(|r| r.kind == ResourceKind::Container)
    {
        let at = format!("{origin}: {}", r.address);
        let command = strings(&r.config["command"]);
        match command.first().map(String::as_str) {
            Some("vllm") => add_flags(used, "vllm", &command, &at),
            Some("ray") if command.len() > 1 => {
                add_flags(used, &format!("ray {}", command[1]), &command[2..], &at)
            }
            _ => {}
        }
        if let Some(env) = r.config["env"].as_object() {
            for k in env.keys().filter(|k| k.starts_with("VLLM_")) {
                used.envs.entry(k.clone()).or_insert_with(|| at.clone());
            }
        }
        for p in r.config["watch_on_log"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.keys())
        {
            used.patterns
                .entry(p.clone())
                .or_insert_with(|| format!("{at} (watch_on_log)"));
        }
        for ready in r.config["ready"].as_array().into_iter().flatten() {
            for kind in ["fail_on_log", "warn_on_log", "progress"] {
                for p in ready[kind].as_object().into_iter().flat_map(|m| m.keys()) {
                    used.patterns
                        .entry(p.clone())
                        .or_insert_with(|| format!("{at} ({kind})"));
                }
            }
            let exec = strings(&ready["exec"]);
            if exec.len() > 1 && exec[0] == "ray" {
                add_flags(used, &format!("ray {}", exec[1]), &exec[2..], &at);
            }
        }
    }
}

/// The examples, and the launchers' fixture with NCCL's socket fallback a warning.
fn used() -> Used {
    let mut used = Used::default();
    for e in EXAMPLES {
        let (c, _) = common::load_resolved(&Path::new("examples").join(e));
        collect(&mut used, &c, &format!("examples/{e}"));
    }
    for fallback in ["fail", "warn"] {
        let inputs = VarInputs {
            cli: vec![("nccl_socket_fallback".into(), fallback.into())],
            ..VarInputs::default()
        };
        let dir = "tests/fixtures/launchers/both";
        let (c, _) = common::load_with(Path::new(dir), &inputs);
        collect(&mut used, &c, dir);
    }
    used
}

/// The recorded releases: (file stem, document), vLLM's then Ray's.
fn fixtures(prefix: &str) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for entry in
        std::fs::read_dir(FIXTURES).expect("tests/fixtures/compat (bench/compat writes it)")
    {
        let path = entry.expect("a fixture").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if stem.starts_with(prefix) && path.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&path).expect("readable");
            let doc =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((stem, doc));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !out.is_empty(),
        "no {prefix}*.json in {FIXTURES}: run bench/compat"
    );
    out
}

fn set(v: &serde_json::Value) -> BTreeSet<String> {
    strings(v).into_iter().collect()
}

#[test]
fn every_vllm_flag_is_an_option_of_every_recorded_release() {
    let used = used();
    let flags = &used.flags["vllm"];
    assert!(flags.contains_key("--tensor-parallel-size"), "{flags:?}");
    let mut missing = Vec::new();
    for (name, doc) in fixtures("vllm-") {
        let options = set(&doc["options"]);
        assert!(
            options.len() > 50,
            "{name}: no parser options recorded (its parser could not be imported?)"
        );
        for (flag, at) in flags {
            if !options.contains(flag) {
                missing.push(format!("{flag} ({at}) is no option of {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "run bench/compat:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_ray_flag_is_an_option_of_the_recorded_ray() {
    let used = used();
    let mut missing = Vec::new();
    let mut seen = 0;
    for (name, doc) in fixtures("ray-") {
        for (program, flags) in used.flags.iter().filter(|(p, _)| p.starts_with("ray ")) {
            let sub = program.trim_start_matches("ray ");
            let options = set(&doc["options"][sub]);
            for (flag, at) in flags {
                seen += 1;
                if !options.contains(flag) {
                    missing.push(format!("`{program} {flag}` ({at}) is no option of {name}"));
                }
            }
        }
    }
    assert!(seen > 0, "no ray flags found in the examples");
    assert!(
        missing.is_empty(),
        "run bench/compat:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_log_pattern_matches_a_line_of_every_recorded_release() {
    let used = used();
    assert!(used.patterns.len() > 10, "{:?}", used.patterns);
    let mut bad = Vec::new();
    for (name, doc) in fixtures("vllm-") {
        for (pattern, at) in &used.patterns {
            let re = regex::Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
            if let Some(owner) = doc["not_checked"][pattern].as_str() {
                assert!(!owner.is_empty() && owner != "vllm", "{name}: {pattern}");
                continue;
            }
            match doc["patterns"][pattern]["text"].as_str() {
                Some(line) if re.is_match(line) => {}
                Some(line) => bad.push(format!(
                    "`{pattern}` ({at}) does not match its recorded line of {name}: {line}"
                )),
                None => bad.push(format!(
                    "`{pattern}` ({at}): no line of {name} (nor another program's) recorded for it"
                )),
            }
        }
    }
    assert!(bad.is_empty(), "run bench/compat:\n{}", bad.join("\n"));
}

#[test]
fn every_vllm_variable_the_modules_set_is_read_by_every_recorded_release() {
    let used = used();
    assert!(used.envs.contains_key("VLLM_HOST_IP"), "{:?}", used.envs);
    let mut bad = Vec::new();
    for (name, doc) in fixtures("vllm-") {
        let read = set(&doc["envs_read"]);
        for (var, at) in &used.envs {
            if !read.contains(var) {
                bad.push(format!("{var} ({at}) is not read by {name}"));
            }
        }
    }
    assert!(bad.is_empty(), "run bench/compat:\n{}", bad.join("\n"));
}

/// The stand-in vLLM names the release whose lines it prints, and that release is recorded
/// (bench/compat checks the stand-in's lines against its source).
#[test]
fn the_standin_prints_a_recorded_release() {
    let text = std::fs::read_to_string("tests/testbed/vllm-standin.py").expect("the stand-in");
    let release = text
        .lines()
        .find_map(|l| l.strip_prefix("STANDIN_RELEASE = \""))
        .and_then(|r| r.strip_suffix('"'))
        .expect("STANDIN_RELEASE = \"X.Y.Z\" in the stand-in");
    let names: Vec<String> = fixtures("vllm-").into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&format!("vllm-{release}")),
        "{release} not in {names:?}"
    );
}

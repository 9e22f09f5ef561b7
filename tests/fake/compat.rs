//! The modules against the real vLLM, SGLang and Ray releases, as `bench/compat` recorded them in
//! tests/fixtures/compat (issue 25): the fast half, no download. Every `vllm serve` flag of the
//! examples' containers is an option of every recorded vLLM release, every flag of
//! `python3 -m sglang.launch_server` (with the `--config` and settings rank 0's API-key wrapper
//! adds) an option of every recorded SGLang release, every `ray start` and `ray status` flag of
//! the recorded Ray; every fail_on_log, warn_on_log, progress and watch_on_log pattern of the
//! vLLM and Ray containers matches the line recorded for it in each vLLM release, every pattern
//! of the SGLang containers the line recorded in each SGLang release (a line of that release's
//! source), or is recorded as another program's line; every VLLM_* variable the modules set is
//! read by each vLLM release, every SGLANG_* one by each SGLang release or by the container's
//! own entrypoint. A module edit that fails here needs `bench/compat` run again (and, if the
//! release lacks the flag or line, a fix).

use crate::common;
use sparkform::vocabulary::KindId;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use sparkform::config::{Config, VarInputs};

const FIXTURES: &str = "tests/fixtures/compat";
const EXAMPLES: [&str; 7] = [
    "testbed",
    "testbed-standin",
    "testbed-mp",
    "qwen35-two-sparks",
    "qwen35-two-sparks-mp",
    "qwen35-two-sparks-sglang",
    "testbed-sglang",
];

/// What an SGLang container runs (modules/sglang-mp): its command starts so.
const SGLANG_LAUNCHER: [&str; 3] = ["python3", "-m", "sglang.launch_server"];

/// What the modules use, each with where: flags by program (`vllm`, `sglang`, `ray start`,
/// `ray status`), log patterns of the vLLM and Ray containers and of the SGLang ones, `VLLM_*`
/// variables of the vLLM and Ray containers, `SGLANG_*` ones of the SGLang containers (with
/// whether the container's entrypoint script reads it itself).
#[derive(Default)]
struct Used {
    flags: BTreeMap<String, BTreeMap<String, String>>,
    patterns: BTreeMap<String, String>,
    sglang_patterns: BTreeMap<String, String>,
    envs: BTreeMap<String, String>,
    sglang_envs: BTreeMap<String, (String, bool)>,
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

/// The keys of the settings file the API-key wrapper writes (`"api-key":`).
fn settings_keys() -> &'static regex::Regex {
    static KEYS: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| regex::Regex::new(r#""([a-z][a-z0-9_-]*)":"#).expect("regex"))
}

fn collect(used: &mut Used, c: &Config, origin: &str) {
    for r in c.resources.iter().filter(|r| r.kind == KindId::Container) {
        let at = format!("{origin}: {}", r.address);
        let command = strings(&r.config["command"]);
        let sglang = command.len() >= SGLANG_LAUNCHER.len()
            && command.iter().zip(SGLANG_LAUNCHER).all(|(a, b)| a == b);
        // Rank 0's API-key wrapper (`sh -c SCRIPT SETTINGS`): the script writes the settings
        // file SGLang reads with `--config`, its keys are options too.
        let script = strings(&r.config["entrypoint"]).join(" ");
        match command.first().map(String::as_str) {
            _ if sglang => {
                add_flags(used, "sglang", &command[SGLANG_LAUNCHER.len()..], &at);
                if script.contains("--config") {
                    add_flags(
                        used,
                        "sglang",
                        &["--config".into()],
                        &format!("{at} (entrypoint)"),
                    );
                }
                for k in settings_keys().captures_iter(&script) {
                    add_flags(
                        used,
                        "sglang",
                        &[format!("--{}", &k[1])],
                        &format!("{at} (entrypoint's settings file)"),
                    );
                }
            }
            Some("vllm") => add_flags(used, "vllm", &command, &at),
            Some("ray") if command.len() > 1 => {
                add_flags(used, &format!("ray {}", command[1]), &command[2..], &at)
            }
            _ => {}
        }
        if let Some(env) = r.config["env"].as_object() {
            // a null value sets nothing (SGLANG_API_KEY without a key)
            for k in env.iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k) {
                if sglang && k.starts_with("SGLANG_") {
                    let by_wrapper = script.contains(k.as_str());
                    let e = used
                        .sglang_envs
                        .entry(k.clone())
                        .or_insert_with(|| (at.clone(), by_wrapper));
                    e.1 &= by_wrapper;
                } else if !sglang && k.starts_with("VLLM_") {
                    used.envs.entry(k.clone()).or_insert_with(|| at.clone());
                }
            }
        }
        // An SGLang container's patterns are SGLang's lines (or FOREIGN's), the others vLLM's.
        fn patterns(used: &mut Used, sglang: bool) -> &mut BTreeMap<String, String> {
            if sglang {
                &mut used.sglang_patterns
            } else {
                &mut used.patterns
            }
        }
        for p in r.config["watch_on_log"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.keys())
        {
            patterns(used, sglang)
                .entry(p.clone())
                .or_insert_with(|| format!("{at} (watch_on_log)"));
        }
        for ready in r.config["ready"].as_array().into_iter().flatten() {
            for kind in ["fail_on_log", "warn_on_log", "progress"] {
                for p in ready[kind].as_object().into_iter().flat_map(|m| m.keys()) {
                    patterns(used, sglang)
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

/// The recorded releases of one program (`vllm-`, `sglang-`, `ray-`): (file stem, document).
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

/// Every flag the examples pass to `program` is an option of every recorded release of it.
fn flags_are_options(program: &str, prefix: &str, sample: &str) {
    let used = used();
    let flags = &used.flags[program];
    assert!(flags.contains_key(sample), "{flags:?}");
    let mut missing = Vec::new();
    for (name, doc) in fixtures(prefix) {
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
fn every_vllm_flag_is_an_option_of_every_recorded_release() {
    flags_are_options("vllm", "vllm-", "--tensor-parallel-size");
}

#[test]
fn every_sglang_flag_is_an_option_of_every_recorded_sglang_release() {
    flags_are_options("sglang", "sglang-", "--dist-init-addr");
    // rank 0's API-key wrapper (testbed-sglang has a key) and what it writes
    let used = used();
    for flag in ["--config", "--api-key"] {
        assert!(
            used.flags["sglang"].contains_key(flag),
            "{flag}: {:?}",
            used.flags["sglang"]
        );
    }
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

/// Every pattern matches the line recorded for it in every recorded release of `engine`
/// (`vllm`, `sglang`), or is recorded as another program's line.
fn patterns_match(patterns: &BTreeMap<String, String>, engine: &str) {
    let mut bad = Vec::new();
    for (name, doc) in fixtures(&format!("{engine}-")) {
        for (pattern, at) in patterns {
            let re = regex::Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
            if let Some(owner) = doc["not_checked"][pattern].as_str() {
                assert!(!owner.is_empty() && owner != engine, "{name}: {pattern}");
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
fn every_log_pattern_matches_a_line_of_every_recorded_release() {
    let used = used();
    assert!(used.patterns.len() > 10, "{:?}", used.patterns);
    patterns_match(&used.patterns, "vllm");
}

#[test]
fn every_sglang_log_pattern_matches_a_line_of_every_recorded_sglang_release() {
    let used = used();
    assert!(
        used.sglang_patterns
            .contains_key("The server is fired up and ready to roll"),
        "{:?}",
        used.sglang_patterns
    );
    patterns_match(&used.sglang_patterns, "sglang");
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

#[test]
fn every_sglang_variable_the_modules_set_is_read_by_every_recorded_sglang_release() {
    let used = used();
    assert!(
        used.sglang_envs.contains_key("SGLANG_API_KEY"),
        "{:?}",
        used.sglang_envs
    );
    let mut bad = Vec::new();
    for (name, doc) in fixtures("sglang-") {
        let read = set(&doc["envs_read"]);
        for (var, (at, by_wrapper)) in &used.sglang_envs {
            // SGLANG_API_KEY: rank 0's wrapper reads it (SGLang takes the key as a setting)
            if !read.contains(var) && !by_wrapper {
                bad.push(format!(
                    "{var} ({at}) is read neither by {name} nor by the container's entrypoint"
                ));
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

/// A stand-in that prints SGLang's lines names the SGLang release (a SGLANG_STANDIN_RELEASE
/// constant in a file under tests/testbed), and that release is recorded (bench/compat checks
/// the stand-in's SGLang lines against its source).
#[test]
fn the_sglang_standin_prints_a_recorded_release() {
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut all = Vec::new();
    files(Path::new("tests/testbed"), &mut all);
    let named: Vec<(String, String)> = all
        .iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            let release = text
                .lines()
                .find_map(|l| l.strip_prefix("SGLANG_STANDIN_RELEASE = \""))?
                .strip_suffix('"')?
                .to_string();
            Some((p.display().to_string(), release))
        })
        .collect();
    assert!(
        named.len() == 1,
        "one file under tests/testbed names the SGLang stand-in's release: {named:?}"
    );
    let names: Vec<String> = fixtures("sglang-").into_iter().map(|(n, _)| n).collect();
    for (file, release) in named {
        assert!(
            names.contains(&format!("sglang-{release}")),
            "{file}: SGLang {release} not in {names:?}"
        );
    }
}

//! The layering of `src/` (ARCHITECTURE.md): read every `crate::…` and `super::…` path of every
//! file, group the files into layers, and fail on a cycle between layers or on a pure layer
//! that reaches (directly or through others) a layer that touches machines. With them, the
//! other shapes ARCHITECTURE.md promises: what the cli may call, where addresses are read,
//! what the product compiles.

use sparkform::kind::Registered;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers that do no I/O besides reading definitions and the state.
const PURE: &[&str] = &[
    "config",
    "config::lowering",
    "config::model",
    "graph",
    "plan",
    "kind",
    "kinds",
    "kinds::lower",
    "schema",
    "state",
    "diag",
];
/// The engine's rooms: they ask the kinds' interface (`kind`) and its registry, which the kinds
/// enter themselves, and never import a kind (the kinds stand above them).
const ENGINE: &[&str] = &[
    "config",
    "config::lowering",
    "config::model",
    "graph",
    "inspect",
    "kind",
    "plan",
    "state",
];
/// Layers a pure layer must never reach.
const MACHINE: &[&str] = &[
    "hosts",
    "inspect",
    "apply",
    "ops",
    "kinds::machine",
    "observe",
    "http",
    "cli",
    "ui",
];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every source file of `dir`, whatever its language (`.rs`, `.py`, `.sh`…).
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            source_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The module path of a file: `src/kinds/probe/machine.rs` → `kinds::probe::machine`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The layer of a module path: its top-level module, with the machine halves of the kinds
/// (`kinds::machine`, `kinds::<kind>::machine`) and their lowering halves (`kinds::lower`,
/// `kinds::<kind>::lower`) apart from the pure halves, and the model of a configuration and
/// the engine's interface for the lowering (`config::model`, `config::lowering`) apart from
/// the engine that uses the lowering.
fn layer_of(path: &[String]) -> Option<String> {
    let top = path.first()?;
    if top == "kinds" {
        for half in ["machine", "lower"] {
            if path.iter().skip(1).take(2).any(|p| p == half) {
                return Some(format!("kinds::{half}"));
            }
        }
    }
    if top == "config" {
        if let Some(sub @ ("model" | "lowering")) = path.get(1).map(String::as_str) {
            return Some(format!("config::{sub}"));
        }
    }
    Some(top.clone())
}

/// Every path a file names, resolved to a module path from the crate root.
fn references(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let path = regex::Regex::new(r"\b(crate|super)((?:::[A-Za-z_$][A-Za-z0-9_]*)+)").unwrap();
    let inline = regex::Regex::new(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*\{").unwrap();
    let mut out = Vec::new();
    // Inline modules (`mod tests {`) open at these brace depths: `super` inside one is the
    // file's own module.
    let mut open_at: Vec<i64> = Vec::new();
    let mut depth: i64 = 0;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        if inline.is_match(code) {
            open_at.push(depth);
        }
        depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
        while open_at.last().is_some_and(|&d| depth <= d) {
            open_at.pop();
        }
        let nested = open_at.len();
        for m in path.captures_iter(code) {
            let segs: Vec<String> = m[2]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            // Inside `nested` inline modules the first `nested` supers stay in the file.
            let mut ups_left_in_file = nested;
            let mut base: Vec<String> = if &m[1] == "crate" {
                Vec::new()
            } else {
                let mut b = module.to_vec();
                if ups_left_in_file > 0 {
                    ups_left_in_file -= 1;
                } else {
                    // `super` in `a/b.rs` and in `a/b/mod.rs` (both module a::b) is `a`.
                    b.pop();
                }
                b
            };
            for s in segs {
                if s == "super" {
                    if ups_left_in_file > 0 {
                        ups_left_in_file -= 1;
                    } else {
                        base.pop();
                    }
                } else {
                    base.push(s);
                }
            }
            out.push(base);
        }
    }
    out
}

fn layer_edges() -> BTreeMap<String, BTreeSet<(String, String)>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    // layer → {(target layer, the file that makes the edge)}
    let mut edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for f in &all {
        let module = module_of(&src, f);
        let Some(from) = layer_of(&module) else {
            continue; // lib.rs, main.rs: the root declares everything.
        };
        let text = std::fs::read_to_string(f).unwrap();
        let entry = edges.entry(from.clone()).or_default();
        for r in references(&text, &module) {
            // A macro's `$module` stands for a folder of the same layer as its neighbours.
            let r: Vec<String> = r
                .into_iter()
                .map(|s| if s.starts_with('$') { "_".into() } else { s })
                .collect();
            // The test kit's nodes, which the unit tests alone compile in (src/lib.rs): no layer.
            if matches!(r.first().map(String::as_str), Some("fake" | "fake_docker")) {
                continue;
            }
            if let Some(to) = layer_of(&r) {
                if to != from {
                    let rel = f.strip_prefix(&src).unwrap().display().to_string();
                    entry.insert((to, rel));
                }
            }
        }
    }
    edges
}

fn reach(
    edges: &BTreeMap<String, BTreeSet<(String, String)>>,
    from: &str,
) -> BTreeMap<String, Vec<String>> {
    // layer → the chain of files that leads there
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut stack = vec![(from.to_string(), Vec::<String>::new())];
    while let Some((l, chain)) = stack.pop() {
        for (to, file) in edges.get(&l).into_iter().flatten() {
            if seen.contains_key(to) || to == from {
                continue;
            }
            let mut c = chain.clone();
            c.push(format!("{file} → {to}"));
            seen.insert(to.clone(), c.clone());
            stack.push((to.clone(), c));
        }
    }
    seen
}

fn cycles(edges: &BTreeMap<String, BTreeSet<(String, String)>>) -> Vec<String> {
    let mut out = Vec::new();
    for layer in edges.keys() {
        for (to, file) in &edges[layer] {
            if let Some(back) = reach(edges, to).get(layer) {
                out.push(format!(
                    "{layer} → {to} ({file}), and back: {}",
                    back.join(", ")
                ));
            }
        }
    }
    out
}

#[test]
fn the_layers_have_no_cycle() {
    let cycles = cycles(&layer_edges());
    assert!(
        cycles.is_empty(),
        "import cycles between layers:\n  {}",
        cycles.join("\n  ")
    );
}

/// Pairs of sibling files (neither the other's parent module) that name each other: a cycle
/// inside a layer, which the layer edges do not see. `a.rs` and `b.rs` both needing a thing is
/// a thing for one of them, or for a third file, to hold.
fn sibling_cycles() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeMap<Vec<String>, String> = all
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().display().to_string();
            (module_of(&src, f), rel)
        })
        .collect();
    // file → the files it names (the longest module path that is a file)
    let mut names: BTreeMap<&[String], BTreeSet<&[String]>> = BTreeMap::new();
    for f in &all {
        let module = module_of(&src, f);
        let Some((from, _)) = modules.get_key_value(&module) else {
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        // A unit test may drive a sibling: only the product's code counts.
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        let entry = names.entry(from.as_slice()).or_default();
        for mut r in references(text, &module) {
            while !r.is_empty() {
                if let Some((to, _)) = modules.get_key_value(&r) {
                    if to != from {
                        entry.insert(to.as_slice());
                    }
                    break;
                }
                r.pop();
            }
        }
    }
    let mut out = Vec::new();
    for (a, targets) in &names {
        for b in targets {
            let related = a.starts_with(b) || b.starts_with(a);
            if a < b && !related && names.get(b).is_some_and(|t| t.contains(a)) {
                out.push(format!(
                    "{} ↔ {}",
                    modules[&a.to_vec()],
                    modules[&b.to_vec()]
                ));
            }
        }
    }
    out
}

#[test]
fn no_two_sibling_files_name_each_other() {
    let cycles = sibling_cycles();
    assert!(
        cycles.is_empty(),
        "files that import each other:\n  {}",
        cycles.join("\n  ")
    );
}

#[test]
fn pure_layers_never_reach_machines() {
    let edges = layer_edges();
    let mut bad = Vec::new();
    for p in PURE {
        for (to, chain) in reach(&edges, p) {
            if MACHINE.contains(&to.as_str()) {
                bad.push(format!("{p} reaches {to}: {}", chain.join(", ")));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "forbidden edges (see ARCHITECTURE.md, Layers):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn only_the_cli_reaches_the_cli() {
    let edges = layer_edges();
    let bad: Vec<String> = edges
        .iter()
        .filter(|(l, _)| l.as_str() != "cli")
        .flat_map(|(l, to)| {
            // The terminal belongs to `cli` and `ui`; only `cli` draws with `ui`.
            to.iter()
                .filter(|(t, _)| t == "cli" || t == "ui")
                .map(move |(t, f)| format!("{l} → {t} ({f})"))
        })
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_reader_sees_edges_and_layers() {
    // The guard itself: it must see a `use crate::` edge, a `super::` edge and the kinds' halves.
    let m = vec![
        "kinds".to_string(),
        "probe".to_string(),
        "machine".to_string(),
    ];
    let refs = references(
        "use crate::hosts::Cmd;\nuse super::Desired; // crate::ui::x in a comment\n",
        &m,
    );
    assert_eq!(
        refs,
        vec![
            vec!["hosts".to_string(), "Cmd".to_string()],
            vec!["kinds".into(), "probe".into(), "Desired".into()],
        ]
    );
    assert_eq!(layer_of(&m).as_deref(), Some("kinds::machine"));
    assert_eq!(
        layer_of(&["kinds".into(), "probe".into(), "Desired".into()]).as_deref(),
        Some("kinds")
    );
    let edges = layer_edges();
    assert!(edges["plan"].iter().any(|(to, _)| to == "kind"));
    assert!(edges["kinds::machine"].iter().any(|(to, _)| to == "hosts"));
    // The kinds register their lowerings with the evaluation, and lower with its interface.
    assert!(edges["kinds"]
        .iter()
        .any(|(to, _)| to == "config::lowering"));
    assert!(edges["kinds::lower"]
        .iter()
        .any(|(to, _)| to == "config::lowering"));
    assert_eq!(
        layer_of(&["kinds".into(), "probe".into(), "lower".into()]).as_deref(),
        Some("kinds::lower")
    );
}

/// The edges from an engine room to a kind, as `from → to (file)`.
fn engine_imports_of_kinds(edges: &BTreeMap<String, BTreeSet<(String, String)>>) -> Vec<String> {
    ENGINE
        .iter()
        .flat_map(|l| edges.get(*l).into_iter().flatten().map(move |e| (l, e)))
        .filter(|(_, (to, _))| to == "kinds" || to.starts_with("kinds::"))
        .map(|(l, (to, file))| format!("{l} → {to} ({file})"))
        .collect()
}

/// No engine room imports a kind: each asks the registry (`kind::Registered`, the evaluation's
/// `LOWERINGS`), so the kinds sit above every room they use and a new kind changes none.
#[test]
fn no_engine_room_imports_a_kind() {
    let mut edges = layer_edges();
    let bad = engine_imports_of_kinds(&edges);
    assert!(
        bad.is_empty(),
        "engine rooms import a kind; ask the registry instead (ARCHITECTURE.md, The kinds' interface):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: the edges the plan and the evaluation had before the registry moved
    // below them.
    for (from, to) in [("plan", "kinds"), ("config", "kinds::lower")] {
        edges
            .entry(from.to_string())
            .or_default()
            .insert((to.to_string(), format!("{from}.rs")));
    }
    assert_eq!(
        engine_imports_of_kinds(&edges),
        [
            "config → kinds::lower (config.rs)",
            "plan → kinds (plan.rs)"
        ]
    );
}

#[test]
fn the_checks_catch_a_cycle_and_a_forbidden_edge() {
    let mut edges: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut edge = |a: &str, b: &str| {
        edges
            .entry(a.into())
            .or_default()
            .insert((b.into(), format!("{a}.rs")));
    };
    edge("config", "kinds");
    edge("kinds", "plan");
    edge("plan", "config");
    edge("kinds", "hosts");
    let found = cycles(&edges);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0]
            .starts_with("config → kinds (config.rs), and back: kinds.rs → plan, plan.rs → config"),
        "{found:?}"
    );
    assert!(reach(&edges, "config").contains_key("hosts"));
    assert_eq!(
        reach(&edges, "config")["hosts"],
        ["config.rs → kinds", "kinds.rs → hosts"]
    );
    // `super` inside `mod tests` names the file's module.
    let r = references(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::undo_order;\n}\nuse super::x;\n",
        &["apply".to_string()],
    );
    assert_eq!(
        r,
        vec![
            vec!["apply".to_string(), "undo_order".into()],
            vec!["x".into()]
        ]
    );
}

/// What a command in `src/cli/` must not do itself: evaluate the definitions
/// (`config::load`, `load_with_readings`, `Workspace::load` as `ws.load(&…)`), resolve models or
/// read node facts (`ops::resolve_models`, `ops::node_facts`, the plan's second evaluation). It
/// gets its definitions from `ops::definitions`, the one place for that.
fn cli_forbidden() -> regex::Regex {
    regex::Regex::new(
        r"\bops::(?:resolve_models|node_facts)\b|\bsecond_evaluation\b|\bplan_connected\b|\bload_observed\b|\bconfig::load\b|\.load\(&",
    )
    .unwrap()
}

/// `file:line: code` for each forbidden use in `text`, tests (from `#[cfg(test)]` on) apart.
fn cli_violations(file: &str, text: &str) -> Vec<String> {
    violations(&cli_forbidden(), file, text)
}

/// `file:line: code` for each line of `text` outside comments that `forbidden` matches, tests
/// (from `#[cfg(test)]` on) apart.
fn violations(forbidden: &regex::Regex, file: &str, text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .enumerate()
        .filter(|(_, l)| forbidden.is_match(l.split("//").next().unwrap_or_default()))
        .map(|(i, l)| format!("{file}:{}: {}", i + 1, l.trim()))
        .collect()
}

/// The number of files below `dir` that `keep` keeps, and `forbidden`'s `violations` in them,
/// each named by its path from `dir`.
fn violations_below(
    dir: &Path,
    keep: impl Fn(&Path) -> bool,
    forbidden: &regex::Regex,
) -> (usize, Vec<String>) {
    let mut all = Vec::new();
    files(dir, &mut all);
    all.retain(|f| keep(f));
    let bad = all
        .iter()
        .flat_map(|f| {
            let name = f.strip_prefix(dir).unwrap().display().to_string();
            violations(forbidden, &name, &std::fs::read_to_string(f).unwrap())
        })
        .collect();
    (all.len(), bad)
}

#[test]
fn the_cli_gets_its_definitions_from_ops_definitions_alone() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
    let (read, bad) = violations_below(&cli, |_| true, &cli_forbidden());
    assert!(read > 10, "{read} files in {}", cli.display());
    assert!(
        bad.is_empty(),
        "cli files load the definitions or resolve models themselves; call ops::definitions (ARCHITECTURE.md, code map):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: what it must catch, and what it must let through.
    let caught = cli_violations(
        "x.rs",
        "let (c, g) = ws.load(&vars)?;\nops::resolve_models::load_resolved(a).await;\nlet o = crate::ops::node_facts::read(&c, &p);\nops::plan::second_evaluation(&c, &o);\ncrate::config::load(dir, &v);\n",
    );
    assert_eq!(caught.len(), 5, "{caught:?}");
    assert!(caught[0].starts_with("x.rs:1: "), "{caught:?}");
    let allowed = cli_violations(
        "x.rs",
        "crate::ops::definitions::load(&ws, &vars)\nif gone.load(Ordering::Relaxed) {}\n// ws.load(&vars) in a comment\n#[cfg(test)]\nmod tests { fn f() { crate::config::load(d, &v); } }\n",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
}

/// What a command in `src/cli/` reaches only through `ops`: the machines (`hosts`) and the
/// resource kinds (`kinds`, either half). A cli file parses, calls one operation, renders.
fn cli_reaches_below_ops() -> regex::Regex {
    regex::Regex::new(
        r"\b(?:crate|sparkform|super::super)::(?:hosts|inspect|kinds)\b|\bcrate::\{[^}]*\b(?:hosts|inspect|kinds)\b",
    )
    .unwrap()
}

#[test]
fn the_cli_calls_neither_hosts_nor_kinds() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
    let (read, bad) = violations_below(&cli, |_| true, &cli_reaches_below_ops());
    assert!(read > 10, "{read} files in {}", cli.display());
    assert!(
        bad.is_empty(),
        "cli files call hosts or kinds themselves; go through an operation in ops (ARCHITECTURE.md, Layers):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: what it must catch, and what it must let through.
    let caught = violations(
        &cli_reaches_below_ops(),
        "x.rs",
        "crate::hosts::lifetime::shutdown();\nuse crate::kinds::container::Desired;\nuse crate::{config, hosts};\nlet p = crate::hosts::HostPool::connect(&c, &n, &o).await;\n",
    );
    assert_eq!(caught.len(), 4, "{caught:?}");
    let allowed = violations(
        &cli_reaches_below_ops(),
        "x.rs",
        "use crate::ops::nodes::{short_id, Facts};\nlet o = crate::ops::HostOptions::default();\n// crate::hosts in a comment\n#[cfg(test)]\nmod tests { use crate::vocabulary::KindId; }\n",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
}

/// What only a kind's own folder says: Docker (its client, a node's engine), a recorded
/// resource's facts or a configuration by key, a kind by its name. `ops`, `plan` and the cli
/// ask the kind's typed questions instead (`AnyKind`, `AnyMachine`).
fn kind_knowledge() -> regex::Regex {
    let names: Vec<String> = sparkform::vocabulary::KindId::ALL
        .iter()
        .map(|k| format!("{k:?}"))
        .collect();
    regex::Regex::new(&format!(
        r#"\bbollard::|\.docker\(\)|attributes(?:\.get\(|\[)"|config(?:\.get\(|\[)"|\bKindId::(?:{})\b"#,
        names.join("|")
    ))
    .unwrap()
}

#[test]
fn ops_plan_and_the_cli_leave_docker_and_a_kinds_keys_to_the_kind() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let forbidden = kind_knowledge();
    let mut bad = Vec::new();
    for layer in ["ops", "plan", "cli"] {
        let dir = src.join(layer);
        let (read, found) = violations_below(&dir, |_| true, &forbidden);
        assert!(read > 5, "{read} files in {}", dir.display());
        bad.extend(found.into_iter().map(|v| format!("{layer}/{v}")));
    }
    assert!(
        bad.is_empty(),
        "Docker or a kind's keys outside its folder; ask the kind (ARCHITECTURE.md, Invariants):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: what ops/status.rs, ops/watch.rs and plan/impact.rs had, and what it
    // must let through.
    let caught = violations(
        &forbidden,
        "x.rs",
        "use bollard::query_parameters as q;\nlet docker = host.docker().await.ok();\nlet id = r.attributes.get(\"container_id\");\nif kind == KindId::Container {\n.is_some_and(|r| r.kind == KindId::Probe)\nlet n = r.config.get(\"name\");\n",
    );
    assert_eq!(caught.len(), 6, "{caught:?}");
    let allowed = violations(
        &forbidden,
        "x.rs",
        "for kind in KindId::ALL {\nmachine(kind).look(host, lineage, &of_kind).await\nr.attributes.get(crate::plan::MARK_LAST_RUN)\n#[cfg(test)]\nmod tests { use bollard::Docker; }\n",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
}

/// A kind's block must be reachable from the top level of the language, or its resources can
/// never be declared: a new kind that is missing from `config::schema::top_level_blocks` fails here.
#[test]
fn every_kind_has_its_block_in_the_language() {
    use sparkform::config::schema::{top_level_blocks, BlockSpec, Child};
    fn walk(spec: &'static BlockSpec, out: &mut Vec<&'static BlockSpec>) {
        out.push(spec);
        for Child { spec, .. } in spec.blocks {
            walk(spec, out);
        }
    }
    let mut declared = Vec::new();
    for spec in top_level_blocks() {
        walk(spec, &mut declared);
    }
    for k in sparkform::vocabulary::KindId::ALL {
        let block = k.kind().description().block;
        assert!(
            declared.iter().any(|b| std::ptr::eq(*b, block)),
            "{k}: block `{}` is not in config::schema::top_level_blocks",
            block.kind
        );
    }
}

/// A string that starts with a kind's block and a dot (`"probe."`, `"container."`): code that
/// tells what a resource is by its address's first characters, which a module path defeats
/// (`module.qwen.probe.rendezvous` is a probe too). Only `src/kinds` may spell addresses;
/// everywhere else asks `kind::address`.
fn kind_name_prefix() -> regex::Regex {
    let blocks: Vec<&str> = sparkform::vocabulary::KindId::ALL
        .iter()
        .map(|k| k.top_block().kind)
        .collect();
    regex::Regex::new(&format!(r#""(?:{})\."#, blocks.join("|"))).unwrap()
}

#[test]
fn only_the_kinds_read_what_a_resource_is_off_its_address() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let forbidden = kind_name_prefix();
    let (_, bad) = violations_below(&src, |f| !f.starts_with(src.join("kinds")), &forbidden);
    assert!(
        bad.is_empty(),
        "code outside src/kinds reads a resource's kind off its address; ask kind::address (ARCHITECTURE.md, Invariants):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: the test plan/impact.rs had, and what it must let through.
    let caught = violations(
        &forbidden,
        "impact.rs",
        "let until = if name.starts_with(\"probe.\") {\n[\"container.\", \"module.\", \"network.\"]\n",
    );
    assert_eq!(caught.len(), 2, "{caught:?}");
    let allowed = violations(
        &forbidden,
        "x.rs",
        "if address::runs(name) {}\nformat!(\"output.{}\", o.name)\n// \"probe.\" in a comment\n#[cfg(test)]\nmod tests { fn f() { assert!(runs(\"probe.hello\")); } }\n",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
}

/// What only the tests may have: the fake nodes, their in-memory Docker Engine and the chaos
/// kill trigger, by names that exist only in the test kit's code (`testkit/`).
const TEST_SUPPORT_ITEMS: &[&str] = &["FakeHost", "FakeWorld", "FakeDocker", "KillTrigger"];

/// The packages sparkform depends on, transitively, as `cargo tree` resolves them for this
/// machine: through normal and build edges only (what `cargo build --release` and
/// `cargo install` compile), or through its dev edges too (what its tests compile).
fn dependencies(with_dev: bool) -> std::collections::BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let edges = if with_dev {
        "normal,build,dev"
    } else {
        "normal,build"
    };
    let out = std::process::Command::new(cargo)
        .args(["tree", "-p", "sparkform", "-e", edges])
        .args(["--prefix=none", "--format={p}", "--locked", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Which of [`TEST_SUPPORT_ITEMS`] occur in `bytes` (a binary's symbols and strings).
fn names_in(bytes: &[u8]) -> Vec<&'static str> {
    TEST_SUPPORT_ITEMS
        .iter()
        .copied()
        .filter(|n| {
            regex::bytes::Regex::new(&regex::escape(n))
                .unwrap()
                .is_match(bytes)
        })
        .collect()
}

/// The `#[path]`s of `text` that name the test kit's source and stand in no `#[cfg(test)]`
/// group of attributes.
fn kit_sources_outside_tests(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .filter(|&i| lines[i].contains("#[path") && lines[i].contains("testkit/"))
        .filter(|&i| {
            !lines[..i]
                .iter()
                .rev()
                .take_while(|l| l.trim_start().starts_with("#["))
                .any(|l| l.trim() == "#[cfg(test)]")
        })
        .map(|i| lines[i].trim().to_string())
        .collect()
}

/// The product (`cargo build --release`, `cargo install`, and the binary `cargo test` builds)
/// has no fake and no chaos hook: they live in the test kit, a crate no build of the binary
/// depends on, so none of their code can be linked in. A look at the dependency graph, and at
/// the binary the tests run.
#[test]
fn the_product_has_no_fake_and_no_chaos_hook() {
    let product = dependencies(false);
    assert!(
        product.contains("tokio") && !product.contains("sparkform-testkit"),
        "the product's build depends on the test kit: {product:?}"
    );
    let bin = std::fs::read(env!("CARGO_BIN_EXE_sparkform")).unwrap();
    let shipped = names_in(&bin);
    assert!(
        shipped.is_empty(),
        "the sparkform binary holds {shipped:?}: only the test kit (testkit/) may define them"
    );
    // The library's unit tests compile the kit's source in (src/lib.rs): only under cfg(test).
    let lib =
        std::fs::read_to_string(format!("{}/src/lib.rs", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let included = kit_sources_outside_tests(&lib);
    assert!(
        included.is_empty(),
        "src/lib.rs compiles the test kit's source outside #[cfg(test)]: {included:?}"
    );
    assert_eq!(
        kit_sources_outside_tests("#[path = \"../testkit/src/fake.rs\"]\nmod fake;\n").len(),
        1
    );
    // The guard itself: it finds the kit where it is, in the tests' graph and in this test's
    // own binary, which links it.
    assert!(dependencies(true).contains("sparkform-testkit"));
    let this = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(names_in(&this), TEST_SUPPORT_ITEMS);
}

/// Sizes (issue 21): a file of `src/` over this many lines is split by what its parts do.
const MAX_FILE_LINES: usize = 1200;
/// A function over this many lines, from its signature's first line to its closing brace, is
/// split into named phases. Functions inside a `mod tests { }` are not counted: a test reads
/// best as one story.
const MAX_FN_LINES: usize = 150;

/// What may be over a limit for now, each as a path from `src/` (a file) or `path::fn` (a
/// function). An entry that is no longer over its limit fails the test, so the list only
/// shrinks.
const OVER_A_LIMIT_FOR_NOW: &[&str] = &[];

/// Files over the size limit by design, each with why (ARCHITECTURE.md says it beside the
/// file): the weights' program is sent to the nodes as one file (`python3 -c`, or mounted), so
/// it stays one, its parts named by their functions.
const OVER_THE_SIZE_LIMIT_BY_DESIGN: &[&str] = &["kinds/model/transfer.py"];

/// `(name, lines)` of each function of `text` longer than `MAX_FN_LINES`, those inside a
/// `mod tests { }` apart. A function runs from the line of `fn NAME` to the first line after it
/// that is its indentation and `}`; a signature ending in `;` (a trait's) has no body.
fn long_functions(text: &str) -> Vec<(String, usize)> {
    let sig = regex::Regex::new(
        r#"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+"[^"]*"\s+)?fn\s+(\w+)"#,
    )
    .unwrap();
    let tests = regex::Regex::new(r"^(\s*)(?:pub(?:\([a-z]+\))?\s+)?mod\s+tests\s*\{").unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let code = |l: &str| {
        l.split("//")
            .next()
            .unwrap_or_default()
            .trim_end()
            .to_string()
    };
    let closing = |from: usize, indent: &str| {
        let end = format!("{indent}}}");
        (from..lines.len()).find(|&k| lines[k] == end)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(m) = tests.captures(lines[i]) {
            // Skip the test module whole.
            i = closing(i + 1, &m[1]).unwrap_or(lines.len()) + 1;
            continue;
        }
        if let Some(m) = sig.captures(lines[i]) {
            let Some(open) = (i..lines.len()).find(|&k| {
                let c = code(lines[k]);
                c.ends_with('{') || c.ends_with(';') || c.ends_with('}')
            }) else {
                break;
            };
            let c = code(lines[open]);
            if !c.ends_with('{') {
                // A declaration (`;`) or a body on its signature's lines.
                i = open + 1;
                continue;
            }
            if let Some(end) = closing(open + 1, &m[1]) {
                let n = end - i + 1;
                if n > MAX_FN_LINES {
                    out.push((m[2].to_string(), n));
                }
            }
        }
        i += 1;
    }
    out
}

#[test]
fn no_file_over_1200_lines_and_no_function_over_150() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    source_files(&src, &mut all);
    let mut over = Vec::new();
    for f in &all {
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        let n = text.lines().count();
        if n > MAX_FILE_LINES && !OVER_THE_SIZE_LIMIT_BY_DESIGN.contains(&rel.as_str()) {
            over.push((
                rel.clone(),
                format!("{rel}: {n} lines (at most {MAX_FILE_LINES})"),
            ));
        }
        if !rel.ends_with(".rs") {
            continue;
        }
        for (name, n) in long_functions(&text) {
            over.push((
                format!("{rel}::{name}"),
                format!("{rel}: fn {name} is {n} lines (at most {MAX_FN_LINES})"),
            ));
        }
    }
    let bad: Vec<&String> = over
        .iter()
        .filter(|(key, _)| !OVER_A_LIMIT_FOR_NOW.contains(&key.as_str()))
        .map(|(_, why)| why)
        .collect();
    assert!(
        bad.is_empty(),
        "split these (a file by what its parts do, a function into named phases):\n  {}",
        bad.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    let stale: Vec<&&str> = OVER_A_LIMIT_FOR_NOW
        .iter()
        .filter(|k| !over.iter().any(|(key, _)| key == *k))
        .collect();
    assert!(
        stale.is_empty(),
        "no longer over a limit: take them out of OVER_A_LIMIT_FOR_NOW: {stale:?}"
    );
    // The guard itself: a function of 151 lines is caught, one of 150 is not, nor one in tests.
    let lines = |n: usize| "    x();\n".repeat(n);
    let text = format!(
        "pub async fn long(\n    a: u8,\n) -> u8 {{\n{}}}\n\nfn fits() {{\n{}}}\n\ntrait T {{\n    fn f(&self);\n}}\n\n#[cfg(test)]\nmod tests {{\n    fn story() {{\n{}    }}\n}}\n",
        lines(151 - 4),
        lines(150 - 2),
        lines(400)
    );
    assert_eq!(long_functions(&text), [("long".to_string(), 151)]);
}

/// The direct edges between layers, as ARCHITECTURE.md lists them under "Layer edges" (one
/// line a layer: `from → to, to`), read from its fenced block.
fn documented_edges() -> BTreeSet<(String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .unwrap();
    let Some(start) = doc.find("Layer edges") else {
        return BTreeSet::new();
    };
    let block = doc[start..]
        .split("```")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let mut out = BTreeSet::new();
    for line in block.lines() {
        let Some((from, tos)) = line.split_once('→') else {
            continue;
        };
        for to in tos.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            out.insert((from.trim().to_string(), to.to_string()));
        }
    }
    out
}

/// ARCHITECTURE.md's picture of the layers is the imports', edge for edge: an import that
/// makes a new edge, or a documented edge nothing makes any more, fails here with the lines
/// to write.
#[test]
fn the_architecture_doc_lists_exactly_the_layer_edges() {
    let edges = layer_edges();
    let actual: BTreeSet<(String, String)> = edges
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |(to, _)| (from.clone(), to.clone())))
        .collect();
    let documented = documented_edges();
    if actual != documented {
        let mut by_layer: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (from, to) in &actual {
            by_layer.entry(from).or_default().push(to);
        }
        let lines: Vec<String> = by_layer
            .iter()
            .map(|(from, tos)| format!("{from} → {}", tos.join(", ")))
            .collect();
        let missing: Vec<String> = actual
            .difference(&documented)
            .map(|(a, b)| format!("{a} → {b}"))
            .collect();
        let stale: Vec<String> = documented
            .difference(&actual)
            .map(|(a, b)| format!("{a} → {b}"))
            .collect();
        panic!(
            "ARCHITECTURE.md's layer edges are not the imports'.\n  undocumented: {}\n  documented but not made: {}\nthe block to write:\n{}",
            missing.join(", "),
            stale.join(", "),
            lines.join("\n")
        );
    }
}

/// ARCHITECTURE.md is a map a reader can trust: at most 300 lines, and each invariant names
/// the test that guards it (`Guard: `PATH::TEST``), a test that exists.
#[test]
fn every_invariant_names_a_test_that_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    assert!(
        doc.lines().count() <= 300,
        "ARCHITECTURE.md has {} lines: a map, at most 300 (the long form goes to docs/design-notes.md)",
        doc.lines().count()
    );
    let section = doc
        .split("\n## Invariants\n")
        .nth(1)
        .expect("ARCHITECTURE.md has an `## Invariants` section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let bullets: Vec<&str> = section
        .split("\n- ")
        .skip(1)
        .filter(|b| !b.trim().is_empty())
        .collect();
    assert!(bullets.len() >= 10, "{} invariants found", bullets.len());
    let guard = regex::Regex::new(r"Guard: `([^`:]+)::([a-z0-9_]+)`").unwrap();
    let mut wrong = Vec::new();
    for b in &bullets {
        let first = b.lines().next().unwrap_or_default();
        let Some(c) = guard.captures(b) else {
            wrong.push(format!("no `Guard: `PATH::TEST`` in: {first}"));
            continue;
        };
        let (path, test) = (&c[1], &c[2]);
        let text = std::fs::read_to_string(root.join(path)).unwrap_or_default();
        let defines = regex::Regex::new(&format!(r"\bfn {test}\s*\("))
            .unwrap()
            .is_match(&text);
        let marked = text
            .split(&format!("fn {test}"))
            .next()
            .and_then(|before| before.rsplit("\n\n").next())
            .is_some_and(|attrs| {
                attrs.contains("#[test]") || attrs.contains("::test(") || attrs.contains("::test]")
            });
        if !defines || !marked {
            wrong.push(format!("{path} has no test `{test}` (for: {first})"));
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md:\n  {}",
        wrong.join("\n  ")
    );
}

/// What a command leaves to its operation: making a runtime (`cli::main` makes the process's
/// one), locking and planning (`lock_and_plan`), pinning the definitions to a state, and the
/// phases of an apply around a prompt (`LockedPlan`'s `apply`, `write_lock`,
/// `drop_connections`).
fn cli_does_an_operations_work() -> regex::Regex {
    regex::Regex::new(
        r"\bruntime::Builder\b|\bRuntime::new\b|\block_and_plan\b|Pins::Recorded|Pins::Planned|\.write_lock\(|\.drop_connections\(",
    )
    .unwrap()
}

#[test]
fn a_command_is_parse_one_operation_render() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
    // `cli/mod.rs` makes the one runtime; the other files take it.
    let (read, bad) = violations_below(
        &cli,
        |f| f.file_name().is_none_or(|n| n != "mod.rs"),
        &cli_does_an_operations_work(),
    );
    assert!(read > 10, "{read} files in {}", cli.display());
    assert!(
        bad.is_empty(),
        "cli files do an operation's work; move it into ops (ARCHITECTURE.md, Layers):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: what cli/apply.rs and cli/verify.rs had, and what it must let through.
    let caught = violations(
        &cli_does_an_operations_work(),
        "x.rs",
        "ops::apply::lock_and_plan(request, &events).await\nlet (c, g) = evaluated.pin(Pins::Recorded(Some(&state)))?;\nrt.block_on(prepared.drop_connections());\nreturn match prepared.write_lock() {\nlet rt = tokio::runtime::Builder::new_current_thread()\n",
    );
    assert_eq!(caught.len(), 5, "{caught:?}");
    let allowed = violations(
        &cli_does_an_operations_work(),
        "x.rs",
        "match ops::apply::apply(cmd, &mut terminal, rt) {\nargs.config.definitions(false, Pins::Unresolved)\n#[cfg(test)]\nmod tests { let rt = tokio::runtime::Runtime::new(); }\n",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
}

/// The map stays true: every path ARCHITECTURE.md names (`src/graph.rs`, `apply/execute.rs`
/// under `src/`, `modules/vllm-mp`) exists, and every guard it names (`FILE::function`) is a
/// function of that file; a file over the size limit by design is named there with its reason.
#[test]
fn every_path_and_guard_the_architecture_map_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    let mut named = 0;
    // A row of the code map names its folder first; the paths after it are in that folder
    // (`src/config/` … `eval/`).
    let tokens = map.lines().flat_map(|line| {
        let tokens: Vec<&str> = line.split('`').skip(1).step_by(2).collect();
        let folder = tokens
            .first()
            .filter(|t| line.starts_with('|') && t.ends_with('/'))
            .map(|t| t.to_string());
        tokens.into_iter().map(move |t| (folder.clone(), t))
    });
    for (folder, token) in tokens {
        let (path, item) = match token.split_once("::") {
            Some((p, i)) => (p, Some(i)),
            None => (token, None),
        };
        let looks_like_a_path = path.contains('/')
            && !path.contains('<')
            && !path.contains(' ')
            && !path.contains('*')
            && !path.starts_with("/");
        if !looks_like_a_path {
            continue;
        }
        named += 1;
        let mut places = vec![root.join(path), root.join("src").join(path)];
        places.extend(folder.map(|f| root.join(f).join(path)));
        let found = places.into_iter().find(|p| p.exists());
        let Some(found) = found else {
            missing.push(format!("{token}: no such path"));
            continue;
        };
        if let Some(function) = item.filter(|i| i.chars().all(|c| c.is_alphanumeric() || c == '_'))
        {
            let text = std::fs::read_to_string(&found).unwrap_or_default();
            if !text.contains(&format!("fn {function}(")) {
                missing.push(format!("{token}: no fn {function} in {path}"));
            }
        }
    }
    assert!(
        named >= 40,
        "only {named} paths found in the map: is it read right?"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what is not there:\n  {}",
        missing.join("\n  ")
    );
    for f in OVER_THE_SIZE_LIMIT_BY_DESIGN {
        assert!(
            map.lines()
                .any(|l| l.contains(&format!("src/{f}")) && l.contains("one file")),
            "ARCHITECTURE.md does not say why src/{f} is over the size limit"
        );
    }
}

/// What names another kind's folder from inside `kind`'s: `kinds::<other>` or `super::<other>`
/// for every other kind.
fn other_kinds(kind: &str) -> regex::Regex {
    let others: Vec<&str> = sparkform::vocabulary::KindId::ALL
        .iter()
        .map(|k| k.as_str())
        .filter(|k| *k != kind)
        .collect();
    regex::Regex::new(&format!(r"\b(?:kinds|super)::(?:{})\b", others.join("|"))).unwrap()
}

#[test]
fn no_kind_imports_another_kinds_folder() {
    let kinds = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kinds");
    let mut bad = Vec::new();
    let mut read = 0;
    for kind in sparkform::vocabulary::KindId::ALL {
        let dir = kinds.join(kind.as_str());
        let (n, found) = violations_below(&dir, |_| true, &other_kinds(kind.as_str()));
        read += n;
        bad.extend(found.into_iter().map(|v| format!("{kind}/{v}")));
    }
    assert!(read > 30, "{read} files under {}", kinds.display());
    assert!(
        bad.is_empty(),
        "a kind reaches into another kind's folder; share it through runtime/ or vocabulary/ (ARCHITECTURE.md, code map):\n  {}",
        bad.join("\n  ")
    );
    // The guard itself: what the fabric test and the probe had, and what it lets through.
    let forbidden = other_kinds("fabric_test");
    let caught = violations(
        &forbidden,
        "x.rs",
        "use crate::kinds::container::machine::helper_body;\nuse super::container::desired::Gpus;\n",
    );
    assert_eq!(caught.len(), 2, "{caught:?}");
    let allowed = violations(
        &forbidden,
        "x.rs",
        "use crate::kinds::fabric_test::Desired;\nuse crate::runtime::spec::ContainerSpec;\nuse crate::kinds::machine::Step;\n",
    );
    assert!(allowed.is_empty(), "{allowed:?}");
}

/// The public types of `src/` by name, with the files that declare each.
fn public_type_names(src: &Path) -> BTreeMap<String, Vec<String>> {
    let decl = regex::Regex::new(
        r"(?m)^\s*pub(?:\([a-z]+\))? (?:struct|enum|trait|type) ([A-Z][A-Za-z0-9]*)",
    )
    .unwrap();
    let mut all = Vec::new();
    files(src, &mut all);
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in all
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(src).unwrap().display().to_string();
        for c in decl.captures_iter(&text) {
            names.entry(c[1].to_string()).or_default().push(rel.clone());
        }
    }
    names
}

/// One name per concept: no two public types share a name, except the three every kind
/// declares in its own folder (`Desired`, `Recorded`, and its machine half's `Undo`), which the
/// kind's path tells apart (`container::Desired`) and the `Kind` trait names.
#[test]
fn no_two_public_types_share_a_name() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let per_kind = ["Desired", "Recorded", "Undo"];
    let names = public_type_names(&src);
    assert!(names.len() > 100, "{} names", names.len());
    let shared: Vec<String> = names
        .iter()
        .filter(|(n, files)| files.len() > 1 && !per_kind.contains(&n.as_str()))
        .map(|(n, files)| format!("{n}: {}", files.join(", ")))
        .collect();
    assert!(
        shared.is_empty(),
        "types that share a name; give each its own (ARCHITECTURE.md, Invariants):\n  {}",
        shared.join("\n  ")
    );
    // The per-kind names stay inside the kinds' folders.
    for n in per_kind {
        assert!(
            names[n].iter().all(|f| f.starts_with("kinds/")),
            "{n}: {:?}",
            names[n]
        );
    }
}

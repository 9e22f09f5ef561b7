//! A plan as text for people: every action with its attributes expanded and never cut, what
//! changed inside lists, maps and objects, then the outputs, the summary and the impact on the
//! running deployment.

use std::fmt::Write as _;

use super::diff::{self, Noun, Sign, SENSITIVE};
use super::impact::{Impact, PhaseTimes};
use super::{Action, AttrChange, Change, Plan};
use crate::kind::address;
use crate::kind::Registered;

/// Where an attribute line's sign sits (under the resource's own sign).
const ATTR_COL: usize = 6;

pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let changes: Vec<&Change> = plan
        .changes
        .iter()
        .filter(|c| c.action.is_change())
        .collect();
    render_imports(&mut out, plan);
    render_moves(&mut out, plan);
    if changes.is_empty() && !plan.outputs.iter().any(|o| o.action.is_change()) {
        if plan.imports.is_empty() && plan.moved.is_empty() && plan.forgotten.is_empty() {
            if plan.failing.is_empty() {
                out.push_str("No changes. The machines match the configuration.\n");
            } else {
                out.push_str(
                    "No changes to make, but the deployment did not pass its last checks.\n",
                );
            }
            render_failing(&mut out, plan);
            render_excluded(&mut out, plan);
            render_foreign(&mut out, plan);
            return out;
        }
        out.push_str(
            "\nWhat runs matches the definitions: nothing else changes, nothing restarts.\n",
        );
    }
    if !changes.is_empty() {
        out.push_str("sparkform will perform these actions, in this order:\n");
        for (step, c) in changes.iter().enumerate() {
            out.push('\n');
            render_change(&mut out, step + 1, c);
        }
    }
    let outputs: Vec<_> = plan
        .outputs
        .iter()
        .filter(|o| o.action.is_change())
        .collect();
    if !outputs.is_empty() {
        out.push_str("\nChanges to outputs:\n");
        let width = outputs
            .iter()
            .map(|o| o.name.chars().count())
            .max()
            .unwrap_or(0);
        for o in outputs {
            let (sign, text) = match (&o.before, &o.after) {
                _ if o.sensitive => (o.action, SENSITIVE.to_string()),
                (None, Some(a)) => (Action::Create, diff::value(a, Sign::Add, 2)),
                (Some(b), None) => (Action::Delete, diff::value(b, Sign::Remove, 2)),
                (Some(b), Some(a)) => (Action::Update, diff::diff(b, a, 2)),
                (None, None) => (o.action, "null".into()),
            };
            let _ = writeln!(out, "  {} {:width$} = {text}", sign.symbol(), o.name);
        }
    }
    render_failing(&mut out, plan);
    render_excluded(&mut out, plan);
    render_foreign(&mut out, plan);
    out.push('\n');
    out.push_str(&summary_line(plan));
    out.push('\n');
    if let Some(impact) = &plan.impact {
        render_impact(&mut out, impact);
    }
    out
}

pub fn summary_line(plan: &Plan) -> String {
    let s = &plan.summary;
    let mut imports = String::new();
    for (n, what) in [
        (s.import, "import"),
        (s.moved, "move"),
        (s.forget, "forget"),
    ] {
        if n > 0 {
            let _ = write!(imports, "{n} to {what}, ");
        }
    }
    format!(
        "Plan: {imports}{} to add, {} to change, {} to replace, {} to destroy; {} probe{} to run.",
        s.create,
        s.update,
        s.replace,
        s.delete,
        s.run,
        if s.run == 1 { "" } else { "s" }
    )
}

/// The runs whose last recorded result failed and that this plan does not run again.
fn render_failing(out: &mut String, plan: &Plan) {
    if plan.failing.is_empty() {
        return;
    }
    out.push_str("\nThe last recorded results of these probes failed:\n");
    for f in &plan.failing {
        let at = if f.at.is_empty() {
            "at an unknown time"
        } else {
            f.at.as_str()
        };
        let _ = writeln!(out, "  ! {} failed ({at}): {}", f.address, f.error);
    }
    out.push_str("Run `sparkform verify` to check them now, or `sparkform apply -replace ADDRESS` to replace what they test.\n");
}

/// Objects of the definitions' addresses running under another state's lineage: what they are,
/// and the `import` blocks that adopt them instead of creating them anew.
fn render_foreign(out: &mut String, plan: &Plan) {
    if plan.foreign.is_empty() {
        return;
    }
    out.push_str("\nWarning: these run already with sparkform's labels for addresses the state does not record, under another state's lineage (was the state lost or replaced?):\n");
    for f in &plan.foreign {
        let lineage = f.lineage.as_deref().unwrap_or("none");
        let _ = writeln!(
            out,
            "  ! {} on {}: {} {} ({}), lineage {lineage}",
            f.address,
            f.node,
            f.kind,
            f.name,
            f.id.chars().take(12).collect::<String>()
        );
    }
    out.push_str("This plan creates them anew, and an apply stops at the first name it finds taken. To adopt them instead, restarting nothing, write their `import` blocks with `sparkform plan -generate-import-out=FILE` (FILE in the definitions' folder, e.g. imports.hcl), then apply; the blocks are:\n");
    let mut seen = std::collections::BTreeSet::new();
    for f in &plan.foreign {
        if seen.insert(f.address.as_str()) {
            for line in f.import_block().lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
}

/// The objects an apply adopts before its steps, and whether what runs already matches.
/// The records `moved` blocks re-address and `removed` blocks forget: state only.
fn render_moves(out: &mut String, plan: &Plan) {
    if plan.moved.is_empty() && plan.forgotten.is_empty() {
        return;
    }
    out.push_str(
        "sparkform will change these records of the state, touching nothing on the nodes:\n\n",
    );
    for m in &plan.moved {
        let _ = writeln!(out, "  # {} has moved to {}", m.from, m.to);
    }
    for f in &plan.forgotten {
        let _ = writeln!(
            out,
            "  # {} will no longer be managed: it stays as it runs{}, no longer in the state (a `removed` block)",
            f.address,
            on(&f.node)
        );
    }
    out.push('\n');
}

fn render_imports(out: &mut String, plan: &Plan) {
    if plan.imports.is_empty() {
        return;
    }
    out.push_str("sparkform will import these objects into the state, restarting nothing:\n");
    let steps: Vec<&str> = plan
        .changes
        .iter()
        .filter(|c| c.action.is_change())
        .map(|c| c.address.as_str())
        .collect();
    for i in &plan.imports {
        let _ = writeln!(
            out,
            "\n  <= {} will be imported (id {:?}{})",
            i.address,
            i.id,
            on(&i.node)
        );
        for n in &i.notes {
            let _ = writeln!(out, "       {n}");
        }
        match steps.iter().position(|a| *a == i.address) {
            Some(step) => {
                let _ = writeln!(
                    out,
                    "       what runs differs from the definitions: step {} below",
                    step + 1
                );
            }
            None => out.push_str("       what runs matches the definitions\n"),
        }
    }
    out.push('\n');
}

fn render_excluded(out: &mut String, plan: &Plan) {
    for n in &plan.notes {
        let _ = writeln!(out, "\nNote: {n}.");
    }
    if plan.excluded.is_empty() {
        return;
    }
    out.push_str("\nExcluded with -exclude (and what depends on it), left as they are:\n");
    for a in &plan.excluded {
        let _ = writeln!(out, "    {a}");
    }
}

/// `12.3 s`, `15 min 4 s`.
pub fn duration(secs: f64) -> String {
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let whole = secs.round() as u64;
        format!("{} min {} s", whole / 60, whole % 60)
    }
}

fn expected(secs: Option<f64>) -> String {
    match secs {
        Some(s) => format!("expected {}", duration(s)),
        None => "expected duration unknown".into(),
    }
}

/// The new containers' cache folders: a warm one shortens phases (by what the recorded cold and
/// warm starts took, or skips them when no warm start is recorded), a cold one goes through
/// them; the expected durations above count it.
fn render_caches(out: &mut String, impact: &Impact) {
    for c in &impact.caches {
        let image = c.image_id.as_deref().map(|i| {
            let hex = i.strip_prefix("sha256:").unwrap_or(i);
            format!("sha256:{}", hex.chars().take(12).collect::<String>())
        });
        let phases = c
            .skips
            .iter()
            .map(|p| cache_phase(p, c.warm, c.last_start_warm))
            .collect::<Vec<_>>()
            .join(", ");
        let text = match (&image, c.warm) {
            (Some(image), true) if !c.skips.is_empty() && c.last_start_warm => {
                format!("warm for image {image}, as the recorded start was: {phases}")
            }
            (Some(image), true) if !c.skips.is_empty() => {
                format!("warm for image {image}: {phases}")
            }
            (Some(image), true) => format!("warm for image {image}"),
            (Some(image), false) if c.skips.is_empty() => {
                format!("cold: nothing for image {image} yet")
            }
            (Some(image), false) => {
                format!("cold: nothing for image {image} yet, so {phases}")
            }
            (None, _) => "cold: the node does not have the image yet".into(),
        };
        let _ = writeln!(out, "  Cache: {}{}: {text}.", c.address, on(&c.node));
    }
}

/// What one phase of a cached start is expected to take, and how the expected time counts it.
fn cache_phase(p: &PhaseTimes, warm: bool, last_start_warm: bool) -> String {
    let label = &p.label;
    let secs = |s: Option<f64>| s.map_or_else(|| "not recorded".to_string(), duration);
    if !warm {
        return match (last_start_warm, p.cold_secs, p.saving()) {
            (true, _, Some(s)) => format!(
                "{label} runs ({} cold, {} warm: {} more than the last apply)",
                secs(p.cold_secs),
                secs(p.warm_secs),
                duration(s)
            ),
            (false, Some(s), _) => format!("{label} runs ({} the last apply)", duration(s)),
            _ => format!("{label} runs"),
        };
    }
    if p.cold_secs.is_none() && p.warm_secs.is_none() {
        // the phase shows on another container's log (a rank that waits for rank 0's health)
        return format!("{label} (not a phase its recorded starts showed)");
    }
    match (last_start_warm, p.saving()) {
        // the recorded start was warm too: its time stands
        (true, _) => format!("{label} ({} warm, the last apply)", secs(p.warm_secs)),
        (false, Some(s)) if p.warm_secs.is_none() => format!(
            "skips {label} ({} the last apply, left out of the expected time until a warm start is recorded)",
            duration(s)
        ),
        (false, Some(s)) => format!(
            "{label} {} cold, {} warm ({} less than the last apply)",
            secs(p.cold_secs),
            secs(p.warm_secs),
            duration(s)
        ),
        (false, None) => format!("{label} (no cold start recorded)"),
    }
}

/// The soaks the apply waits for, after the rest of the impact.
fn render_soaks(out: &mut String, impact: &Impact) {
    for (address, secs) in &impact.soaks {
        let _ = writeln!(
            out,
            "  Soak: {address} must keep passing for {} after it passes before the apply completes (a failure rolls back).",
            duration(*secs as f64)
        );
    }
}

fn on(node: &Option<String>) -> String {
    node.as_ref()
        .map(|n| format!(" on {n}"))
        .unwrap_or_default()
}

fn render_scales(out: &mut String, impact: &Impact) {
    for scale in &impact.scales {
        let mut said = Vec::new();
        if !scale.removed.is_empty() {
            said.push(format!(
                "{} taken out of the router (drained) before it is removed",
                scale.removed.join(", ")
            ));
        }
        if !scale.added.is_empty() {
            said.push(format!(
                "{} put in once its probes pass",
                scale.added.join(", ")
            ));
        }
        let _ = writeln!(
            out,
            "  Scaling behind {}: {} → {} replicas, with no restart of the router: the endpoint stays up.\n    {}.",
            scale.router,
            scale.before,
            scale.after,
            said.join("; ")
        );
    }
}

fn render_impact(out: &mut String, impact: &Impact) {
    if !impact.is_disruptive() {
        out.push_str("\nImpact: no disruption (no running container is stopped or replaced).\n");
        render_scales(out, impact);
        render_caches(out, impact);
        render_soaks(out, impact);
        return;
    }
    out.push_str("\nImpact:\n  Stopped or replaced:\n");
    for s in &impact.stopped {
        let note = s
            .kind
            .kind()
            .description()
            .disruption(s.action == Action::Replace)
            .unwrap_or("changes");
        let what = if s.action == Action::Replace {
            format!("{note} ({})", expected(s.expected_secs))
        } else {
            note.to_string()
        };
        let _ = writeln!(
            out,
            "    step {}: {}{} {what}",
            s.step,
            s.address,
            on(&s.node)
        );
    }
    if !impact.unavailable.is_empty() {
        out.push_str("  Unavailable:\n");
        for o in &impact.unavailable {
            let until = match (&o.until, o.until_step) {
                (Some(u), Some(step)) if address::runs(u) => {
                    format!(
                        "until {u} passes (step {step}); {}",
                        expected(o.expected_secs)
                    )
                }
                (Some(u), Some(step)) => format!(
                    "until {u} passes its ready check (step {step}); {}",
                    expected(o.expected_secs)
                ),
                _ => "until the configuration serves them again".to_string(),
            };
            let _ = writeln!(
                out,
                "    {}: from step {} ({}) {until}",
                o.endpoints.join(", "),
                o.from_step,
                o.cause
            );
        }
    }
    if impact.keeps_running.is_empty() {
        out.push_str("  Keeps running: no other container.\n");
    } else {
        out.push_str("  Keeps running:\n");
        for r in &impact.keeps_running {
            let _ = writeln!(out, "    {}{}", r.address, on(&r.node));
        }
    }
    for roll in &impact.rolls {
        let _ = writeln!(
            out,
            "  Rolling behind {}, one replica at a time: the endpoint stays up.\n    Replicas serving: {}",
            roll.router,
            roll.serving()
        );
    }
    render_scales(out, impact);
    if impact.unavailable.is_empty() {
        if impact.rolls.is_empty() && impact.scales.is_empty() {
            out.push_str("  No output or probe depends on what stops.\n");
        }
        render_caches(out, impact);
        render_soaks(out, impact);
        return;
    }
    match impact.outage_secs {
        Some(s) => {
            let _ = writeln!(
                out,
                "  Expected outage: {} (durations recorded by the last apply that ran these steps{}).",
                duration(s),
                match impact.engine_start_secs {
                    Some(e) => format!(
                        "), of which {} is the engine's own start (the slowest replaced container's, from its start to ready",
                        duration(e.min(s))
                    ),
                    None => String::new(),
                }
            );
            if let Some(a) = impact.apply_secs {
                let _ = writeln!(
                    out,
                    "  Expected apply: {} (the changed steps' recorded durations, along the longest chain of them).",
                    duration(a)
                );
            }
        }
        None if impact.unmeasured.is_empty() => out.push_str("  Expected outage: unknown.\n"),
        None => {
            let _ = writeln!(
                out,
                "  Expected outage: unknown: no apply has recorded how long {} take{}.",
                impact.unmeasured.join(", "),
                if impact.unmeasured.len() == 1 {
                    "s"
                } else {
                    ""
                }
            );
        }
    }
    render_caches(out, impact);
    render_soaks(out, impact);
}

fn render_change(out: &mut String, step: usize, c: &Change) {
    let what = match c.action {
        Action::Create => "will be created".to_string(),
        Action::Update => "will be updated in place".to_string(),
        Action::Replace => format!("must be replaced ({})", c.replace_reasons.join("; ")),
        // An untracked copy goes, not the resource: one that does not run (the previous
        // container an interrupted apply set aside, a snapshot of weights) is only removed.
        Action::Delete => match &c.orphan {
            Some(o) if !o.running => format!(
                "has an untracked copy that does not run ({}): it will be removed; nothing running stops",
                o.name
            ),
            Some(o) => format!(
                "has an untracked, running copy ({}) that will be stopped and removed",
                o.name
            ),
            None => "will be destroyed".to_string(),
        },
        Action::Run => format!(
            "will run{}",
            c.run_reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        Action::NoOp => "is unchanged".to_string(),
    };
    let _ = writeln!(
        out,
        "  # {step}. {} ({}{}) {what}",
        c.address,
        c.kind,
        on(&c.node)
    );
    let _ = writeln!(out, "{:>5} {}", c.action.symbol(), c.address);
    for d in &c.drift {
        let _ = writeln!(out, "      ! drift: {d}");
    }
    let groups = group(&c.attributes);
    let width = groups
        .iter()
        .map(|g| g.name.chars().count())
        .max()
        .unwrap_or(0);
    for g in &groups {
        let (sign, text) = match g.entries.as_slice() {
            [(None, a)] => change_text(a, ATTR_COL),
            entries => (Sign::Change, map_entries(c, g.name, entries)),
        };
        let forces =
            c.action == Action::Replace && g.entries.iter().any(|(_, a)| a.forces_replacement);
        let text = if forces {
            diff::mark_first_line(&text, "   # forces replacement")
        } else {
            text
        };
        let _ = writeln!(
            out,
            "{}{} {:width$} = {text}",
            " ".repeat(ATTR_COL),
            sign.char(),
            g.name
        );
    }
}

/// One top-level attribute: either the whole value, or the changed keys of a map
/// (`env.HF_TOKEN`, `env.NODE_IP`), which the plan lists one by one.
struct Group<'a> {
    name: &'a str,
    entries: Vec<(Option<&'a str>, &'a AttrChange)>,
}

fn group(attributes: &[AttrChange]) -> Vec<Group<'_>> {
    let mut out: Vec<Group> = Vec::new();
    for a in attributes {
        let (name, sub) = match a.path.split_once('.') {
            Some((n, s)) => (n, Some(s)),
            None => (a.path.as_str(), None),
        };
        match out.last_mut() {
            Some(g)
                if sub.is_some()
                    && g.name == name
                    && g.entries.iter().all(|(s, _)| s.is_some()) =>
            {
                g.entries.push((sub, a))
            }
            _ => out.push(Group {
                name,
                entries: vec![(sub, a)],
            }),
        }
    }
    out
}

/// One attribute's (or map entry's) sign and value: added, removed, or what changed in it.
/// A value flagged sensitive shows as `(sensitive)`, except for an object, whose secrets the
/// plan already holds as hashes (so its plain entries can be shown).
fn change_text(a: &AttrChange, col: usize) -> (Sign, String) {
    match (&a.before, &a.after) {
        (None, Some(v)) if a.sensitive => (Sign::Add, diff::sensitive_value(v, Sign::Add, col)),
        (None, Some(v)) => (Sign::Add, diff::value(v, Sign::Add, col)),
        (Some(v), None) if a.sensitive => {
            (Sign::Remove, diff::sensitive_value(v, Sign::Remove, col))
        }
        (Some(v), None) => (Sign::Remove, diff::value(v, Sign::Remove, col)),
        (Some(b), Some(v)) if a.sensitive && !(b.is_object() && v.is_object()) => {
            (Sign::Change, format!("{SENSITIVE} → {SENSITIVE}"))
        }
        (Some(b), Some(v)) => (Sign::Change, diff::diff(b, v, col)),
        (None, None) => (Sign::Change, "null".into()),
    }
}

/// The changed keys of a map, and how many others it keeps as they are.
fn map_entries(c: &Change, name: &str, entries: &[(Option<&str>, &AttrChange)]) -> String {
    let lines = entries
        .iter()
        .map(|(k, a)| {
            let (sign, text) = change_text(a, ATTR_COL + 4);
            (sign, k.unwrap_or_default(), text)
        })
        .collect();
    let total = c
        .after
        .as_ref()
        .and_then(|v| v.get(name))
        .and_then(|v| v.as_object())
        .map_or(0, |m| m.len());
    let present = entries.iter().filter(|(_, a)| a.after.is_some()).count();
    let unchanged = total.saturating_sub(present);
    let folded = (unchanged > 0).then(|| diff::hidden(unchanged, Noun::Elements));
    diff::block(lines, folded, ATTR_COL)
}

/// A JSON value on one line, in full: a reviewer must see all of it (`state show`, outputs).
pub fn value(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::impact::{Outage, Stop};
    use crate::vocabulary::KindId;

    /// The impact of a replaced container that endpoints wait behind until `until` passes.
    fn waiting_until(until: &str) -> Impact {
        Impact {
            stopped: vec![Stop {
                step: 1,
                address: "module.qwen.container.vllm".into(),
                kind: KindId::Container,
                node: None,
                action: Action::Replace,
                expected_secs: None,
            }],
            unavailable: vec![Outage {
                endpoints: vec!["output.endpoint".into()],
                from_step: 1,
                cause: "module.qwen.container.vllm".into(),
                until: Some(until.into()),
                until_step: Some(2),
                expected_secs: None,
            }],
            ..Impact::default()
        }
    }

    fn rendered(impact: &Impact) -> String {
        let mut out = String::new();
        render_impact(&mut out, impact);
        out
    }

    #[test]
    fn an_outage_ends_when_a_probe_passes_wherever_a_module_declares_it() {
        for probe in ["probe.hello", "module.qwen.probe.rendezvous"] {
            let out = rendered(&waiting_until(probe));
            assert!(
                out.contains(&format!("until {probe} passes (step 2);")),
                "{out}"
            );
        }
        let out = rendered(&waiting_until("module.qwen.container.vllm"));
        assert!(
            out.contains("until module.qwen.container.vllm passes its ready check (step 2);"),
            "{out}"
        );
    }
}

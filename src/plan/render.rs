//! A plan as text for people.

use std::fmt::Write as _;

use super::{Action, AttrChange, Change, Plan};

/// Render the plan. `detail` shows every attribute of created resources (Terraform's default).
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let changes: Vec<&Change> = plan
        .changes
        .iter()
        .filter(|c| c.action.is_change())
        .collect();
    if changes.is_empty() && !plan.outputs.iter().any(|o| o.action.is_change()) {
        out.push_str("No changes. The machines match the configuration.\n");
        return out;
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
        for o in outputs {
            let shown = |v: &Option<serde_json::Value>| match v {
                _ if o.sensitive => "(sensitive)".to_string(),
                Some(v) => value(v),
                None => "null".into(),
            };
            match o.action {
                Action::Create => {
                    let _ = writeln!(out, "  + {} = {}", o.name, shown(&o.after));
                }
                Action::Delete => {
                    let _ = writeln!(out, "  - {} = {}", o.name, shown(&o.before));
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "  ~ {} = {} → {}",
                        o.name,
                        shown(&o.before),
                        shown(&o.after)
                    );
                }
            }
        }
    }
    out.push('\n');
    out.push_str(&summary_line(plan));
    out.push('\n');
    if let Some(impact) = impact(plan) {
        out.push_str(&impact);
    }
    out
}

pub fn summary_line(plan: &Plan) -> String {
    let s = &plan.summary;
    format!(
        "Plan: {} to add, {} to change, {} to replace, {} to destroy; {} probe{} to run.",
        s.create,
        s.update,
        s.replace,
        s.delete,
        s.run,
        if s.run == 1 { "" } else { "s" }
    )
}

/// Which running containers stop, and from which step on.
fn impact(plan: &Plan) -> Option<String> {
    let steps: Vec<&Change> = plan
        .changes
        .iter()
        .filter(|c| c.action.is_change())
        .collect();
    let disrupted: Vec<(usize, &Change)> = steps
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.kind.kind().disrupts_when_replaced()
                && matches!(c.action, Action::Replace | Action::Delete)
        })
        .map(|(i, c)| (i + 1, *c))
        .collect();
    if disrupted.is_empty() {
        return None;
    }
    let mut out = String::from("Impact:\n");
    for (step, c) in &disrupted {
        let what = if c.action == Action::Replace {
            "restarts (replaced)"
        } else {
            "stops (destroyed)"
        };
        let _ = writeln!(out, "  step {step}: {} {what}", c.address);
    }
    if let Some((first, _)) = disrupted.iter().find(|(_, c)| c.action == Action::Replace) {
        let _ = writeln!(
            out,
            "  Services in these containers are down from step {first} until their replacements pass their ready checks."
        );
    }
    Some(out)
}

fn render_change(out: &mut String, step: usize, c: &Change) {
    let where_ = c
        .node
        .as_ref()
        .map(|n| format!(" on {n}"))
        .unwrap_or_default();
    let what = match c.action {
        Action::Create => "will be created".to_string(),
        Action::Update => "will be updated in place".to_string(),
        Action::Replace => format!("must be replaced ({})", c.replace_reasons.join("; ")),
        Action::Delete => "will be destroyed".to_string(),
        Action::Run => format!(
            "will run{}",
            c.run_reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        Action::NoOp => "is unchanged".to_string(),
    };
    let _ = writeln!(out, "  # {step}. {} ({}{where_}) {what}", c.address, c.kind);
    let _ = writeln!(out, "{:>5} {}", c.action.symbol(), c.address);
    for d in &c.drift {
        let _ = writeln!(out, "      ! drift: {d}");
    }
    let width = c.attributes.iter().map(|a| a.path.len()).max().unwrap_or(0);
    for a in &c.attributes {
        let _ = writeln!(out, "      {}", attr_line(c.action, a, width));
    }
}

fn attr_line(action: Action, a: &AttrChange, width: usize) -> String {
    let show = |v: &Option<serde_json::Value>| -> String {
        match v {
            _ if a.sensitive => "(sensitive)".into(),
            Some(v) => value(v),
            None => "null".into(),
        }
    };
    let path = format!("{:width$}", a.path, width = width);
    let line = match (action, &a.before, &a.after) {
        (Action::Create | Action::Run, None, Some(_)) => format!("+ {path} = {}", show(&a.after)),
        (_, None, Some(_)) => format!("+ {path} = {}", show(&a.after)),
        (_, Some(_), None) => format!("- {path} = {}", show(&a.before)),
        _ => format!("~ {path} = {} → {}", show(&a.before), show(&a.after)),
    };
    if a.forces_replacement && action == Action::Replace {
        format!("{line}   # forces replacement")
    } else {
        line
    }
}

/// A JSON value on one line; long values are cut so one attribute cannot flood the screen.
pub fn value(v: &serde_json::Value) -> String {
    let s = serde_json::to_string(v).unwrap_or_default();
    if s.chars().count() > 240 {
        let cut: String = s.chars().take(240).collect();
        format!("{cut}…")
    } else {
        s
    }
}

//! `sparkform rollback`: a known-good generation put back from what the state recorded, not
//! from an old commit of the definitions. The definitions on disk still say how to reach the
//! nodes and give the values the state keeps only as keyed hashes (each must hash to what the
//! generation recorded) and the ephemeral ones it never keeps; every resource of the generation
//! is planned at the configuration it recorded, and what the generation did not have is
//! destroyed. The plan and the apply are the ordinary ones.

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, OutputBlock, Resource};
use crate::diag::{Diag, Diagnostics, SourceFile, Span};
use crate::graph::Graph;
use crate::kind::Registered;
use crate::plan::{pointer_mut, recorded_config, Plan, PlanOptions};
use crate::state::generations::{Generation, Shape};
use crate::state::{hash_sensitive, HashKey, State};

use super::definitions::{Evaluated, Pins};
use super::history::entries;
use super::OpError;

/// A rollback's plan, and what it was made from.
pub struct RollbackPlan {
    pub config: (Config, Graph),
    pub plan: Plan,
    pub warnings: Vec<Diag>,
    /// The generation it puts back, and that generation's definitions digest.
    pub number: u64,
    pub definitions: String,
}

/// The plan that puts generation `number` (or the one [`chosen`] takes) of `state` back, with
/// the definitions as written (`evaluated`) for the nodes and the values the state never holds
/// in clear; nothing is read on the machines.
pub fn plan(
    evaluated: Evaluated,
    state: &State,
    number: Option<u64>,
    key: Option<&HashKey>,
) -> Result<RollbackPlan, OpError> {
    let defs = evaluated.pin(Pins::Recorded(Some(state)))?;
    let generation = chosen(state, number)?;
    let config = generation_config(&defs.config, generation, key)?;
    let graph = Graph::build(&config)?;
    let options = PlanOptions {
        key: key.cloned(),
        ..PlanOptions::default()
    };
    let mut plan = crate::plan::plan(&config, &graph, state, &options)?;
    // What each resource it starts again ran then: its kind starts exactly that where the node
    // still has it (a container, the image by its recorded ID).
    use crate::plan::Action;
    for c in plan.changes.iter_mut() {
        if matches!(c.action, Action::Create | Action::Replace | Action::Update) {
            c.restores = generation
                .resources
                .get(&c.address)
                .map(|r| r.attributes.clone());
        }
    }
    plan.notes.push(format!(
        "Rolling back to generation {} (applied {} by {}), from what the state recorded: the \
         definitions on disk give only the nodes and the sensitive values",
        generation.number, generation.at, generation.by
    ));
    Ok(RollbackPlan {
        config: (config, graph),
        plan,
        warnings: defs.warnings,
        number: generation.number,
        definitions: generation.definitions.clone(),
    })
}

/// What the plan's notes say of what the resources the rollback starts again ran in the
/// generation and their nodes no longer hold as recorded, as each kind sees it
/// (`Machine::restorable`): an image whose reference moved on (run by its ID, or named with the
/// fix), a kept snapshot that no longer matches its manifest. Found before the apply, not
/// halfway through it; what a node lacks and cannot get (weights no node keeps, with the hub
/// unreachable) refuses the rollback. A node that does not answer is left out (the apply finds
/// out).
pub async fn restored_images(
    config: &Config,
    plan: &Plan,
    generation: &Generation,
    pool: &crate::hosts::HostPool,
) -> Result<Vec<String>, OpError> {
    use crate::plan::Action;
    let mut asks = Vec::new();
    for c in &plan.changes {
        if !matches!(c.action, Action::Create | Action::Replace | Action::Update) {
            continue;
        }
        let (Some(r), Some(record)) = (
            config.resources.iter().find(|r| r.address == c.address),
            generation.resources.get(&c.address),
        ) else {
            continue;
        };
        let Some(node) = r.node.as_deref().and_then(|a| config.nodes.get(a)) else {
            continue;
        };
        let Ok(host) = pool.get(&node.address) else {
            continue;
        };
        let (address, number) = (c.address.clone(), generation.number);
        let kind = r.kind;
        asks.push(async move {
            crate::kinds::machine::machine(kind)
                .restorable(host.as_ref(), &address, record, number)
                .await
        });
    }
    let mut notes = Vec::new();
    let mut refused = Vec::new();
    for r in futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
    {
        match r {
            crate::kinds::machine::Restorable::Note(n) => notes.push(n),
            crate::kinds::machine::Restorable::Refused { message, help } => {
                refused.push(Diag::error("rollback::unrestorable", message).help(help))
            }
        }
    }
    if !refused.is_empty() {
        return Err(OpError::Config(Diagnostics(refused)));
    }
    Ok(notes)
}

/// The generation a rollback takes: `number`, or without one the newest before the generation
/// running now (the newest kept when none runs now).
pub fn chosen(state: &State, number: Option<u64>) -> Result<&Generation, OpError> {
    let refuse = |message: String, help: &str| {
        OpError::Config(Diagnostics(vec![Diag::error(
            "rollback::generation",
            message,
        )
        .help(help.to_string())]))
    };
    if state.generations.is_empty() {
        return Err(refuse(
            "the state has no generation to roll back to".into(),
            "an apply records one when every step and probe passes; `sparkform history` lists them",
        ));
    }
    let kept = || {
        state
            .generations
            .iter()
            .map(|g| g.number.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(n) = number {
        return state
            .generations
            .iter()
            .find(|g| g.number == n)
            .ok_or_else(|| {
                refuse(
                    format!("the state keeps no generation {n} (it keeps {})", kept()),
                    "`sparkform history` lists them",
                )
            });
    }
    // Newest first: the first one after the one running now whose configuration differs from
    // what runs. A restart (`watch --restart`, a probe's run) records a generation identical to
    // the one before it; going back to that would put back what runs, not what ran before.
    let listed = entries(state);
    let target = match listed.iter().position(|e| e.current) {
        Some(i) => listed.iter().skip(i + 1).find(|e| !e.runs_now),
        None => listed.first(),
    };
    let target = target.ok_or_else(|| {
        refuse(
            format!(
                "the state runs the oldest configuration it keeps (generations {}): there is none before it that differs from what runs",
                kept()
            ),
            "name one with `sparkform rollback DIR N`; `sparkform history` lists them",
        )
    })?;
    state
        .generations
        .iter()
        .find(|g| g.number == target.number)
        .ok_or_else(|| refuse("the generation vanished".into(), "report this"))
}

/// `current` (the definitions on disk, evaluated) with the resources and outputs of
/// `generation` in place of its own: each resource at the configuration the generation
/// recorded, its sensitive values taken from `current` where they hash (under `key`) to what
/// was recorded, its ephemeral values from `current`. A resource whose configuration `current`
/// already gives as recorded is taken whole.
pub fn generation_config(
    current: &Config,
    generation: &Generation,
    key: Option<&HashKey>,
) -> Result<Config, OpError> {
    let mut resources = Vec::new();
    let mut wrong = Vec::new();
    for (address, record) in &generation.resources {
        let now = current.resource(address);
        if let Some(now) = now.filter(|n| recorded_config(n, key) == record.config) {
            resources.push(now.clone());
            continue;
        }
        let shape = generation.shapes.get(address).cloned().unwrap_or_default();
        let mut config = record.config.json().clone();
        for path in &shape.sensitive {
            let Some(slot) = pointer_mut(&mut config, path) else {
                continue;
            };
            let live = now.and_then(|n| value_at(&n.config, path));
            match live {
                Some(v) if hash_sensitive(key, v) == *slot => *slot = v.clone(),
                _ => wrong.push(format!("{address}: {}", path.join("."))),
            }
        }
        for path in &shape.ephemeral {
            if let (Some(v), Some((last, parent))) = (
                now.and_then(|n| value_at(&n.config, path)),
                path.split_last(),
            ) {
                if let Some(serde_json::Value::Object(m)) = pointer_mut(&mut config, parent) {
                    m.insert(last.clone(), v.clone());
                }
            }
        }
        resources.push(resource(address, record, shape, config, now, generation));
    }
    if !wrong.is_empty() {
        return Err(OpError::Config(Diagnostics(vec![Diag::error(
            "rollback::sensitive",
            format!(
                "generation {} ran with sensitive values the definitions no longer give: {}",
                generation.number,
                wrong.join("; ")
            ),
        )
        .help(
            "the state keeps only their keyed hashes: give the values they had then (the \
             variables that set them, with -var or SPARKFORM_VAR_name) and roll back again",
        )])));
    }
    let mut config = current.clone();
    config.resources = resources;
    config.outputs = outputs(current, generation);
    // What the definitions adopt, move or forget belongs to them, not to the generation.
    config.imports.clear();
    config.moves.clear();
    config.removals.clear();
    Ok(config)
}

/// The resource `address` as the generation recorded it.
fn resource(
    address: &str,
    record: &crate::state::ResourceState,
    shape: Shape,
    config: serde_json::Value,
    now: Option<&Resource>,
    generation: &Generation,
) -> Resource {
    let span = now.map(|n| n.span.clone()).unwrap_or_else(|| {
        let file = Arc::new(SourceFile::new(
            Path::new(&format!("generation {}", generation.number)),
            String::new(),
        ));
        Span::new(&file, 0..0)
    });
    Resource {
        address: address.to_string(),
        kind: record.kind,
        node: record.node.clone(),
        // Decoded here, where the generation's configuration is made whole again.
        config: record.kind.configuration(config),
        sensitive: shape.sensitive,
        ephemeral: shape.ephemeral,
        deps: record.depends_on.iter().cloned().collect(),
        replace_triggered_by: shape.replace_triggered_by.into_iter().collect(),
        group: shape.group,
        span,
    }
}

/// The generation's outputs; a sensitive one (recorded as a hash) takes the definitions' value
/// of the same name, or is left out.
fn outputs(current: &Config, generation: &Generation) -> Vec<OutputBlock> {
    let span = |name: &str| {
        current
            .outputs
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.span.clone())
    };
    generation
        .outputs
        .iter()
        .filter_map(|(name, o)| {
            if o.sensitive {
                return current.outputs.iter().find(|c| &c.name == name).cloned();
            }
            let span = span(name).unwrap_or_else(|| {
                let file = Arc::new(SourceFile::new(Path::new("generation"), String::new()));
                Span::new(&file, 0..0)
            });
            Some(OutputBlock {
                name: name.clone(),
                value: o.value.clone(),
                sensitive: false,
                deps: Default::default(),
                span,
            })
        })
        .collect()
}

/// What a plan says when the state runs a rollback's generation and the definitions plan
/// changes to it: they are not what the rollback put back, and the plan takes what runs to what
/// they say.
pub fn rolled_back_note(state: &State, plan: &Plan) -> Option<String> {
    let g = state.generations.last()?;
    let to = g.rollback_to?;
    let runs_it = entries(state).first().is_some_and(|e| e.current);
    (runs_it && plan.has_changes()).then(|| {
        format!(
            "The state runs generation {} ({}), a rollback to generation {to}; these definitions \
             are not what it put back, and this plan takes what runs to what they say",
            g.number, g.at
        )
    })
}

fn value_at<'a>(v: &'a serde_json::Value, path: &[String]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(v, |cur, p| cur.get(p))
}

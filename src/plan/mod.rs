//! Desired (configuration) against recorded (state): what to create, change, replace, delete
//! and which probes to run. Pure: no I/O.

pub mod diff;
mod foreign;
pub mod impact;
mod imports;
mod kept;
pub mod moves;
mod outputs;
pub mod planfile;
mod record;
pub mod render;
pub use foreign::{import_block, import_blocks, Foreign};

use outputs::output_changes;
use record::mark;
pub use record::{
    mark_run_started, record, record_change, record_import, record_intent, record_outputs,
    record_run_failed, MARK_LAST_RUN, MARK_PENDING, MARK_RUN_FAILED, MARK_RUN_STARTED,
};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::config::{Config, Resource};
use crate::diag::Diag;
use crate::graph::Graph;
use crate::kind::{Configuration, Registered};
use crate::state::{
    hash_sensitive, is_sensitive_hash, sha256_hex, HashKey, OutputState, ResourceState, State,
    LEGACY_PREFIX,
};
use crate::vocabulary::{KindId, Lifecycle, OnDrift};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Update,
    Replace,
    Delete,
    Run,
    NoOp,
}

impl Action {
    pub fn symbol(self) -> &'static str {
        match self {
            Action::Create => "+",
            Action::Update => "~",
            Action::Replace => "-/+",
            Action::Delete => "-",
            Action::Run => "?",
            Action::NoOp => " ",
        }
    }

    pub fn is_change(self) -> bool {
        self != Action::NoOp
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttrChange {
    /// `image`, `env.HF_TOKEN`, `ready`.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<serde_json::Value>,
    pub sensitive: bool,
    pub forces_replacement: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub address: String,
    pub kind: KindId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub action: Action,
    /// Attribute-level differences (all attributes for a create, none for a no-op).
    pub attributes: Vec<AttrChange>,
    /// Why a replacement: attributes that force it, `-replace`, or `replace_triggered_by`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replace_reasons: Vec<String>,
    /// Why a probe runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_reason: Option<String>,
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The configuration the state records after this change (sensitive values as hashes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<crate::kind::Configuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_hash: Option<String>,
    /// How the machine differs from the state (refresh).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    /// For an untracked container found by its labels: its name and id on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan: Option<Orphan>,
    /// A delete that also removes what the kind keeps by design (`Kind::kept_on_delete`: a
    /// container's cache folder), as `destroy -purge-caches` asks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub purge: bool,
    /// A rollback's create, replace or update: what the generation it puts back recorded of
    /// the resource (its facts), so that its kind starts again exactly what ran then where the
    /// node still has it (a container: the image by its recorded ID, wherever the reference
    /// points now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restores: Option<crate::kind::Attributes>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputChange {
    pub name: String,
    pub action: Action,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<serde_json::Value>,
    pub sensitive: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub create: usize,
    pub update: usize,
    pub replace: usize,
    pub delete: usize,
    pub run: usize,
    /// Objects adopted into the state (`import`), besides what their changes count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub import: usize,
    /// Records re-addressed by `moved` blocks, nothing on the nodes changed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moved: usize,
    /// Records forgotten by `removed` blocks, what runs left running.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub forget: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Every resource, in the order an apply would take them (deletions first, in reverse
    /// dependency order); no-ops included so the plan is a full picture.
    pub changes: Vec<Change>,
    pub outputs: Vec<OutputChange>,
    /// Steps that can run together, as addresses, level by level (changes only).
    pub levels: Vec<Vec<String>>,
    pub summary: Summary,
    /// What the changes do to the running deployment; `None` in plan files made before plans
    /// computed it (they say nothing rather than "no disruption").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<impact::Impact>,
    /// `-exclude`: resources left out, with everything that depends on them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<String>,
    /// Why some changes are planned that the definitions alone do not explain (sensitive
    /// values planned as changed for want of their key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Runs (probes) whose last recorded result failed and that this plan does not run again:
    /// the machines may match the configuration and still not work.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<FailedRun>,
    /// Objects an apply adopts into the state before its steps; each one's change compares
    /// what runs with what the definitions want.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<Import>,
    /// Import blocks for resources the definitions do not have yet (`-generate-config-out`):
    /// observed for the blocks to write, not applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generated: Vec<Import>,
    /// Objects that carry sparkform's labels for the definitions' addresses under another
    /// state's lineage (a lost state): `-generate-import-out` writes the blocks that adopt them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<Foreign>,
    /// Records the `moved` blocks re-address: an apply writes them at their new addresses
    /// before its first step; nothing on the nodes changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<moves::Moved>,
    /// Records the `removed` blocks forget (`destroy = false`): an apply drops them from the
    /// state and leaves what runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgotten: Vec<crate::state::Forgotten>,
}

/// A run whose last recorded result failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRun {
    pub address: String,
    /// When it failed (RFC 3339).
    pub at: String,
    pub error: String,
}

impl Plan {
    pub fn has_changes(&self) -> bool {
        self.changes.iter().any(|c| c.action.is_change())
            || self.outputs.iter().any(|o| o.action.is_change())
            || !self.imports.is_empty()
            || !self.moved.is_empty()
            || !self.forgotten.is_empty()
    }

    pub fn import(&self, address: &str) -> Option<&Import> {
        self.imports.iter().find(|i| i.address == address)
    }

    pub fn change(&self, address: &str) -> Option<&Change> {
        self.changes.iter().find(|c| c.address == address)
    }
}

#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// `-replace ADDR`: replace these even if unchanged.
    pub replace: Vec<String>,
    /// `-target ADDR`: only these and what they depend on.
    pub targets: Vec<String>,
    /// `-exclude ADDR`: everything but these and what depends on them.
    pub exclude: Vec<String>,
    /// What refresh saw on the machines; `None` plans against the state alone.
    pub observations: Option<Observations>,
    /// The deployment's key of sensitive hashes, read beside the state by the caller (plan
    /// stays pure); `None` when there is none: every sensitive value then plans as changed.
    pub key: Option<HashKey>,
    /// Objects to adopt, as their kinds observed them (clear values: the plan hashes the
    /// sensitive ones). Ones whose address the state has are no-ops.
    pub imports: Vec<Import>,
    /// `-generate-config-out`: import blocks may name resources the definitions lack; they are
    /// observed into `Plan::generated` for the blocks to write.
    pub generate_config: bool,
}

/// An object to adopt into the state (an `import` block or `sparkform import`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Import {
    pub address: String,
    pub kind: KindId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What it was imported by: `spark1:vllm`.
    pub id: String,
    /// What runs, as a desired configuration of its kind (in a plan: as the state records it).
    pub config: crate::kind::Configuration,
    /// Facts to record (a container's id).
    #[serde(default)]
    pub attributes: crate::kind::Attributes,
    /// What the kind says about it (labels that come with the next replacement).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Values in `config` that may be secrets the definitions do not mark: hashed like the
    /// sensitive ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_paths: Vec<Vec<String>>,
}

impl PlanOptions {
    /// No options but the deployment's key.
    pub fn with_key(key: HashKey) -> Self {
        PlanOptions {
            key: Some(key),
            ..PlanOptions::default()
        }
    }
}

/// The note of a plan made without the key, when a sensitive value is at stake.
pub const NOTE_NO_KEY: &str = "the deployment's key for sensitive values (sparkform.key beside the state) is missing: every sensitive value plans as changed; an apply creates a new key and records them under it";
/// The note of a plan over a state written before hashes were keyed.
pub const NOTE_LEGACY: &str = "the state holds sensitive values as unkeyed hashes written by an earlier sparkform: they plan as changed once, and an apply records them with keyed hashes";

/// What refresh found for the recorded resources, and containers nobody recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    pub resources: BTreeMap<String, Drift>,
    pub orphans: Vec<Orphan>,
    /// Objects of the definitions' addresses the state lacks, under another lineage or none.
    pub foreign: Vec<Foreign>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Drift {
    /// As recorded.
    InSync,
    /// Gone from the machine.
    Missing(String),
    /// There, but not as recorded (each string says how).
    Drifted(Vec<String>),
}

/// A container carrying this deployment's labels that the state does not explain (an apply
/// killed between creating it and recording it, or a state that was lost).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Orphan {
    /// The kind that found it.
    pub kind: KindId,
    pub address: String,
    pub node: String,
    pub name: String,
    pub id: String,
    /// Whether it runs. A stopped one (the previous container an interrupted apply set aside)
    /// stops nothing when it is removed: the plan says so and counts no outage for it.
    #[serde(default = "runs_unless_said")]
    pub running: bool,
}

/// An orphan recorded before `running` existed is taken as running (the cautious reading).
fn runs_unless_said() -> bool {
    true
}

/// The configuration as the state records it: sensitive values replaced by their keyed hashes,
/// ephemeral ones left out (so they are never a change either); decoded by its kind here,
/// where it is made (the desired one itself where nothing is left out or hashed).
pub fn recorded_config(r: &Resource, key: Option<&HashKey>) -> Configuration {
    if r.ephemeral.is_empty() && r.sensitive.is_empty() {
        return r.config.clone();
    }
    let mut v = r.config.json().clone();
    for path in &r.ephemeral {
        if let Some((last, parent)) = path.split_last() {
            if let Some(serde_json::Value::Object(m)) = pointer_mut(&mut v, parent) {
                m.remove(last);
            }
        }
    }
    for path in &r.sensitive {
        if let Some(slot) = pointer_mut(&mut v, path) {
            *slot = hash_sensitive(key, slot);
        }
    }
    r.kind.configuration(v)
}

/// Whether a recorded configuration holds an unkeyed hash of an earlier sparkform at one of
/// the resource's sensitive paths.
fn holds_legacy_hash(recorded: &serde_json::Value, r: &Resource) -> bool {
    r.sensitive.iter().any(|path| {
        let mut cur = recorded;
        for p in path {
            match cur.get(p) {
                Some(v) => cur = v,
                None => return false,
            }
        }
        legacy_in(cur)
    })
}

fn legacy_in(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.starts_with(LEGACY_PREFIX) && is_sensitive_hash(s),
        serde_json::Value::Object(m) => m.values().any(legacy_in),
        serde_json::Value::Array(a) => a.iter().any(legacy_in),
        _ => false,
    }
}

pub(crate) fn pointer_mut<'a>(
    v: &'a mut serde_json::Value,
    path: &[String],
) -> Option<&'a mut serde_json::Value> {
    let mut cur = v;
    for p in path {
        cur = cur.as_object_mut()?.get_mut(p)?;
    }
    Some(cur)
}

pub fn config_hash(recorded: &serde_json::Value) -> String {
    format!(
        "sha256:{}",
        sha256_hex(&serde_json::to_vec(recorded).unwrap_or_default())
    )
}

fn is_sensitive_path(r: &Resource, top: &str, sub: Option<&str>) -> bool {
    r.sensitive.iter().any(|p| {
        p.first().is_some_and(|f| f == top)
            && match (p.get(1), sub) {
                (None, _) => true,
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => true,
            }
    })
}

/// Compare two recorded configurations attribute by attribute (maps one level deep).
fn diff_attributes(
    before: Option<&serde_json::Value>,
    after: Option<&serde_json::Value>,
    r: Option<&Resource>,
    kind: KindId,
) -> Vec<AttrChange> {
    let empty = serde_json::Map::new();
    let b = before.and_then(|v| v.as_object()).unwrap_or(&empty);
    let a = after.and_then(|v| v.as_object()).unwrap_or(&empty);
    let keys: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    let in_place = kind.kind().description().in_place;
    let whole = kind.kind().description().whole_attributes;
    let mut out = Vec::new();
    // Keep the order of the configuration's attributes where possible.
    let mut ordered: Vec<&String> = a.keys().filter(|k| keys.contains(k)).collect();
    ordered.extend(b.keys().filter(|k| !a.contains_key(*k)));
    for key in ordered {
        // A null is an unset attribute: a create does not list it, an update shows it removed.
        let (bv, av) = (
            b.get(key).filter(|v| !v.is_null()),
            a.get(key).filter(|v| !v.is_null()),
        );
        if bv == av {
            continue;
        }
        let forces = before.is_some() && after.is_some() && !in_place.contains(&key.as_str());
        match (bv, av) {
            (Some(serde_json::Value::Object(bm)), Some(serde_json::Value::Object(am)))
                if !whole.contains(&key.as_str()) =>
            {
                let sub: BTreeSet<&String> = bm.keys().chain(am.keys()).collect();
                for s in sub {
                    let (bs, as_) = (
                        bm.get(s).filter(|v| !v.is_null()),
                        am.get(s).filter(|v| !v.is_null()),
                    );
                    if bs != as_ {
                        out.push(AttrChange {
                            path: format!("{key}.{s}"),
                            before: bs.cloned(),
                            after: as_.cloned(),
                            sensitive: r.is_some_and(|r| is_sensitive_path(r, key, Some(s)))
                                || is_hash(bm.get(s))
                                || is_hash(am.get(s)),
                            forces_replacement: forces,
                        });
                    }
                }
            }
            _ => out.push(AttrChange {
                path: key.clone(),
                before: bv.cloned(),
                after: av.cloned(),
                sensitive: r.is_some_and(|r| is_sensitive_path(r, key, None))
                    || is_hash(bv)
                    || is_hash(av),
                forces_replacement: forces,
            }),
        }
    }
    out
}

fn is_hash(v: Option<&serde_json::Value>) -> bool {
    v.and_then(|v| v.as_str()).is_some_and(is_sensitive_hash)
}

/// Compute the plan. Errors only for bad options (an unknown `-replace` or `-target` address).
pub fn plan(
    config: &Config,
    graph: &Graph,
    state: &State,
    opts: &PlanOptions,
) -> Result<Plan, Box<Diag>> {
    // What moved blocks rename and removed blocks forget plans as if the state had it so.
    let moves::Readdressed {
        moved,
        forgotten,
        state: with_moves,
    } = moves::apply_to(config, state)?;
    let state = with_moves.as_ref().unwrap_or(state);
    // The refresh observed the records at their old addresses.
    let moved_opts = moves::options_after(opts, &moved, state);
    let opts = moved_opts.as_ref().unwrap_or(opts);
    check_named_addresses(config, state, opts)?;
    // What is imported plans as if the state had it as it runs.
    let (imports, generated, with_imports) = imports::as_recorded(config, state, opts);
    let state = with_imports.as_ref().unwrap_or(state);
    let selection = Selection::of(graph, state, opts);
    let by_address: HashMap<&str, &Resource> = config
        .resources
        .iter()
        .map(|r| (r.address.as_str(), r))
        .collect();
    let mut actions: HashMap<String, Action> = HashMap::new();
    let mut changes: BTreeMap<String, Change> = BTreeMap::new();
    let mut notes: Vec<String> = Vec::new();
    let order = graph.order();
    for address in &order {
        let Some(r) = by_address.get(address.as_str()).copied() else {
            continue;
        };
        if selection.leaves_out(address) {
            continue;
        }
        let change = resource_change(r, state, opts, &actions, &mut notes);
        actions.insert(address.clone(), change.action);
        changes.insert(address.clone(), change);
    }
    replace_process_groups(config, &order, state, &mut actions, &mut changes);
    run_probes_after_what_changed(&order, graph, state, &actions, &mut changes);
    let failing = failing_runs(&order, &changes, state);
    // Deletions first (dependents first), then the rest in dependency order.
    let mut ordered: Vec<Change> = deletions(state, &by_address, &selection, opts);
    for address in &order {
        if let Some(c) = changes.remove(address) {
            ordered.push(c);
        }
    }
    let outputs = if selection.targeted.is_some() {
        Vec::new()
    } else {
        // An output showing an excluded resource keeps its recorded value.
        output_changes(config, state, opts.key.as_ref(), &mut notes)
            .into_iter()
            .filter(|o| {
                config
                    .outputs
                    .iter()
                    .find(|c| c.name == o.name)
                    .is_none_or(|c| c.deps.is_disjoint(&selection.excluded))
            })
            .collect()
    };
    kept::kept_for_rollback(&ordered, state, &mut notes);
    let foreign = foreign::listed(config, state, opts.observations.as_ref(), &imports);
    let mut summary = summarize(&ordered, imports.len());
    summary.moved = moved.len();
    summary.forget = forgotten.len();
    let levels = changed_levels(graph, &ordered);
    let mut plan = Plan {
        changes: ordered,
        outputs,
        levels,
        summary,
        impact: None,
        excluded: selection.excluded.into_iter().collect(),
        notes,
        failing,
        imports,
        generated,
        foreign,
        moved,
        forgotten,
    };
    plan.impact = Some(impact::compute(&plan, config, graph, state));
    Ok(plan)
}

/// `-replace` must name a resource of the configuration; `-target` and `-exclude` one of the
/// configuration or the state.
fn check_named_addresses(
    config: &Config,
    state: &State,
    opts: &PlanOptions,
) -> Result<(), Box<Diag>> {
    for a in opts.replace.iter() {
        if config.resource(a).is_none() {
            return Err(Box::new(unknown_address("-replace", a, config)));
        }
    }
    for a in opts.targets.iter() {
        if config.resource(a).is_none() && !state.resources.contains_key(a) {
            return Err(Box::new(unknown_address("-target", a, config)));
        }
    }
    for a in opts.exclude.iter() {
        if config.resource(a).is_none() && !state.resources.contains_key(a) {
            return Err(Box::new(unknown_address("-exclude", a, config)));
        }
    }
    Ok(())
}

/// What `-target` and `-exclude` leave in the plan.
struct Selection {
    /// The targets and everything they depend on; `None`: no `-target`, everything.
    targeted: Option<BTreeSet<String>>,
    /// What `-exclude` names and everything that depends on it.
    excluded: BTreeSet<String>,
}

impl Selection {
    fn of(graph: &Graph, state: &State, opts: &PlanOptions) -> Selection {
        let excluded = excluded(&opts.exclude, graph, state);
        let targeted: Option<BTreeSet<String>> = (!opts.targets.is_empty()).then(|| {
            let mut set = BTreeSet::new();
            for t in &opts.targets {
                set.insert(t.clone());
                set.extend(graph.ancestors(t));
            }
            set
        });
        Selection { targeted, excluded }
    }

    fn leaves_out(&self, address: &str) -> bool {
        self.targeted.as_ref().is_some_and(|t| !t.contains(address))
            || self.excluded.contains(address)
    }
}

/// The change for one resource of the configuration: against what the state records, what
/// refresh observed, the journal's marks, `-replace` and `replace_triggered_by` (`actions`: what
/// is planned so far for the resources before it in dependency order).
fn resource_change(
    r: &Resource,
    state: &State,
    opts: &PlanOptions,
    actions: &HashMap<String, Action>,
    notes: &mut Vec<String>,
) -> Change {
    let address = &r.address;
    let runs = r.kind.kind().description().lifecycle == Lifecycle::Runs;
    let after = recorded_config(r, opts.key.as_ref());
    let hash = config_hash(&after);
    // Nothing recorded, nothing to compare: a create needs no explaining.
    if !r.sensitive.is_empty() && opts.key.is_none() && state.resources.contains_key(address) {
        note(notes, NOTE_NO_KEY);
    }
    if state
        .resources
        .get(address)
        .is_some_and(|old| holds_legacy_hash(&old.config, r))
    {
        note(notes, NOTE_LEGACY);
    }
    let observed = opts
        .observations
        .as_ref()
        .and_then(|o| o.resources.get(address));
    let mut drift = Vec::new();
    let recorded = match (state.resources.get(address), observed) {
        (Some(_), Some(Drift::Missing(why))) => {
            drift.push(why.clone());
            None
        }
        (rec, Some(Drift::Drifted(notes))) => {
            drift.extend(notes.iter().cloned());
            rec
        }
        (rec, _) => rec,
    };
    let mut change = Change {
        address: address.clone(),
        kind: r.kind,
        node: r.node.clone(),
        action: Action::NoOp,
        attributes: Vec::new(),
        replace_reasons: Vec::new(),
        run_reason: None,
        depends_on: r.deps.iter().cloned().collect(),
        after: Some(after.clone()),
        after_hash: Some(hash.clone()),
        drift: drift.clone(),
        orphan: None,
        purge: false,
        restores: None,
    };
    against_recorded(&mut change, recorded, r, &after, &hash);
    if recorded.is_some() {
        after_drift_and_interruptions(&mut change, r, state, observed);
    }
    if !runs {
        forced_by_options(&mut change, r, opts, actions);
    }
    change
}

/// The action from the configuration against what the state records: create (or run) what is
/// new, replace what changes kind or an attribute that forces it, update the rest that changed.
fn against_recorded(
    change: &mut Change,
    recorded: Option<&ResourceState>,
    r: &Resource,
    after: &Configuration,
    hash: &str,
) {
    let runs = r.kind.kind().description().lifecycle == Lifecycle::Runs;
    match recorded {
        None => {
            if runs {
                change.action = Action::Run;
                change.run_reason = Some(format!("new {}", r.kind));
            } else {
                change.action = Action::Create;
            }
            change.attributes = diff_attributes(None, Some(after), Some(r), r.kind);
        }
        Some(old) if old.kind != r.kind => {
            change.action = Action::Replace;
            change
                .replace_reasons
                .push(format!("kind changes from {} to {}", old.kind, r.kind));
            change.attributes = diff_attributes(Some(&old.config), Some(after), Some(r), r.kind);
        }
        Some(old) if old.config_hash != hash => {
            change.attributes = diff_attributes(Some(&old.config), Some(after), Some(r), r.kind);
            let forcing: Vec<String> = change
                .attributes
                .iter()
                .filter(|a| a.forces_replacement)
                .map(|a| a.path.split('.').next().unwrap_or(&a.path).to_string())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if runs {
                change.action = Action::Run;
                change.run_reason = Some("its configuration changed".into());
            } else if forcing.is_empty() {
                change.action = Action::Update;
            } else {
                change.action = Action::Replace;
                change.replace_reasons = forcing
                    .iter()
                    .map(|f| {
                        r.kind
                            .kind()
                            .replace_reason(f, &old.config, after)
                            .unwrap_or_else(|| format!("`{f}` changes"))
                    })
                    .collect();
            }
        }
        Some(_) => {}
    }
}

/// A recorded resource the configuration leaves as it is may still need a step: the machine
/// drifted from the state, or a kill interrupted its create.
fn after_drift_and_interruptions(
    change: &mut Change,
    r: &Resource,
    state: &State,
    observed: Option<&Drift>,
) {
    // The machine no longer matches the state: bring it back even if the config did not change.
    if !change.drift.is_empty() && change.action == Action::NoOp {
        match r.kind.kind().description().on_drift {
            OnDrift::Update => change.action = Action::Update,
            OnDrift::Replace => {
                change.action = Action::Replace;
                change
                    .replace_reasons
                    .push("it drifted from the state".into());
            }
            OnDrift::Ignore => {}
        }
    }
    // A create a kill interrupted: recorded ahead, marked pending. Found on the node (or not
    // looked at), it is adopted: the step runs again and records it as a whole.
    if matches!(change.action, Action::NoOp | Action::Update)
        && mark(state, &r.address, MARK_PENDING).is_some()
    {
        change.action = Action::Update;
        change.drift.push(match observed {
            Some(_) => {
                "found on the node, will be adopted: an earlier apply was stopped while creating it"
                    .into()
            }
            None => {
                "an earlier apply was stopped while creating it: it is created or adopted".into()
            }
        });
    }
}

/// `-replace`, and `replace_triggered_by` naming a resource planned for replacement.
fn forced_by_options(
    change: &mut Change,
    r: &Resource,
    opts: &PlanOptions,
    actions: &HashMap<String, Action>,
) {
    if opts.replace.contains(&r.address) && change.action != Action::Create {
        change.action = Action::Replace;
        change
            .replace_reasons
            .push("requested with -replace".into());
    }
    if change.action != Action::Create {
        for t in &r.replace_triggered_by {
            if actions.get(t) == Some(&Action::Replace) {
                change.action = Action::Replace;
                change
                    .replace_reasons
                    .push(format!("replace_triggered_by: {t} is replaced"));
            }
        }
    }
}

/// Probes run when anything they depend on changes, and again when a kill interrupted their
/// last run.
fn run_probes_after_what_changed(
    order: &[String],
    graph: &Graph,
    state: &State,
    actions: &HashMap<String, Action>,
    changes: &mut BTreeMap<String, Change>,
) {
    for address in order {
        let Some(c) = changes.get(address) else {
            continue;
        };
        if c.kind.kind().description().lifecycle != Lifecycle::Runs || c.action != Action::NoOp {
            continue;
        }
        let cause = graph
            .ancestors(address)
            .into_iter()
            .filter_map(|a| actions.get(&a).map(|act| (a, *act)))
            .find(|(_, act)| matches!(act, Action::Create | Action::Update | Action::Replace));
        if let Some((a, act)) = cause {
            let verb = match act {
                Action::Create => "is created",
                Action::Update => "is updated",
                _ => "is replaced",
            };
            if let Some(c) = changes.get_mut(address) {
                c.action = Action::Run;
                c.run_reason = Some(format!("{a} {verb}"));
            }
        } else if let Some(at) = mark(state, address, MARK_RUN_STARTED) {
            // Killed while it ran: what it checks was never confirmed.
            if let Some(c) = changes.get_mut(address) {
                c.action = Action::Run;
                c.run_reason = Some(format!(
                    "its last run (started {}) was interrupted before it finished",
                    at.as_str().unwrap_or("at an unknown time")
                ));
            }
        }
    }
    // What a check that runs again measured last time, so a reader knows what it is held to.
    for c in changes.values_mut().filter(|c| c.action == Action::Run) {
        let Some(recorded) = state.resources.get(&c.address) else {
            continue;
        };
        let measured = c.kind.kind().holds(&recorded.attributes).measured;
        if measured.is_empty() {
            continue;
        }
        let figures: Vec<String> = measured
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect();
        let reason = c.run_reason.take().unwrap_or_default();
        c.run_reason = Some(format!(
            "{reason}; its last run measured {}",
            figures.join(", ")
        ));
    }
}

/// The runs that failed last time and do not run now: plan says so instead of "No changes."
fn failing_runs(
    order: &[String],
    changes: &BTreeMap<String, Change>,
    state: &State,
) -> Vec<FailedRun> {
    order
        .iter()
        .filter(|a| changes.get(*a).is_some_and(|c| c.action == Action::NoOp))
        .filter_map(|a| {
            let f = mark(state, a, MARK_RUN_FAILED)?;
            let text = |k: &str| f.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            Some(FailedRun {
                address: a.clone(),
                at: text("at"),
                error: text("error"),
            })
        })
        .collect()
}

/// Deletions: recorded resources the configuration no longer has and the labelled objects
/// refresh found untracked, dependents first.
fn deletions(
    state: &State,
    by_address: &HashMap<&str, &Resource>,
    selection: &Selection,
    opts: &PlanOptions,
) -> Vec<Change> {
    let mut deletes: Vec<Change> = Vec::new();
    for (address, old) in &state.resources {
        if by_address.contains_key(address.as_str()) {
            continue;
        }
        if selection.leaves_out(address) {
            continue;
        }
        let drift = match opts
            .observations
            .as_ref()
            .and_then(|o| o.resources.get(address))
        {
            Some(Drift::Missing(why)) => {
                vec![format!("{why}; it is only removed from the state")]
            }
            Some(Drift::Drifted(notes)) => notes.clone(),
            _ => Vec::new(),
        };
        deletes.push(Change {
            address: address.clone(),
            kind: old.kind,
            node: old.node.clone(),
            action: Action::Delete,
            attributes: diff_attributes(Some(&old.config), None, None, old.kind),
            replace_reasons: Vec::new(),
            run_reason: None,
            depends_on: old.depends_on.clone(),
            after: None,
            after_hash: None,
            drift,
            orphan: None,
            purge: false,
            restores: None,
        });
    }
    if let Some(obs) = &opts.observations {
        for o in &obs.orphans {
            if selection.leaves_out(&o.address) {
                continue;
            }
            let desired = by_address.get(o.address.as_str()).map(|r| &r.config);
            let untracked = o.kind.kind().untracked(&o.id, desired);
            if untracked.wanted {
                continue;
            }
            deletes.push(Change {
                address: o.address.clone(),
                kind: o.kind,
                node: Some(o.node.clone()),
                action: Action::Delete,
                attributes: Vec::new(),
                replace_reasons: Vec::new(),
                run_reason: None,
                depends_on: Vec::new(),
                after: None,
                after_hash: None,
                drift: vec![format!(
                    "{} {} ({}) {} but the state does not record it",
                    o.kind,
                    o.name,
                    o.id.chars().take(12).collect::<String>(),
                    untracked.found_by
                )],
                orphan: Some(o.clone()),
                purge: false,
                restores: None,
            });
        }
    }
    reverse_dependency_order(deletes)
}

fn summarize(ordered: &[Change], imports: usize) -> Summary {
    let mut summary = Summary {
        import: imports,
        ..Summary::default()
    };
    for c in ordered {
        match c.action {
            Action::Create => summary.create += 1,
            Action::Update => summary.update += 1,
            Action::Replace => summary.replace += 1,
            Action::Delete => summary.delete += 1,
            Action::Run => summary.run += 1,
            Action::NoOp => {}
        }
    }
    summary
}

/// The graph's levels of parallel steps, each with only what changes (deletes apart).
fn changed_levels(graph: &Graph, ordered: &[Change]) -> Vec<Vec<String>> {
    let changed: BTreeSet<&str> = ordered
        .iter()
        .filter(|c| c.action.is_change() && c.action != Action::Delete)
        .map(|c| c.address.as_str())
        .collect();
    graph
        .levels()
        .into_iter()
        .map(|l| {
            l.into_iter()
                .filter(|a| changed.contains(a.as_str()))
                .collect::<Vec<_>>()
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// The members of one process group (the ranks of a multi-node engine) start as one: a member
/// replaced, or created while another member runs, replaces every other member that runs, and
/// what their replacement triggers (`replace_triggered_by`) follows, until nothing more moves.
/// Only what would otherwise stay or change in place is replaced; a create stays a create.
fn replace_process_groups(
    config: &Config,
    order: &[String],
    state: &State,
    actions: &mut HashMap<String, Action>,
    changes: &mut BTreeMap<String, Change>,
) {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for address in order {
        if let Some(g) = config.resource(address).and_then(|r| r.group.as_deref()) {
            if changes.contains_key(address) {
                groups.entry(g).or_default().push(address);
            }
        }
    }
    if groups.is_empty() {
        return;
    }
    let replaceable = |a: Option<&Action>| matches!(a, Some(Action::NoOp | Action::Update));
    loop {
        let mut moved = false;
        for members in groups.values() {
            let runs = |m: &str| {
                state.resources.contains_key(m) && actions.get(m) != Some(&Action::Create)
            };
            let trigger = members.iter().copied().find(|m| match actions.get(*m) {
                Some(Action::Replace) => true,
                Some(Action::Create) => members.iter().any(|o| o != m && runs(o)),
                _ => false,
            });
            let Some(trigger) = trigger else { continue };
            let verb = if actions.get(trigger) == Some(&Action::Create) {
                "is created"
            } else {
                "is replaced"
            };
            for m in members.iter().copied().filter(|m| *m != trigger) {
                if !replaceable(actions.get(m)) {
                    continue;
                }
                if let Some(c) = changes.get_mut(m) {
                    c.action = Action::Replace;
                    c.replace_reasons.push(format!(
                        "{trigger} {verb}, so this restarts with it: one process group"
                    ));
                    actions.insert(m.to_string(), Action::Replace);
                    moved = true;
                }
            }
        }
        for address in order {
            let Some(r) = config.resource(address) else {
                continue;
            };
            if !replaceable(actions.get(address))
                || r.kind.kind().description().lifecycle == Lifecycle::Runs
            {
                continue;
            }
            let Some(t) = r
                .replace_triggered_by
                .iter()
                .find(|t| actions.get(*t) == Some(&Action::Replace))
            else {
                continue;
            };
            if let Some(c) = changes.get_mut(address) {
                c.action = Action::Replace;
                c.replace_reasons
                    .push(format!("replace_triggered_by: {t} is replaced"));
                actions.insert(address.clone(), Action::Replace);
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
}

/// `-exclude`: the named resources and everything that depends on them, in the configuration
/// (its graph) or, for resources only the state still has, through their recorded dependencies.
fn excluded(named: &[String], graph: &Graph, state: &State) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for a in named {
        out.insert(a.clone());
        out.extend(graph.descendants(a));
    }
    if out.is_empty() {
        return out;
    }
    loop {
        let more: Vec<String> = state
            .resources
            .iter()
            .filter(|(a, r)| !out.contains(*a) && r.depends_on.iter().any(|d| out.contains(d)))
            .map(|(a, _)| a.clone())
            .collect();
        if more.is_empty() {
            break;
        }
        for a in more {
            out.extend(graph.descendants(&a));
            out.insert(a);
        }
    }
    out
}

fn unknown_address(flag: &str, address: &str, config: &Config) -> Diag {
    let mut d = Diag::error(
        "plan::unknown_address",
        format!("{flag} {address}: no such resource"),
    );
    let addrs = config.resources.iter().map(|r| r.address.as_str());
    if let Some(s) = crate::diag::did_you_mean(address, addrs) {
        d = d.help(format!("did you mean {s}?"));
    } else {
        d = d.help("`sparkform graph` lists every resource address");
    }
    d
}

/// Order deletions so a resource goes before the resources it depended on.
fn reverse_dependency_order(deletes: Vec<Change>) -> Vec<Change> {
    let n = deletes.len();
    let index: HashMap<&str, usize> = deletes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.address.as_str(), i))
        .collect();
    // blockers[j]: how many deleted resources depend on j and must go first.
    let mut blockers = vec![0usize; n];
    for c in &deletes {
        for d in &c.depends_on {
            if let Some(&j) = index.get(d.as_str()) {
                blockers[j] += 1;
            }
        }
    }
    let mut queue: std::collections::VecDeque<usize> =
        (0..n).filter(|&i| blockers[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    while let Some(i) = queue.pop_front() {
        order.push(i);
        placed[i] = true;
        for d in &deletes[i].depends_on {
            if let Some(&j) = index.get(d.as_str()) {
                blockers[j] -= 1;
                if blockers[j] == 0 {
                    queue.push_back(j);
                }
            }
        }
    }
    // A cycle recorded in a damaged state: keep the rest in recorded order.
    order.extend((0..n).filter(|&i| !placed[i]));
    let mut slots: Vec<Option<Change>> = deletes.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

pub(crate) fn note(notes: &mut Vec<String>, text: &str) {
    if !notes.iter().any(|n| n == text) {
        notes.push(text.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_null_attribute_is_unset_not_a_change() {
        let kind = KindId::ALL[0];
        // A create lists what is set, not the nulls a plan file would read back as absent.
        let created = diff_attributes(None, Some(&json!({"a": 1, "b": null})), None, kind);
        let paths: Vec<&str> = created.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["a"]);
        // An update from a value to null shows it removed; null to absent is no change.
        let updated = diff_attributes(
            Some(&json!({"a": "x", "b": null, "m": {"k": null, "j": 1}})),
            Some(&json!({"a": null, "m": {"j": 1}})),
            None,
            kind,
        );
        assert_eq!(updated.len(), 1, "{updated:?}");
        assert_eq!(updated[0].path, "a");
        assert_eq!(updated[0].before, Some(json!("x")));
        assert_eq!(updated[0].after, None);
    }
}

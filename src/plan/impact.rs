//! What a plan does to the running deployment: which containers stop or are replaced and where,
//! which endpoints are down from which step until which probe passes, what keeps running, and
//! how long the disruption should last, judged by the durations the last apply recorded. Pure:
//! computed from the plan, the configuration, its graph and the state.

use crate::kind::Registered;
use crate::vocabulary::KindId;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Action, Plan};
use crate::config::Config;
use crate::kind::address;
use crate::vocabulary::Lifecycle;
use petgraph::graph::NodeIndex;
use petgraph::Direction;

use crate::graph::Graph;
use crate::state::State;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Impact {
    /// Running containers (and fabric addresses) the plan stops, replaces or removes.
    #[serde(default)]
    pub stopped: Vec<Stop>,
    /// Endpoints that stop answering, grouped by when they go down and what brings them back.
    #[serde(default)]
    pub unavailable: Vec<Outage>,
    /// Running containers the plan does not touch.
    #[serde(default)]
    pub keeps_running: Vec<Running>,
    /// Seconds from the start of the first disruptive step until every endpoint is back;
    /// `None` when a step on the way has no recorded duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outage_secs: Option<f64>,
    /// Of the outage, the engine's own start: the slowest start (from its process's start to its
    /// readiness, as last measured, less what a warm cache saves) of what the plan replaces and
    /// an endpoint waits for. The rest is sparkform's and the checks'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_start_secs: Option<f64>,
    /// Seconds from the first step the plan runs to the last one done, each step taking its
    /// recorded duration and starting when what it waits for is done; `None` when a step that
    /// runs has no recorded duration or the plan deletes (a delete's time is not recorded).
    /// The time of steps only: the apply's refresh and connections come before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_secs: Option<f64>,
    /// Steps on the way to an endpoint's return with no recorded duration (why an expected
    /// time is unknown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<String>,
    /// Checks that run and must keep passing for a while once they pass (a probe's `soak`):
    /// (address, seconds), which the apply's time includes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub soaks: Vec<(String, u64)>,
    /// New containers that mount a cache folder (`cache`), and what the plan read of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<CacheUse>,
    /// Replicas behind a router that the plan replaces one at a time while the others serve:
    /// what their replacement stops is no outage of what the router serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolls: Vec<Roll>,
    /// Routers whose replicas the plan adds or removes while the others serve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scales: Vec<Scale>,
}

/// Replicas added to or removed from one router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scale {
    pub router: String,
    /// How many replicas it had and will have.
    pub before: usize,
    pub after: usize,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// The routers (updated, not new) whose replicas the state recorded differ in their keys from
/// those the definitions give.
fn scales(config: &Config, state: &State, actions: &HashMap<&str, Action>) -> Vec<Scale> {
    let mut out = Vec::new();
    for r in &config.resources {
        let Some(now) = r.kind.kind().rolling(&r.config) else {
            continue;
        };
        if actions.get(r.address.as_str()) != Some(&Action::Update) {
            continue;
        }
        let Some(was) = state
            .resources
            .get(&r.address)
            .and_then(|rec| r.kind.kind().rolling(&rec.config))
        else {
            continue;
        };
        let added: Vec<String> = now
            .replicas
            .keys()
            .filter(|k| !was.replicas.contains_key(*k))
            .cloned()
            .collect();
        let removed: Vec<String> = was
            .replicas
            .keys()
            .filter(|k| !now.replicas.contains_key(*k))
            .cloned()
            .collect();
        if !added.is_empty() || !removed.is_empty() {
            out.push(Scale {
                router: r.address.clone(),
                before: was.replicas.len(),
                after: now.replicas.len(),
                added,
                removed,
            });
        }
    }
    out
}

/// A roll through the replicas behind one router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roll {
    pub router: String,
    /// How many replicas it has.
    pub replicas: usize,
    /// The replicas replaced, in the order they go, each with the step that replaces it first.
    pub replaced: Vec<(String, usize)>,
}

impl Roll {
    /// "2 of 2 → 1 of 2 (a, step 3) → 2 of 2 → …": how many serve at each step of the roll.
    pub fn serving(&self) -> String {
        let n = self.replicas;
        let mut parts = vec![format!("{n} of {n}")];
        for (key, step) in &self.replaced {
            parts.push(format!("{} of {n} ({key} replaced, step {step})", n - 1));
            parts.push(format!("{n} of {n}"));
        }
        parts.join(" → ")
    }
}

/// The rolls of `config`'s routers: every router (not itself new) with at least two replicas
/// whose resources the plan replaces some of, with those replicas in their order.
fn rolls(
    config: &Config,
    actions: &HashMap<&str, Action>,
    step_of: &HashMap<&str, usize>,
) -> Vec<Roll> {
    let mut out = Vec::new();
    for r in &config.resources {
        let Some(rolling) = r.kind.kind().rolling(&r.config) else {
            continue;
        };
        if matches!(actions.get(r.address.as_str()), Some(Action::Create)) {
            continue;
        }
        let replaced: Vec<(String, usize)> = rolling
            .replicas
            .iter()
            .filter_map(|(key, members)| {
                let step = members
                    .iter()
                    .filter(|m| actions.get(m.as_str()) == Some(&Action::Replace))
                    .filter_map(|m| step_of.get(m.as_str()).copied())
                    .min()?;
                Some((key.clone(), step))
            })
            .collect();
        if rolling.replicas.len() >= 2 && !replaced.is_empty() {
            out.push(Roll {
                router: r.address.clone(),
                replicas: rolling.replicas.len(),
                replaced,
            });
        }
    }
    out
}

/// The resources of the replicas a roll replaces: while one of them is out, the others serve.
fn rolled_members(config: &Config, rolls: &[Roll]) -> HashSet<String> {
    let mut out = HashSet::new();
    for roll in rolls {
        let Some(r) = config.resource(&roll.router) else {
            continue;
        };
        let Some(rolling) = r.kind.kind().rolling(&r.config) else {
            continue;
        };
        for (key, _) in &roll.replaced {
            out.extend(rolling.replicas.get(key).into_iter().flatten().cloned());
        }
    }
    out
}

/// A new container's cache folder as the plan read it: warm (it holds what an earlier
/// container of the same image compiled) or cold, and the phases a warm one shortens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheUse {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The image ID the folder is keyed by; `None` when the node does not have the image yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    pub warm: bool,
    /// Whether the start whose time the state recorded found its folder warm.
    #[serde(default)]
    pub last_start_warm: bool,
    /// The `progress` phases a warm cache shortens, with what starts measured of each.
    pub skips: Vec<PhaseTimes>,
}

pub use crate::vocabulary::PhaseTimes;

impl CacheUse {
    /// Seconds to take off the recorded duration: what a warm folder saves when the recorded
    /// start was cold, added back (negative) when the recorded start was warm and this one is
    /// cold.
    pub fn saves(&self) -> f64 {
        let total: f64 = self.skips.iter().filter_map(PhaseTimes::saving).sum();
        match (self.warm, self.last_start_warm) {
            (true, false) => total,
            (false, true) => -total,
            _ => 0.0,
        }
    }
}

impl Impact {
    pub fn is_disruptive(&self) -> bool {
        !self.stopped.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stop {
    /// The step number, as the plan text numbers its actions (from 1).
    pub step: usize,
    pub address: String,
    pub kind: KindId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `replace` or `delete`.
    pub action: Action,
    /// What the step took the last time an apply ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_secs: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outage {
    /// `output.endpoint`, `probe.hello`: what stops answering.
    pub endpoints: Vec<String>,
    /// The first step that takes them down, and its resource.
    pub from_step: usize,
    pub cause: String,
    /// The probe whose pass brings them back, or, with no probe watching them, the replacement
    /// whose ready check does (`None` only when neither exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_step: Option<usize>,
    /// Seconds from the start of `from_step` until `until` passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_secs: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// When a step starts and ends, in seconds after the apply starts, if every step it waits for
/// has a recorded duration.
#[derive(Clone, Copy)]
struct Window {
    start: Option<f64>,
    end: Option<f64>,
}

fn disrupts(kind: KindId, action: Action) -> bool {
    matches!(action, Action::Replace | Action::Delete)
        && kind
            .kind()
            .description()
            .disruption(action == Action::Replace)
            .is_some()
}

pub fn compute(plan: &Plan, config: &Config, graph: &Graph, state: &State) -> Impact {
    let steps: Vec<&super::Change> = plan
        .changes
        .iter()
        .filter(|c| c.action.is_change())
        .collect();
    let step_of: HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, c)| (c.address.as_str(), i + 1))
        .collect();
    let actions: HashMap<&str, Action> = plan
        .changes
        .iter()
        .map(|c| (c.address.as_str(), c.action))
        .collect();
    let caches = cache_uses(config, state, &steps);
    let durations = Durations {
        state,
        caches: &caches,
    };
    let stopped = stopped_steps(&steps, &durations);
    let windows = step_windows(graph, &steps, &actions, &durations);
    // The checks whose pass says an endpoint answers again: a benchmark after them measures an
    // endpoint that already answers, and is no part of the outage.
    let names: Vec<&str> = steps
        .iter()
        .filter(|c| {
            c.kind.kind().description().lifecycle == Lifecycle::Runs && c.action == Action::Run
        })
        .filter(|c| {
            config
                .resource(&c.address)
                .is_none_or(|r| c.kind.kind().checking(&r.config).readiness)
        })
        .map(|c| c.address.as_str())
        .collect();
    let probes = Probes {
        ancestors: names.iter().map(|p| (*p, graph.ancestors(p))).collect(),
        names,
    };
    let rolls = rolls(config, &actions, &step_of);
    let rolled = rolled_members(config, &rolls);
    // A replica out of its router is no outage: the others answer meanwhile.
    let down: Vec<Stop> = stopped
        .iter()
        .filter(|s| !rolled.contains(&s.address))
        .cloned()
        .collect();
    let mut unavailable = outages(config, graph, &down, &probes, &step_of, &actions, &windows);
    let unmeasured = unmeasured_steps(graph, &steps, &unavailable, &probes, state);
    unavailable.sort_by_key(|o| (o.from_step, o.until_step.unwrap_or(usize::MAX)));
    let outage_secs = whole_outage(&unavailable, &windows);
    let engine_start_secs = outage_secs.and(engine_start(&stopped, &caches, state));
    let apply_secs = whole_apply(&windows);
    let keeps_running = keeps_running(config, state, &actions, &stopped);
    let soaks = steps
        .iter()
        .filter(|c| c.action == Action::Run)
        .filter_map(|c| {
            let config = &config.resource(&c.address)?.config;
            Some((c.address.clone(), c.kind.kind().checking(config).soak_secs?))
        })
        .collect();
    Impact {
        rolls,
        scales: scales(config, state, &actions),
        caches,
        soaks,
        stopped,
        unavailable,
        keeps_running,
        outage_secs,
        engine_start_secs,
        apply_secs,
        unmeasured: unmeasured.into_iter().map(String::from).collect(),
    }
}

/// The slowest own start (its kind's `Holds::start_secs`) of what the plan replaces, less what
/// a warm cache saves; `None` when none of them measured one.
fn engine_start(stopped: &[Stop], caches: &[CacheUse], state: &State) -> Option<f64> {
    stopped
        .iter()
        .filter(|s| s.action == Action::Replace)
        .filter_map(|s| {
            let r = state.resources.get(&s.address)?;
            let start = s.kind.kind().holds(&r.attributes).start_secs?;
            let saves = caches
                .iter()
                .find(|c| c.address == s.address)
                .map_or(0.0, CacheUse::saves);
            Some((start - saves).max(0.0))
        })
        .reduce(f64::max)
}

/// How long the last apply took for a resource's step.
fn recorded(state: &State, a: &str) -> Option<f64> {
    state.resources.get(a).and_then(|r| r.last_apply_secs)
}

/// The recorded durations, less what a warm cache skips.
struct Durations<'a> {
    state: &'a State,
    caches: &'a [CacheUse],
}

impl Durations<'_> {
    fn expected(&self, a: &str) -> Option<f64> {
        let saves = self
            .caches
            .iter()
            .find(|c| c.address == a)
            .map_or(0.0, CacheUse::saves);
        recorded(self.state, a).map(|d| (d - saves).max(0.0))
    }
}

/// The new objects (created or replaced) that reuse something on their node (a container's
/// warm cache folder), as their kind says (`Kind::reuse`).
fn cache_uses(config: &Config, state: &State, steps: &[&super::Change]) -> Vec<CacheUse> {
    steps
        .iter()
        .filter(|c| matches!(c.action, Action::Create | Action::Replace))
        .filter_map(|c| {
            let resource = config.resource(&c.address)?;
            let reuse = c.kind.kind().reuse(
                &resource.config,
                config.readings.kinds.get(&c.address),
                state.resources.get(&c.address).map(|r| &r.attributes),
            )?;
            Some(CacheUse {
                address: c.address.clone(),
                node: c.node.clone(),
                image_id: reuse.image_id,
                warm: reuse.warm,
                last_start_warm: reuse.last_start_warm,
                skips: reuse.skips,
            })
        })
        .collect()
}

/// The steps that stop something running (a replace or delete of a kind that disrupts).
fn stopped_steps(steps: &[&super::Change], durations: &Durations) -> Vec<Stop> {
    let state = durations.state;
    steps
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            // A stopped untracked copy (set aside by an interrupted apply) stops nothing.
            let runs = match &c.orphan {
                Some(o) => o.running,
                None => state.resources.contains_key(&c.address),
            };
            disrupts(c.kind, c.action) && runs
        })
        .map(|(i, c)| Stop {
            step: i + 1,
            address: c.address.clone(),
            kind: c.kind,
            node: c.node.clone(),
            action: c.action,
            // A deletion's duration is never recorded (its state entry goes with it).
            expected_secs: (c.action == Action::Replace)
                .then(|| durations.expected(&c.address))
                .flatten(),
        })
        .collect()
}

/// When each changed step starts and ends, from the recorded durations.
///
/// Steps wait for every deletion and for the changed steps behind them, through unchanged
/// resources too, as the executor orders them; a window is known when every duration on the
/// way is. A deletion's duration is never recorded, so any deletion makes them unknown.
fn step_windows<'g>(
    graph: &'g Graph,
    steps: &[&super::Change],
    actions: &HashMap<&str, Action>,
    durations: &Durations,
) -> HashMap<&'g str, Window> {
    let has_deletes = steps.iter().any(|c| c.action == Action::Delete);
    let base = if has_deletes { None } else { Some(0.0f64) };
    let node_of: HashMap<&str, NodeIndex> = graph
        .graph
        .node_indices()
        .map(|i| (graph.graph[i].as_str(), i))
        .collect();
    // When everything a resource waits for is done, and for a step when it starts and ends.
    let mut done: HashMap<&str, Option<f64>> = HashMap::new();
    let mut windows: HashMap<&str, Window> = HashMap::new();
    for address in graph.order() {
        let Some(&i) = node_of.get(address.as_str()) else {
            continue;
        };
        let address = graph.graph[i].as_str();
        let mut start = base;
        for p in graph.graph.neighbors_directed(i, Direction::Incoming) {
            let before = done.get(graph.graph[p].as_str()).copied().flatten();
            start = start.zip(before).map(|(s, e)| s.max(e));
        }
        let finish = match actions.get(address) {
            Some(a) if a.is_change() => {
                let end = start.zip(durations.expected(address)).map(|(s, d)| s + d);
                windows.insert(address, Window { start, end });
                end
            }
            _ => start,
        };
        done.insert(address, finish);
    }
    windows
}

/// The probes that run, with what each depends on.
struct Probes<'p> {
    names: Vec<&'p str>,
    ancestors: HashMap<&'p str, BTreeSet<String>>,
}

/// The endpoints (probes and outputs) that go down, grouped by the step that takes them down
/// and the probe (or replacement) that says they are back.
fn outages(
    config: &Config,
    graph: &Graph,
    stopped: &[Stop],
    probes: &Probes<'_>,
    step_of: &HashMap<&str, usize>,
    actions: &HashMap<&str, Action>,
    windows: &HashMap<&str, Window>,
) -> Vec<Outage> {
    let disrupted: HashMap<&str, usize> = stopped
        .iter()
        .map(|s| (s.address.as_str(), s.step))
        .collect();
    let ancestors = &probes.ancestors;
    // What each endpoint depends on and which of it goes down.
    let mut endpoints: Vec<(String, BTreeSet<String>)> = Vec::new();
    for p in &probes.names {
        endpoints.push((p.to_string(), ancestors[p].clone()));
    }
    for o in &config.outputs {
        let mut deps: BTreeSet<String> = o.deps.clone();
        for d in &o.deps {
            deps.extend(graph.ancestors(d));
        }
        endpoints.push((format!("output.{}", o.name), deps));
    }
    let mut groups: BTreeMap<(usize, String, Option<String>), Vec<String>> = BTreeMap::new();
    for (name, deps) in &endpoints {
        let causes: Vec<(&str, usize)> = deps
            .iter()
            .filter_map(|d| disrupted.get_key_value(d.as_str()))
            .map(|(a, step)| (*a, *step))
            .collect();
        let Some(&(first, first_step)) = causes.iter().min_by_key(|(_, step)| *step) else {
            continue;
        };
        // A probe endpoint (in a module or not; its kind says) is back when it passes itself.
        let until = if address::runs(name) {
            Some(name.clone())
        } else {
            // The last probe that depends on everything the output shows watches it.
            let direct: Option<&BTreeSet<String>> = config
                .outputs
                .iter()
                .find(|o| format!("output.{}", o.name) == *name)
                .map(|o| &o.deps);
            probes
                .names
                .iter()
                .filter(|p| direct.is_some_and(|d| !d.is_empty() && d.is_subset(&ancestors[*p])))
                .max_by_key(|p| step_of.get(**p))
                .map(|p| p.to_string())
                .or_else(|| {
                    // No probe watches it: back when the last replacement it waits for is ready.
                    causes
                        .iter()
                        .filter(|(c, _)| actions.get(*c) == Some(&Action::Replace))
                        .max_by_key(|(_, step)| *step)
                        .map(|(c, _)| c.to_string())
                })
        };
        groups
            .entry((first_step, first.to_string(), until))
            .or_default()
            .push(name.clone());
    }
    groups
        .into_iter()
        .map(|((from_step, cause, until), mut endpoints)| {
            endpoints.sort_by_key(|e| (!e.starts_with("output."), e.clone()));
            let expected_secs = until.as_deref().and_then(|u| {
                let (from, to) = (windows.get(cause.as_str())?, windows.get(u)?);
                Some(to.end? - from.start?)
            });
            Outage {
                until_step: until.as_deref().and_then(|u| step_of.get(u).copied()),
                endpoints,
                from_step,
                cause,
                until,
                expected_secs,
            }
        })
        .collect()
}

/// The steps the endpoints' returns wait for that have no recorded duration (and every
/// deletion): what makes the expected times unknown.
fn unmeasured_steps<'c>(
    graph: &Graph,
    steps: &[&'c super::Change],
    unavailable: &[Outage],
    probes: &Probes<'_>,
    state: &State,
) -> Vec<&'c str> {
    // Everything the returns of the endpoints wait for, each set walked once.
    let mut on_the_way: HashSet<String> = HashSet::new();
    let ends: BTreeSet<&str> = unavailable
        .iter()
        .filter_map(|o| o.until.as_deref())
        .collect();
    for u in ends {
        match probes.ancestors.get(u) {
            Some(set) => on_the_way.extend(set.iter().cloned()),
            None => on_the_way.extend(graph.ancestors(u)),
        }
        on_the_way.insert(u.to_string());
    }
    steps
        .iter()
        .filter(|c| {
            let waited = c.action == Action::Delete || on_the_way.contains(&c.address);
            waited && (c.action == Action::Delete || recorded(state, &c.address).is_none())
        })
        .map(|c| c.address.as_str())
        .collect()
}

/// From the first endpoint down to the last one back, when every window on the way is known.
fn whole_outage(unavailable: &[Outage], windows: &HashMap<&str, Window>) -> Option<f64> {
    if unavailable.is_empty() || unavailable.iter().any(|o| o.until.is_none()) {
        return None;
    }
    let starts: Option<Vec<f64>> = unavailable
        .iter()
        .map(|o| windows.get(o.cause.as_str()).and_then(|w| w.start))
        .collect();
    let ends: Option<Vec<f64>> = unavailable
        .iter()
        .map(|o| {
            o.until
                .as_deref()
                .and_then(|u| windows.get(u))
                .and_then(|w| w.end)
        })
        .collect();
    starts.zip(ends).map(|(s, e)| {
        e.iter().copied().fold(0.0, f64::max) - s.iter().copied().fold(f64::INFINITY, f64::min)
    })
}

/// From the first step's start to the last step's end, when every step's window is known.
fn whole_apply(windows: &HashMap<&str, Window>) -> Option<f64> {
    if windows.is_empty() {
        return None;
    }
    let mut first = f64::INFINITY;
    let mut last = 0.0f64;
    for w in windows.values() {
        first = first.min(w.start?);
        last = last.max(w.end?);
    }
    Some(last - first)
}

/// What keeps running while something stops: recorded resources of disruptable kinds that this
/// plan leaves running.
fn keeps_running(
    config: &Config,
    state: &State,
    actions: &HashMap<&str, Action>,
    stopped: &[Stop],
) -> Vec<Running> {
    if stopped.is_empty() {
        return Vec::new();
    }
    config
        .resources
        .iter()
        .filter(|r| r.kind.kind().description().service)
        .filter(|r| {
            state.resources.contains_key(&r.address)
                && matches!(
                    actions.get(r.address.as_str()),
                    None | Some(Action::NoOp) | Some(Action::Update)
                )
        })
        .map(|r| Running {
            address: r.address.clone(),
            node: r.node.clone(),
        })
        .collect()
}

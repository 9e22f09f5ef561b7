//! The interface of a resource kind, as the engine sees it, and the registry the kinds enter.
//!
//! A kind (its folder under `kinds/`) implements [`Kind`] on its own types; the engine uses it
//! as [`AnyKind`] (configurations and records as plans and the state hold them) and finds it by
//! its [`KindId`] through [`Registered`]. The kinds enter the registry themselves
//! (`kinds::register!`), so this room, and every engine room that asks it, imports no kind: the
//! kinds stand above the engine, never beside it.

pub mod address;
mod attributes;
mod configuration;

pub use attributes::Attributes;
pub use configuration::{late_decodes, Configuration};

use serde::{Deserialize, Serialize};

use crate::schema::BlockSpec;
use crate::vocabulary::{KindId, Lifecycle, OnDrift, PhaseTimes};

/// One kind's entry in the registry: its id, its pure half and the top-level block that
/// declares its resources. Each kind's folder makes its own (`kinds::register!`).
pub struct KindRegistration {
    pub id: KindId,
    pub kind: &'static dyn AnyKind,
    pub top_block: &'static BlockSpec,
}

/// The registry: every kind's [`KindRegistration`], gathered at link time from the kinds' folders.
#[linkme::distributed_slice]
pub static KINDS: [KindRegistration];

/// The registration of `id`. Every kind of `KindId::ALL` has one (the test
/// `every_kind_is_registered_once` guards it); one missing is a bug in the build, not input.
fn registration(id: KindId) -> &'static KindRegistration {
    match KINDS.iter().find(|r| r.id == id) {
        Some(r) => r,
        None => panic!(
            "resource kind `{}` is not registered: a bug in sparkform",
            id.as_str()
        ),
    }
}

impl Registered for KindId {
    fn kind(self) -> &'static dyn AnyKind {
        registration(self).kind
    }

    fn top_block(self) -> &'static BlockSpec {
        registration(self).top_block
    }
}

/// What the registry knows of a kind by its id: its pure half and the block that declares it.
pub trait Registered: Copy {
    /// The kind's pure half.
    fn kind(self) -> &'static dyn AnyKind;
    /// The top-level block that declares resources of the kind (`network` for attachments).
    fn top_block(self) -> &'static BlockSpec;
    /// `json` read as the kind's typed `Desired` and written again (see [`AnyKind::decode`]).
    fn typed_config(self, json: &serde_json::Value) -> Result<serde_json::Value, String> {
        self.kind().typed_config(json)
    }
    /// `json` as a configuration of the kind, decoded here, once: where a configuration enters
    /// the engine (a state's or a plan file's load, a plan's recorded form). One that is not
    /// the kind's (written by another version) stays untyped, and its hooks say so.
    fn configuration(self, json: serde_json::Value) -> Configuration {
        self.kind()
            .decode(json)
            .unwrap_or_else(|(json, _)| Configuration::untyped(json))
    }
}

/// The kind whose top-level block is `block`.
pub fn declared_by(block: &str) -> Option<KindId> {
    KindId::ALL
        .iter()
        .copied()
        .find(|k| k.top_block().kind == block)
}

/// A kind's desired configuration, typed (`kinds::<kind>::Desired`): what its lowering
/// produces, what its machine half works on, and, as serde's JSON, what plans diff, hash and
/// the state records. Its defaults live on the type, nowhere else.
pub trait DesiredConfig:
    Serialize + serde::de::DeserializeOwned + Clone + Sized + Send + Sync + 'static
{
    /// Read from a desired or recorded configuration of the kind.
    fn from_config(config: &serde_json::Value) -> Result<Self, String> {
        serde_json::from_value(config.clone()).map_err(|e| e.to_string())
    }
    /// As a resource's configuration.
    fn to_config(&self) -> serde_json::Value {
        // Serialising maps with string keys and plain fields cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// What the state keeps of a resource of a kind besides its configuration (the facts its
/// steps found: a container's ID, the MTU an interface had), typed, with the version of its
/// shape. Like OpenTofu's schema version and `UpgradeResourceState`: a record written under an
/// older version is upgraded when the state loads, so no kind reads an old shape.
pub trait RecordedFacts:
    Serialize + serde::de::DeserializeOwned + Default + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// The version of this shape, written beside each record (`schema_version`).
    const VERSION: u32 = 1;
    /// Bring the attributes of a record written under version `from` (0: before records had
    /// versions) to this version's shape; `Err` says why they cannot be.
    fn upgrade(
        _from: u32,
        _attributes: &mut std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// What a new object of a kind reuses on its node, as a plan's impact counts it: a container's
/// JIT cache folder, warm or not, and the start phases a warm one shortens with what the
/// recorded starts took of each.
#[derive(Debug, Clone, PartialEq)]
pub struct Reuse {
    /// The image ID the folder is keyed by; `None` when the node does not have the image yet.
    pub image_id: Option<String>,
    pub warm: bool,
    /// Whether the start whose time the state recorded found its folder warm.
    pub last_start_warm: bool,
    pub skips: Vec<PhaseTimes>,
}

/// What a recorded resource holds on its node, from its record: what the state records it by
/// there (a container's ID; `status`, `watch`, `import`), what its log said once it was ready
/// (`status`), and what deleting it leaves there by design (a container's cache folder, as a
/// plan names it; `destroy -purge-caches` removes it too, by the machine half's finalize).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holds {
    pub id: Option<String>,
    pub from_log: std::collections::BTreeMap<String, Vec<String>>,
    pub kept_on_delete: Option<String>,
    /// What its last run measured, by figure (a bench probe's throughput and latencies), as
    /// `status` shows it.
    pub measured: std::collections::BTreeMap<String, f64>,
    /// How long its last start took from its process's start to its readiness (an engine's own
    /// start): the share of a plan's expected outage that only a faster engine shortens.
    pub start_secs: Option<f64>,
}

/// The object a node's runtime keeps for a resource (a container): its name there, which
/// `sparkform logs` reads and an exec probe runs commands in, and the patterns of its log
/// that mean it failed, with their fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunsIn {
    pub name: String,
    pub fail_on_log: Vec<(String, String)>,
}

/// What an untracked object refresh found is to the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Untracked {
    /// How refresh knows it is this deployment's, as a plan's drift line says it.
    pub found_by: &'static str,
    /// Whether it is what the resource's desired configuration uses, so a plan keeps it
    /// instead of removing it (a verified copy of the wanted weights that a rollback kept,
    /// which the next apply takes up without fetching it again).
    pub wanted: bool,
}

impl Default for Untracked {
    fn default() -> Self {
        Untracked {
            found_by: "carries this deployment's labels",
            wanted: false,
        }
    }
}

/// How a kind that runs checks a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checking {
    /// Whether `verify` and `watch` run it when no `-target` names it (a bandwidth test that
    /// loads a serving deployment's fabric and GPUs runs only when named).
    pub unnamed: bool,
    /// How long, once it passed, it must keep passing before the apply goes on (a probe's
    /// `soak`); a plan's impact shows it.
    pub soak_secs: Option<u64>,
    /// Whether its pass says that an endpoint answers again, so a plan's expected outage ends
    /// there; a benchmark measures an endpoint that already answers, and a fabric test loads
    /// links, not an endpoint.
    pub readiness: bool,
}

impl Default for Checking {
    fn default() -> Self {
        Checking {
            unnamed: true,
            soak_secs: None,
            readiness: true,
        }
    }
}

/// Where a resource is found (each `None` where it has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The object its node's runtime keeps for it (a container): what `sparkform logs` reads
    /// and an exec probe runs commands in.
    pub runs_in: Option<RunsIn>,
    /// The HTTP endpoint it reaches (`sparkform tunnel`).
    pub reaches: Option<Reaches>,
    /// The address it gives its node on a network (an attachment's fabric address), which a
    /// URL's host may name.
    pub node_address: Option<String>,
    /// The network interface of its node it configures (an attachment's), which
    /// `sparkform nodes` looks for among the node's interfaces.
    pub interface: Option<ConfiguredInterface>,
    /// The nodes its steps reach besides its own, connected before an apply starts: a model's
    /// pull runs `serve` on the download node, a fabric test's ranks run on theirs.
    pub other_nodes: Vec<String>,
    /// Whether its steps go into the definitions' containers, on any of their nodes (a probe:
    /// an exec probe runs its command in one).
    pub enters_containers: bool,
}

/// A node's network interface as a resource configures it: its name and the MTU it sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredInterface {
    pub name: String,
    pub mtu: u32,
}

/// An HTTP endpoint a resource reaches (a probe's URL), as `sparkform tunnel` offers it: the
/// node it goes through, the URL as that node sees it, and the `Authorization` header it sends
/// (sensitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaches {
    pub via: String,
    pub url: String,
    pub authorization: Option<String>,
}

/// An upgrade's step: the fact recorded as `from` is now `to` (nothing when it is absent).
pub fn rename_fact(
    attributes: &mut std::collections::BTreeMap<String, serde_json::Value>,
    from: &str,
    to: &str,
) {
    if let Some(value) = attributes.remove(from) {
        attributes.insert(to.to_string(), value);
    }
}

/// Facts of a kind that records none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NoFacts {}

impl RecordedFacts for NoFacts {}

/// What a kind is, as data, like the schema OpenTofu asks of a provider: the engine reads it,
/// no kind computes it.
#[derive(Debug)]
pub struct Description {
    /// The block that declares a resource of the kind.
    pub block: &'static BlockSpec,
    /// Top-level attributes whose change the resource applies without being replaced.
    pub in_place: &'static [&'static str],
    /// Attributes whose maps a plan shows as one change rather than key by key.
    pub whole_attributes: &'static [&'static str],
    pub lifecycle: Lifecycle,
    pub on_drift: OnDrift,
    /// Whether it is a running service: a plan's impact lists the ones it stops and the ones
    /// that keep running.
    pub service: bool,
    /// How a plan's impact says what replacing and what removing one does to what runs;
    /// `None` when that interrupts nothing.
    pub disruption: Option<Disruption>,
    /// Whether refresh looks at the nodes the configuration puts it on even where the state
    /// records none, to find ones an interrupted apply left untracked.
    pub found_untracked: bool,
    /// Graphviz shape in `sparkform graph`.
    pub dot_shape: &'static str,
}

/// What replacing and what removing a resource does to what runs, as a plan says it.
#[derive(Debug)]
pub struct Disruption {
    pub replaced: &'static str,
    pub removed: &'static str,
}

impl Description {
    /// What replacing (`replaced`) or removing one does to what runs; `None`: nothing.
    pub fn disruption(&self, replaced: bool) -> Option<&'static str> {
        self.disruption
            .as_ref()
            .map(|d| if replaced { d.replaced } else { d.removed })
    }
}

/// A running service's disruption: it stops.
pub const STOPS: Disruption = Disruption {
    replaced: "is stopped and replaced",
    removed: "is stopped and removed",
};

/// The pure half of a resource kind: what plans, graphs and renderings need to know, on its
/// own types. The engine sees it through [`AnyKind`], which the registry makes of it.
pub trait Kind: Sync + 'static {
    /// Its desired configuration: what the lowering writes and the machine half works on.
    type Desired: DesiredConfig;
    /// What the state keeps of it besides the configuration.
    type Recorded: RecordedFacts;
    /// What it is, as data: its block, how it changes, lives and drifts, what replacing it
    /// interrupts, how `graph` draws it.
    const DESCRIPTION: Description;
    /// Why a change of `attribute` (one that forces replacement) replaces the resource, in the
    /// plan's header; `None` for the plain "`attribute` changes". Pure: the recorded and the
    /// desired configurations only.
    fn replace_reason(
        &self,
        _attribute: &str,
        _before: &Self::Desired,
        _after: &Self::Desired,
    ) -> Option<String> {
        None
    }
    /// What `sparkform.lock.hcl` keeps of a resource of the kind, from its configuration: the
    /// entry's block type, its label and its attributes (the kind's plan-time read takes them
    /// back through `ReadCx::lock`); `None` when the lock keeps nothing of it.
    fn lock_entry(
        &self,
        _desired: &Self::Desired,
    ) -> Option<(String, String, crate::lock_file::Entry)> {
        None
    }
    /// For a kind that runs (`Lifecycle::Runs`): when it runs and how long it must keep
    /// passing, from its configuration.
    fn checking(&self, _desired: &Self::Desired) -> Checking {
        Checking::default()
    }
    /// What an untracked object of the kind that refresh found (`orphan_id`: its id on its
    /// node) is to the resource at its address, whose desired configuration is `desired` when
    /// the definitions still have it.
    fn untracked(&self, _orphan_id: &str, _desired: Option<&Self::Desired>) -> Untracked {
        Untracked::default()
    }
    /// The image references a resource of the kind runs, from its configuration (what
    /// `sparkform nodes` looks up on the nodes and the lock file pins), each with what a lock
    /// file pins it to when `recorded` says what ran (its digest, else its ID).
    fn images(
        &self,
        _desired: &Self::Desired,
        _recorded: Option<&Self::Recorded>,
    ) -> Vec<(String, Option<String>)> {
        Vec::new()
    }
    /// Where it is found, from its configuration: the object its node's runtime keeps for it,
    /// the HTTP endpoint it reaches, the address it gives its node (`logs`, exec probes,
    /// `tunnel`).
    fn placement(&self, _desired: &Self::Desired) -> Placement {
        Placement::default()
    }
    /// What it holds on its node, from its record.
    fn holds(&self, _recorded: &Self::Recorded) -> Holds {
        Holds::default()
    }
    /// What it keeps on its node for a rollback once `desired` is applied over what the state
    /// recorded (`before`, `recorded`), and what that apply removes, as a plan says it (a
    /// model's earlier revisions and the disk they hold). `None`: nothing.
    fn kept_for_rollback(
        &self,
        _desired: &Self::Desired,
        _before: Option<&Self::Desired>,
        _recorded: &Self::Recorded,
    ) -> Option<String> {
        None
    }
    /// What a new object (created or replaced) would reuse on its node, from its configuration,
    /// what the kind's plan-time read found for it (`found`: `Readings::kinds`) and what the
    /// state recorded: what makes a replacement cheaper than the recorded one. `None`: nothing.
    fn reuse(
        &self,
        _desired: &Self::Desired,
        _found: Option<&serde_json::Value>,
        _recorded: Option<&Self::Recorded>,
    ) -> Option<Reuse> {
        None
    }
    /// Whether it puts replicas behind one endpoint, and which resources each is made of:
    /// a plan says how many serve at each step of a roll instead of an outage. A deliberate
    /// seam with one implementer (the router): the plan's impact asks it of every resource.
    fn rolling(&self, _desired: &Self::Desired) -> Option<Rolling> {
        None
    }
}

/// Replicas behind one endpoint: each replica's key with the addresses of the resources it is
/// made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rolling {
    pub replicas: std::collections::BTreeMap<String, Vec<String>>,
}

/// A state's attributes: a recorded resource's facts, and the engine's journal marks beside
/// them.
pub type AttributeMap = std::collections::BTreeMap<String, serde_json::Value>;

/// A kind's facts as a state's attributes.
pub fn facts_to_attributes<R: RecordedFacts>(facts: &R) -> AttributeMap {
    match serde_json::to_value(facts) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().collect(),
        _ => AttributeMap::new(),
    }
}

/// A state's attributes as a kind's facts (the engine's marks beside them are left out);
/// `Err` says what does not fit the shape.
pub fn facts_of<R: RecordedFacts>(attributes: &AttributeMap) -> Result<R, String> {
    let object: serde_json::Map<String, serde_json::Value> = attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    serde_json::from_value(serde_json::Value::Object(object)).map_err(|e| e.to_string())
}

/// `config` as `K`'s typed `Desired` (decoded where it was made; see [`Configuration::typed`]).
fn typed<K: Kind>(config: &Configuration) -> Result<K::Desired, String> {
    config.typed::<K::Desired>()
}

/// A kind as the engine uses it: the [`Kind`] with its configurations as the engine carries
/// them ([`Configuration`]) and its records as the state holds them. Every kind has it through
/// the blanket impl below, so no kind and no engine code reads a key.
pub trait AnyKind: Sync {
    fn description(&self) -> &'static Description;
    fn replace_reason(
        &self,
        attribute: &str,
        before: &Configuration,
        after: &Configuration,
    ) -> Option<String>;
    fn lock_entry(
        &self,
        config: &Configuration,
    ) -> Option<(String, String, crate::lock_file::Entry)>;
    fn checking(&self, config: &Configuration) -> Checking;
    fn untracked(&self, orphan_id: &str, config: Option<&Configuration>) -> Untracked;
    fn images(
        &self,
        config: &Configuration,
        attributes: Option<&Attributes>,
    ) -> Vec<(String, Option<String>)>;
    fn reuse(
        &self,
        config: &Configuration,
        found: Option<&serde_json::Value>,
        attributes: Option<&Attributes>,
    ) -> Option<Reuse>;
    fn holds(&self, attributes: &Attributes) -> Holds;
    /// `config` applied over the record of `recorded_config` and `attributes`.
    fn kept_for_rollback(
        &self,
        config: &Configuration,
        recorded_config: &Configuration,
        attributes: &Attributes,
    ) -> Option<String>;
    fn placement(&self, config: &Configuration) -> Placement;
    fn rolling(&self, config: &Configuration) -> Option<Rolling>;
    /// The version of the shape of its recorded facts.
    fn recorded_version(&self) -> u32;
    /// A record's attributes written under version `from`, brought to this version's shape
    /// and decoded as it, once (the record enters the engine here); the engine's marks beside
    /// the facts are kept as they are.
    fn upgrade_recorded(&self, from: u32, attributes: AttributeMap) -> Result<Attributes, String>;
    /// A record's attributes decoded as the kind's facts where they enter (a plan file's
    /// load): untyped where they are not the kind's.
    fn decode_facts(&self, attributes: AttributeMap) -> Attributes;
    /// `json` decoded as the kind's typed `Desired`, once, where a configuration enters (a
    /// state's or a plan file's load, a plan's recorded form); the JSON stays as it came.
    /// `Err`: it is not the kind's: the JSON back, and why.
    fn decode(&self, json: serde_json::Value)
        -> Result<Configuration, (serde_json::Value, String)>;
    /// `json` read as the kind's typed `Desired` and written again: what a lowering produced
    /// comes back unchanged (the tests check every example).
    fn typed_config(&self, json: &serde_json::Value) -> Result<serde_json::Value, String>;
}

impl<K: Kind> AnyKind for K {
    fn description(&self) -> &'static Description {
        &K::DESCRIPTION
    }
    fn replace_reason(
        &self,
        attribute: &str,
        before: &Configuration,
        after: &Configuration,
    ) -> Option<String> {
        let before = typed::<K>(before).ok()?;
        let after = typed::<K>(after).ok()?;
        Kind::replace_reason(self, attribute, &before, &after)
    }
    fn lock_entry(
        &self,
        config: &Configuration,
    ) -> Option<(String, String, crate::lock_file::Entry)> {
        Kind::lock_entry(self, &typed::<K>(config).ok()?)
    }
    fn checking(&self, config: &Configuration) -> Checking {
        typed::<K>(config)
            .map(|d| Kind::checking(self, &d))
            .unwrap_or_default()
    }
    fn untracked(&self, orphan_id: &str, config: Option<&Configuration>) -> Untracked {
        let desired = config.and_then(|c| typed::<K>(c).ok());
        Kind::untracked(self, orphan_id, desired.as_ref())
    }
    fn images(
        &self,
        config: &Configuration,
        attributes: Option<&Attributes>,
    ) -> Vec<(String, Option<String>)> {
        let Ok(desired) = typed::<K>(config) else {
            return Vec::new();
        };
        let recorded = attributes.and_then(|a| a.typed::<K::Recorded>().ok());
        Kind::images(self, &desired, recorded.as_ref())
    }
    fn reuse(
        &self,
        config: &Configuration,
        found: Option<&serde_json::Value>,
        attributes: Option<&Attributes>,
    ) -> Option<Reuse> {
        let desired = typed::<K>(config).ok()?;
        let recorded = attributes.and_then(|a| a.typed::<K::Recorded>().ok());
        Kind::reuse(self, &desired, found, recorded.as_ref())
    }
    fn holds(&self, attributes: &Attributes) -> Holds {
        attributes
            .typed::<K::Recorded>()
            .map(|r| Kind::holds(self, &r))
            .unwrap_or_default()
    }
    fn kept_for_rollback(
        &self,
        config: &Configuration,
        recorded_config: &Configuration,
        attributes: &Attributes,
    ) -> Option<String> {
        let desired = typed::<K>(config).ok()?;
        let before = typed::<K>(recorded_config).ok();
        let facts = attributes.typed::<K::Recorded>().ok()?;
        Kind::kept_for_rollback(self, &desired, before.as_ref(), &facts)
    }
    fn placement(&self, config: &Configuration) -> Placement {
        typed::<K>(config)
            .map(|d| Kind::placement(self, &d))
            .unwrap_or_default()
    }
    fn rolling(&self, config: &Configuration) -> Option<Rolling> {
        Kind::rolling(self, &typed::<K>(config).ok()?)
    }
    fn recorded_version(&self) -> u32 {
        <K::Recorded as RecordedFacts>::VERSION
    }
    fn upgrade_recorded(
        &self,
        from: u32,
        mut attributes: AttributeMap,
    ) -> Result<Attributes, String> {
        let current = <K::Recorded as RecordedFacts>::VERSION;
        if from > current {
            return Err(format!(
                "it was recorded in version {from} of the kind's shape, and this sparkform knows versions up to {current} (was the state written by a newer sparkform?)"
            ));
        }
        if from < current {
            K::Recorded::upgrade(from, &mut attributes)?;
        }
        let facts = facts_of::<K::Recorded>(&attributes)?;
        Ok(Attributes::decoded(attributes, facts))
    }
    fn typed_config(&self, json: &serde_json::Value) -> Result<serde_json::Value, String> {
        K::Desired::from_config(json).map(|d| d.to_config())
    }
    fn decode_facts(&self, attributes: AttributeMap) -> Attributes {
        match facts_of::<K::Recorded>(&attributes) {
            Ok(facts) => Attributes::decoded(attributes, facts),
            Err(_) => Attributes::untyped(attributes),
        }
    }
    fn decode(
        &self,
        json: serde_json::Value,
    ) -> Result<Configuration, (serde_json::Value, String)> {
        match K::Desired::from_config(&json) {
            Ok(d) => Ok(Configuration::decoded(json, d)),
            Err(e) => Err((json, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind enters the registry from its folder (`kinds::register!`), once: a kind named
    /// in `for_each_kind!` whose folder forgets its line fails here, not at a user's first plan.
    #[test]
    fn every_kind_is_registered_once() {
        for k in KindId::ALL {
            let entries: Vec<&KindRegistration> = KINDS.iter().filter(|r| r.id == *k).collect();
            assert_eq!(entries.len(), 1, "{k}: registrations");
        }
        assert_eq!(KINDS.len(), KindId::ALL.len());
    }

    #[test]
    fn kinds_keep_the_names_state_files_use() {
        for k in KindId::ALL {
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<KindId>(&json).unwrap(), *k);
        }
        assert_eq!(
            serde_json::to_string(&KindId::Attachment).unwrap(),
            "\"attachment\""
        );
    }

    #[test]
    fn an_unknown_kind_is_named_with_the_known_ones() {
        let e = serde_json::from_str::<KindId>("\"volume\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown resource kind `volume`"), "{e}");
        assert!(
            e.contains("attachment, container, fabric_test, model, probe"),
            "{e}"
        );
    }
}

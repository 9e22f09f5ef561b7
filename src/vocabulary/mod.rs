//! The words every layer shares about resources, below all of them: the kinds' names, how a
//! resource of a kind lives and what a plan does with its drift, which address lies under
//! which, the phases of a start. What a kind *does* is the kinds' (`kind::Registered` maps a
//! name to its folder); this room names, and imports nothing of the crate.

use serde::{Deserialize, Serialize};

/// Every resource kind, once, as `Variant => folder`: the folder under `src/kinds/` that holds
/// it, whose name is the kind's name in plans and state files. A new kind is its folder plus
/// one line here (with `#[cfg(...)]` before it when only some builds have it: the toy kind of
/// the crate's tests); `kind::Registered` maps each to its folder.
macro_rules! for_each_kind {
    ($then:ident) => {
        $then! {
            Attachment => attachment,
            Container => container,
            FabricTest => fabric_test,
            Model => model,
            Probe => probe,
            Router => router,
            #[cfg(test)] Toy => toy,
        }
    };
}
pub(crate) use for_each_kind;

macro_rules! define_kinds {
    ($($(#[$meta:meta])* $variant:ident => $module:ident,)*) => {
        /// A resource kind. Serialised as its name (`"container"`), as state files always had it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum KindId {
            $($(#[$meta])* $variant,)*
        }

        impl KindId {
            pub const ALL: &'static [KindId] = &[$($(#[$meta])* KindId::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($(#[$meta])* KindId::$variant => stringify!($module),)*
                }
            }
        }
    };
}
for_each_kind!(define_kinds);

impl KindId {
    pub fn parse(s: &str) -> Option<Self> {
        KindId::ALL.iter().copied().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for KindId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for KindId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for KindId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        KindId::parse(&name).ok_or_else(|| {
            let known: Vec<&str> = KindId::ALL.iter().map(|k| k.as_str()).collect();
            serde::de::Error::custom(format!(
                "unknown resource kind `{name}` (this sparkform knows {}; was the file written by a newer one?)",
                known.join(", ")
            ))
        })
    }
}

/// How a resource of a kind lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// It exists on a machine: created, updated in place or replaced, deleted.
    Converges,
    /// It changes nothing and runs: when it is new, when its configuration changes and when
    /// something upstream of it is created, updated or replaced (a probe).
    Runs,
}

/// What a plan does with a resource whose machine drifted from the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDrift {
    /// Apply it again in place (an address put back on an interface).
    Update,
    /// Make a new one (a container that stopped or was changed by hand).
    Replace,
    /// Nothing is observed.
    Ignore,
}

/// One phase of a start as the state recorded it from a cold folder and from a warm one (the
/// latest start of each). No warm start recorded: the phase is taken as skipped (0 s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_secs: Option<f64>,
}

impl PhaseTimes {
    /// Seconds a warm folder takes off the phase; `None` without a cold start recorded.
    pub fn saving(&self) -> Option<f64> {
        Some((self.cold_secs? - self.warm_secs.unwrap_or(0.0)).max(0.0))
    }
}

/// Whether `address` is `prefix` or lies under it: `module.qwen` holds
/// `module.qwen.container.rank0`; `container.rank` holds `container.rank["node2"]`.
pub fn address_within(address: &str, prefix: &str) -> bool {
    address == prefix
        || address
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// A container's `gpus`: `gpus = 2` or `gpus = "all"` (the container and fabric test kinds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Gpus {
    Count(u64),
    Named(String),
}

impl Gpus {
    /// Docker's GPU request count: -1 for all, `None` for none.
    pub fn request_count(&self) -> Option<i64> {
        match self {
            Gpus::Named(s) if s == "all" => Some(-1),
            Gpus::Count(n) => i64::try_from(*n).ok().filter(|n| *n > 0),
            Gpus::Named(_) => None,
        }
    }
}

/// The engine's journal marks, written into a record's attributes beside its kind's facts.
/// A create of a kind whose objects carry no label (an address on an interface) is recorded
/// before it starts, marked pending: an object a kill left on the machine is then this
/// deployment's (refresh sees it, plan adopts it, destroy removes it), never someone else's.
pub const MARK_PENDING: &str = "journal_pending";
/// A run's summary, the last time it passed (a probe's answer): what `status` shows.
pub const MARK_LAST_RUN: &str = "last_run";
/// A run (a probe) that started and has not finished: the next apply runs it again.
pub const MARK_RUN_STARTED: &str = "run_started";
/// The last run failed: `{"at": time, "error": text}`; plan says so.
pub const MARK_RUN_FAILED: &str = "last_failure";

/// Whether an attribute of a record is one of the engine's journal marks, not a fact.
pub fn is_journal_mark(key: &str) -> bool {
    [
        MARK_PENDING,
        MARK_LAST_RUN,
        MARK_RUN_STARTED,
        MARK_RUN_FAILED,
    ]
    .contains(&key)
}

//! Resource kinds: everything specific to one kind of resource lives in its folder
//! `kinds/<kind>/`. `mod.rs` there is the pure half (its block, its desired configuration and
//! checks, its policy for plans); `machine.rs` there is what it does on a machine. The rest of
//! sparkform asks [`KindId::kind`] (pure) or [`machine::machine`] and names no kind.
//!
//! This file and the pure halves do no I/O and import neither `hosts`, `apply`, `ops` nor a
//! machine half (`tests/fake/layering.rs` checks it).

pub mod address;
pub mod attachment;
pub mod container;
pub(crate) mod lower;
pub mod machine;
pub mod model;
pub mod probe;
#[cfg(test)]
pub mod toy;

use serde::{Deserialize, Serialize};

use crate::schema::BlockSpec;

/// The registry: every resource kind, once, as `Variant => folder`. The folder's name is the
/// kind's name in plans and state files. A new kind is its folder plus one line here (with
/// `#[cfg(...)]` before it when only some builds have it: the toy kind of the crate's tests).
macro_rules! for_each_kind {
    ($then:ident) => {
        $then! {
            Attachment => attachment,
            Container => container,
            Model => model,
            Probe => probe,
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

            /// The kind's pure half.
            pub fn kind(self) -> &'static dyn Kind {
                match self {
                    $($(#[$meta])* KindId::$variant => &$module::KIND,)*
                }
            }

            /// The top-level block that declares resources of the kind (`network` for
            /// attachments).
            pub fn top_block(self) -> &'static BlockSpec {
                match self {
                    $($(#[$meta])* KindId::$variant => $module::TOP_BLOCK,)*
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

    /// The kind whose top-level block is `block`.
    pub fn declared_by(block: &str) -> Option<Self> {
        KindId::ALL
            .iter()
            .copied()
            .find(|k| k.top_block().kind == block)
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

/// The pure half of a resource kind: what plans, graphs and renderings need to know.
pub trait Kind: Sync {
    /// The block that declares a resource of this kind.
    fn block(&self) -> &'static BlockSpec;
    /// Top-level attributes whose change the resource applies without being replaced.
    fn in_place(&self) -> &'static [&'static str];
    /// Attributes whose maps a plan shows as one change rather than key by key.
    fn whole_attributes(&self) -> &'static [&'static str] {
        &[]
    }
    fn lifecycle(&self) -> Lifecycle {
        Lifecycle::Converges
    }
    fn on_drift(&self) -> OnDrift;
    /// Whether it is a running service: a plan's impact lists the ones it stops and the ones
    /// that keep running.
    fn disrupts_when_replaced(&self) -> bool {
        false
    }
    /// How a plan's impact says what replacing (`replaced`) or removing one does to what runs;
    /// `None` when that interrupts nothing.
    fn disruption(&self, replaced: bool) -> Option<&'static str> {
        self.disrupts_when_replaced().then_some(if replaced {
            "is stopped and replaced"
        } else {
            "is stopped and removed"
        })
    }
    /// Whether refresh looks at the nodes the configuration puts it on even where the state
    /// records none, to find ones an interrupted apply left untracked.
    fn found_untracked(&self) -> bool {
        false
    }
    /// Why a change of `attribute` (one that forces replacement) replaces the resource, in the
    /// plan's header; `None` for the plain "`attribute` changes". Pure: the recorded and the
    /// desired configurations only.
    fn replace_reason(
        &self,
        _attribute: &str,
        _before: &serde_json::Value,
        _after: &serde_json::Value,
    ) -> Option<String> {
        None
    }
    /// Graphviz shape in `sparkform graph`.
    fn dot_shape(&self) -> &'static str;
}

/// A problem with one attribute's value, found while building the desired configuration.
#[derive(Debug, Clone)]
pub struct Problem {
    pub block: &'static str,
    pub attribute: &'static str,
    pub message: String,
    pub help: String,
}

impl Problem {
    pub fn new(
        attribute: &'static str,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> Self {
        Problem {
            block: "",
            attribute,
            message: message.into(),
            help: help.into(),
        }
    }
}

/// An HCL value as JSON, for desired configurations.
pub fn to_json(v: &hcl::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(e.contains("attachment, container, model, probe"), "{e}");
    }
}

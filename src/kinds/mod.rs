//! Resource kinds: everything specific to one kind of resource lives in its folder
//! `kinds/<kind>/`. `mod.rs` there is the pure half (its block, its desired configuration and
//! checks, its policy for plans); `machine.rs` there is what it does on a machine. The rest of
//! sparkform asks [`KindId::kind`] (pure) or [`machine::machine`] and names no kind.
//!
//! This file and the pure halves do no I/O and import neither `hosts`, `apply`, `ops` nor a
//! machine half (`tests/fake/layering.rs` checks it).

pub mod attachment;
pub mod container;
pub mod fabric_test;
pub(crate) mod lower;
pub mod machine;
pub mod model;
pub mod probe;
pub mod router;
#[cfg(test)]
pub mod toy;

/// Enter a kind into the registry (and its lowering into the evaluation's): one line in its
/// folder's `mod.rs`, `register!(Container, KIND, TOP_BLOCK, lower::lower);`.
macro_rules! register {
    ($variant:ident, $kind:expr, $top_block:expr, $lower:path) => {
        #[linkme::distributed_slice($crate::kind::KINDS)]
        static REGISTRATION: $crate::kind::KindRegistration = $crate::kind::KindRegistration {
            id: $crate::vocabulary::KindId::$variant,
            kind: &$kind,
            top_block: $top_block,
        };
        #[linkme::distributed_slice($crate::config::lowering::LOWERINGS)]
        static LOWERING: $crate::config::lowering::LoweringRegistration =
            $crate::config::lowering::LoweringRegistration {
                id: $crate::vocabulary::KindId::$variant,
                lower: $lower,
            };
    };
}
pub(crate) use register;

/// A list of texts as evaluated: an element the first evaluation cannot know yet (a node fact
/// the read phase fills) is `null`, kept so the configuration reads back as it was written;
/// what runs takes the [`known`] ones.
pub type Texts = Vec<Option<String>>;

/// The elements of a [`Texts`] that are known.
pub fn known(list: &[Option<String>]) -> Vec<String> {
    list.iter().flatten().cloned().collect()
}

/// The HTTP status a check wants: `status`, else 200 (a ready check's and a probe's).
pub fn wanted_status(status: Option<&serde_json::Number>) -> u16 {
    status
        .and_then(serde_json::Number::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(200)
}

/// The exit code a check wants: `exit_code`, else 0.
pub fn wanted_exit_code(code: Option<&serde_json::Number>) -> i64 {
    code.and_then(serde_json::Number::as_i64).unwrap_or(0)
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

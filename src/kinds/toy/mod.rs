//! A toy kind that proves the kind seam, registered only in the crate's own tests
//! (`#[cfg(test)]` in `for_each_kind!`): a `toy` block on a node, whose greeting the kind reads
//! from the node at plan time (`Machine::read`) and its resource carries. It leaves nothing on
//! a machine. Nothing outside this folder and its registration line names it.

pub(crate) mod lower;
pub mod machine;

use crate::kind::Kind;
use crate::schema::{self, req, spec, BlockSpec};
use crate::vocabulary::OnDrift;

/// The block that declares it.
pub static TOY: BlockSpec = spec(
    "toy",
    &["name"],
    &[req("node", schema::ValueType::Node)],
    &[],
);

/// Its desired configuration: the node and what the read phase found there.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Desired {
    pub node: String,
    pub greeting: serde_json::Value,
}

impl crate::kind::DesiredConfig for Desired {}

/// What the state keeps of a toy: the greeting it last said. Version 2 of the shape: version 1
/// called it `greeting`, and a record of it is upgraded when the state loads.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub said: Option<String>,
}

impl crate::kind::RecordedFacts for Recorded {
    const VERSION: u32 = 2;
    fn upgrade(
        from: u32,
        attributes: &mut std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Result<(), String> {
        if from < 2 {
            crate::kind::rename_fact(attributes, "greeting", "said");
        }
        Ok(())
    }
}

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &TOY;

pub struct Toy;
pub static KIND: Toy = Toy;
super::register!(Toy, KIND, TOP_BLOCK, lower::lower);

impl Kind for Toy {
    type Desired = Desired;
    type Recorded = Recorded;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &TOY,
        in_place: &["greeting"],
        whole_attributes: &[],
        lifecycle: crate::vocabulary::Lifecycle::Converges,
        on_drift: OnDrift::Ignore,
        service: false,
        disruption: None,
        found_untracked: false,
        dot_shape: "box",
    };
    /// Its log is the node's `/var/log/toy.log`.
    fn placement(&self, _desired: &Desired) -> crate::kind::Placement {
        crate::kind::Placement {
            runs_in: Some(crate::kind::RunsIn {
                name: "toy".into(),
                fail_on_log: Vec::new(),
            }),
            ..Default::default()
        }
    }
}

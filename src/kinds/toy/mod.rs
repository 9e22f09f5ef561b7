//! A toy kind that proves the kind seam, registered only in the crate's own tests
//! (`#[cfg(test)]` in `for_each_kind!`): a `toy` block on a node, whose greeting the kind reads
//! from the node at plan time (`Machine::read`) and its resource carries. It leaves nothing on
//! a machine. Nothing outside this folder and its registration line names it.

pub(crate) mod lower;
pub mod machine;

use super::{Kind, OnDrift};
use crate::schema::{self, req, spec, BlockSpec};

/// The block that declares it.
pub static TOY: BlockSpec = spec("toy", &["name"], &[req("node", schema::Kind::Node)], &[]);

/// Its desired configuration: the node and what the read phase found there.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Desired {
    pub node: String,
    pub greeting: serde_json::Value,
}

impl super::DesiredConfig for Desired {}

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &TOY;

pub struct Toy;
pub static KIND: Toy = Toy;

impl Kind for Toy {
    fn block(&self) -> &'static BlockSpec {
        &TOY
    }
    fn in_place(&self) -> &'static [&'static str] {
        &["greeting"]
    }
    fn on_drift(&self) -> OnDrift {
        OnDrift::Ignore
    }
    fn dot_shape(&self) -> &'static str {
        "box"
    }
}

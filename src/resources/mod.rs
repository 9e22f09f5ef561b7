//! One file per resource kind: what its desired configuration looks like, which values are
//! valid, and which attribute changes can be applied in place rather than by replacement.

pub mod attachment;
pub mod container;
pub mod probe;

use crate::config::ResourceKind;

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

/// Top-level attributes whose change the resource can apply without being replaced.
pub fn in_place_attributes(kind: ResourceKind) -> &'static [&'static str] {
    match kind {
        ResourceKind::Attachment => attachment::IN_PLACE,
        ResourceKind::Container => container::IN_PLACE,
        ResourceKind::Probe => probe::IN_PLACE,
    }
}

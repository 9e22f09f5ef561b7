//! The container runtime the kinds share, below them and above `hosts` (which reaches the
//! Docker socket): a command in a running container and its log (`exec`), a one-shot helper
//! container run to its end (`one_shot`), what a node's engine says of an image reference
//! (`image`). No kind imports another kind's internals for these.

pub mod exec;
pub mod image;
pub mod one_shot;
pub mod spec;

//! sparkform: deploy multi-node LLM inference clusters from HCL definitions.
//!
//! `config` → `graph` → `plan` are pure (they read only the definitions and the state);
//! see ARCHITECTURE.md for the code map and the invariants.

pub mod apply;
pub mod cli;
pub mod config;
pub mod diag;
pub mod events;
pub mod fmt;
pub mod graph;
pub mod hosts;
pub mod http;
pub mod inspect;
pub mod kind;
pub mod kinds;
pub mod lock_file;
pub mod log;
pub mod observe;
pub mod ops;
pub mod plan;
pub mod runtime;
pub mod schema;
pub mod secrets;
pub mod state;
pub mod tasks;
pub mod ui;
pub mod vocabulary;
pub mod workspace;

// The library's own unit tests use the test kit's nodes in memory, compiled into the unit-test
// build from the kit's source: the kit's crate links the library built without `cfg(test)`,
// whose `Host` is another type than this build's. `sparkform::` in the kit's source names this
// crate here. No other build has them (tests/fake/layering.rs).
#[cfg(test)]
extern crate self as sparkform;
// The kit's whole interface, of which the unit tests use a part.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../testkit/src/fake.rs"]
mod fake;
#[cfg(test)]
#[allow(dead_code)]
#[path = "../testkit/src/fake_docker.rs"]
mod fake_docker;

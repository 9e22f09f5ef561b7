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
pub mod kinds;
pub mod lockfile;
pub mod ops;
pub mod plan;
pub mod refresh;
pub mod schema;
pub mod secrets;
pub mod state;
pub mod tasks;
pub mod ui;
pub mod workspace;

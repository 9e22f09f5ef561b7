//! The command line as a user meets it, one test binary: the built `sparkform` run as a child
//! process (`CARGO_BIN_EXE_sparkform`) on definitions in temp folders, no testbed: exit codes,
//! messages, files written, where the deployment is found, a reader that goes away, sensitive
//! arguments, hostile definitions under memory and time limits. A file here is a module.

#[path = "../common/mod.rs"]
mod common;

mod bench_check;
mod broken_pipe;
mod cli;
mod cli_convention;
mod hostile;
mod lock_timeout;
mod module_source;
mod pg_state;
mod sensitive_args;
mod state_compat;
mod workspaces;

//! The library's integration tests, in this process, as one test binary (cargo links every test
//! binary with the whole library: one per area, not one per file): the pure layers
//! (configuration, plan, render, diagnostics, the layering and the language reference), the
//! executor, refresh, import and the operations on fake nodes and fake Docker Engines
//! (`sparkform_testkit::fake`, `sparkform_testkit::fake_docker`), and the testbed's stand-ins and the transfer program on
//! loopback. A file here is a module; its snapshots are `snapshots/fake__<module>__<name>.snap`.
//! A few tests here need the testbed too: they are `#[ignore]`d as those of `tests/on_testbed`
//! and take their file's turn on it in `common::testbed::testbed()`.

#[path = "../common/mod.rs"]
mod common;

mod attachment_race;
mod bench;
mod compat;
mod crash_consistency;
mod diagnostics;
mod ephemeral;
mod executor;
mod fabric_derived;
mod fabric_test;
mod fuzz;
mod generations;
mod import;
mod interrupt;
mod jit_cache;
mod keep_revisions;
mod keyed_hashes;
mod launchers;
mod layering;
mod llm_stack;
mod lost_state;
mod machine_faults;
mod missing_programs;
mod model_kind;
mod moved;
mod nccl_fact;
mod observed_facts;
mod ops;
mod pg_state;
mod plan_render;
mod plan_snapshots;
mod prepare;
mod properties;
mod real_engine_log;
mod reference;
mod rolling;
mod soak;
mod standins;
mod start_gate;
mod taint;
mod topology;
mod transfer;
mod typed_kinds;
mod verify;
mod watch;

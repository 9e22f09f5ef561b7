//! The tests that need the local multi-host testbed (`tests/testbed/testbed`), one test binary:
//! every test here is `#[ignore = "needs the testbed: …"]`, and `.ci/test` runs them with
//! `--include-ignored`. A file here is a module.
//!
//! They share one testbed (its nodes, container names, fabric addresses, the examples' model
//! cache), and run on it as when each file was its own test binary, which cargo ran one after
//! the other: the tests of one file may run beside each other, never beside a test of another
//! file on the same nodes. `common::testbed::testbed()`, which each of them calls first, gives
//! the first pair of nodes to one file at a time; `testbed_second_pair()` and
//! `testbed_third_pair()` give the second (sf-node3, sf-node4: the real engine's file, then
//! others) and the third (sf-node5, sf-node6) the same way, and `.ci/test` runs each pair's
//! files in a process of their own, beside each other.

#[path = "../common/mod.rs"]
mod common;

mod leftovers;
mod real_engine;
mod real_engine_replicas;
mod terminal;
mod testbed_apply;
mod testbed_apply_more;
mod testbed_chaos;
mod testbed_ephemeral;
mod testbed_fabric;
mod testbed_fabric_test;
mod testbed_faults;
mod testbed_hosts;
mod testbed_import;
mod testbed_interrupt;
mod testbed_jit_cache;
mod testbed_llm;
mod testbed_memory;
mod testbed_model;
mod testbed_model_serving;
mod testbed_moved;
mod testbed_mp;
mod testbed_operate;
mod testbed_parity;
mod testbed_progress;
mod testbed_rank_group;
mod testbed_refresh;
mod testbed_replicas;
mod testbed_sglang;
mod testbed_ssh_alias;
mod testbed_warm;
mod testbed_watch;

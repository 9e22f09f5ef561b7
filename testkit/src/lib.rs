//! sparkform's test support, in a crate of its own so that no build of the `sparkform` binary
//! can hold it: nodes in memory behind the `Host` trait ([`fake`]), a Docker Engine in memory
//! ([`fake_docker`]), and the crash harness's journal observer ([`chaos`]), which only this
//! crate's `sparkform-chaos` binary and the tests install. sparkform's tests take it as a
//! dev-dependency; `tests/fake/layering.rs` checks that nothing else does.

pub mod chaos;
pub mod fake;
pub mod fake_docker;

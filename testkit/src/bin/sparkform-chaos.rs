//! `sparkform` with the crash harness's journal observer installed (`bench/chaos`): the same
//! commands, and `SPARKFORM_CHAOS_KILL_AFTER` / `SPARKFORM_CHAOS_SKIP_JOURNAL` take effect.

fn main() -> std::process::ExitCode {
    sparkform_testkit::chaos::install();
    let code = sparkform::cli::main();
    sparkform::hosts::lifetime::shutdown();
    code
}

//! `sparkform graph`: the dependency graph as Graphviz DOT.

use std::process::ExitCode;

use clap::Args;

use super::prelude::ConfigArgs;
use crate::ops::definitions::Pins;

/// Print the resource dependency graph in DOT (pipe it to `dot -Tsvg`)
#[derive(Args, Debug)]
#[command(
    long_about = "Print the resources and their dependencies as a Graphviz DOT graph. Each rank is a \
level of steps that can run in parallel; boxes are containers, diamonds probes, the other shape \
fabric attachments.",
    after_help = "Example:\n  sparkform graph examples/qwen35-two-sparks | dot -Tsvg > graph.svg"
)]
pub struct GraphArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
}

pub fn run(args: GraphArgs) -> ExitCode {
    // The shapes and edges are the same whatever the kinds read at plan time.
    let defs = match args.config.definitions(false, Pins::Unresolved) {
        Ok(d) => d,
        Err(code) => return code,
    };
    print!("{}", defs.graph.to_dot());
    ExitCode::SUCCESS
}

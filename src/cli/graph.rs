//! `sparkform graph`: the dependency graph as Graphviz DOT.

use std::process::ExitCode;

use clap::Args;

use super::{report_diagnostics, ConfigArgs};
use crate::diag::Diagnostics;

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
    let vars = match args.config.var_inputs() {
        Ok(v) => v,
        Err(d) => {
            report_diagnostics(&Diagnostics(vec![*d]), false);
            return ExitCode::from(1);
        }
    };
    match args.config.workspace().load(&vars) {
        Ok((_, graph)) => {
            print!("{}", graph.to_dot());
            ExitCode::SUCCESS
        }
        Err(diags) => {
            report_diagnostics(&diags, false);
            ExitCode::from(1)
        }
    }
}

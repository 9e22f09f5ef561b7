//! `sparkform validate`: check the definitions without touching state or machines.

use std::process::ExitCode;

use clap::Args;

use super::prelude::{report_warnings, ConfigArgs};
use crate::ops::definitions::{Definitions, Pins};

const LONG_ABOUT: &str = "Check the definitions: syntax, references, types, required and unknown \
attributes, cycles, checks and variable validations, and values such as CIDR blocks, addresses \
and names. Every independent error is reported in one run. Reads no state and contacts no machine.

Functions available in expressions: cidrcontains, cidrhost, cidrnetmask, cidrsubnet, merge, \
concat, length, keys, values, lookup, contains, join, split, format, upper, lower, tostring, \
tonumber, tobool, min, max, sum, file, jsonencode, jsondecode and more (see README).";

/// Check the definitions for errors (no state, no machines)
#[derive(Args, Debug)]
#[command(long_about = LONG_ABOUT, after_help = "Example:\n  sparkform validate examples/qwen35-two-sparks\n  sparkform validate examples/testbed --json")]
pub struct ValidateArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the result and every diagnostic as JSON on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ValidateArgs) -> ExitCode {
    // Nothing is asked of the machines: what the kinds would read stays unread.
    match args.config.definitions(args.json, Pins::Unresolved) {
        Ok(Definitions { config, graph, .. }) => {
            if args.json {
                println!("{}", super::prelude::diagnostics_json(&config.warnings));
            } else {
                report_warnings(&config.warnings);
                println!(
                    "The configuration is valid: {} node{}, {} resource{} in {} step{}.",
                    config.nodes.len(),
                    if config.nodes.len() == 1 { "" } else { "s" },
                    config.resources.len(),
                    if config.resources.len() == 1 { "" } else { "s" },
                    graph.levels().len(),
                    if graph.levels().len() == 1 { "" } else { "s" },
                );
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

//! `sparkform destroy`: remove everything the state records, in reverse dependency order.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::apply::{execute, ExecArgs};
use crate::ops::apply::Source;

/// Remove every container and fabric address the state records
#[derive(Args, Debug)]
#[command(
    long_about = "Remove everything this deployment created, dependents first: containers are stopped and \
removed, the addresses sparkform added to fabric interfaces are taken off. Asks for confirmation \
unless -auto-approve. With -target, only those resources (and what depends on them is not touched).",
    after_help = "Example:\n  sparkform destroy examples/testbed -auto-approve"
)]
pub struct DestroyArgs {
    /// Folder holding the .hcl definitions
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub common: ExecArgs,
}

pub fn run(args: DestroyArgs) -> ExitCode {
    let ca = args.common.config_args(args.dir.clone());
    let Some((config, graph)) = super::apply::load(&ca, args.common.json) else {
        return ExitCode::from(1);
    };
    let ws = ca.workspace();
    execute(
        &args.common,
        &ws,
        &config,
        &graph,
        Source::Destroy {
            targets: args.common.target.clone(),
            exclude: args.common.exclude.clone(),
        },
    )
}

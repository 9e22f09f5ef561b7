//! `sparkform destroy`: remove everything the deployment owns (the state's records and what a
//! refresh finds carrying its labels), in reverse dependency order.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Args};

use super::apply::{execute, ExecArgs};
use crate::ops;
use crate::ops::apply::PlanSource;

/// Remove every container, fabric address and copy of weights the deployment owns
#[derive(Args, Debug)]
#[command(
    long_about = "Remove everything this deployment created, dependents first: containers are stopped and \
removed, the addresses sparkform added to fabric interfaces are taken off, the weights' copies \
are deleted (saying the space freed). Asks for confirmation unless -auto-approve. It looks at the \
machines first and removes also the containers carrying this deployment's labels that the state \
does not record (a run killed midway), and the snapshots of a `model` block's weights that \
sparkform verified in its cache folder beside a recorded copy but no longer records (a revision \
change killed before it removed the old one), listing each with its size; \
-refresh=false removes only what the state records. With -target, only those resources (and what \
depends on them is not touched). A container's cache folder (its `cache`) is kept for a later apply \
of the same image unless -purge-caches.",
    after_help = "Example:\n  sparkform destroy examples/testbed -auto-approve"
)]
pub struct DestroyArgs {
    /// Folder holding the .hcl definitions
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub common: ExecArgs,
    /// Look at the machines first, to remove also what carries this deployment's labels but
    /// the state does not record
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub refresh: bool,
    /// Remove also the containers' cache folders (compile and JIT artefacts), which a destroy
    /// keeps so that a later apply of the same image starts without compiling again
    #[arg(long = "purge-caches")]
    pub purge_caches: bool,
}

pub fn run(args: DestroyArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let ca = args.common.config_args(args.dir.clone());
    // Destroy removes what the state records (and what carries the deployment's labels): the
    // definitions only say how to reach the nodes, so nothing is read at plan time.
    let evaluated = match super::apply::load(&ca, args.common.json) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let ws = ca.workspace();
    execute(
        &args.common,
        &ws,
        evaluated,
        PlanSource::Destroy {
            targets: args.common.target.clone(),
            exclude: args.common.exclude.clone(),
            refresh: ops::ReadMode::refresh(args.refresh),
            purge_caches: args.purge_caches,
        },
        rt,
    )
}

//! `sparkform rollback`: put a known-good generation back, from what the state recorded.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::apply::{execute, ExecArgs};
use crate::ops::apply::PlanSource;

/// Put a known-good generation back, from what the state recorded
#[derive(Args, Debug)]
#[command(
    long_about = "Plan and apply a known-good generation (`sparkform history` lists them) from what \
the state recorded when it ran: every resource at the configuration it had then, and what that \
generation did not have destroyed. Without N, the newest generation before the one running now \
whose configuration differs from what runs (a restart by `watch --restart` records a generation \
that changes nothing, and is skipped). Neither the definitions of that time nor the hub is needed: the definitions on disk only say how \
to reach the nodes and give the values the state keeps as keyed hashes (each must hash to what \
the generation recorded, or the rollback is refused naming it) and the ephemeral ones it never \
keeps. Each container starts again from the image ID it ran then, also where its tag has moved \
on since (the plan says so, and names an image a node no longer has, with the fix); each model \
node takes the weights from the snapshots it keeps (keep_revisions), checked against the \
manifest recorded when they were downloaded; only a revision no node keeps needs the hub. The plan reads like any \
other and asks for confirmation unless -auto-approve; a rollback that fails is rolled back like any apply. Afterwards the definitions on disk differ from what \
runs, and the next `plan` says so.",
    after_help = "Examples:\n  sparkform history examples/testbed\n  sparkform rollback examples/testbed          # the last generation that differs from what runs\n  sparkform rollback examples/testbed 3 -auto-approve"
)]
pub struct RollbackArgs {
    /// Folder holding the .hcl definitions
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// The generation to put back [default: the newest before the one running now]
    #[arg(value_name = "N")]
    pub generation: Option<u64>,
    #[command(flatten)]
    pub common: ExecArgs,
}

pub fn run(mut args: RollbackArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    // `sparkform rollback 3` in the definitions' folder: a number that names no folder is N.
    if args.generation.is_none() && !args.dir.exists() {
        if let Some(n) = args.dir.to_str().and_then(|d| d.parse::<u64>().ok()) {
            args.generation = Some(n);
            args.dir = PathBuf::from(".");
        }
    }
    if !args.common.target.is_empty() || !args.common.exclude.is_empty() {
        eprintln!(
            "Error: a rollback puts a whole generation back; -target and -exclude do not apply"
        );
        return ExitCode::from(2);
    }
    let ca = args.common.config_args(args.dir.clone());
    let evaluated = match super::apply::load(&ca, args.common.json) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let ws = ca.workspace();
    execute(
        &args.common,
        &ws,
        evaluated,
        PlanSource::Generation {
            number: args.generation,
        },
        rt,
    )
}

//! `sparkform workspace list`: the states kept for one set of definitions, by workspace.

use std::process::ExitCode;

use clap::Subcommand;

use super::prelude::report_error;
use super::state::StateArgs;

/// The workspaces: other states of the same definitions
#[derive(Subcommand, Debug)]
pub enum WorkspaceCommand {
    /// List the workspaces, the one in use marked with `*`
    #[command(
        long_about = "List the workspaces of the definitions' state backend: with PostgreSQL, the rows of \
the `state` block's schema; with the local file, `default` (DIR/state/sparkform.json) and each \
DIR/state/workspaces/NAME/sparkform.json. A command uses the workspace that -workspace NAME (or \
SPARKFORM_WORKSPACE) names, else the `state` block's (PostgreSQL), else `default`: the same \
definitions deploy a second cluster (staging, a second pair of nodes chosen by -var) without an edit.",
        after_help = "Examples:\n  sparkform workspace list examples/testbed\n  sparkform apply examples/testbed -workspace staging -var 'nodes=[\"sf-node3\",\"sf-node4\"]'"
    )]
    List(StateArgs),
}

pub fn run(cmd: WorkspaceCommand) -> ExitCode {
    let WorkspaceCommand::List(args) = cmd;
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match crate::ops::workspace::list(&ws) {
        Ok(entries) => {
            for e in entries {
                let mark = if e.current { "*" } else { " " };
                let note = if e.has_state { "" } else { "  (no state yet)" };
                println!("{mark} {}{note}", e.name);
            }
            ExitCode::SUCCESS
        }
        Err(e) => report_error(e),
    }
}

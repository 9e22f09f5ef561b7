//! `sparkform force-unlock ID`: remove a state lock left by a process that died; a lock whose
//! holder still runs only with `-force`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::prelude::report_error;

/// Remove the state lock with this ID (after a crash)
#[derive(Args, Debug)]
#[command(
    long_about = "Remove the lock on the state, when the process that held it is gone and the lock was left \
behind. The ID is printed in the error of the command that found the state locked. A lock whose \
holder still holds it (an operation is running) is refused: removing it lets two writers in. \
-force removes it anyway.",
    after_help = "Example:\n  sparkform force-unlock 0b5e4c1a-6f0e-4d39-9a43-1fd5a2c0f6a1 examples/testbed"
)]
pub struct ForceUnlockArgs {
    /// The lock ID from the "state is locked" error
    pub id: String,
    /// Folder holding the .hcl definitions; its state is DIR/state/sparkform.json [default: .]
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Remove the lock even though the process holding it is still running
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub file: super::prelude::StateFile,
}

pub fn run(args: ForceUnlockArgs) -> ExitCode {
    let ws = match args.file.workspace(args.dir.as_deref()) {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match crate::ops::state::force_unlock(&ws, &args.id, args.force) {
        Ok(info) => {
            println!(
                "Removed the lock {} (held by PID {} on {} since {} for {}).",
                info.id, info.pid, info.host, info.started, info.operation
            );
            ExitCode::SUCCESS
        }
        Err(e) => report_error(e),
    }
}

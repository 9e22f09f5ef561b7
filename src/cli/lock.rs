//! `sparkform lock`: resolve what the definitions leave to the world and write
//! `sparkform.lock.hcl`.

use std::process::ExitCode;

use clap::Args;

use super::prelude::{report_warnings, ConfigArgs, ConnectArgs};
use crate::ops;

const LONG_ABOUT: &str = "Resolve every value the lock file pins (each model block's revision \
to its commit, size and file count, on its download node, as a plan does) and write \
sparkform.lock.hcl beside the definitions. Commit the file: plans then resolve a branch or tag \
to the locked commit until `plan -upgrade` (or this command) resolves it again, and \
`plan -refresh=false` works from the lock alone. apply writes it too. The state is neither read \
nor changed.";

/// Write sparkform.lock.hcl: what the definitions resolve to now
#[derive(Args, Debug)]
#[command(long_about = LONG_ABOUT, after_help = "Example:\n  sparkform lock examples/qwen35-two-sparks && git add examples/qwen35-two-sparks/sparkform.lock.hcl")]
pub struct LockArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub fn run(args: LockArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let evaluated = match args.config.evaluate(false) {
        Ok(e) => e,
        Err(code) => return code,
    };
    report_warnings(evaluated.warnings());
    let hosts = args.connect.options();
    let done = rt.block_on(super::prelude::with_notes(false, |events| async move {
        ops::lock::lock(evaluated, &hosts, &events).await
    }));
    match done {
        Ok(update) => {
            let changes = update.changes();
            if changes.is_empty() {
                println!("{} is up to date.", ops::lock_file::FILE);
            } else {
                println!("Wrote {}:", ops::lock_file::FILE);
                changes.iter().for_each(|c| println!("  {c}"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::prelude::report_op_error(e, false),
    }
}

//! `sparkform fmt`: rewrite .hcl files in the canonical layout, keeping comments.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::fmt::unified_diff;

/// Rewrite .hcl files in the canonical layout (comments kept)
#[derive(Args, Debug)]
#[command(
    long_about = "Normalise the layout of .hcl files: two-space indentation, aligned `=`, single blank \
lines, no trailing whitespace. Comments and string contents are kept exactly. With --check, change \
nothing: print the diff and exit 1 if any file is not formatted (for CI).",
    after_help = "Examples:\n  sparkform fmt examples/testbed\n  sparkform fmt --check -recursive .     # in CI"
)]
pub struct FmtArgs {
    /// Files or folders (default: the current folder)
    pub paths: Vec<PathBuf>,
    /// Change nothing; show the diff and exit 1 when a file needs formatting
    #[arg(long)]
    pub check: bool,
    /// Also print the diff when rewriting
    #[arg(long)]
    pub diff: bool,
    /// Descend into sub-folders
    #[arg(long)]
    pub recursive: bool,
}

pub fn run(args: FmtArgs) -> ExitCode {
    let req = crate::ops::fmt::FmtRequest {
        paths: if args.paths.is_empty() {
            vec![PathBuf::from(".")]
        } else {
            args.paths.clone()
        },
        recursive: args.recursive,
        write: !args.check,
    };
    let files = match crate::ops::fmt::fmt(&req) {
        Ok(f) => f,
        Err(missing) => {
            eprintln!("Error: {} does not exist", missing.display());
            return ExitCode::from(1);
        }
    };
    let mut failed = false;
    let mut unformatted = 0usize;
    for f in files {
        let shown = crate::diag::display_path(&f.path);
        let changed = f.changed();
        let (original, formatted) = match f.outcome {
            Ok(o) => o,
            Err(crate::ops::fmt::FmtFailure::Read(e)) => {
                eprintln!("Error: cannot read {shown}: {e}");
                failed = true;
                continue;
            }
            Err(crate::ops::fmt::FmtFailure::Parse(e)) => {
                eprintln!(
                    "{:?}",
                    miette::Report::new(e).wrap_err(format!("cannot format {shown}"))
                );
                failed = true;
                continue;
            }
        };
        if !changed {
            continue;
        }
        unformatted += 1;
        if args.check || args.diff {
            print!("{}", unified_diff(&shown, &original, &formatted));
        }
        if args.check {
            continue;
        }
        if let Some(e) = &f.write_error {
            eprintln!("Error: cannot write {shown}: {e}");
            failed = true;
            continue;
        }
        println!("{shown}");
    }
    if failed || (args.check && unformatted > 0) {
        if args.check && unformatted > 0 {
            eprintln!(
                "{unformatted} file{} not formatted; run `sparkform fmt` to fix.",
                if unformatted == 1 { " is" } else { "s are" }
            );
        }
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

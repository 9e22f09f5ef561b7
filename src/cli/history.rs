//! `sparkform history`: the known-good generations, newest first.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::prelude::report_error;
use crate::ops::history::{history, HistoryLine};

/// List the known-good generations: what each passing apply left running
#[derive(Args, Debug)]
#[command(
    long_about = "List the known-good generations the state keeps, newest first: every apply that \
ended with each step done and each probe passing records one (its number, when, who, a digest of \
the definitions, and every resource as the state recorded it). Each line says what changed from \
the generation before it: + an address added, - one removed, ~ one whose configuration changed, \
with the names of the settings that differ. The generation the state runs now is marked \
(current). The state keeps the last 10.",
    after_help = "Examples:\n  sparkform history examples/testbed\n  sparkform history examples/testbed --json | jq '.[0]'"
)]
pub struct HistoryArgs {
    /// Folder holding the .hcl definitions; its state is DIR/state/sparkform.json [default: .]
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub file: super::prelude::StateFile,
    /// Print JSON: an array of generations, newest first
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: HistoryArgs) -> ExitCode {
    let ws = match args.file.workspace(args.dir.as_deref()) {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    let entries = match history(&ws) {
        Ok(Some(e)) => e,
        Ok(None) => {
            eprintln!("{}, so there is no generation.", ws.nothing_applied());
            return ExitCode::from(1);
        }
        Err(e) => return report_error(e),
    };
    if args.json {
        match serde_json::to_string_pretty(&entries) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("Error: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    if entries.is_empty() {
        println!("No generation yet: an apply records one when every step and probe passes.");
        return ExitCode::SUCCESS;
    }
    for e in &entries {
        print!("{}", render(e));
    }
    ExitCode::SUCCESS
}

/// `#N  AT  BY  definitions HASH8  (current)` and one indented line per change.
fn render(e: &HistoryLine) -> String {
    let digest = e.definitions.trim_start_matches("sha256:");
    let mut out = format!(
        "#{}  {}  {}  definitions {}{}\n",
        e.number,
        e.at,
        e.by,
        &digest[..digest.len().min(12)],
        if e.current { "  (current)" } else { "" }
    );
    if e.changes.is_empty() {
        out.push_str("    no configuration changed (a replacement, or a probe's run)\n");
    }
    for c in &e.changes {
        out.push_str(&format!("    {}\n", c.line()));
    }
    out
}

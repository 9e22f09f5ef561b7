//! `sparkform show`: the recorded state, or a saved plan.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::report_error;
use crate::plan::planfile::PlanFile;
use crate::plan::render;

/// Show the recorded state, or a plan file made by `plan -out`
#[derive(Args, Debug)]
#[command(
    long_about = "Without FILE, show every resource of the recorded state with its attributes (sensitive \
values appear only as hashes there). With FILE, show the saved plan and the state it was made against.",
    after_help = "Examples:\n  sparkform show --dir examples/testbed\n  sparkform show testbed.plan\n  sparkform show testbed.plan --json"
)]
pub struct ShowArgs {
    /// A plan file from `plan -out`; without it, the state is shown
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub location: super::state::StateArgs,
    /// Print JSON on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ShowArgs) -> ExitCode {
    if let Some(file) = &args.file {
        let pf = match PlanFile::read(file) {
            Ok(p) => p,
            Err(e) => return report_error(e),
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&pf).unwrap_or_default());
        } else {
            println!(
                "Plan made {} by sparkform {} for {} against {}.\n",
                pf.created,
                pf.sparkform_version,
                pf.config_dir,
                match &pf.state_lineage {
                    Some(l) => format!("state {l} at serial {}", pf.state_serial),
                    None => "no state".into(),
                }
            );
            print!("{}", render::render(&pf.plan));
        }
        return ExitCode::SUCCESS;
    }
    let ws = args.location.workspace();
    match ws.state() {
        Err(e) => report_error(e),
        Ok(None) => {
            if args.json {
                println!("null");
            } else {
                println!(
                    "No state at {}: nothing has been applied.",
                    ws.state_path.display()
                );
            }
            ExitCode::SUCCESS
        }
        Ok(Some(state)) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&state).unwrap_or_default()
                );
                return ExitCode::SUCCESS;
            }
            println!(
                "State {} (serial {}, lineage {}), {} resource{}.",
                ws.state_path.display(),
                state.serial,
                state.lineage,
                state.resources.len(),
                if state.resources.len() == 1 { "" } else { "s" }
            );
            for (address, r) in &state.resources {
                println!(
                    "\n# {address} ({}{})",
                    r.kind,
                    r.node
                        .as_ref()
                        .map(|n| format!(" on {n}"))
                        .unwrap_or_default()
                );
                print!("{}", super::state::describe_resource(r));
            }
            if !state.outputs.is_empty() {
                println!("\nOutputs:");
                for (name, o) in &state.outputs {
                    let v = if o.sensitive {
                        "(sensitive)".to_string()
                    } else {
                        render::value(&o.value)
                    };
                    println!("  {name} = {v}");
                }
            }
            ExitCode::SUCCESS
        }
    }
}

//! `sparkform show`: the recorded state, or a saved plan.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::prelude::report_error;
use crate::plan::render;

/// Show the recorded state of a deployment, or a plan file made by `plan -out`
#[derive(Args, Debug)]
#[command(
    long_about = "Given a folder (the current one by default), show every resource of its recorded \
state with its attributes (sensitive values appear only as hashes there). Given a plan file, show \
the saved plan and the state it was made against.",
    after_help = "Examples:\n  sparkform show examples/testbed\n  sparkform show testbed.plan\n  sparkform show testbed.plan --json"
)]
pub struct ShowArgs {
    /// The deployment's folder (its state is PATH/state/sparkform.json), or a plan file from
    /// `plan -out` [default: .]
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub file: super::prelude::StateFile,
    /// Print JSON on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ShowArgs) -> ExitCode {
    if let Some(path) = &args.path {
        if !path.is_dir() && !path.is_file() {
            eprintln!(
                "Error: {} is neither a folder nor a plan file.\n  help: give the deployment's folder (`sparkform show examples/testbed`) or a file from `sparkform plan -out FILE` (`sparkform show testbed.plan`)",
                path.display()
            );
            return ExitCode::from(1);
        }
    }
    if let Some(file) = args.path.as_ref().filter(|p| p.is_file()) {
        let pf = match crate::ops::plan::saved(file) {
            Ok(p) => p,
            Err(e) => return report_error(e),
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&pf).unwrap_or_default());
        } else {
            println!(
                "{} made {} by sparkform {} for {} against {}.\n",
                if pf.destroy { "Destroy plan" } else { "Plan" },
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
    let ws = match args.file.workspace(args.path.as_deref()) {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match crate::ops::state::recorded(&ws) {
        Err(e) => report_error(e),
        Ok(None) => {
            if args.json {
                println!("null");
            } else {
                println!("{}.", ws.nothing_applied());
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

//! `sparkform output`: the outputs recorded by the last apply.

use std::process::ExitCode;

use clap::Args;

use super::report_error;
use crate::plan::render;

/// Print the outputs recorded by the last apply
#[derive(Args, Debug)]
#[command(
    long_about = "Print the root module's outputs as recorded by the last apply. Sensitive outputs are \
stored only as hashes and print as (sensitive). With NAME, print that output's value alone (a \
string without quotes), for scripts.",
    after_help = "Examples:\n  sparkform output --dir examples/testbed\n  curl \"$(sparkform output endpoint --dir examples/testbed)/v1/models\""
)]
pub struct OutputArgs {
    /// Print only this output
    pub name: Option<String>,
    #[command(flatten)]
    pub location: super::state::StateArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: OutputArgs) -> ExitCode {
    let ws = args.location.workspace();
    let state = match ws.state() {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!(
                "No state at {}: nothing has been applied, so there are no outputs.",
                ws.state_path.display()
            );
            return ExitCode::from(1);
        }
        Err(e) => return report_error(e),
    };
    if let Some(name) = &args.name {
        let Some(o) = state.outputs.get(name) else {
            let known: Vec<&str> = state.outputs.keys().map(String::as_str).collect();
            eprintln!(
                "Error: no output named {name:?}{}",
                if known.is_empty() {
                    ". The state has no outputs.".to_string()
                } else {
                    format!("; outputs: {}", known.join(", "))
                }
            );
            return ExitCode::from(1);
        };
        if o.sensitive {
            eprintln!("Error: output {name:?} is sensitive; sparkform keeps only its hash.");
            return ExitCode::from(1);
        }
        match (&o.value, args.json) {
            (serde_json::Value::String(s), false) => println!("{s}"),
            (v, _) => println!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
        }
        return ExitCode::SUCCESS;
    }
    if args.json {
        let doc: serde_json::Map<String, serde_json::Value> = state
            .outputs
            .iter()
            .map(|(k, o)| (k.clone(), serde_json::json!({ "value": if o.sensitive { serde_json::Value::Null } else { o.value.clone() }, "sensitive": o.sensitive })))
            .collect();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if state.outputs.is_empty() {
        println!("No outputs.");
    }
    for (name, o) in &state.outputs {
        let v = if o.sensitive {
            "(sensitive)".to_string()
        } else {
            render::value(&o.value)
        };
        println!("{name} = {v}");
    }
    ExitCode::SUCCESS
}

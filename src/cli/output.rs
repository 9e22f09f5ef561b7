//! `sparkform output`: the outputs recorded by the last apply.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::prelude::report_error;
use crate::plan::render;

/// Print the outputs recorded by the last apply
#[derive(Args, Debug)]
#[command(
    long_about = "Print the root module's outputs as recorded by the last apply. Sensitive outputs are \
stored only as hashes and print as (sensitive). With NAME, print that output's value alone (a \
string without quotes), for scripts; with -raw, as Terraform's `output -raw`: a string, number or \
bool exactly, with no newline after it (a list or map is refused: -json prints those). Given one argument, a folder (a path with a `/`, `.`, or a \
folder holding .hcl files) is DIR and anything else NAME.",
    after_help = "Examples:\n  sparkform output examples/testbed\n  curl \"$(sparkform output endpoint examples/testbed)/v1/models\"\n  sparkform output -raw endpoint examples/testbed > endpoint.txt"
)]
pub struct OutputArgs {
    /// Print only this output
    pub name: Option<String>,
    /// Folder holding the .hcl definitions; its state is DIR/state/sparkform.json [default: .]
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub file: super::prelude::StateFile,
    /// Print JSON
    #[arg(long, conflicts_with = "raw")]
    pub json: bool,
    /// With NAME: its value exactly, no quotes and no newline (a string, number or bool)
    #[arg(long, requires = "name")]
    pub raw: bool,
}

/// Output names are identifiers, so an argument with a `/` or a dot, or a folder of
/// definitions, can only have been meant as the folder.
fn is_folder(arg: &str) -> bool {
    let path = Path::new(arg);
    arg.contains('/')
        || arg.starts_with('.')
        || std::fs::read_dir(path).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "hcl"))
        })
}

pub fn run(mut args: OutputArgs) -> ExitCode {
    if args.dir.is_none() && args.name.as_deref().is_some_and(is_folder) {
        args.dir = args.name.take().map(PathBuf::from);
    }
    let ws = match args.file.workspace(args.dir.as_deref()) {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    let state = match crate::ops::state::recorded(&ws) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("{}, so there are no outputs.", ws.nothing_applied());
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
        if args.raw {
            return print_raw(name, &o.value);
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

/// `output -raw NAME`: a string, number or bool as it is, with no newline after it; anything
/// else refused (exit 1), as Terraform does.
fn print_raw(name: &str, value: &serde_json::Value) -> ExitCode {
    use std::io::Write;
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        other => {
            let what = match other {
                serde_json::Value::Array(_) => "a list",
                serde_json::Value::Object(_) => "a map",
                _ => "null",
            };
            eprintln!(
                "Error: output {name:?} is {what}, which -raw cannot print as it is\n  help: `sparkform output -json {name}` prints it as JSON"
            );
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

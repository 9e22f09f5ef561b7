//! `sparkform state list|show`: read the recorded state.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::report_error;
use crate::plan::render;
use crate::state::ResourceState;
use crate::workspace::Workspace;

/// Read the recorded state
#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// List the addresses of every recorded resource
    #[command(after_help = "Example:\n  sparkform state list examples/testbed")]
    List(StateArgs),
    /// Show one recorded resource with its attributes
    #[command(
        after_help = "Example:\n  sparkform state show 'module.qwen.container.vllm' examples/testbed"
    )]
    Show {
        /// Resource address, as `state list` prints it
        address: String,
        #[command(flatten)]
        args: StateArgs,
    },
}

#[derive(Args, Debug)]
pub struct StateArgs {
    /// Folder holding the .hcl definitions; its state is DIR/state/sparkform.json [default: .]
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub file: super::StateFile,
}

impl StateArgs {
    pub fn workspace(&self) -> Result<Workspace, ExitCode> {
        self.file.workspace(self.dir.as_deref())
    }
}

pub fn run(cmd: StateCommand) -> ExitCode {
    let (args, address) = match &cmd {
        StateCommand::List(a) => (a, None),
        StateCommand::Show { address, args } => (args, Some(address)),
    };
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    let state = match ws.state() {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("{}.", ws.nothing_applied());
            return if address.is_some() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
        Err(e) => return report_error(e),
    };
    match address {
        None => {
            for a in state.resources.keys() {
                println!("{a}");
            }
            ExitCode::SUCCESS
        }
        Some(a) => match state.resources.get(a) {
            Some(r) => {
                println!(
                    "# {a} ({}{})",
                    r.kind,
                    r.node
                        .as_ref()
                        .map(|n| format!(" on {n}"))
                        .unwrap_or_default()
                );
                print!("{}", describe_resource(r));
                ExitCode::SUCCESS
            }
            None => {
                let hint = crate::diag::did_you_mean(a, state.resources.keys().map(String::as_str))
                    .map(|s| format!(" Did you mean {s}?"))
                    .unwrap_or_else(|| " `sparkform state list` prints the addresses.".into());
                eprintln!("Error: no resource {a} in the state.{hint}");
                ExitCode::from(1)
            }
        },
    }
}

/// Attributes of a recorded resource, one per line.
pub fn describe_resource(r: &ResourceState) -> String {
    let mut out = String::new();
    let mut lines: Vec<(String, String)> = Vec::new();
    if let Some(obj) = r.config.as_object() {
        for (k, v) in obj {
            lines.push((k.clone(), render::value(v)));
        }
    }
    for (k, v) in &r.attributes {
        lines.push((format!("[live] {k}"), render::value(v)));
    }
    lines.push(("config_hash".into(), r.config_hash.clone()));
    if !r.depends_on.is_empty() {
        lines.push(("depends_on".into(), r.depends_on.join(", ")));
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in lines {
        out.push_str(&format!("  {k:width$} = {v}\n"));
    }
    out
}

//! `sparkform state list|show|pull|push|migrate|mv|rm`: read the recorded state, move it as it
//! is, or re-address and forget its records.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::prelude::{report_error, report_op_error};
use crate::ops;
use crate::plan::render;
use crate::state::ResourceState;
use crate::workspace::Workspace;

/// Read the recorded state, move it as it is, or re-address and forget its records
#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// Print the state document (decrypted when it is encrypted) to stdout
    #[command(after_help = "Example:\n  sparkform state pull examples/testbed > backup.json")]
    Pull(StateArgs),
    /// Replace the state with the document in FILE (as `state pull` prints it)
    #[command(
        long_about = "Replace the state with the document in FILE, byte for byte, holding the state lock. \
Refused when the state there has another lineage (another deployment's) or a newer serial, unless -force.",
        after_help = "Example:\n  sparkform state push backup.json examples/testbed"
    )]
    Push {
        /// The state document to write
        file: PathBuf,
        /// Write it even over another lineage or a newer serial
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        args: StateArgs,
    },
    /// Move the state to PostgreSQL or back to the local file
    #[command(
        long_about = "Copy the state, byte for byte, from the other backend to the one named by --to: \
--to pg reads DIR/state/sparkform.json and writes the row of the `state` block's schema and workspace \
(the connection from SPARKFORM_PG_CONN); --to local the other way. Both locks are held; a target \
holding another deployment's state (another lineage) or a newer serial is refused. A local source \
file is renamed sparkform.json.migrated. Then set `backend` in the `state` block to match.",
        after_help = "Example:\n  SPARKFORM_PG_CONN='host=/run/postgresql dbname=sparkform' sparkform state migrate -to pg examples/testbed"
    )]
    Migrate {
        /// Where the state goes: `pg` or `local`
        #[arg(long, value_name = "BACKEND", value_parser = ["pg", "local"])]
        to: String,
        #[command(flatten)]
        args: StateArgs,
    },
    /// Record a resource (or a module's, or every instance's) at another address
    #[command(
        long_about = "Re-address what the state records at FROM (the resource, every instance of it, or everything under a module) to TO, holding the state lock. Nothing on the nodes changes. \
Rename the blocks in the definitions to match: a container whose name was derived from its old address is then replaced, unless the definitions give it that name; a `moved { from = FROM to = TO }` block does both at once and keeps derived names.",
        after_help = "Example:\n  sparkform state mv module.qwen module.qwen35 examples/testbed"
    )]
    Mv {
        /// The address the state records now
        from: String,
        /// The address to record it at
        to: String,
        #[command(flatten)]
        args: StateArgs,
    },
    /// Forget a resource (or a module's, or every instance's), leaving it running
    #[command(
        long_about = "Drop what the state records at ADDRESS (the resource, every instance of it, or everything under a module), holding the state lock, without touching the nodes: it runs on, unmanaged, and later plans neither destroy it nor take it for a lost record's leftover. \
Delete its block from the definitions too, or the next plan creates it anew; a `removed { from = ADDRESS lifecycle { destroy = false } }` block does both at once.",
        after_help = "Example:\n  sparkform state rm 'module.qwen.container.rank[\"node2\"]' examples/testbed"
    )]
    Rm {
        /// The address to forget, as `state list` prints it
        address: String,
        #[command(flatten)]
        args: StateArgs,
    },
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
    pub file: super::prelude::StateFile,
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
        StateCommand::Pull(args) => return pull(args),
        StateCommand::Push { file, force, args } => return push(args, file, *force),
        StateCommand::Migrate { to, args } => return migrate(args, to),
        StateCommand::Mv { from, to, args } => return move_records(args, from, to),
        StateCommand::Rm { address, args } => return forget(args, address),
    };
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    let state = match ops::state::recorded(&ws) {
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
    let Some(a) = address else {
        for a in state.resources.keys() {
            println!("{a}");
        }
        return ExitCode::SUCCESS;
    };
    match ops::state::resource(&state, a) {
        ops::state::Lookup::Found(r) => {
            println!(
                "# {a} ({}{})",
                r.kind,
                r.node
                    .as_ref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default()
            );
            print!("{}", describe_resource(&r));
            ExitCode::SUCCESS
        }
        ops::state::Lookup::Missing { did_you_mean } => {
            let hint = did_you_mean
                .map(|s| format!(" Did you mean {s}?"))
                .unwrap_or_else(|| " `sparkform state list` prints the addresses.".into());
            eprintln!("Error: no resource {a} in the state.{hint}");
            ExitCode::from(1)
        }
    }
}

fn pull(args: &StateArgs) -> ExitCode {
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match ops::state::pull(&ws) {
        Ok(Some(doc)) => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            match out.write_all(&doc).and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: cannot write the state to stdout: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Ok(None) => {
            eprintln!("Error: {}.", ws.nothing_applied());
            ExitCode::from(1)
        }
        Err(e) => report_error(e),
    }
}

fn push(args: &StateArgs, file: &std::path::Path, force: bool) -> ExitCode {
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match ops::state::push(&ws, file, force) {
        Ok(w) => {
            let m = &w.relocated;
            let was = m
                .replaced
                .map(|s| format!(" (it was at serial {s})"))
                .unwrap_or_default();
            println!(
                "Pushed {} to {}: serial {}, lineage {}, {} resources{was}.",
                file.display(),
                w.to,
                m.serial,
                m.lineage,
                m.resources
            );
            ExitCode::SUCCESS
        }
        Err(e) => report_op_error(e, false),
    }
}

fn migrate(args: &StateArgs, to: &str) -> ExitCode {
    use crate::config::backend::BackendKind;
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    let target = if to == "pg" {
        BackendKind::Pg
    } else {
        BackendKind::Local
    };
    match ops::state::migrate(&ws, target) {
        Ok(w) => {
            let m = &w.relocated;
            println!(
                "Migrated the state from {} to {}: serial {}, lineage {}, {} resources.",
                w.from.as_deref().unwrap_or_default(),
                w.to,
                m.serial,
                m.lineage,
                m.resources
            );
            if ws.backend_kind() != target {
                println!(
                    "Now set `backend = \"{}\"` in the definitions' `state` block: until then the commands refuse to run.",
                    target.name()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => report_op_error(e, false),
    }
}

fn move_records(args: &StateArgs, from: &str, to: &str) -> ExitCode {
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match ops::state::move_records(&ws, from, to) {
        Ok(moves) => {
            for (f, t) in &moves {
                println!("Moved {f} to {t}.");
            }
            println!(
                "{} record(s) moved; nothing on the nodes changed.",
                moves.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => report_op_error(e, false),
    }
}

fn forget(args: &StateArgs, address: &str) -> ExitCode {
    let ws = match args.workspace() {
        Ok(ws) => ws,
        Err(code) => return code,
    };
    match ops::state::forget(&ws, &[address.to_string()]) {
        Ok(gone) => {
            for a in &gone {
                println!("Removed {a} from the state; what runs of it was left running.");
            }
            println!("{} record(s) forgotten. Delete their blocks from the definitions too, or the next plan creates them anew.", gone.len());
            ExitCode::SUCCESS
        }
        Err(e) => report_op_error(e, false),
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
    for (k, v) in r.attributes.iter() {
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

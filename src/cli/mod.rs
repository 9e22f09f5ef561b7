//! The command line: one file per subcommand, each parsing its arguments and calling one
//! library operation. This module holds what they share.

// `println!` and friends panic when the reader of the pipe has gone; these drop the output
// instead (`out.rs`). Defined before the subcommands' modules so that they see them.
macro_rules! println {
    () => { $crate::cli::out::stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out::stdout(format_args!("{}\n", format_args!($($t)*))) };
}
macro_rules! print {
    ($($t:tt)*) => { $crate::cli::out::stdout(format_args!($($t)*)) };
}
macro_rules! eprintln {
    () => { $crate::cli::out::stderr(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out::stderr(format_args!("{}\n", format_args!($($t)*))) };
}
macro_rules! eprint {
    ($($t:tt)*) => { $crate::cli::out::stderr(format_args!($($t)*)) };
}

mod apply;
mod connections;
mod console;
mod destroy;
mod fmt;
mod force_unlock;
mod graph;
mod history;
mod import;
mod lock;
mod logs;
mod nodes;
mod out;
mod output;
mod plan;
mod prelude;
mod rollback;
mod show;
mod state;
mod status;
mod tunnel;
mod validate;
mod verify;
mod watch;
mod workspace;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

const ABOUT: &str = "Deploy multi-node LLM inference clusters from HCL definitions.

sparkform reads every *.hcl file of a folder (nodes, the fabric between them, containers and
probes), compares them with the recorded state, and shows or makes the changes in dependency
order.";

const AFTER_HELP: &str = "Examples:
  sparkform validate examples/qwen35-two-sparks
  sparkform plan examples/testbed
  sparkform plan examples/testbed -refresh=false     # no connection: the recorded state
  sparkform plan examples/testbed -var rev=v2 -out testbed.plan
  sparkform show testbed.plan
  sparkform -chdir=examples/testbed plan             # as if run in that folder

Options written Terraform-style with one dash (-var, -out, -refresh=false) work too.

Environment: SPARKFORM_LOG=trace|debug|info|warn|error writes a log of every remote command,
Docker call, HTTP request and state write, with its node and duration, sensitive values
hidden (to standard error, or to the file SPARKFORM_LOG_PATH names), as Terraform's TF_LOG.";

#[derive(Parser, Debug)]
#[command(name = "sparkform", version, about = ABOUT, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// No color in the output, as Terraform's `-no-color` (the `NO_COLOR` variable does the
    /// same). Only `logs` colors, and only in a terminal.
    #[arg(long = "no-color", global = true)]
    pub no_color: bool,
    /// Run as if started in DIR, as Terraform's `-chdir=DIR` (before the command: `sparkform
    /// -chdir=deploy plan`): the definitions, the state and every relative path are DIR's.
    #[arg(long = "chdir", value_name = "DIR")]
    pub chdir: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Validate(validate::ValidateArgs),
    Plan(plan::PlanArgs),
    Apply(apply::ApplyArgs),
    Destroy(destroy::DestroyArgs),
    Verify(verify::VerifyArgs),
    Watch(watch::WatchArgs),
    Logs(logs::LogsArgs),
    Tunnel(tunnel::TunnelArgs),
    Status(status::StatusArgs),
    Import(import::ImportArgs),
    Lock(lock::LockArgs),
    Graph(graph::GraphArgs),
    Nodes(nodes::NodesArgs),
    Connections(connections::ConnectionsArgs),
    Show(show::ShowArgs),
    Output(output::OutputArgs),
    Console(console::ConsoleArgs),
    History(history::HistoryArgs),
    Rollback(rollback::RollbackArgs),
    Fmt(fmt::FmtArgs),
    #[command(subcommand)]
    State(state::StateCommand),
    ForceUnlock(force_unlock::ForceUnlockArgs),
    #[command(
        subcommand,
        after_help = "Example:\n  sparkform workspace list examples/testbed\n  SPARKFORM_WORKSPACE=staging sparkform plan examples/testbed"
    )]
    Workspace(workspace::WorkspaceCommand),
}

/// The async runtime for commands that talk to machines, made once, in `main`.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("Error: cannot start the async runtime: {e}");
            ExitCode::from(1)
        })
}

/// Long options that users write Terraform-style with a single dash.
const SINGLE_DASH: &[&str] = &[
    "var",
    "var-file",
    "state",
    "out",
    "refresh",
    "detailed-exitcode",
    "replace",
    "target",
    "exclude",
    "json",
    "check",
    "diff",
    "recursive",
    "no-color",
    "accept-new-host-keys",
    "auto-approve",
    "parallelism",
    "no-rollback",
    "connect-timeout",
    "force",
    "to",
    "upgrade",
    "lockfile",
    "generate-config-out",
    "generate-import-out",
    "purge-caches",
    "persist",
    "close",
    "lock-timeout",
    "workspace",
    "raw",
    "chdir",
    "destroy",
    "refresh-only",
];

/// `-var x=1` → `--var x=1`, `-refresh=false` → `--refresh=false`, up to a bare `--`.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut passthrough = false;
    for a in args {
        if passthrough || a == "--" {
            passthrough = true;
            out.push(a);
            continue;
        }
        if let Some(rest) = a.strip_prefix('-') {
            if !rest.starts_with('-') {
                let name = rest.split('=').next().unwrap_or(rest);
                if SINGLE_DASH.contains(&name) {
                    out.push(format!("-{a}"));
                    continue;
                }
            }
        }
        out.push(a);
    }
    out
}

pub fn main() -> ExitCode {
    let args = normalize_args(std::env::args());
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // The debug log first, so that everything after it is in it.
    if let Err(warning) = crate::log::init_from_env() {
        eprintln!("Warning: {warning}");
    }
    if cli.no_color {
        // Before any thread starts: every command reads colors from NO_COLOR alone.
        std::env::set_var("NO_COLOR", "1");
    }
    if let Some(dir) = &cli.chdir {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!(
                "Error: -chdir={}: cannot run there: {e}\n  help: -chdir takes a folder that exists (the one holding the definitions)",
                dir.display()
            );
            return ExitCode::from(1);
        }
    }
    // The one runtime of the process: the commands that talk to machines run on it.
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let rt = &rt;
    match cli.command {
        Command::Validate(a) => validate::run(a),
        Command::Console(a) => console::run(a),
        Command::Lock(a) => lock::run(a, rt),
        Command::Plan(a) => plan::run(a, rt),
        Command::Apply(a) => apply::run(a, rt),
        Command::Destroy(a) => destroy::run(a, rt),
        Command::Verify(a) => verify::run(a, rt),
        Command::Watch(a) => watch::run(a, rt),
        Command::Logs(a) => logs::run(a, rt),
        Command::Tunnel(a) => tunnel::run(a, rt),
        Command::Status(a) => status::run(a, rt),
        Command::Import(a) => import::run(a, rt),
        Command::Graph(a) => graph::run(a),
        Command::Nodes(a) => nodes::run(a, rt),
        Command::Connections(a) => connections::run(a, rt),
        Command::Show(a) => show::run(a),
        Command::Output(a) => output::run(a),
        Command::History(a) => history::run(a),
        Command::Rollback(a) => rollback::run(a, rt),
        Command::Fmt(a) => fmt::run(a),
        Command::State(c) => state::run(c),
        Command::ForceUnlock(a) => force_unlock::run(a),
        Command::Workspace(c) => workspace::run(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_long_options() {
        let args = [
            "sparkform",
            "plan",
            "-var",
            "a=1",
            "-refresh=false",
            "-out",
            "p",
            "-x",
            "--",
            "-var",
        ]
        .map(String::from);
        assert_eq!(
            normalize_args(args),
            [
                "sparkform",
                "plan",
                "--var",
                "a=1",
                "--refresh=false",
                "--out",
                "p",
                "-x",
                "--",
                "-var"
            ]
        );
    }
}

//! `sparkform logs`: the deployment's container logs, merged in time order.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Args;

use super::prelude::{ConfigArgs, ConnectArgs};
use std::collections::{HashMap, HashSet};

use crate::ops::logs::{
    begins_like_an_address, fatal_match, LogEvent, LogLine, LogTarget, LogsCommand, LogsRequest,
    NoLogs,
};

/// Show the logs of the deployment's containers, from every node, merged in time order
#[derive(Args, Debug)]
#[command(
    long_about = "Show the logs of the deployment's containers (all, or the given addresses; a \
for_each block's address names every instance, a module's every container in it) from every node \
at once, merged in time order, each line prefixed by its address. Lines matching a ready block's \
fail_on_log pattern are highlighted and their fix is printed. With -f, follow until Ctrl-C, across \
a container's replacement.",
    after_help = "Example:\n  sparkform logs examples/testbed\n  sparkform logs examples/testbed module.qwen.container.ray_worker -f --since 10m"
)]
pub struct LogsArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Container addresses (default: all)
    #[arg(value_name = "ADDRESS")]
    pub addresses: Vec<String>,
    /// Follow the logs until Ctrl-C
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only lines newer than this (30s, 10m, 2h)
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// Start with at most N lines per container
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

const COLOURS: &[&str] = &["36", "33", "35", "32", "34", "96", "93", "95"];

/// How a line reads: `address │ text`, the address coloured and a fatal line in bold red on a
/// terminal.
pub fn render(line: &LogLine, width: usize, colour: Option<&str>, fatal: bool) -> String {
    match colour {
        Some(c) if fatal => format!(
            "\x1b[{c}m{:<width$}\x1b[0m │ \x1b[1;31m{}\x1b[0m",
            line.address, line.text
        ),
        Some(c) => format!("\x1b[{c}m{:<width$}\x1b[0m │ {}", line.address, line.text),
        None => format!("{:<width$} │ {}", line.address, line.text),
    }
}

pub fn run(args: LogsArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    // The folder is optional: a first positional that is an address is one.
    let mut args = args;
    if begins_like_an_address(&args.config.dir.to_string_lossy()) && !args.config.dir.is_dir() {
        let a = args.config.dir.to_string_lossy().into_owned();
        args.addresses.insert(0, a);
        args.config.dir = ".".into();
    }
    let since_secs = match args.since.as_deref().map(crate::config::parse_duration) {
        None => None,
        Some(Some(s)) => Some(s),
        Some(None) => {
            eprintln!(
                "Error: --since {:?} is not a duration\n  help: write e.g. 30s, 10m, 2h",
                args.since.unwrap_or_default()
            );
            return ExitCode::from(1);
        }
    };
    let evaluated = match args.config.evaluate(false) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let cmd = LogsCommand {
        workspace: args.config.workspace(),
        evaluated,
        request: LogsRequest {
            addresses: args.addresses.clone(),
            follow: args.follow,
            since_secs,
            tail: args.tail,
        },
        hosts: args.connect.options(),
    };
    let outcome = rt.block_on(async {
        let cancel = tokio_util::sync::CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.cancel();
            }
        });
        let mut printer = None;
        let outcome = crate::ops::logs::run(
            cmd,
            |targets| {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                printer = Some(tokio::spawn(print(Printer::new(targets), rx)));
                tx
            },
            cancel,
        )
        .await;
        if let Some(printer) = printer {
            let _ = printer.await;
        }
        outcome
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(NoLogs::NoSuchAddress(e)) => {
            eprintln!(
                "Error: {e}\n  help: `sparkform state list` shows the deployment's addresses"
            );
            ExitCode::from(1)
        }
        Err(NoLogs::Op(e)) => super::prelude::report_op_error(e, false),
    }
}

/// How the containers' lines are drawn: the addresses' column width, a colour each on a
/// terminal, and their `fail_on_log` patterns, compiled.
struct Printer {
    terminal: bool,
    width: usize,
    colours: HashMap<String, &'static str>,
    patterns: HashMap<String, Vec<(regex::Regex, String)>>,
}

impl Printer {
    fn new(targets: &[LogTarget]) -> Printer {
        Printer {
            terminal: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
            width: targets.iter().map(|t| t.address.len()).max().unwrap_or(0),
            colours: targets
                .iter()
                .enumerate()
                .map(|(i, t)| (t.address.clone(), COLOURS[i % COLOURS.len()]))
                .collect(),
            patterns: targets
                .iter()
                .map(|t| {
                    let compiled = t
                        .fail_on_log
                        .iter()
                        .filter_map(|(p, f)| Some((regex::Regex::new(p).ok()?, f.clone())))
                        .collect();
                    (t.address.clone(), compiled)
                })
                .collect(),
        }
    }
}

/// Lines on stdout, notes and each fix (once) on stderr, until the logs end.
async fn print(p: Printer, mut rx: tokio::sync::mpsc::UnboundedReceiver<LogEvent>) {
    let mut hinted = HashSet::new();
    while let Some(ev) = rx.recv().await {
        let mut out = std::io::stdout().lock();
        match ev {
            LogEvent::Line(l) => {
                let fix = p
                    .patterns
                    .get(&l.address)
                    .and_then(|pats| fatal_match(pats, &l.text));
                let colour = p
                    .terminal
                    .then(|| p.colours.get(&l.address).copied().unwrap_or("0"));
                if writeln!(out, "{}", render(&l, p.width, colour, fix.is_some())).is_err() {
                    break;
                }
                if let Some(fix) = fix {
                    if hinted.insert(fix.to_string()) {
                        let _ = out.flush();
                        eprintln!("  ↳ {}: a fail_on_log pattern matched: {fix}", l.address);
                    }
                }
            }
            LogEvent::Note(n) => {
                let _ = out.flush();
                eprintln!("-- {n}");
            }
        }
    }
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prefixed_and_coloured_only_when_asked() {
        let l = LogLine {
            time: 0,
            address: "container.a".into(),
            text: "CUDA out of memory".into(),
            stderr: true,
        };
        assert_eq!(
            render(&l, 13, None, true),
            "container.a   │ CUDA out of memory"
        );
        let c = render(&l, 11, Some("36"), true);
        assert!(c.starts_with("\x1b[36mcontainer.a\x1b[0m"), "{c:?}");
        assert!(c.contains("\x1b[1;31mCUDA out of memory"), "{c:?}");
        assert!(!render(&l, 11, Some("36"), false).contains("1;31"));
    }

    #[test]
    fn arguments_parse() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "sparkform",
            "logs",
            "examples/testbed",
            "container.a",
            "container.b",
            "-f",
            "--since",
            "10m",
            "--tail",
            "5",
        ])
        .unwrap();
        let crate::cli::Command::Logs(a) = cli.command else {
            panic!("not logs");
        };
        assert_eq!(a.config.dir, std::path::PathBuf::from("examples/testbed"));
        assert_eq!(a.addresses, ["container.a", "container.b"]);
        assert!(a.follow);
        assert_eq!(a.since.as_deref(), Some("10m"));
        assert_eq!(a.tail, Some(5));
    }
}

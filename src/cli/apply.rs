//! `sparkform apply`: make the machines match the definitions (or a saved plan).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Args};

use super::{
    report_diagnostics, report_error, report_warnings, ConfigArgs, ConnectArgs, InputArgs,
};
use crate::apply::{self, ApplyRequest};
use crate::config::Config;
use crate::diag::Diagnostics;
use crate::plan::planfile::PlanFile;
use crate::plan::{self, render, Plan, PlanOptions};
use crate::state::StateStore;
use crate::workspace::Workspace;

const LONG_ABOUT: &str =
    "Plan, show the plan, ask for confirmation, then apply it: steps run in dependency \
order with as many at once as -parallelism allows; the state is written after every step; \
probes gate what follows them. On the first failure nothing new starts, running steps stop, \
and every step this apply completed is undone in reverse order (replaced containers come back), \
unless --no-rollback. Ctrl-C once stops and rolls back; twice exits at once (the state on disk \
says what exists).

Given a plan file from `plan -out`, apply exactly that plan, without asking; it is refused when \
the state changed since.";

/// Make the machines match the definitions
#[derive(Args, Debug)]
#[command(
    long_about = LONG_ABOUT,
    after_help = "Examples:\n  sparkform apply examples/testbed -auto-approve\n  sparkform plan examples/testbed -out tb.plan && sparkform apply tb.plan\n  sparkform apply . -target 'module.qwen.container.vllm'"
)]
pub struct ApplyArgs {
    /// Folder of definitions, or a plan file made by `plan -out`
    #[arg(default_value = ".")]
    pub path: PathBuf,
    #[command(flatten)]
    pub common: ExecArgs,
    /// Replace this resource even if unchanged (repeatable)
    #[arg(long, value_name = "ADDRESS")]
    pub replace: Vec<String>,
    /// Observe the machines before planning
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub refresh: bool,
}

/// What apply and destroy share.
#[derive(Args, Debug, Clone)]
pub struct ExecArgs {
    #[command(flatten)]
    pub inputs: InputArgs,
    /// Do not ask for confirmation
    #[arg(long = "auto-approve")]
    pub auto_approve: bool,
    /// Steps running at once
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub parallelism: usize,
    /// On failure, keep what was done (for debugging) instead of rolling back
    #[arg(long = "no-rollback")]
    pub no_rollback: bool,
    /// Only this resource and what it depends on (repeatable)
    #[arg(long, value_name = "ADDRESS")]
    pub target: Vec<String>,
    /// Everything except this resource and what depends on it (repeatable)
    #[arg(long, value_name = "ADDRESS")]
    pub exclude: Vec<String>,
    /// Progress as JSON lines
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

impl ExecArgs {
    pub fn config_args(&self, dir: PathBuf) -> ConfigArgs {
        ConfigArgs {
            dir,
            inputs: self.inputs.clone(),
        }
    }
}

pub fn run(args: ApplyArgs) -> ExitCode {
    if args.path.is_file() {
        return run_planfile(&args);
    }
    let ca = args.common.config_args(args.path.clone());
    let Some((config, graph)) = load(&ca, args.common.json) else {
        return ExitCode::from(1);
    };
    let ws = ca.workspace();
    let opts = PlanOptions {
        replace: args.replace.clone(),
        targets: args.common.target.clone(),
        exclude: args.common.exclude.clone(),
        observations: None,
    };
    execute(
        &args.common,
        &ws,
        &config,
        Mode::Apply {
            refresh: args.refresh,
            graph: &graph,
            opts,
        },
    )
}

fn load(ca: &ConfigArgs, json: bool) -> Option<(Config, crate::graph::Graph)> {
    let vars = match ca.var_inputs() {
        Ok(v) => v,
        Err(d) => {
            report_diagnostics(&Diagnostics(vec![*d]), json);
            return None;
        }
    };
    match ca.workspace().load(&vars) {
        Ok((c, g)) => {
            if !json {
                report_warnings(&c.warnings);
            }
            Some((c, g))
        }
        Err(d) => {
            report_diagnostics(&d, json);
            None
        }
    }
}

fn run_planfile(args: &ApplyArgs) -> ExitCode {
    let pf = match PlanFile::read(&args.path) {
        Ok(p) => p,
        Err(e) => return report_error(e),
    };
    let mut ca = args.common.config_args(PathBuf::from(&pf.config_dir));
    if ca.inputs.state.is_none() {
        ca.inputs.state = Some(PathBuf::from(&pf.state_path));
    }
    let Some((config, graph)) = load(&ca, args.common.json) else {
        return ExitCode::from(1);
    };
    let ws = ca.workspace();
    execute(
        &args.common,
        &ws,
        &config,
        Mode::PlanFile {
            file: &pf,
            path: &args.path,
            graph: &graph,
        },
    )
}

pub enum Mode<'a> {
    Apply {
        refresh: bool,
        graph: &'a crate::graph::Graph,
        opts: PlanOptions,
    },
    PlanFile {
        file: &'a PlanFile,
        path: &'a std::path::Path,
        graph: &'a crate::graph::Graph,
    },
    Destroy {
        graph: &'a crate::graph::Graph,
    },
}

/// Lock, plan (or check the plan file), confirm, apply, report.
pub fn execute(args: &ExecArgs, ws: &Workspace, config: &Config, mode: Mode<'_>) -> ExitCode {
    let store: StateStore = ws.store();
    let operation = if matches!(mode, Mode::Destroy { .. }) {
        "destroy"
    } else {
        "apply"
    };
    let lock = match store.lock(operation) {
        Ok(l) => l,
        Err(e) => return report_error(e),
    };
    if let Some(old) = &lock.took_over {
        eprintln!(
            "note: took over a lock left by PID {} on {} ({} since {}), which is no longer running.",
            old.pid, old.host, old.operation, old.started
        );
    }
    let recorded = match store.load() {
        Ok(s) => s,
        Err(e) => return report_error(e),
    };
    let state = recorded.clone().unwrap_or_default();
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // The refresh's connections, reused by the apply when no prompt waits on a human in between.
    let mut pool = None;
    let plan: Plan = match &mode {
        Mode::PlanFile { file, path, graph } => {
            if let Err(e) = file.check_fresh(path, recorded.as_ref()) {
                return report_error(e);
            }
            // The plan's configurations must still be what the definitions say.
            let now = match plan::plan(config, graph, &state, &PlanOptions::default()) {
                Ok(p) => p,
                Err(d) => {
                    report_diagnostics(&Diagnostics(vec![*d]), args.json);
                    return ExitCode::from(1);
                }
            };
            for c in file
                .plan
                .changes
                .iter()
                .filter(|c| c.action.is_change() && c.after_hash.is_some())
            {
                if now.change(&c.address).and_then(|n| n.after_hash.as_ref())
                    != c.after_hash.as_ref()
                {
                    eprintln!(
                        "Error: the definitions changed since the plan was made ({} differs); make a new plan.",
                        c.address
                    );
                    return ExitCode::from(1);
                }
            }
            file.plan.clone()
        }
        Mode::Apply {
            refresh,
            graph,
            opts,
        } => {
            let mut opts = opts.clone();
            if *refresh && recorded.is_some() {
                match rt.block_on(super::plan::refresh_keeping_connections(
                    config,
                    &state,
                    &args.connect,
                    args.json,
                )) {
                    Ok((o, p)) => {
                        opts.observations = Some(o);
                        pool = p;
                    }
                    Err(code) => return code,
                }
            }
            match plan::plan(config, graph, &state, &opts) {
                Ok(p) => p,
                Err(d) => {
                    report_diagnostics(&Diagnostics(vec![*d]), args.json);
                    return ExitCode::from(1);
                }
            }
        }
        Mode::Destroy { graph } => {
            let empty = Config {
                resources: Vec::new(),
                outputs: Vec::new(),
                ..config.clone()
            };
            let opts = PlanOptions {
                targets: args.target.clone(),
                exclude: args.exclude.clone(),
                ..PlanOptions::default()
            };
            let _ = graph;
            let g = match crate::graph::Graph::build(&empty) {
                Ok(g) => g,
                Err(d) => {
                    report_diagnostics(&Diagnostics(vec![*d]), args.json);
                    return ExitCode::from(1);
                }
            };
            match plan::plan(&empty, &g, &state, &opts) {
                Ok(p) => p,
                Err(d) => {
                    report_diagnostics(&Diagnostics(vec![*d]), args.json);
                    return ExitCode::from(1);
                }
            }
        }
    };
    if !args.json {
        print!("{}", render::render(&plan));
    }
    let from_planfile = matches!(mode, Mode::PlanFile { .. });
    let prompt = !args.auto_approve && !from_planfile;
    if !plan.has_changes() || prompt {
        if let Some(p) = pool.take() {
            rt.block_on(p.close());
        }
    }
    if !plan.has_changes() {
        return ExitCode::SUCCESS;
    }
    if prompt && !confirm(operation) {
        eprintln!(
            "{} cancelled.",
            if operation == "destroy" {
                "Destroy"
            } else {
                "Apply"
            }
        );
        return ExitCode::from(1);
    }
    let outcome = rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ui = crate::ui::spawn(crate::ui::mode(args.json), rx);
        let cancel = tokio_util::sync::CancellationToken::new();
        let watcher = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!("\nInterrupted: finishing or stopping running steps, then rolling back. Press Ctrl-C again to exit at once (the state file says what exists).");
                    cancel.cancel();
                    if tokio::signal::ctrl_c().await.is_ok() {
                        eprintln!("Exiting now.");
                        std::process::exit(130);
                    }
                }
            })
        };
        let outcome = apply::apply(ApplyRequest {
            config,
            plan: &plan,
            store: &store,
            state,
            parallelism: args.parallelism,
            rollback: !args.no_rollback,
            hosts: args.connect.options(),
            pool,
            events: tx,
            cancel,
        })
        .await;
        watcher.abort();
        let _ = ui.await;
        outcome
    });
    drop(lock);
    report(&outcome, &plan, operation, args.json)
}

fn confirm(operation: &str) -> bool {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        eprintln!("Error: sparkform asks for confirmation on a terminal; pass -auto-approve to {operation} without asking.");
        return false;
    }
    print!("\nDo you want to {operation}? Only 'yes' is accepted: ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    stdin.lock().read_line(&mut line).is_ok() && line.trim() == "yes"
}

fn report(outcome: &apply::ApplyOutcome, plan: &Plan, operation: &str, json: bool) -> ExitCode {
    if let Some(e) = &outcome.state_error {
        eprintln!("Error: the state could not be written: {e}");
    }
    for w in &outcome.warnings {
        eprintln!("warning: {w}");
    }
    if outcome.ok {
        if !json {
            let s = &plan.summary;
            if operation == "destroy" {
                println!("\nDestroy complete: {} destroyed.", s.delete);
            } else {
                println!(
                    "\nApply complete: {} added, {} changed, {} replaced, {} destroyed; {} probe{} passed.",
                    s.create, s.update, s.replace, s.delete, s.run, if s.run == 1 { "" } else { "s" }
                );
                let outputs: Vec<_> = outcome.state.outputs.iter().collect();
                if !outputs.is_empty() {
                    println!("\nOutputs:");
                    for (k, o) in outputs {
                        println!(
                            "  {k} = {}",
                            if o.sensitive {
                                "(sensitive)".into()
                            } else {
                                render::value(&o.value)
                            }
                        );
                    }
                }
            }
        }
        return if outcome.state_error.is_some() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        };
    }
    eprintln!();
    for (address, e) in &outcome.failures {
        eprintln!("Error: {address}: {}", e.render());
    }
    if outcome.rolled_back {
        if outcome.undo_failures.is_empty() {
            eprintln!("\nRolled back: the machines and the state are as they were before this {operation}.");
        } else {
            eprintln!("\nRollback incomplete: {} step{} could not be undone; the state records what exists. Run `sparkform plan` to see it.", outcome.undo_failures.len(), if outcome.undo_failures.len() == 1 { "" } else { "s" });
        }
    } else {
        eprintln!("\nNot rolled back (--no-rollback): the state records what was done. Run `sparkform plan` to see it.");
    }
    ExitCode::from(1)
}

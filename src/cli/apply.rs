//! `sparkform apply`: make the machines match the definitions (or a saved plan).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::prelude::{report_error, report_warnings, ConfigArgs, ConnectArgs, InputArgs};
use crate::apply;
use crate::diag::Diag;
use crate::ops;
use crate::ops::apply::{
    ApplyCommand, ApplyResult, ApplyUi, Interrupt, PlanRequest, PlanSource, RunOptions,
};
use crate::ops::definitions::Evaluated;
use crate::plan::{render, PlanOptions};
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
    /// Observe the machines before planning (deep: also rehash every model file on every node)
    #[arg(long, value_name = "true|false|deep", value_enum, default_value = "true", num_args = 0..=1, default_missing_value = "true")]
    pub refresh: super::plan::RefreshMode,
    /// Resolve again what sparkform.lock.hcl pins (a branch's new commit), and write the lock
    #[arg(long)]
    pub upgrade: bool,
    /// Change nothing on the machines: record in the state what they show (the records of
    /// objects that are gone dropped), after asking
    #[arg(long = "refresh-only")]
    pub refresh_only: bool,
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
    /// readonly: a change the apply would make to sparkform.lock.hcl is an error (for CI)
    #[arg(long, value_name = "readonly", value_enum)]
    pub lockfile: Option<LockfileMode>,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `-lockfile=readonly`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LockfileMode {
    Readonly,
}

impl ExecArgs {
    pub fn config_args(&self, dir: PathBuf) -> ConfigArgs {
        ConfigArgs {
            dir,
            inputs: self.inputs.clone(),
        }
    }
}

pub fn run(args: ApplyArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let changes_flags = !args.replace.is_empty()
        || !args.common.target.is_empty()
        || !args.common.exclude.is_empty()
        || args.upgrade
        || args.path.is_file()
        || args.refresh == super::plan::RefreshMode::False;
    if args.refresh_only && changes_flags {
        eprintln!("Error: -refresh-only records what the machines show: a plan file, -replace, -target, -exclude, -upgrade and -refresh=false apply changes\n  help: drop -refresh-only, or the other flag");
        return ExitCode::from(1);
    }
    if args.path.is_file() {
        return run_planfile(&args, rt);
    }
    let json = args.common.json;
    let ca = args.common.config_args(args.path.clone());
    // The store made first: PostgreSQL's connection opens while the definitions evaluate.
    let ws = ca.workspace();
    let _ = ws.store();
    let evaluated = match load(&ca, json) {
        Ok(e) => e.upgrading(args.upgrade),
        Err(code) => return code,
    };
    if args.refresh_only {
        return refresh_only(&args, &ws, evaluated, rt);
    }
    let opts = PlanOptions {
        replace: args.replace.clone(),
        targets: args.common.target.clone(),
        exclude: args.common.exclude.clone(),
        observations: None,
        // `prepare` reads (or creates) the key once it holds the state lock.
        key: None,
        ..PlanOptions::default()
    };
    execute(
        &args.common,
        &ws,
        evaluated,
        PlanSource::Definitions {
            refresh: args.refresh.read_mode(),
            options: opts,
        },
        rt,
    )
}

/// `apply -refresh-only`: show how the machines differ from the state, ask, and record what
/// is gone; nothing on the machines changes.
fn refresh_only(
    args: &ApplyArgs,
    ws: &Workspace,
    evaluated: Evaluated,
    rt: &tokio::runtime::Runtime,
) -> ExitCode {
    let hosts = args.common.connect.options();
    let auto = args.common.auto_approve;
    let approve = move |report: &ops::refresh::RefreshReport| {
        super::plan::print_refresh(report, true);
        auto || confirm("drop the records of what is gone from the state")
    };
    let report = rt.block_on(super::prelude::with_notes(
        args.common.json,
        |events| async move {
            ops::refresh::refresh_only(ws, evaluated, &hosts, Some(&approve), &events).await
        },
    ));
    match report {
        Err(e) => super::prelude::report_op_error(e, args.common.json),
        Ok(r) if r.written => {
            println!(
                "\nRefresh complete: {} record{} of what is gone dropped from the state; nothing on the machines changed.",
                r.gone.len(),
                if r.gone.len() == 1 { "" } else { "s" }
            );
            ExitCode::SUCCESS
        }
        Ok(r) if r.gone.is_empty() => {
            super::plan::print_refresh(&r, true);
            if r.differs() {
                println!("\nNothing to record: no recorded object is gone. A drifted object keeps its record; the next plan puts it back.");
            }
            ExitCode::SUCCESS
        }
        Ok(_) => {
            println!("\nRefresh cancelled: the state is as it was.");
            ExitCode::from(1)
        }
    }
}

/// The definitions as written, their warnings shown; `Err` once the errors are reported.
pub fn load(ca: &ConfigArgs, json: bool) -> Result<Evaluated, ExitCode> {
    let evaluated = ca.evaluate(json)?;
    show_warnings(evaluated.warnings(), json);
    Ok(evaluated)
}

/// Warnings drawn (text) or printed as a JSON line.
fn show_warnings(warnings: &[Diag], json: bool) {
    if !json {
        report_warnings(warnings);
    } else if !warnings.is_empty() {
        // A line of its own ahead of the progress lines, tagged like them.
        let line = serde_json::json!({
            "event": "diagnostics",
            "diagnostics": super::prelude::diagnostics_values(warnings),
        });
        println!("{line}");
    }
}

fn run_planfile(args: &ApplyArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let pf = match ops::plan::saved(&args.path) {
        Ok(p) => p,
        Err(e) => return report_error(e),
    };
    let mut ca = args.common.config_args(PathBuf::from(&pf.config_dir));
    if ca.inputs.state.is_none() {
        ca.inputs.state = Some(PathBuf::from(&pf.state_path));
    }
    let evaluated = match load(&ca, args.common.json) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let ws = ca.workspace();
    // What the plan was made with (the values its changes carry, the node facts it records):
    // nothing is read again.
    execute(
        &args.common,
        &ws,
        evaluated,
        PlanSource::PlanFile {
            file: &pf,
            path: &args.path,
        },
        rt,
    )
}

/// Lock, plan (or check the plan file), confirm, apply: `ops::apply::apply`, rendered.
pub fn execute(
    args: &ExecArgs,
    ws: &Workspace,
    evaluated: Evaluated,
    source: PlanSource<'_>,
    rt: &tokio::runtime::Runtime,
) -> ExitCode {
    let operation = source.operation();
    // A saved plan was looked at when it was made.
    let ask = !args.auto_approve && !matches!(source, PlanSource::PlanFile { .. });
    let cmd = ApplyCommand {
        plan: PlanRequest {
            evaluated,
            lockfile_readonly: args.lockfile == Some(LockfileMode::Readonly),
            store: ws.store(),
            source,
            hosts: args.connect.options(),
        },
        run: RunOptions {
            parallelism: args.parallelism,
            rollback: !args.no_rollback,
            hosts: args.connect.options(),
        },
        ask,
    };
    let mut terminal = Terminal {
        json: args.json,
        header: super::prelude::workspace_header(ws),
    };
    match ops::apply::apply(cmd, &mut terminal, rt) {
        Err(e) => super::prelude::report_op_error(e, args.json),
        Ok(ApplyResult::NothingToDo { lock_notes }) => {
            if !args.json {
                lock_notes.iter().for_each(|n| println!("{n}"));
            }
            ExitCode::SUCCESS
        }
        Ok(ApplyResult::Declined) => {
            eprintln!(
                "{} cancelled.",
                if operation == "destroy" {
                    "Destroy"
                } else {
                    "Apply"
                }
            );
            ExitCode::from(1)
        }
        Ok(ApplyResult::Ran(outcome)) => report(&outcome, operation, args.json),
    }
}

/// The apply drawn on this process's terminal (or as JSON lines), asking on stdin.
struct Terminal {
    json: bool,
    /// The workspace's line above the plan, when it is not the default one.
    header: Option<String>,
}

impl ApplyUi for Terminal {
    fn notes(&mut self) -> (crate::events::Sender, tokio::task::JoinHandle<()>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, crate::ui::spawn_notes(self.json, rx))
    }

    fn show_plan(&mut self, warnings: &[Diag], plan: &crate::plan::Plan) {
        show_warnings(warnings, self.json);
        if !self.json {
            if let Some(header) = &self.header {
                println!("{header}");
            }
            print!("{}", render::render(plan));
        }
    }

    fn approve(&mut self, operation: &str) -> bool {
        confirm(operation)
    }

    fn progress(
        &mut self,
        secrets: &crate::events::Secrets,
    ) -> (crate::events::Sender, tokio::task::JoinHandle<()>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ui = crate::ui::spawn(crate::ui::mode(self.json), rx, secrets.clone());
        (tx, ui)
    }

    fn interrupted(&self) -> Box<dyn Fn(Interrupt) + Send> {
        Box::new(|i| {
            match i {
            Interrupt::Stopping => eprintln!("\nInterrupted: finishing or stopping running steps, then rolling back. Press Ctrl-C again to exit at once (the state file says what exists)."),
            Interrupt::Exiting => {
                eprintln!("Exiting now.");
                // The process exits next: no master connection may outlive it.
                ops::apply::shutdown_connections();
            }
        }
        })
    }
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

fn report(outcome: &apply::ApplyOutcome, operation: &str, json: bool) -> ExitCode {
    if let Some(e) = &outcome.state_error {
        eprintln!("Error: the state could not be written: {e}");
    }
    for w in &outcome.warnings {
        eprintln!("warning: {w}");
    }
    if outcome.ok {
        if !json {
            for n in &outcome.notes {
                println!("{n}");
            }
            // What ran, not what was planned: the two agree only because every step ran.
            let s = &outcome.ran;
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
    eprint!("{}", ending(outcome, operation));
    if outcome.interrupted {
        // 128 + SIGINT, as a shell reports a command ended by Ctrl-C.
        return ExitCode::from(130);
    }
    ExitCode::from(1)
}

/// What a run that did not succeed ends with: interrupted or the errors, then what was rolled
/// back, with the counts the progress lines used.
fn ending(outcome: &apply::ApplyOutcome, operation: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("\n");
    if outcome.interrupted {
        let _ = writeln!(
            out,
            "Interrupted: the {operation} stopped on Ctrl-C{}.",
            if outcome.stopped.is_empty() {
                String::new()
            } else {
                format!(" while {} ran", outcome.stopped.join(", "))
            }
        );
    }
    for (address, e) in &outcome.failures {
        let _ = writeln!(out, "Error: {address}: {}", e.render());
    }
    let steps = |n: usize| format!("{n} step{}", if n == 1 { "" } else { "s" });
    if !outcome.not_run.is_empty() {
        let _ = writeln!(out, "\nNot run: {}.", steps(outcome.not_run.len()));
        for (address, why) in &outcome.not_run {
            let _ = writeln!(out, "  {address}: {why}");
        }
    }
    if !outcome.rolled_back {
        out.push_str("\nNot rolled back (--no-rollback): the state records what was done. Run `sparkform plan` to see it.\n");
    } else if outcome.undo_failures.is_empty() {
        let _ = writeln!(
            out,
            "\nRolled back {}: the machines and the state are as they were before this {operation}.",
            steps(outcome.undone)
        );
    } else {
        let _ = writeln!(
            out,
            "\nRollback incomplete: {} of {} undone, {} could not be; the state records what exists. Run `sparkform plan` to see it.",
            outcome.undone,
            steps(outcome.to_undo),
            outcome.undo_failures.len()
        );
        // Which were not restored, and why: never "as they were" when something is not.
        for (address, e) in &outcome.undo_failures {
            let _ = writeln!(out, "  not restored: {address}: {}", e.render());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ending;
    use crate::apply::ApplyOutcome;
    use crate::kinds::machine::StepError;
    use crate::state::State;

    fn outcome() -> ApplyOutcome {
        ApplyOutcome {
            ok: false,
            failures: Vec::new(),
            interrupted: false,
            stopped: Vec::new(),
            rolled_back: true,
            undone: 4,
            to_undo: 4,
            undo_failures: Vec::new(),
            warnings: Vec::new(),
            notes: Vec::new(),
            not_run: Vec::new(),
            ran: Default::default(),
            state: State::new(),
            state_error: None,
        }
    }

    #[test]
    fn an_interrupted_run_says_so_and_blames_no_step() {
        let mut o = outcome();
        o.interrupted = true;
        o.stopped = vec!["probe.ray_members".into()];
        let text = ending(&o, "apply");
        assert!(
            text.contains("Interrupted: the apply stopped on Ctrl-C while probe.ray_members ran."),
            "{text}"
        );
        assert!(!text.contains("Error"), "{text}");
        assert!(text.contains("Rolled back 4 steps: the machines and the state are as they were before this apply."), "{text}");
    }

    #[test]
    fn a_failed_destroy_names_the_error_and_the_undone_count() {
        let mut o = outcome();
        o.failures = vec![("container.web".into(), StepError::new("boom"))];
        o.undone = 2;
        o.to_undo = 3;
        o.undo_failures = vec![("container.db".into(), StepError::new("gone"))];
        let text = ending(&o, "destroy");
        assert!(text.contains("Error: container.web: boom"), "{text}");
        assert!(!text.contains("Interrupted"), "{text}");
        assert!(
            text.contains("Rollback incomplete: 2 of 3 steps undone, 1 could not be"),
            "{text}"
        );
        assert!(text.contains("not restored: container.db: gone"), "{text}");
    }
}

//! `sparkform plan`: show what an apply would change.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::prelude::{report_diagnostics, report_warnings, ConfigArgs, ConnectArgs};
use crate::diag::Diagnostics;
use crate::ops;
use crate::plan::{render, PlanOptions};

const LONG_ABOUT: &str =
    "Compare the definitions with the recorded state and show, in the order an \
apply would take them, what would be created (+), updated in place (~), replaced (-/+, with the \
attribute that forces it), destroyed (-), and which probes would run (?). Sensitive values show \
as (sensitive).";

/// Show what apply would change
#[derive(Args, Debug)]
#[command(
    long_about = LONG_ABOUT,
    after_help = "Examples:\n  sparkform plan examples/testbed\n  sparkform plan examples/testbed -refresh=false         # no connection: the recorded state\n  sparkform plan examples/testbed -out testbed.plan      # save it for `apply testbed.plan`\n  sparkform plan . -detailed-exitcode                   # exit 2 when there are changes\n  sparkform plan . -replace 'module.qwen.container.vllm'\n  sparkform plan . -generate-import-out=imports.hcl        # adopt what a lost state left running\n  sparkform plan . -destroy -out down.plan              # review a teardown, then `apply down.plan`"
)]
pub struct PlanArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Save the plan to FILE; `apply FILE` refuses it if the state changed meanwhile
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Observe the machines before planning (-refresh=false plans against the state alone;
    /// -refresh=deep also rehashes every model file on every node)
    #[arg(long, value_name = "true|false|deep", value_enum, default_value = "true", num_args = 0..=1, default_missing_value = "true")]
    pub refresh: RefreshMode,
    /// Exit 0 when there is nothing to do, 2 when there are changes, 1 on error
    #[arg(long = "detailed-exitcode")]
    pub detailed_exitcode: bool,
    /// Print the plan as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Replace this resource even if unchanged (repeatable)
    #[arg(long, value_name = "ADDRESS")]
    pub replace: Vec<String>,
    /// Plan only this resource and what it depends on (repeatable)
    #[arg(long, value_name = "ADDRESS")]
    pub target: Vec<String>,
    /// Plan everything except this resource and what depends on it (repeatable)
    #[arg(long, value_name = "ADDRESS")]
    pub exclude: Vec<String>,
    /// Resolve again what sparkform.lock.hcl pins (a branch's new commit) and show the lock's changes
    #[arg(long)]
    pub upgrade: bool,
    /// Write blocks for `import` blocks whose resource has no block yet to FILE (a new file)
    #[arg(long = "generate-config-out", value_name = "FILE")]
    pub generate_config_out: Option<PathBuf>,
    /// Write `import` blocks to FILE (a new file; put it in the definitions' folder) for the
    /// containers that run with sparkform's labels for the definitions' addresses under
    /// another state's lineage (a lost state): the next apply adopts them, restarting nothing
    #[arg(long = "generate-import-out", value_name = "FILE")]
    pub generate_import_out: Option<PathBuf>,
    /// Plan what `destroy` would remove (with -target and -exclude, only those); with -out,
    /// `apply FILE` removes exactly that, refused if the state changed meanwhile
    #[arg(long)]
    pub destroy: bool,
    /// Only look: show how the machines differ from the state (objects gone, drifted, or
    /// untracked), planning no change; `apply -refresh-only` records what is gone
    #[arg(long = "refresh-only")]
    pub refresh_only: bool,
}

/// `-refresh=true|false|deep`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RefreshMode {
    True,
    False,
    /// A refresh that also compares checksums where a kind can (model files: sha256).
    Deep,
}

impl RefreshMode {
    /// How the operation reads the machines: handed down to every kind's observation.
    pub fn read_mode(self) -> ops::ReadMode {
        match self {
            RefreshMode::True => ops::ReadMode::Normal,
            RefreshMode::False => ops::ReadMode::Recorded,
            RefreshMode::Deep => ops::ReadMode::Deep,
        }
    }
}

/// A `-generate-*-out` file that exists already, or that a plan without looking cannot fill.
fn refuse_out_file(args: &PlanArgs) -> Option<crate::diag::Diag> {
    let changes_flags = args.destroy
        || args.out.is_some()
        || !args.replace.is_empty()
        || !args.target.is_empty()
        || !args.exclude.is_empty()
        || args.upgrade
        || args.generate_config_out.is_some()
        || args.generate_import_out.is_some()
        || args.refresh == RefreshMode::False;
    if args.refresh_only && changes_flags {
        return Some(
            crate::diag::Diag::error(
                "cli::refresh_only",
                "-refresh-only only looks at the machines: -destroy, -out, -replace, -target, -exclude, -upgrade, -generate-*-out and -refresh=false plan changes",
            )
            .help("drop -refresh-only, or the other flag"),
        );
    }
    let generating = args.generate_config_out.is_some() || args.generate_import_out.is_some();
    if args.destroy && (generating || !args.replace.is_empty() || args.upgrade) {
        return Some(
            crate::diag::Diag::error(
                "cli::plan_destroy",
                "-destroy plans a removal: -replace, -upgrade and -generate-*-out plan an apply",
            )
            .help("drop -destroy, or the other flag"),
        );
    }
    let named = [
        ("generate-config-out", &args.generate_config_out),
        ("generate-import-out", &args.generate_import_out),
    ];
    for (flag, out) in named {
        if let Some(out) = out.as_ref().filter(|p| p.exists()) {
            return Some(
                crate::diag::Diag::error(
                    "cli::generate_out",
                    format!("-{flag} {}: the file exists", out.display()),
                )
                .help("it is never overwritten: name a new file, or remove this one"),
            );
        }
    }
    (args.generate_import_out.is_some() && args.refresh == RefreshMode::False).then(|| {
        crate::diag::Diag::error(
            "cli::generate_import_out",
            "-generate-import-out finds what runs on the nodes, and -refresh=false looks at none",
        )
        .help("drop -refresh=false")
    })
}

pub fn run(args: PlanArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    if let Some(d) = refuse_out_file(&args) {
        report_diagnostics(&Diagnostics(vec![d]), args.json);
        return ExitCode::from(1);
    }
    let ws = args.config.workspace();
    // The store made first: PostgreSQL's connection opens while the definitions evaluate.
    let _ = ws.store();
    let evaluated = match args.config.evaluate(args.json) {
        Ok(e) => e.upgrading(args.upgrade),
        Err(code) => return code,
    };
    if !args.json {
        report_warnings(evaluated.warnings());
    }
    if args.refresh_only {
        return refresh_only(&ws, evaluated, &args, rt);
    }
    let command = ops::plan::PlanCommand {
        workspace: &ws,
        evaluated,
        refresh: args.refresh.read_mode(),
        options: PlanOptions {
            replace: args.replace.clone(),
            targets: args.target.clone(),
            exclude: args.exclude.clone(),
            observations: None,
            generate_config: args.generate_config_out.is_some(),
            ..PlanOptions::default()
        },
        hosts: args.connect.options(),
        out: args.out.as_deref(),
        generate_config_out: args.generate_config_out.as_deref(),
        destroy: args.destroy,
        generate_import_out: args.generate_import_out.as_deref(),
    };
    let planned = rt.block_on(super::prelude::with_notes(args.json, |events| async move {
        ops::plan::plan(command, &events).await
    }));
    let planned = match planned {
        Ok(p) => p,
        Err(e) => return super::prelude::report_op_error(e, args.json),
    };
    if args.json {
        print_json(&ws, &planned);
    } else {
        print_text(&ws, &planned, args.destroy);
    }
    if args.detailed_exitcode && planned.plan.has_changes() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// `plan -refresh-only`: the machines against the state, nothing planned.
fn refresh_only(
    ws: &crate::workspace::Workspace,
    evaluated: ops::definitions::Evaluated,
    args: &PlanArgs,
    rt: &tokio::runtime::Runtime,
) -> ExitCode {
    let hosts = args.connect.options();
    let report = rt.block_on(super::prelude::with_notes(args.json, |events| async move {
        ops::refresh::refresh_only(ws, evaluated, &hosts, None, &events).await
    }));
    let report = match report {
        Ok(r) => r,
        Err(e) => return super::prelude::report_op_error(e, args.json),
    };
    print_refresh(&report, false);
    if args.detailed_exitcode && report.differs() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// How the machines differ from the state, as `-refresh-only` shows it (`applying`: before an
/// apply asks to record it).
pub fn print_refresh(report: &ops::refresh::RefreshReport, applying: bool) {
    if !report.differs() {
        println!("No changes. The machines match the state.");
        return;
    }
    println!("Objects have changed outside of sparkform:\n");
    for (address, why) in &report.gone {
        println!("  - {address}: gone ({why})");
    }
    for (address, how) in &report.drifted {
        println!("  ~ {address}: {}", how.join("; "));
    }
    for o in &report.untracked {
        println!(
            "  ? {} on {}: carries this deployment's labels, and the state does not record it ({})",
            o.name, o.node, o.address
        );
    }
    let gone = report.gone.len();
    if !applying {
        println!(
            "\nThis is a refresh-only plan: `apply -refresh-only` drops the {gone} record{} of what is gone, so the state says what exists, and changes nothing on the machines. A drifted object keeps its record: the next plan puts it back as the definitions say.",
            if gone == 1 { "" } else { "s" }
        );
    }
}

fn print_json(ws: &crate::workspace::Workspace, p: &ops::plan::Planned) {
    let doc = serde_json::json!({
        "format_version": 1,
        "workspace": ws.workspace_name(),
        "diagnostics": super::prelude::diagnostics_values(&p.warnings),
        "lock": p.state_lock_note,
        "state": { "lineage": p.state.as_ref().map(|s| &s.0), "serial": p.state.as_ref().map_or(0, |s| s.1) },
        "plan": p.plan,
        "lock_file_changes": p.lock_file_changes,
        // Per node the plan connected: commands and Docker API requests it made there.
        "round_trips": p.round_trips,
    });
    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    for s in &p.not_generated {
        eprintln!("Warning: {s}");
    }
    if let Some((out, 0)) = &p.generated_imports {
        eprintln!(
            "Nothing runs under another state's lineage for these definitions: {} not written.",
            out.display()
        );
    }
}

fn print_text(ws: &crate::workspace::Workspace, p: &ops::plan::Planned, destroy: bool) {
    report_warnings(&p.new_warnings);
    if let Some(header) = super::prelude::workspace_header(ws) {
        println!("{header}");
    }
    if destroy && !p.plan.has_changes() {
        println!("No changes. The state records nothing to destroy.");
    } else {
        print!("{}", render::render(&p.plan));
    }
    if !p.lock_file_changes.is_empty() {
        println!("\n{} changes (an apply writes them):", ops::lock_file::FILE);
        p.lock_file_changes.iter().for_each(|c| println!("  {c}"));
    }
    for s in &p.not_generated {
        eprintln!("Warning: {s}");
    }
    if let Some((out, n)) = &p.generated_config {
        println!(
            "\nWrote {n} block{} for imports without a resource block to {}: review it, keep it with the definitions, and plan again.",
            if *n == 1 { "" } else { "s" },
            out.display()
        );
    }
    match &p.generated_imports {
        Some((out, 0)) => eprintln!(
            "Nothing runs under another state's lineage for these definitions: {} not written.",
            out.display()
        ),
        Some((out, n)) => println!(
            "\nWrote {n} import block{} to {}: with it in the definitions' folder, `sparkform apply` adopts what runs, restarting nothing.",
            if *n == 1 { "" } else { "s" },
            out.display()
        ),
        None => {}
    }
    if let Some(out) = &p.plan_file {
        println!(
            "\nSaved the plan to {}. Apply exactly this plan with `sparkform apply {}`.",
            out.display(),
            out.display()
        );
    }
}

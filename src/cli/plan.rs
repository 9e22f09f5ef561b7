//! `sparkform plan`: show what an apply would change.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{report_diagnostics, report_error, report_warnings, ConfigArgs, ConnectArgs};
use crate::diag::Diagnostics;
use crate::ops;
use crate::plan::planfile::PlanFile;
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
    after_help = "Examples:\n  sparkform plan examples/testbed\n  sparkform plan examples/testbed -refresh=false         # no connection: the recorded state\n  sparkform plan examples/testbed -out testbed.plan      # save it for `apply testbed.plan`\n  sparkform plan . -detailed-exitcode                   # exit 2 when there are changes\n  sparkform plan . -replace 'module.qwen.container.vllm'\n  sparkform plan . -generate-import-out=imports.hcl        # adopt what a lost state left running"
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

/// Write `text` to `out`, a new file.
fn write_new(out: &std::path::Path, text: &str) -> Result<(), crate::state::StateError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .map_err(|e| crate::state::StateError::Io {
            path: out.to_path_buf(),
            source: e,
        })
}

/// The `-generate-config-out` and `-generate-import-out` files, when asked for.
fn write_generated(args: &PlanArgs, plan: &crate::plan::Plan) -> Result<(), ExitCode> {
    if let Some(out) = &args.generate_config_out {
        let (text, skipped) = ops::import::generated_hcl(&plan.generated);
        for s in &skipped {
            eprintln!("Warning: {s}");
        }
        if !text.is_empty() {
            if let Err(e) = write_new(out, &text) {
                return Err(report_error(e));
            }
            if !args.json {
                println!(
                    "\nWrote {} block{} for imports without a resource block to {}: review it, keep it with the definitions, and plan again.",
                    plan.generated.len() - skipped.len(),
                    if plan.generated.len() - skipped.len() == 1 { "" } else { "s" },
                    out.display()
                );
            }
        }
    }
    if let Some(out) = &args.generate_import_out {
        let text = crate::plan::import_blocks(&plan.foreign);
        if text.is_empty() {
            eprintln!(
                "Nothing runs under another state's lineage for these definitions: {} not written.",
                out.display()
            );
        } else {
            if let Err(e) = write_new(out, &text) {
                return Err(report_error(e));
            }
            if !args.json {
                let n = text.matches("\nimport {").count();
                println!(
                    "\nWrote {n} import block{} to {}: with it in the definitions' folder, `sparkform apply` adopts what runs, restarting nothing.",
                    if n == 1 { "" } else { "s" },
                    out.display()
                );
            }
        }
    }
    Ok(())
}

pub fn run(args: PlanArgs) -> ExitCode {
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
    let lock_before = evaluated.lock().cloned();
    if !args.json {
        report_warnings(evaluated.warnings());
    }
    let recorded = match ws.state() {
        Ok(s) => s,
        Err(e) => return report_error(e),
    };
    // An apply running beside this plan changes what it looks at; a killed one left work.
    let lock_note = ws.store().lock_status().ok().and_then(|s| s.note());
    if let (Some(note), false) = (&lock_note, args.json) {
        eprintln!("{note}");
    }
    // A plan file records hashes under the key, so writing one creates it.
    let key = match ws.key(args.out.is_some()) {
        Ok(k) => k,
        Err(e) => return report_error(e),
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let request = ops::prepare::PrepareRequest {
        evaluated,
        recorded: recorded.as_ref(),
        refresh: args.refresh.read_mode(),
        options: PlanOptions {
            replace: args.replace.clone(),
            targets: args.target.clone(),
            exclude: args.exclude.clone(),
            observations: None,
            key,
            generate_config: args.generate_config_out.is_some(),
            ..PlanOptions::default()
        },
        hosts: args.connect.options(),
    };
    let prepared = rt.block_on(super::with_notes(args.json, |events| async move {
        let mut prepared = ops::prepare::prepare(request, &events).await?;
        prepared.close().await;
        Ok::<_, ops::OpError>(prepared)
    }));
    let ops::prepare::Prepared {
        config,
        plan,
        warnings,
        readings,
        images,
        round_trips,
        ..
    } = match prepared {
        Ok(p) => p,
        Err(e) => return super::report_op_error(e, args.json),
    };
    let lock_changes = ops::lock_file::LockUpdate::new(
        &config,
        lock_before.as_ref(),
        args.upgrade,
        &images,
        recorded.as_ref(),
    )
    .changes();
    if args.json {
        // Every warning of the evaluation the plan was made from, and those of the reading.
        let mut all = config.warnings.clone();
        for w in &warnings {
            if !all.iter().any(|a| a.message == w.message) {
                all.push(w.clone());
            }
        }
        let doc = serde_json::json!({
            "format_version": 1,
            "workspace": ws.workspace_name(),
            "diagnostics": super::diagnostics_values(&all),
            "lock": lock_note,
            "state": { "lineage": recorded.as_ref().map(|s| &s.lineage), "serial": recorded.as_ref().map_or(0, |s| s.serial) },
            "plan": plan,
            "lock_file_changes": lock_changes,
            // Per node the plan connected: commands and Docker API requests it made there.
            "round_trips": round_trips,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        report_warnings(&warnings);
        if let Some(header) = super::workspace_header(&ws) {
            println!("{header}");
        }
        print!("{}", render::render(&plan));
        if !lock_changes.is_empty() {
            println!("\n{} changes (an apply writes them):", ops::lock_file::FILE);
            lock_changes.iter().for_each(|c| println!("  {c}"));
        }
    }
    if let Err(code) = write_generated(&args, &plan) {
        return code;
    }
    if let Some(out) = &args.out {
        let file = PlanFile::new(plan.clone(), &ws.dir, &ws.state_path, recorded.as_ref())
            .with_readings(&readings);
        if let Err(e) = file.write(out) {
            return report_error(e);
        }
        if !args.json {
            println!(
                "\nSaved the plan to {}. Apply exactly this plan with `sparkform apply {}`.",
                out.display(),
                out.display()
            );
        }
    }
    if args.detailed_exitcode && plan.has_changes() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

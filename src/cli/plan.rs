//! `sparkform plan`: show what an apply would change.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Args};

use super::{report_diagnostics, report_error, report_warnings, ConfigArgs, ConnectArgs};
use crate::diag::Diagnostics;
use crate::plan::planfile::PlanFile;
use crate::plan::{self, render, PlanOptions};
use crate::state::State;

const LONG_ABOUT: &str =
    "Compare the definitions with the recorded state and show, in the order an \
apply would take them, what would be created (+), updated in place (~), replaced (-/+, with the \
attribute that forces it), destroyed (-), and which probes would run (?). Sensitive values show \
as (sensitive).";

/// Show what apply would change
#[derive(Args, Debug)]
#[command(
    long_about = LONG_ABOUT,
    after_help = "Examples:\n  sparkform plan examples/testbed -refresh=false\n  sparkform plan examples/testbed -out testbed.plan      # save it for `apply testbed.plan`\n  sparkform plan . -detailed-exitcode                   # exit 2 when there are changes\n  sparkform plan . -replace 'module.qwen.container.vllm'"
)]
pub struct PlanArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Save the plan to FILE; `apply FILE` refuses it if the state changed meanwhile
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Observe the machines before planning (-refresh=false plans against the state alone)
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub refresh: bool,
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
}

pub fn run(args: PlanArgs) -> ExitCode {
    let vars = match args.config.var_inputs() {
        Ok(v) => v,
        Err(d) => {
            report_diagnostics(&Diagnostics(vec![*d]), args.json);
            return ExitCode::from(1);
        }
    };
    let ws = args.config.workspace();
    let (config, graph) = match ws.load(&vars) {
        Ok(x) => x,
        Err(diags) => {
            report_diagnostics(&diags, args.json);
            return ExitCode::from(1);
        }
    };
    if !args.json {
        report_warnings(&config.warnings);
    }
    let recorded = match ws.state() {
        Ok(s) => s,
        Err(e) => return report_error(e),
    };
    let empty = State::new();
    let state = recorded.as_ref().unwrap_or(&empty);
    let observations = if args.refresh && recorded.is_some() {
        match refresh(&config, state, &args.connect, args.json) {
            Ok(o) => Some(o),
            Err(code) => return code,
        }
    } else {
        None
    };
    let opts = PlanOptions {
        replace: args.replace.clone(),
        targets: args.target.clone(),
        exclude: args.exclude.clone(),
        observations,
    };
    let plan = match plan::plan(&config, &graph, state, &opts) {
        Ok(p) => p,
        Err(d) => {
            report_diagnostics(&Diagnostics(vec![*d]), args.json);
            return ExitCode::from(1);
        }
    };
    if args.json {
        let doc = serde_json::json!({
            "format_version": 1,
            "state": { "lineage": recorded.as_ref().map(|s| &s.lineage), "serial": recorded.as_ref().map_or(0, |s| s.serial) },
            "plan": plan,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", render::render(&plan));
    }
    if let Some(out) = &args.out {
        let file = PlanFile::new(plan.clone(), &ws.dir, &ws.state_path, recorded.as_ref());
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

/// Look at the machines; on failure print why and return the exit code.
pub fn refresh(
    config: &crate::config::Config,
    state: &State,
    connect: &ConnectArgs,
    json: bool,
) -> Result<crate::plan::Observations, ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(async {
        let (observations, pool) =
            refresh_keeping_connections(config, state, connect, json).await?;
        if let Some(pool) = pool {
            pool.close().await;
        }
        Ok(observations)
    })
}

/// `refresh`, handing back the connections it opened (to reuse them in the same runtime).
pub async fn refresh_keeping_connections(
    config: &crate::config::Config,
    state: &State,
    connect: &ConnectArgs,
    json: bool,
) -> Result<(crate::plan::Observations, Option<crate::hosts::HostPool>), ExitCode> {
    let nodes = crate::refresh::nodes_to_refresh(config, state);
    if nodes.is_empty() {
        return Ok((Default::default(), None));
    }
    if !json {
        eprintln!(
            "Refreshing: looking at {} node{}…",
            nodes.len(),
            if nodes.len() == 1 { "" } else { "s" }
        );
    }
    let (pool, observed) =
        crate::refresh::connect_and_refresh(config, state, &nodes, &connect.options()).await;
    match observed {
        Ok(o) => Ok((o, Some(pool))),
        Err(errors) => {
            pool.close().await;
            for e in errors {
                eprintln!("{:?}", miette::Report::new(super::SharedHostError(e)));
            }
            eprintln!("Error: cannot refresh; fix the connection, or plan against the state alone with -refresh=false.");
            Err(ExitCode::from(1))
        }
    }
}

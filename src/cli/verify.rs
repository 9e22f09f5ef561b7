//! `sparkform verify`: run the probes against what is deployed; change nothing.

use std::process::ExitCode;

use clap::Args;

use super::{ConfigArgs, ConnectArgs};
use crate::ops::definitions::Pins;

/// Run every probe against the live deployment (for cron and monitoring)
#[derive(Args, Debug)]
#[command(
    long_about = "Run every probe (or the -target ones) against the deployment as it runs now, in \
dependency order, and print each one's latency and answer. Changes nothing and takes no lock. \
Exits 1 when a probe fails.\n\n\
Made to answer fast for cron and monitoring: a probe first looks at what it depends on, and a \
container that is not running fails it at once, naming its state and exit code (container \
vllm-node1 is exited (exit code 137) on node.node1). A running engine that does not answer is \
tried again for --retry-for only, not for the probe's timeout, which is how long an apply waits \
for an engine that is still loading.",
    after_help = "Examples:\n  sparkform verify examples/testbed\n  sparkform verify examples/testbed -target probe.hello --json\n  sparkform verify examples/testbed --retry-for 30s   # cron: a busy engine gets 30 s to answer"
)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only these probes (repeatable); a fabric_test runs only when named here
    #[arg(long, value_name = "ADDRESS")]
    pub target: Vec<String>,
    /// How long a probe's failed attempts are tried again (0s: one attempt); a probe whose
    /// container is not running fails at once
    #[arg(long = "retry-for", default_value = "10s", value_name = "DURATION")]
    pub retry_for: String,
    /// Progress as JSON lines
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: VerifyArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let Some(retry_for) = crate::config::parse_duration(&args.retry_for) else {
        eprintln!(
            "Error: --retry-for {:?} is not a duration\n  help: such as \"10s\", \"2m\", or \"0s\" for one attempt",
            args.retry_for
        );
        return ExitCode::from(2);
    };
    let retry_for = std::time::Duration::from_secs(retry_for);
    let ws = args.config.workspace();
    let evaluated = match args.config.evaluate(args.json) {
        Ok(e) => e,
        Err(code) => return code,
    };
    if let Some(t) = crate::ops::verify::unknown_targets(evaluated.config(), &args.target).first() {
        eprintln!("Error: -target {t}: no such probe");
        return ExitCode::from(1);
    }
    let deploy_hint = format!(
        "  help: deploy it first with `sparkform apply {}`",
        ws.dir.display()
    );
    let state = match crate::ops::state::recorded(&ws) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!(
                "Error: {}, so there is nothing to verify.\n{deploy_hint}",
                ws.nothing_applied()
            );
            return ExitCode::from(1);
        }
        Err(e) => return super::report_error(e),
    };
    if state.resources.is_empty() {
        eprintln!(
            "Error: the state at {} records nothing: nothing is deployed, so there is nothing to verify.\n{deploy_hint}",
            ws.state_path.display()
        );
        return ExitCode::from(1);
    }
    // What is deployed: the values the state records, never what the machines say now.
    let (config, graph) = match evaluated.pin(Pins::Recorded(Some(&state))) {
        Ok(d) => (d.config, d.graph),
        Err(e) => return super::report_op_error(e, args.json),
    };
    let undeployed = crate::ops::verify::undeployed(&config, &graph, &state, &args.target);
    if !undeployed.is_empty() {
        for (probe, missing) in &undeployed {
            // The first few name the problem; a whole module's worth would bury it.
            let named: Vec<&str> = missing.iter().take(3).map(String::as_str).collect();
            let more = match missing.len().saturating_sub(named.len()) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            eprintln!(
                "Error: {probe} cannot run: {}{more} {} not deployed (not in {}).",
                named.join(", "),
                if missing.len() == 1 { "is" } else { "are" },
                ws.state_path.display()
            );
        }
        eprintln!("{deploy_hint}, or -target only probes whose resources are deployed");
        return ExitCode::from(1);
    }
    let results = rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let secrets = config.secrets.clone();
        let ui = crate::ui::spawn(crate::ui::mode(args.json), rx, secrets);
        let r = crate::ops::verify::verify(
            &config,
            &graph,
            &state,
            &args.target,
            retry_for,
            &args.connect.options(),
            &tx,
        )
        .await;
        drop(tx);
        let _ = ui.await;
        r
    });
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    if !args.json {
        for skipped in crate::ops::verify::not_run_by_default(&config, &args.target) {
            println!("{skipped} was not run: it loads the fabric and the GPUs, so it runs only when named (-target {skipped})");
        }
        println!(
            "\n{} probe{} passed, {failed} failed.",
            results.len() - failed,
            if results.len() - failed == 1 { "" } else { "s" }
        );
    }
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

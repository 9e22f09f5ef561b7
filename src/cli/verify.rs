//! `sparkform verify`: run the probes against what is deployed; change nothing.

use std::process::ExitCode;

use clap::Args;

use super::prelude::{ConfigArgs, ConnectArgs};
use crate::ops::verify::{NotVerified, VerifyCommand};

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
    let workspace = args.config.workspace();
    let evaluated = match args.config.evaluate(args.json) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let deploy_hint = format!(
        "  help: deploy it first with `sparkform apply {}`",
        workspace.dir.display()
    );
    let state_path = workspace.state_path.clone();
    let cmd = VerifyCommand {
        workspace,
        evaluated,
        targets: args.target.clone(),
        retry_for: std::time::Duration::from_secs(retry_for),
        hosts: args.connect.options(),
    };
    let verified = rt.block_on(async {
        let mut ui = None;
        let verified = crate::ops::verify::run(cmd, |secrets| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            ui = Some(crate::ui::spawn(
                crate::ui::mode(args.json),
                rx,
                secrets.clone(),
            ));
            tx
        })
        .await;
        if let Some(ui) = ui {
            let _ = ui.await;
        }
        verified
    });
    let verified = match verified {
        Ok(v) => v,
        Err(NotVerified::UnknownTarget(t)) => {
            eprintln!("Error: -target {t}: no such probe");
            return ExitCode::from(1);
        }
        Err(NotVerified::NothingDeployed(why)) => {
            eprintln!("Error: {why}, so there is nothing to verify.\n{deploy_hint}");
            return ExitCode::from(1);
        }
        Err(NotVerified::Undeployed(probes)) => {
            report_undeployed(&probes, &state_path);
            eprintln!("{deploy_hint}, or -target only probes whose resources are deployed");
            return ExitCode::from(1);
        }
        Err(NotVerified::Op(e)) => return super::prelude::report_op_error(e, args.json),
    };
    let failed = verified.results.iter().filter(|(_, r)| r.is_err()).count();
    let passed = verified.results.len() - failed;
    if !args.json {
        for skipped in &verified.not_run {
            println!("{skipped} was not run: it loads the fabric and the GPUs, so it runs only when named (-target {skipped})");
        }
        println!(
            "\n{passed} probe{} passed, {failed} failed.",
            if passed == 1 { "" } else { "s" }
        );
    }
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Each probe that cannot run, with the first few of what it lacks: a whole module's worth
/// would bury the problem.
fn report_undeployed(probes: &[(String, Vec<String>)], state_path: &std::path::Path) {
    for (probe, missing) in probes {
        let named: Vec<&str> = missing.iter().take(3).map(String::as_str).collect();
        let more = match missing.len().saturating_sub(named.len()) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        eprintln!(
            "Error: {probe} cannot run: {}{more} {} not deployed (not in {}).",
            named.join(", "),
            if missing.len() == 1 { "is" } else { "are" },
            state_path.display()
        );
    }
}

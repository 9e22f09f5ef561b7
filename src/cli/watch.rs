//! `sparkform watch`: check the live deployment every interval, and restart a failed engine
//! as a whole when told to.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::prelude::{ConfigArgs, ConnectArgs};
use crate::ops::watch::{WatchEnd, WatchRequest};

/// Watch the live deployment; with --restart, restart a failed engine as a whole
#[derive(Args, Debug)]
#[command(
    long_about = "Check the deployment as it runs, every --interval: each container's state and \
Docker restart count, the lines of its log that mean the engine no longer serves (watch_on_log, \
such as EngineDeadError, and its ready checks' fail_on_log), and the probes verify runs (the \
canary's real completion), each within --probe-timeout: a probe whose container is not running \
fails at once, naming its state and exit code, and a failed attempt is tried again for --retry-for \
only (not the probe's timeout, which is how long an apply waits for an engine that is loading). Exits 1 naming the cause at the first \
failure, unless --restart: then the whole engine (every rank of its process group, what its \
replacement triggers, and the probes after it) is replaced through the normal apply (journal, \
state, rollback), at most --max-restarts times within --window, each waiting twice as long as \
the one before; one more stops the watch with exit 1. The state is locked only while a restart \
runs, so plan and status work beside it. Ctrl-C or SIGTERM stops it; a restart that is running \
is stopped and rolled back first, as an apply is.",
    after_help = "Examples:\n  sparkform watch examples/testbed-mp --interval 30s\n  sparkform watch examples/testbed-mp --restart --max-restarts 3 --window 1h --json\n  sparkform watch . --restart --metrics 127.0.0.1:9464   # Prometheus text at /metrics\n\nA systemd unit that keeps it running: docs/watch.md."
)]
pub struct WatchArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Time between checks
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub interval: String,
    /// The longest each probe may take at a check (a wedged engine never answers)
    #[arg(long = "probe-timeout", default_value = "60s", value_name = "DURATION")]
    pub probe_timeout: String,
    /// How long a probe's failed attempts are tried again at a check (0s: one attempt); a probe
    /// whose container is not running fails at once
    #[arg(long = "retry-for", default_value = "10s", value_name = "DURATION")]
    pub retry_for: String,
    /// Restart the engine when a check fails (else exit 1 naming the cause)
    #[arg(long)]
    pub restart: bool,
    /// Restarts allowed within --window; one more stops the watch
    #[arg(long = "max-restarts", default_value_t = 3)]
    pub max_restarts: usize,
    /// The window --max-restarts counts in
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub window: String,
    /// Stop after this many checks (default: until stopped)
    #[arg(long, value_name = "N")]
    pub ticks: Option<u64>,
    /// Serve Prometheus text metrics at http://ADDR/metrics
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// How many steps a restart runs at once
    #[arg(long, default_value_t = 10)]
    pub parallelism: usize,
    /// Progress as JSON lines
    #[arg(long)]
    pub json: bool,
}

/// `text` as a duration of at least `least` seconds.
fn duration(flag: &str, text: &str, least: u64) -> Result<Duration, ExitCode> {
    match crate::config::parse_duration(text) {
        Some(s) if s >= least => Ok(Duration::from_secs(s)),
        _ => {
            eprintln!("Error: --{flag} {text:?} is not a duration\n  help: such as \"30s\", \"5m\" or \"1h\"");
            Err(ExitCode::from(2))
        }
    }
}

pub fn run(args: WatchArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let parsed = (|| {
        Ok::<_, ExitCode>((
            duration("interval", &args.interval, 1)?,
            duration("probe-timeout", &args.probe_timeout, 1)?,
            duration("retry-for", &args.retry_for, 0)?,
            duration("window", &args.window, 1)?,
        ))
    })();
    let (interval, probe_timeout, retry_for, window) = match parsed {
        Ok(d) => d,
        Err(code) => return code,
    };
    if args.max_restarts == 0 && args.restart {
        eprintln!("Error: --max-restarts 0 with --restart allows no restart\n  help: leave --restart out to exit at the first failure");
        return ExitCode::from(2);
    }
    let metrics_addr = match args
        .metrics
        .as_deref()
        .map(str::parse::<std::net::SocketAddr>)
    {
        None => None,
        Some(Ok(a)) => Some(a),
        Some(Err(_)) => {
            eprintln!(
                "Error: --metrics {:?} is not an address to listen on\n  help: such as 127.0.0.1:9464",
                args.metrics.as_deref().unwrap_or_default()
            );
            return ExitCode::from(2);
        }
    };
    let ws = args.config.workspace();
    let evaluated = match args.config.evaluate(args.json) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let secrets = evaluated.config().secrets.clone();
    let request = WatchRequest {
        workspace: ws,
        evaluated,
        interval,
        probe_timeout,
        retry_for,
        restart: args.restart,
        max_restarts: args.max_restarts,
        window,
        ticks: args.ticks,
        hosts: args.connect.options(),
        parallelism: args.parallelism.max(1),
    };
    let end = rt.block_on(async {
        let cancel = tokio_util::sync::CancellationToken::new();
        let signals = stop_on_signals(cancel.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ui = crate::ui::spawn(crate::ui::mode(args.json), rx, secrets);
        let end = crate::ops::watch::watch_deployment(request, metrics_addr, &tx, cancel).await;
        drop(tx);
        let _ = ui.await;
        signals.abort();
        end
    });
    match end {
        Err(e) => super::prelude::report_op_error(e, args.json),
        Ok(WatchEnd::Done) => ExitCode::SUCCESS,
        Ok(WatchEnd::Interrupted) => {
            eprintln!("watch: stopped; nothing is left running on this machine");
            ExitCode::from(130)
        }
        Ok(WatchEnd::Failed(cause)) => {
            eprintln!("Error: watch: {cause}\n  help: `sparkform watch --restart` restarts the engine as a whole; `sparkform logs` shows every rank's log");
            ExitCode::from(1)
        }
        Ok(WatchEnd::CrashLoop(cause)) => {
            eprintln!(
                "Error: watch: the engine failed again after {} restart{} within {}: {cause}\n  help: it does not recover by restarting: see `sparkform logs` and `sparkform status`",
                args.max_restarts,
                if args.max_restarts == 1 { "" } else { "s" },
                args.window
            );
            ExitCode::from(1)
        }
    }
}

/// Cancel on SIGINT or SIGTERM (a systemd stop).
fn stop_on_signals(cancel: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            cancel.cancel();
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.cancel();
            }
        }
    })
}

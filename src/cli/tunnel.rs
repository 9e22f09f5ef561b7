//! `sparkform tunnel`: a deployment endpoint on a local port until Ctrl-C, or for one command.

use std::process::ExitCode;

use clap::Args;

use super::prelude::{ConfigArgs, ConnectArgs};
use crate::ops::definitions::Pins;
use crate::ops::tunnel::{tunnel, TunnelEnd, TunnelRequest, TunnelTarget};

/// Forward a deployment endpoint to a local port through the jump host
#[derive(Args, Debug)]
#[command(
    long_about = "Forward a deployment endpoint (an output whose value is an http:// URL, or an \
http probe's URL as its `via` node sees it) to a local port, through the node's SSH master \
connection, print the local URL and keep it open until Ctrl-C. Says when the remote side stops \
answering. With --exec, run a command against it (through sh -c, with SPARKFORM_TUNNEL_URL set and \
{url} replaced by the local URL; when the definitions' probes send the endpoint an API key, \
SPARKFORM_TUNNEL_AUTHORIZATION holds their Authorization header and OPENAI_API_KEY the key), close, \
and exit with the command's code.",
    after_help = "Example:\n  sparkform tunnel examples/testbed endpoint\n  sparkform tunnel examples/testbed probe.hello -L 8080\n  sparkform tunnel examples/testbed endpoint --exec 'curl -s -H \"Authorization: $SPARKFORM_TUNNEL_AUTHORIZATION\" {url}/v1/models'"
)]
pub struct TunnelArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// An output's name or a probe's address (default: the only http:// output)
    #[arg(value_name = "OUTPUT|ADDRESS")]
    pub endpoint: Option<String>,
    /// Local [BIND:]PORT (default: 127.0.0.1 and the remote port, or any free one)
    #[arg(short = 'L', value_name = "[BIND:]PORT")]
    pub local: Option<String>,
    /// Allow a bind address other machines can reach
    #[arg(long)]
    pub allow_remote_bind: bool,
    /// Run this command against the tunnel (sh -c; {url} is the local URL), then close
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub fn run(args: TunnelArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let mut args = args;
    // `tunnel endpoint` with no folder: the one positional is the endpoint.
    if args.endpoint.is_none() && !args.config.dir.is_dir() {
        args.endpoint = Some(args.config.dir.to_string_lossy().into_owned());
        args.config.dir = ".".into();
    }
    // The nodes and ports are the same whatever the kinds read at plan time.
    let config = match args.config.definitions(false, Pins::Unresolved) {
        Ok(d) => d.config,
        Err(code) => return code,
    };
    let request = TunnelRequest {
        config: &config,
        endpoint: args.endpoint.as_deref(),
        local: args.local.as_deref(),
        allow_remote_bind: args.allow_remote_bind,
        hosts: args.connect.options(),
        exec: args.exec.as_deref(),
    };
    let waits = args.exec.is_none();
    let end = rt.block_on(async {
        let (tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
        let printing = tokio::spawn(async move {
            while let Some(n) = notes.recv().await {
                eprintln!("sparkform tunnel: {n}");
            }
        });
        let opened = |target: &TunnelTarget, url: &str| {
            if waits {
                println!(
                    "{} ({} as {} sees it) is at\n  {url}\nPress Ctrl-C to close.",
                    target.from, target.url, target.node
                );
            }
        };
        let end = tunnel(request, opened, tx).await;
        let _ = printing.await;
        end
    });
    match end {
        Ok(TunnelEnd::Closed) => ExitCode::SUCCESS,
        Ok(TunnelEnd::CommandExited(code)) => ExitCode::from(code.clamp(0, 255) as u8),
        Ok(TunnelEnd::Interrupted) => ExitCode::from(130),
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn arguments_parse() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "sparkform",
            "tunnel",
            "examples/testbed",
            "probe.hello",
            "-L",
            "127.0.0.1:8080",
            "--exec",
            "curl {url}",
        ])
        .unwrap();
        let crate::cli::Command::Tunnel(a) = cli.command else {
            panic!("not tunnel");
        };
        assert_eq!(a.endpoint.as_deref(), Some("probe.hello"));
        assert_eq!(a.local.as_deref(), Some("127.0.0.1:8080"));
        assert_eq!(a.exec.as_deref(), Some("curl {url}"));
        assert!(!a.allow_remote_bind);
    }
}

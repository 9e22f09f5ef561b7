//! `sparkform tunnel`: a deployment endpoint on a local port until Ctrl-C, or for one command.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{ConfigArgs, ConnectArgs};
use crate::ops::definitions::Pins;

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

/// The command line for `--exec`: `{url}` replaced by the local URL.
pub fn exec_script(cmd: &str, url: &str) -> String {
    cmd.replace("{url}", url)
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
    let target = match crate::ops::tunnel::resolve(&config, args.endpoint.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(1);
        }
    };
    let bind = match crate::ops::tunnel::bind_address(
        args.local.as_deref(),
        target.port,
        args.allow_remote_bind,
    ) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = args.connect.options();
    rt.block_on(async {
        let pool = crate::ops::tunnel::connect(&config, &target, &opts).await;
        let code = match pool.get(&target.node) {
            Err(e) => {
                eprintln!("Error: {e}");
                ExitCode::from(1)
            }
            Ok(host) => {
                match crate::ops::tunnel::Tunnel::open(
                    host.as_ref(),
                    &target,
                    bind,
                    args.local.is_some(),
                )
                .await
                {
                    Err(e) => {
                        eprintln!("Error: {}: {e}", target.from);
                        ExitCode::from(1)
                    }
                    Ok(tunnel) => serve(tunnel, &target, args.exec.as_deref()).await,
                }
            }
        };
        pool.close().await;
        code
    })
}

async fn serve(
    tunnel: crate::ops::tunnel::Tunnel,
    target: &crate::ops::tunnel::Target,
    exec: Option<&str>,
) -> ExitCode {
    let url = tunnel.url.clone();
    let (tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
    let cancel = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(tunnel.serve(Duration::from_secs(5), tx, cancel.clone()));
    let printing = tokio::spawn(async move {
        while let Some(n) = notes.recv().await {
            eprintln!("sparkform tunnel: {n}");
        }
    });
    let code = match exec {
        None => {
            println!(
                "{} ({} as {} sees it) is at\n  {url}\nPress Ctrl-C to close.",
                target.from, target.url, target.node
            );
            let _ = tokio::signal::ctrl_c().await;
            ExitCode::SUCCESS
        }
        Some(cmd) => {
            let mut command = tokio::process::Command::new("sh");
            // The endpoint's key, when its probes send one: in the environment only (never in
            // an argument another user could read).
            if let Some(auth) = &target.authorization {
                command.env("SPARKFORM_TUNNEL_AUTHORIZATION", auth);
                if let Some(key) = auth.strip_prefix("Bearer ") {
                    command.env("OPENAI_API_KEY", key);
                }
            }
            let child = command
                .arg("-c")
                .arg(exec_script(cmd, &url))
                .env("SPARKFORM_TUNNEL_URL", &url)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .status();
            tokio::select! {
                st = child => match st {
                    Ok(st) => ExitCode::from(st.code().map_or(1, |c| c.clamp(0, 255) as u8)),
                    Err(e) => {
                        eprintln!("Error: cannot run sh -c: {e}");
                        ExitCode::from(1)
                    }
                },
                _ = tokio::signal::ctrl_c() => ExitCode::from(130),
            }
        }
    };
    cancel.cancel();
    let _ = serving.await;
    printing.abort();
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_substitutes_the_url() {
        assert_eq!(
            exec_script("curl -s {url} && echo {url}", "http://127.0.0.1:5/x"),
            "curl -s http://127.0.0.1:5/x && echo http://127.0.0.1:5/x"
        );
    }

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

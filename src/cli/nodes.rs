//! `sparkform nodes`: connect to every node and show what it is, flagging where the definitions
//! disagree with the machine.

use std::process::ExitCode;

use clap::Args;

use super::{report_diagnostics, ConfigArgs, ConnectArgs};
use crate::diag::Diagnostics;
use crate::hosts::facts::{self, Facts};
use crate::ops::nodes::NodeFacts;

/// Connect to every node and show its facts (OS, CPUs, memory, GPUs, Docker, interfaces)
#[derive(Args, Debug)]
#[command(
    long_about = "Connect to every node (through its jump host, with strict host-key checking) in parallel \
and show its OS, architecture, CPUs, memory, GPUs, Docker Engine and network interfaces. Lines \
marked `!` are where the definitions disagree with the machine: declared GPUs or memory, an \
attachment's interface that does not exist. Exits 1 when a node cannot be reached.",
    after_help = "Example:\n  sparkform nodes examples/testbed\n  sparkform nodes examples/testbed --json"
)]
pub struct NodesArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: NodesArgs) -> ExitCode {
    let vars = match args.config.var_inputs() {
        Ok(v) => v,
        Err(d) => {
            report_diagnostics(&Diagnostics(vec![*d]), args.json);
            return ExitCode::from(1);
        }
    };
    let (config, _) = match args.config.workspace().load(&vars) {
        Ok(x) => x,
        Err(d) => {
            report_diagnostics(&d, args.json);
            return ExitCode::from(1);
        }
    };
    let opts = args.connect.options();
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(async {
        let results: std::collections::BTreeMap<String, Result<Facts, String>> =
            crate::ops::nodes::gather(&config, &opts)
                .await
                .into_iter()
                .map(|(name, r)| {
                    let r = match r {
                        NodeFacts::Facts(f) => Ok(*f),
                        NodeFacts::Failed(e) => Err(e),
                        NodeFacts::Unreachable(e) => Err(format!(
                            "{:?}",
                            miette::Report::new(super::SharedHostError(e))
                        )),
                    };
                    (name, r)
                })
                .collect();
        let mut unreachable = false;
        if args.json {
            let doc: serde_json::Map<String, serde_json::Value> = results
                .iter()
                .map(|(name, r)| {
                    let v = match r {
                        Ok(f) => serde_json::json!({
                            "facts": f,
                            "disagreements": config.nodes.get(name).map(|n| facts::disagreements(&config, n, f)).unwrap_or_default(),
                        }),
                        Err(e) => {
                            unreachable = true;
                            serde_json::json!({ "error": e })
                        }
                    };
                    (name.clone(), v)
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        } else {
            let mut rows = vec![vec!["NODE".to_string(), "OS".into(), "ARCH".into(), "CPUS".into(), "MEMORY".into(), "GPUS".into(), "DOCKER".into()]];
            let mut notes = Vec::new();
            for (name, r) in &results {
                match r {
                    Ok(f) => {
                        rows.push(vec![
                            name.clone(),
                            f.os.clone(),
                            f.arch.clone(),
                            f.cpus.to_string(),
                            format!("{:.1} GiB", f.memory_gib),
                            if f.gpus.is_empty() { "0".into() } else { format!("{} × {}", f.gpus.len(), f.gpus[0].name) },
                            f.docker.clone().unwrap_or_else(|_| "unavailable".into()),
                        ]);
                        let ifaces: Vec<String> = f
                            .interfaces
                            .iter()
                            .filter(|i| i.name != "lo")
                            .map(|i| format!("{} mtu {} {} {}", i.name, i.mtu, i.state, i.addresses.join(" ")).trim_end().to_string())
                            .collect();
                        notes.push(format!("{name}: interfaces: {}", ifaces.join("; ")));
                        if let Some(n) = config.nodes.get(name) {
                            for d in facts::disagreements(&config, n, f) {
                                notes.push(format!("! {name}: {d}"));
                            }
                        }
                    }
                    Err(e) => {
                        unreachable = true;
                        rows.push(vec![name.clone(), "unreachable".into(), String::new(), String::new(), String::new(), String::new(), String::new()]);
                        notes.push(format!("! {name}: {e}"));
                    }
                }
            }
            print!("{}", super::table(&rows));
            println!();
            for n in notes {
                println!("{n}");
            }
        }
        if unreachable {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        }
    })
}

//! `sparkform import [DIR] ADDRESS ID`: adopt one running object into the state.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::prelude::{report_diagnostics, report_error, ConfigArgs, ConnectArgs, InputArgs};
use crate::diag::{Diag, Diagnostics};
use crate::ops;
use crate::plan::render;

const LONG_ABOUT: &str = "Adopt an object that already runs (a container started by hand or by \
a script, a fabric address set with `ip addr`) as the resource ADDRESS of the definitions, \
without restarting or changing it. The object is observed (a container with `docker inspect`: \
image and its ID, command, entrypoint, env, mounts, network/IPC/PID modes, GPUs and devices, \
shm, ulimits, restart policy) and recorded in the state under its lock; the plan printed after \
it shows what the next apply changes to make it what the definitions want (nothing when they \
match). ID is NODE:NAME (or NODE:CONTAINER_ID) for a container and NODE:ADDRESS/PREFIX for a \
network's attachment. `import` blocks in the definitions do the same through plan and apply.";

/// Adopt a running container or fabric address into the state, restarting nothing
#[derive(Args, Debug)]
#[command(
    long_about = LONG_ABOUT,
    after_help = "Examples:\n  sparkform import examples/testbed module.qwen.container.vllm node1:sparkform-vllm\n  sparkform import . network.roce.attach.node1 node1:192.168.200.1/24"
)]
pub struct ImportArgs {
    /// [DIR] ADDRESS ID: the definitions' folder (default: .), the resource address, the object
    #[arg(value_name = "ARGS", num_args = 2..=3, required = true)]
    pub args: Vec<String>,
    #[command(flatten)]
    pub inputs: InputArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub fn run(args: ImportArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let (dir, address, id) = match args.args.as_slice() {
        [a, i] => (PathBuf::from("."), a.clone(), i.clone()),
        [d, a, i] => (PathBuf::from(d), a.clone(), i.clone()),
        _ => {
            let d = Diag::error("cli::import", "import takes [DIR] ADDRESS ID")
                .help("e.g. sparkform import examples/testbed module.qwen.container.vllm node1:sparkform-vllm");
            report_diagnostics(&Diagnostics(vec![d]), false);
            return ExitCode::from(2);
        }
    };
    let config_args = ConfigArgs {
        dir,
        inputs: args.inputs.clone(),
    };
    let evaluated = match config_args.evaluate(false) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let ws = config_args.workspace();
    let request = ops::import::ImportRequest {
        evaluated,
        store: ws.store(),
        address,
        id,
        hosts: args.connect.options(),
    };
    let done = rt.block_on(super::prelude::with_notes(false, |events| async move {
        ops::import::import(request, &events).await
    }));
    let result = match done {
        Ok(r) => r,
        Err(e) => return super::prelude::report_op_error(e, false),
    };
    let what = result
        .recorded_id()
        .map(|id| format!(" (container {})", id.chars().take(12).collect::<String>()))
        .unwrap_or_default();
    let i = &result.import;
    println!(
        "Imported {} from {}{what}; nothing was restarted.",
        i.address, i.id
    );
    for n in &i.notes {
        println!("  Note: {n}.");
    }
    println!();
    print!("{}", render::render(&result.plan));
    if let Err(e) = std::io::Write::flush(&mut std::io::stdout()) {
        return report_error(crate::state::StateError::Io {
            path: PathBuf::from("(stdout)"),
            source: e,
        });
    }
    ExitCode::SUCCESS
}

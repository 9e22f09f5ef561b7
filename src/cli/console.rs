//! `sparkform console`: evaluate expressions against the definitions and the recorded state.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use clap::Args;

use super::prelude::{report_diagnostics, ConfigArgs};
use crate::ops;

const LONG_ABOUT: &str = "Evaluate expressions as the definitions' root module sees them \
(variables, locals, nodes, resources, module outputs, functions), filled with what the recorded \
state says (a model's resolved commit), as Terraform's console does. One expression per line, \
from standard input; in a terminal, a prompt until an empty line, `exit` or Ctrl-D. Read-only: \
it connects to no machine and writes nothing. An expression that reads a sensitive or \
ephemeral value is refused, as an output that would show it is.";

/// Evaluate expressions against the definitions and the recorded state (read-only)
#[derive(Args, Debug)]
#[command(
    long_about = LONG_ABOUT,
    after_help = "Examples:\n  echo 'module.qwen.endpoint' | sparkform console examples/testbed\n  sparkform console examples/testbed          # a prompt, in a terminal\n  echo 'cidrhost(\"10.0.0.0/24\", 5)' | sparkform console ."
)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
}

pub fn run(args: ConsoleArgs) -> ExitCode {
    let ws = args.config.workspace();
    let evaluated = match args.config.evaluate(false) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let console = match ops::console::Console::open(&ws, evaluated) {
        Ok(c) => c,
        Err(e) => return super::prelude::report_op_error(e, false),
    };
    let stdin = std::io::stdin();
    let prompt = stdin.is_terminal();
    let mut failed = false;
    let mut lines = stdin.lock().lines();
    loop {
        if prompt {
            print!("> ");
            let _ = std::io::stdout().flush();
        }
        let Some(Ok(line)) = lines.next() else { break };
        let expression = line.trim();
        if expression.is_empty() {
            if prompt {
                break;
            }
            continue;
        }
        if prompt && expression == "exit" {
            break;
        }
        match console.evaluate(expression) {
            Ok(value) => println!("{}", ops::console::render(&value)),
            Err(ops::OpError::Config(d)) => {
                failed = true;
                report_diagnostics(&d, false);
            }
            Err(e) => {
                failed = true;
                let _ = super::prelude::report_op_error(e, false);
            }
        }
    }
    if failed && !prompt {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

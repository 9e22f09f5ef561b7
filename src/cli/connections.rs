//! `sparkform connections`: the connections the warm mode (`--persist`) kept, and `-close` to
//! end them.

use std::process::ExitCode;

use clap::Args;

/// List the connections kept by --persist (the warm mode), or end them with -close
#[derive(Args, Debug)]
#[command(
    long_about = "With --persist DURATION (or SPARKFORM_PERSIST), a command keeps each node's ssh \
connection open when it ends, and the next command reuses it instead of connecting again. Each \
kept connection ends by itself once it has been idle for DURATION. This lists them: the machine, \
its jump host, the idle bound and how long ago it was opened. A connection whose process died is \
removed as it is found. -close ends every one now. Without --persist nothing is kept: every \
connection ends with its command.",
    after_help = "Examples:\n  sparkform plan examples/testbed --persist 60s\n  sparkform connections\n  sparkform connections -close"
)]
pub struct ConnectionsArgs {
    /// End every kept connection now
    #[arg(long)]
    pub close: bool,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ConnectionsArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let found = match rt.block_on(crate::ops::connections::connections(args.close)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::from(1);
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&found).unwrap_or_else(|_| "{}".into())
        );
        return ExitCode::SUCCESS;
    }
    let alive: Vec<_> = found.connections.iter().filter(|c| c.alive).collect();
    let dead = found.connections.len() - alive.len();
    if alive.is_empty() {
        println!("No kept connections (in {}).", found.folder.display());
    } else {
        let mut rows = vec![vec![
            "ADDRESS".to_string(),
            "MACHINE".into(),
            "VIA".into(),
            "IDLE BOUND".into(),
            "OPENED".into(),
        ]];
        for c in &alive {
            rows.push(vec![
                c.address.clone(),
                c.target.clone(),
                c.via.clone().unwrap_or_else(|| "-".into()),
                format!("{} s", c.persist_secs),
                format!("{} s ago", c.age_secs),
            ]);
        }
        print!("{}", super::prelude::table(&rows));
        if args.close {
            println!("Closed {} connection(s).", alive.len());
        }
    }
    if dead > 0 {
        println!("Removed {dead} that had died.");
    }
    ExitCode::SUCCESS
}

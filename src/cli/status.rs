//! `sparkform status`: nodes, resources as recorded and as running, probes, outputs.

use std::process::ExitCode;

use clap::Args;

use super::prelude::{table, ConfigArgs, ConnectArgs};
use crate::ops::definitions::Pins;
use crate::ops::status::{NoStatus, Seen, Status};

/// Show the deployment on one screen: nodes, what runs, the probes' last results, the outputs
#[derive(Args, Debug)]
#[command(
    long_about = "Show, on one screen, whether each node answers; for each recorded resource, \
what the state records and what the machine has (running with its uptime and restarts, exited \
with its code, missing), and its image ID; the probes' last results from the state; the outputs. \
Changes nothing and takes no lock. Exits 1 when a node is unreachable or a resource is not as \
recorded.",
    after_help = "Example:\n  sparkform status examples/testbed\n  sparkform status examples/testbed --json"
)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// One JSON document
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

fn short(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    &id[..id.len().min(12)]
}

fn uptime(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// Whether everything is as recorded.
pub fn healthy(s: &Status) -> bool {
    s.nodes.iter().all(|n| n.reachable)
        && s.resources
            .iter()
            .all(|r| matches!(r.observed, Seen::Running { .. } | Seen::InSync))
}

pub fn render(s: &Status) -> String {
    let mut out = String::from("Nodes:\n");
    let mut rows = Vec::new();
    for n in &s.nodes {
        rows.push(vec![
            format!("  {}", n.node),
            if n.reachable {
                "reachable"
            } else {
                "UNREACHABLE"
            }
            .to_string(),
            n.error.clone().unwrap_or_default(),
        ]);
    }
    out.push_str(&table(&rows));
    out.push_str("\nResources:\n");
    let mut rows = vec![vec![
        "  ADDRESS".to_string(),
        "NODE".into(),
        "RECORDED".into(),
        "OBSERVED".into(),
        "UPTIME".into(),
        "IMAGE".into(),
    ]];
    for r in &s.resources {
        let restarts = |n: i64| {
            if n > 0 {
                format!(", restarted {n} time{}", if n == 1 { "" } else { "s" })
            } else {
                String::new()
            }
        };
        let (observed, up, image) = match &r.observed {
            Seen::Running {
                uptime_secs,
                restarts: n,
                image_id,
            } => (
                format!("running{}", restarts(*n)),
                uptime_secs.map(uptime).unwrap_or_default(),
                image_id
                    .as_deref()
                    .map(short)
                    .unwrap_or_default()
                    .to_string(),
            ),
            Seen::Exited {
                code,
                restarts: n,
                image_id,
            } => (
                format!("EXITED with code {code}{}", restarts(*n)),
                String::new(),
                image_id
                    .as_deref()
                    .map(short)
                    .unwrap_or_default()
                    .to_string(),
            ),
            Seen::Other { status } => (status.to_uppercase(), String::new(), String::new()),
            Seen::InSync => ("as recorded".into(), String::new(), String::new()),
            Seen::Drifted { notes } => (
                format!("DRIFTED: {}", notes.join("; ")),
                String::new(),
                String::new(),
            ),
            Seen::Missing { reason } => {
                (format!("MISSING: {reason}"), String::new(), String::new())
            }
            Seen::Unknown => (
                "unknown (node unreachable)".into(),
                String::new(),
                String::new(),
            ),
        };
        rows.push(vec![
            format!("  {}", r.address),
            r.node.clone(),
            r.recorded
                .as_deref()
                .map(short)
                .unwrap_or("recorded")
                .to_string(),
            observed,
            up,
            image,
        ]);
    }
    if s.resources.is_empty() {
        out.push_str("  (none recorded)\n");
    } else {
        out.push_str(&table(&rows));
    }
    let logged: Vec<_> = s
        .resources
        .iter()
        .filter(|r| !r.from_log.is_empty())
        .collect();
    if !logged.is_empty() {
        out.push_str("\nFrom the logs when each became ready:\n");
        for r in logged {
            out.push_str(&format!("  {}\n", r.address));
            for (name, values) in &r.from_log {
                for (i, v) in values.iter().enumerate() {
                    let label = if i == 0 {
                        format!("{name}:")
                    } else {
                        String::new()
                    };
                    out.push_str(&format!("    {label:<w$} {v}\n", w = name.len() + 1));
                }
            }
        }
    }
    if !s.probes.is_empty() {
        out.push_str("\nProbes (last run by apply):\n");
        let rows: Vec<Vec<String>> = s
            .probes
            .iter()
            .map(|p| {
                vec![
                    format!("  {}", p.address),
                    p.last_run.clone().unwrap_or_else(|| "never run".into()),
                    p.took_secs
                        .map(|t| format!("(took {})", crate::plan::render::duration(t)))
                        .unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(&rows));
    }
    out.push_str(&restarts(s));
    if !s.outputs.is_empty() {
        out.push_str("\nOutputs:\n");
        for (k, v) in &s.outputs {
            let shown = match v {
                serde_json::Value::Null => "(sensitive)".to_string(),
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("  {k} = {shown}\n"));
        }
    }
    out
}

/// What `sparkform watch` restarted, the newest last; empty without restarts.
fn restarts(s: &Status) -> String {
    let mut out = String::new();
    if !s.restarts.is_empty() {
        out.push_str("\nRestarts by sparkform watch (the newest last):\n");
        for r in &s.restarts {
            out.push_str(&format!(
                "  {} {}: {}\n    {}\n",
                r.at,
                if r.ok { "restarted" } else { "restart FAILED" },
                r.resources.join(", "),
                r.cause
            ));
        }
    }
    out
}

pub fn run(args: StatusArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    let ws = args.config.workspace();
    // Only the nodes are used, which no commit changes.
    let config = match args.config.definitions(args.json, Pins::Unresolved) {
        Ok(d) => d.config,
        Err(code) => return code,
    };
    let status = match rt.block_on(crate::ops::status::deployed(
        &ws,
        &config,
        &args.connect.options(),
    )) {
        Ok(s) => s,
        Err(NoStatus::NothingDeployed(path)) => {
            eprintln!(
                "Error: no state at {}: nothing is deployed from these definitions\n  help: run `sparkform apply` first, or pass -state PATH",
                path.display()
            );
            return ExitCode::from(1);
        }
        Err(NoStatus::State(e)) => {
            eprintln!("Error: {e}");
            return ExitCode::from(1);
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&status) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("Error: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        print!("{}", render(&status));
    }
    if healthy(&status) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::status::{NodeStatus, ProbeStatus, ResourceStatus};
    use crate::vocabulary::KindId;
    use std::collections::BTreeMap;

    fn made_up() -> Status {
        Status {
            nodes: vec![
                NodeStatus {
                    node: "node.a".into(),
                    reachable: true,
                    error: None,
                },
                NodeStatus {
                    node: "node.b".into(),
                    reachable: false,
                    error: Some("node.b: cannot reach sf-b: timed out".into()),
                },
            ],
            resources: vec![
                ResourceStatus {
                    address: "container.head".into(),
                    kind: KindId::Container,
                    node: "node.a".into(),
                    recorded: Some("0123456789abcdef0123".into()),
                    observed: Seen::Running {
                        uptime_secs: Some(3725),
                        restarts: 2,
                        image_id: Some("sha256:feedbeefcafe0000".into()),
                    },
                    from_log: [(
                        "nccl_net".to_string(),
                        vec![
                            "spark1 NET/IB : Using [0]rocep1s0f0:1/RoCE".to_string(),
                            "spark2 NET/Socket : Using [0]enp1s0f0np0:192.168.200.2<0>".to_string(),
                        ],
                    )]
                    .into_iter()
                    .collect(),
                },
                ResourceStatus {
                    address: "container.vllm".into(),
                    kind: KindId::Container,
                    node: "node.a".into(),
                    recorded: Some("abcdef".into()),
                    observed: Seen::Exited {
                        code: 137,
                        restarts: 0,
                        image_id: None,
                    },
                    from_log: BTreeMap::new(),
                },
                ResourceStatus {
                    address: "container.worker".into(),
                    kind: KindId::Container,
                    node: "node.b".into(),
                    recorded: None,
                    observed: Seen::Unknown,
                    from_log: BTreeMap::new(),
                },
            ],
            probes: vec![ProbeStatus {
                address: "probe.hello".into(),
                last_run: Some("200 in 41 ms: I am Qwen".into()),
                took_secs: Some(2.5),
                measured: BTreeMap::new(),
            }],
            outputs: [
                (
                    "endpoint".to_string(),
                    serde_json::json!("http://10.0.0.1:30000"),
                ),
                ("token".to_string(), serde_json::Value::Null),
            ]
            .into_iter()
            .collect(),
            restarts: vec![crate::state::Restart {
                at: "2026-12-03T06:15:29Z".into(),
                cause: "module.qwen.container.rank0: EngineDeadError".into(),
                resources: vec!["module.qwen.container.rank0".into()],
                ok: true,
            }],
        }
    }

    #[test]
    fn a_made_up_observation_renders_on_one_screen() {
        let s = made_up();
        let text = render(&s);
        assert!(
            text.contains("node.b  UNREACHABLE  node.b: cannot reach"),
            "{text}"
        );
        assert!(text.contains("running, restarted 2 times"), "{text}");
        assert!(text.contains("1h2m"), "{text}");
        assert!(text.contains("feedbeefcafe"), "{text}");
        assert!(text.contains("0123456789ab "), "{text}");
        assert!(text.contains("EXITED with code 137"), "{text}");
        assert!(text.contains("unknown (node unreachable)"), "{text}");
        assert!(text.contains("200 in 41 ms: I am Qwen"), "{text}");
        assert!(text.contains("endpoint = http://10.0.0.1:30000"), "{text}");
        assert!(text.contains("token = (sensitive)"), "{text}");
        assert!(
            text.contains("Restarts by sparkform watch (the newest last):\n  2026-12-03T06:15:29Z restarted: module.qwen.container.rank0\n    module.qwen.container.rank0: EngineDeadError"),
            "{text}"
        );
        assert!(
            text.contains("From the logs when each became ready:\n  container.head\n    nccl_net: spark1 NET/IB : Using [0]rocep1s0f0:1/RoCE\n              spark2 NET/Socket"),
            "{text}"
        );
        assert!(!healthy(&s));
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["resources"][1]["observed"]["state"], "exited");
        assert_eq!(j["resources"][1]["observed"]["code"], 137);
        assert_eq!(j["resources"][0]["kind"], "container");
        assert_eq!(
            j["resources"][0]["from_log"]["nccl_net"][1],
            "spark2 NET/Socket : Using [0]enp1s0f0np0:192.168.200.2<0>"
        );
        assert!(j["resources"][1].get("from_log").is_none());
    }

    #[test]
    fn all_running_is_healthy() {
        let mut s = made_up();
        s.nodes.truncate(1);
        s.resources.truncate(1);
        assert!(healthy(&s));
    }
}

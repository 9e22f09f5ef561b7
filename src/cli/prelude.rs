//! What the commands share: the arguments most take (the definitions' folder and variables,
//! the state file, how to reach the machines) and how a result or an error is shown. Each
//! command's file takes what it needs from here; `cli/mod.rs` only parses and dispatches.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::VarInputs;
use crate::diag::{render_for_terminal, Diag, Diagnostics};
use crate::workspace::Workspace;

/// The folder and variables every configuration-reading command takes.
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Folder holding the .hcl definitions
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub inputs: InputArgs,
}

/// Variables and the state file, for commands that evaluate the definitions.
#[derive(Args, Debug, Clone)]
pub struct InputArgs {
    /// Set a variable: -var name=value (repeatable; lists and maps in HCL syntax)
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub vars: Vec<String>,
    /// Read variables from an HCL file of `name = value` lines (repeatable). The folder's own
    /// `sparkform.tfvars` and `*.auto.tfvars` (by name) load by themselves, before these files;
    /// `-var` comes last and wins
    #[arg(long = "var-file", value_name = "FILE")]
    pub var_files: Vec<PathBuf>,
    /// State file (default: DIR/state/sparkform.json)
    #[arg(long = "state", value_name = "PATH")]
    pub state: Option<PathBuf>,
    /// When another command holds the state lock, wait up to DURATION for it (30s, 5m)
    /// instead of failing at once
    #[arg(long = "lock-timeout", value_name = "DURATION", value_parser = parse_lock_timeout)]
    pub lock_timeout: Option<std::time::Duration>,
    /// The state's workspace: another state of the same definitions (a PostgreSQL row, or the
    /// local file DIR/state/workspaces/NAME/sparkform.json); `sparkform workspace list`
    #[arg(long = "workspace", env = "SPARKFORM_WORKSPACE", value_name = "NAME", value_parser = parse_workspace)]
    pub workspace: Option<String>,
}

/// `-workspace`'s value: a name a state can be kept under.
fn parse_workspace(text: &str) -> Result<String, String> {
    if crate::config::backend::is_workspace_name(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a workspace name: use letters, digits, `_`, `-` and `.` (not first), at most 128"
        ))
    }
}

/// `-lock-timeout`'s value: a duration as the definitions write one (`90`, `30s`, `5m`, `1h`).
fn parse_lock_timeout(text: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_duration(text)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is not a duration: write 30s, 5m or 1h"))
}

/// How the state lock waits with `-lock-timeout`: it tells, once, who holds it and since when.
fn lock_wait(timeout: Option<std::time::Duration>) -> Option<crate::state::LockWait> {
    let timeout = timeout.filter(|t| !t.is_zero())?;
    Some(crate::state::LockWait {
        timeout,
        notify: std::sync::Arc::new(|holder: &crate::state::LockInfo, timeout| {
            eprintln!(
                "Waiting up to {} for the state lock: `{}` holds it since {} (PID {} on {}, lock ID {})…",
                crate::plan::render::duration(timeout.as_secs_f64()),
                holder.operation,
                holder.started,
                holder.pid,
                holder.host,
                holder.id
            );
        }),
    })
}

impl ConfigArgs {
    pub fn workspace(&self) -> Workspace {
        Workspace::new(&self.dir, self.inputs.state.as_deref())
            .in_workspace(self.inputs.workspace.as_deref())
            .with_lock_wait(lock_wait(self.inputs.lock_timeout))
    }

    /// The definitions evaluated as written (`ops::definitions::load`), with its variables;
    /// `Err` once the errors are reported.
    pub fn evaluate(&self, json: bool) -> Result<crate::ops::definitions::Evaluated, ExitCode> {
        let vars = self.var_inputs().map_err(|d| {
            report_diagnostics(&Diagnostics(vec![*d]), json);
            ExitCode::from(1)
        })?;
        crate::ops::definitions::load(&self.workspace(), &vars)
            .map_err(|e| report_op_error(e, json))
    }

    /// [`Self::evaluate`] filled by `pins`, connecting to nothing; warnings not shown.
    pub fn definitions(
        &self,
        json: bool,
        pins: crate::ops::definitions::Pins<'_>,
    ) -> Result<crate::ops::definitions::Definitions, ExitCode> {
        self.evaluate(json)?
            .pin(pins)
            .map_err(|e| report_op_error(e, json))
    }

    pub fn var_inputs(&self) -> Result<VarInputs, Box<Diag>> {
        let mut inputs = VarInputs::from_env();
        inputs.files = self.inputs.var_files.clone();
        for v in &self.inputs.vars {
            match v.split_once('=') {
                Some((k, val)) if !k.is_empty() => {
                    inputs.cli.push((k.to_string(), val.to_string()))
                }
                _ => {
                    return Err(Box::new(
                        Diag::error("cli::var", format!("-var {v:?} is not NAME=VALUE"))
                            .help("write -var name=value, e.g. -var port=30000"),
                    ))
                }
            }
        }
        Ok(inputs)
    }
}

/// The state file of commands that only read the state, and the `--dir` spelling of their
/// folder that scripts written before the folder became positional still use.
#[derive(Args, Debug, Clone)]
pub struct StateFile {
    /// State file (default: DIR/state/sparkform.json)
    #[arg(long = "state", value_name = "PATH")]
    pub state: Option<PathBuf>,
    /// When another command holds the state lock, wait up to DURATION for it (30s, 5m)
    /// instead of failing at once
    #[arg(long = "lock-timeout", value_name = "DURATION", value_parser = parse_lock_timeout)]
    pub lock_timeout: Option<std::time::Duration>,
    /// The state's workspace (a PostgreSQL row, or DIR/state/workspaces/NAME/sparkform.json)
    #[arg(long = "workspace", env = "SPARKFORM_WORKSPACE", value_name = "NAME", value_parser = parse_workspace)]
    pub workspace: Option<String>,
    /// The folder, as older scripts give it; DIR is the way now
    #[arg(long = "dir", value_name = "DIR", hide = true)]
    pub old_dir: Option<PathBuf>,
}

impl StateFile {
    /// The deployment whose folder is `dir` (or `--dir`, or the current folder). A folder
    /// that was named must exist; the default one need not when `-state` names the file.
    pub fn workspace(&self, dir: Option<&std::path::Path>) -> Result<Workspace, ExitCode> {
        let named = match (dir, self.old_dir.as_deref()) {
            (Some(a), Some(b)) if a != b => {
                eprintln!(
                    "Error: two folders given, {} and --dir {}; give the deployment's folder once, as the DIR argument.",
                    a.display(),
                    b.display()
                );
                return Err(ExitCode::from(1));
            }
            (Some(a), _) | (None, Some(a)) => Some(a),
            (None, None) => None,
        };
        let ws = Workspace::new(
            named.unwrap_or(std::path::Path::new(".")),
            self.state.as_deref(),
        )
        .in_workspace(self.workspace.as_deref())
        .with_lock_wait(lock_wait(self.lock_timeout));
        if named.is_some() || self.state.is_none() {
            if let Err(message) = ws.check_folder() {
                eprintln!("Error: {message}");
                return Err(ExitCode::from(1));
            }
        }
        Ok(ws)
    }
}

/// How to reach the machines.
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Trust the host key of a machine seen for the first time (a changed key is still refused)
    #[arg(long = "accept-new-host-keys")]
    pub accept_new_host_keys: bool,
    /// Seconds to wait for each SSH connection
    #[arg(long = "connect-timeout", value_name = "SECONDS", default_value_t = 10)]
    pub connect_timeout: u64,
    /// Keep each connection open after this command for the next one, ending it after DURATION idle (10s to 1h, e.g. 60s; `off` by default: nothing outlives the command). See `sparkform connections`
    #[arg(
        long = "persist",
        env = "SPARKFORM_PERSIST",
        value_name = "DURATION",
        value_parser = crate::ops::connections::parse_persist
    )]
    pub persist: Option<crate::ops::connections::Persist>,
}

impl ConnectArgs {
    // The tests' builds have one more field (`fake`), the product's none.
    #[allow(clippy::needless_update)]
    pub fn options(&self) -> crate::ops::HostOptions {
        crate::ops::HostOptions {
            accept_new_host_keys: self.accept_new_host_keys,
            connect_timeout: std::time::Duration::from_secs(self.connect_timeout.max(1)),
            use_user_config: std::env::var_os("SPARKFORM_NO_USER_SSH_CONFIG").is_none(),
            persist: self.persist.and_then(|p| p.0),
            ..crate::ops::HostOptions::default()
        }
    }
}

/// The line a plan or an apply starts with when its state is not the `default` workspace's:
/// the same definitions then deploy another cluster, and the reader should see which.
pub fn workspace_header(ws: &Workspace) -> Option<String> {
    let name = ws.workspace_name();
    (name != crate::config::backend::DEFAULT_WORKSPACE).then(|| {
        format!(
            "Workspace \"{name}\": the state in {}.\n",
            ws.store().describe()
        )
    })
}

/// A plain text table: columns padded to their widest cell.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Print configuration diagnostics to stderr (or as JSON to stdout) and say how many.
pub fn report_diagnostics(diags: &Diagnostics, json: bool) {
    if json {
        println!("{}", diagnostics_json(&diags.0));
        return;
    }
    eprint!("{}", render_for_terminal(&diags.0));
    let n = diags.error_count();
    if n > 0 {
        eprintln!(
            "Error: {} error{} in the configuration.",
            n,
            if n == 1 { "" } else { "s" }
        );
    }
}

pub fn report_warnings(warnings: &[Diag]) {
    if !warnings.is_empty() {
        eprint!("{}", render_for_terminal(warnings));
    }
}

/// Run an operation with its notes (a lock taken over, a refresh) drawn on stderr.
pub async fn with_notes<T, F>(json: bool, work: impl FnOnce(crate::events::Sender) -> F) -> T
where
    F: std::future::Future<Output = T>,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let notes = crate::ui::spawn_notes(json, rx);
    let result = work(tx).await;
    let _ = notes.await;
    result
}

/// Why an operation did not start, rendered as each error always was.
pub fn report_op_error(e: crate::ops::OpError, json: bool) -> ExitCode {
    use crate::ops::OpError;
    match e {
        OpError::Config(d) => {
            report_diagnostics(&d, json);
            ExitCode::from(1)
        }
        OpError::State(e) => report_error(e),
        OpError::PlanFile(e) => report_error(e),
        OpError::Refresh(errors) => {
            // Connected, but a program the read needs is not on the node: nothing to fix in
            // the connection.
            let programs = !errors.is_empty()
                && errors
                    .iter()
                    .all(|e| matches!(**e, crate::ops::HostError::ProgramMissing { .. }));
            for e in errors {
                eprintln!("{:?}", miette::Report::new(SharedHostError(e)));
            }
            if programs {
                eprintln!("Error: cannot refresh; install what is missing on the node, or plan against the state alone with -refresh=false.");
            } else {
                eprintln!("Error: cannot refresh; fix the connection, or plan against the state alone with -refresh=false.");
            }
            ExitCode::from(1)
        }
        OpError::DefinitionsChanged(address) => {
            eprintln!(
                "Error: the definitions changed since the plan was made ({address} differs); make a new plan."
            );
            ExitCode::from(1)
        }
        OpError::Local(message) => {
            eprintln!("Error: {message}");
            ExitCode::from(1)
        }
    }
}

/// Any other error (state, plan file, I/O), rendered by miette.
pub fn report_error(e: impl miette::Diagnostic + Send + Sync + 'static) -> ExitCode {
    eprintln!("{:?}", miette::Report::new(e));
    ExitCode::from(1)
}

/// Each diagnostic as JSON: severity, message, where (the first label's file, line and column,
/// so a reader need not dig into `labels`), code, help and every label.
pub fn diagnostics_values(diags: &[Diag]) -> Vec<serde_json::Value> {
    diags
        .iter()
        .map(|d| {
            let labels: Vec<serde_json::Value> = d
                .labels
                .iter()
                .filter_map(|(range, text)| {
                    let file = d.source.as_ref()?;
                    let (line, column) = file.line_col(range.start);
                    Some(serde_json::json!({
                        "file": file.display, "line": line, "column": column,
                        "start": range.start, "end": range.end, "label": text,
                    }))
                })
                .collect();
            let at = |key: &str| {
                labels
                    .first()
                    .map_or(serde_json::Value::Null, |l| l[key].clone())
            };
            serde_json::json!({
                "severity": match d.severity { miette::Severity::Error => "error", miette::Severity::Warning => "warning", miette::Severity::Advice => "advice" },
                "code": d.code,
                "message": d.message,
                "file": at("file"),
                "line": at("line"),
                "column": at("column"),
                "help": d.help,
                "labels": labels,
            })
        })
        .collect()
}

pub fn diagnostics_json(diags: &[Diag]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "valid": !diags.iter().any(Diag::is_error),
        "diagnostics": diagnostics_values(diags),
    }))
    .unwrap_or_default()
}

/// A host error shared between tasks, rendered by miette with its help.
#[derive(Debug)]
pub struct SharedHostError(pub std::sync::Arc<crate::ops::HostError>);

impl std::fmt::Display for SharedHostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedHostError {}

impl miette::Diagnostic for SharedHostError {
    fn code<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.0.code()
    }
    fn help<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.0.help()
    }
}

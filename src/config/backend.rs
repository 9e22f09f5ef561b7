//! The `state { … }` block: where the deployment's state lives (the local file, the default, or
//! a PostgreSQL table). Literal values only, as Terraform's backend block: the workspace knows
//! where the state is before anything is evaluated. The connection is never written here: it
//! comes from the environment (`SPARKFORM_PG_CONN`, or libpq's `PG*` variables).

use std::path::Path;
use std::sync::Arc;

use hcl_edit::expr::Expression;
use hcl_edit::structure::{Block, Structure};
use hcl_edit::Span as _;

use super::lowering::{header_span, span_of};
use super::schema::STATE;
use crate::diag::{did_you_mean, Diag, Diagnostics, SourceFile};

/// Which backend keeps the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// `DIR/state/sparkform.json` (or `-state PATH`).
    Local,
    /// A row of `SCHEMA.states` in PostgreSQL.
    Pg,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Pg => "pg",
        }
    }
}

/// What a `state` block says, with where it is (`file:line:col`) for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateBlock {
    pub backend: BackendKind,
    /// The PostgreSQL schema holding the tables (`sparkform` unless set).
    pub schema: String,
    /// The row's name: one deployment's state (`default` unless set).
    pub workspace: String,
    pub at: String,
}

pub const DEFAULT_SCHEMA: &str = "sparkform";
pub const DEFAULT_WORKSPACE: &str = "default";

/// Attributes that would put a connection (and so, perhaps, a password) in the definitions.
const CONNECTION_WORDS: &[&str] = &[
    "conn",
    "conn_str",
    "connection",
    "connection_string",
    "dsn",
    "url",
    "uri",
    "password",
    "passwd",
    "host",
    "port",
    "user",
    "username",
    "dbname",
    "database",
];

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
}

/// A workspace's name: letters, digits, `_`, `-` and `.`, not starting with a dot (a local
/// workspace is a folder of that name).
pub fn is_workspace_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Checks one `state` block; every problem found, at once.
pub fn check_block(file: &Arc<SourceFile>, block: &Block) -> Result<StateBlock, Vec<Diag>> {
    let header = header_span(file, block);
    let mut diags = Vec::new();
    let mut out = StateBlock {
        backend: BackendKind::Local,
        schema: DEFAULT_SCHEMA.to_string(),
        workspace: DEFAULT_WORKSPACE.to_string(),
        at: header.location(),
    };
    if !block.labels.is_empty() {
        diags.push(
            Diag::error("config::state_block", "`state` takes no label")
                .label(&header, "here")
                .help("write `state { backend = \"pg\" }`"),
        );
    }
    for structure in block.body.iter() {
        let attr = match structure {
            Structure::Attribute(a) => a,
            Structure::Block(b) => {
                diags.push(
                    Diag::error(
                        "config::unknown_block",
                        format!("unknown block `{}` in `state`", b.ident.as_str()),
                    )
                    .label(&header_span(file, b), "not expected here")
                    .help("`state` takes: backend, schema, workspace"),
                );
                continue;
            }
        };
        let key = attr.key.as_str();
        let key_span = span_of(file, attr.key.span());
        let value_span = span_of(file, attr.value.span());
        if STATE.attr(key).is_none() {
            let d = if CONNECTION_WORDS.contains(&key) {
                // No snippet: the line may hold a password; the message says where it is.
                Diag::error(
                    "config::state_connection",
                    format!("{}: `{key}` in `state` cannot be written in the definitions: the connection to PostgreSQL comes from the environment only", key_span.location()),
                )
                .help("set SPARKFORM_PG_CONN (e.g. \"host=/run/postgresql dbname=sparkform user=deploy\"), or libpq's PGHOST, PGPORT, PGUSER, PGDATABASE and PGPASSWORD, in the environment of the commands")
            } else {
                let d = Diag::error(
                    "config::unknown_attribute",
                    format!("unknown attribute `{key}` in `state`"),
                )
                .label(&key_span, "not expected here");
                match did_you_mean(key, STATE.names()) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help("`state` takes: backend, schema, workspace"),
                }
            };
            diags.push(d);
            continue;
        }
        let Expression::String(s) = &attr.value else {
            diags.push(
                Diag::error(
                    "config::state_literal",
                    format!("`{key}` in `state` is a string literal"),
                )
                .label(&value_span, "not a plain string")
                .help("where the state lives is known before anything is evaluated: no variables, references or templates here"),
            );
            continue;
        };
        let text = s.value().to_string();
        if text.contains("://") || text.contains("password") {
            diags.push(
                Diag::error(
                    "config::state_connection",
                    format!("{}: `{key}` in `state` looks like a connection string; the connection to PostgreSQL comes from the environment only", value_span.location()),
                )
                .help("set SPARKFORM_PG_CONN in the environment, never in a file that is committed"),
            );
            continue;
        }
        match key {
            "backend" => match text.as_str() {
                "local" => out.backend = BackendKind::Local,
                "pg" | "postgres" | "postgresql" => out.backend = BackendKind::Pg,
                other => diags.push(
                    Diag::error(
                        "config::state_backend",
                        format!("unknown state backend {other:?}"),
                    )
                    .label(&value_span, "here")
                    .help("backends are \"local\" (the file DIR/state/sparkform.json, the default) and \"pg\" (PostgreSQL)"),
                ),
            },
            "schema" if !is_identifier(&text) => diags.push(
                Diag::error(
                    "config::state_schema",
                    format!("schema {text:?} is not a plain PostgreSQL name"),
                )
                .label(&value_span, "here")
                .help("lower-case letters, digits and `_`, starting with a letter or `_`, at most 63 characters"),
            ),
            "schema" => out.schema = text,
            "workspace" if !is_workspace_name(&text) => diags.push(
                Diag::error(
                    "config::state_workspace",
                    format!("workspace {text:?} is not a valid name"),
                )
                .label(&value_span, "here")
                .help("letters, digits, `_`, `-` and `.`, at most 128 characters"),
            ),
            _ => out.workspace = text,
        }
    }
    if diags.is_empty() {
        Ok(out)
    } else {
        Err(diags)
    }
}

/// The `state` block of the definitions in `dir`, read without evaluating anything: `None`
/// when there is none (or no definitions: `-state PATH` alone). Errors are the block's, a
/// second block, or definitions that do not parse.
pub fn read(dir: &Path) -> Result<Option<StateBlock>, Diagnostics> {
    let has_hcl = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "hcl"))
        })
        .unwrap_or(false);
    if !has_hcl {
        return Ok(None);
    }
    let mut diags = Diagnostics::default();
    let Some(files) = super::parse::read_folder(dir, &mut diags) else {
        return Err(diags);
    };
    if diags.has_errors() {
        return Err(diags);
    }
    let mut found: Option<StateBlock> = None;
    for (file, body) in &files.files {
        for block in body.blocks().filter(|b| b.ident.as_str() == STATE.kind) {
            match check_block(file, block) {
                Ok(b) => {
                    if let Some(first) = &found {
                        diags.push(
                            Diag::error("config::state_block", "a second `state` block")
                                .label(&header_span(file, block), "here")
                                .help(format!(
                                    "the state lives in one place: keep the block at {}",
                                    first.at
                                )),
                        );
                    } else {
                        found = Some(b);
                    }
                }
                Err(ds) => diags.0.extend(ds),
            }
        }
    }
    if diags.has_errors() {
        Err(diags)
    } else {
        Ok(found)
    }
}

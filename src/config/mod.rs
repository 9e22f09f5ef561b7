//! From a folder of HCL files to an evaluated [`Config`]. Reads the files; does no other I/O.

mod arith;
pub mod backend;
mod eval;
pub mod functions;
pub mod limits;
pub(crate) mod lowering;
mod model;
mod parse;
pub mod refs;
pub mod schema;
pub mod types;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hcl::eval::Evaluate;
use hcl_edit::Span as _;

pub use eval::{parse_duration, parse_size, valid_name};
pub use model::*;
pub use parse::strip_bom;

use crate::diag::{did_you_mean, Diag, Diagnostics, SourceFile, Span};
use eval::{InputValue, Loader};

/// How many times the definitions of a folder were evaluated in this process (tests: how many
/// evaluations an operation makes), keyed by the folder so tests running at once do not mix.
/// One map update per evaluation: too little to keep out of the product.
pub mod evaluations {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static COUNTS: Mutex<Option<HashMap<PathBuf, usize>>> = Mutex::new(None);

    pub(super) fn count(dir: &Path) {
        let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
        *counts
            .get_or_insert_with(HashMap::new)
            .entry(dir.to_path_buf())
            .or_default() += 1;
    }

    /// The evaluations of the definitions in `dir` so far.
    pub fn of(dir: &Path) -> usize {
        let counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .as_ref()
            .and_then(|c| c.get(dir).copied())
            .unwrap_or(0)
    }
}

/// Load and evaluate the configuration in `dir`. On failure, every independent error found.
pub fn load(dir: &Path, vars: &VarInputs) -> Result<Config, Diagnostics> {
    load_with_readings(dir, vars, &Readings::default())
}

/// [`load`], with what the machines said about the values a definition leaves to them.
pub fn load_with_readings(
    dir: &Path,
    vars: &VarInputs,
    readings: &Readings,
) -> Result<Config, Diagnostics> {
    load_with(dir, vars, readings, None)
}

/// The name of the file that holds `sparkform console`'s expression in its messages.
pub const CONSOLE_FILE: &str = "<console>";
/// The output the console's expression is evaluated as, in the root module.
pub const CONSOLE_OUTPUT: &str = "sparkform_console";

/// What comes before the console's expression in [`CONSOLE_FILE`]: a message's place in the
/// file, less its length, is its place in the expression.
pub fn console_prefix() -> String {
    format!("output \"{CONSOLE_OUTPUT}\" {{\n  value = ")
}

/// [`load_with_readings`], with `expression` evaluated in the root module as if it were the
/// value of an output [`CONSOLE_OUTPUT`] written in a file [`CONSOLE_FILE`]: what it reads is
/// checked as an output's value is (a sensitive or ephemeral value refused), and its errors
/// point into that one line.
pub fn load_for_console(
    dir: &Path,
    vars: &VarInputs,
    readings: &Readings,
    expression: &str,
) -> Result<Config, Diagnostics> {
    load_with(dir, vars, readings, Some(expression))
}

fn load_with(
    dir: &Path,
    vars: &VarInputs,
    readings: &Readings,
    console: Option<&str>,
) -> Result<Config, Diagnostics> {
    evaluations::count(dir);
    let _budget = limits::Budget::begin();
    // The sensitive values of an earlier load on this thread are not this one's.
    crate::diag::forget_secrets();
    let mut loader = Loader::new(dir);
    loader.readings = readings.clone();
    loader.config.vars = vars.clone();
    loader.config.readings = readings.clone();
    let Some(mut files) = loader.load_folder(dir) else {
        return Err(loader.diags);
    };
    if let Some(expression) = console {
        // One expression, and nothing around it (a `}` that would close the block first).
        let alone = Arc::new(crate::diag::SourceFile::new(
            Path::new(CONSOLE_FILE),
            expression.to_string(),
        ));
        if !parse::is_one_expression(&alone, &mut loader.diags) {
            return Err(loader.diags);
        }
        let text = format!("{}{expression}\n}}\n", console_prefix());
        let file = Arc::new(crate::diag::SourceFile::new(Path::new(CONSOLE_FILE), text));
        let parsed = parse::parse_source(file, &mut loader.diags);
        let Some(parsed) = parsed else {
            return Err(loader.diags);
        };
        std::rc::Rc::make_mut(&mut files).files.push(parsed);
    }
    let mut secret_names = Vec::new();
    let declared: Vec<(String, Option<types::Type>)> = Loader::declared_variables(&files)
        .into_iter()
        .map(|(name, _, block)| {
            let ty = block
                .body
                .get_attribute("type")
                .and_then(|a| types::parse_type(&a.value).ok());
            // An ephemeral variable is sensitive too.
            let sensitive = ["sensitive", "ephemeral"].iter().any(|k| {
                block.body.get_attribute(k).is_some_and(
                    |a| matches!(&a.value, hcl_edit::expr::Expression::Bool(b) if *b.value()),
                )
            });
            if sensitive {
                secret_names.push(name.clone());
            }
            (name, ty)
        })
        .collect();
    // A sensitive value set on the command line must not appear in the messages about it.
    for (name, raw) in vars.env.iter().chain(vars.cli.iter()) {
        if secret_names.contains(name) {
            crate::diag::note_secret(raw);
        }
    }
    for name in sensitive_on_command_line(vars, &secret_names) {
        loader.diags.push(
            Diag::warning(
                "config::sensitive_var_argument",
                format!("the sensitive variable `{name}` was given as `-var {name}=…`: its value is in sparkform's process arguments, which every user of this machine can read (`ps`, /proc)"),
            )
            .help(format!("set it in the environment as SPARKFORM_VAR_{name}, or in a -var-file readable only by you (docs/security.md)")),
        );
    }
    let inputs = root_inputs(dir, vars, &declared, &secret_names, &mut loader.diags);
    let result = loader.eval_module(&files, &[], inputs, &Default::default(), None);
    loader.config.outputs = result.output_items;
    loader.check_moves();
    if loader.diags.has_errors() {
        loader.diags.sort();
        return Err(loader.diags);
    }
    loader.config.warnings = loader.diags.0;
    // One set of sensitive texts for everything shown later: what the load noted (the
    // variables' values, every tainted value) and what the lowering built from them.
    let mut secrets = crate::diag::noted_secrets();
    secrets.extend(&crate::secrets::Secrets::new(loader.config.secret_texts()));
    loader.config.secrets = secrets;
    Ok(loader.config)
}

/// The sensitive variables set with `-var`, each once, in command-line order.
fn sensitive_on_command_line<'a>(vars: &'a VarInputs, secret_names: &[String]) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for (name, _) in &vars.cli {
        if secret_names.contains(name) && !out.contains(&name.as_str()) {
            out.push(name);
        }
    }
    out
}

fn root_inputs(
    dir: &Path,
    vars: &VarInputs,
    declared: &[(String, Option<types::Type>)],
    secret_names: &[String],
    diags: &mut Diagnostics,
) -> HashMap<String, InputValue> {
    let mut out = HashMap::new();
    let names: Vec<&str> = declared.iter().map(|(n, _)| n.as_str()).collect();
    let unknown = |name: &str, origin: &str| {
        let mut d = Diag::error(
            "config::unknown_variable",
            format!("{origin} sets `{name}`, but no variable `{name}` is declared"),
        );
        d = match did_you_mean(name, names.iter().copied()) {
            Some(s) => d.help(format!("did you mean `{s}`?")),
            None if names.is_empty() => d.help("the configuration declares no variables"),
            None => d.help(format!("declared variables: {}", names.join(", "))),
        };
        d
    };
    for (name, raw) in &vars.env {
        // Like Terraform, environment values for undeclared variables are ignored: the
        // environment is shared with other configurations.
        if let Some((_, ty)) = declared.iter().find(|(n, _)| n == name) {
            let origin = format!("SPARKFORM_VAR_{name}");
            match parse_cli_value(raw, ty.as_ref()) {
                Ok(value) => {
                    out.insert(name.clone(), input(value, None, origin));
                }
                Err(msg) => diags.push(Diag::error("config::var", format!("{origin}: {msg}"))),
            }
        }
    }
    // Terraform's order: the environment, the definitions' own files (`sparkform.tfvars`, then
    // `*.auto.tfvars` by name), `-var-file`, `-var`; a later value wins.
    for (file, origin) in auto_var_files(dir)
        .into_iter()
        .chain(vars.files.iter().map(|f| (f.clone(), VarFileOrigin::Given)))
    {
        var_file_inputs(
            &file,
            origin,
            &names,
            &unknown,
            secret_names,
            diags,
            &mut out,
        );
    }
    for (name, raw) in &vars.cli {
        let origin = format!("-var {name}=…");
        match declared.iter().find(|(n, _)| n == name) {
            None => diags.push(unknown(name, &format!("-var {name}=…"))),
            Some((_, ty)) => match parse_cli_value(raw, ty.as_ref()) {
                Ok(value) => {
                    out.insert(name.clone(), input(value, None, origin));
                }
                Err(msg) => diags.push(
                    Diag::error("config::var", format!("-var {name}: {msg}")).help(
                        "lists, maps and objects are written in HCL: -var 'xs=[\"a\",\"b\"]'",
                    ),
                ),
            },
        }
    }
    out
}

/// Where a var file comes from: the definitions' folder loads `sparkform.tfvars` and
/// `*.auto.tfvars` by itself, as Terraform its `terraform.tfvars`; `-var-file` names the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VarFileOrigin {
    Auto,
    Given,
}

impl VarFileOrigin {
    /// How a message names the file.
    fn flag(self, file: &Path) -> String {
        match self {
            VarFileOrigin::Auto => format!("the auto-loaded {}", file.display()),
            VarFileOrigin::Given => format!("-var-file {}", file.display()),
        }
    }
}

/// The folder's own var files, in the order they apply: `sparkform.tfvars`, then every
/// `*.auto.tfvars` by name. A folder that cannot be listed has none (its definitions' own
/// read says why).
fn auto_var_files(dir: &Path) -> Vec<(PathBuf, VarFileOrigin)> {
    let mut out = Vec::new();
    let main = dir.join("sparkform.tfvars");
    if main.is_file() {
        out.push((main, VarFileOrigin::Auto));
    }
    let mut auto: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(".auto.tfvars"))
        })
        .collect();
    auto.sort();
    out.extend(auto.into_iter().map(|p| (p, VarFileOrigin::Auto)));
    out
}

/// The values one var file sets, into `out`: `name = value` lines only, each a declared
/// variable, each a literal.
fn var_file_inputs(
    file: &Path,
    origin: VarFileOrigin,
    names: &[&str],
    unknown: &dyn Fn(&str, &str) -> Diag,
    secret_names: &[String],
    diags: &mut Diagnostics,
    out: &mut HashMap<String, InputValue>,
) {
    let mut file_diags = Diagnostics::default();
    let Some((src, body)) = parse::read_file(file, &mut file_diags) else {
        for mut d in file_diags.0 {
            d.message = format!("in {}: {}", origin.flag(file), d.message);
            if !secret_names.is_empty() {
                without_excerpt(&mut d, secret_names);
            }
            diags.push(d);
        }
        return;
    };
    // Before any message about the file: its secrets are masked in the excerpts shown.
    for structure in body.iter() {
        if let hcl_edit::structure::Structure::Attribute(attr) = structure {
            if secret_names.iter().any(|n| n == attr.key.as_str()) {
                if let hcl_edit::expr::Expression::String(v) = &attr.value {
                    crate::diag::note_secret(v.value());
                }
                if let Some(text) = attr.value.span().and_then(|r| src.text.get(r)) {
                    crate::diag::note_secret(text);
                }
            }
        }
    }
    for structure in body.iter() {
        let hcl_edit::structure::Structure::Attribute(attr) = structure else {
            let span = Span::new(&src, structure.span().unwrap_or(0..0));
            diags.push(
                Diag::error(
                    "config::var_file",
                    "a var file holds only `name = value` lines",
                )
                .label(&span, "blocks are not allowed here"),
            );
            continue;
        };
        let name = attr.key.as_str();
        let key_span = Span::new(&src, attr.key.span().unwrap_or(0..0));
        if !names.contains(&name) {
            diags.push(
                unknown(name, &origin.flag(file)).label(&key_span, "not a declared variable"),
            );
            continue;
        }
        if let Some(value) = literal_value(&src, &attr.value, diags) {
            let span = Span::new(&src, attr.value.span().unwrap_or(0..0));
            out.insert(
                name.to_string(),
                input(value, Some(span), origin.flag(file)),
            );
        }
    }
}

/// A var file that does not parse cannot say which of its text is a sensitive value, so its
/// error shows the place (file, line, column) without the file's lines.
fn without_excerpt(d: &mut Diag, secret_names: &[String]) {
    if let Some(at) = d.location() {
        d.message = format!("{} (at {at})", d.message);
    }
    d.labels.clear();
    d.source = None;
    d.related.clear();
    let names: Vec<String> = secret_names.iter().map(|n| format!("`{n}`")).collect();
    let why = format!(
        "the file's lines are not shown: it may hold the value of a sensitive variable ({})",
        names.join(", ")
    );
    d.help = Some(match d.help.take() {
        Some(h) => format!("{h}; {why}"),
        None => why,
    });
}

fn input(value: hcl::Value, span: Option<Span>, origin: String) -> InputValue {
    InputValue {
        value,
        sensitive: false,
        ephemeral: false,
        deps: Default::default(),
        span,
        origin,
    }
}

/// A command-line value: taken as a string for primitive types, parsed as HCL otherwise.
fn parse_cli_value(raw: &str, ty: Option<&types::Type>) -> Result<hcl::Value, String> {
    use types::Type;
    let as_hcl = match ty {
        Some(Type::String | Type::Number | Type::Bool) => false,
        Some(_) => true,
        None => {
            let t = raw.trim_start();
            t.starts_with('[') || t.starts_with('{')
        }
    };
    if !as_hcl {
        return Ok(hcl::Value::String(raw.to_string()));
    }
    let expr = hcl_edit::parser::parse_expr(raw)
        .map_err(|e| format!("cannot parse {raw:?} as HCL: {}", e.message()))?;
    if !refs::collect(&expr).refs.is_empty() {
        return Err("values given on the command line cannot refer to other values".into());
    }
    let mut ctx = hcl::eval::Context::new();
    functions::declare_all(&mut ctx);
    let e = arith::guard(expr.into());
    e.evaluate(&ctx).map_err(|e| arith::message(&e))
}

fn literal_value(
    src: &Arc<SourceFile>,
    expr: &hcl_edit::expr::Expression,
    diags: &mut Diagnostics,
) -> Option<hcl::Value> {
    let span = Span::new(src, expr.span().unwrap_or(0..0));
    if !refs::collect(expr).refs.is_empty() {
        diags.push(
            Diag::error(
                "config::var_file",
                "values in a var file cannot refer to other values",
            )
            .label(&span, "a reference"),
        );
        return None;
    }
    let mut ctx = hcl::eval::Context::new();
    functions::declare_all(&mut ctx);
    let e = arith::guard(expr.clone().into());
    match e.evaluate(&ctx) {
        Ok(v) => Some(v),
        Err(err) => {
            let msg = arith::message(&err);
            diags.push(
                Diag::error("config::eval", format!("cannot evaluate: {msg}")).label(&span, msg),
            );
            None
        }
    }
}

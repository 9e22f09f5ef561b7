//! `sparkform console`: an expression evaluated in the definitions' root module, as the
//! recorded state fills them (a model's commit), connecting to nothing and changing nothing.

use crate::config::{CONSOLE_FILE, CONSOLE_OUTPUT};
use crate::diag::{Diag, Diagnostics};
use crate::state::State;

use super::definitions::{Evaluated, Pins};
use super::OpError;

/// The definitions as the console evaluates expressions in them: as written, filled with what
/// the recorded state says.
pub struct Console {
    evaluated: Evaluated,
    readings: crate::config::Readings,
}

impl Console {
    /// The definitions of `evaluated`, filled with what the workspace's state records (nothing
    /// when it records nothing).
    pub fn open(ws: &crate::workspace::Workspace, evaluated: Evaluated) -> Result<Self, OpError> {
        let state: Option<State> = ws.state()?;
        let readings = evaluated
            .readings(Pins::Recorded(state.as_ref()))?
            .unwrap_or_default();
        Ok(Console {
            evaluated,
            readings,
        })
    }

    /// The value of `expression`. One that reads a sensitive or ephemeral value is refused, as
    /// an output that would show it is; its errors point into the expression
    /// ([`CONSOLE_FILE`]).
    pub fn evaluate(&self, expression: &str) -> Result<serde_json::Value, OpError> {
        let config = self.evaluated.config();
        let loaded =
            crate::config::load_for_console(&config.dir, &config.vars, &self.readings, expression)
                .map_err(|d| OpError::Config(in_console_only(d, expression)))?;
        loaded
            .outputs
            .into_iter()
            .find(|o| o.name == CONSOLE_OUTPUT)
            .map(|o| o.value)
            .ok_or_else(|| OpError::Local("the expression gave no value".into()))
    }
}

/// The errors about the expression (the definitions' own loaded once already without them),
/// each pointing into the expression alone, in its words: what the output it is evaluated as
/// would refuse is what the console does not show.
fn in_console_only(all: Diagnostics, expression: &str) -> Diagnostics {
    let alone = std::sync::Arc::new(crate::diag::SourceFile::new(
        std::path::Path::new(CONSOLE_FILE),
        expression.to_string(),
    ));
    let prefix = crate::config::console_prefix().len();
    let about: Vec<Diag> = all
        .0
        .iter()
        .filter(|d| d.source.as_ref().is_some_and(|f| f.display == CONSOLE_FILE))
        .cloned()
        .map(|mut d| {
            d.source = Some(alone.clone());
            for (range, _) in &mut d.labels {
                let start = range.start.saturating_sub(prefix).min(expression.len());
                let end = range.end.saturating_sub(prefix).clamp(start, expression.len());
                *range = start..end;
            }
            match d.code {
                "config::sensitive_output" => {
                    d.message = "the expression reads a sensitive value, which the console does not show".into();
                    d.help = Some("no value derived from a sensitive input is shown, here or in any output".into());
                }
                "config::ephemeral_output" => {
                    d.message = "the expression reads an ephemeral value, which exists only while a plan or an apply runs".into();
                    d.help = None;
                }
                _ => {}
            }
            d
        })
        .collect();
    if about.is_empty() {
        all
    } else {
        Diagnostics(about)
    }
}

/// `value` as HCL writes it: strings quoted, lists in brackets, objects as `{ key = value }`.
pub fn render(value: &serde_json::Value) -> String {
    render_at(value, 0)
}

fn render_at(value: &serde_json::Value, indent: usize) -> String {
    use serde_json::Value;
    let pad = "  ".repeat(indent + 1);
    let close = "  ".repeat(indent);
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Array(items) if items.is_empty() => "[]".into(),
        Value::Array(items) => {
            let lines: Vec<String> = items
                .iter()
                .map(|v| format!("{pad}{},", render_at(v, indent + 1)))
                .collect();
            format!("[\n{}\n{close}]", lines.join("\n"))
        }
        Value::Object(map) if map.is_empty() => "{}".into(),
        Value::Object(map) => {
            let width = map.keys().map(|k| key(k).len()).max().unwrap_or(0);
            let lines: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{pad}{:<width$} = {}", key(k), render_at(v, indent + 1)))
                .collect();
            format!("{{\n{}\n{close}}}", lines.join("\n"))
        }
    }
}

/// An object's key: bare where HCL allows it, quoted otherwise.
fn key(k: &str) -> String {
    let bare = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        k.to_string()
    } else {
        serde_json::to_string(k).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_render_as_hcl() {
        let v = serde_json::json!({"a": [1, "x"], "b c": {}, "n": null});
        assert_eq!(
            render(&v),
            "{\n  a     = [\n    1,\n    \"x\",\n  ]\n  \"b c\" = {}\n  n     = null\n}"
        );
        assert_eq!(render(&serde_json::json!("q\"")), "\"q\\\"\"");
    }
}

//! Lowering `check` and `output` blocks.

use super::*;

impl Loader {
    pub(super) fn eval_check(&mut self, scope: &mut Scope<'_>, i: usize) {
        let item = &scope.items[i];
        let Some(block) = item.block else { return };
        let file = item.file.clone();
        let Some(ctx) = self.item_context(scope, i) else {
            return;
        };
        let Some(cond) = block.body.get_attribute("condition") else {
            return;
        };
        let Some(v) = self.eval_expr(&ctx, &file, &cond.value) else {
            return;
        };
        let span = span_of(&file, cond.value.span());
        match v {
            Value::Bool(true) => {}
            Value::Bool(false) => {
                let message = block
                    .body
                    .get_attribute("error_message")
                    .and_then(|m| self.eval_expr(&ctx, &file, &m.value))
                    .map(|m| value_text(&m))
                    .unwrap_or_else(|| "check failed".into());
                let warning = match block.body.get_attribute("severity").map(|a| &a.value) {
                    None => false,
                    Some(Expression::String(s)) if s.value() == "warning" => true,
                    Some(Expression::String(s)) if s.value() == "error" => false,
                    Some(other) => {
                        let sspan = span_of(&file, other.span());
                        self.diags.push(
                            Diag::error(
                                "config::invalid_value",
                                "a check's severity is \"error\" or \"warning\"",
                            )
                            .label(&sspan, "here"),
                        );
                        false
                    }
                };
                let mut d = if warning {
                    Diag::warning(
                        "config::check_warning",
                        format!("check `{}`: {message}", item.name),
                    )
                    .label(&span, "this condition is false")
                } else {
                    Diag::error(
                        "config::check_failed",
                        format!("check `{}` failed: {message}", item.name),
                    )
                    .label(&span, "this condition is false")
                };
                if let Some(call) = &scope.caller {
                    d = d.label(call, "in this module call");
                }
                self.diags.push(d);
            }
            other => {
                self.diags.push(
                    Diag::error(
                        "config::type",
                        format!("the condition of check `{}` is not a bool", item.name),
                    )
                    .label(&span, format!("evaluates to {}", types::describe(&other))),
                );
            }
        }
    }

    pub(super) fn eval_output(
        &mut self,
        scope: &mut Scope<'_>,
        i: usize,
        result: &mut ModuleResult,
    ) {
        let item = &scope.items[i];
        let Some(block) = item.block else { return };
        let file = item.file.clone();
        let name = item.name.clone();
        let header = item.header.clone();
        let Some(mut ctx) = self.item_context(scope, i) else {
            return;
        };
        let Some(edge) = self.edge_deps(scope, i, "depends_on") else {
            return;
        };
        ctx.deps.extend(edge);
        let Some(attr) = block.body.get_attribute("value") else {
            return;
        };
        let Some(value) = self.eval_expr(&ctx, &file, &attr.value) else {
            return;
        };
        let declared = self
            .literal_bool(&file, block.body.get_attribute("sensitive"))
            .unwrap_or(false);
        if ctx.ephemeral && scope.refs_ephemeral(&refs::collect(&attr.value).refs) {
            let span = span_of(&file, attr.value.span());
            self.diags.push(
                Diag::error(
                    "config::ephemeral_output",
                    format!("output `{name}` is derived from an ephemeral value"),
                )
                .label(&span, "derived from an ephemeral variable")
                .help("an output is recorded (the state, `sparkform output`), and an ephemeral value never is: output something that is not ephemeral, or make the variable `sensitive = true` instead of `ephemeral = true`"),
            );
            return;
        }
        if ctx.sensitive && !declared {
            let span = span_of(&file, attr.value.span());
            self.diags.push(
                Diag::error(
                    "config::sensitive_output",
                    format!("output `{name}` shows a sensitive value"),
                )
                .label(&span, "derived from a sensitive variable")
                .help("add `sensitive = true` to the output block, so it is never printed"),
            );
            return;
        }
        result.outputs.insert(name.clone(), value.clone());
        result.output_deps.insert(name.clone(), ctx.deps.clone());
        if declared {
            result.sensitive_outputs.insert(name.clone());
        }
        result.output_items.push(OutputBlock {
            name,
            value: serde_json::to_value(&value).unwrap_or(serde_json::Value::Null),
            sensitive: declared,
            deps: ctx.deps,
            span: header,
        });
    }

    // ----- module calls -----
}

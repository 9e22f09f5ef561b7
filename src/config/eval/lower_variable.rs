//! Lowering `variable` blocks: the value given (or the default), its type, its validations.

use super::*;

impl Loader {
    pub(super) fn eval_variable(&mut self, scope: &mut Scope<'_>, i: usize) -> Option<ItemValue> {
        let item = &scope.items[i];
        let block = item.block?;
        let file = item.file.clone();
        let ty = self.variable_type(&file, block, &item.name)?;
        // An ephemeral value is a secret too: everything said of a sensitive one holds for it.
        let ephemeral = self
            .literal_bool(&file, block.body.get_attribute("ephemeral"))
            .unwrap_or(false);
        let declared_sensitive = ephemeral
            || self
                .literal_bool(&file, block.body.get_attribute("sensitive"))
                .unwrap_or(false);
        let name = item.name.clone();
        let header = item.header.clone();
        if !ephemeral {
            self.refuse_ephemeral_input(scope, &name, &header)?;
        }
        let (value, sensitive, deps) =
            self.variable_value(scope, &file, block, &ty, declared_sensitive, &name, &header)?;
        if sensitive {
            note_secrets(&value);
        }
        if !self.variable_validations_pass(scope, &file, block, &name, &value) {
            return None;
        }
        Some(ItemValue {
            value,
            sensitive,
            ephemeral,
            sensitive_keys: HashSet::new(),
            deps: DepTree::Leaf(deps),
            all_resources: BTreeSet::new(),
        })
    }

    /// A module's variable set from an ephemeral value must say so (`ephemeral = true`): what
    /// the module does with it would otherwise be recorded. `None` when refused.
    fn refuse_ephemeral_input(
        &mut self,
        scope: &Scope<'_>,
        name: &str,
        header: &Span,
    ) -> Option<()> {
        let Some(input) = scope.inputs.get(name).filter(|i| i.ephemeral) else {
            return Some(());
        };
        self.diags.push(
            Diag::error(
                "config::ephemeral_input",
                format!(
                    "variable `{name}` is set from an ephemeral value ({}), and is not ephemeral",
                    input.origin
                ),
            )
            .maybe_label(input.span.as_ref(), "derived from an ephemeral variable")
            .label(header, "declared without `ephemeral = true`")
            .help(format!(
                "add `ephemeral = true` to variable `{name}`, so that nothing the module records holds it; or set it from a value that is not ephemeral"
            )),
        );
        None
    }

    /// The variable's `type` (any when it has none).
    fn variable_type(&mut self, file: &Arc<SourceFile>, block: &Block, name: &str) -> Option<Type> {
        let ty = match block.body.get_attribute("type") {
            Some(a) => match types::parse_type(&a.value) {
                Ok(t) => t,
                Err(msg) => {
                    let span = span_of(file, a.value.span());
                    self.diags.push(
                        Diag::error(
                            "config::type",
                            format!("invalid type for variable `{name}`"),
                        )
                        .label(&span, msg),
                    );
                    return None;
                }
            },
            None => Type::Any,
        };
        Some(ty)
    }

    /// The value set by the caller (or on the command line), else the default, converted to its
    /// type; with whether it is sensitive and what it depends on.
    #[allow(clippy::too_many_arguments)]
    fn variable_value(
        &mut self,
        scope: &Scope<'_>,
        file: &Arc<SourceFile>,
        block: &Block,
        ty: &Type,
        declared_sensitive: bool,
        name: &str,
        header: &Span,
    ) -> Option<(Value, bool, BTreeSet<String>)> {
        let (value, sensitive, deps) = if let Some(input) = scope.inputs.get(name) {
            match types::convert(&input.value, ty) {
                Ok(v) => (v, input.sensitive || declared_sensitive, input.deps.clone()),
                Err(msg) => {
                    let shown = if declared_sensitive || input.sensitive {
                        format!("expected {ty}")
                    } else {
                        msg
                    };
                    let d = Diag::error(
                        "config::type",
                        format!("wrong type for variable `{name}` (set by {})", input.origin),
                    )
                    .maybe_label(input.span.as_ref(), shown.clone())
                    .label(header, format!("declared as {ty}"));
                    self.diags.push(d);
                    return None;
                }
            }
        } else if let Some(a) = block.body.get_attribute("default") {
            if !refs::collect(&a.value).refs.is_empty() {
                let span = span_of(file, a.value.span());
                self.diags.push(
                    Diag::error(
                        "config::variable_default",
                        format!("the default of variable `{name}` refers to other values"),
                    )
                    .label(&span, "defaults must be literal values")
                    .help("compute derived values in a `locals` block instead"),
                );
                return None;
            }
            let ctx = Ctx::default();
            let v = self.eval_expr(&ctx, file, &a.value)?;
            match types::convert(&v, ty) {
                Ok(v) => (v, declared_sensitive, BTreeSet::new()),
                Err(msg) => {
                    let span = span_of(file, a.value.span());
                    self.diags.push(
                        Diag::error(
                            "config::type",
                            format!("the default of variable `{name}` does not match its type"),
                        )
                        .label(&span, msg),
                    );
                    return None;
                }
            }
        } else {
            let mut d = Diag::error(
                "config::missing_variable",
                format!("no value for the required variable `{name}`"),
            )
            .label(header, "declared here without a default");
            d = match &scope.caller {
                Some(call) => d
                    .label(call, format!("set `{name} = …` in this module block"))
                    .help(format!("the module call must set `{name}`")),
                None => d.help(format!(
                    "set it with `-var {name}=VALUE`, in a `-var-file`, or with the environment variable SPARKFORM_VAR_{name}"
                )),
            };
            self.diags.push(d);
            return None;
        };
        Some((value, sensitive, deps))
    }

    /// The `validation` blocks, which see only this variable; each that fails is an error.
    fn variable_validations_pass(
        &mut self,
        scope: &Scope<'_>,
        file: &Arc<SourceFile>,
        block: &Block,
        name: &str,
        value: &Value,
    ) -> bool {
        // validation blocks see only this variable.
        let mut self_ctx = Ctx::default();
        let mut obj = Map::new();
        obj.insert(name.to_string(), value.clone());
        self_ctx.vars.insert("var", Value::Object(obj));
        let mut ok = true;
        for v in block.body.get_blocks("validation") {
            let Some(cond) = v.body.get_attribute("condition") else {
                continue;
            };
            for r in refs::collect(&cond.value).refs {
                if r.root != "var" || r.first_key() != Some(name) {
                    let span = Span::new(file, r.span.clone());
                    self.diags.push(
                        Diag::error(
                            "config::validation",
                            format!("a validation of `{name}` may only refer to var.{name}"),
                        )
                        .label(&span, "refers to something else"),
                    );
                    ok = false;
                }
            }
            if !ok {
                continue;
            }
            let Some(passed) = self.eval_expr(&self_ctx, file, &cond.value) else {
                ok = false;
                continue;
            };
            if passed != Value::Bool(true) {
                let message = v
                    .body
                    .get_attribute("error_message")
                    .and_then(|m| self.eval_expr(&self_ctx, file, &m.value))
                    .map(|m| value_text(&m))
                    .unwrap_or_else(|| "validation failed".into());
                let cond_span = span_of(file, cond.value.span());
                let mut d = Diag::error(
                    "config::validation",
                    format!("invalid value for variable `{name}`: {message}"),
                )
                .label(&cond_span, "this condition is false");
                if let Some(input) = scope.inputs.get(name) {
                    d = d.maybe_label(
                        input.span.as_ref(),
                        format!("value set here ({})", input.origin),
                    );
                    if input.span.is_none() {
                        d = d.help(format!("the value came from {}", input.origin));
                    }
                }
                self.diags.push(d);
                ok = false;
            }
        }
        ok
    }

    pub(super) fn literal_bool(
        &mut self,
        file: &Arc<SourceFile>,
        attr: Option<&Attribute>,
    ) -> Option<bool> {
        let attr = attr?;
        match &attr.value {
            Expression::Bool(b) => Some(*b.value()),
            other => {
                let span = span_of(file, other.span());
                self.diags.push(
                    Diag::error(
                        "config::type",
                        format!("`{}` must be true or false", attr.key.as_str()),
                    )
                    .label(&span, "expected a literal bool"),
                );
                None
            }
        }
    }
}

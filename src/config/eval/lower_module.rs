//! Lowering `module` blocks: evaluating the called module with its inputs.

use super::*;

impl Loader {
    pub(super) fn eval_module_call(
        &mut self,
        scope: &mut Scope<'_>,
        i: usize,
    ) -> Option<ItemValue> {
        let item = &scope.items[i];
        let block = item.block?;
        let file = item.file.clone();
        let name = item.name.clone();
        let header = item.header.clone();
        let source_attr = block.body.get_attribute("source")?;
        let source = match &source_attr.value {
            Expression::String(s) => s.value().to_string(),
            other => {
                let span = span_of(&file, other.span());
                self.diags.push(
                    Diag::error(
                        "config::module_source",
                        "a module's `source` must be a literal string",
                    )
                    .label(
                        &span,
                        "expected a folder path such as \"../../modules/vllm-ray\"",
                    ),
                );
                return None;
            }
        };
        let source_span = span_of(&file, source_attr.value.span());
        let base = file
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| scope.dir.clone());
        let dir = normalize_path(&base.join(&source));
        if !dir.is_dir() {
            self.diags.push(
                Diag::error(
                    "config::module_source",
                    format!(
                        "module `{name}`: no folder at {}",
                        crate::diag::display_path(&dir)
                    ),
                )
                .label(&source_span, "not found")
                .help("`source` is a folder of .hcl files, relative to this file"),
            );
            return None;
        }
        let key = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        if self.stack.contains(&key) || self.stack.len() >= MAX_MODULE_DEPTH {
            self.diags.push(
                Diag::error(
                    "config::module_recursion",
                    format!("module `{name}` includes itself (directly or through other modules)"),
                )
                .label(&source_span, "recursive module source"),
            );
            return None;
        }
        // Skipped when something it refers to failed (already reported).
        self.context_for(scope, &item.refs)?;
        let edge_deps = self.edge_deps(scope, i, "depends_on")?;
        let files = self.load_folder(&dir)?;
        let declared = Self::declared_variables(&files);
        let mut inputs = HashMap::new();
        let mut ok = true;
        for attr in block.body.attributes() {
            let key = attr.key.as_str();
            if key == "source" || key == "depends_on" {
                continue;
            }
            let span = span_of(&file, attr.span());
            if !declared.iter().any(|(n, _, _)| n == key) {
                let mut d = Diag::error(
                    "config::unknown_input",
                    format!("module `{name}` has no variable `{key}`"),
                )
                .label(&span, "not an input of this module");
                d = match did_you_mean(key, declared.iter().map(|(n, _, _)| n.as_str())) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help(format!(
                        "its variables are: {}",
                        declared
                            .iter()
                            .map(|(n, _, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                };
                self.diags.push(d);
                ok = false;
                continue;
            }
            let c = refs::collect(&attr.value);
            let Some(sub) = self.context_for(scope, &c.refs) else {
                ok = false;
                continue;
            };
            let Some(v) = self.eval_expr(&sub, &file, &attr.value) else {
                ok = false;
                continue;
            };
            inputs.insert(
                key.to_string(),
                InputValue {
                    value: v,
                    sensitive: sub.sensitive,
                    ephemeral: sub.ephemeral,
                    deps: sub.deps,
                    span: Some(span_of(&file, attr.value.span())),
                    origin: format!("module `{name}`"),
                },
            );
        }
        if !ok {
            return None;
        }
        let mut path = scope.path.clone();
        path.push(name.clone());
        let mut extra = scope.extra_deps.clone();
        extra.extend(edge_deps);
        let before = self.diags.error_count();
        let result = self.eval_module(&files, &path, inputs, &extra, Some(&header));
        if self.diags.error_count() > before {
            return None;
        }
        let mut tree = BTreeMap::new();
        for (k, d) in &result.output_deps {
            tree.insert(k.clone(), DepTree::Leaf(d.clone()));
        }
        Some(ItemValue {
            value: Value::Object(result.outputs),
            sensitive: false,
            ephemeral: false,
            sensitive_keys: result.sensitive_outputs,
            deps: DepTree::Keyed(tree),
            all_resources: result.all_resources,
        })
    }
}

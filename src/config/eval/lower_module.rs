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
        if !self.source_is_inside_the_repository(&name, &key, &source_span) {
            return None;
        }
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

impl Loader {
    /// Whether a module's source (`dir`, symlinks resolved) lies where the definitions may read
    /// it; refused with its place otherwise. Inside a git repository (the nearest folder above
    /// the definitions with a `.git`) a source must stay in it, or in a folder named in
    /// `SPARKFORM_MODULE_PATH`: a pull request's definitions cannot make `validate` read `.hcl`
    /// files elsewhere on the machine. Outside a repository nothing marks the project's bounds,
    /// and any folder is read, as Terraform reads local paths.
    fn source_is_inside_the_repository(&mut self, name: &str, dir: &Path, source: &Span) -> bool {
        let Some(roots) = module_roots(&self.config.dir) else {
            return true;
        };
        if roots.iter().any(|r| dir.starts_with(r)) {
            return true;
        }
        self.diags.push(
            Diag::error(
                "config::module_source",
                format!(
                    "module `{name}`: its source {} lies outside the repository {}",
                    crate::diag::display_path(dir),
                    crate::diag::display_path(&roots[0])
                ),
            )
            .label(source, "leaves the definitions' repository")
            .help(
                "a module's source is a folder inside the repository that holds the definitions; \
                 name a folder of modules kept elsewhere in SPARKFORM_MODULE_PATH",
            ),
        );
        false
    }
}

/// Where a module's source may lie, symlinks resolved: the git repository that holds the
/// definitions (the nearest folder above them with a `.git`) and each folder of
/// `SPARKFORM_MODULE_PATH` (separated as `PATH` is); `None` outside a repository.
fn module_roots(definitions: &Path) -> Option<Vec<PathBuf>> {
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let own = canonical(definitions);
    let repository = own.ancestors().find(|a| a.join(".git").exists())?;
    let mut roots = vec![repository.to_path_buf()];
    if let Some(more) = std::env::var_os("SPARKFORM_MODULE_PATH") {
        roots.extend(
            std::env::split_paths(&more)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| canonical(&p)),
        );
    }
    Some(roots)
}

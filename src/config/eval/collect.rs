//! Blocks into items: each block of a module's files checked (labels, nested blocks, function
//! names) and turned into an item with its references.

use super::*;

impl Loader {
    pub(super) fn collect_items<'m>(&mut self, scope: &mut Scope<'m>, files: &'m ModuleFiles) {
        for (file, body) in &files.files {
            for structure in body.iter() {
                match structure {
                    Structure::Attribute(attr) => {
                        let span = span_of(file, attr.span());
                        self.diags.push(
                            Diag::error(
                                "config::top_level_attribute",
                                format!(
                                    "unexpected attribute `{}` at the top level",
                                    attr.key.as_str()
                                ),
                            )
                            .label(&span, "attributes belong inside a block")
                            .help("put it in a `locals { … }` block, or make it a `variable`"),
                        );
                    }
                    Structure::Block(block) => self.collect_block(scope, file, block),
                }
            }
        }
    }

    pub(super) fn collect_block<'m>(
        &mut self,
        scope: &mut Scope<'m>,
        file: &Arc<SourceFile>,
        block: &'m Block,
    ) {
        let kind = block.ident.as_str();
        let header = header_span(file, block);
        let Some(spec) = schema::top_level(kind) else {
            let kinds = schema::top_level_blocks().into_iter().map(|s| s.kind);
            let mut d = Diag::error(
                "config::unknown_block",
                format!("unknown block type `{kind}`"),
            )
            .label(&header, "not a sparkform block");
            d = match did_you_mean(kind, kinds) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None => d.help(format!(
                    "blocks are {}",
                    schema::top_level_blocks()
                        .into_iter()
                        .map(|s| s.kind)
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            };
            self.diags.push(d);
            return;
        };
        if !self.check_labels(file, block, spec) {
            return;
        }
        if kind == "locals" {
            self.check_nested(file, &block.body, spec, &header);
            for attr in block.body.attributes() {
                let name = attr.key.as_str().to_string();
                let span = span_of(file, attr.span());
                let collected = refs::collect(&attr.value);
                let funcs_ok = self.check_funcs(file, &collected.funcs);
                self.add_item(
                    scope,
                    Item {
                        root: Root::Local,
                        name,
                        file: file.clone(),
                        block: None,
                        local: Some(attr),
                        header: span,
                        calls_functions: !collected.funcs.is_empty(),
                        refs: collected.refs,
                        edge_refs: Vec::new(),
                        broken: !funcs_ok,
                    },
                );
            }
            return;
        }
        if kind == "state" {
            self.collect_state(file, block, &header);
            return;
        }
        if kind == "import" {
            self.check_nested(file, &block.body, spec, &header);
            self.lower_import(file, block, header);
            return;
        }
        if kind == "moved" || kind == "removed" {
            self.check_nested(file, &block.body, spec, &header);
            self.lower_moved(file, block, header);
            return;
        }
        let Some(root) = Root::from_block(kind) else {
            return;
        };
        let name = block.labels[0].as_str().to_string();
        self.check_nested(file, &block.body, spec, &header);
        let mut item_refs = Vec::new();
        let mut edge_refs = Vec::new();
        let mut funcs_ok = true;
        // A variable's validations and default are not scanned here: let them call functions.
        let mut calls_functions = root == Root::Var;
        // A variable's validations refer only to itself and its default to nothing (both
        // checked when it is evaluated); they are not dependencies.
        if root != Root::Var {
            funcs_ok = self.block_refs(
                file,
                &block.body,
                spec,
                &mut item_refs,
                &mut edge_refs,
                &mut calls_functions,
            );
        }
        self.add_item(
            scope,
            Item {
                root,
                name,
                file: file.clone(),
                block: Some(block),
                local: None,
                header,
                refs: item_refs,
                edge_refs,
                broken: !funcs_ok,
                calls_functions,
            },
        );
    }

    /// `state { … }`: only in the root module, once; its literal values checked.
    fn collect_state(&mut self, file: &Arc<SourceFile>, block: &Block, header: &Span) {
        if self.stack.len() > 1 {
            self.diags.push(
                Diag::error(
                    "config::state_in_module",
                    "a `state` block belongs in the root module",
                )
                .label(header, "inside a module")
                .help("where the state lives is the deployment's choice: move it to the definitions you run sparkform on"),
            );
            return;
        }
        match crate::config::backend::check_block(file, block) {
            Ok(b) => match &self.state_block {
                Some(first) => self.diags.push(
                    Diag::error("config::state_block", "a second `state` block")
                        .label(header, "here")
                        .help(format!(
                            "the state lives in one place: keep the block at {first}"
                        )),
                ),
                None => self.state_block = Some(b.at),
            },
            Err(ds) => ds.into_iter().for_each(|d| self.diags.push(d)),
        }
    }

    pub(super) fn block_refs(
        &mut self,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
        item_refs: &mut Vec<Ref>,
        edge_refs: &mut Vec<Ref>,
        calls_functions: &mut bool,
    ) -> bool {
        let mut ok = true;
        for attr in body.attributes() {
            let key = attr.key.as_str();
            let kind = spec.attr(key).map(|a| a.kind);
            match kind {
                Some(ValueType::TypeExpr) => {}
                Some(ValueType::RefList) => {
                    let c = refs::collect(&attr.value);
                    edge_refs.extend(c.refs);
                }
                _ if spec.kind == "module" && key == "source" => {}
                _ => {
                    let c = refs::collect(&attr.value);
                    ok &= self.check_funcs(file, &c.funcs);
                    *calls_functions |= !c.funcs.is_empty();
                    item_refs.extend(c.refs);
                }
            }
        }
        for child in body.blocks() {
            if let Some(c) = spec.child(child.ident.as_str()) {
                ok &= self.block_refs(
                    file,
                    &child.body,
                    c.spec,
                    item_refs,
                    edge_refs,
                    calls_functions,
                );
            }
        }
        ok
    }

    /// Report calls of unknown functions; false when there was one.
    pub(super) fn check_funcs(&mut self, file: &Arc<SourceFile>, funcs: &[refs::FuncRef]) -> bool {
        let mut ok = true;
        for f in funcs {
            if !crate::config::functions::FUNCTION_NAMES.contains(&f.name.as_str()) {
                let span = Span::new(file, f.span.clone());
                let mut d = Diag::error(
                    "config::unknown_function",
                    format!("unknown function `{}`", f.name),
                )
                .label(&span, "no such function");
                d = match did_you_mean(
                    &f.name,
                    crate::config::functions::FUNCTION_NAMES.iter().copied(),
                ) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help("see `sparkform validate --help` for the function list"),
                };
                self.diags.push(d);
                ok = false;
            }
        }
        ok
    }

    pub(super) fn check_labels(
        &mut self,
        file: &Arc<SourceFile>,
        block: &Block,
        spec: &BlockSpec,
    ) -> bool {
        let header = header_span(file, block);
        if block.labels.len() != spec.labels.len() {
            let want = match spec.labels.len() {
                0 => format!("`{}` takes no label", spec.kind),
                _ => format!("`{} \"NAME\" {{ … }}` takes one label, its name", spec.kind),
            };
            self.diags.push(
                Diag::error(
                    "config::labels",
                    format!(
                        "`{}` block has {} label{}; expected {}",
                        spec.kind,
                        block.labels.len(),
                        if block.labels.len() == 1 { "" } else { "s" },
                        spec.labels.len()
                    ),
                )
                .label(&header, "here")
                .help(want),
            );
            return false;
        }
        for label in &block.labels {
            if !valid_name(label.as_str()) {
                let span = span_of(file, label.span());
                self.diags.push(
                    Diag::error(
                        "config::invalid_name",
                        format!("invalid {} name {:?}", spec.kind, label.as_str()),
                    )
                    .label(&span, "names become parts of container names, addresses and paths")
                    .help("use letters, digits, `_` and `-`, starting with a letter or `_` (at most 63 characters)"),
                );
                return false;
            }
        }
        true
    }

    /// Unknown and missing attributes and nested blocks, recursively.
    pub(super) fn check_nested(
        &mut self,
        file: &Arc<SourceFile>,
        body: &Body,
        spec: &BlockSpec,
        header: &Span,
    ) {
        let mut seen_blocks: HashMap<&str, Span> = HashMap::new();
        for structure in body.iter() {
            match structure {
                Structure::Attribute(attr) => {
                    let key = attr.key.as_str();
                    if spec.attr(key).is_none() && !spec.open {
                        let span = span_of(file, attr.key.span());
                        let is_block = spec.child(key).is_some();
                        let mut d = Diag::error(
                            "config::unknown_attribute",
                            format!("unknown attribute `{key}` in `{}`", spec.kind),
                        )
                        .label(
                            &span,
                            if is_block {
                                "this is a block, not an attribute"
                            } else {
                                "not expected here"
                            },
                        );
                        d = if is_block {
                            d.help(format!("write it as a block: `{key} {{ … }}`"))
                        } else {
                            match did_you_mean(key, spec.names()) {
                                Some(s) => d.help(format!("did you mean `{s}`?")),
                                None => d.help(format!(
                                    "`{}` takes: {}",
                                    spec.kind,
                                    spec.names().collect::<Vec<_>>().join(", ")
                                )),
                            }
                        };
                        self.diags.push(d);
                    }
                }
                Structure::Block(child) => {
                    let name = child.ident.as_str();
                    let child_header = header_span(file, child);
                    match spec.child(name) {
                        None => {
                            let mut d = Diag::error(
                                "config::unknown_block",
                                format!("unknown block `{name}` in `{}`", spec.kind),
                            )
                            .label(&child_header, "not expected here");
                            if let Some(s) = did_you_mean(name, spec.names()) {
                                d = d.help(format!("did you mean `{s}`?"));
                            } else if spec.attr(name).is_some() {
                                d = d.help(format!("`{name}` is an attribute: write `{name} = …`"));
                            }
                            self.diags.push(d);
                        }
                        Some(c) => {
                            if self.check_labels(file, child, c.spec) {
                                self.check_nested(file, &child.body, c.spec, &child_header);
                            }
                            if !c.multiple {
                                if let Some(first) = seen_blocks.get(name) {
                                    self.diags.push(
                                        Diag::error(
                                            "config::duplicate_block",
                                            format!("`{}` takes one `{name}` block", spec.kind),
                                        )
                                        .label(&child_header, "second block")
                                        .label(first, "first block"),
                                    );
                                }
                                seen_blocks.insert(name, child_header);
                            }
                        }
                    }
                }
            }
        }
        for a in spec.attrs.iter().filter(|a| a.required) {
            if !body.has_attribute(a.name) {
                self.diags.push(
                    Diag::error(
                        "config::missing_attribute",
                        format!(
                            "`{}` is missing the required attribute `{}`",
                            spec.kind, a.name
                        ),
                    )
                    .label(
                        header,
                        format!("needs `{} = …` ({})", a.name, a.kind.describe()),
                    ),
                );
            }
        }
    }

    pub(super) fn add_item<'m>(&mut self, scope: &mut Scope<'m>, item: Item<'m>) {
        let key = (item.root, item.name.clone());
        if let Some(&first) = scope.index.get(&key) {
            let other: &Item = &scope.items[first];
            let what = match item.root {
                Root::Var => "variable",
                Root::Local => "local value",
                r => r.ident(),
            };
            self.diags.push(
                Diag::error(
                    "config::duplicate",
                    format!("duplicate {what} `{}`", item.name),
                )
                .label(&item.header, "declared again here")
                .label(&other.header, "first declared here")
                .help("names must be unique per block type within a module; rename one of them"),
            );
            return;
        }
        scope.index.insert(key, scope.items.len());
        scope.items.push(item);
    }
}

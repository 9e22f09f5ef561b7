//! Lowering `import` blocks: the address they adopt an object for and the object's id, checked
//! for their form here; whether the address and the node exist is for whoever reads them with
//! the whole configuration at hand (`ops::import`).

use super::*;
use crate::config::model::ImportBlock;

impl Loader {
    pub(super) fn lower_import(&mut self, file: &Arc<SourceFile>, block: &Block, header: Span) {
        if self.stack.len() > 1 {
            self.diags.push(
                Diag::error(
                    "config::import_in_module",
                    "`import` blocks belong in the root module",
                )
                .label(&header, "inside a module")
                .help("move it to the definitions you run sparkform on, with `to` naming the resource through its module: module.NAME.container.C"),
            );
            return;
        }
        let Some(id) = block.body.get_attribute("id") else {
            // A missing attribute is reported by `check_nested`.
            return;
        };
        let id_span = span_of(file, id.value.span());
        let Some((to_text, to_span)) = self.address_attr(
            file,
            &block.body,
            "to",
            "config::import_to",
            "write the address unquoted, as plans show it: to = module.qwen.container.vllm, or container.worker[\"node2\"]",
        ) else {
            return;
        };
        let Expression::String(s) = &id.value else {
            self.diags.push(
                Diag::error("config::import_id", "`id` is a string literal")
                    .label(&id_span, "not a plain string")
                    .help("write it as \"NODE:OBJECT\", e.g. id = \"spark1:vllm\""),
            );
            return;
        };
        let text = s.value().to_string();
        match text.split_once(':') {
            Some((node, object)) if valid_name(node) && !object.is_empty() => {
                self.config.imports.push(ImportBlock {
                    to: to_text,
                    node: node.to_string(),
                    object: object.to_string(),
                    span: header,
                    to_span,
                    id_span,
                });
            }
            _ => self.diags.push(
                Diag::error(
                    "config::import_id",
                    format!("import id {text:?} is not NODE:OBJECT"),
                )
                .label(&id_span, "here")
                .help("a container is \"NODE:NAME\" (or NODE:CONTAINER_ID), a fabric address \"NODE:ADDRESS/PREFIX\"; NODE is a node block's name"),
            ),
        }
    }
}

impl Loader {
    /// The text of an address attribute (`to = module.qwen.container.vllm`), checked for its
    /// form; `None` after reporting why (`code`, `help`), or when it is missing
    /// (`check_nested` reports that).
    pub(super) fn address_attr(
        &mut self,
        file: &Arc<SourceFile>,
        body: &Body,
        name: &str,
        code: &'static str,
        help: &str,
    ) -> Option<(String, Span)> {
        let attr = body.get_attribute(name)?;
        let span = span_of(file, attr.value.span());
        let text: String = attr
            .value
            .span()
            .and_then(|r| file.text.get(r))
            .unwrap_or_default()
            .trim()
            .to_string();
        if let Err(why) = check_address(&text) {
            self.diags.push(
                Diag::error(code, format!("`{name}` is not a resource address: {why}"))
                    .label(&span, "here")
                    .help(help.to_string()),
            );
            return None;
        }
        Some((text, span))
    }
}

/// `a.b.c`, with `["key"]` or `[0]` after a name.
pub(crate) fn check_address(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("it is empty".into());
    }
    if text.starts_with('"') {
        return Err("it is quoted".into());
    }
    let mut chars = text.chars().peekable();
    let mut names = 0;
    loop {
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if name.is_empty() {
            return Err(format!("{text:?} has an empty part"));
        }
        names += 1;
        if chars.peek() == Some(&'[') {
            chars.next();
            let ok = if chars.peek() == Some(&'"') {
                chars.next();
                let mut key = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '"' {
                        closed = true;
                        break;
                    }
                    key.push(c);
                }
                closed && !key.contains('\\') && chars.next() == Some(']')
            } else {
                let mut digits = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == ']' {
                        closed = true;
                        break;
                    }
                    digits.push(c);
                }
                closed && digits.parse::<u64>().is_ok()
            };
            if !ok {
                return Err(format!(
                    "{text:?} has an index that is not [\"key\"] or [N]"
                ));
            }
        }
        match chars.next() {
            None => break,
            Some('.') => continue,
            Some(c) => return Err(format!("{text:?} holds {c:?}")),
        }
    }
    if names < 2 {
        return Err(format!("{text:?} names no resource (KIND.NAME)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_address;

    #[test]
    fn addresses_are_names_and_indexes() {
        assert!(check_address("container.vllm").is_ok());
        assert!(check_address("module.qwen.container.vllm").is_ok());
        assert!(check_address("module.qwen.container.ray_worker[\"node2\"]").is_ok());
        assert!(check_address("network.roce.attach.node1").is_ok());
        assert!(check_address("vllm").is_err());
        assert!(check_address("\"container.vllm\"").is_err());
        assert!(check_address("container..vllm").is_err());
        assert!(check_address("container.vllm[x]").is_err());
        assert!(check_address("container.vllm + 1").is_err());
    }
}

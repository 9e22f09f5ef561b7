//! Resource addresses, typed: the strings that key plans and state files
//! (`network.N.attach.A`, `[module.M.]container.C["key"]`, `[module.M.]probe.P`,
//! `model.M["NODE"]`) read back into their parts, so that what an address is comes from the
//! kind registry rather than from its first characters: a probe in a module
//! (`module.qwen.probe.rendezvous`) is a probe as much as `probe.hello` is.

use std::fmt;

use super::Registered;
use crate::vocabulary::{KindId, Lifecycle};

/// One resource's address, in parts. `Display` writes it back exactly as the lowering wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address {
    /// The modules that declare it, outermost first (`["qwen", "ray"]` for
    /// `module.qwen.module.ray.container.ray_head`); empty at the root.
    pub modules: Vec<String>,
    pub kind: KindId,
    /// The label of the top-level block the kind's block is nested in (`roce` in
    /// `network.roce.attach.spark1`); `None` where the kind's block is itself top-level.
    pub within: Option<String>,
    /// Its block's label: `vllm` in `container.vllm`, `spark1` in `network.roce.attach.spark1`.
    pub name: String,
    /// The instance key: a `for_each` key, or a model's node.
    pub key: Option<String>,
}

impl Address {
    /// The address `text` spells, or `None` when it is none (`output.endpoint`, a module path
    /// alone, a block no kind declares, a malformed key).
    pub fn parse(text: &str) -> Option<Address> {
        let (path, key) = match text.find('[') {
            Some(open) => (&text[..open], Some(parse_key(&text[open..])?)),
            None => (text, None),
        };
        let parts: Vec<&str> = path.split('.').collect();
        if !parts.iter().all(|p| is_label(p)) {
            return None;
        }
        let mut modules = Vec::new();
        let mut rest = parts.as_slice();
        while let ["module", module, tail @ ..] = rest {
            modules.push(module.to_string());
            rest = tail;
        }
        let (kind, within, name) = KindId::ALL
            .iter()
            .find_map(|&kind| in_block_of(kind, rest).map(|(w, n)| (kind, w, n)))?;
        Some(Address {
            modules,
            kind,
            within,
            name,
            key,
        })
    }

    /// Whether it runs rather than converges (a probe): its kind says, wherever it is declared.
    pub fn runs(&self) -> bool {
        self.kind.kind().description().lifecycle == Lifecycle::Runs
    }
}

/// Whether `address` is that of a resource that runs (a probe, in a module or not); false for
/// anything else, an output's name included.
pub fn runs(address: &str) -> bool {
    Address::parse(address).is_some_and(|a| a.runs())
}

/// Whether `text` begins as a resource address or a selection of them does (`module.M`, or a
/// kind's block and its label, with or without the rest): how a command tells a first
/// argument that names resources from one that names a folder.
pub fn begins_like_an_address(text: &str) -> bool {
    let mut parts = text.split('.');
    loop {
        match parts.next() {
            Some("module") => match parts.next() {
                Some(module) if is_label(module) => {}
                _ => return false,
            },
            // Module blocks and nothing after them: all of a module's resources.
            None => return true,
            Some(block) => {
                return KindId::ALL.iter().any(|k| k.top_block().kind == block)
                    && parts.next().is_some_and(|label| !label.is_empty())
            }
        }
    }
}

/// The label of the top-level block and the resource's own label when `parts` are where
/// `kind` puts its resources: `[block, label]`, or `[block, label, child, label]` for a kind
/// whose block is nested in a top-level one (attachments in a network).
fn in_block_of(kind: KindId, parts: &[&str]) -> Option<(Option<String>, String)> {
    let top = kind.top_block();
    let own = kind.kind().description().block;
    match parts {
        [block, name] if *block == top.kind && std::ptr::eq(top, own) => {
            Some((None, name.to_string()))
        }
        [block, within, child, name] if *block == top.kind => {
            let nested = top.child(child)?;
            std::ptr::eq(nested.spec, own).then(|| (Some(within.to_string()), name.to_string()))
        }
        _ => None,
    }
}

/// A block label or module name as the language allows them.
fn is_label(part: &str) -> bool {
    !part.is_empty()
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `["key"]`, the key written as the lowering writes it (Rust's `{:?}` of a string), and
/// nothing after it.
fn parse_key(text: &str) -> Option<String> {
    let mut chars = text.strip_prefix("[\"")?.chars();
    let mut key = String::new();
    loop {
        match chars.next()? {
            '"' => break,
            '\\' => key.push(unescape(&mut chars)?),
            c => key.push(c),
        }
    }
    (chars.as_str() == "]").then_some(key)
}

/// The character an escape of `{:?}` stands for, its backslash already read.
fn unescape(chars: &mut std::str::Chars<'_>) -> Option<char> {
    Some(match chars.next()? {
        '\\' => '\\',
        '"' => '"',
        '\'' => '\'',
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        '0' => '\0',
        'u' => {
            let hex = chars.as_str().strip_prefix('{')?;
            let end = hex.find('}')?;
            let digits = &hex[..end];
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            let c = char::from_u32(u32::from_str_radix(digits, 16).ok()?)?;
            // Past `{`, the digits and `}`.
            for _ in 0..end + 2 {
                chars.next();
            }
            c
        }
        _ => return None,
    })
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.modules {
            write!(f, "module.{m}.")?;
        }
        let top = self.kind.top_block();
        write!(f, "{}.", top.kind)?;
        if let Some(within) = &self.within {
            let own = self.kind.kind().description().block;
            let child = top
                .blocks
                .iter()
                .find(|c| std::ptr::eq(c.spec, own))
                .map_or(own.kind, |c| c.name);
            write!(f, "{within}.{child}.")?;
        }
        f.write_str(&self.name)?;
        if let Some(key) = &self.key {
            write!(f, "[{key:?}]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Address {
        Address::parse(text).unwrap_or_else(|| panic!("{text} does not parse"))
    }

    #[test]
    fn every_form_the_configuration_writes_parses_into_its_parts() {
        let a = parsed("network.roce.attach.spark1");
        assert_eq!(
            (
                a.kind,
                a.within.as_deref(),
                a.name.as_str(),
                a.key.as_deref()
            ),
            (KindId::Attachment, Some("roce"), "spark1", None)
        );
        let c = parsed("module.qwen.module.ray.container.ray_worker[\"node2\"]");
        assert_eq!(c.modules, ["qwen", "ray"]);
        assert_eq!(
            (c.kind, c.within, c.name.as_str(), c.key.as_deref()),
            (KindId::Container, None, "ray_worker", Some("node2"))
        );
        let p = parsed("module.qwen.probe.rendezvous");
        assert_eq!((p.kind, p.name.as_str()), (KindId::Probe, "rendezvous"));
        let m = parsed("model.qwen[\"node1\"]");
        assert_eq!(
            (m.kind, m.name.as_str(), m.key.as_deref()),
            (KindId::Model, "qwen", Some("node1"))
        );
    }

    #[test]
    fn a_probe_runs_wherever_a_module_declares_it() {
        for probe in [
            "probe.hello",
            "module.qwen.probe.rendezvous",
            "module.qwen.module.ray.probe.ray_members",
        ] {
            assert!(runs(probe), "{probe}");
        }
        for other in [
            "container.vllm",
            "module.qwen.container.vllm",
            "network.roce.attach.spark1",
            "model.qwen[\"node1\"]",
            "output.endpoint",
            // A container whose name only starts like a probe's.
            "container.probe",
        ] {
            assert!(!runs(other), "{other}");
        }
    }

    #[test]
    fn what_is_no_resource_address_is_refused() {
        for text in [
            "",
            "output.endpoint",
            "module.qwen",
            "module.qwen.container",
            "container",
            "container.vllm.x",
            "container..vllm",
            "network.roce",
            "network.roce.attach",
            "network.roce.other.spark1",
            "container.vllm[node2]",
            "container.vllm[\"node2\"",
            "container.vllm[\"node2\"]x",
            "container.vllm[\"a\\q\"]",
            "container.vllm[\"a\\u{110000}\"]",
            "volume.data",
        ] {
            assert_eq!(Address::parse(text), None, "{text}");
        }
    }

    #[test]
    fn addresses_print_back_as_they_were_written() {
        for text in [
            "network.roce.attach.spark1",
            "module.m.network.roce.attach.spark-1",
            "module.qwen.module.ray.container.ray_worker[\"node2\"]",
            "probe.hello",
            "model.qwen[\"node1\"]",
        ] {
            assert_eq!(parsed(text).to_string(), text);
        }
        // Keys with what `{:?}` escapes: quotes, backslashes, brackets, dots, control and
        // non-ASCII characters.
        for key in [
            "a\"b",
            "a\\b",
            "x]y",
            "module.q.probe.p",
            "tab\there\n",
            "\u{7f}\u{301}é",
            "",
        ] {
            let text = format!("container.c[{key:?}]");
            let a = parsed(&text);
            assert_eq!(a.key.as_deref(), Some(key), "{text}");
            assert_eq!(a.to_string(), text);
        }
    }

    #[test]
    fn a_first_argument_that_names_resources_is_told_from_a_folder() {
        for text in [
            "container.vllm",
            "container.worker[\"a\"]",
            "module.qwen",
            "module.qwen.module.ray.container.ray_head",
            "network.roce",
            "probe.hello",
        ] {
            assert!(begins_like_an_address(text), "{text}");
        }
        for text in [
            ".",
            "examples/testbed",
            "module",
            "module.",
            "container",
            "container.",
            "deploy.d",
        ] {
            assert!(!begins_like_an_address(text), "{text}");
        }
    }
}

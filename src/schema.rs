//! The shape of the language's blocks: attribute names, their types, which are required, nested
//! blocks. The types only; `config::schema` lists the blocks, each resource kind its own.

/// The type an attribute's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Any,
    Str,
    Num,
    Bool,
    ListStr,
    MapStr,
    /// A `node.x` reference (or a node's name as a string).
    Node,
    /// A `jump.x` reference (or a jump host's name).
    Jump,
    /// A `container.x` reference.
    Container,
    /// `"30s"`, `"5m"`, `"1h30m"` or a number of seconds.
    Duration,
    /// `"16g"`, `"512m"` or a number of bytes.
    Size,
    /// A number, or `"all"` (GPUs).
    Gpus,
    /// References that add edges and are not evaluated (`depends_on`, `replace_triggered_by`).
    RefList,
    /// A resource address, written as a reference and not evaluated (`import.to`).
    Address,
    /// A type constraint (`variable.type`).
    TypeExpr,
    /// The `for_each` meta-argument.
    ForEach,
}

impl ValueType {
    pub fn describe(self) -> &'static str {
        match self {
            ValueType::Any => "any value",
            ValueType::Str => "a string",
            ValueType::Num => "a number",
            ValueType::Bool => "a bool",
            ValueType::ListStr => "a list of strings",
            ValueType::MapStr => "a map of strings",
            ValueType::Node => "a node reference such as node.spark1",
            ValueType::Jump => "a jump host reference such as jump.bastion",
            ValueType::Container => "a container reference such as container.ray_head",
            ValueType::Duration => "a duration such as \"30s\", \"5m\" or \"1h30m\"",
            ValueType::Size => "a size such as \"16g\" or \"512m\", or a number of bytes",
            ValueType::Gpus => "a number of GPUs or \"all\"",
            ValueType::RefList => "a list of references",
            ValueType::Address => "a resource address such as module.qwen.container.vllm",
            ValueType::TypeExpr => "a type",
            ValueType::ForEach => "a map or a set of strings",
        }
    }
}

#[derive(Debug)]
pub struct Attr {
    pub name: &'static str,
    pub kind: ValueType,
    pub required: bool,
    /// Whether it may take an ephemeral value (a variable's `ephemeral = true`): the kind uses
    /// it during an apply and records nothing of it when it is ephemeral (`Resource::ephemeral`).
    pub takes_ephemeral: bool,
}

pub const fn req(name: &'static str, kind: ValueType) -> Attr {
    Attr {
        name,
        kind,
        required: true,
        takes_ephemeral: false,
    }
}
pub const fn opt(name: &'static str, kind: ValueType) -> Attr {
    Attr {
        name,
        kind,
        required: false,
        takes_ephemeral: false,
    }
}
/// An optional attribute that may take an ephemeral value ([`Attr::takes_ephemeral`]).
pub const fn opt_ephemeral(name: &'static str, kind: ValueType) -> Attr {
    Attr {
        name,
        kind,
        required: false,
        takes_ephemeral: true,
    }
}

#[derive(Debug)]
pub struct Child {
    pub name: &'static str,
    pub spec: &'static BlockSpec,
    pub multiple: bool,
}

#[derive(Debug)]
pub struct BlockSpec {
    pub kind: &'static str,
    /// Names of the labels the block takes, for "expected N labels" errors.
    pub labels: &'static [&'static str],
    pub attrs: &'static [Attr],
    pub blocks: &'static [Child],
    /// Module blocks take any attribute as an input.
    pub open: bool,
}

impl BlockSpec {
    pub fn attr(&self, name: &str) -> Option<&'static Attr> {
        self.attrs.iter().find(|a| a.name == name)
    }
    pub fn child(&self, name: &str) -> Option<&'static Child> {
        self.blocks.iter().find(|c| c.name == name)
    }
    pub fn names(&self) -> impl Iterator<Item = &'static str> {
        self.attrs
            .iter()
            .map(|a| a.name)
            .chain(self.blocks.iter().map(|c| c.name))
    }
}

pub const fn spec(
    kind: &'static str,
    labels: &'static [&'static str],
    attrs: &'static [Attr],
    blocks: &'static [Child],
) -> BlockSpec {
    BlockSpec {
        kind,
        labels,
        attrs,
        blocks,
        open: false,
    }
}

/// `http://host:port/path` → (host, port, path). A URL with a control character or a space
/// anywhere is refused: it would change the request line or a header.
pub fn parse_url(url: &str) -> Result<(String, u16, String), String> {
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "\"{}\" contains a control character or a space; write it percent-encoded (%0D, %20)",
            shown_url(url)
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("\"{}\" is not an http:// URL", shown_url(url)))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    if authority.contains('@') {
        return Err(format!(
            "\"{}\": user information in the URL is not supported",
            shown_url(url)
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse()
                .map_err(|_| format!("bad port in \"{}\"", shown_url(url)))?,
        ),
        _ => (authority.to_string(), 80),
    };
    if host.is_empty() {
        return Err(format!("no host in \"{}\"", shown_url(url)));
    }
    if port == 0 {
        return Err(format!("port 0 in \"{}\"", shown_url(url)));
    }
    Ok((host, port, path))
}

/// A URL as messages quote it: cut, and its line breaks written as `\n` so the quote stays on
/// one line.
fn shown_url(url: &str) -> String {
    crate::diag::clip(&url.replace('\n', "\\n"), 120)
}

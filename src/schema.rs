//! The shape of the language's blocks: attribute names, their types, which are required, nested
//! blocks. The types only; `config::schema` lists the blocks, each resource kind its own.

/// The type an attribute's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
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
    /// A type constraint (`variable.type`).
    TypeExpr,
    /// The `for_each` meta-argument.
    ForEach,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Any => "any value",
            Kind::Str => "a string",
            Kind::Num => "a number",
            Kind::Bool => "a bool",
            Kind::ListStr => "a list of strings",
            Kind::MapStr => "a map of strings",
            Kind::Node => "a node reference such as node.spark1",
            Kind::Jump => "a jump host reference such as jump.bastion",
            Kind::Container => "a container reference such as container.ray_head",
            Kind::Duration => "a duration such as \"30s\", \"5m\" or \"1h30m\"",
            Kind::Size => "a size such as \"16g\" or \"512m\", or a number of bytes",
            Kind::Gpus => "a number of GPUs or \"all\"",
            Kind::RefList => "a list of references",
            Kind::TypeExpr => "a type",
            Kind::ForEach => "a map or a set of strings",
        }
    }
}

#[derive(Debug)]
pub struct Attr {
    pub name: &'static str,
    pub kind: Kind,
    pub required: bool,
}

pub const fn req(name: &'static str, kind: Kind) -> Attr {
    Attr {
        name,
        kind,
        required: true,
    }
}
pub const fn opt(name: &'static str, kind: Kind) -> Attr {
    Attr {
        name,
        kind,
        required: false,
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

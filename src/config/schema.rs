//! What each block may contain: attribute names, their types, which are required, nested blocks.

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

const fn req(name: &'static str, kind: Kind) -> Attr {
    Attr {
        name,
        kind,
        required: true,
    }
}
const fn opt(name: &'static str, kind: Kind) -> Attr {
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

const fn spec(
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

pub static VALIDATION: BlockSpec = spec(
    "validation",
    &[],
    &[
        req("condition", Kind::Bool),
        req("error_message", Kind::Str),
    ],
    &[],
);

pub static VARIABLE: BlockSpec = spec(
    "variable",
    &["name"],
    &[
        opt("type", Kind::TypeExpr),
        opt("default", Kind::Any),
        opt("description", Kind::Str),
        opt("sensitive", Kind::Bool),
        opt("nullable", Kind::Bool),
    ],
    &[Child {
        name: "validation",
        spec: &VALIDATION,
        multiple: true,
    }],
);

pub static JUMP: BlockSpec = spec(
    "jump",
    &["name"],
    &[
        req("address", Kind::Str),
        opt("user", Kind::Str),
        opt("port", Kind::Num),
        opt("identity_file", Kind::Str),
        opt("known_hosts", Kind::Str),
    ],
    &[],
);

pub static NODE: BlockSpec = spec(
    "node",
    &["name"],
    &[
        req("address", Kind::Str),
        opt("user", Kind::Str),
        opt("port", Kind::Num),
        opt("jump", Kind::Jump),
        opt("identity_file", Kind::Str),
        opt("known_hosts", Kind::Str),
        opt("gpus", Kind::Num),
        opt("memory_gib", Kind::Num),
        opt("labels", Kind::MapStr),
        opt("unified_memory", Kind::Bool),
    ],
    &[],
);

pub static ATTACH: BlockSpec = spec(
    "attach",
    &["name"],
    &[
        req("node", Kind::Node),
        req("interface", Kind::Str),
        req("address", Kind::Str),
    ],
    &[],
);

pub static NETWORK: BlockSpec = spec(
    "network",
    &["name"],
    &[req("subnet", Kind::Str), opt("mtu", Kind::Num)],
    &[Child {
        name: "attach",
        spec: &ATTACH,
        multiple: true,
    }],
);

pub static READY: BlockSpec = spec(
    "ready",
    &[],
    &[
        opt("exec", Kind::ListStr),
        opt("http", Kind::Str),
        opt("tcp", Kind::Str),
        opt("status", Kind::Num),
        opt("exit_code", Kind::Num),
        opt("output_contains", Kind::Str),
        opt("timeout", Kind::Duration),
        opt("interval", Kind::Duration),
        opt("fail_on_log", Kind::MapStr),
    ],
    &[],
);

pub static CONTAINER: BlockSpec = spec(
    "container",
    &["name"],
    &[
        req("node", Kind::Node),
        req("image", Kind::Str),
        opt("name", Kind::Str),
        opt("command", Kind::ListStr),
        opt("entrypoint", Kind::ListStr),
        opt("env", Kind::MapStr),
        opt("network_mode", Kind::Str),
        opt("ipc_mode", Kind::Str),
        opt("pid_mode", Kind::Str),
        opt("shm_size", Kind::Size),
        opt("gpus", Kind::Gpus),
        opt("devices", Kind::ListStr),
        opt("volumes", Kind::ListStr),
        opt("ulimits", Kind::MapStr),
        opt("cap_add", Kind::ListStr),
        opt("privileged", Kind::Bool),
        opt("user", Kind::Str),
        opt("working_dir", Kind::Str),
        opt("restart", Kind::Str),
        opt("labels", Kind::MapStr),
        opt("pull", Kind::Bool),
        opt("image_archive", Kind::Str),
        opt("stop_timeout", Kind::Duration),
        opt("replace_triggered_by", Kind::RefList),
        opt("depends_on", Kind::RefList),
        opt("for_each", Kind::ForEach),
    ],
    &[Child {
        name: "ready",
        spec: &READY,
        multiple: true,
    }],
);

pub static PROBE_HTTP: BlockSpec = spec(
    "http",
    &[],
    &[
        req("via", Kind::Node),
        req("url", Kind::Str),
        opt("method", Kind::Str),
        opt("headers", Kind::MapStr),
        opt("json", Kind::Any),
        opt("body", Kind::Str),
    ],
    &[],
);

pub static PROBE_EXEC: BlockSpec = spec(
    "exec",
    &[],
    &[
        opt("node", Kind::Node),
        opt("container", Kind::Container),
        req("command", Kind::ListStr),
    ],
    &[],
);

pub static PROBE_TCP: BlockSpec = spec(
    "tcp",
    &[],
    &[req("via", Kind::Node), req("address", Kind::Str)],
    &[],
);

pub static EXPECT: BlockSpec = spec(
    "expect",
    &[],
    &[
        opt("status", Kind::Num),
        opt("contains", Kind::Str),
        opt("matches", Kind::Str),
        opt("json_path", Kind::Str),
        opt("equals", Kind::Any),
        opt("exit_code", Kind::Num),
        opt("stdout_contains", Kind::Str),
    ],
    &[],
);

pub static PROBE: BlockSpec = spec(
    "probe",
    &["name"],
    &[
        opt("timeout", Kind::Duration),
        opt("interval", Kind::Duration),
        opt("depends_on", Kind::RefList),
    ],
    &[
        Child {
            name: "http",
            spec: &PROBE_HTTP,
            multiple: false,
        },
        Child {
            name: "exec",
            spec: &PROBE_EXEC,
            multiple: false,
        },
        Child {
            name: "tcp",
            spec: &PROBE_TCP,
            multiple: false,
        },
        Child {
            name: "expect",
            spec: &EXPECT,
            multiple: false,
        },
    ],
);

pub static CHECK: BlockSpec = spec(
    "check",
    &["name"],
    &[
        req("condition", Kind::Bool),
        req("error_message", Kind::Str),
        opt("severity", Kind::Str),
    ],
    &[],
);

pub static OUTPUT: BlockSpec = spec(
    "output",
    &["name"],
    &[
        req("value", Kind::Any),
        opt("sensitive", Kind::Bool),
        opt("description", Kind::Str),
        opt("depends_on", Kind::RefList),
    ],
    &[],
);

pub static MODULE: BlockSpec = BlockSpec {
    kind: "module",
    labels: &["name"],
    attrs: &[req("source", Kind::Str), opt("depends_on", Kind::RefList)],
    blocks: &[],
    open: true,
};

pub static LOCALS: BlockSpec = BlockSpec {
    kind: "locals",
    labels: &[],
    attrs: &[],
    blocks: &[],
    open: true,
};

pub static TOP_LEVEL: &[&BlockSpec] = &[
    &VARIABLE, &LOCALS, &JUMP, &NODE, &NETWORK, &CONTAINER, &PROBE, &CHECK, &MODULE, &OUTPUT,
];

pub fn top_level(kind: &str) -> Option<&'static BlockSpec> {
    TOP_LEVEL.iter().copied().find(|s| s.kind == kind)
}

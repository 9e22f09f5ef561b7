//! What each block may contain. The resource kinds declare their own blocks (`kinds::*`); this
//! lists the others and the top level.

use crate::kind::Registered;
use crate::schema::{opt, req, spec};
pub use crate::schema::{Attr, BlockSpec, Child, ValueType};
use crate::vocabulary::KindId;

pub static VALIDATION: BlockSpec = spec(
    "validation",
    &[],
    &[
        req("condition", ValueType::Bool),
        req("error_message", ValueType::Str),
    ],
    &[],
);

pub static VARIABLE: BlockSpec = spec(
    "variable",
    &["name"],
    &[
        opt("type", ValueType::TypeExpr),
        opt("default", ValueType::Any),
        opt("description", ValueType::Str),
        opt("sensitive", ValueType::Bool),
        opt("ephemeral", ValueType::Bool),
        opt("nullable", ValueType::Bool),
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
        req("address", ValueType::Str),
        opt("user", ValueType::Str),
        opt("port", ValueType::Num),
        opt("identity_file", ValueType::Str),
        opt("known_hosts", ValueType::Str),
    ],
    &[],
);

pub static NODE: BlockSpec = spec(
    "node",
    &["name"],
    &[
        req("address", ValueType::Str),
        opt("user", ValueType::Str),
        opt("port", ValueType::Num),
        opt("jump", ValueType::Jump),
        opt("identity_file", ValueType::Str),
        opt("known_hosts", ValueType::Str),
        opt("gpus", ValueType::Num),
        opt("memory_gib", ValueType::Num),
        opt("labels", ValueType::MapStr),
        opt("unified_memory", ValueType::Bool),
        opt("gpu_devices", ValueType::Bool),
    ],
    &[],
);

pub static CHECK: BlockSpec = spec(
    "check",
    &["name"],
    &[
        req("condition", ValueType::Bool),
        req("error_message", ValueType::Str),
        opt("severity", ValueType::Str),
    ],
    &[],
);

pub static OUTPUT: BlockSpec = spec(
    "output",
    &["name"],
    &[
        req("value", ValueType::Any),
        opt("sensitive", ValueType::Bool),
        opt("description", ValueType::Str),
        opt("depends_on", ValueType::RefList),
    ],
    &[],
);

/// `import { to = ADDRESS, id = "NODE:OBJECT" }`: adopt an object already running.
pub static IMPORT: BlockSpec = spec(
    "import",
    &[],
    &[req("to", ValueType::Address), req("id", ValueType::Str)],
    &[],
);

/// `moved { from = ADDRESS, to = ADDRESS }`: what the state records at `from` (a resource, a
/// `for_each` instance, or everything under a module or a resource) is recorded at `to` from the
/// next apply on; nothing on the nodes changes.
pub static MOVED: BlockSpec = spec(
    "moved",
    &[],
    &[
        req("from", ValueType::Address),
        req("to", ValueType::Address),
    ],
    &[],
);

/// `removed { from = ADDRESS lifecycle { destroy = false } }`: forget what the state records at
/// `from` without touching the nodes (`destroy = true`, the default, destroys it as deleting
/// the block would).
pub static REMOVED: BlockSpec = spec(
    "removed",
    &[],
    &[req("from", ValueType::Address)],
    &[Child {
        name: "lifecycle",
        spec: &REMOVED_LIFECYCLE,
        multiple: false,
    }],
);

pub static REMOVED_LIFECYCLE: BlockSpec =
    spec("lifecycle", &[], &[opt("destroy", ValueType::Bool)], &[]);

/// `state { backend = "pg" … }`: where the state lives (`config::backend`). Literal strings.
pub static STATE: BlockSpec = spec(
    "state",
    &[],
    &[
        opt("backend", ValueType::Str),
        opt("schema", ValueType::Str),
        opt("workspace", ValueType::Str),
    ],
    &[],
);

pub static MODULE: BlockSpec = BlockSpec {
    kind: "module",
    labels: &["name"],
    attrs: &[
        req("source", ValueType::Str),
        opt("depends_on", ValueType::RefList),
    ],
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

/// Every top-level block: the language's own, with the resource kinds' from the registry, in
/// the order of `KindId::ALL`.
pub fn top_level_blocks() -> Vec<&'static BlockSpec> {
    let own_before: [&'static BlockSpec; 4] = [&VARIABLE, &LOCALS, &JUMP, &NODE];
    let own_after: [&'static BlockSpec; 7] =
        [&CHECK, &MODULE, &OUTPUT, &IMPORT, &MOVED, &REMOVED, &STATE];
    let kinds = KindId::ALL.iter().map(|k| k.top_block());
    own_before
        .into_iter()
        .chain(kinds)
        .chain(own_after)
        .collect()
}

pub fn top_level(kind: &str) -> Option<&'static BlockSpec> {
    top_level_blocks().into_iter().find(|s| s.kind == kind)
}

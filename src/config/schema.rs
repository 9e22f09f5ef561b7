//! What each block may contain. The resource kinds declare their own blocks (`kinds::*`); this
//! lists the others and the top level.

use crate::kind::Registered;
use crate::schema::{opt, req, spec};
pub use crate::schema::{Attr, BlockSpec, Child, Kind};
use crate::vocabulary::KindId;

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
        opt("ephemeral", Kind::Bool),
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
        opt("gpu_devices", Kind::Bool),
    ],
    &[],
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

/// `import { to = ADDRESS, id = "NODE:OBJECT" }`: adopt an object already running.
pub static IMPORT: BlockSpec = spec(
    "import",
    &[],
    &[req("to", Kind::Address), req("id", Kind::Str)],
    &[],
);

/// `moved { from = ADDRESS, to = ADDRESS }`: what the state records at `from` (a resource, a
/// `for_each` instance, or everything under a module or a resource) is recorded at `to` from the
/// next apply on; nothing on the nodes changes.
pub static MOVED: BlockSpec = spec(
    "moved",
    &[],
    &[req("from", Kind::Address), req("to", Kind::Address)],
    &[],
);

/// `removed { from = ADDRESS lifecycle { destroy = false } }`: forget what the state records at
/// `from` without touching the nodes (`destroy = true`, the default, destroys it as deleting
/// the block would).
pub static REMOVED: BlockSpec = spec(
    "removed",
    &[],
    &[req("from", Kind::Address)],
    &[Child {
        name: "lifecycle",
        spec: &REMOVED_LIFECYCLE,
        multiple: false,
    }],
);

pub static REMOVED_LIFECYCLE: BlockSpec =
    spec("lifecycle", &[], &[opt("destroy", Kind::Bool)], &[]);

/// `state { backend = "pg" … }`: where the state lives (`config::backend`). Literal strings.
pub static STATE: BlockSpec = spec(
    "state",
    &[],
    &[
        opt("backend", Kind::Str),
        opt("schema", Kind::Str),
        opt("workspace", Kind::Str),
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

//! What a lost or replaced state leaves running: objects that carry sparkform's labels for
//! addresses of the definitions under another lineage than the state's (or under none), found
//! by the kinds during refresh (`Machine::find_foreign`). The plan lists them, and
//! `plan -generate-import-out=FILE` writes the `import` blocks that adopt them, so the next
//! apply records them without restarting anything. Pure.

use serde::{Deserialize, Serialize};

use super::{Import, Observations};
use crate::config::Config;
use crate::state::State;
use crate::vocabulary::KindId;

/// An object of the definitions' address on the definitions' node, started under another
/// state's lineage (or none).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Foreign {
    pub address: String,
    /// `node.spark1`.
    pub node: String,
    /// The kind that found it.
    pub kind: KindId,
    /// Its name on the node (a container's name): the import id's OBJECT.
    pub name: String,
    /// Its ID on the node (a container's ID).
    pub id: String,
    /// The lineage it carries; `None` when it carries none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
}

impl Foreign {
    /// `NODE:NAME`, as an `import` block's `id` says it.
    pub fn import_id(&self) -> String {
        let node = self.node.strip_prefix("node.").unwrap_or(&self.node);
        format!("{node}:{}", self.name)
    }

    /// The `import` block that adopts it.
    pub fn import_block(&self) -> String {
        import_block(&self.address, &self.import_id())
    }
}

/// `import { to = ADDRESS  id = "NODE:OBJECT" }` as HCL text (the id quoted, with `${` and
/// `%{` escaped: an object name is the machine's).
pub fn import_block(address: &str, id: &str) -> String {
    let quoted = serde_json::to_string(id)
        .unwrap_or_default()
        .replace("${", "$${")
        .replace("%{", "%%{");
    format!("import {{\n  to = {address}\n  id = {quoted}\n}}\n")
}

/// What the plan lists: the objects refresh found for an address the definitions declare on
/// that node, the state does not record and no import adopts. Sorted by address and node.
pub(super) fn listed(
    config: &Config,
    state: &State,
    observations: Option<&Observations>,
    imports: &[Import],
) -> Vec<Foreign> {
    let Some(obs) = observations else {
        return Vec::new();
    };
    let mut out: Vec<Foreign> = obs
        .foreign
        .iter()
        .filter(|f| {
            config
                .resource(&f.address)
                .is_some_and(|r| r.node.as_deref() == Some(f.node.as_str()))
                && !state.resources.contains_key(&f.address)
                && !imports.iter().any(|i| i.address == f.address)
                && f.lineage.as_deref() != Some(state.lineage.as_str())
        })
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The `import` blocks that adopt every one of `foreign` (`plan -generate-import-out`), one
/// object per address (the first by node when two claim one), with a header saying what they
/// are.
pub fn import_blocks(foreign: &[Foreign]) -> String {
    if foreign.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "# Written by `sparkform plan -generate-import-out`: objects that carry sparkform's labels\n# for these addresses under another state's lineage. `sparkform apply` adopts them,\n# restarting nothing; once the state records them these blocks are no-ops.\n",
    );
    let mut seen = std::collections::BTreeSet::new();
    for f in foreign {
        if seen.insert(f.address.as_str()) {
            out.push('\n');
            out.push_str(&f.import_block());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_block_escapes_what_hcl_would_interpolate() {
        assert_eq!(
            import_block("container.w[\"a\"]", "n1:x${y}%{z}\"q"),
            "import {\n  to = container.w[\"a\"]\n  id = \"n1:x$${y}%%{z}\\\"q\"\n}\n"
        );
    }
}

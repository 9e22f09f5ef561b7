//! Model weights: one Hugging Face snapshot at one pinned commit, present and verified in a
//! cache folder on each node. A resource per node (`model.qwen["spark1"]`): the download node
//! fetches it from the hub, every other node pulls it from the download node over the fabric.
//! The program that does the work on the nodes is `transfer.py` (in a one-shot container).

pub mod desired;
pub(crate) mod lower;
pub mod machine;

pub use desired::{Desired, Recorded, ROLE_DOWNLOAD, ROLE_PULL};

use crate::kind::Kind;
use crate::schema::{self, opt, req, spec, BlockSpec};
use crate::vocabulary::OnDrift;

/// The block that declares it.
pub static MODEL: BlockSpec = spec(
    "model",
    &["name"],
    &[
        req("repo", schema::ValueType::Str),
        opt("revision", schema::ValueType::Str),
        req("nodes", schema::ValueType::Any),
        req("cache", schema::ValueType::Str),
        opt("download_node", schema::ValueType::Node),
        opt("network", schema::ValueType::Any),
        opt("include", schema::ValueType::ListStr),
        opt("exclude", schema::ValueType::ListStr),
        schema::opt_ephemeral("token", schema::ValueType::Str),
        opt("image", schema::ValueType::Str),
        opt("endpoint", schema::ValueType::Str),
        opt("serve_image", schema::ValueType::Str),
        opt("keep_revisions", schema::ValueType::Num),
        opt("depends_on", schema::ValueType::RefList),
    ],
    &[],
);

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &MODEL;

/// The image that runs the transfer when the block names none: vLLM's, which carries
/// `huggingface_hub`.
pub const DEFAULT_IMAGE: &str = "vllm/vllm-openai:latest";

/// The revision when the block names none.
pub const DEFAULT_REVISION: &str = "main";

pub struct Model;
pub static KIND: Model = Model;
super::register!(Model, KIND, TOP_BLOCK, lower::lower);

/// The earlier revisions a node keeps, as a plan says it: how many, their size, their commits;
/// and those it removes.
fn kept_text(kept: &[desired::Kept], removed: &[String]) -> Option<String> {
    let short = |c: &str| c[..c.len().min(12)].to_string();
    let mut parts = Vec::new();
    if !kept.is_empty() {
        // A copy recorded before sizes were is left out of the sum, and an unknown sum unsaid.
        let sizes: Vec<u64> = kept.iter().filter_map(|k| k.bytes).collect();
        let size = match sizes.is_empty() {
            true => String::new(),
            false => format!("{}, ", human_bytes(sizes.iter().sum())),
        };
        let commits: Vec<String> = kept.iter().map(|k| short(&k.commit)).collect();
        parts.push(format!(
            "{} earlier revision{} ({size}{})",
            kept.len(),
            if kept.len() == 1 { "" } else { "s" },
            commits.join(", ")
        ));
    }
    if !removed.is_empty() {
        let commits: Vec<String> = removed.iter().map(|c| short(c)).collect();
        parts.push(format!("removes {}", commits.join(", ")));
    }
    (!parts.is_empty()).then(|| parts.join(", and "))
}

/// What changes without replacing the weights: how they are fetched, not which they are. A
/// changed revision that points at the same commit keeps them too.
pub const IN_PLACE: &[&str] = &[
    "keep_revisions",
    "revision",
    "image",
    "endpoint",
    "token",
    "role",
    "download_node",
    "source_address",
    "more_source_addresses",
    "address",
    "serve_image",
];

impl Kind for Model {
    type Desired = Desired;
    type Recorded = Recorded;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &MODEL,
        in_place: IN_PLACE,
        whole_attributes: &[],
        lifecycle: crate::vocabulary::Lifecycle::Converges,
        on_drift: OnDrift::Update,
        service: false,
        disruption: None,
        found_untracked: false,
        dot_shape: "cylinder",
    };
    /// A pull step also runs `serve` on the download node.
    fn placement(&self, desired: &Desired) -> crate::kind::Placement {
        crate::kind::Placement {
            other_nodes: (desired.role == ROLE_PULL)
                .then(|| desired.download_node.clone())
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }
    /// The revision in use until now joins the kept ones, the one the change puts in use leaves
    /// them, and those past `keep_revisions` go (as the apply's step does it).
    fn kept_for_rollback(
        &self,
        desired: &Desired,
        before: Option<&Desired>,
        recorded: &Recorded,
    ) -> Option<String> {
        let commit = desired.commit.as_deref()?;
        let in_use = before
            .and_then(|b| b.commit.clone())
            .filter(|c| is_commit(c))
            .map(|commit| desired::Kept {
                commit,
                bytes: recorded.bytes_total,
            });
        let (kept, removed) = desired::Kept::after(
            in_use.into_iter().chain(recorded.kept.iter().cloned()),
            commit,
            desired.keep_revisions(),
        );
        kept_text(&kept, &removed)
    }
    /// A snapshot of the commit the definitions want (verified, then kept by a rollback) is
    /// the copy the next apply uses; any other untracked snapshot goes.
    fn untracked(&self, orphan_id: &str, desired: Option<&Desired>) -> crate::kind::Untracked {
        crate::kind::Untracked {
            found_by: "was copied and verified by sparkform into the block's cache folder",
            wanted: desired.is_some_and(|d| d.commit.as_deref() == Some(orphan_id)),
        }
    }
    /// Files missing or corrupt on a node are fetched again in place (what is verified stays).
    /// The download node's resource, once its revision is resolved: the repository, the
    /// revision as written, its commit, the manifest's size and file count, and the
    /// `config.json` facts (as their JSON text).
    fn lock_entry(&self, d: &Desired) -> Option<(String, String, crate::lock_file::Entry)> {
        let d = d.clone();
        let commit = d.commit.clone().filter(|_| d.is_download())?;
        let mut e = crate::lock_file::Entry::new();
        e.insert("repo".into(), d.repo.into());
        e.insert("revision".into(), d.revision.into());
        e.insert("commit".into(), commit.into());
        e.insert("total_bytes".into(), d.total_bytes.into());
        e.insert("files".into(), d.files.into());
        if !d.facts.is_null() {
            e.insert("facts".into(), d.facts.to_string().into());
        }
        Some(("model".into(), d.block, e))
    }
    /// The image its transfers run in.
    fn images(&self, desired: &Desired, _: Option<&Recorded>) -> Vec<(String, Option<String>)> {
        vec![(desired.image.clone(), None)]
    }
    /// A new commit says which revision moved: "main now points at 5088b93…" reads as what
    /// happened on the hub, where "`commit` changes" reads as an edit.
    fn replace_reason(&self, attribute: &str, before: &Desired, after: &Desired) -> Option<String> {
        if attribute != "commit" {
            return None;
        }
        let short = |c: &str| c.chars().take(12).collect::<String>();
        let (old, new) = (before.commit.clone()?, after.commit.clone()?);
        let (old_rev, new_rev) = (before.revision.clone(), after.revision.clone());
        Some(if is_commit(&new_rev) {
            format!("the revision changes to commit {}", short(&new))
        } else if old_rev == new_rev {
            format!(
                "revision changed: {new_rev} now points at {} (was {})",
                short(&new),
                short(&old)
            )
        } else {
            format!(
                "the revision changes from {old_rev} to {new_rev}, commit {}",
                short(&new)
            )
        })
    }
}

/// `Qwen/Qwen3-0.6B` → `models--Qwen--Qwen3-0.6B`, the hub cache's folder for a repository.
pub fn storage_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// The local snapshot path: the same on every node, what vLLM serves with `HF_HUB_OFFLINE=1`.
pub fn snapshot_path(cache: &str, repo: &str, commit: &str) -> String {
    format!(
        "{}/{}/snapshots/{commit}",
        cache.trim_end_matches('/'),
        storage_folder(repo)
    )
}

/// A Hugging Face repository id: `ORG/NAME` of letters, digits, `-`, `_`, `.`.
pub fn check_repo(repo: &str) -> Result<(), String> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.len() <= 96
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match repo.split_once('/') {
        Some((org, name)) if ok_part(org) && ok_part(name) => Ok(()),
        _ => Err(format!("{repo:?} is not a repository id ORG/NAME")),
    }
}

/// A branch, tag or commit: no spaces, no control characters, no `..`.
pub fn check_revision(rev: &str) -> Result<(), String> {
    if rev.is_empty()
        || rev.len() > 200
        || rev.contains("..")
        || rev.starts_with('/')
        || rev.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(format!("{rev:?} is not a branch, tag or commit"));
    }
    Ok(())
}

/// The cache folder: absolute, no `..`, no characters Docker's bind syntax would misread.
pub fn check_cache(cache: &str) -> Result<(), String> {
    if !cache.starts_with('/')
        || cache.split('/').any(|p| p == "..")
        || cache.contains([':', ','])
        || cache.chars().any(char::is_control)
    {
        return Err(format!(
            "{cache:?} is not an absolute folder without `..`, `:` or `,`"
        ));
    }
    Ok(())
}

/// An include/exclude pattern (fnmatch, as `huggingface_hub`'s allow/ignore patterns).
pub fn check_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() || p.chars().any(char::is_control) {
        return Err(format!("{p:?} is not a file pattern"));
    }
    Ok(())
}

/// Whether a revision is already a commit (nothing to resolve).
pub fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// Bytes as the plan and progress lines show them.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// What refresh says about one node's copy, from transfer.py's `observe` result: `None` when
/// it is complete and verified.
pub fn judge_observed(node: &str, result: &serde_json::Value) -> Option<Vec<String>> {
    let list = |k: &str| {
        result
            .get(k)
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default()
    };
    let size_of = |v: &[serde_json::Value]| -> u64 {
        v.iter()
            .filter_map(|f| f.get("size").and_then(|s| s.as_u64()))
            .sum()
    };
    let missing = list("missing");
    let differ = list("differ");
    let unverified: Vec<serde_json::Value> = list("present")
        .into_iter()
        .filter(|f| f.get("verified").and_then(|v| v.as_bool()) == Some(false))
        .collect();
    let mut out = Vec::new();
    let names = |v: &[serde_json::Value]| {
        let mut n: Vec<&str> = v
            .iter()
            .filter_map(|f| f.get("path").and_then(|p| p.as_str()))
            .take(3)
            .collect();
        if v.len() > 3 {
            n.push("…");
        }
        n.join(", ")
    };
    if !missing.is_empty() {
        out.push(format!(
            "{} file{} missing on {node} ({}): {}",
            missing.len(),
            if missing.len() == 1 { "" } else { "s" },
            human_bytes(size_of(&missing)),
            names(&missing)
        ));
    }
    let (checksum, size): (Vec<_>, Vec<_>) = differ
        .into_iter()
        .partition(|f| f.get("why").and_then(|w| w.as_str()) == Some("checksum"));
    if !checksum.is_empty() {
        out.push(format!(
            "{} file{} corrupt on {node} (sha256 differs, {}): {}",
            checksum.len(),
            if checksum.len() == 1 { "" } else { "s" },
            human_bytes(size_of(&checksum)),
            names(&checksum)
        ));
    }
    if !size.is_empty() {
        out.push(format!(
            "{} file{} of the wrong size on {node} ({}): {}",
            size.len(),
            if size.len() == 1 { "" } else { "s" },
            human_bytes(size_of(&size)),
            names(&size)
        ));
    }
    if !unverified.is_empty() {
        out.push(format!(
            "{} file{} on {node} changed since verified: {}",
            unverified.len(),
            if unverified.len() == 1 { "" } else { "s" },
            names(&unverified)
        ));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_commit_says_which_revision_moved() {
        let c = |rev: &str, commit: &str| {
            crate::kind::Configuration::from(serde_json::json!({"revision": rev, "commit": commit}))
        };
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        assert_eq!(
            crate::kind::AnyKind::replace_reason(&Model, "commit", &c("main", &a), &c("main", &b))
                .as_deref(),
            Some("revision changed: main now points at bbbbbbbbbbbb (was aaaaaaaaaaaa)")
        );
        assert_eq!(
            crate::kind::AnyKind::replace_reason(&Model, "commit", &c("main", &a), &c("v2", &b))
                .as_deref(),
            Some("the revision changes from main to v2, commit bbbbbbbbbbbb")
        );
        assert_eq!(
            crate::kind::AnyKind::replace_reason(&Model, "commit", &c("main", &a), &c(&b, &b))
                .as_deref(),
            Some("the revision changes to commit bbbbbbbbbbbb")
        );
        assert_eq!(
            crate::kind::AnyKind::replace_reason(&Model, "cache", &c("main", &a), &c("main", &b)),
            None
        );
    }

    #[test]
    fn paths_and_checks() {
        assert_eq!(
            snapshot_path("/c/", "Qwen/Qwen3-0.6B", "abc"),
            "/c/models--Qwen--Qwen3-0.6B/snapshots/abc"
        );
        assert!(check_repo("Qwen/Qwen3-0.6B").is_ok());
        assert!(check_repo("Qwen").is_err());
        assert!(check_repo("a/../b").is_err());
        assert!(check_repo("a/b c").is_err());
        assert!(check_revision("main").is_ok());
        assert!(check_revision("a b").is_err());
        assert!(check_cache("/x/y").is_ok());
        assert!(check_cache("x/y").is_err());
        assert!(check_cache("/x:/y").is_err());
        assert!(is_commit(&"a".repeat(40)));
        assert!(!is_commit("main"));
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn observed_copies_are_judged_by_what_differs() {
        let r = serde_json::json!({
            "present": [{"path": "a", "size": 1, "verified": true}],
            "missing": [{"path": "m1", "size": 1073741824u64}, {"path": "m2", "size": 1073741824u64}],
            "differ": [{"path": "c", "size": 10, "why": "checksum"}],
        });
        let d = judge_observed("spark2", &r).unwrap();
        assert_eq!(d[0], "2 files missing on spark2 (2.0 GiB): m1, m2");
        assert!(d[1].starts_with("1 file corrupt on spark2"), "{d:?}");
        let ok = serde_json::json!({"present": [{"path": "a", "size": 1, "verified": true}], "missing": [], "differ": []});
        assert!(judge_observed("spark2", &ok).is_none());
    }
}

//! What a node holds of the recorded weights, read in one `sh` command on the node (no
//! container): for each cache folder the node's recorded copies live in, every verified record
//! transfer.py wrote (`sparkform/COMMIT.json`) and every snapshot's files with their size and
//! modification time (`find -L`, following the snapshot's links to the blobs, as transfer.py's
//! `os.stat` does). The verdict is transfer.py's `observe` without `--deep`: a file is missing,
//! of another size, or present and still the one verified (same size and modification time as
//! the record says). `-refresh=deep` rehashes in a one-shot container instead.
//!
//! A record of a commit no recorded resource of the node names is a snapshot sparkform left
//! untracked (a run killed before it removed the previous revision, a rollback that kept a
//! verified copy): it is reported as an untracked object of the resource whose cache folder
//! holds it, with its size, so a plan says it and `destroy` removes it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::super::{human_bytes, is_commit, judge_observed};
use crate::hosts::{Cmd, Host, HostError};
use crate::plan::{Drift, Orphan};
use crate::vocabulary::KindId;

/// Its arguments are the repositories' folders in the caches (`CACHE/models--ORG--NAME`),
/// named in its output by their position (from 1) so a path is never parsed back.
pub const SCRIPT: &str = r#"i=0
for s in "$@"; do
  i=$((i+1))
  [ -d "$s" ] || continue
  for r in "$s"/sparkform/*.json; do
    [ -f "$r" ] || continue
    echo "== record $i ${r##*/}"
    cat "$r"
    echo
  done
  for d in "$s"/snapshots/*/; do
    [ -d "$d" ] || continue
    c=${d%/}
    echo "== snapshot $i ${c##*/}"
    find -L "$d" -type f -printf '%s %T@ %P\n' 2>/dev/null
  done
done
exit 0
"#;

/// The repository folder of `repo` in `cache`, as transfer.py and huggingface_hub lay it out.
pub fn storage_folder(cache: &str, repo: &str) -> String {
    format!(
        "{}/models--{}",
        cache.trim_end_matches('/'),
        repo.replace('/', "--")
    )
}

/// What the command printed about one repository folder.
#[derive(Debug, Default, PartialEq)]
pub struct Storage {
    /// A record's text by commit.
    pub records: BTreeMap<String, String>,
    /// A snapshot's files by commit: relative path → (size, modification time in ns).
    pub snapshots: BTreeMap<String, BTreeMap<String, (u64, u128)>>,
}

/// The command's output, by position of the folder (from 0).
pub fn parse_listing(out: &str, folders: usize) -> Vec<Storage> {
    let mut all: Vec<Storage> = (0..folders).map(|_| Storage::default()).collect();
    enum At {
        Nowhere,
        Record(usize, String),
        Snapshot(usize, String),
    }
    let mut at = At::Nowhere;
    for line in out.lines() {
        if let Some(head) = line.strip_prefix("== ") {
            let mut parts = head.splitn(3, ' ');
            let (what, i, name) = (parts.next(), parts.next(), parts.next());
            let i = i
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| i.checked_sub(1))
                .filter(|i| *i < folders);
            at = match (what, i, name) {
                (Some("record"), Some(i), Some(n)) => match n.strip_suffix(".json") {
                    Some(c) if is_commit(c) => {
                        all[i].records.insert(c.to_string(), String::new());
                        At::Record(i, c.to_string())
                    }
                    _ => At::Nowhere,
                },
                (Some("snapshot"), Some(i), Some(c)) if is_commit(c) => {
                    all[i].snapshots.entry(c.to_string()).or_default();
                    At::Snapshot(i, c.to_string())
                }
                _ => At::Nowhere,
            };
            continue;
        }
        match &at {
            At::Record(i, c) => {
                if let Some(text) = all[*i].records.get_mut(c) {
                    text.push_str(line);
                    text.push('\n');
                }
            }
            At::Snapshot(i, c) => {
                let mut f = line.splitn(3, ' ');
                let (Some(size), Some(mtime), Some(path)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                let (Ok(size), Some(mtime)) = (size.parse::<u64>(), mtime_ns(mtime)) else {
                    continue;
                };
                if let Some(files) = all[*i].snapshots.get_mut(c) {
                    files.insert(path.to_string(), (size, mtime));
                }
            }
            At::Nowhere => {}
        }
    }
    all
}

/// GNU find's `%T@` (`SECONDS.FRACTION`) in nanoseconds, exactly (no float on the way).
fn mtime_ns(text: &str) -> Option<u128> {
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: u128 = secs.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    while digits.len() < 9 {
        digits.push('0');
    }
    Some(secs * 1_000_000_000 + digits.parse::<u128>().ok()?)
}

#[derive(Debug, Deserialize)]
struct Record {
    format: String,
    commit: String,
    #[serde(default)]
    files: Vec<RecordFile>,
    #[serde(default)]
    expected: Option<Vec<RecordFile>>,
    #[serde(default)]
    total_bytes: Option<u64>,
}

#[derive(Debug, Deserialize, Clone)]
struct RecordFile {
    path: String,
    size: u64,
    #[serde(default)]
    blob: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    git_sha1: Option<String>,
    #[serde(default)]
    mtime_ns: Option<u128>,
}

impl RecordFile {
    fn blob(&self) -> Option<&str> {
        self.blob
            .as_deref()
            .or(self.sha256.as_deref())
            .or(self.git_sha1.as_deref())
    }
}

const VERIFIED_FORMAT: &str = "sparkform-verified-manifest/1";

fn record_of(storage: &Storage, commit: &str) -> Option<Result<Record, String>> {
    let text = storage.records.get(commit)?;
    Some(
        serde_json::from_str::<Record>(text)
            .map_err(|e| format!("its record cannot be read ({e})"))
            .and_then(|r| {
                if r.format != VERIFIED_FORMAT || r.commit != commit {
                    Err("its record is not a verified manifest of this commit".to_string())
                } else {
                    Ok(r)
                }
            }),
    )
}

/// transfer.py's `observe` of `commit` (without `--deep`) on what the command listed: the
/// verdict for the resource on node `name`.
pub fn judge(storage: &Storage, repo: &str, commit: &str, name: &str) -> Drift {
    let record = match record_of(storage, commit) {
        None => return Drift::Missing(format!("no verified copy of {repo} on {name}")),
        Some(Err(why)) => {
            return Drift::Drifted(vec![format!(
                "the copy of {repo} at {} on {name}: {why}",
                &commit[..12]
            )])
        }
        Some(Ok(r)) => r,
    };
    let verified: BTreeMap<&str, &RecordFile> =
        record.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let wanted = record.expected.as_ref().unwrap_or(&record.files);
    let empty = BTreeMap::new();
    let on_disk = storage.snapshots.get(commit).unwrap_or(&empty);
    let (mut present, mut missing, mut differ) = (Vec::new(), Vec::new(), Vec::new());
    for f in wanted {
        let Some(&(size, mtime)) = on_disk.get(&f.path) else {
            missing.push(serde_json::json!({"path": f.path, "size": f.size}));
            continue;
        };
        if size != f.size {
            differ.push(serde_json::json!({"path": f.path, "size": f.size, "actual_size": size, "why": "size"}));
            continue;
        }
        let trusted = verified.get(f.path.as_str()).is_some_and(|r| {
            r.size == f.size
                && r.blob() == f.blob()
                && (f.sha256.is_none() || r.sha256 == f.sha256)
                && r.mtime_ns == Some(mtime)
        });
        present.push(serde_json::json!({"path": f.path, "size": f.size, "verified": trusted}));
    }
    let result = serde_json::json!({"present": present, "missing": missing, "differ": differ});
    match judge_observed(name, &result) {
        None => Drift::InSync,
        Some(d) => Drift::Drifted(d),
    }
}

/// One recorded copy the node is asked about.
pub struct Asked {
    pub address: String,
    pub repo: String,
    pub commit: String,
    pub cache: String,
    pub node_name: String,
    /// The earlier revisions the record keeps for a rollback: tracked, not untracked.
    pub kept: Vec<String>,
}

/// Read the node once for every copy asked about: the verdict of each, and the snapshots with
/// a record that none of them names (untracked).
pub async fn observe_copies(
    host: &dyn Host,
    asked: &[Asked],
) -> Result<(BTreeMap<String, Drift>, Vec<Orphan>), HostError> {
    let folders: Vec<String> = asked
        .iter()
        .map(|a| storage_folder(&a.cache, &a.repo))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let cmd = Cmd::new("sh")
        .args(["-c", SCRIPT, "sparkform-observe"])
        .args(folders.iter().cloned());
    let out = host.exec(&cmd).await?;
    if !out.success() {
        return Err(HostError::Other {
            node: host.node().to_string(),
            message: format!(
                "cannot list the model caches: {}",
                out.stderr.lines().last().unwrap_or("exit code not 0")
            ),
        });
    }
    let listing = parse_listing(&out.stdout, folders.len());
    let position = |a: &Asked| {
        let f = storage_folder(&a.cache, &a.repo);
        folders.iter().position(|x| *x == f).unwrap_or(0)
    };
    let mut seen = BTreeMap::new();
    for a in asked {
        let storage = &listing[position(a)];
        seen.insert(
            a.address.clone(),
            judge(storage, &a.repo, &a.commit, &a.node_name),
        );
    }
    let mut orphans = Vec::new();
    for (i, storage) in listing.iter().enumerate() {
        let here: Vec<&Asked> = asked.iter().filter(|a| position(a) == i).collect();
        let Some(owner) = here.first() else { continue };
        for commit in storage.records.keys() {
            if here
                .iter()
                .any(|a| a.commit == *commit || a.kept.contains(commit))
            {
                continue;
            }
            let size = record_of(storage, commit)
                .and_then(Result::ok)
                .and_then(|r| r.total_bytes)
                .map(|b| format!(", {}", human_bytes(b)))
                .unwrap_or_default();
            orphans.push(Orphan {
                kind: KindId::Model,
                address: owner.address.clone(),
                node: host.node().to_string(),
                name: format!("snapshot {} of {}{size}", &commit[..12], owner.repo),
                id: commit.clone(),
                running: false,
            });
        }
    }
    Ok((seen, orphans))
}

/// transfer.py's `observe --deep` of a recorded copy in a one-shot container: every file
/// rehashed.
pub(super) async fn deep(
    host: &dyn Host,
    lineage: &str,
    address: &str,
    w: &super::Want,
) -> Result<Drift, HostError> {
    let node = host.node().to_string();
    let docker = host.docker().await?;
    let mut args = vec!["observe".to_string()];
    args.extend(super::snapshot_args(w, &w.commit));
    args.push("--deep".into());
    let job = super::Job {
        node: &node,
        docker: &docker,
        who: super::helper(&w.block, &w.node_name, "observe"),
        image: &w.image,
        cache: &w.cache,
        args,
        input: String::new(),
        lineage,
    };
    let never = tokio_util::sync::CancellationToken::new();
    let end = super::run(&job, &mut |_| {}, &never)
        .await
        .map_err(|e| HostError::Docker {
            node: node.clone(),
            message: format!("cannot observe {address}: {}", e.message),
            help: e.help.clone(),
        })?;
    let Some(result) = end.result.filter(|_| end.code == 0) else {
        return Err(HostError::Docker {
            node: node.clone(),
            message: format!(
                "cannot observe {address}: {}",
                end.error
                    .or_else(|| end.stderr.last().cloned())
                    .unwrap_or_else(|| format!("exit code {}", end.code))
            ),
            help: None,
        });
    };
    let name = &w.node_name;
    Ok(
        if result.get("recorded").and_then(|x| x.as_bool()) == Some(false) {
            Drift::Missing(format!("no verified copy of {} on {name}", w.repo))
        } else {
            match judge_observed(name, &result) {
                None => Drift::InSync,
                Some(d) => Drift::Drifted(d),
            }
        },
    )
}

/// What a rollback to `commit` would find of it on the node: `None` when the copy there is
/// still the one verified (every file of the manifest recorded at its download, unchanged
/// since), else why not, naming each file.
pub async fn kept_copy(
    host: &dyn Host,
    repo: &str,
    cache: &str,
    commit: &str,
    name: &str,
) -> Result<Option<String>, HostError> {
    let folder = storage_folder(cache, repo);
    let cmd = Cmd::new("sh")
        .args(["-c", SCRIPT, "sparkform-observe"])
        .arg(folder);
    let out = host.exec(&cmd).await?;
    if !out.success() {
        return Ok(None);
    }
    let listing = parse_listing(&out.stdout, 1);
    Ok(match judge(&listing[0], repo, commit, name) {
        Drift::InSync => None,
        Drift::Missing(why) => Some(why),
        Drift::Drifted(why) => Some(why.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn find_times_are_exact_nanoseconds() {
        assert_eq!(
            mtime_ns("1701601234.1234567890"),
            Some(1_701_601_234_123_456_789)
        );
        assert_eq!(mtime_ns("12.5"), Some(12_500_000_000));
        assert_eq!(mtime_ns("12"), Some(12_000_000_000));
        assert_eq!(mtime_ns("x.1"), None);
        assert_eq!(mtime_ns("1.x"), None);
    }

    fn record(files: &str, expected: &str) -> String {
        format!(
            r#"{{"format": "{VERIFIED_FORMAT}", "commit": "{A}", "repo": "o/m", "files": [{files}], "expected": [{expected}], "total_bytes": 3000}}"#
        )
    }

    fn listing(rec: &str, snap: &str) -> String {
        format!(
            "== record 1 {A}.json\n{rec}\n\n== snapshot 1 {A}\n{snap}== record 1 {B}.json\n{{}}\n"
        )
    }

    #[test]
    fn a_listing_is_judged_as_transfer_py_observes() {
        let f1 = r#"{"path": "a.safetensors", "size": 1000, "blob": "11", "sha256": "11", "mtime_ns": 5000000000}"#;
        let f2 = r#"{"path": "dir/b.json", "size": 2000, "blob": "22", "sha256": "22", "mtime_ns": 6000000000}"#;
        let e1 = r#"{"path": "a.safetensors", "size": 1000, "blob": "11", "sha256": "11"}"#;
        let e2 = r#"{"path": "dir/b.json", "size": 2000, "blob": "22", "sha256": "22"}"#;
        let rec = record(&format!("{f1}, {f2}"), &format!("{e1}, {e2}"));
        let whole = listing(
            &rec,
            "1000 5.0000000000 a.safetensors\n2000 6.0 dir/b.json\n",
        );
        let s = parse_listing(&whole, 1);
        assert_eq!(judge(&s[0], "o/m", A, "n1"), Drift::InSync);
        assert_eq!(s[0].records.len(), 2, "both records listed");
        // A file touched since it was verified, one missing, one of another size.
        let touched = listing(&rec, "1000 7.0 a.safetensors\n2000 6.0 dir/b.json\n");
        let Drift::Drifted(d) = judge(&parse_listing(&touched, 1)[0], "o/m", A, "n1") else {
            panic!("a touched file is drift")
        };
        assert!(d.join(" ").contains("a.safetensors"), "{d:?}");
        let gone = listing(&rec, "1000 5.0 a.safetensors\n");
        let Drift::Drifted(d) = judge(&parse_listing(&gone, 1)[0], "o/m", A, "n1") else {
            panic!("a missing file is drift")
        };
        assert!(d.join(" ").contains("missing"), "{d:?}");
        let resized = listing(&rec, "999 5.0 a.safetensors\n2000 6.0 dir/b.json\n");
        assert!(matches!(
            judge(&parse_listing(&resized, 1)[0], "o/m", A, "n1"),
            Drift::Drifted(_)
        ));
        // No record of the commit: no verified copy.
        assert!(matches!(
            judge(&parse_listing("", 1)[0], "o/m", A, "n1"),
            Drift::Missing(_)
        ));
        // A record that is not one: drift, said.
        let Drift::Drifted(d) = judge(&parse_listing(&whole, 1)[0], "o/m", B, "n1") else {
            panic!("a broken record is drift")
        };
        assert!(d[0].contains("record"), "{d:?}");
    }

    /// What a rollback plan asks of a kept revision on a node: nothing when it is as verified,
    /// else the files that changed, by name.
    #[tokio::test]
    async fn a_kept_copy_is_judged_by_its_recorded_manifest_and_names_the_changed_file() {
        use crate::fake::{Answer, FakeHost, FakeWorld};
        let f1 = r#"{"path": "a.safetensors", "size": 1000, "blob": "11", "sha256": "11", "mtime_ns": 5000000000}"#;
        let e1 = r#"{"path": "a.safetensors", "size": 1000, "blob": "11", "sha256": "11"}"#;
        let rec = record(f1, e1);
        let world = FakeWorld::new();
        let as_verified = FakeHost::new("node.n1", &world);
        as_verified.on(
            &["sh", "-c", SCRIPT],
            Answer::Exit(0, listing(&rec, "1000 5.0 a.safetensors\n"), String::new()),
        );
        assert_eq!(
            kept_copy(&as_verified, "o/m", "/c", A, "n1").await.unwrap(),
            None
        );
        let flipped = FakeHost::new("node.n1", &world);
        flipped.on(
            &["sh", "-c", SCRIPT],
            Answer::Exit(0, listing(&rec, "1000 9.0 a.safetensors\n"), String::new()),
        );
        let why = kept_copy(&flipped, "o/m", "/c", A, "n1").await.unwrap();
        assert!(
            why.as_deref().is_some_and(|w| w.contains("a.safetensors")),
            "{why:?}"
        );
        let none = FakeHost::new("node.n1", &world);
        none.on(
            &["sh", "-c", SCRIPT],
            Answer::Exit(0, String::new(), String::new()),
        );
        let why = kept_copy(&none, "o/m", "/c", B, "n1").await.unwrap();
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("no verified copy")),
            "{why:?}"
        );
    }

    #[test]
    fn headers_out_of_range_or_not_commits_are_ignored() {
        let s = parse_listing(
            "== record 2 x.json\n{}\n== record 0 a.json\n== snapshot 1 ../../etc\n1 1.0 passwd\n",
            1,
        );
        assert_eq!(s, vec![Storage::default()]);
    }
}

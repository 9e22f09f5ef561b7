//! `sparkform.lock.hcl` as the operations see it: the lock the definitions resolve to (from
//! every resource's `Kind::lock_entry`), the image references the nodes name now, and what
//! changes against the file. Not the state's lock (`state::StateLock`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::config::Config;
use crate::diag::{Diag, Diagnostics};
use crate::hosts::HostPool;
use crate::kind::Registered;
use crate::lock_file::LockFile;
use crate::runtime::image;
use crate::state::State;

use super::OpError;

/// The lock file's name, beside the definitions.
pub use crate::lock_file::FILE;

/// The lock the definitions `config` resolved to: every entry a kind keeps.
pub fn of(config: &Config) -> LockFile {
    let mut lock = LockFile::default();
    for r in &config.resources {
        if let Some((kind, label, entry)) = r.kind.kind().lock_entry(&r.config) {
            lock.entries.insert((kind, label), entry);
        }
    }
    lock
}

/// The lock's block type for image references: `image "REF" { NODE = "DIGEST" … }`.
const IMAGE: &str = "image";

/// What each node's image references name now, read in the plan's read phase: by (node name,
/// reference).
pub type ImagesSeen = BTreeMap<(String, String), image::ImageSeen>;

/// One image reference a resource runs on a node.
struct ImageUse<'a> {
    address: &'a str,
    node_address: &'a str,
    node: &'a str,
    image: String,
}

/// Every (resource, node, image reference) of the definitions, from each kind's `images`. A
/// node name that two nodes share (in different modules) is left out: the lock is keyed by it.
fn image_uses(config: &Config) -> Vec<ImageUse<'_>> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for n in config.nodes.values() {
        *names.entry(n.name.as_str()).or_default() += 1;
    }
    let mut out = Vec::new();
    for r in &config.resources {
        let Some(node) = r.node.as_deref().and_then(|a| config.nodes.get(a)) else {
            continue;
        };
        if names.get(node.name.as_str()) != Some(&1) {
            continue;
        }
        for (image, _) in r.kind.kind().images(&r.config, None) {
            out.push(ImageUse {
                address: &r.address,
                node_address: &node.address,
                node: &node.name,
                image,
            });
        }
    }
    out
}

/// Read on `pool` what the definitions' image references name on their nodes (one inspect per
/// reference and node, all at once); a node that is not connected or does not answer is left out.
pub async fn read_images(config: &Config, pool: &HostPool) -> ImagesSeen {
    let mut wanted: BTreeMap<(&str, &str), BTreeSet<String>> = BTreeMap::new();
    for u in image_uses(config) {
        wanted
            .entry((u.node_address, u.node))
            .or_default()
            .insert(u.image);
    }
    let reads = wanted.into_iter().filter_map(|((address, name), images)| {
        let host = pool.get(address).ok()?;
        let images: Vec<String> = images.into_iter().collect();
        Some(async move {
            let seen = image::image_digests(host.as_ref(), &images).await;
            (name.to_string(), seen)
        })
    });
    let mut out = ImagesSeen::new();
    for (node, seen) in futures_util::future::join_all(reads).await {
        for (image, s) in seen {
            if let Some(s) = s {
                out.insert((node.clone(), image), s);
            }
        }
    }
    out
}

/// What the lock pins `image` to on `node`.
fn locked<'a>(lock: Option<&'a LockFile>, image: &str, node: &str) -> Option<&'a str> {
    lock?.entry(IMAGE, image)?.get(node)?.as_str()
}

/// The image entries of a plan's lock: what the lock pins stays (unless `upgrade`), else what
/// the node's reference names now, else what the state records running there; a reference not
/// on its node yet is written by the apply that loads it.
fn planned_images(
    config: &Config,
    before: Option<&LockFile>,
    upgrade: bool,
    seen: &ImagesSeen,
    recorded: Option<&State>,
) -> LockFile {
    let mut lock = LockFile::default();
    for u in image_uses(config) {
        let key = (u.node.to_string(), u.image.clone());
        let digest = locked(before, &u.image, u.node)
            .filter(|_| !upgrade)
            .map(str::to_string)
            .or_else(|| seen.get(&key).map(|s| s.digest(&u.image)))
            .or_else(|| running(recorded, u.address, &u.image));
        if let Some(d) = digest {
            pin(&mut lock, &u.image, u.node, d);
        }
    }
    lock
}

/// What the state records `address` running for `image`.
fn running(state: Option<&State>, address: &str, image: &str) -> Option<String> {
    let r = state?.resources.get(address)?;
    r.kind
        .kind()
        .images(&r.config, Some(&r.attributes))
        .into_iter()
        .find(|(i, _)| i == image)
        .and_then(|(_, d)| d)
}

fn pin(lock: &mut LockFile, image: &str, node: &str, digest: String) {
    lock.entries
        .entry((IMAGE.to_string(), image.to_string()))
        .or_default()
        .insert(node.to_string(), digest.into());
}

/// A node whose image reference no longer names what the lock pins (pulled or retagged since):
/// one diagnostic each, naming both. `-upgrade` takes what the node has instead.
pub fn image_drift(config: &Config, before: Option<&LockFile>, seen: &ImagesSeen) -> Vec<Diag> {
    let mut out = Vec::new();
    let mut said = BTreeSet::new();
    for u in image_uses(config) {
        let Some(pinned) = locked(before, &u.image, u.node) else {
            continue;
        };
        let Some(now) = seen.get(&(u.node.to_string(), u.image.clone())) else {
            continue;
        };
        if now.is(pinned) || !said.insert((u.node, u.image.clone())) {
            continue;
        }
        out.push(
            Diag::warning(
                "lock::image_drift",
                format!(
                    "image {} on {} is {} (pulled or retagged since it was locked); {} pins {}",
                    u.image,
                    u.node_address,
                    image::short_id(&now.digest(&u.image)),
                    crate::lock_file::FILE,
                    image::short_id(pinned)
                ),
            )
            .help(format!(
                "to run the locked image, tag it again on the node (`docker tag {pinned} {}`); to take the new one, plan and apply with -upgrade (what runs the image is replaced)",
                u.image
            )),
        );
    }
    out
}

/// An apply without `-upgrade` stops at the plan's image drift (`image_drift`'s warnings).
pub fn refuse_image_drift(warnings: &[Diag]) -> Result<(), OpError> {
    let drift: Vec<Diag> = warnings
        .iter()
        .filter(|w| w.code == "lock::image_drift")
        .map(|w| Diag {
            severity: miette::Severity::Error,
            ..w.clone()
        })
        .collect();
    if drift.is_empty() {
        Ok(())
    } else {
        Err(OpError::Config(Diagnostics(drift)))
    }
}

/// The lock file before and after a plan: what the plan shows and an apply writes.
#[derive(Debug, Clone)]
pub struct LockUpdate {
    pub dir: PathBuf,
    pub before: Option<LockFile>,
    pub after: LockFile,
}

impl LockUpdate {
    /// The lock a plan of `config` leads to: the kinds' entries, and the image digests as
    /// [`planned_images`] says.
    pub fn new(
        config: &Config,
        before: Option<&LockFile>,
        upgrade: bool,
        seen: &ImagesSeen,
        recorded: Option<&State>,
    ) -> LockUpdate {
        let mut after = of(config);
        after
            .entries
            .extend(planned_images(config, before, upgrade, seen, recorded).entries);
        LockUpdate {
            dir: config.dir.clone(),
            before: before.cloned(),
            after,
        }
    }

    /// After a successful apply of `config`: the images as the new state records them running
    /// (a node that loaded or pulled one during the apply included), the rest as planned.
    pub fn applied(&self, config: &Config, state: &State) -> LockUpdate {
        let mut after = self.after.clone();
        for u in image_uses(config) {
            if let Some(d) = running(Some(state), u.address, &u.image) {
                pin(&mut after, &u.image, u.node, d);
            }
        }
        LockUpdate {
            dir: self.dir.clone(),
            before: self.before.clone(),
            after,
        }
    }

    /// Whether the file would be written (or created).
    pub fn changed(&self) -> bool {
        match &self.before {
            Some(b) => *b != self.after,
            None => !self.after.entries.is_empty(),
        }
    }

    /// What changes, in the plan's words (`model.qwen: main at 5088b93… (was main at ad8e4dd…)`).
    pub fn changes(&self) -> Vec<String> {
        self.before.clone().unwrap_or_default().changes(&self.after)
    }

    /// `-lockfile=readonly`: a change to the lock is an error, before anything is applied.
    pub fn refuse_changes(&self) -> Result<(), OpError> {
        if !self.changed() {
            return Ok(());
        }
        Err(OpError::Config(Diagnostics(vec![Diag::error(
            "lock::readonly",
            format!(
                "-lockfile=readonly: this apply would change {}: {}",
                crate::lock_file::FILE,
                self.changes().join("; ")
            ),
        )
        .help(
            "run `sparkform lock` (or apply without -lockfile=readonly) and commit the lock file",
        )])))
    }

    /// Write the file when it changes.
    pub fn write(&self) -> Result<bool, OpError> {
        if !self.changed() {
            return Ok(false);
        }
        self.after.write(&self.dir).map_err(|e| {
            OpError::Local(format!(
                "cannot write {}: {e}",
                LockFile::path(&self.dir).display()
            ))
        })?;
        Ok(true)
    }
}

//! What a node's Docker Engine says of an image reference: its ID and registry digests, as the
//! pool inspects it once per reference while it reads for a plan ([`image`]) and the lock file
//! pins it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::hosts::memo::remembered;
use crate::hosts::Host;

/// The ID each image reference resolves to on the node (None: the node does not have it).
pub async fn image_ids(host: &dyn Host, images: &[String]) -> BTreeMap<String, Option<String>> {
    image_digests(host, images)
        .await
        .into_iter()
        .map(|(image, seen)| (image, seen.map(|s| s.id)))
        .collect()
}

/// What an image reference names on a node: its image ID and the registry digests it has.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImageSeen {
    pub id: String,
    pub repo_digests: Vec<String>,
}

impl ImageSeen {
    /// What a lock file pins the reference to: the registry digest of the reference's own
    /// repository (`vllm/vllm-openai@sha256:…`) where the image came from a registry, else the
    /// image ID (a loaded or locally built image has no registry digest).
    pub fn digest(&self, reference: &str) -> String {
        let repo = repository(reference);
        self.repo_digests
            .iter()
            .find(|d| d.split_once('@').is_some_and(|(r, _)| r == repo))
            .cloned()
            .unwrap_or_else(|| self.id.clone())
    }

    /// Whether `pinned` (a [`ImageSeen::digest`] written earlier) names this image.
    pub fn is(&self, pinned: &str) -> bool {
        pinned == self.id || self.repo_digests.iter().any(|d| d == pinned)
    }
}

/// A reference's repository: without its tag or digest (`host:5000/a/b:1` → `host:5000/a/b`).
fn repository(reference: &str) -> &str {
    let no_digest = reference.split_once('@').map_or(reference, |(r, _)| r);
    match no_digest.rfind(':') {
        // A colon after the last slash starts the tag; one before it is a registry's port.
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
}

/// What each of `images` names on `host` (None: not there, or the engine did not answer),
/// through [`image`]: inspected once per reference while the host's pool reads for a plan.
pub async fn image_digests(
    host: &dyn Host,
    images: &[String],
) -> BTreeMap<String, Option<ImageSeen>> {
    let seen = futures_util::future::join_all(images.iter().map(|i| image(host, i))).await;
    images.iter().cloned().zip(seen).collect()
}

/// What the image reference names on `host` (None: not there, or the engine did not answer);
/// a pool that reads for a plan inspects each reference once.
pub async fn image(host: &dyn Host, reference: &str) -> Option<ImageSeen> {
    remembered(host, &format!("image {reference}"), || async {
        inspect(&host.docker().await.ok()?, reference).await
    })
    .await
}

/// What `reference` names on the engine `docker` (None: not there, or no answer).
pub async fn inspect(docker: &bollard::Docker, reference: &str) -> Option<ImageSeen> {
    let i = docker.inspect_image(reference).await.ok()?;
    Some(ImageSeen {
        id: i.id?,
        repo_digests: i.repo_digests.unwrap_or_default(),
    })
}

/// An image ID as people compare them: `sha256:` and 12 hex digits; a registry digest
/// (`repo@sha256:…`) keeps its repository.
pub fn short_id(id: &str) -> String {
    if let Some((repo, digest)) = id.split_once('@') {
        return format!("{repo}@{}", short_id(digest));
    }
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    format!("sha256:{}", hex.chars().take(12).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_pins_the_registry_digest_of_the_references_repository_else_the_id() {
        let seen = ImageSeen {
            id: "sha256:1111".into(),
            repo_digests: vec![
                "mirror:5000/vllm/vllm-openai@sha256:2222".into(),
                "vllm/vllm-openai@sha256:3333".into(),
            ],
        };
        assert_eq!(
            seen.digest("vllm/vllm-openai:v0.21.0"),
            "vllm/vllm-openai@sha256:3333"
        );
        assert_eq!(
            seen.digest("mirror:5000/vllm/vllm-openai:v0.21.0"),
            "mirror:5000/vllm/vllm-openai@sha256:2222"
        );
        assert_eq!(seen.digest("local/built:1"), "sha256:1111");
        assert!(seen.is("sha256:1111") && seen.is("vllm/vllm-openai@sha256:3333"));
        assert!(!seen.is("sha256:4444"));
        assert_eq!(repository("mirror:5000/a/b"), "mirror:5000/a/b");
        assert_eq!(repository("a/b@sha256:00"), "a/b");
        assert_eq!(
            short_id("a/b@sha256:0123456789abcdef"),
            "a/b@sha256:0123456789ab"
        );
    }
}

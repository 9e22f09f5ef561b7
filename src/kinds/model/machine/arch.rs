//! The model kind's architecture check (`Machine::checks`): a one-shot run of the block's
//! `serve_image` lists vLLM's model registry on the download node, after the weights' steps
//! and before every changed resource that uses them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{follow, helper, list, remove_container, s, spawn_with, Desired, Job};
use crate::config::{Config, Resource};
use crate::hosts::HostPool;
use crate::kinds::machine::{Check, CheckRun, StepError};

/// What the architecture check asks the image's vLLM: its registry's architectures, as JSON,
/// printed and kept in the file its first argument names (the answer for that image ID).
const ARCHS_PY: &str = "import json, os, sys\n\
try:\n    from vllm import ModelRegistry\n\
except Exception as e:\n    print(json.dumps({'error': '%s: %s' % (type(e).__name__, e)})); sys.exit(3)\n\
answer = json.dumps({'architectures': sorted(ModelRegistry.get_supported_archs())})\n\
try:\n    os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n    tmp = sys.argv[1] + '.tmp'\n    open(tmp, 'w').write(answer)\n    os.replace(tmp, sys.argv[1])\n\
except (IndexError, OSError):\n    pass\n\
print(answer)\n";

/// Where a node keeps the registry an image's vLLM listed, by the image's ID: an image already
/// asked is not started again (an image ID is its content, so the answer cannot change).
fn answer_path(cache: &str, image_id: &str) -> Option<String> {
    let hex = image_id.strip_prefix("sha256:").unwrap_or(image_id);
    (hex.len() >= 12 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| {
        format!(
            "{}/.sparkform-archcheck/{hex}.json",
            cache.trim_end_matches('/')
        )
    })
}

/// The answer a node kept for `image_id`, if it kept one that reads as a registry.
async fn kept_answer(host: &dyn crate::hosts::Host, path: &str) -> Option<serde_json::Value> {
    let out = host
        .exec(
            &crate::hosts::Cmd::new("cat")
                .arg(path)
                .timeout(Duration::from_secs(20)),
        )
        .await
        .ok()?;
    if !out.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).ok()?;
    (!list(&v, "architectures").is_empty()).then_some(v)
}

/// How long the image may take to answer: importing a real vLLM imports torch, which took 40 to
/// 77 s on the testbed's two shared cores (its CPU build, from a cold page cache).
const ARCHITECTURE_CHECK_BOUND: Duration = Duration::from_secs(300);

/// The architecture check: the image that serves the weights lists the architecture of the
/// model's `config.json`. It runs after the model's steps and before every changed resource
/// that uses the model (the Ray and vLLM containers the modules make depend on it), so an image
/// that cannot load the model is refused in seconds, before anything starts.
struct ArchitectureCheck {
    block: String,
    node: String,
    image: String,
    cache: String,
    architectures: Vec<String>,
}

/// Which of `wanted` a registry lacks; an error when the answer is not a registry.
pub fn lacking(wanted: &[String], answer: &serde_json::Value) -> Result<Vec<String>, String> {
    if let Some(e) = s(answer, "error") {
        return Err(e.to_string());
    }
    let have = list(answer, "architectures");
    if have.is_empty() {
        return Err("the image's vLLM lists no architecture".into());
    }
    Ok(wanted
        .iter()
        .filter(|a| !have.contains(a))
        .cloned()
        .collect())
}

#[async_trait]
impl CheckRun for ArchitectureCheck {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        let host = pool.get(&self.node)?;
        let node = host.node().to_string();
        let image_id = crate::runtime::image::image(host.as_ref(), &self.image)
            .await
            .map(|s| s.id);
        let kept = image_id
            .as_deref()
            .and_then(|id| answer_path(&self.cache, id));
        if let Some(path) = &kept {
            if let Some(answer) = kept_answer(host.as_ref(), path).await {
                if let Ok(missing) = lacking(&self.architectures, &answer) {
                    if missing.is_empty() {
                        return Ok(format!(
                            "{} serves {} (its vLLM was asked before, for image {})",
                            self.image,
                            self.architectures.join(", "),
                            crate::runtime::image::short_id(
                                image_id.as_deref().unwrap_or_default()
                            )
                        ));
                    }
                }
            }
        }
        let docker = host.docker().await?;
        let job = Job {
            node: &node,
            docker: &docker,
            who: helper(&self.block, &node.replace("node.", ""), "archcheck"),
            image: &self.image,
            cache: &self.cache,
            args: Vec::new(),
            input: String::new(),
            lineage: "check",
        };
        let mut cmd = vec!["python3".to_string(), "-c".into(), ARCHS_PY.into()];
        cmd.extend(kept);
        let id = spawn_with(&job, cmd).await?;
        let mut ignore = |_: &serde_json::Value| {};
        let run = follow(&docker, &id, &mut ignore, None);
        let end = tokio::time::timeout(ARCHITECTURE_CHECK_BOUND, run).await;
        remove_container(&docker, &id).await;
        let Ok(end) = end else {
            return Err(StepError::new(format!(
                "{node}: {} did not answer which architectures its vLLM serves within {} s",
                self.image,
                ARCHITECTURE_CHECK_BOUND.as_secs()
            )));
        };
        let answer = end.events.last().cloned().unwrap_or_else(
            || serde_json::json!({"error": end.stderr.last().cloned().unwrap_or_else(|| format!("exit code {}", end.code))}),
        );
        match lacking(&self.architectures, &answer) {
            Ok(missing) if missing.is_empty() => Ok(format!(
                "{} serves {}",
                self.image,
                self.architectures.join(", ")
            )),
            Ok(missing) => Err(StepError::new(format!(
                "{node}: the image {} cannot serve {}: its vLLM does not list the architecture {} of the model's config.json",
                self.image,
                self.block,
                missing.join(", ")
            ))
            .help("use a vLLM image (a newer release, or a build) whose model registry has it; nothing that uses the model was started")),
            Err(why) => Err(StepError::new(format!(
                "{node}: cannot ask {} which architectures its vLLM serves: {why}",
                self.image
            ))
            .help("serve_image must be the vLLM image the modules run (python3 with the vllm package)")),
        }
    }
}

/// The architecture checks of a configuration: one per model block with a `serve_image`
/// whose architecture is known, when the model or something using it changes.
pub fn architecture_checks(config: &Config, changed: &dyn Fn(&str) -> bool) -> Vec<Check> {
    let mut out = Vec::new();
    let models: Vec<(&Resource, Desired)> = config
        .resources
        .iter()
        .filter(|r| r.kind == crate::vocabulary::KindId::Model)
        .filter_map(|r| Some((r, r.config.typed::<Desired>().ok()?)))
        .collect();
    for (r, c) in &models {
        if !c.is_download() {
            continue;
        }
        let (block, Some(image)) = (c.block.as_str(), c.serve_image()) else {
            continue;
        };
        // The model's config.json facts, as the read phase recorded them.
        let architectures = list(&c.facts, "architectures");
        if architectures.is_empty() {
            continue;
        }
        let mine: Vec<String> = models
            .iter()
            .filter(|(_, m)| m.block == block)
            .map(|(m, _)| m.address.clone())
            .collect();
        let users: Vec<String> = config
            .resources
            .iter()
            .filter(|u| !mine.contains(&u.address) && changed(&u.address))
            .filter(|u| u.deps.iter().any(|d| mine.contains(d)))
            .map(|u| u.address.clone())
            .collect();
        let model_changed: Vec<String> = mine.iter().filter(|a| changed(a)).cloned().collect();
        if users.is_empty() && model_changed.is_empty() {
            continue;
        }
        out.push(Check {
            address: format!("{block} (architecture check)"),
            after: model_changed,
            covers: Vec::new(),
            before: users,
            nodes: r.node.clone().into_iter().collect(),
            keeps: Vec::new(),
            run: Arc::new(ArchitectureCheck {
                block: block.to_string(),
                node: r.node.clone().unwrap_or_default(),
                image: image.to_string(),
                cache: Some(c.cache.clone())
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| "/tmp".into()),
                architectures,
            }),
        });
    }
    out
}

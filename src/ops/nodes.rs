//! Nodes: connect to every node of the configuration and gather its facts, then the NCCL each
//! image the node has carries (a short one-shot container per image, bounded on its own so it
//! is removed however it ends).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::hosts::{HostError, HostOptions, HostPool};
pub use crate::inspect::fabric::RdmaFabric;
pub use crate::inspect::facts::{differences, disagreements, explanations, Facts};
pub use crate::inspect::nccl::ImageNccl;
use crate::inspect::{facts, nccl};
/// What `nodes` shows of a node, and how it compares with the definitions and the others.
pub use crate::runtime::image::short_id;

/// What one node said.
#[derive(Debug)]
pub enum NodeReport {
    Facts(Box<Facts>),
    /// Connected, but gathering failed or took over 60 s.
    Failed(String),
    Unreachable(Arc<HostError>),
}

/// Every node of the configuration, by address, in parallel.
pub async fn gather(config: &Config, opts: &HostOptions) -> BTreeMap<String, NodeReport> {
    let names: Vec<String> = config.nodes.keys().cloned().collect();
    let pool = HostPool::connect(config, &names, opts).await;
    let images = facts::images_of(config);
    let mut tasks = crate::tasks::KeyedTasks::new();
    for (name, host) in pool.connected() {
        let host = host.clone();
        let images = images.clone();
        tasks.spawn(name.clone(), async move {
            let gathered = tokio::time::timeout(
                Duration::from_secs(60),
                facts::gather(host.as_ref(), &images),
            )
            .await;
            // Outside the facts' 60 s: each probe has its own bound and removes its container
            // when it ends, which a timeout around it would cut short.
            match gathered {
                Ok(Ok(mut f)) => {
                    let present: Vec<String> = f
                        .images
                        .iter()
                        .filter(|(_, id)| id.is_some())
                        .map(|(image, _)| image.clone())
                        .collect();
                    f.nccl = nccl::read(host.as_ref(), &present).await;
                    Ok(Ok(f))
                }
                other => other,
            }
        });
    }
    let mut results = BTreeMap::new();
    while let Some((name, f)) = tasks.next().await {
        let r = match f {
            Ok(Ok(Ok(f))) => NodeReport::Facts(Box::new(f)),
            Ok(Ok(Err(e))) => NodeReport::Failed(e.to_string()),
            Ok(Err(_)) => NodeReport::Failed("gathering facts took over 60 s".into()),
            Err(panic) => NodeReport::Failed(panic),
        };
        results.insert(name, r);
    }
    for (name, e) in pool.errors() {
        results.insert(name.clone(), NodeReport::Unreachable(e.clone()));
    }
    pool.close().await;
    results
}

//! Drift: the recorded containers of a node judged against what runs there, and the node
//! parity preflight (one image ID and one driver version on every node).

use super::*;

/// The recorded containers of a node against the labelled containers it has. Pure.
pub(super) fn judge(
    node: &str,
    recorded: &[(String, Record<'_, Container>)],
    list: &[bollard::models::ContainerSummary],
    images_now: &std::collections::BTreeMap<String, Option<String>>,
) -> NodeObservations {
    let mut out = std::collections::BTreeMap::new();
    let recorded_ids: HashMap<&str, &str> = recorded
        .iter()
        .filter_map(|(a, r)| Some((a.as_str(), r.facts.container_id.as_deref()?)))
        .collect();
    let by_id: HashMap<&str, &str> = recorded_ids.iter().map(|(a, id)| (*id, *a)).collect();
    let mut found: HashMap<String, &bollard::models::ContainerSummary> = HashMap::new();
    let mut claimed: std::collections::BTreeSet<String> = Default::default();
    for c in list {
        // An imported container started by hand carries no labels: it is the recorded ID's.
        if let Some((a, id)) = unlabelled_claim(c, &recorded_ids) {
            found.insert(a.to_string(), c);
            claimed.insert(id.to_string());
            continue;
        }
        // The recorded ID is the record's, whatever address its label names: a `moved` block
        // re-addressed the record and left the container (and its labels) as they were.
        if let Some(&a) = c.id.as_deref().and_then(|id| by_id.get(id)) {
            found.insert(a.to_string(), c);
            claimed.insert(c.id.clone().unwrap_or_default());
            continue;
        }
        let (Some(a), Some(id)) = (
            c.labels.as_ref().and_then(|l| l.get(LABEL_ADDRESS)),
            c.id.as_ref(),
        ) else {
            continue;
        };
        let claim = match recorded_ids.get(a.as_str()) {
            Some(rid) => *rid == id.as_str(),
            // A state without the id (written by an older sparkform): the first by address.
            None => recorded.iter().any(|(r, _)| r == a) && !found.contains_key(a),
        };
        if claim {
            found.insert(a.clone(), c);
            claimed.insert(id.clone());
        }
    }
    for (addr, r) in recorded {
        let obs = match found.get(addr) {
            None => Drift::Missing(format!(
                "container {} is gone from {node}",
                r.config
                    .as_ref()
                    .map(|d| d.name.as_str())
                    .filter(|n| !n.is_empty())
                    .unwrap_or(addr)
            )),
            Some(c) => {
                let mut notes = Vec::new();
                let running = matches!(
                    c.state,
                    Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                );
                if !running {
                    notes.push(format!(
                        "container {} is {} ({})",
                        summary_name(c),
                        c.state
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "in an unknown state".into()),
                        c.status.clone().unwrap_or_default()
                    ));
                }
                let hash = c.labels.as_ref().and_then(|l| l.get(LABEL_CONFIG_HASH));
                if hash.is_some_and(|h| *h != r.state.config_hash) {
                    notes.push(format!("container {} was created from another configuration than the state records", summary_name(c)));
                }
                notes.extend(image_moved(node, r, c, images_now));
                if notes.is_empty() {
                    Drift::InSync
                } else {
                    Drift::Drifted(notes)
                }
            }
        };
        out.insert(addr.clone(), obs);
    }
    let orphans = list
        .iter()
        .filter_map(|c| {
            let addr = c.labels.as_ref()?.get(LABEL_ADDRESS)?;
            (!claimed.contains(c.id.as_deref().unwrap_or_default())).then(|| Orphan {
                kind: crate::vocabulary::KindId::Container,
                address: addr.clone(),
                node: node.to_string(),
                name: summary_name(c),
                id: c.id.clone().unwrap_or_default(),
                running: c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING),
            })
        })
        .collect();
    (out, orphans)
}

/// The containers of `list` labelled for one of `addresses` under another lineage than
/// `lineage` (or none): one per address and node, the one that is not set aside when there
/// are both. Pure.
pub(super) fn foreign_of(
    node: &str,
    lineage: &str,
    addresses: &[String],
    list: &[bollard::models::ContainerSummary],
) -> Vec<Foreign> {
    let mut out: Vec<Foreign> = Vec::new();
    for c in list {
        let labels = c.labels.as_ref();
        let (Some(address), Some(id)) = (labels.and_then(|l| l.get(LABEL_ADDRESS)), &c.id) else {
            continue;
        };
        let theirs = labels.and_then(|l| l.get(LABEL_LINEAGE));
        if !addresses.contains(address) || theirs.map(String::as_str) == Some(lineage) {
            continue;
        }
        let name = summary_name(c);
        let found = Foreign {
            address: address.clone(),
            node: node.to_string(),
            kind: crate::vocabulary::KindId::Container,
            name: name.clone(),
            id: id.clone(),
            lineage: theirs.cloned(),
        };
        let aside = |n: &str| n.contains("-sparkform-old-");
        match out.iter_mut().find(|f| f.address == *address) {
            Some(f) if aside(&f.name) && !aside(&name) => *f = found,
            Some(_) => {}
            None => out.push(found),
        }
    }
    out
}

pub(super) fn summary_name(c: &bollard::models::ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_else(|| c.id.clone().unwrap_or_default())
}

/// A pull or `docker tag` on the node since the apply: the reference names another image than
/// the one the container was created from, so a new container would run something else.
pub(super) fn image_moved(
    node: &str,
    r: &Record<'_, Container>,
    c: &bollard::models::ContainerSummary,
    images_now: &std::collections::BTreeMap<String, Option<String>>,
) -> Option<String> {
    let image = r.config.as_ref()?.image.as_str();
    let runs = r
        .facts
        .image_id
        .as_deref()
        .filter(|v| !v.is_empty())
        .or(c.image_id.as_deref())?;
    let now = images_now.get(image)?.as_deref()?;
    (now != runs).then(|| {
        format!(
            "image {image} on {node} is now {} (pulled or retagged); the container runs {}",
            crate::runtime::image::short_id(now),
            crate::runtime::image::short_id(runs)
        )
    })
}

/// One preflight before the first changed container of an apply starts: every image reference
/// is the same image ID on every node that runs it, and the nodes run one NVIDIA driver
/// version. A rank on another build or driver fails late and obscurely (NCCL, a version
/// mismatch); here it fails before anything changed. A rollback's container counts as the
/// image it restores by its recorded ID, where its node has that.
pub(super) fn parity_check(config: &Config, changed: &Changed<'_>) -> Option<Check> {
    let containers: Vec<&Resource> = config
        .resources
        .iter()
        .filter(|r| r.kind == crate::vocabulary::KindId::Container)
        .collect();
    let before: Vec<String> = containers
        .iter()
        .filter(|r| changed.is(&r.address))
        .map(|r| r.address.clone())
        .collect();
    if before.is_empty() {
        return None;
    }
    // Every container counts, changed or not: a new rank must match the ranks already running.
    let mut images: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let mut restoring: Restoring = Default::default();
    for r in &containers {
        if let (Some(node), Ok(d)) = (&r.node, r.config.typed::<Desired>()) {
            let restored = changed
                .change(&r.address)
                .and_then(|c| c.restores.as_ref())
                .and_then(|a| crate::kind::facts_of::<Recorded>(a).ok())
                .and_then(|f| f.image_id);
            if let Some(id) = restored {
                restoring.insert((node.clone(), d.image.clone()), id);
            }
            images.entry(node.clone()).or_default().insert(d.image);
        }
    }
    Some(Check {
        address: "containers (node parity)".into(),
        after: Vec::new(),
        covers: Vec::new(),
        before,
        nodes: images.keys().cloned().collect(),
        keeps: Vec::new(),
        run: std::sync::Arc::new(Parity { images, restoring }),
    })
}

/// (node, image reference) → the image ID a rollback starts there by (`Change::restores`).
type Restoring = std::collections::BTreeMap<(String, String), String>;

pub(super) struct Parity {
    /// Node → the image references its containers use.
    images: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    restoring: Restoring,
}

/// What one node said for the parity check.
pub(super) type NodeParity = (
    std::collections::BTreeMap<String, Option<String>>,
    Option<String>,
);

#[async_trait]
impl CheckRun for Parity {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        let mut tasks = crate::tasks::KeyedTasks::new();
        for (node, images) in &self.images {
            let host = pool.get(node)?;
            let images: Vec<String> = images.iter().cloned().collect();
            let restoring: Vec<(String, String)> = images
                .iter()
                .filter_map(|i| {
                    let id = self.restoring.get(&(node.clone(), i.clone()))?;
                    Some((i.clone(), id.clone()))
                })
                .collect();
            tasks.spawn(node.clone(), async move {
                let (mut ids, nvidia) = tokio::join!(
                    crate::runtime::image::image_ids(host.as_ref(), &images),
                    crate::inspect::facts::nvidia(host.as_ref())
                );
                // What the node runs for the reference is the restored image, while it has it.
                for (image, id) in restoring {
                    if ids.get(&image) != Some(&Some(id.clone()))
                        && crate::runtime::image::image(host.as_ref(), &id)
                            .await
                            .is_some()
                    {
                        ids.insert(image, Some(id));
                    }
                }
                Ok::<NodeParity, HostError>((ids, nvidia?.map(|n| n.driver)))
            });
        }
        let mut seen = std::collections::BTreeMap::new();
        while let Some((node, r)) = tasks.next().await {
            let r = r.map_err(|panic| StepError::new(format!("{node}: {panic}")))?;
            seen.insert(node, r?);
        }
        judge_parity(&seen)
    }
}

/// The parity verdict from what every node said. Pure.
pub(super) fn judge_parity(
    seen: &std::collections::BTreeMap<String, NodeParity>,
) -> Result<String, StepError> {
    let mut problems = Vec::new();
    let mut fine = Vec::new();
    let mut by_image: std::collections::BTreeMap<&str, Vec<(&str, &str)>> = Default::default();
    for (node, (ids, _)) in seen {
        for (image, id) in ids {
            // A node without the image loads or pulls it in its own step.
            if let Some(id) = id {
                by_image.entry(image).or_default().push((node, id));
            }
        }
    }
    for (image, on) in &by_image {
        let distinct: std::collections::BTreeSet<&str> = on.iter().map(|(_, id)| *id).collect();
        if distinct.len() > 1 {
            let each: Vec<String> = on
                .iter()
                .map(|(n, id)| format!("{n} has {}", crate::runtime::image::short_id(id)))
                .collect();
            problems.push(format!(
                "image {image} is not the same on every node: {}",
                each.join(", ")
            ));
        } else if let Some(id) = distinct.first() {
            fine.push(format!(
                "{image} is {} on {} node(s)",
                crate::runtime::image::short_id(id),
                on.len()
            ));
        }
    }
    let drivers: Vec<(&str, &str)> = seen
        .iter()
        .filter_map(|(n, (_, d))| Some((n.as_str(), d.as_deref()?)))
        .collect();
    let without: Vec<&str> = seen
        .iter()
        .filter(|(_, (_, d))| d.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    let distinct: std::collections::BTreeSet<&str> = drivers.iter().map(|(_, d)| *d).collect();
    if distinct.len() > 1 || (!drivers.is_empty() && !without.is_empty()) {
        let mut each: Vec<String> = drivers
            .iter()
            .map(|(n, d)| format!("{n} has {d}"))
            .collect();
        each.extend(without.iter().map(|n| format!("{n} has none")));
        problems.push(format!(
            "the NVIDIA driver differs between the nodes: {}",
            each.join(", ")
        ));
    } else if let Some(d) = distinct.first() {
        fine.push(format!("NVIDIA driver {d} everywhere"));
    } else {
        fine.push("no NVIDIA driver on any node: driver parity not checked".into());
    }
    if problems.is_empty() {
        return Ok(fine.join("; "));
    }
    Err(StepError::new(format!("node parity: {}", problems.join("; ")))
        .help("every rank must run the same build on the same driver: load or pull the same image on every node (or pin it by digest, REPO@sha256:…), and install one driver version everywhere; `sparkform nodes` shows what each node has"))
}

/// The recorded containers the lineage filter cannot find (imported ones, without labels), by
/// their recorded IDs. None found when there are none to look for, or the engine refuses.
pub(super) async fn unlabelled_by_id(
    docker: &bollard::Docker,
    recorded: &[(String, Record<'_, Container>)],
    listed: &[bollard::models::ContainerSummary],
) -> Vec<bollard::models::ContainerSummary> {
    let ids: Vec<String> = recorded
        .iter()
        .filter_map(|(_, r)| r.facts.container_id.as_deref())
        .filter(|id| !listed.iter().any(|c| c.id.as_deref() == Some(*id)))
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let mut filters = HashMap::new();
    filters.insert("id".to_string(), ids.clone());
    docker
        .list_containers(Some(q::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.id.as_ref().is_some_and(|id| ids.contains(id)))
        .collect()
}

/// An unlabelled container whose ID the state records: (address, id).
pub(super) fn unlabelled_claim<'a>(
    c: &'a bollard::models::ContainerSummary,
    recorded_ids: &HashMap<&'a str, &'a str>,
) -> Option<(&'a str, &'a str)> {
    if c.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_ADDRESS))
    {
        return None;
    }
    let id = c.id.as_deref()?;
    recorded_ids
        .iter()
        .find(|(_, rid)| **rid == id)
        .map(|(a, _)| (*a, id))
}

// ---- import: a container started by hand, observed with `docker inspect` ----

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(images: &[(&str, Option<&str>)], driver: Option<&str>) -> NodeParity {
        (
            images
                .iter()
                .map(|(i, id)| (i.to_string(), id.map(str::to_string)))
                .collect(),
            driver.map(str::to_string),
        )
    }

    #[test]
    fn parity_refuses_different_image_ids_naming_both() {
        let seen: BTreeMap<String, NodeParity> = [
            (
                "node.a".into(),
                node(&[("vllm:x", Some("sha256:aaaaaaaaaaaaaaaa"))], None),
            ),
            (
                "node.b".into(),
                node(&[("vllm:x", Some("sha256:bbbbbbbbbbbbbbbb"))], None),
            ),
        ]
        .into();
        let e = judge_parity(&seen).unwrap_err();
        assert!(
            e.message.contains("node.a has sha256:aaaaaaaaaaaa"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("node.b has sha256:bbbbbbbbbbbb"),
            "{}",
            e.message
        );
    }

    #[test]
    fn parity_passes_alike_nodes_and_skips_a_missing_image_or_driver() {
        let seen: BTreeMap<String, NodeParity> = [
            (
                "node.a".into(),
                node(&[("vllm:x", Some("sha256:aaaa"))], None),
            ),
            ("node.b".into(), node(&[("vllm:x", None)], None)),
        ]
        .into();
        let ok = judge_parity(&seen).unwrap();
        assert!(ok.contains("no NVIDIA driver on any node"), "{ok}");
    }

    #[test]
    fn parity_refuses_different_drivers() {
        let seen: BTreeMap<String, NodeParity> = [
            ("node.a".into(), node(&[], Some("580.95.05"))),
            ("node.b".into(), node(&[], Some("580.82.07"))),
        ]
        .into();
        let e = judge_parity(&seen).unwrap_err();
        assert!(
            e.message
                .contains("node.a has 580.95.05, node.b has 580.82.07"),
            "{}",
            e.message
        );
        let one_without: BTreeMap<String, NodeParity> = [
            ("node.a".into(), node(&[], Some("580.95.05"))),
            ("node.b".into(), node(&[], None)),
        ]
        .into();
        assert!(judge_parity(&one_without).is_err());
    }

    #[test]
    fn a_retagged_image_is_drift() {
        let r: crate::state::ResourceState = serde_json::from_value(serde_json::json!({
            "kind": "container",
            "node": "node.a",
            "config": { "image": "vllm:x", "name": "rank" },
            "config_hash": "h",
            "attributes": { "image_id": "sha256:aaaaaaaaaaaaaaaa" }
        }))
        .unwrap();
        let r = Record::<Container>::of(&r);
        let c = bollard::models::ContainerSummary::default();
        let same: BTreeMap<String, Option<String>> =
            [("vllm:x".into(), Some("sha256:aaaaaaaaaaaaaaaa".into()))].into();
        assert_eq!(image_moved("node.a", &r, &c, &same), None);
        let moved: BTreeMap<String, Option<String>> =
            [("vllm:x".into(), Some("sha256:cccccccccccccccc".into()))].into();
        let note = image_moved("node.a", &r, &c, &moved).unwrap();
        assert!(note.contains("now sha256:cccccccccccc"), "{note}");
        assert!(note.contains("runs sha256:aaaaaaaaaaaa"), "{note}");
    }
}

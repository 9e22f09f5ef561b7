//! A container on the machine: bollard over the node's forwarded Docker socket; observed by
//! the labels sparkform puts on it. Here the `Machine` steps (apply, undo, finalize, restart,
//! stop, observe, import); beside them the Docker plumbing (`docker`), readiness (`ready`),
//! set-aside and restore (`aside`), drift and node parity (`drift`) and import (`import`).
//! The files share one namespace (each `use super::*`), as when they were one file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters as q;
use futures_util::StreamExt;

use super::{
    Container, Desired, PhaseSecs, PhasesByCache, ReadyCheck, ReadyKind, Recorded, LABEL_ADDRESS,
    LABEL_CONFIG_HASH, LABEL_LINEAGE,
};
use crate::config::{Config, Resource};
use crate::hosts::{Host, HostError, HostPool};
use crate::kind::DesiredConfig;
use crate::kinds::machine::{
    Backoff, Changed, Check, CheckRun, Done, GatePhase, HealthWindow, Machine, NodeObservations,
    ReadCx, ReadError, ReadMode, Record, Restore, Seen, Step, StepCx, StepError,
};
use crate::plan::{Action, Drift, Foreign, Orphan};
use crate::runtime::image;

mod aside;
mod cache;
mod docker;
mod drift;
mod health;
mod import;
mod ipc;
mod logs;
mod memory;
mod ready;
mod status;

use aside::*;
use docker::*;
use drift::*;
use ready::*;

use crate::runtime::exec::{exec_in, log_tail, log_tail_since};
pub use docker::create_body;
pub use import::{import_container, imported_config, NOTE_UNLABELLED};

pub struct ContainerMachine;
pub static MACHINE: ContainerMachine = ContainerMachine;

/// What a container's step undoes.
#[derive(Debug, Clone, Default)]
pub enum Undo {
    #[default]
    Nothing,
    /// A delete set `previous` aside (`aside`: its name while aside); it goes back as `name`.
    Restore {
        previous: String,
        name: String,
        aside: String,
    },
    /// An update changed the restart policy of `container` from `previous_restart`.
    RestartPolicy {
        container: String,
        previous_restart: String,
    },
    /// A create or replace started `created`; `previous`, set aside, runs again as `name`.
    Remove {
        created: String,
        previous: Option<String>,
        name: String,
    },
}

impl Undo {
    /// The container set aside until the apply succeeds, which `finalize` removes.
    fn set_aside(&self) -> Option<&str> {
        match self {
            Undo::Restore { previous, .. } => Some(previous),
            Undo::Remove { previous, .. } => previous.as_deref(),
            _ => None,
        }
    }
}

type Cx<'a, 'b> = &'a Step<'b, Container>;

fn name_of(cx: Cx<'_, '_>) -> String {
    let named = |d: &Desired| Some(d.name.clone()).filter(|n| !n.is_empty());
    cx.desired
        .as_ref()
        .and_then(named)
        .or_else(|| cx.recorded_config().and_then(named))
        .or_else(|| cx.change.orphan.as_ref().map(|o| o.name.clone()))
        .unwrap_or_else(|| cx.address.replace(['[', ']', '"'], "_"))
}

/// How long a container may take to stop: the `stop_timeout` it was created with (else the
/// desired one), else Docker's 10 s.
fn stop_secs(cx: Cx<'_, '_>) -> i32 {
    cx.recorded_config()
        .filter(|d| d.stop_timeout.is_some())
        .or(cx.desired.as_ref())
        .map_or(super::desired::DEFAULT_STOP_SECS, |d| d.stop_secs())
}

/// The container the state (or refresh) knows for this resource.
fn recorded_id(cx: Cx<'_, '_>) -> Option<String> {
    cx.change
        .orphan
        .as_ref()
        .map(|o| o.id.clone())
        .or_else(|| cx.recorded_facts()?.container_id.clone())
}

/// The error of a create whose name another container has: it names the `import` block that
/// adopts that container instead (what a lost state calls for), and the other ways out.
fn name_taken(
    address: &str,
    node: &str,
    name: &str,
    labels: &HashMap<String, String>,
) -> StepError {
    let whose = match (labels.get(LABEL_ADDRESS), labels.get(LABEL_LINEAGE)) {
        (Some(a), Some(l)) if a == address => format!(
            ": it carries sparkform's labels for {address} under another state's lineage ({l}), so the state that created it was lost or replaced"
        ),
        (Some(a), _) => format!(": it carries sparkform's labels for {a}"),
        _ => String::new(),
    };
    let short = node.strip_prefix("node.").unwrap_or(node);
    let block = crate::plan::import_block(address, &format!("{short}:{name}"));
    StepError::new(format!(
        "a container named {name} already exists on {node} and this state did not create it{whose}"
    ))
    .help(format!(
        "to adopt it as {address}, restarting nothing, add this `import` block to the definitions and apply again (`sparkform plan -generate-import-out=FILE` writes one for every such container):\n{block}or remove or rename it, or give this container another `name`"
    ))
}

/// What a new container's start found: its ID, its image's ID and digest, the node's cache
/// folder it mounts (`cache`), and the seconds each `progress` phase took.
struct Started {
    id: String,
    image_id: String,
    image_digest: String,
    cache_folder: Option<String>,
    /// Whether the cache folder held anything when the container started.
    cache_warm: bool,
    phases: std::collections::BTreeMap<String, f64>,
    /// From `docker start` to the ready checks' pass.
    start_secs: f64,
}

/// What a new container needs on its node that does not need the previous one stopped: its
/// image (loaded or pulled), its cache folder keyed by the image's ID and whether that holds
/// anything. Made while the previous container still serves, so a replacement's outage is the
/// new container's own start.
struct Prepared {
    image: ImageToRun,
    cache_folder: Option<String>,
    cache_warm: bool,
}

/// [`Prepared`] for `desired` (with `restoring`, a rollback's recorded image ID: that image).
async fn prepare_new(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &Desired,
    restoring: Option<&str>,
) -> Result<Prepared, StepError> {
    let node = cx.change.node.clone().unwrap_or_default();
    let image = ensure_image(cx, docker, desired, restoring).await?;
    // The cache folder of this image on the node (Docker creates it when missing): a new image
    // ID is a new folder, so nothing another build compiled is ever loaded.
    let cache_folder = match &desired.cache {
        Some(c) => Some(c.folder(&image.id).ok_or_else(|| {
            StepError::new(format!(
                "{node}: image {} has no ID to key its cache folder by ({:?})",
                desired.image, image.id
            ))
        })?),
        None => None,
    };
    let cache_warm = match &cache_folder {
        Some(folder) => cache::holds_anything(cx.host()?.as_ref(), folder).await,
        None => false,
    };
    Ok(Prepared {
        image,
        cache_folder,
        cache_warm,
    })
}

/// Create, start and wait for a new container from what [`prepare_new`] made ready. On failure
/// nothing of it is left.
async fn start_new(
    cx: &StepCx<'_>,
    docker: &bollard::Docker,
    desired: &Desired,
    name: &str,
    prepared: Prepared,
) -> Result<Started, StepError> {
    let node = cx.change.node.clone().unwrap_or_default();
    let Prepared {
        image,
        cache_folder,
        cache_warm,
    } = prepared;
    // A container with this name from an earlier, interrupted run of this deployment is ours
    // to replace; anyone else's is not.
    if let Ok(existing) = docker
        .inspect_container(name, None::<q::InspectContainerOptions>)
        .await
    {
        let labels = existing.config.and_then(|c| c.labels).unwrap_or_default();
        if labels.get(LABEL_LINEAGE).map(String::as_str) == Some(cx.lineage) {
            remove(docker, existing.id.as_deref().unwrap_or(name)).await?;
        } else {
            return Err(name_taken(cx.address, &node, name, &labels));
        }
    }
    // The previous container (replaced, or removed above) has stopped: its memory may still be
    // on its way back.
    memory::ensure(cx, name, &desired.memory).await?;
    let hash = cx.change.after_hash.clone().unwrap_or_default();
    let mut body = create_body(desired, cx.lineage, cx.address, &hash);
    body.image = Some(image.create_from.clone());
    if let (Some(folder), Some(c)) = (&cache_folder, &desired.cache) {
        if let Some(hc) = body.host_config.as_mut() {
            hc.binds
                .get_or_insert_with(Vec::new)
                .push(format!("{folder}:{}", c.path));
        }
    }
    cx.progress(format!("creating {name} on {node}"), None, None);
    let created = docker
        .create_container(
            Some(q::CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|e| docker_err(&format!("{node}: cannot create container {name}"), e))?;
    let id = created.id;
    let starting = Instant::now();
    if let Err(e) = docker
        .start_container(&id, None::<q::StartContainerOptions>)
        .await
    {
        let (_, logs) = evidence(docker, &id).await;
        let _ = remove(docker, &id).await;
        return Err(docker_err(&format!("{node}: cannot start container {name}"), e).details(logs));
    }
    let phases = match wait_ready(cx, docker, &id, name, &desired.ready, 0).await {
        Ok(p) => p,
        Err(e) => {
            let _ = remove(docker, &id).await;
            return Err(e);
        }
    };
    Ok(Started {
        id,
        image_id: image.id,
        image_digest: image.digest,
        cache_folder,
        cache_warm,
        phases,
        start_secs: (starting.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    })
}

/// Wait at the process group's start gate, when the apply starts several members of it.
async fn pass_gate(cx: Cx<'_, '_>, phase: GatePhase) -> Result<(), StepError> {
    let Some(gate) = cx.gate else {
        return Ok(());
    };
    if phase == GatePhase::Stopped {
        cx.progress(
            format!(
                "waiting for the {} members of {} to stop their previous containers",
                gate.members(),
                gate.group()
            ),
            None,
            None,
        );
    }
    gate.arrive(phase, cx.cancel).await.map_err(StepError::new)
}

/// A create or replace: what the new container needs made ready while the previous one still
/// runs, the previous one set aside, then the new one started (each phase passing the process
/// group's gate, when there is one); on failure the previous one runs again.
async fn create_or_replace(
    cx: Cx<'_, '_>,
    docker: &bollard::Docker,
    name: String,
    old: Option<String>,
) -> Result<Done<ContainerMachine>, StepError> {
    let desired = cx.desired()?;
    // A rollback starts the image the generation ran, by its recorded ID.
    let restoring = cx.restored_facts().and_then(|r| r.image_id);
    let prepared = prepare_new(cx, docker, desired, restoring.as_deref()).await?;
    pass_gate(cx, GatePhase::Prepared).await?;
    let mut aside = None;
    if let Some(old) = &old {
        if docker
            .inspect_container(old, None::<q::InspectContainerOptions>)
            .await
            .is_ok()
        {
            cx.progress(format!("stopping the previous {name}"), None, None);
            aside = Some(set_aside(docker, old, &name, stop_secs(cx)).await?);
        }
    }
    // Every member of its process group has stopped its previous container before
    // any starts a new one: a new rank never joins an old one.
    let started = match pass_gate(cx, GatePhase::Stopped).await {
        Ok(()) => start_new(cx, docker, desired, &name, prepared).await,
        Err(e) => Err(e),
    };
    match started {
        Ok(started) => {
            let id = started.id;
            let cached = started.cache_folder.is_some();
            let from_log = ready::record_from_log(cx, docker, &id, &desired.ready, 0).await;
            let recorded = Recorded {
                container_id: Some(id.clone()),
                image_id: Some(started.image_id),
                image_digest: Some(started.image_digest),
                cache_warm: cached.then_some(started.cache_warm),
                phase_secs_by_cache: cached.then(|| {
                    cache::phases_by_cache(cx.recorded_facts(), started.cache_warm, &started.phases)
                }),
                cache_folder: started.cache_folder,
                phase_secs: Some(started.phases).filter(|p| !p.is_empty()),
                from_log: Some(from_log).filter(|f| !f.is_empty()),
                start_secs: Some(started.start_secs),
            };
            Ok(Done {
                recorded,
                undo: Undo::Remove {
                    created: id.clone(),
                    previous: if aside.is_some() { old.clone() } else { None },
                    name: name.clone(),
                },
                summary: format!(
                    "{name} running ({})",
                    id.chars().take(12).collect::<String>()
                ),
            })
        }
        Err(e) => {
            if let (Some(old), Some(_)) = (&old, &aside) {
                if let Err(r) = restore(docker, old, &name).await {
                    return Err(StepError::new(format!(
                        "{}; and bringing the previous container back failed: {}",
                        e.message, r.message
                    ))
                    .details(e.details));
                }
            }
            Err(e)
        }
    }
}

#[async_trait]
impl Machine for ContainerMachine {
    type Kind = Container;
    type Undo = Undo;

    async fn apply(&self, cx: Cx<'_, '_>, action: Action) -> Result<Done<Self>, StepError> {
        let host = cx.host()?;
        let docker = host.docker().await?;
        let name = name_of(cx);
        let old = recorded_id(cx);
        match action {
            Action::Delete => {
                let Some(old) = old else {
                    return Ok(Done::summary(""));
                };
                if docker
                    .inspect_container(&old, None::<q::InspectContainerOptions>)
                    .await
                    .is_err()
                {
                    return Ok(Done::summary(format!("{name} was already gone")));
                }
                // `docker stop` waits up to the stop timeout for the process to end.
                cx.progress(
                    format!("stopping {name}"),
                    None,
                    Some(stop_secs(cx).max(0) as u64),
                );
                let aside = set_aside(&docker, &old, &name, stop_secs(cx)).await?;
                // An untracked one goes back under its own name on rollback: the resource's
                // name is the tracked container's.
                let back = cx
                    .change
                    .orphan
                    .as_ref()
                    .map_or(name.clone(), |o| o.name.clone());
                // What it held of a unified-memory node's memory is back (or on its way).
                let needs = cx
                    .recorded_config()
                    .map(|d| d.memory.clone())
                    .unwrap_or_default();
                let freed = memory::free_now(cx, &needs).await;
                Ok(Done {
                    recorded: Recorded::default(),
                    undo: Undo::Restore {
                        previous: old,
                        name: back,
                        aside,
                    },
                    summary: format!(
                        "stopped {name}; removed once every step has succeeded{freed}"
                    ),
                })
            }
            Action::Update => {
                let desired = cx.desired()?;
                let old = old.unwrap_or_else(|| name.clone());
                let previous_restart = cx
                    .recorded_config()
                    .map(|d| d.restart_policy().to_string())
                    .unwrap_or_else(|| Desired::default().restart_policy().to_string());
                let restart = desired.restart_policy();
                if restart != previous_restart {
                    docker
                        .update_container(
                            &old,
                            bollard::models::ContainerUpdateBody {
                                restart_policy: Some(restart_policy(restart)),
                                ..Default::default()
                            },
                        )
                        .await
                        .map_err(|e| {
                            docker_err(&format!("cannot update the restart policy of {name}"), e)
                        })?;
                }
                Ok(Done {
                    recorded: cx.recorded_facts().cloned().unwrap_or_default(),
                    undo: Undo::RestartPolicy {
                        container: old,
                        previous_restart,
                    },
                    summary: format!("updated {name} in place"),
                })
            }
            _ => create_or_replace(cx, &docker, name, old).await,
        }
    }

    async fn undo(
        &self,
        cx: Cx<'_, '_>,
        _action: Action,
        done: &Done<Self>,
    ) -> Result<String, StepError> {
        let host = cx.host()?;
        let docker = host.docker().await?;
        let (created, previous, name) = match &done.undo {
            Undo::Nothing => return Ok(format!("removed {}", name_of(cx))),
            Undo::RestartPolicy {
                container,
                previous_restart,
            } => {
                docker
                    .update_container(
                        container,
                        bollard::models::ContainerUpdateBody {
                            restart_policy: Some(restart_policy(previous_restart)),
                            ..Default::default()
                        },
                    )
                    .await
                    .map_err(|e| docker_err("cannot restore the restart policy", e))?;
                return Ok(format!("restored the restart policy of {}", name_of(cx)));
            }
            Undo::Restore { previous, name, .. } => (None, Some(previous), name.clone()),
            Undo::Remove {
                created,
                previous,
                name,
            } => (Some(created), previous.as_ref(), name.clone()),
        };
        {
            {
                if let Some(created) = created {
                    remove(&docker, created).await?;
                }
                if let Some(prev) = previous {
                    // An untracked copy gives way to the tracked container at its address:
                    // it stays set aside and stopped, and the next apply removes it.
                    if cx.change.orphan.is_some() {
                        if let Some(holder) = name_holder(&docker, prev, &name).await {
                            return Ok(format!(
                                "left the untracked {} set aside and stopped: {} holds the name {name}; the next apply removes it",
                                prev.chars().take(12).collect::<String>(),
                                holder.chars().take(12).collect::<String>()
                            ));
                        }
                    }
                    // The new one held the node's memory until it was removed: the previous
                    // engine starts only once its memory is back, as a new one would.
                    if let Some(d) = cx.recorded_config() {
                        memory::ensure(cx, &name, &d.memory).await?;
                    }
                    restore(&docker, prev, &name).await?;
                    return Ok(format!(
                        "removed the new {name}, the previous one runs again"
                    ));
                }
                Ok(format!("removed {name}"))
            }
        }
    }

    async fn finalize(
        &self,
        cx: Cx<'_, '_>,
        action: Action,
        done: &Done<Self>,
    ) -> Result<(), StepError> {
        if let Some(prev) = done.undo.set_aside() {
            let host = cx.host()?;
            let docker = host.docker().await?;
            remove(&docker, prev).await?;
        }
        // `destroy -purge-caches`: the folder goes only once the container is gone.
        if let (Action::Delete, true, Some(recorded)) =
            (action, cx.change.purge, cx.recorded_facts())
        {
            let host = cx.host()?;
            let docker = host.docker().await?;
            if let Some(done) = cache::purge(cx, &docker, recorded).await? {
                cx.progress(done, None, None);
            }
        }
        Ok(())
    }

    async fn restore(&self, cx: Cx<'_, '_>, to: Restore) -> Result<String, StepError> {
        match to {
            Restore::Running => restart(cx).await,
            Restore::Stopped => stop(cx).await,
        }
    }

    async fn health(
        &self,
        address: &str,
        recorded: &Record<'_, Container>,
        pool: &HostPool,
        window: HealthWindow,
    ) -> Option<crate::kinds::machine::Health> {
        match window {
            HealthWindow::Now => {
                down(recorded, pool)
                    .await
                    .map(|cause| crate::kinds::machine::Health {
                        failure: Some(crate::kinds::machine::HealthFailure {
                            cause,
                            restartable: true,
                        }),
                        ..Default::default()
                    })
            }
            HealthWindow::SinceLastCheck {
                restarts_before,
                log_since,
            } => {
                let id = recorded.facts.container_id.as_deref()?;
                recorded.config.as_ref()?;
                let health =
                    health::health(address, recorded, id, pool, restarts_before, log_since);
                Some(health.await)
            }
        }
    }

    /// The container the state records for an address is the one with the recorded id; others
    /// with the same address (set aside by an interrupted apply) are untracked.
    async fn observe(
        &self,
        host: &dyn Host,
        lineage: &str,
        recorded: &[(String, Record<'_, Container>)],
        _mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        let node = host.node();
        let docker = host.docker().await?;
        let mut filters = HashMap::new();
        filters.insert(
            "label".to_string(),
            vec![format!("{LABEL_LINEAGE}={lineage}")],
        );
        let list = docker
            .list_containers(Some(q::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| HostError::Docker {
                node: node.to_string(),
                message: format!("cannot list containers: {e}"),
                help: None,
            })?;
        let mut list = list;
        list.extend(unlabelled_by_id(&docker, recorded, &list).await);
        let images: Vec<String> = recorded
            .iter()
            .filter_map(|(_, r)| r.config.as_ref().map(|d| d.image.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let now = image::image_ids(host, &images).await;
        Ok(judge(node, recorded, &list, &now))
    }

    async fn read_log(&self, host: std::sync::Arc<dyn Host>, read: crate::kinds::machine::LogRead) {
        match host.docker().await {
            Ok(docker) => logs::LogSource(read).run(&docker).await,
            Err(e) => read.end(Some(e.to_string())).await,
        }
    }

    /// Each recorded container inspected by its recorded ID (else its name).
    async fn look(
        &self,
        host: &dyn Host,
        _lineage: &str,
        recorded: &[(String, Record<'_, Container>)],
    ) -> BTreeMap<String, Seen> {
        let docker = host.docker().await.ok();
        let mut out = BTreeMap::new();
        for (a, r) in recorded {
            let id = r
                .facts
                .container_id
                .clone()
                .or_else(|| r.config.as_ref().map(|d| d.name.clone()));
            let seen = match (&docker, &id) {
                (Some(d), Some(id)) => status::inspect(d, id).await,
                (None, _) => Seen::Unknown,
                (_, None) => Seen::Missing {
                    reason: "the state records no container".into(),
                },
            };
            out.insert(a.clone(), seen);
        }
        out
    }

    async fn find_foreign(
        &self,
        host: &dyn Host,
        lineage: &str,
        addresses: &[String],
    ) -> Result<Vec<Foreign>, HostError> {
        let node = host.node();
        let docker = host.docker().await?;
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![LABEL_ADDRESS.to_string()]);
        let list = docker
            .list_containers(Some(q::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| HostError::Docker {
                node: node.to_string(),
                message: format!("cannot list containers: {e}"),
                help: None,
            })?;
        Ok(foreign_of(node, lineage, addresses, &list))
    }

    fn read_nodes(&self, config: &Config) -> Vec<String> {
        let mut nodes = ipc::ipc_nodes(config);
        nodes.extend(cache::cache_nodes(config));
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// systemd-logind's settings on the nodes of containers it can break
    /// ([`ipc::judge_remove_ipc`]): one command a node, and none without such a container.
    async fn read(&self, cx: &ReadCx<'_>) -> Result<crate::config::Readings, ReadError> {
        let mut out = crate::config::Readings::default();
        if !cx.mode.looks() {
            return Ok(out);
        }
        let nodes = ipc::ipc_nodes(cx.config);
        let (logind, caches) = tokio::join!(
            crate::inspect::fabric::read_each(cx.pool, &nodes),
            cache::read_caches(cx.config, cx.pool)
        );
        out.kinds = caches;
        let (errors, warnings) = ipc::judge_remove_ipc(cx.config, &logind);
        if !errors.is_empty() {
            return Err(ReadError::Config(crate::diag::Diagnostics(errors)));
        }
        out.warnings = warnings;
        Ok(out)
    }

    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check> {
        parity_check(config, changed).into_iter().collect()
    }

    async fn import(
        &self,
        host: &dyn Host,
        address: &str,
        object: &str,
        desired: Option<&Desired>,
    ) -> Result<crate::kinds::machine::Imported, StepError> {
        import_container(host, address, object, desired).await
    }
}

/// Stop container `id` within the grace its configuration gives it (`stop_secs`); one already
/// stopped is no error.
async fn stop_within_its_grace(
    cx: Cx<'_, '_>,
    docker: &bollard::Docker,
    id: &str,
) -> Result<(), bollard::errors::Error> {
    let stopped = docker
        .stop_container(
            id,
            Some(q::StopContainerOptions {
                t: Some(stop_secs(cx)),
                ..Default::default()
            }),
        )
        .await;
    already_so(stopped)
}

/// Start again, from scratch, the container the state recorded, and wait until it is ready.
async fn restart(cx: Cx<'_, '_>) -> Result<String, StepError> {
    let host = cx.host()?;
    let docker = host.docker().await?;
    let name = name_of(cx);
    let id = recorded_id(cx)
        .ok_or_else(|| StepError::new(format!("{name}: no container recorded to restart")))?;
    cx.progress(format!("restarting {name}"), None, None);
    let stopped = stop_within_its_grace(cx, &docker, &id).await;
    stopped.map_err(|e| docker_err(&format!("cannot stop {name}"), e))?;
    // Its own memory (a unified-memory node) comes back only after the engine released it.
    let recorded_config = cx.recorded_config();
    if let Some(d) = recorded_config {
        memory::ensure(cx, &name, &d.memory).await?;
    }
    // What the previous run logged (a peer that went away) is no verdict on this one: it
    // has stopped, so every line from the next whole second on (Docker's `since` counts in
    // seconds, and the previous run may have logged in this one) is the new run's, which
    // starts only then.
    let now = chrono::Utc::now();
    let to_next = 1_000_000_000u64.saturating_sub(u64::from(now.timestamp_subsec_nanos()));
    tokio::time::sleep(std::time::Duration::from_nanos(to_next)).await;
    let since = i32::try_from(now.timestamp() + 1).unwrap_or(0);
    let started = docker
        .start_container(&id, None::<q::StartContainerOptions>)
        .await;
    already_so(started).map_err(|e| docker_err(&format!("cannot start {name}"), e))?;
    // Ready as it was recorded: the checks of the configuration it runs, not the new one.
    let checks = recorded_config.map(|d| d.ready.clone()).unwrap_or_default();
    wait_ready(cx, &docker, &id, &name, &checks, since).await?;
    Ok(format!(
        "restarted {name} ({}): its process group starts again as one",
        id.chars().take(12).collect::<String>()
    ))
}

/// Stop the container the state recorded.
async fn stop(cx: Cx<'_, '_>) -> Result<String, StepError> {
    let host = cx.host()?;
    let docker = host.docker().await?;
    let name = name_of(cx);
    let Some(id) = recorded_id(cx) else {
        return Ok(String::new());
    };
    let stopped = stop_within_its_grace(cx, &docker, &id).await;
    match stopped {
        Ok(())
        | Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(format!("stopped {name}")),
        Err(e) => Err(docker_err(&format!("cannot stop {name}"), e)),
    }
}

/// Looked up by the ID the state records (else its name) on its node: gone, exited (with
/// its exit code), restarting, paused. A node the pool could not reach is down too; an
/// engine that does not answer now tells nothing.
async fn down(recorded: &Record<'_, Container>, pool: &HostPool) -> Option<String> {
    let d = recorded.config.as_ref()?;
    let node = recorded
        .state
        .node
        .clone()
        .unwrap_or_else(|| d.node.clone());
    let id = recorded.facts.container_id.as_deref().unwrap_or(&d.name);
    if id.is_empty() {
        return None;
    }
    let host = match pool.get(&node) {
        Ok(h) => h,
        Err(e) => return Some(format!("container {} on {node}: {e}", d.name)),
    };
    let docker = host.docker().await.ok()?;
    let seen = liveness(&docker, id).await.ok()?;
    let why = not_serving(&seen, &d.name, &node)?;
    // What it died of, where its log says so in a line its ready checks know as fatal.
    let patterns: BTreeMap<String, String> = d
        .ready
        .iter()
        .filter_map(|r| r.fail_on_log.clone())
        .flatten()
        .collect();
    match fail_on_log(&docker, id, &d.name, &patterns, 0).await {
        Err(e) => Some(match &e.help {
            Some(fix) => format!("{why}; {}: {fix}", e.message),
            None => format!("{why}; {}", e.message),
        }),
        Ok(()) => Some(why),
    }
}

//! Refresh as an operation: which nodes to look at, what they show, progress as an event.

use crate::config::Config;
use crate::events::{emit, Event, Sender};
use crate::hosts::{HostOptions, HostPool};
use crate::kinds::machine::ReadMode;
use crate::observe::{connect_and_observe, nodes_to_observe};
use crate::plan::Observations;
use crate::state::State;

use super::OpError;

/// Observe the machines the state and the configuration put resources on. The connections are
/// handed back (`None` when no node needed looking at) so an apply can reuse them; on error
/// they are closed. `mode` says how far the kinds look (`-refresh=deep`).
pub async fn refresh(
    config: &Config,
    state: &State,
    mode: ReadMode,
    hosts: &HostOptions,
    events: &Sender,
) -> Result<(Observations, Option<HostPool>), OpError> {
    let nodes = nodes_to_observe(config, state);
    if nodes.is_empty() {
        return Ok((Observations::default(), None));
    }
    emit(events, Event::Refreshing { nodes: nodes.len() });
    let (pool, observed) = connect_and_observe(config, state, &nodes, hosts, mode).await;
    match observed {
        Ok(o) => Ok((o, Some(pool))),
        Err(errors) => {
            pool.close().await;
            Err(OpError::Refresh(errors))
        }
    }
}

/// Observe the machines the state and the configuration put resources on, on `pool` (the
/// connections `ops::prepare` opened; the nodes it lacks are connected into it): nodes that
/// cannot be reached are an error, the pool stays the caller's.
pub async fn refresh_on(
    config: &Config,
    state: &State,
    mode: ReadMode,
    pool: &mut Option<HostPool>,
    hosts: &HostOptions,
) -> Result<Observations, OpError> {
    let nodes = nodes_to_observe(config, state);
    if nodes.is_empty() {
        return Ok(Observations::default());
    }
    let pool = match pool {
        Some(p) => {
            p.connect_more(config, &nodes, hosts).await;
            p
        }
        None => pool.insert(HostPool::connect(config, &nodes, hosts).await),
    };
    let mut connected = Vec::new();
    let mut unreachable = Vec::new();
    for node in &nodes {
        match pool.get(node) {
            Ok(h) => connected.push((node.clone(), h)),
            Err(e) => unreachable.push(e),
        }
    }
    match crate::observe::observe_hosts_for(config, state, connected, mode).await {
        Ok(o) if unreachable.is_empty() => Ok(o),
        Ok(_) => Err(OpError::Refresh(unreachable)),
        Err(mut errors) => {
            errors.extend(unreachable);
            Err(OpError::Refresh(errors))
        }
    }
}

/// No state at all: look on the nodes of the definitions' containers, as far as they answer,
/// for what a lost state left running (`refresh::find_foreign_hosts`).
pub async fn foreign_on(
    config: &Config,
    pool: &mut Option<HostPool>,
    hosts: &HostOptions,
) -> Observations {
    let nodes = nodes_to_observe(config, &State::new());
    if nodes.is_empty() {
        return Observations::default();
    }
    let pool = match pool {
        Some(p) => {
            p.connect_more(config, &nodes, hosts).await;
            p
        }
        None => pool.insert(HostPool::connect(config, &nodes, hosts).await),
    };
    let connected = nodes
        .iter()
        .filter_map(|n| Some((n.clone(), pool.get(n).ok()?)))
        .collect();
    Observations {
        foreign: crate::observe::find_foreign_hosts(config, connected).await,
        ..Observations::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::fake::{FakeHost, FakeWorld};
    use crate::fake_docker::{FakeDocker, Fault};
    use crate::hosts::Host;
    use crate::kinds::machine::ReadMode;
    use crate::state::{ResourceState, State};
    use crate::vocabulary::KindId;

    const COMMIT: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    /// A state recording the weights of `model.m` on node `a`.
    fn state() -> State {
        let mut state = State::new();
        state.resources.insert(
            "model.m[\"a\"]".into(),
            ResourceState {
                kind: KindId::Model,
                node: Some("node.a".into()),
                config_hash: String::new(),
                config: serde_json::json!({
                    "block": "model.m", "repo": "org/name", "revision": "main",
                    "commit": COMMIT, "cache": "/data/hf", "image": "img:1",
                    "node_name": "a", "role": "download", "download_node": "node.a",
                })
                .into(),
                attributes: Default::default(),
                depends_on: Vec::new(),
                last_apply_secs: None,
                schema_version: 1,
            },
        );
        state
    }

    type Hosts = Vec<(String, Arc<dyn Host>)>;

    /// A node whose engine answers the model kind's observation with a complete copy.
    fn node() -> (Arc<FakeDocker>, Hosts) {
        let docker = Arc::new(FakeDocker::start().unwrap());
        docker.fault(
            "sparkform-model.m-a-observe",
            Fault::ExitsAfterStart(
                0,
                vec![r#"{"event": "result", "recorded": true, "complete": true, "missing": [], "differ": [], "present": []}"#.into()],
            ),
        );
        let world = FakeWorld::new();
        let fake = FakeHost::new("node.a", &world).docker_engine(docker.clone());
        // The one command that lists the node's copies (none here).
        fake.on(
            &["sh", "-c", crate::kinds::model::machine::observe::SCRIPT],
            crate::fake::Answer::Exit(0, String::new(), String::new()),
        );
        let host: Arc<dyn Host> = Arc::new(fake);
        (docker, vec![("node.a".to_string(), host)])
    }

    /// The arguments transfer.py's observation ran with on `docker`, if it ran there.
    fn observe_args(docker: &FakeDocker) -> Option<Vec<String>> {
        let created = docker.created();
        let (_, body) = created
            .iter()
            .find(|(name, _)| name.ends_with("-observe"))?;
        body["Entrypoint"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(body["Cmd"].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect::<Vec<_>>()
            .into()
    }

    #[tokio::test]
    async fn a_deep_refresh_reaches_the_kinds_and_a_normal_one_beside_it_stays_shallow() {
        let state = state();
        let (deep_docker, deep_hosts) = node();
        let (plain_docker, plain_hosts) = node();
        // Both in one process at once: the mode is each operation's, nothing global.
        let (deep, plain) = tokio::join!(
            crate::observe::observe_hosts_as(&state, deep_hosts, ReadMode::Deep),
            crate::observe::observe_hosts_as(&state, plain_hosts, ReadMode::Normal),
        );
        assert!(deep.is_ok() && plain.is_ok(), "{deep:?} {plain:?}");
        // Deep rehashes in transfer.py's container; normal reads the listing alone.
        let deep_args = observe_args(&deep_docker).expect("a deep observation ran");
        assert!(deep_args.iter().any(|a| a == "--deep"), "{deep_args:?}");
        assert_eq!(
            observe_args(&plain_docker),
            None,
            "a normal refresh ran a container"
        );
    }
}

/// What `-refresh-only` found: how the machines differ from the state.
#[derive(Debug, Default)]
pub struct RefreshReport {
    /// Recorded resources whose object is gone from its machine, with why.
    pub gone: Vec<(String, String)>,
    /// Recorded resources whose object is there but not as recorded, with how.
    pub drifted: Vec<(String, Vec<String>)>,
    /// Objects with the deployment's labels that the state does not record.
    pub untracked: Vec<crate::plan::Orphan>,
    /// Whether the state was written (`apply -refresh-only`, approved): the records of what is
    /// gone dropped.
    pub written: bool,
}

impl RefreshReport {
    pub fn differs(&self) -> bool {
        !self.gone.is_empty() || !self.drifted.is_empty() || !self.untracked.is_empty()
    }
}

/// `plan -refresh-only` (`approve` is `None`) and `apply -refresh-only`: look at the machines
/// and say how they differ from the state. With `approve`, under the state lock, and when it
/// approves what it is shown, the records of objects that are gone are dropped, so the state
/// says what exists. Nothing on the machines changes. A drifted object keeps its record: the
/// definitions, not the machine, say what it should be, and the next plan puts it back.
pub async fn refresh_only(
    ws: &crate::workspace::Workspace,
    evaluated: super::definitions::Evaluated,
    hosts: &HostOptions,
    approve: Option<&(dyn Fn(&RefreshReport) -> bool + Sync)>,
    events: &Sender,
) -> Result<RefreshReport, OpError> {
    let store = ws.store();
    let _lock = match approve {
        Some(_) => Some(store.lock("apply -refresh-only")?),
        None => None,
    };
    let Some(mut state) = store.load()? else {
        return Ok(RefreshReport::default());
    };
    // The definitions only say how to reach the nodes: nothing is read at plan time.
    let defs = evaluated.pin(super::definitions::Pins::Unresolved)?;
    let (observed, pool) = refresh(&defs.config, &state, ReadMode::Normal, hosts, events).await?;
    if let Some(p) = pool {
        p.close().await;
    }
    let mut report = RefreshReport {
        untracked: observed.orphans,
        ..RefreshReport::default()
    };
    for (address, drift) in observed.resources {
        match drift {
            crate::plan::Drift::InSync => {}
            crate::plan::Drift::Missing(why) => report.gone.push((address, why)),
            crate::plan::Drift::Drifted(how) => report.drifted.push((address, how)),
        }
    }
    if let Some(approve) = approve {
        if !report.gone.is_empty() && approve(&report) {
            for (address, _) in &report.gone {
                state.resources.remove(address);
            }
            store.write(&mut state)?;
            report.written = true;
        }
    }
    Ok(report)
}

//! The start gate of a process group: the members of one group (vLLM's ranks) that an apply
//! creates or replaces start their new containers together, once every member has what it
//! needs on its node (its image, its cache folder) and every previous member has stopped.
//!
//! Why two phases: nothing of the old group is stopped until every member could start (an image
//! that does not load on one node stops nothing anywhere), and no new member starts while an old
//! one still runs (a new headless rank never joins the old rank 0). Ranks whose launcher waits
//! for its master itself (vLLM's headless ranks) then start at once instead of one after
//! another: the group's outage is its slowest member's own start.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where a member is in its replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatePhase {
    /// Its image and cache folder are ready on its node; its previous container still runs.
    Prepared,
    /// Its previous container has stopped (or there was none).
    Stopped,
}

#[derive(Debug, Clone, Default)]
struct Arrivals {
    prepared: usize,
    stopped: usize,
    /// A member that will not arrive, and why: every waiting member gives up.
    abandoned: Option<String>,
}

/// One process group's gate, for the members an apply creates or replaces.
#[derive(Debug)]
pub struct StartGate {
    group: String,
    members: usize,
    arrivals: watch::Sender<Arrivals>,
}

impl StartGate {
    pub fn new(group: impl Into<String>, members: usize) -> StartGate {
        StartGate {
            group: group.into(),
            members,
            arrivals: watch::Sender::new(Arrivals::default()),
        }
    }

    /// The process group's name (`module.qwen.vllm`).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// How many members pass through it.
    pub fn members(&self) -> usize {
        self.members
    }

    /// This member reached `phase`: wait until every member has, or until one gives up (its
    /// reason), or until the apply is interrupted.
    pub async fn arrive(&self, phase: GatePhase, cancel: &CancellationToken) -> Result<(), String> {
        self.arrivals.send_modify(|a| match phase {
            GatePhase::Prepared => a.prepared += 1,
            GatePhase::Stopped => a.stopped += 1,
        });
        let mut rx = self.arrivals.subscribe();
        let members = self.members;
        let passed = rx.wait_for(|a| {
            a.abandoned.is_some()
                || match phase {
                    GatePhase::Prepared => a.prepared >= members,
                    GatePhase::Stopped => a.stopped >= members,
                }
        });
        let seen = tokio::select! {
            seen = passed => seen.map(|a| a.clone()).map_err(|_| "the apply ended".to_string())?,
            _ = cancel.cancelled() => return Err("interrupted".into()),
        };
        match seen.abandoned {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Whether every member reached `phase` (the gate opened there): before `Stopped`'s, no
    /// member has started a new container; before `Prepared`'s, none stopped a previous one.
    pub fn passed(&self, phase: GatePhase) -> bool {
        let a = self.arrivals.borrow();
        match phase {
            GatePhase::Prepared => a.prepared >= self.members,
            GatePhase::Stopped => a.stopped >= self.members,
        }
    }

    /// A member will not arrive (its step failed, or the run stopped before it started): every
    /// member waiting, now or later, gives up with `why`. The first reason stands.
    pub fn abandon(&self, why: impl Into<String>) {
        let why = why.into();
        self.arrivals.send_modify(|a| {
            if a.abandoned.is_none() {
                a.abandoned = Some(why);
            }
        });
    }
}

/// The gates of one apply, by the address of each member that passes through one.
#[derive(Debug, Default, Clone)]
pub struct StartGates(HashMap<String, Arc<StartGate>>);

impl StartGates {
    /// Gates for `groups`: each group's name with the addresses of its members that the apply
    /// starts. A group of one member needs no gate.
    pub fn new(groups: impl IntoIterator<Item = (String, Vec<String>)>) -> StartGates {
        let mut by_member = HashMap::new();
        for (group, members) in groups {
            if members.len() < 2 {
                continue;
            }
            let gate = Arc::new(StartGate::new(group, members.len()));
            for m in members {
                by_member.insert(m, gate.clone());
            }
        }
        StartGates(by_member)
    }

    pub fn of(&self, address: &str) -> Option<&Arc<StartGate>> {
        self.0.get(address)
    }

    /// The run stopped: no member still to start will, so none waits for it.
    pub fn abandon_all(&self, why: &str) {
        for g in self.0.values() {
            g.abandon(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn members_pass_each_phase_together_and_a_member_that_gives_up_releases_the_rest() {
        let gates = StartGates::new([
            ("g".to_string(), vec!["a".to_string(), "b".to_string()]),
            ("alone".to_string(), vec!["c".to_string()]),
        ]);
        assert!(gates.of("c").is_none(), "a group of one needs no gate");
        let (a, b) = (
            gates.of("a").unwrap().clone(),
            gates.of("b").unwrap().clone(),
        );
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let first = tokio::spawn(async move { a.arrive(GatePhase::Prepared, &c2).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!first.is_finished(), "a waits for b");
        b.arrive(GatePhase::Prepared, &cancel).await.unwrap();
        first.await.unwrap().unwrap();
        // The second phase: b gives up before it stops its previous container.
        let a = gates.of("a").unwrap().clone();
        let c2 = cancel.clone();
        let waiting = tokio::spawn(async move { a.arrive(GatePhase::Stopped, &c2).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        gates.of("b").unwrap().abandon("b failed");
        assert_eq!(waiting.await.unwrap(), Err("b failed".to_string()));
    }
}

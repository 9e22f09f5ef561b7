//! `moved` and `removed` blocks against the state: the records they re-address or forget, in a
//! copy of the state the rest of the plan diffs against, so a renamed block plans no change on
//! the nodes and a removed one no destroy. An apply makes the same changes to the state before
//! its first step (`apply::record_moves`).

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::diag::Diag;
use crate::state::{Forgotten, State};
use crate::vocabulary::address_within;

use super::{Observations, PlanOptions};

/// One record re-addressed by a `moved` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub from: String,
    pub to: String,
}

/// What the `moved` and `removed` blocks do to a state.
pub struct Readdressed {
    pub moved: Vec<Moved>,
    pub forgotten: Vec<Forgotten>,
    /// The state with them made; `None` when there are none.
    pub state: Option<State>,
}

/// What the definitions' `moved` and `removed` blocks do to `state`. A move whose new address
/// the state already records is refused, naming both.
pub fn apply_to(config: &Config, state: &State) -> Result<Readdressed, Box<Diag>> {
    let mut moved = Vec::new();
    let mut forgets = Vec::new();
    let mut s = state.clone();
    for m in &config.moves {
        let taking: Vec<&String> = s
            .resources
            .keys()
            .filter(|a| address_within(a, &m.from))
            .collect();
        if taking.is_empty() {
            // Already moved by an earlier apply, or nothing was ever recorded there.
            continue;
        }
        if let Some(there) = s.resources.keys().find(|a| address_within(a, &m.to)) {
            return Err(Box::new(
                Diag::error(
                    "plan::moved_onto_recorded",
                    format!(
                        "this `moved` block moves {} to {}, but the state already records {there}",
                        m.from, m.to
                    ),
                )
                .label(&m.span, "the move")
                .label(&m.to_span, "recorded already")
                .help(format!(
                    "two records cannot share an address: `sparkform state rm {there}` forgets the one there (leaving it running), or destroy it first, or move to another address"
                )),
            ));
        }
        moved.extend(
            s.move_records(&m.from, &m.to)
                .into_iter()
                .map(|(from, to)| Moved { from, to }),
        );
    }
    for r in config.removals.iter().filter(|r| !r.destroy) {
        let gone: Vec<String> = s
            .resources
            .keys()
            .filter(|a| address_within(a, &r.from))
            .cloned()
            .collect();
        for address in gone {
            if let Some(rec) = s.forget(&address) {
                forgets.push(Forgotten {
                    address,
                    node: rec.node,
                });
            }
        }
    }
    let changed = (!moved.is_empty() || !forgets.is_empty()).then_some(s);
    Ok(Readdressed {
        moved,
        forgotten: forgets,
        state: changed,
    })
}

/// Make the plan's moves and forgets in `state` (an apply, before its first step): each only
/// where the state still has it as planned.
pub fn record(state: &mut State, moved: &[Moved], forgets: &[Forgotten]) {
    for m in moved {
        if state.resources.contains_key(&m.from) && !state.resources.contains_key(&m.to) {
            state.move_records(&m.from, &m.to);
        }
    }
    for f in forgets {
        state.forget(&f.address);
    }
}

/// What the refresh observed, for the state after the moves: the observations of moved
/// records at their new addresses, and no object of a forgotten record
/// taken for a lost record's leftover.
pub fn observations_after(obs: &Observations, moved: &[Moved], state: &State) -> Observations {
    let mut out = obs.clone();
    for m in moved {
        if let Some(o) = out.resources.remove(&m.from) {
            out.resources.insert(m.to.clone(), o);
        }
    }
    out.orphans.retain(|o| {
        !state
            .forgotten
            .iter()
            .any(|f| f.address == o.address && f.node.as_ref().is_none_or(|n| *n == o.node))
    });
    out
}

/// `opts` with its observations made for the state after the moves (`observations_after`);
/// `None` when nothing moved or was ever forgotten, or nothing was observed.
pub fn options_after(opts: &PlanOptions, moved: &[Moved], state: &State) -> Option<PlanOptions> {
    let obs = opts.observations.as_ref()?;
    if moved.is_empty() && state.forgotten.is_empty() {
        return None;
    }
    Some(PlanOptions {
        observations: Some(observations_after(obs, moved, state)),
        ..opts.clone()
    })
}

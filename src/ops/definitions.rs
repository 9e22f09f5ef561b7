//! The definitions as the commands use them, in one place. [`load`] evaluates them as written
//! (the first evaluation: a command shows its warnings before anything connects); then the
//! values they leave to others are filled by evaluating them again with what those say:
//! [`Evaluated::resolve`] resolves the models' revisions on their download nodes (`plan`,
//! `apply DIR`; pinned by the state with `-refresh=false`), [`Evaluated::pin`] never connects
//! (the state's commits, or a saved plan's commits and node facts). The node facts of a plan
//! made now are read later, on the refresh's connections (`ops::plan`).

use crate::config::{Config, Observed, VarInputs};
use crate::diag::Diag;
use crate::events::Sender;
use crate::graph::Graph;
use crate::hosts::HostOptions;
use crate::plan::planfile::PlanFile;
use crate::state::State;
use crate::workspace::Workspace;

use super::resolve_models;
use super::OpError;

/// The definitions evaluated as written: a model's commit only where its revision is one, the
/// node facts as declared.
pub struct Evaluated {
    config: Config,
    graph: Graph,
}

/// What the definitions are evaluated with when nothing is asked of the machines.
pub enum Pins<'a> {
    /// Nothing: as written (commands that use the nodes, addresses and ports, which no commit
    /// changes: validate, graph, nodes, status, logs, tunnel, destroy).
    Unresolved,
    /// The state's commits for the models whose revision is unchanged, the others left
    /// unresolved; the hub is never asked (commands about what is deployed: verify, import).
    Recorded(Option<&'a State>),
    /// What a saved plan was made with: its models' commits and the node facts it records
    /// (`apply PLANFILE`); never resolved again.
    Planned(&'a PlanFile),
}

/// The definitions a command works with.
pub struct Definitions {
    pub config: Config,
    pub graph: Graph,
    /// Warnings of the evaluation with the filled values that the first did not have (the
    /// command showed the first's).
    pub warnings: Vec<Diag>,
}

/// The definitions of `ws` evaluated as written, and their graph; every error at once.
pub fn load(ws: &Workspace, vars: &VarInputs) -> Result<Evaluated, OpError> {
    let (config, graph) = ws.load(vars).map_err(OpError::Config)?;
    Ok(Evaluated { config, graph })
}

impl Evaluated {
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The first evaluation's warnings.
    pub fn warnings(&self) -> &[Diag] {
        &self.config.warnings
    }

    /// As written, when nothing fills a value.
    fn unchanged(self) -> Definitions {
        Definitions {
            config: self.config,
            graph: self.graph,
            warnings: Vec::new(),
        }
    }

    /// Evaluated again with `observed` (kept as written when it is empty).
    fn again(self, observed: &Observed) -> Result<Definitions, OpError> {
        if observed.models.is_empty() && observed.nodes.is_empty() {
            return Ok(self.unchanged());
        }
        let config = crate::config::load_observed(&self.config.dir, &self.config.vars, observed)
            .map_err(OpError::Config)?;
        let graph = Graph::build(&config)?;
        let warnings = super::plan::new_warnings(&self.config, &config);
        Ok(Definitions {
            config,
            graph,
            warnings,
        })
    }

    /// Filled without connecting to anything.
    pub fn pin(self, pins: Pins<'_>) -> Result<Definitions, OpError> {
        match pins {
            Pins::Unresolved => Ok(self.unchanged()),
            Pins::Recorded(state) => {
                let observed = resolve_models::recorded(&self.config, state);
                self.again(&observed)
            }
            Pins::Planned(file) => {
                let mut observed = file.observed();
                if !super::plan::facts_matter(&self.config, &observed) {
                    observed.nodes.clear();
                }
                observed.models = resolve_models::planned(&file.plan).models;
                self.again(&observed)
            }
        }
    }

    /// The models' revisions resolved on their download nodes when `refresh` (connected for
    /// it, then closed), else pinned by `state` (a revision it has no commit for is an error
    /// naming the model block); as written when there is no model.
    pub async fn resolve(
        self,
        state: Option<&State>,
        refresh: bool,
        hosts: &HostOptions,
        events: &Sender,
    ) -> Result<Definitions, OpError> {
        if !resolve_models::has_models(&self.config) {
            return Ok(self.unchanged());
        }
        let observed =
            resolve_models::resolve_models(&self.config, state, refresh, hosts, events).await?;
        self.again(&observed)
    }
}

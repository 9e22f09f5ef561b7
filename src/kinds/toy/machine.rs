//! The toy kind on a machine: it "says" its greeting (records it, and says the one before on
//! undo); at plan time it reads `/etc/toy-greeting` on each toy's node when the mode looks;
//! status compares that file with what it said; its log is the node's `/var/log/toy.log`.

use crate::vocabulary::KindId;
use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{Config, Readings};
use crate::hosts::{Cmd, HostError};
use crate::kinds::machine::{
    Done, LogLine, LogRead, Machine, ReadCx, ReadError, Record, Seen, Step, StepError,
};
use crate::plan::Action;

pub struct ToyMachine;
pub static MACHINE: ToyMachine = ToyMachine;

/// The toys of `config`: (address, node).
fn toys(config: &Config) -> impl Iterator<Item = (&str, &str)> {
    config
        .resources
        .iter()
        .filter(|r| r.kind == KindId::Toy)
        .filter_map(|r| Some((r.address.as_str(), r.node.as_deref()?)))
}

#[async_trait]
impl Machine for ToyMachine {
    type Kind = super::Toy;
    /// What it said before, said again by a rollback.
    type Undo = Option<String>;

    async fn apply(
        &self,
        cx: &Step<'_, super::Toy>,
        _action: Action,
    ) -> Result<Done<Self>, StepError> {
        let said = cx
            .desired
            .as_ref()
            .and_then(|d| d.greeting.as_str())
            .map(str::to_string);
        Ok(Done {
            summary: format!("said {said:?}"),
            recorded: super::Recorded { said },
            undo: cx.recorded_facts().and_then(|r| r.said.clone()),
        })
    }

    async fn undo(
        &self,
        _cx: &Step<'_, super::Toy>,
        _action: Action,
        done: &Done<Self>,
    ) -> Result<String, StepError> {
        Ok(format!("says {:?} again", done.undo))
    }

    /// In sync while the node's greeting is what it said.
    async fn look(
        &self,
        host: &dyn crate::hosts::Host,
        _lineage: &str,
        recorded: &[(String, Record<'_, super::Toy>)],
    ) -> std::collections::BTreeMap<String, Seen> {
        let now = match host.exec(&Cmd::new("cat").arg("/etc/toy-greeting")).await {
            Ok(o) if o.success() => o.stdout.trim().to_string(),
            _ => return Default::default(),
        };
        recorded
            .iter()
            .map(|(a, r)| {
                let seen = if r.facts.said.as_deref() == Some(now.as_str()) {
                    Seen::InSync
                } else {
                    Seen::Drifted {
                        notes: vec![format!("the node says {now:?} now")],
                    }
                };
                (a.clone(), seen)
            })
            .collect()
    }

    async fn read_log(&self, host: Arc<dyn crate::hosts::Host>, read: LogRead) {
        let out = match host.exec(&Cmd::new("cat").arg("/var/log/toy.log")).await {
            Ok(o) if o.success() => o.stdout,
            Ok(o) => return read.end(Some(o.stderr)).await,
            Err(e) => return read.end(Some(e.to_string())).await,
        };
        for (time, text) in out.lines().enumerate() {
            let line = LogLine {
                time: time as i64,
                address: read.address.clone(),
                text: text.to_string(),
                stderr: false,
            };
            if read.lines.send((read.index, Some(line))).await.is_err() {
                return;
            }
        }
        read.end(None).await;
    }

    fn read_nodes(&self, config: &Config) -> Vec<String> {
        toys(config).map(|(_, node)| node.to_string()).collect()
    }

    async fn read(&self, cx: &ReadCx<'_>) -> Result<Readings, ReadError> {
        let mut out = Readings::default();
        if !cx.mode.looks() {
            return Ok(out);
        }
        let mut errors = Vec::new();
        for (address, node) in toys(cx.config) {
            let host = match cx.pool.get(node) {
                Ok(h) => h,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            match host.exec(&Cmd::new("cat").arg("/etc/toy-greeting")).await {
                Ok(o) if o.success() => {
                    out.kinds
                        .insert(address.to_string(), o.stdout.trim().to_string().into());
                }
                Ok(o) => errors.push(Arc::new(HostError::Other {
                    node: node.to_string(),
                    message: o.stderr,
                })),
                Err(e) => errors.push(Arc::new(e)),
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(ReadError::Hosts(errors))
        }
    }
}

//! The warm mode's connections (`--persist`, `hosts::warm`): the setting, and what
//! `sparkform connections` lists and ends.

use std::path::PathBuf;
use std::time::Duration;

use crate::hosts::warm;

/// `--persist` / `SPARKFORM_PERSIST`: how long a connection is kept idle after a command; None
/// (`off`, the default) keeps none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persist(pub Option<Duration>);

/// clap's parser for `--persist`.
pub fn parse_persist(text: &str) -> Result<Persist, String> {
    warm::parse_persist(text).map(Persist)
}

/// One kept connection.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Connection {
    /// The node's address (`node.spark1`) or the jump host's.
    pub address: String,
    pub target: String,
    pub via: Option<String>,
    /// How long it stays once idle.
    pub persist_secs: u64,
    /// Seconds since it was opened.
    pub age_secs: u64,
    /// False: its master had died; its folder was removed now.
    pub alive: bool,
    /// Its folder (the control socket inside is the connection: it runs commands as you).
    pub folder: PathBuf,
}

/// What `connections` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Connections {
    pub folder: PathBuf,
    pub connections: Vec<Connection>,
}

/// The kept connections (dead ones reaped); with `close`, each ended too.
pub async fn connections(close: bool) -> Result<Connections, String> {
    let root = warm::root_path();
    if !root.exists() {
        return Ok(Connections {
            folder: root,
            connections: Vec::new(),
        });
    }
    let root = warm::root()?;
    let listed = if close {
        warm::close_all(&root).await
    } else {
        warm::list(&root).await
    };
    let now = warm::now_secs();
    let connections = listed
        .into_iter()
        .map(|l| {
            let info = l.info.unwrap_or(warm::Info {
                address: "?".into(),
                target: "?".into(),
                via: None,
                persist_secs: 0,
                started: now,
            });
            Connection {
                address: info.address,
                target: info.target,
                via: info.via,
                persist_secs: info.persist_secs,
                age_secs: now.saturating_sub(info.started),
                alive: l.alive,
                folder: l.dir,
            }
        })
        .collect();
    Ok(Connections {
        folder: root,
        connections,
    })
}

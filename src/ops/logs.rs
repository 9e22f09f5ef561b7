//! Logs: the deployment's containers' logs from every node at once, merged in time order.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::hosts::{HostOptions, HostPool};
use crate::kind::Registered;
use crate::kind::RunsIn;
use crate::kinds::machine::{machine, LogRead};
use crate::vocabulary::KindId;

/// Whether a command-line word reads as a resource address (`logs ADDRESS` without a folder).
pub use crate::kind::address::begins_like_an_address;

/// A container whose logs are asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTarget {
    pub address: String,
    /// Its kind, which reads its log.
    pub kind: KindId,
    pub node: String,
    /// Its Docker name in the definitions, for containers that carry no address label.
    pub name: String,
    /// Its ready blocks' `fail_on_log` patterns and their fixes.
    pub fail_on_log: Vec<(String, String)>,
}

/// One line of a resource's log, and what a logs run says besides (`kinds::machine`, where
/// each kind reads its own).
pub use crate::kinds::machine::{split_timestamp, LogEvent, LogLine};

#[derive(Debug, Clone)]
pub struct LogsRequest {
    pub addresses: Vec<String>,
    pub follow: bool,
    /// Only lines newer than this many seconds.
    pub since_secs: Option<u64>,
    /// At most this many lines per container to start with.
    pub tail: Option<usize>,
}

/// The resources with a log (containers) an address list names: each exactly, a `for_each`
/// block by its address without key, or a module by its prefix; all of them when the list is
/// empty.
pub fn select(config: &Config, addresses: &[String]) -> Result<Vec<LogTarget>, String> {
    let logged: Vec<(&crate::config::Resource, RunsIn)> = config
        .resources
        .iter()
        .filter_map(|r| Some((r, r.kind.kind().placement(&r.config).runs_in?)))
        .collect();
    let named = |want: &str, have: &str| {
        have == want
            || have
                .strip_prefix(want)
                .is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'))
    };
    for a in addresses {
        if !logged.iter().any(|(r, _)| named(a, &r.address)) {
            let known: Vec<&str> = logged.iter().map(|(r, _)| r.address.as_str()).collect();
            return Err(format!(
                "{a}: no container of the definitions has this address (they are: {})",
                known.join(", ")
            ));
        }
    }
    Ok(logged
        .into_iter()
        .filter(|(r, _)| addresses.is_empty() || addresses.iter().any(|a| named(a, &r.address)))
        .filter_map(|(r, source)| {
            Some(LogTarget {
                address: r.address.clone(),
                kind: r.kind,
                node: r.node.clone()?,
                fail_on_log: source.fail_on_log,
                name: source.name,
            })
        })
        .collect())
}

/// What `sparkform logs` asks: the logs of `request.addresses` (all containers when empty)
/// of the evaluated definitions, from the nodes the workspace's deployment runs on.
pub struct LogsCommand {
    pub workspace: crate::workspace::Workspace,
    pub evaluated: super::definitions::Evaluated,
    pub request: LogsRequest,
    pub hosts: HostOptions,
}

/// Why no log was read.
pub enum NoLogs {
    /// An address that names no container of the definitions (the message says which exist).
    NoSuchAddress(String),
    Op(super::OpError),
}

/// `sparkform logs`: the containers the addresses name, each one's log read by its kind,
/// merged in time order until they end (or `cancel`, when following). `show` is handed the
/// containers first and returns where their lines go.
pub async fn run(
    cmd: LogsCommand,
    show: impl FnOnce(&[LogTarget]) -> mpsc::UnboundedSender<LogEvent>,
    cancel: CancellationToken,
) -> Result<(), NoLogs> {
    // Only the containers and their log patterns are used, which no commit changes.
    let config = cmd
        .evaluated
        .pin(super::definitions::Pins::Unresolved)
        .map_err(NoLogs::Op)?
        .config;
    // The lineage tells this deployment's containers apart; without a state, names do.
    let lineage = super::state::recorded(&cmd.workspace)
        .ok()
        .flatten()
        .map(|s| s.lineage);
    let targets = select(&config, &cmd.request.addresses).map_err(NoLogs::NoSuchAddress)?;
    let events = show(&targets);
    logs(
        &config,
        lineage,
        targets,
        &cmd.request,
        &cmd.hosts,
        events,
        cancel,
    )
    .await;
    Ok(())
}

/// How many lines wait in one container's queue before they are written out of order rather
/// than held: the merge's memory bound.
pub const QUEUE_CAP: usize = 1024;

/// Merge per-container streams (each in time order) into one in time order. A line waits while
/// an open source has nothing queued; with `grace` (following), no longer than that, so an idle
/// container does not hold the others back. Memory: at most [`QUEUE_CAP`] lines per source.
pub async fn merge(
    sources: usize,
    mut rx: mpsc::Receiver<(usize, Option<LogLine>)>,
    grace: Option<Duration>,
    mut out: impl FnMut(LogLine),
) {
    let mut queues: Vec<VecDeque<(Instant, LogLine)>> = vec![VecDeque::new(); sources];
    let mut open = vec![true; sources];
    loop {
        while let Some(i) = ready(&queues, &open, grace) {
            if let Some((_, l)) = queues[i].pop_front() {
                out(l);
            }
        }
        if open.iter().all(|o| !o) && queues.iter().all(VecDeque::is_empty) {
            return;
        }
        let oldest = queues
            .iter()
            .filter_map(|q| q.front().map(|(at, _)| *at))
            .min();
        let msg = match (grace, oldest) {
            (Some(g), Some(at)) => {
                match tokio::time::timeout(g.saturating_sub(at.elapsed()), rx.recv()).await {
                    Ok(m) => m,
                    Err(_) => continue,
                }
            }
            _ => rx.recv().await,
        };
        match msg {
            Some((i, Some(l))) if i < sources => queues[i].push_back((Instant::now(), l)),
            Some((i, None)) if i < sources => open[i] = false,
            Some(_) => {}
            // Every sender gone: nothing more comes.
            None => open.iter_mut().for_each(|o| *o = false),
        }
    }
}

/// The source whose first line goes out next, if it may go now: the oldest line goes once no
/// open source could still send an older one, its queue is full, or a line waited `grace`.
fn ready(
    queues: &[VecDeque<(Instant, LogLine)>],
    open: &[bool],
    grace: Option<Duration>,
) -> Option<usize> {
    let min = (0..queues.len())
        .filter(|&i| !queues[i].is_empty())
        .min_by_key(|&i| queues[i].front().map(|(_, l)| l.time))?;
    let overdue = grace.is_some_and(|g| {
        queues
            .iter()
            .filter_map(|q| q.front())
            .any(|(at, _)| at.elapsed() >= g)
    });
    let full = queues.iter().any(|q| q.len() >= QUEUE_CAP);
    let blocked = (0..queues.len()).any(|j| open[j] && queues[j].is_empty());
    (!blocked || overdue || full).then_some(min)
}

/// Run `logs`: events arrive on `events` in order until the logs end or `cancel` fires.
pub async fn logs(
    config: &Config,
    lineage: Option<String>,
    targets: Vec<LogTarget>,
    req: &LogsRequest,
    hosts: &HostOptions,
    events: mpsc::UnboundedSender<LogEvent>,
    cancel: CancellationToken,
) {
    let mut nodes: Vec<String> = targets.iter().map(|t| t.node.clone()).collect();
    nodes.sort();
    nodes.dedup();
    let pool = HostPool::connect(config, &nodes, hosts).await;
    for (node, e) in pool.errors() {
        let _ = events.send(LogEvent::Note(format!("{node}: no logs: {e}")));
    }
    let (tx, rx) = mpsc::channel(256);
    let since = req
        .since_secs
        .map(|s| chrono::Utc::now().timestamp() - i64::try_from(s).unwrap_or(i64::MAX / 2));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, t) in targets.iter().enumerate() {
        let Ok(host) = pool.get(&t.node) else {
            let _ = tx.send((i, None)).await;
            continue;
        };
        let read = LogRead {
            index: i,
            address: t.address.clone(),
            node: t.node.clone(),
            source: RunsIn {
                name: t.name.clone(),
                fail_on_log: t.fail_on_log.clone(),
            },
            lineage: lineage.clone(),
            follow: req.follow,
            since,
            tail: req.tail,
            lines: tx.clone(),
            notes: events.clone(),
            cancel: cancel.clone(),
        };
        let kind = t.kind;
        tasks.spawn(async move { machine(kind).read_log(host, read).await });
    }
    drop(tx);
    let grace = req.follow.then_some(Duration::from_millis(300));
    let lines = events.clone();
    merge(targets.len(), rx, grace, move |l| {
        let _ = lines.send(LogEvent::Line(l));
    })
    .await;
    tasks.shutdown().await;
    pool.close().await;
}

/// The fix for the first `fail_on_log` pattern a line matches.
pub fn fatal_match<'a>(patterns: &'a [(regex::Regex, String)], text: &str) -> Option<&'a str> {
    patterns
        .iter()
        .find(|(re, _)| re.is_match(text))
        .map(|(_, fix)| fix.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(address: &str, time: i64) -> LogLine {
        LogLine {
            time,
            address: address.into(),
            text: format!("{address} at {time}"),
            stderr: false,
        }
    }

    #[tokio::test]
    async fn lines_of_several_containers_come_out_in_time_order() {
        let (tx, rx) = mpsc::channel(4);
        let feeder = tokio::spawn(async move {
            // Arrival order differs from time order: source 1 is read first, then 0, then 2.
            for t in [5, 6, 30] {
                tx.send((1, Some(line("b", t)))).await.unwrap();
            }
            for t in [1, 7, 8, 40] {
                tx.send((0, Some(line("a", t)))).await.unwrap();
            }
            tx.send((1, None)).await.unwrap();
            for t in [2, 9] {
                tx.send((2, Some(line("c", t)))).await.unwrap();
            }
            tx.send((0, None)).await.unwrap();
            tx.send((2, None)).await.unwrap();
        });
        let mut got = Vec::new();
        merge(3, rx, None, |l| got.push(l.time)).await;
        feeder.await.unwrap();
        assert_eq!(got, vec![1, 2, 5, 6, 7, 8, 9, 30, 40]);
    }

    #[tokio::test]
    async fn following_an_idle_container_does_not_hold_the_others_back() {
        let (tx, rx) = mpsc::channel(4);
        let (got_tx, mut got_rx) = mpsc::unbounded_channel();
        let merging = tokio::spawn(async move {
            merge(2, rx, Some(Duration::from_millis(50)), |l| {
                let _ = got_tx.send(l.time);
            })
            .await
        });
        tx.send((0, Some(line("a", 1)))).await.unwrap();
        // Source 1 stays open and silent: the line still comes out after the grace.
        let first = tokio::time::timeout(Duration::from_secs(5), got_rx.recv()).await;
        assert_eq!(first.ok().flatten(), Some(1));
        drop(tx);
        merging.await.unwrap();
    }

    #[tokio::test]
    async fn a_source_that_floods_is_bounded() {
        let (tx, rx) = mpsc::channel(4);
        let feeder = tokio::spawn(async move {
            for t in 0..(QUEUE_CAP as i64 * 3) {
                tx.send((0, Some(line("a", t)))).await.unwrap();
            }
            tx.send((1, Some(line("b", -1)))).await.unwrap();
            tx.send((0, None)).await.unwrap();
            tx.send((1, None)).await.unwrap();
        });
        let mut got = Vec::new();
        merge(2, rx, None, |l| got.push(l.time)).await;
        feeder.await.unwrap();
        // Source 1 said nothing until the end: source 0 could not wait for it forever.
        assert_eq!(got.len(), QUEUE_CAP * 3 + 1);
        assert_eq!(got[0], 0);
    }

    #[test]
    fn docker_timestamps_are_parsed_to_nanoseconds() {
        let (a, text) = split_timestamp("2026-12-01T10:44:11.1234Z hello world").unwrap();
        let (b, _) = split_timestamp("2026-12-01T10:44:11.12345Z x").unwrap();
        assert_eq!(text, "hello world");
        // Docker trims trailing zeros, so the text does not sort; the numbers do.
        assert!(b > a);
        assert_eq!(b - a, 50_000);
        assert!(split_timestamp("not a timestamp").is_none());
    }

    #[test]
    fn addresses_select_containers_and_for_each_instances() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("main.hcl"),
            r#"
node "a" { address = "local" }
node "b" { address = "local" }
container "head" {
  node  = node.a
  image = "busybox"
  ready {
    exec        = ["true"]
    fail_on_log = { "CUDA out of memory" = "lower gpu_memory_utilization" }
  }
}
container "worker" {
  for_each = { a = node.a, b = node.b }
  node     = each.value
  image    = "busybox"
}
"#,
        )
        .unwrap();
        let ws = crate::workspace::Workspace::new(dir.path(), None);
        let (config, _) = ws.load(&Default::default()).unwrap();
        let all = select(&config, &[]).unwrap();
        assert_eq!(all.len(), 3);
        let head = &all.iter().find(|t| t.address == "container.head").unwrap();
        assert_eq!(
            head.fail_on_log,
            vec![(
                "CUDA out of memory".to_string(),
                "lower gpu_memory_utilization".to_string()
            )]
        );
        let workers = select(&config, &["container.worker".into()]).unwrap();
        let addrs: Vec<&str> = workers.iter().map(|t| t.address.as_str()).collect();
        assert_eq!(
            addrs,
            ["container.worker[\"a\"]", "container.worker[\"b\"]"]
        );
        let one = select(&config, &["container.worker[\"b\"]".into()]).unwrap();
        assert_eq!(one.len(), 1);
        let err = select(&config, &["container.nope".into()]).unwrap_err();
        assert!(
            err.contains("container.nope") && err.contains("container.head"),
            "{err}"
        );
        // A prefix that is not an address boundary names nothing.
        assert!(select(&config, &["container.work".into()]).is_err());
    }
}

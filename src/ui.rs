//! Drawing the executor's events: live lines on a terminal, plain lines otherwise, or JSON lines.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::events::Event;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One live line per running step, redrawn.
    Live,
    /// A line per event, progress at most every 10 s per step.
    Plain,
    Json,
}

pub fn mode(json: bool) -> Mode {
    use std::io::IsTerminal;
    if json {
        Mode::Json
    } else if std::io::stdout().is_terminal()
        && std::env::var_os("TERM").is_some_and(|t| t != "dumb")
    {
        Mode::Live
    } else {
        Mode::Plain
    }
}

struct Running {
    started: Instant,
    action: String,
    message: String,
    log: Option<String>,
    timeout: Option<u64>,
    last_printed: Instant,
}

/// The line for what happens before an apply (a lock taken over, a refresh), if `e` is such.
pub fn note(e: &Event) -> Option<String> {
    match e {
        Event::LockTakenOver {
            pid,
            host,
            operation,
            started,
        } => Some(format!("note: took over a lock left by PID {pid} on {host} ({operation} since {started}), which is no longer running.")),
        Event::Refreshing { nodes } => Some(format!(
            "Refreshing: looking at {nodes} node{}…",
            if *nodes == 1 { "" } else { "s" }
        )),
        _ => None,
    }
}

/// Draw the notes of the work before an apply on stderr until the channel closes.
pub fn spawn_notes(
    json: bool,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            // A taken-over lock is worth knowing even when stdout is JSON.
            if json && matches!(e, Event::Refreshing { .. }) {
                continue;
            }
            if let Some(line) = note(&e) {
                eprintln!("{line}");
            }
        }
    })
}

/// Draw events until the channel closes.
pub fn spawn(
    mode: Mode,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut running: BTreeMap<String, Running> = BTreeMap::new();
        let mut drawn_lines = 0usize;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            let event = tokio::select! {
                e = rx.recv() => match e { Some(e) => Some(e), None => break },
                _ = tick.tick() => None,
            };
            let mut out = std::io::stdout().lock();
            if mode == Mode::Live && drawn_lines > 0 {
                let _ = write!(out, "\x1b[{drawn_lines}A\x1b[J");
                drawn_lines = 0;
            }
            if let Some(e) = event {
                if mode == Mode::Json {
                    let _ = writeln!(out, "{}", serde_json::to_string(&e).unwrap_or_default());
                    continue;
                }
                for line in lines(&e, start, &mut running, mode) {
                    let _ = writeln!(out, "{line}");
                }
            }
            if mode == Mode::Live {
                for (address, r) in &running {
                    let mut line = format!(
                        "  … {address}  {:>4}s  {}",
                        r.started.elapsed().as_secs(),
                        r.action
                    );
                    if !r.message.is_empty() {
                        line.push_str(&format!(": {}", r.message));
                    }
                    if let Some(t) = r.timeout {
                        line.push_str(&format!(" (timeout {t} s)"));
                    }
                    if let Some(l) = &r.log {
                        line.push_str(&format!(" │ {l}"));
                    }
                    let cut: String = line.chars().take(160).collect();
                    let _ = writeln!(out, "{cut}");
                    drawn_lines += 1;
                }
            }
            let _ = out.flush();
        }
    })
}

fn stamp(start: Instant) -> String {
    format!("[{:>6.1}s]", start.elapsed().as_secs_f64())
}

fn lines(
    e: &Event,
    start: Instant,
    running: &mut BTreeMap<String, Running>,
    mode: Mode,
) -> Vec<String> {
    let t = stamp(start);
    match e {
        // Before the apply starts; drawn on stderr by `spawn_notes`.
        Event::LockTakenOver { .. } | Event::Refreshing { .. } => Vec::new(),
        Event::Started { steps, parallelism } => vec![format!(
            "{t} {steps} step{} to run, up to {parallelism} at once",
            if *steps == 1 { "" } else { "s" }
        )],
        Event::StepStarted { address, action } => {
            running.insert(
                address.clone(),
                Running {
                    started: Instant::now(),
                    action: action.clone(),
                    message: String::new(),
                    log: None,
                    timeout: None,
                    last_printed: Instant::now(),
                },
            );
            if mode == Mode::Plain {
                vec![format!("{t} {address}: {action}…")]
            } else {
                Vec::new()
            }
        }
        Event::StepProgress {
            address,
            message,
            log,
            timeout_secs,
        } => {
            let Some(r) = running.get_mut(address) else {
                return Vec::new();
            };
            r.message = message.clone();
            if log.is_some() {
                r.log = log.clone();
            }
            r.timeout = *timeout_secs;
            if mode == Mode::Plain && r.last_printed.elapsed() >= Duration::from_secs(10) {
                r.last_printed = Instant::now();
                let mut l = format!(
                    "{t} {address}: still {} after {} s: {message}",
                    r.action,
                    r.started.elapsed().as_secs()
                );
                if let Some(log) = &r.log {
                    l.push_str(&format!(" │ {log}"));
                }
                return vec![l];
            }
            Vec::new()
        }
        Event::StepDone {
            address,
            action,
            elapsed,
            summary,
        } => {
            running.remove(address);
            vec![format!(
                "{t} ✓ {address}: {action} done in {:.1} s{}",
                elapsed.as_secs_f64(),
                if summary.is_empty() {
                    String::new()
                } else {
                    format!(" — {summary}")
                }
            )]
        }
        Event::StepFailed {
            address,
            elapsed,
            error,
        } => {
            running.remove(address);
            let mut v = vec![format!(
                "{t} ✗ {address}: failed after {:.1} s",
                elapsed.as_secs_f64()
            )];
            v.extend(error.lines().map(|l| format!("    {l}")));
            v
        }
        Event::Stopping { reason } => vec![format!("{t} stopping: {reason}; starting nothing new")],
        Event::RollbackStarted { steps } => vec![format!(
            "{t} rolling back {steps} completed step{}",
            if *steps == 1 { "" } else { "s" }
        )],
        Event::UndoDone {
            address,
            summary,
            elapsed,
        } => vec![format!(
            "{t} ↶ {address}: {summary} ({:.1} s)",
            elapsed.as_secs_f64()
        )],
        Event::UndoFailed { address, error, .. } => {
            let mut v = vec![format!("{t} ✗ undo of {address} failed")];
            v.extend(error.lines().map(|l| format!("    {l}")));
            v
        }
        Event::Finished {
            ok,
            elapsed,
            summary,
        } => vec![format!(
            "{t} {} in {:.1} s: {summary}",
            if *ok { "finished" } else { "FAILED" },
            elapsed.as_secs_f64()
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_for_a_step_and_its_failure() {
        let start = Instant::now();
        let mut running = BTreeMap::new();
        let started = lines(
            &Event::StepStarted {
                address: "container.a".into(),
                action: "create".into(),
            },
            start,
            &mut running,
            Mode::Plain,
        );
        assert!(started[0].ends_with("container.a: create…"), "{started:?}");
        assert!(running.contains_key("container.a"));
        // Progress within 10 s of the last line prints nothing, but is remembered for live mode.
        let quiet = lines(
            &Event::StepProgress {
                address: "container.a".into(),
                message: "waiting".into(),
                log: Some("loading".into()),
                timeout_secs: Some(30),
            },
            start,
            &mut running,
            Mode::Plain,
        );
        assert!(quiet.is_empty());
        assert_eq!(running["container.a"].log.as_deref(), Some("loading"));
        let failed = lines(
            &Event::StepFailed {
                address: "container.a".into(),
                elapsed: Duration::from_millis(1500),
                error: "boom\n    │ last line".into(),
            },
            start,
            &mut running,
            Mode::Plain,
        );
        assert!(
            failed[0].contains("✗ container.a: failed after 1.5 s"),
            "{failed:?}"
        );
        assert_eq!(failed[2], "        │ last line");
        assert!(running.is_empty());
    }

    #[test]
    fn json_events_carry_seconds() {
        let e = Event::StepDone {
            address: "probe.hello".into(),
            action: "run".into(),
            elapsed: Duration::from_millis(1234),
            summary: "200".into(),
        };
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(v["event"], "step_done");
        assert_eq!(v["elapsed"], 1.234);
    }
}

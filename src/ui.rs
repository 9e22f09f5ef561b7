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
    /// The latest phase of its start (`loading weights 45%`) and since when it is in it.
    phase: Option<(String, String, Instant)>,
    last_printed: Instant,
}

impl Running {
    fn new(action: &str) -> Running {
        Running {
            started: Instant::now(),
            action: action.to_string(),
            message: String::new(),
            log: None,
            timeout: None,
            phase: None,
            last_printed: Instant::now(),
        }
    }

    /// What it is doing: the phase of its start when one is known (more telling than the
    /// check that did not pass yet), else the step's last word.
    fn doing(&self) -> String {
        match &self.phase {
            Some((_, shown, since)) => format!("{shown} ({} s)", since.elapsed().as_secs()),
            None => self.message.clone(),
        }
    }

    /// Its live line for a terminal `width` columns wide. What it is doing matters most: when
    /// the whole line does not fit, the address loses its module path and the action and
    /// timeout go; the terminal's width cuts what still does not fit.
    fn live_line_for(&self, address: &str, width: usize) -> String {
        let full = self.live_line(address);
        // The spinner and its indent take 4 columns.
        if console::measure_text_width(&full) + 4 <= width {
            return full;
        }
        let short = address
            .rsplit_once("module.")
            .and_then(|(_, rest)| rest.split_once('.'))
            .map_or(address, |(_, r)| r);
        let mut line = format!("{short} {}s", self.started.elapsed().as_secs());
        let doing = self.doing();
        if !doing.is_empty() {
            line.push_str(&format!(" {doing}"));
        }
        if let Some(l) = &self.log {
            line.push_str(&format!(" │ {l}"));
        }
        line
    }

    /// Its live line, uncut.
    fn live_line(&self, address: &str) -> String {
        let mut line = format!(
            "{address}  {:>4}s  {}",
            self.started.elapsed().as_secs(),
            self.action
        );
        let doing = self.doing();
        if !doing.is_empty() {
            line.push_str(&format!(": {doing}"));
        }
        if let Some(t) = self.timeout {
            line.push_str(&format!(" (timeout {t} s)"));
        }
        if let Some(l) = &self.log {
            line.push_str(&format!(" │ {l}"));
        }
        line
    }
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
        Event::StateLockHeld { note } => Some(note.clone()),
        Event::Refreshing { nodes } => Some(format!(
            "Refreshing: looking at {nodes} node{}…",
            if *nodes == 1 { "" } else { "s" }
        )),
        _ => None,
    }
}

/// Draw the notes of the work before an apply on stderr until the channel closes. On a
/// terminal, a refresh shows a spinner with its time until it ends, then its line stays.
pub fn spawn_notes(
    json: bool,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> tokio::task::JoinHandle<()> {
    use std::io::IsTerminal;
    let live = !json && std::io::stderr().is_terminal();
    tokio::spawn(async move {
        let mut spinner: Option<(indicatif::ProgressBar, String)> = None;
        while let Some(e) = rx.recv().await {
            // A taken-over lock is worth knowing even when stdout is JSON.
            // A plan's JSON document carries the state lock's note itself.
            if json && matches!(e, Event::Refreshing { .. } | Event::StateLockHeld { .. }) {
                continue;
            }
            let Some(line) = note(&e) else { continue };
            if live && matches!(e, Event::Refreshing { .. }) {
                let bar = indicatif::ProgressBar::with_draw_target(
                    None,
                    indicatif::ProgressDrawTarget::stderr(),
                )
                .with_style(spinner_style("{spinner} {wide_msg}"))
                .with_message(line.clone());
                bar.enable_steady_tick(Duration::from_millis(200));
                spinner = Some((bar, line));
            } else if let Some((bar, _)) = &spinner {
                bar.suspend(|| {
                    let _ = writeln!(std::io::stderr(), "{line}");
                });
            } else {
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
        if let Some((bar, line)) = spinner {
            bar.finish_and_clear();
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    })
}

fn spinner_style(template: &str) -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner())
        .tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ")
}

/// Draw events until the channel closes. Live lines are indicatif's: it knows the terminal's
/// width (a line is cut, never wrapped), redraws on resize and prints finished lines above.
/// Draw the events of an operation until its sender is dropped; every event is scrubbed of
/// `secrets` first, whatever the mode.
pub fn spawn(
    mode: Mode,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    secrets: crate::events::Secrets,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut running: BTreeMap<String, Running> = BTreeMap::new();
        let multi = (mode == Mode::Live).then(|| {
            indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stdout())
        });
        let mut bars: BTreeMap<String, indicatif::ProgressBar> = BTreeMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            let event = tokio::select! {
                e = rx.recv() => match e { Some(e) => Some(e), None => break },
                _ = tick.tick() => None,
            };
            if let Some(e) = event {
                let e = e.scrubbed(&secrets);
                if mode == Mode::Json {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{}", serde_json::to_string(&e).unwrap_or_default());
                    let _ = out.flush();
                    continue;
                }
                let printed = lines(&e, start, &mut running, mode);
                match &multi {
                    Some(m) => {
                        for line in printed {
                            let _ = m.println(line);
                        }
                    }
                    None => {
                        let mut out = std::io::stdout().lock();
                        for line in printed {
                            let _ = writeln!(out, "{line}");
                        }
                        let _ = out.flush();
                    }
                }
            }
            if let Some(m) = &multi {
                bars.retain(|address, bar| {
                    let keep = running.contains_key(address);
                    if !keep {
                        bar.finish_and_clear();
                        m.remove(bar);
                    }
                    keep
                });
                let width = console::Term::stdout()
                    .size_checked()
                    .map_or(80, |(_, cols)| cols as usize);
                for (address, r) in &running {
                    let bar = bars.entry(address.clone()).or_insert_with(|| {
                        m.add(
                            indicatif::ProgressBar::new_spinner()
                                .with_style(spinner_style("  {spinner} {wide_msg}")),
                        )
                    });
                    bar.set_message(r.live_line_for(address, width));
                    bar.tick();
                }
            }
        }
        if let Some(m) = multi {
            for bar in bars.values() {
                bar.finish_and_clear();
            }
            let _ = m.clear();
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
        Event::LockTakenOver { .. } | Event::Refreshing { .. } | Event::StateLockHeld { .. } => {
            Vec::new()
        }
        Event::Started { steps, parallelism } => vec![format!(
            "{t} {steps} step{} to run, up to {parallelism} at once",
            if *steps == 1 { "" } else { "s" }
        )],
        Event::StepStarted { address, action } => {
            running.insert(address.clone(), Running::new(action));
            if mode == Mode::Plain {
                vec![format!("{t} {address}: {action}…")]
            } else {
                Vec::new()
            }
        }
        Event::StepProgress { .. } => progress_lines(e, &t, running, mode),
        Event::Phase { .. } => phase_lines(e, &t, running, mode),
        Event::StepWarning {
            address,
            message,
            help,
        } => vec![
            format!("{t} ! {address}: warning: {message}"),
            format!("    help: {help}"),
        ],
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
        Event::StepStopped {
            address,
            elapsed,
            at,
        } => {
            running.remove(address);
            vec![format!(
                "{t} ⏹ {address}: interrupted after {:.1} s, before it finished (it was at: {at})",
                elapsed.as_secs_f64()
            )]
        }
        Event::StepNotRun { address, reason } => {
            vec![format!("{t} - {address}: not run: {reason}")]
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
        Event::WatchCheck {
            tick,
            ok,
            elapsed,
            summary,
        } => vec![format!(
            "{t} {} check {tick} ({:.1} s): {summary}",
            if *ok { "✓" } else { "✗" },
            elapsed.as_secs_f64()
        )],
        Event::WatchRestart {
            attempt,
            cause,
            resources,
        } => vec![format!(
            "{t} ↻ restart {attempt}: {cause}\n{t}   replacing {}",
            resources.join(", ")
        )],
        Event::WatchRestarted { ok, summary } => vec![format!(
            "{t} {} restart: {summary}",
            if *ok { "✓" } else { "✗" }
        )],
    }
}

/// A running step's progress: kept for the live line; a plain line at most every 10 s.
fn progress_lines(
    e: &Event,
    t: &str,
    running: &mut BTreeMap<String, Running>,
    mode: Mode,
) -> Vec<String> {
    let Event::StepProgress {
        address,
        message,
        log,
        timeout_secs,
    } = e
    else {
        return Vec::new();
    };
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
            "{t} {address}: still {} after {} s: {}",
            r.action,
            r.started.elapsed().as_secs(),
            r.doing()
        );
        if let Some(log) = &r.log {
            l.push_str(&format!(" │ {log}"));
        }
        return vec![l];
    }
    Vec::new()
}

/// A phase a container's log showed: kept for the live line; a plain line for each new phase.
fn phase_lines(
    e: &Event,
    t: &str,
    running: &mut BTreeMap<String, Running>,
    mode: Mode,
) -> Vec<String> {
    let Event::Phase {
        address,
        phase,
        percent,
        line,
    } = e
    else {
        return Vec::new();
    };
    let Some(r) = running.get_mut(address) else {
        return Vec::new();
    };
    let shown = crate::events::phase_text(phase, *percent);
    let new_phase = r.phase.as_ref().is_none_or(|(label, _, _)| label != phase);
    let since = match &r.phase {
        Some((label, _, since)) if label == phase => *since,
        _ => Instant::now(),
    };
    r.phase = Some((phase.clone(), shown.clone(), since));
    r.log = Some(line.clone());
    // A plain line for each new phase; its percentages only as often as progress.
    if mode == Mode::Plain && (new_phase || r.last_printed.elapsed() >= Duration::from_secs(10)) {
        r.last_printed = Instant::now();
        return vec![format!(
            "{t} {address}: {shown} (after {} s)",
            r.started.elapsed().as_secs()
        )];
    }
    Vec::new()
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
    fn a_phase_replaces_the_failed_check_and_prints_once_per_label() {
        let start = Instant::now();
        let mut running = BTreeMap::new();
        lines(
            &Event::StepStarted {
                address: "container.vllm".into(),
                action: "create".into(),
            },
            start,
            &mut running,
            Mode::Plain,
        );
        let progress = Event::StepProgress {
            address: "container.vllm".into(),
            message: "waiting for `GET http://10.0.0.1:8000/health`: answered 503".into(),
            log: None,
            timeout_secs: Some(900),
        };
        lines(&progress, start, &mut running, Mode::Plain);
        assert!(running["container.vllm"]
            .live_line("container.vllm")
            .contains("answered 503"));
        let phase = |percent: f64| Event::Phase {
            address: "container.vllm".into(),
            phase: "loading weights".into(),
            percent: Some(percent),
            line: format!("Loading safetensors checkpoint shards: {percent}% Completed"),
        };
        let first = lines(&phase(7.0), start, &mut running, Mode::Plain);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(
            first[0].contains("container.vllm: loading weights 7%"),
            "{first:?}"
        );
        // The next percentage within 10 s updates the line without printing one.
        assert!(lines(&phase(50.0), start, &mut running, Mode::Plain).is_empty());
        lines(&progress, start, &mut running, Mode::Plain);
        let live = running["container.vllm"].live_line("container.vllm");
        assert!(live.contains("create: loading weights 50% (0 s)"), "{live}");
        assert!(!live.contains("503"), "{live}");
        assert!(
            live.contains("(timeout 900 s) │ Loading safetensors"),
            "{live}"
        );
        let next = lines(
            &Event::Phase {
                address: "container.vllm".into(),
                phase: "capturing CUDA graphs".into(),
                percent: None,
                line: "Capturing CUDA graphs".into(),
            },
            start,
            &mut running,
            Mode::Plain,
        );
        assert_eq!(next.len(), 1, "{next:?}");
    }

    #[test]
    fn a_narrow_terminal_keeps_what_a_step_does() {
        let mut r = Running::new("create");
        r.phase = Some((
            "loading weights".into(),
            "loading weights 45%".into(),
            Instant::now(),
        ));
        r.timeout = Some(900);
        let address = "module.qwen.module.ray.container.ray_worker[\"node2\"]";
        assert!(r
            .live_line_for(address, 200)
            .starts_with("module.qwen.module.ray.container.ray_worker[\"node2\"]     0s  create: loading weights 45% (0 s) (timeout 900 s)"));
        assert_eq!(
            r.live_line_for(address, 40),
            "container.ray_worker[\"node2\"] 0s loading weights 45% (0 s)"
        );
        assert_eq!(
            r.live_line_for("probe.hello", 40),
            "probe.hello 0s loading weights 45% (0 s)"
        );
    }

    #[test]
    fn phase_events_in_json() {
        let e = Event::Phase {
            address: "module.llm.container.vllm".into(),
            phase: "loading weights".into(),
            percent: Some(45.0),
            line: "Loading safetensors checkpoint shards:  45% Completed".into(),
        };
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(v["event"], "phase");
        assert_eq!(v["phase"], "loading weights");
        assert_eq!(v["percent"], 45.0);
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

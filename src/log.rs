//! `SPARKFORM_LOG=trace|debug|info|warn|error`: a log of what sparkform does on machines, as
//! Terraform's `TF_LOG`: each remote command, Docker call, HTTP request and state write with its
//! node and how long it took (`tracing` events of the `sparkform` targets, written by
//! `tracing-subscriber`), to standard error or to `SPARKFORM_LOG_PATH`. Every line passes the
//! one scrubber of sensitive values first ([`hide`]), so no secret reaches the log.

use std::io::Write;
use std::sync::{Mutex, RwLock};

use tracing_subscriber::filter::{filter_fn, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::secrets::Secrets;

/// The variable that turns the log on, and the one that sends it to a file.
pub const LEVEL_VAR: &str = "SPARKFORM_LOG";
pub const PATH_VAR: &str = "SPARKFORM_LOG_PATH";

/// The sensitive texts every line is scrubbed of: those of every definitions' load so far.
static HIDDEN: RwLock<Option<Secrets>> = RwLock::new(None);

/// Scrub every later line of the log of `secrets` too (the definitions' sensitive values, as
/// their load found them).
pub fn hide(secrets: &Secrets) {
    let mut hidden = HIDDEN.write().unwrap_or_else(|e| e.into_inner());
    let mut all = hidden.take().unwrap_or_default();
    all.extend(secrets);
    *hidden = Some(all);
}

fn scrubbed(text: &str) -> String {
    let hidden = HIDDEN.read().unwrap_or_else(|e| e.into_inner());
    match hidden.as_ref() {
        Some(s) => s.scrub(text).into_owned(),
        None => text.to_string(),
    }
}

/// The level `value` names (`off` is none), or `Err` with what it accepts.
pub fn level(value: &str) -> Result<Option<LevelFilter>, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "off" => Ok(None),
        "trace" => Ok(Some(LevelFilter::TRACE)),
        "debug" => Ok(Some(LevelFilter::DEBUG)),
        "info" => Ok(Some(LevelFilter::INFO)),
        "warn" => Ok(Some(LevelFilter::WARN)),
        "error" => Ok(Some(LevelFilter::ERROR)),
        _ => Err("trace, debug, info, warn, error or off".into()),
    }
}

/// Where the lines go: standard error, or the file, each line scrubbed.
enum Sink {
    Stderr,
    File(Mutex<std::fs::File>),
}

/// One line's writer: it holds the line and writes it, scrubbed, when the line is done.
struct Line<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        let text = scrubbed(&String::from_utf8_lossy(&self.buf));
        let _ = match self.sink {
            Sink::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
            Sink::File(f) => f
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(text.as_bytes()),
        };
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            sink: self,
            buf: Vec::new(),
        }
    }
}

/// Start the log as the environment says, once, before any work: `Err` is a warning for the
/// user (a level that is none, a file that cannot be opened), the command going on without
/// the log or with it on standard error.
pub fn init_from_env() -> Result<(), String> {
    let Ok(value) = std::env::var(LEVEL_VAR) else {
        return Ok(());
    };
    let level = match level(&value) {
        Ok(Some(l)) => l,
        Ok(None) => return Ok(()),
        Err(accepted) => {
            return Err(format!(
                "{LEVEL_VAR}={value:?} is not a log level ({accepted}): no log is written"
            ))
        }
    };
    let mut warning = Ok(());
    let sink = match std::env::var_os(PATH_VAR).filter(|p| !p.is_empty()) {
        None => Sink::Stderr,
        Some(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => Sink::File(Mutex::new(f)),
            Err(e) => {
                warning = Err(format!(
                    "{PATH_VAR}={}: cannot write there ({e}): the log goes to standard error",
                    std::path::Path::new(&path).display()
                ));
                Sink::Stderr
            }
        },
    };
    // sparkform's own events only: the libraries' are noise at this level of detail.
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(sink)
        .with_ansi(false)
        .with_filter(filter_fn(move |m| {
            m.target().starts_with("sparkform") && *m.level() <= level
        }));
    let _ = tracing_subscriber::registry().with(layer).try_init();
    warning
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_read_as_terraform_writes_them() {
        assert_eq!(level("TRACE"), Ok(Some(LevelFilter::TRACE)));
        assert_eq!(level("debug"), Ok(Some(LevelFilter::DEBUG)));
        assert_eq!(level("off"), Ok(None));
        assert!(level("banana").unwrap_err().contains("trace, debug"));
    }

    #[test]
    fn a_line_is_scrubbed_of_what_was_hidden() {
        hide(&Secrets::new(["tok-12345-secret".to_string()]));
        assert_eq!(
            scrubbed("GET http://n/v1?key=tok-12345-secret 200"),
            format!("GET http://n/v1?key={} 200", crate::secrets::HIDDEN)
        );
    }
}

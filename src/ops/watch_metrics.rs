//! `sparkform watch --metrics ADDR`: what the watch sees, as Prometheus text (prometheus-client)
//! on a plain HTTP endpoint: each probe's latency, the canary's tokens per second, checks,
//! failures and restarts, and the last failure's cause.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    probe_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    tokens_per_second: Family<Labels, Gauge<f64, AtomicU64>>,
    checks: Counter,
    failed_checks: Counter,
    restarts: Counter,
    last_failure: Family<Labels, Gauge>,
    last_cause: Mutex<Option<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sparkform_watch");
        let m = Metrics {
            registry: Registry::default(),
            probe_seconds: Family::default(),
            tokens_per_second: Family::default(),
            checks: Counter::default(),
            failed_checks: Counter::default(),
            restarts: Counter::default(),
            last_failure: Family::default(),
            last_cause: Mutex::new(None),
        };
        registry.register(
            "probe_seconds",
            "How long each probe took to pass at the last check",
            m.probe_seconds.clone(),
        );
        registry.register(
            "canary_tokens_per_second",
            "Completion tokens per second of each probe that reported its usage",
            m.tokens_per_second.clone(),
        );
        registry.register("checks", "Checks made", m.checks.clone());
        registry.register(
            "failed_checks",
            "Checks that found a failure",
            m.failed_checks.clone(),
        );
        registry.register("restarts", "Engine restarts started", m.restarts.clone());
        registry.register(
            "last_failure",
            "1 for the cause of the last failure seen",
            m.last_failure.clone(),
        );
        Metrics { registry, ..m }
    }

    /// What one check saw: each probe that passed (address, seconds, summary) and the cause of
    /// its first failure.
    pub fn observe(&self, probes: &[(String, f64, String)], failure: Option<&str>) {
        self.checks.inc();
        for (address, secs, summary) in probes {
            let labels = vec![("probe".to_string(), address.clone())];
            self.probe_seconds.get_or_create(&labels).set(*secs);
            if let Some(tokens) = completion_tokens(summary) {
                if *secs > 0.0 {
                    self.tokens_per_second
                        .get_or_create(&labels)
                        .set(tokens as f64 / secs);
                }
            }
        }
        if let Some(cause) = failure {
            self.failed_checks.inc();
            self.cause(cause);
        }
    }

    pub fn restarted(&self, cause: &str) {
        self.restarts.inc();
        self.cause(cause);
    }

    fn cause(&self, cause: &str) {
        let cut: String = cause.chars().take(200).collect();
        if let Ok(mut last) = self.last_cause.lock() {
            if let Some(old) = last.replace(cut.clone()) {
                self.last_failure
                    .get_or_create(&vec![("cause".to_string(), old)])
                    .set(0);
            }
        }
        self.last_failure
            .get_or_create(&vec![("cause".to_string(), cut)])
            .set(1);
    }

    /// The text exposition.
    pub fn text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// `(12 completion tokens)` in a probe's summary (what an OpenAI answer's usage said).
pub fn completion_tokens(summary: &str) -> Option<u64> {
    let (_, rest) = summary.rsplit_once('(')?;
    rest.strip_suffix(" completion tokens)")?
        .trim()
        .parse()
        .ok()
}

/// Serve `metrics` on `listener` until the task is aborted: every request gets the text (a
/// path other than `/metrics` a 404); one request per connection, bounded in size and time.
pub async fn serve(listener: tokio::net::TcpListener, metrics: std::sync::Arc<Metrics>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            let read = async {
                while len < buf.len() {
                    match conn.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            };
            if tokio::time::timeout(std::time::Duration::from_secs(5), read)
                .await
                .is_err()
            {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if path == "/metrics" || path.starts_with("/metrics?") {
                ("200 OK", metrics.text())
            } else {
                ("404 Not Found", "see /metrics\n".to_string())
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_shows_in_the_text() {
        let m = Metrics::new();
        m.observe(
            &[(
                "probe.hello".into(),
                0.5,
                "passed in 0.50 s, 200: Hello (20 completion tokens)".into(),
            )],
            None,
        );
        m.observe(&[], Some("container.x: EngineDeadError"));
        m.restarted("container.x: EngineDeadError");
        let t = m.text();
        assert!(
            t.contains("sparkform_watch_probe_seconds{probe=\"probe.hello\"} 0.5"),
            "{t}"
        );
        assert!(
            t.contains("sparkform_watch_canary_tokens_per_second{probe=\"probe.hello\"} 40.0"),
            "{t}"
        );
        assert!(t.contains("sparkform_watch_checks_total 2"), "{t}");
        assert!(t.contains("sparkform_watch_failed_checks_total 1"), "{t}");
        assert!(t.contains("sparkform_watch_restarts_total 1"), "{t}");
        assert!(
            t.contains("sparkform_watch_last_failure{cause=\"container.x: EngineDeadError\"} 1"),
            "{t}"
        );
    }

    #[test]
    fn completion_tokens_are_read_from_a_summary() {
        assert_eq!(
            completion_tokens("200: hi (12 completion tokens)"),
            Some(12)
        );
        assert_eq!(completion_tokens("200: hi"), None);
    }
}

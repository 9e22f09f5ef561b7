//! A probe's desired configuration, typed: what its lowering produces and its machine half
//! runs. Exactly one of `http`, `exec`, `tcp` is set (the lowering checks it); `form` names
//! it, as the recorded configurations always did. The defaults are here and nowhere else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Number;

use crate::kind::DesiredConfig;
use crate::kinds::Texts;

pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
pub const DEFAULT_INTERVAL_SECS: u64 = 2;
pub const DEFAULT_SOAK_INTERVAL_SECS: u64 = 15;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    /// `http`, `exec` or `tcp`.
    pub form: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<Http>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<Exec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Tcp>,
    #[serde(default)]
    pub expect: Expect,
    /// Seconds for all the attempts together; always written.
    #[serde(default = "default_timeout")]
    pub timeout: Number,
    /// Seconds between attempts; always written.
    #[serde(default = "default_interval")]
    pub interval: Number,
    /// After it passed: how long it must keep passing, checked how often.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<Soak>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<super::bench::Bench>,
    /// A bench probe's figures may move this far from the last good generation's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<super::bench::Regression>,
}

/// What a probe's run found that the state keeps: a bench probe's figures and the workload
/// they measured (the last good generation's, for the next run's regression rules).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<super::bench::Measured>,
}

/// A record from before the figures (none) reads as one without them: no upgrade to make.
impl crate::kind::RecordedFacts for Recorded {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Soak {
    /// Seconds.
    pub duration: Number,
    /// Seconds between checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Number>,
}

impl DesiredConfig for Desired {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Http {
    /// The node whose tunnel the request goes through.
    #[serde(default)]
    pub via: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// A JSON document to send (`Content-Type: application/json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exec {
    /// On this node, or
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// in this container (an address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(default)]
    pub command: Texts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tcp {
    #[serde(default)]
    pub via: String,
    pub address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Expect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contains: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_contains: Option<String>,
}

fn default_timeout() -> Number {
    Number::from(DEFAULT_TIMEOUT_SECS)
}

fn default_interval() -> Number {
    Number::from(DEFAULT_INTERVAL_SECS)
}

/// What a probe does.
pub enum ProbeForm<'a> {
    Http(&'a Http),
    Exec(&'a Exec),
    Tcp(&'a Tcp),
}

impl Desired {
    /// The check its `form` names; `None` when that block is missing.
    pub fn check(&self) -> Option<ProbeForm<'_>> {
        match self.form.as_str() {
            "http" => self.http.as_ref().map(ProbeForm::Http),
            "exec" => self.exec.as_ref().map(ProbeForm::Exec),
            "tcp" => self.tcp.as_ref().map(ProbeForm::Tcp),
            _ => None,
        }
    }

    pub fn timeout_secs(&self) -> u64 {
        self.timeout.as_u64().unwrap_or(DEFAULT_TIMEOUT_SECS)
    }

    pub fn interval_secs(&self) -> u64 {
        self.interval.as_u64().unwrap_or(DEFAULT_INTERVAL_SECS)
    }

    /// How long it must keep passing once it passed (its soak), if it soaks.
    pub fn soak_secs(&self) -> Option<u64> {
        self.soak.as_ref()?.duration.as_u64().filter(|s| *s > 0)
    }

    /// How often the soak checks it.
    pub fn soak_interval_secs(&self) -> u64 {
        self.soak
            .as_ref()
            .and_then(|s| s.interval.as_ref())
            .and_then(Number::as_u64)
            .unwrap_or(DEFAULT_SOAK_INTERVAL_SECS)
            .max(1)
    }
}

impl Expect {
    pub fn want_status(&self) -> u16 {
        crate::kinds::wanted_status(self.status.as_ref())
    }

    pub fn want_exit_code(&self) -> i64 {
        crate::kinds::wanted_exit_code(self.exit_code.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_json_is_the_evaluated_one_and_defaults_live_here() {
        let config = json!({
            "form": "http",
            "http": {"via": "node.n1", "url": "http://127.0.0.1:8000/v1/chat/completions",
                     "json": {"max_tokens": 8}, "headers": {"Authorization": "Bearer x"}},
            "expect": {"status": 200, "json_path": "choices[0].message.content"},
            "timeout": 900, "interval": 5,
        });
        let d = Desired::from_config(&config).unwrap();
        assert_eq!(d.to_config(), config);
        assert!(matches!(d.check(), Some(ProbeForm::Http(_))));
        let bare =
            Desired::from_config(&json!({"form": "tcp", "tcp": {"via": "n", "address": "h:1"}}))
                .unwrap();
        assert_eq!(bare.timeout_secs(), 60);
        assert_eq!(bare.interval_secs(), 2);
        assert_eq!(bare.expect.want_status(), 200);
        assert_eq!(bare.to_config()["expect"], json!({}));
    }
}

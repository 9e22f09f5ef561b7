//! The one scrubber of sensitive values: the texts of every value derived from a sensitive
//! input, as they can appear in a message (as given, and as Rust and JSON quote them), each
//! replaced by [`HIDDEN`]. The load notes them while it evaluates (`diag::note_secret`: the
//! variables' values, every tainted value) and hands the set on in `Config::secrets`, with the
//! texts the kinds' lowering built from them (a header, a URL); diagnostics, a step's messages
//! and errors, the events (the terminal, `--json`) and the journal are scrubbed with that set
//! (docs/security.md).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

/// What a shown text says where a value derived from a sensitive input was.
pub const HIDDEN: &str = "(sensitive value)";

/// Shortest sensitive value looked for: a shorter one would blot out ordinary words and tell
/// what the secret is (docs/security.md); such values are kept out by the taint alone.
pub const MIN_SECRET: usize = 4;

/// Most texts a set holds (a guard against a definition that makes millions of secrets).
pub const MAX_SECRETS: usize = 4096;

/// A set of sensitive texts, longest first so that a secret containing another is replaced
/// whole. Cloning shares it; `{:?}` shows how many texts it holds, never one.
#[derive(Clone, Default)]
pub struct Secrets(Arc<Vec<String>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} texts)", self.0.len())
    }
}

impl Secrets {
    pub fn new(texts: impl IntoIterator<Item = String>) -> Secrets {
        let mut s = Secrets::default();
        for t in texts {
            s.add(&t);
        }
        s
    }

    /// Add a sensitive value's text in every form a message can show it.
    pub fn add(&mut self, text: &str) {
        if text.chars().count() < MIN_SECRET {
            return;
        }
        let debug = format!("{text:?}");
        let json = serde_json::to_string(text).unwrap_or_default();
        let inner = |q: &str| {
            q.get(1..q.len().saturating_sub(1))
                .unwrap_or_default()
                .to_string()
        };
        let forms = [text.to_string(), inner(&debug), inner(&json)];
        let all = Arc::make_mut(&mut self.0);
        let before = all.len();
        for f in forms {
            if all.len() < MAX_SECRETS && f.chars().count() >= MIN_SECRET && !all.contains(&f) {
                all.push(f);
            }
        }
        if all.len() != before {
            all.sort_by_key(|f| std::cmp::Reverse(f.len()));
        }
    }

    /// This set with every text of `other`.
    pub fn extend(&mut self, other: &Secrets) {
        if self.0.is_empty() {
            *self = other.clone();
            return;
        }
        let all = Arc::make_mut(&mut self.0);
        for f in other.0.iter() {
            if all.len() < MAX_SECRETS && !all.contains(f) {
                all.push(f.clone());
            }
        }
        all.sort_by_key(|f| std::cmp::Reverse(f.len()));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `s` with every secret replaced by [`HIDDEN`].
    pub fn scrub<'a>(&self, s: &'a str) -> Cow<'a, str> {
        if !self.0.iter().any(|x| s.contains(x.as_str())) {
            return Cow::Borrowed(s);
        }
        let mut out = s.to_string();
        for x in self.0.iter() {
            if out.contains(x.as_str()) {
                out = out.replace(x.as_str(), HIDDEN);
            }
        }
        Cow::Owned(out)
    }

    /// Byte ranges of `text` that hold a secret, for masking source lines.
    pub fn ranges(&self, text: &str) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        for x in self.0.iter() {
            out.extend(text.match_indices(x.as_str()).map(|(i, m)| i..i + m.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_secret_is_hidden_and_short_values_are_not() {
        let s = Secrets::new(["to\"ken-1234".to_string(), "abc".to_string()]);
        assert_eq!(s.scrub("a to\"ken-1234 b"), "a (sensitive value) b");
        // as JSON and Rust quote it
        assert_eq!(
            s.scrub(r#"{"k":"to\"ken-1234"}"#),
            r#"{"k":"(sensitive value)"}"#
        );
        assert_eq!(s.scrub("abc"), "abc");
        // a secret containing another is replaced whole
        let mut s = Secrets::new(["token".to_string()]);
        s.add("Bearer token");
        assert_eq!(s.scrub("Bearer token"), HIDDEN);
        assert_eq!(s.ranges("x token"), vec![2..7]);
        assert_eq!(format!("{s:?}"), "Secrets(2 texts)");
    }
}

//! A test hook for the crash harness (`bench/chaos`): with `SPARKFORM_CHAOS_KILL_AFTER` set,
//! sparkform kills itself with SIGKILL right after the journal recorded a matching step, so a
//! kill lands exactly at a chosen transition (the state recorded a create, a replacement whose
//! old container is renamed aside, an address add) instead of at a random instant.
//!
//! The value is `ACTION[:ADDRESS_PART][@N]`: the action as plans spell it (`create`,
//! `replace`, `update`, `delete`, `run`), a part of the step's address, and which matching
//! write (from 1, by default the first). `replace:container.` kills after the first container
//! replacement was recorded. Unset it costs one environment look-up per apply and does
//! nothing.
//!
//! Only builds with the feature `test-support` have it (the tests, and bench/chaos's binary):
//! in the product `after_journal_write` is an empty function, so the journal's call stays as
//! it is and compiles to nothing, and no environment variable can make sparkform kill itself.

use crate::plan::Action;

#[cfg(feature = "test-support")]
pub use hook::{after_journal_write, ENV};

/// Called after each journal write of a step; without the test support there is no hook.
#[cfg(not(feature = "test-support"))]
#[inline(always)]
pub fn after_journal_write(_action: Action, _address: &str) {}

#[cfg(feature = "test-support")]
mod hook {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    use super::Action;

    pub const ENV: &str = "SPARKFORM_CHAOS_KILL_AFTER";

    #[derive(Debug, PartialEq, Eq)]
    struct KillTrigger {
        action: String,
        address_part: String,
        nth: usize,
    }

    fn parse(text: &str) -> Option<KillTrigger> {
        let (rest, nth) = match text.rsplit_once('@') {
            Some((r, n)) => (r, n.parse().ok().filter(|n| *n >= 1)?),
            None => (text, 1),
        };
        let (action, address_part) = rest.split_once(':').unwrap_or((rest, ""));
        (!action.is_empty()).then(|| KillTrigger {
            action: action.to_string(),
            address_part: address_part.to_string(),
            nth,
        })
    }

    fn trigger() -> Option<&'static KillTrigger> {
        static TRIGGER: OnceLock<Option<KillTrigger>> = OnceLock::new();
        TRIGGER
            .get_or_init(|| std::env::var(ENV).ok().as_deref().and_then(parse))
            .as_ref()
    }

    fn action_name(action: Action) -> &'static str {
        match action {
            Action::Create => "create",
            Action::Update => "update",
            Action::Replace => "replace",
            Action::Delete => "delete",
            Action::Run => "run",
            Action::NoOp => "no-op",
        }
    }

    impl KillTrigger {
        fn matches(&self, action: Action, address: &str) -> bool {
            self.action == action_name(action) && address.contains(&self.address_part)
        }
    }

    /// Called after each journal write of a step (the state on disk records it).
    pub fn after_journal_write(action: Action, address: &str) {
        static SEEN: AtomicUsize = AtomicUsize::new(0);
        let Some(t) = trigger() else { return };
        if !t.matches(action, address) || SEEN.fetch_add(1, Ordering::SeqCst) + 1 != t.nth {
            return;
        }
        // SIGKILL, as an operator's `kill -9` or the OOM killer: no destructor, no handler runs.
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        // The signal is on its way; nothing more of this run may happen.
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn triggers_parse_and_match() {
            let t = parse("replace:container.@2").unwrap();
            assert_eq!(
                t,
                KillTrigger {
                    action: "replace".into(),
                    address_part: "container.".into(),
                    nth: 2
                }
            );
            assert!(t.matches(Action::Replace, "module.qwen.container.vllm"));
            assert!(!t.matches(Action::Create, "module.qwen.container.vllm"));
            assert!(!t.matches(Action::Replace, "network.roce.attach.node1"));
            let any_create = parse("create").unwrap();
            assert!(any_create.matches(Action::Create, "network.roce.attach.node1"));
            assert_eq!(any_create.nth, 1);
            assert_eq!(parse(""), None);
            assert_eq!(parse("create@0"), None);
            assert_eq!(parse("create@x"), None);
        }
    }
}

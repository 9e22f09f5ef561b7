//! The crash harness's journal observer (`bench/chaos`), installed by `sparkform-chaos` and by
//! tests that kill a child at a journal write.
//!
//! With `SPARKFORM_CHAOS_KILL_AFTER` set, sparkform kills itself with SIGKILL right after a
//! matching journal write, so a kill lands exactly at a chosen transition (the state recorded a
//! create, a replacement whose old container is renamed aside, an address add recorded ahead)
//! instead of at a random instant. With `SPARKFORM_CHAOS_SKIP_JOURNAL` set, the matching
//! records are never made (neither in memory nor on disk): a deliberately broken build, which
//! the harness must report as inconsistent.
//!
//! A trigger is `[PHASE:]ACTION[:ADDRESS_PART][@N]`:
//! - `PHASE` names which write of the journal (default `done`):
//!   - `ahead`: the write-ahead mark before a step starts (`plan::MARK_PENDING` on a create of a
//!     kind whose objects carry no label, an address; `plan::MARK_RUN_STARTED` on a run of a
//!     recorded probe);
//!   - `done`: the record of a completed step;
//!   - `forget`: a step recorded ahead that returned an error, its record taken back;
//!   - `failed`: a run that failed on its own, its failure recorded (`plan::MARK_RUN_FAILED`);
//!   - `finalize`: the write after a successful apply's finalize (set-aside containers
//!     removed, outputs recorded); it belongs to no step, so `finalize` alone matches it;
//!   - `revert`: a complete rollback putting back the entries of the steps that failed;
//!   - `undo`: a rollback's record of one undone step (its entry back as before the apply);
//!   - `lineage`: the state written before the first step of a deployment's first apply (the
//!     lineage its containers will carry); it belongs to no step, so `lineage` alone matches.
//! - `ACTION` the action as plans spell it (`create`, `replace`, `update`, `delete`, `run`),
//!   or `*` (or nothing) for any;
//! - `ADDRESS_PART` a part of the step's address;
//! - `N` which matching write (from 1). The kill defaults to the first; the skip, without `@N`,
//!   skips every matching record.
//!
//! `replace:container.` kills after the first container replacement was recorded;
//! `ahead:create:attach` after an address add was recorded pending, before the address is
//! added. The skip takes several triggers separated by commas:
//! `SPARKFORM_CHAOS_SKIP_JOURNAL=ahead:create:attach,create:attach` leaves every address out of
//! the state. Unset they cost one environment look-up per process and do nothing.
//!
//! Only `sparkform-chaos` (this kit's build of the binary) and the tests install it
//! ([`install`]); the `sparkform` binary has no observer, so there the variables do nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use sparkform::apply::journal_hook::{JournalObserver, JournalWrite};
use sparkform::plan::Action;

pub const ENV: &str = "SPARKFORM_CHAOS_KILL_AFTER";
pub const SKIP_ENV: &str = "SPARKFORM_CHAOS_SKIP_JOURNAL";

const PHASES: [JournalWrite; 8] = [
    JournalWrite::Ahead,
    JournalWrite::Done,
    JournalWrite::Forget,
    JournalWrite::Failed,
    JournalWrite::Finalize,
    JournalWrite::Revert,
    JournalWrite::Undo,
    JournalWrite::Lineage,
];

#[derive(Debug)]
struct KillTrigger {
    phase: JournalWrite,
    /// Empty: any action.
    action: String,
    address_part: String,
    /// None: the kill's first, the skip's every one.
    nth: Option<usize>,
    /// Matching writes seen so far.
    seen: AtomicUsize,
}

fn parse(text: &str) -> Option<KillTrigger> {
    let text = text.trim();
    let (rest, nth) = match text.rsplit_once('@') {
        Some((r, n)) => (r, Some(n.parse().ok().filter(|n| *n >= 1)?)),
        None => (text, None),
    };
    let (first, after) = match rest.split_once(':') {
        Some((f, a)) => (f, Some(a)),
        None => (rest, None),
    };
    // Without a phase word the first part is the action, which is then needed.
    let (phase, rest, named) = match PHASES.iter().find(|p| p.word() == first) {
        Some(p) => (*p, after.unwrap_or(""), true),
        None => (JournalWrite::Done, rest, false),
    };
    let (action, address_part) = rest.split_once(':').unwrap_or((rest, ""));
    let action = if action == "*" { "" } else { action };
    if action.is_empty() && !named {
        return None;
    }
    Some(KillTrigger {
        phase,
        action: action.to_string(),
        address_part: address_part.to_string(),
        nth,
        seen: AtomicUsize::new(0),
    })
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
    fn matches(&self, phase: JournalWrite, action: Action, address: &str) -> bool {
        self.phase == phase
            && (self.action.is_empty() || self.action == action_name(action))
            && address.contains(&self.address_part)
    }

    /// A matching write: counted, and whether it is the one (or, without `@N` and
    /// `every`, each one) this trigger is for.
    fn hit(&self, phase: JournalWrite, action: Action, address: &str, every: bool) -> bool {
        if !self.matches(phase, action, address) {
            return false;
        }
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        match self.nth {
            Some(nth) => n == nth,
            None => every || n == 1,
        }
    }
}

fn kill_trigger() -> Option<&'static KillTrigger> {
    static TRIGGER: OnceLock<Option<KillTrigger>> = OnceLock::new();
    TRIGGER
        .get_or_init(|| std::env::var(ENV).ok().as_deref().and_then(parse))
        .as_ref()
}

fn skip_triggers() -> &'static [KillTrigger] {
    static TRIGGERS: OnceLock<Vec<KillTrigger>> = OnceLock::new();
    TRIGGERS.get_or_init(|| {
        std::env::var(SKIP_ENV)
            .map(|v| v.split(',').filter_map(parse).collect())
            .unwrap_or_default()
    })
}

/// Called after each journal write (the state on disk records it).
fn after_journal_write(phase: JournalWrite, action: Action, address: &str) {
    let Some(t) = kill_trigger() else { return };
    if !t.hit(phase, action, address, false) {
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

/// Whether the journal leaves this record out (a deliberately broken build).
fn skip_journal_record(phase: JournalWrite, action: Action, address: &str) -> bool {
    skip_triggers()
        .iter()
        .any(|t| t.hit(phase, action, address, true))
}

/// The observer the variables describe.
struct FromEnvironment;

impl JournalObserver for FromEnvironment {
    fn after_write(&self, write: JournalWrite, action: Action, address: &str) {
        after_journal_write(write, action, address);
    }

    fn skip_record(&self, write: JournalWrite, action: Action, address: &str) -> bool {
        skip_journal_record(write, action, address)
    }
}

/// Installs the observer that `SPARKFORM_CHAOS_KILL_AFTER` and `SPARKFORM_CHAOS_SKIP_JOURNAL`
/// describe, for this process; unset, it does nothing at a write.
pub fn install() {
    sparkform::apply::journal_hook::install_observer(Box::new(FromEnvironment));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(t: &KillTrigger) -> (JournalWrite, &str, &str, Option<usize>) {
        (t.phase, &t.action, &t.address_part, t.nth)
    }

    #[test]
    fn triggers_parse_and_match() {
        let t = parse("replace:container.@2").unwrap();
        assert_eq!(
            fields(&t),
            (JournalWrite::Done, "replace", "container.", Some(2))
        );
        assert!(t.matches(
            JournalWrite::Done,
            Action::Replace,
            "module.qwen.container.vllm"
        ));
        assert!(!t.matches(
            JournalWrite::Ahead,
            Action::Replace,
            "module.qwen.container.vllm"
        ));
        assert!(!t.matches(
            JournalWrite::Done,
            Action::Create,
            "module.qwen.container.vllm"
        ));
        assert!(!t.matches(
            JournalWrite::Done,
            Action::Replace,
            "network.roce.attach.node1"
        ));
        let any_create = parse("create").unwrap();
        assert!(any_create.matches(JournalWrite::Done, Action::Create, "network.roce.attach.n1"));
        assert_eq!(any_create.nth, None);
        assert!(parse("").is_none());
        assert!(parse("create@0").is_none());
        assert!(parse("create@x").is_none());
    }

    #[test]
    fn phases_parse_and_match() {
        let t = parse("ahead:create:attach").unwrap();
        assert_eq!(fields(&t), (JournalWrite::Ahead, "create", "attach", None));
        assert!(t.matches(
            JournalWrite::Ahead,
            Action::Create,
            "network.f.attach.node1"
        ));
        assert!(!t.matches(JournalWrite::Done, Action::Create, "network.f.attach.node1"));
        let run = parse("ahead:run:probe").unwrap();
        assert!(run.matches(JournalWrite::Ahead, Action::Run, "probe.hello"));
        let fin = parse("finalize").unwrap();
        assert_eq!(fields(&fin), (JournalWrite::Finalize, "", "", None));
        assert!(fin.matches(JournalWrite::Finalize, Action::NoOp, ""));
        assert!(!fin.matches(JournalWrite::Done, Action::Create, "probe.hello"));
        let any = parse("failed:*:probe@1").unwrap();
        assert_eq!(fields(&any), (JournalWrite::Failed, "", "probe", Some(1)));
        assert!(any.matches(JournalWrite::Failed, Action::Run, "probe.hello"));
        let revert = parse("revert:run").unwrap();
        assert!(revert.matches(JournalWrite::Revert, Action::Run, "probe.hello"));
        let undo = parse("undo:replace:container.head").unwrap();
        assert!(undo.matches(JournalWrite::Undo, Action::Replace, "container.head"));
        assert!(!undo.matches(JournalWrite::Done, Action::Replace, "container.head"));
        let lineage = parse("lineage").unwrap();
        assert!(lineage.matches(JournalWrite::Lineage, Action::NoOp, ""));
        assert!(!lineage.matches(JournalWrite::Finalize, Action::NoOp, ""));
        assert_eq!(
            fields(&parse("forget:create:attach").unwrap()).0,
            JournalWrite::Forget
        );
        // `done` spelled out, any action; a bare phase word of `done` needs none either.
        assert_eq!(
            fields(&parse("done").unwrap()),
            (JournalWrite::Done, "", "", None)
        );
        assert!(parse("*").is_none());
    }

    #[test]
    fn the_kill_takes_the_nth_and_the_skip_every_one() {
        let first = parse("create:attach").unwrap();
        let hit = |t: &KillTrigger, every| {
            t.hit(
                JournalWrite::Done,
                Action::Create,
                "network.f.attach.n1",
                every,
            )
        };
        assert!(hit(&first, false));
        assert!(!hit(&first, false));
        let every = parse("create:attach").unwrap();
        assert!(hit(&every, true) && hit(&every, true));
        let second = parse("create:attach@2").unwrap();
        assert!(!hit(&second, true));
        assert!(hit(&second, true));
        assert!(!hit(&second, true));
        // Other writes are not counted.
        assert!(!second.hit(
            JournalWrite::Ahead,
            Action::Create,
            "network.f.attach.n1",
            true
        ));
    }
}

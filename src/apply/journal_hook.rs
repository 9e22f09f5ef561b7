//! A seam at every write of the apply's journal, for the crash harness.
//!
//! The apply calls [`after_journal_write`] right after each write of its journal reached the
//! disk and asks [`skip_journal_record`] before each record. The product installs no observer,
//! so both do nothing (one atomic load each). `sparkform-chaos`, the test kit's build of the
//! binary (`testkit/`), installs one that kills the process with SIGKILL right after a chosen
//! write, or leaves chosen records out (a deliberately broken build the harness must report):
//! a kill lands exactly at a chosen transition instead of at a random instant. No build of the
//! `sparkform` binary contains such an observer, so no environment variable can make it kill
//! itself or skip a record (tests/fake/layering.rs).

use std::sync::OnceLock;

use crate::plan::Action;

/// Which write of the journal a hook is called at (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalWrite {
    /// The write-ahead mark before a step starts.
    Ahead,
    /// The record of a completed step.
    Done,
    /// A step recorded ahead that returned an error: its record taken back.
    Forget,
    /// A run's own failure recorded.
    Failed,
    /// The write after the apply's finalize.
    Finalize,
    /// A complete rollback putting back the entries of the steps that failed.
    Revert,
    /// A rollback's record of one undone step.
    Undo,
    /// The state written before the first step, holding the lineage.
    Lineage,
}

impl JournalWrite {
    /// The phase word of a trigger.
    pub fn word(self) -> &'static str {
        match self {
            JournalWrite::Ahead => "ahead",
            JournalWrite::Done => "done",
            JournalWrite::Forget => "forget",
            JournalWrite::Failed => "failed",
            JournalWrite::Finalize => "finalize",
            JournalWrite::Revert => "revert",
            JournalWrite::Undo => "undo",
            JournalWrite::Lineage => "lineage",
        }
    }
}

/// What the crash harness puts at the journal's writes (see the module's documentation).
pub trait JournalObserver: Send + Sync {
    /// Called after a write of the journal reached the disk.
    fn after_write(&self, write: JournalWrite, action: Action, address: &str);
    /// Whether this record is to be left out, in memory and on disk.
    fn skip_record(&self, write: JournalWrite, action: Action, address: &str) -> bool;
}

static OBSERVER: OnceLock<Box<dyn JournalObserver>> = OnceLock::new();

/// Installs the process's journal observer, once; false when one was already installed.
pub fn install_observer(observer: Box<dyn JournalObserver>) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// Called after each journal write (the state on disk records it).
#[inline]
pub fn after_journal_write(write: JournalWrite, action: Action, address: &str) {
    if let Some(o) = OBSERVER.get() {
        o.after_write(write, action, address);
    }
}

/// Whether this journal record is to be left out; never without an observer.
#[inline]
pub fn skip_journal_record(write: JournalWrite, action: Action, address: &str) -> bool {
    OBSERVER
        .get()
        .is_some_and(|o| o.skip_record(write, action, address))
}

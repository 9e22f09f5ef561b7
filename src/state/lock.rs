//! State locking.
//!
//! The lock is `<state>.lock`, a JSON [`LockInfo`] describing the holder,
//! plus an OS advisory lock (`File::try_lock`, i.e. `flock` on Unix) on that
//! file held for the lifetime of [`StateLock`]. The OS lock is what excludes
//! other processes; the JSON is for humans and for `force-unlock`. Because
//! the OS releases the lock when its holder dies, a lock file left behind by
//! a killed process is taken over automatically (reported in
//! [`StateLock::took_over`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::{io_err, parent_dir, StateError, SPARKFORM_VERSION};

/// How many times to re-open the lock file when it is replaced under us.
const MAX_OPEN_ATTEMPTS: u32 = 50;
/// How many times to re-read the holder's info while it is being written.
const MAX_INFO_READS: u32 = 50;
const INFO_READ_PAUSE: Duration = Duration::from_millis(10);

/// Contents of the lock file: who holds the lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// UUID v4, what `sparkform force-unlock` takes.
    pub id: String,
    pub host: String,
    pub pid: u32,
    /// RFC 3339, UTC.
    pub started: String,
    /// e.g. `"apply"`.
    pub operation: String,
    /// sparkform version of the holder.
    #[serde(default)]
    pub version: String,
}

impl LockInfo {
    pub(super) fn new(operation: &str) -> Self {
        LockInfo {
            id: uuid::Uuid::new_v4().to_string(),
            host: this_host(),
            pid: std::process::id(),
            started: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            operation: operation.to_string(),
            version: SPARKFORM_VERSION.to_string(),
        }
    }
}

/// A held state lock. Dropping it removes the lock file (if it is still
/// ours) and releases the OS lock; [`StateLock::release`] does the same but
/// reports errors.
#[derive(Debug)]
pub struct StateLock {
    /// Kept open: closing it releases the OS lock.
    file: Option<File>,
    /// The lock of a backend other than the local file (PostgreSQL's session lock).
    remote: Option<Box<dyn RemoteLock>>,
    path: PathBuf,
    info: LockInfo,
    /// Set when a stale lock file (left by a process that no longer holds
    /// the OS lock, e.g. one that was killed) was taken over; the CLI should
    /// warn about it. `None` also when the stale file was empty or unreadable.
    pub took_over: Option<LockInfo>,
}

impl StateLock {
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the lock file and releases the lock, reporting errors.
    pub fn release(mut self) -> Result<(), StateError> {
        self.release_inner()
    }

    /// A lock held by another backend, for the life of `remote`.
    pub(super) fn remote(
        remote: Box<dyn RemoteLock>,
        place: PathBuf,
        info: LockInfo,
        took_over: Option<LockInfo>,
    ) -> Self {
        StateLock {
            file: None,
            remote: Some(remote),
            path: place,
            info,
            took_over,
        }
    }

    fn release_inner(&mut self) -> Result<(), StateError> {
        if let Some(mut remote) = self.remote.take() {
            return remote.release();
        }
        let Some(file) = self.file.take() else {
            return Ok(());
        };
        // Remove the file while still holding the OS lock, and only if it is
        // still ours: after a `force-unlock` it may belong to someone else.
        let ours = same_file(&file, &self.path).map_err(|e| io_err(&self.path, e))?
            && matches!(read_info_at(&self.path), Ok(Some(i)) if i.id == self.info.id);
        let result = if ours {
            match fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&self.path, e)),
                _ => Ok(()),
            }
        } else {
            Ok(())
        };
        // Closing the file releases the OS lock either way.
        let _ = file.unlock();
        drop(file);
        result
    }
}

/// A lock held elsewhere than in a local file; released once, by `release` or on drop.
pub(crate) trait RemoteLock: Send + Sync + std::fmt::Debug {
    fn release(&mut self) -> Result<(), StateError>;
}

impl Drop for StateLock {
    fn drop(&mut self) {
        let _ = self.release_inner();
    }
}

/// Is the open `file` still the one at `path` (not unlinked/replaced)?
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let ours = file.metadata()?;
    match fs::metadata(path) {
        Ok(theirs) => Ok(ours.dev() == theirs.dev() && ours.ino() == theirs.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Open files cannot be unlinked on other platforms.
#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> io::Result<bool> {
    Ok(path.exists())
}

fn read_from(file: &mut File) -> io::Result<String> {
    file.seek(SeekFrom::Start(0))?;
    let mut s = String::new();
    file.read_to_string(&mut s)?;
    Ok(s)
}

/// Reads and parses the lock file at `path`; `Ok(None)` if it is missing.
fn read_info_at(path: &Path) -> Result<Option<LockInfo>, StateError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| StateError::LockCorrupt {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// Takes the state lock for `operation` (e.g. `"apply"`), failing fast
/// with [`StateError::Locked`] if another process holds it.
pub(super) fn lock_file(path: PathBuf, operation: &str) -> Result<StateLock, StateError> {
    let dir = parent_dir(&path);
    fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;

    for _ in 0..MAX_OPEN_ATTEMPTS {
        // Never truncate before holding the OS lock: the file may hold
        // the current holder's info.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(holder_error(&path, &mut file)),
            Err(fs::TryLockError::Error(e)) => return Err(io_err(&path, e)),
        }
        // The previous holder may have unlinked the file between our open
        // and our lock (or force-unlock may have): then we locked an
        // orphan inode, and someone else can create a new file. Retry.
        if !same_file(&file, &path).map_err(|e| io_err(&path, e))? {
            continue;
        }

        // We hold it. Whatever is in the file was left by a process that
        // no longer holds the OS lock.
        let previous = read_from(&mut file).map_err(|e| io_err(&path, e))?;
        let took_over = serde_json::from_str::<LockInfo>(&previous).ok();

        let info = LockInfo::new(operation);
        let mut doc =
            serde_json::to_vec_pretty(&info).map_err(|e| io_err(&path, io::Error::other(e)))?;
        doc.push(b'\n');
        let written = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(&doc))
            .and_then(|()| file.sync_all());
        let lock = StateLock {
            file: Some(file),
            remote: None,
            path: path.clone(),
            info,
            took_over,
        };
        // On failure, dropping `lock` cleans up (the id check fails on a
        // partial write, so the file is left for the next taker).
        written.map_err(|e| io_err(&path, e))?;
        return Ok(lock);
    }
    Err(StateError::LockBusy { path })
}

/// Removes the lock file if its ID is `id`, returning what it contained.
///
/// A lock whose holder still holds the OS lock (an operation is running) is refused with
/// [`StateError::LockLive`] unless `force`: removing it would let a second writer in
/// beside the first. With `force` the file is removed anyway, and a new `lock()` succeeds
/// alongside the old holder, which then does not remove the new holder's file when it
/// finishes.
pub(super) fn force_unlock_file(
    path: PathBuf,
    id: &str,
    force: bool,
) -> Result<LockInfo, StateError> {
    let info = read_info_at(&path)?.ok_or_else(|| StateError::NotLocked { path: path.clone() })?;
    if info.id != id {
        return Err(StateError::LockIdMismatch {
            path,
            expected: id.to_string(),
            found: info.id,
        });
    }
    if !force && os_lock_held(&path)? {
        let process = holder_process(&info).describe(&info);
        return Err(StateError::LockLive {
            path,
            holder: Box::new(info),
            process,
        });
    }
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&path, e)),
        _ => Ok(info),
    }
}

/// The current lock file's contents, `Ok(None)` if there is none. A file
/// may remain after its holder was killed; [`StateStore::lock_status`]
/// tells whether it is live.
pub(super) fn read_lock_info_file(path: &Path) -> Result<Option<LockInfo>, StateError> {
    read_info_at(path)
}

/// Whether an operation holds the lock now, left a stale lock file, or neither. Reading
/// commands (plan) use it to say that an apply is running.
pub(super) fn lock_status_file(path: PathBuf) -> Result<LockStatus, StateError> {
    let info = match read_info_at(&path) {
        Ok(Some(info)) => info,
        Ok(None) => return Ok(LockStatus::Free),
        // A holder that is still writing its info holds the OS lock already.
        Err(StateError::LockCorrupt { .. }) if os_lock_held(&path)? => {
            return Ok(LockStatus::Starting)
        }
        Err(e) => return Err(e),
    };
    Ok(if os_lock_held(&path)? {
        LockStatus::Held(info)
    } else {
        LockStatus::Stale(info)
    })
}

/// Who holds the state lock, as a reading command sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockStatus {
    /// No lock file: no operation is running.
    Free,
    /// A process holds the OS lock: this operation is running.
    Held(LockInfo),
    /// A process holds the OS lock and has not written its info yet.
    Starting,
    /// A lock file whose holder no longer holds the OS lock (it was killed): the next writer
    /// takes it over.
    Stale(LockInfo),
}

impl LockStatus {
    /// One line for a reading command, `None` when nothing holds the lock.
    pub fn note(&self) -> Option<String> {
        match self {
            LockStatus::Free => None,
            LockStatus::Starting => Some(
                "Note: another sparkform operation is just starting on this state; the machines may be changing."
                    .into(),
            ),
            LockStatus::Held(h) => Some(format!(
                "Note: the state is locked: `{}` has been running since {} (PID {} on {}, lock ID {}); the machines may be changing while this plan looks at them.",
                h.operation, h.started, h.pid, h.host, h.id
            )),
            LockStatus::Stale(h) => Some(format!(
                "Note: a stale state lock was left by `{}` started at {} (PID {} on {}, lock ID {}), which is no longer running; the next apply takes it over and this plan shows what it left.",
                h.operation, h.started, h.pid, h.host, h.id
            )),
        }
    }
}

/// What the recorded holder's process is, as far as this machine can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderProcess {
    /// It runs here and is a sparkform.
    Sparkform,
    /// Its PID runs here, as another program (a library caller, or the PID was reused): named.
    Other(String),
    /// No process has its PID here.
    Gone,
    /// It recorded another host: its process cannot be seen from here.
    Elsewhere,
}

impl HolderProcess {
    pub(crate) fn describe(&self, info: &LockInfo) -> String {
        match self {
            HolderProcess::Sparkform => format!("PID {} is a running sparkform", info.pid),
            HolderProcess::Other(name) => format!("PID {} runs `{name}`", info.pid),
            HolderProcess::Gone => format!(
                "PID {} is gone, but the lock is held by a live process (one sharing its lock file)",
                info.pid
            ),
            HolderProcess::Elsewhere => format!(
                "the holder runs on {}, and the lock is held there",
                info.host
            ),
        }
    }
}

fn this_host() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Whether the holder's PID is alive on this machine and is a sparkform.
pub fn holder_process(info: &LockInfo) -> HolderProcess {
    if info.host != this_host() {
        return HolderProcess::Elsewhere;
    }
    let proc_dir = PathBuf::from(format!("/proc/{}", info.pid));
    if !proc_dir.exists() {
        return HolderProcess::Gone;
    }
    // `comm` is cut at 15 bytes; the executable's name is whole when it is readable.
    let exe = fs::read_link(proc_dir.join("exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let comm = fs::read_to_string(proc_dir.join("comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default();
    let name = exe.unwrap_or(comm);
    if name.starts_with("sparkform") {
        HolderProcess::Sparkform
    } else {
        HolderProcess::Other(name)
    }
}

/// Whether some process holds the OS lock on `path`: a shared lock is refused only while an
/// exclusive one is held. Taken and dropped at once (a writer starting in that instant finds
/// the state locked and can retry).
fn os_lock_held(path: &Path) -> Result<bool, StateError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path, e)),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(false)
        }
        Err(fs::TryLockError::WouldBlock) => Ok(true),
        Err(fs::TryLockError::Error(e)) => Err(io_err(path, e)),
    }
}

/// Builds the error for a lock held by someone else, waiting briefly for the
/// holder to finish writing its info.
fn holder_error(path: &Path, file: &mut File) -> StateError {
    for attempt in 0..MAX_INFO_READS {
        if attempt > 0 {
            std::thread::sleep(INFO_READ_PAUSE);
        }
        match read_from(file) {
            Ok(text) => {
                if let Ok(holder) = serde_json::from_str::<LockInfo>(&text) {
                    return StateError::Locked {
                        path: path.to_path_buf(),
                        holder: Box::new(holder),
                    };
                }
            }
            Err(e) => return io_err(path, e),
        }
    }
    StateError::LockBusy {
        path: path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateStore;

    fn store() -> (tempfile::TempDir, StateStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state.json"));
        (dir, store)
    }

    fn stale_info() -> LockInfo {
        LockInfo {
            id: "11111111-2222-4333-8444-555555555555".into(),
            host: "deadhost".into(),
            pid: 424242,
            started: "2024-01-02T03:04:05Z".into(),
            operation: "apply".into(),
            version: "0.0.1".into(),
        }
    }

    #[test]
    fn lock_writes_info() {
        let (_dir, store) = store();
        let lock = store.lock("plan").unwrap();
        assert!(lock.took_over.is_none());
        let info = lock.info().clone();
        assert_eq!(info.pid, std::process::id());
        assert_eq!(info.operation, "plan");
        assert_eq!(info.version, SPARKFORM_VERSION);
        assert!(uuid::Uuid::parse_str(&info.id).is_ok());
        assert!(chrono::DateTime::parse_from_rfc3339(&info.started).is_ok());
        assert!(info.started.ends_with('Z'));
        assert!(!info.host.is_empty());
        assert_eq!(store.read_lock_info().unwrap(), Some(info));
        assert_eq!(lock.path(), store.lock_path());
    }

    #[test]
    fn second_lock_fails_with_holder() {
        // flock locks belong to the open file description, so a second
        // open() in the same process conflicts just like another process.
        let (_dir, store) = store();
        let first = store.lock("apply").unwrap();
        let err = store.lock("destroy").unwrap_err();
        match &err {
            StateError::Locked { holder, path } => {
                assert_eq!(**holder, *first.info());
                assert_eq!(holder.pid, std::process::id());
                assert_eq!(holder.operation, "apply");
                assert_eq!(*path, store.lock_path());
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        let msg = err.to_string();
        for part in [
            &first.info().host,
            &first.info().pid.to_string(),
            &first.info().started,
            &first.info().operation,
            &first.info().id,
        ] {
            assert!(msg.contains(part.as_str()), "{msg} lacks {part}");
        }
        let help = miette::Diagnostic::help(&err).unwrap().to_string();
        assert!(
            help.contains(&format!("sparkform force-unlock {}", first.info().id)),
            "{help}"
        );
        // The failed attempt did not disturb the holder's file.
        assert_eq!(store.read_lock_info().unwrap().as_ref(), Some(first.info()));
        drop(first);
        store.lock("destroy").unwrap();
    }

    #[test]
    fn drop_removes_lock_file() {
        let (_dir, store) = store();
        let lock = store.lock("apply").unwrap();
        assert!(store.lock_path().exists());
        drop(lock);
        assert!(!store.lock_path().exists());
        assert_eq!(store.read_lock_info().unwrap(), None);
        let lock = store.lock("apply").unwrap();
        lock.release().unwrap();
        assert!(!store.lock_path().exists());
    }

    #[test]
    fn stale_lock_file_is_taken_over() {
        let (_dir, store) = store();
        let stale = stale_info();
        fs::write(store.lock_path(), serde_json::to_vec(&stale).unwrap()).unwrap();
        let lock = store.lock("apply").unwrap();
        assert_eq!(lock.took_over.as_ref(), Some(&stale));
        assert_ne!(lock.info().id, stale.id);
        // The file now holds our info, fully replacing the (longer) old one.
        assert_eq!(store.read_lock_info().unwrap().as_ref(), Some(lock.info()));
    }

    #[test]
    fn empty_stale_lock_file_is_taken_over_without_info() {
        let (_dir, store) = store();
        fs::write(store.lock_path(), "").unwrap();
        let lock = store.lock("apply").unwrap();
        assert!(lock.took_over.is_none());
        assert_eq!(store.read_lock_info().unwrap().as_ref(), Some(lock.info()));
    }

    #[test]
    fn force_unlock() {
        let (_dir, store) = store();
        assert!(matches!(
            store.force_unlock("nope", false),
            Err(StateError::NotLocked { .. })
        ));

        let stale = stale_info();
        fs::write(store.lock_path(), serde_json::to_vec(&stale).unwrap()).unwrap();
        match store.force_unlock("wrong", false) {
            Err(StateError::LockIdMismatch {
                expected, found, ..
            }) => {
                assert_eq!(expected, "wrong");
                assert_eq!(found, stale.id);
            }
            other => panic!("expected LockIdMismatch, got {other:?}"),
        }
        assert!(store.lock_path().exists());
        // Nobody holds the OS lock: the holder is gone, no -force needed.
        assert_eq!(
            store.lock_status().unwrap(),
            LockStatus::Stale(stale.clone())
        );
        assert_eq!(store.force_unlock(&stale.id, false).unwrap(), stale);
        assert!(!store.lock_path().exists());
        assert_eq!(store.lock_status().unwrap(), LockStatus::Free);
    }

    #[test]
    fn force_unlock_refuses_a_live_holder_unless_forced() {
        let (_dir, store) = store();
        let old = store.lock("apply").unwrap();
        let id = old.info().id.clone();
        assert_eq!(
            store.lock_status().unwrap(),
            LockStatus::Held(old.info().clone())
        );
        match store.force_unlock(&id, false) {
            Err(e @ StateError::LockLive { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&id) && msg.contains("apply"), "{msg}");
                // This test process holds it; it is not a sparkform binary by name unless the
                // test binary is (cargo names it sparkform-HASH), so only its PID is asserted.
                assert!(msg.contains(&std::process::id().to_string()), "{msg}");
                let help = miette::Diagnostic::help(&e).unwrap().to_string();
                assert!(help.contains("-force"), "{help}");
            }
            other => panic!("a live holder's lock was removed: {other:?}"),
        }
        // Still there and still ours.
        assert_eq!(store.read_lock_info().unwrap().as_ref(), Some(old.info()));
        assert!(matches!(
            store.lock("apply"),
            Err(StateError::Locked { .. })
        ));
        // With -force it goes, and a new lock succeeds (terraform-like); the old holder
        // finishing must not remove the new holder's file.
        assert_eq!(store.force_unlock(&id, true).unwrap().id, id);
        assert!(!store.lock_path().exists());
        let new = store.lock("apply").unwrap();
        drop(old);
        assert_eq!(store.read_lock_info().unwrap().as_ref(), Some(new.info()));
        drop(new);
        assert!(!store.lock_path().exists());
    }

    #[test]
    fn the_holder_process_is_told_apart() {
        let mut me = stale_info();
        me.host = this_host();
        me.pid = std::process::id();
        // The unit tests run in `sparkform-HASH`.
        assert_eq!(holder_process(&me), HolderProcess::Sparkform);
        me.pid = 1;
        assert!(matches!(holder_process(&me), HolderProcess::Other(_)));
        // PIDs stop below 2^22 on Linux.
        me.pid = 4_194_304 + 7;
        assert_eq!(holder_process(&me), HolderProcess::Gone);
        assert_eq!(holder_process(&stale_info()), HolderProcess::Elsewhere);
    }

    #[test]
    fn lock_notes_say_who_runs_since_when_or_that_the_lock_is_stale() {
        let info = stale_info();
        assert_eq!(LockStatus::Free.note(), None);
        let held = LockStatus::Held(info.clone()).note().unwrap();
        assert!(
            held.contains("`apply` has been running since 2024-01-02T03:04:05Z")
                && held.contains("PID 424242 on deadhost"),
            "{held}"
        );
        let stale = LockStatus::Stale(info).note().unwrap();
        assert!(
            stale.contains("stale") && stale.contains("no longer running"),
            "{stale}"
        );
    }

    #[test]
    fn corrupt_lock_file_is_reported() {
        let (_dir, store) = store();
        fs::write(store.lock_path(), "garbage").unwrap();
        assert!(matches!(
            store.read_lock_info(),
            Err(StateError::LockCorrupt { .. })
        ));
        assert!(matches!(
            store.force_unlock("x", false),
            Err(StateError::LockCorrupt { .. })
        ));
    }
}

//! The warm mode (`--persist DURATION`, or `SPARKFORM_PERSIST`): each master connection is kept
//! after the command that opened it, for the next command to reuse, and ends by itself once it
//! has been idle for the bound. Without the setting nothing here runs and every connection ends
//! with its command (`lifetime`).
//!
//! The keeper of a warm connection is its ssh master itself: started with
//! `ControlPersist=BOUND`, it counts its own idle time (no client, no channel) and exits at the
//! bound, whatever became of the command that started it. Each lives in a folder of its own
//! under the user's warm folder (`$XDG_RUNTIME_DIR/sparkform-warm`, else
//! `/tmp/sparkform-warm-UID`, mode 0700, refused when anyone else could enter it), named by a
//! hash of what sparkform's generated ssh config says of the connection (address, user, port,
//! key, known hosts file, jump host, host-key mode, the user's ssh config file's path) and the
//! bound: a changed definition never reuses a connection made for another. Edits inside the
//! user's ssh config or known hosts file do not change the name: they reach kept connections
//! after `sparkform connections -close`. A master is reused only after a command through it
//! answers (a master whose machine went away still answers locally for a while); a command that
//! finds a folder whose master died (killed, machine rebooted) reaps it; `sparkform
//! connections` lists the folders and `-close` ends them.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// The shortest bound: a master must outlive the moment between `ssh -f` returning and the
/// command connecting its lifeline, as `lifetime::PERSIST_SECS` says.
pub const MIN_PERSIST: Duration = Duration::from_secs(10);
/// The longest bound: a warm connection is a convenience between commands, not a service.
pub const MAX_PERSIST: Duration = Duration::from_secs(3600);

const MASTER: &str = "master";
const INFO: &str = "info.json";
const LOCK: &str = "lock";

/// `60s`, `5m`, `1h`, or a number of seconds; `0` or `off` for none (the default). Bounded to
/// [`MIN_PERSIST`]..=[`MAX_PERSIST`].
pub fn parse_persist(text: &str) -> Result<Option<Duration>, String> {
    let t = text.trim();
    if t.is_empty() || t == "0" || t.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write e.g. 60s, 5m or 1h (or off)"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is not a duration: write e.g. 60s, 5m or 1h (or off)"))?;
    let d = Duration::from_secs(secs);
    if d < MIN_PERSIST || d > MAX_PERSIST {
        return Err(format!(
            "{text:?} is outside {} s to {} s: a warm connection is kept between {} s and an hour",
            MIN_PERSIST.as_secs(),
            MAX_PERSIST.as_secs(),
            MIN_PERSIST.as_secs()
        ));
    }
    Ok(Some(d))
}

/// The user's warm folder, where it would be (nothing is created).
pub fn root_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_dir()) {
        Some(d) => Path::new(&d).join("sparkform-warm"),
        None => PathBuf::from(format!("/tmp/sparkform-warm-{}", my_uid())),
    }
}

/// This process's effective user.
fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// The user's warm folder, created when missing; refused when it is a link, is not the user's,
/// or lets anyone else in (its control sockets run commands as the user on every node).
pub fn root() -> Result<PathBuf, String> {
    let root = root_path();
    match std::fs::DirBuilder::new().mode(0o700).create(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", root.display())),
    }
    check_private(&root)?;
    Ok(root)
}

fn check_private(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let me = my_uid();
    let fix = "set XDG_RUNTIME_DIR to a folder of your own (the warm folder goes there), or do not ask for kept connections (--persist, SPARKFORM_PERSIST)";
    if !meta.is_dir() {
        return Err(format!(
            "{} is not a folder (a link or a file), so it cannot hold kept connections: remove it if it is yours, or {fix}",
            dir.display()
        ));
    }
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to you (uid {me}): kept connections need a folder of your own; {fix}",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} has mode {:o}: others may enter it, and a kept connection's socket runs commands as you; `chmod 700` it, or {fix}",
            dir.display(),
            meta.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

/// What a warm folder says about its connection, for `sparkform connections`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Info {
    /// The node's address (`node.spark1`) or the jump host's (`jump.bastion`).
    pub address: String,
    /// The machine, as the definitions name it (`user@host:port`).
    pub target: String,
    pub via: Option<String>,
    pub persist_secs: u64,
    /// When the master started, in seconds since the epoch.
    pub started: u64,
}

/// One warm connection's folder.
#[derive(Debug, Clone)]
pub struct Slot {
    pub dir: PathBuf,
    pub persist: Duration,
}

impl Slot {
    /// The folder of the connection made with `settings` (every setting that shapes it).
    pub fn new(root: &Path, settings: &str, persist: Duration) -> Slot {
        let mut h = sha2::Sha256::new();
        h.update(settings.as_bytes());
        h.update(format!("\npersist {}", persist.as_secs()).as_bytes());
        let hex: String = h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Slot {
            dir: root.join(hex),
            persist,
        }
    }

    pub fn master(&self) -> PathBuf {
        self.dir.join(MASTER)
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// Hold the folder alone (another command may be starting its master): waits up to
    /// `limit`. The folder exists while the guard lives.
    pub async fn lock(&self, limit: Duration) -> Result<SlotGuard, String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match try_lock(&self.dir) {
                Ok(Some(file)) => return Ok(SlotGuard { _file: file }),
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Ok(None) => {
                    return Err(format!(
                        "another sparkform held {} for {} s",
                        self.dir.display(),
                        limit.as_secs()
                    ))
                }
                Err(e) => return Err(format!("cannot use {}: {e}", self.dir.display())),
            }
        }
    }

    pub fn write_info(&self, info: &Info) {
        if let Ok(text) = serde_json::to_string(info) {
            let tmp = self.dir.join("info.tmp");
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(tmp, self.dir.join(INFO));
            }
        }
    }
}

/// The lock of a slot's folder, released on drop.
pub struct SlotGuard {
    _file: File,
}

/// Lock `dir/lock`, creating the folder; `None` while another process holds it. A lock taken
/// on a folder that a reaper removed meanwhile is let go and taken again on the new one.
fn try_lock(dir: &Path) -> std::io::Result<Option<File>> {
    loop {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = dir.join(LOCK);
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            // A reaper removed the folder between the two: make it again.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let same = std::fs::metadata(&path)
            .ok()
            .zip(file.metadata().ok())
            .is_some_and(|(a, b)| a.ino() == b.ino() && a.dev() == b.dev());
        if same {
            return Ok(Some(file));
        }
    }
}

/// Whether a master answers on `ctl` (a native mux alive check: no process started).
pub async fn answers(ctl: &Path) -> bool {
    if !ctl.exists() {
        return false;
    }
    let session = openssh::Session::resume_mux(ctl.into(), None);
    matches!(
        tokio::time::timeout(Duration::from_secs(2), session.check()).await,
        Ok(Ok(()))
    )
}

/// One warm folder as `sparkform connections` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub dir: PathBuf,
    /// None for a folder without a readable record (being created, or damaged).
    pub info: Option<Info>,
    pub alive: bool,
}

/// The warm folders under `root`, each checked; the dead ones (no master answers, and no other
/// command holds the folder) are removed and listed with `alive: false`.
pub async fn list(root: &Path) -> Vec<Listed> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return out;
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
                && p.file_name().is_some_and(|n| {
                    n.len() == 16 && n.to_string_lossy().chars().all(|c| c.is_ascii_hexdigit())
                })
        })
        .collect();
    dirs.sort();
    for dir in dirs {
        let info = std::fs::read_to_string(dir.join(INFO))
            .ok()
            .and_then(|t| serde_json::from_str::<Info>(&t).ok());
        let mut alive = answers(&dir.join(MASTER)).await;
        if !alive {
            match try_lock(&dir) {
                // Nobody is starting it now; asked again under the lock, for a command that
                // started it meanwhile and let go.
                Ok(Some(_held)) => {
                    alive = answers(&dir.join(MASTER)).await;
                    if !alive {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                }
                // Another command is starting it right now: not ours to judge.
                _ => continue,
            }
        }
        let info = if alive {
            std::fs::read_to_string(dir.join(INFO))
                .ok()
                .and_then(|t| serde_json::from_str::<Info>(&t).ok())
                .or(info)
        } else {
            info
        };
        out.push(Listed { dir, info, alive });
    }
    out
}

/// End every warm connection under `root` now (`ssh -O exit`, at once) and remove the
/// folders; what was there, as [`list`] saw it.
pub async fn close_all(root: &Path) -> Vec<Listed> {
    let listed = list(root).await;
    let alive: Vec<PathBuf> = listed
        .iter()
        .filter(|l| l.alive)
        .map(|l| l.dir.join(MASTER))
        .collect();
    let ends = alive.iter().map(|ctl| {
        let mut c = tokio::process::Command::from(super::lifetime::exit_command(ctl));
        c.kill_on_drop(true);
        async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), c.status()).await;
        }
    });
    futures_util::future::join_all(ends).await;
    for l in listed.iter().filter(|l| l.alive) {
        // Under the folder's lock, so a command starting a new master there is not cut off;
        // one that holds it keeps its folder (its master is new, and ends when idle).
        if let Ok(Some(_held)) = try_lock(&l.dir) {
            let _ = std::fs::remove_dir_all(&l.dir);
        }
    }
    listed
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_bounds() {
        assert_eq!(parse_persist("off"), Ok(None));
        assert_eq!(parse_persist("0"), Ok(None));
        assert_eq!(parse_persist("60s"), Ok(Some(Duration::from_secs(60))));
        assert_eq!(parse_persist("90"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(parse_persist("5m"), Ok(Some(Duration::from_secs(300))));
        assert_eq!(parse_persist("1h"), Ok(Some(Duration::from_secs(3600))));
        for bad in [
            "5s",
            "2h",
            "ten",
            "10 s",
            "-1",
            "1d",
            "99999999999999999999h",
        ] {
            let e = parse_persist(bad).unwrap_err();
            assert!(e.contains(bad) || e.contains("outside"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_setting_changed_is_another_folder() {
        let slot = |host: &str, secs: u64| {
            let text = format!("Host a\n  HostName {host}\n");
            Slot::new(Path::new("/r"), &text, Duration::from_secs(secs))
        };
        let a = slot("10.0.0.1", 60);
        let same = slot("10.0.0.1", 60);
        let other_host = slot("10.0.0.2", 60);
        let other_bound = slot("10.0.0.1", 61);
        assert_eq!(a.dir, same.dir);
        assert_ne!(a.dir, other_host.dir);
        assert_ne!(a.dir, other_bound.dir);
        assert_eq!(a.dir.parent(), Some(Path::new("/r")));
        assert_eq!(a.dir.file_name().map(|n| n.len()), Some(16));
    }

    #[test]
    fn a_folder_others_may_enter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let warm = dir.path().join("w");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&warm)
            .unwrap();
        assert_eq!(check_private(&warm), Ok(()));
        std::fs::set_permissions(&warm, std::fs::Permissions::from_mode(0o770)).unwrap();
        let e = check_private(&warm).unwrap_err();
        assert!(e.contains("others may enter") && e.contains("770"), "{e}");
        assert!(e.contains("XDG_RUNTIME_DIR"), "{e}");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(check_private(&link).unwrap_err().contains("not a folder"));
    }

    #[tokio::test]
    async fn a_dead_masters_folder_is_reaped_and_a_held_one_is_left() {
        let root = tempfile::tempdir().unwrap();
        let dead = Slot::new(root.path(), "dead", MIN_PERSIST);
        let held = Slot::new(root.path(), "held", MIN_PERSIST);
        for s in [&dead, &held] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&s.dir)
                .unwrap();
            // A socket nobody listens on any more: what a killed master leaves.
            drop(std::os::unix::net::UnixListener::bind(s.master()).unwrap());
            s.write_info(&Info {
                address: "node.a".into(),
                target: "a".into(),
                via: None,
                persist_secs: 10,
                started: 1,
            });
        }
        let _guard = held.lock(Duration::from_secs(1)).await.unwrap();
        let listed = list(root.path()).await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(!listed[0].alive);
        assert_eq!(
            listed[0].info.as_ref().map(|i| i.address.as_str()),
            Some("node.a")
        );
        assert!(!dead.dir.exists(), "the dead master's folder is reaped");
        assert!(held.dir.exists(), "a folder another command holds is left");
        // Locked by someone else: a second lock waits, then says so.
        let e = held.lock(Duration::from_millis(100)).await.err().unwrap();
        assert!(e.contains("another sparkform"), "{e}");
    }
}

//! Nothing sparkform starts on this machine outlives it, however it ends.
//!
//! ssh masters run in the background (`-f`) and are no children of sparkform, so its death does
//! not reach them by itself. Three things bound them:
//! - **A lifeline**: sparkform holds one idle connection to every master's control socket. A
//!   master counts a connected multiplexing client as an open channel, so its bounded
//!   `ControlPersist` never runs down while sparkform lives; when sparkform dies, for any reason,
//!   the kernel closes the lifeline (and every forwarded socket connection) and the master exits
//!   [`PERSIST_SECS`] later. A forward's listening socket does not count as a client, so a dead
//!   sparkform's Docker socket forward does not keep its master alive.
//! - **A janitor**: a small shell process, in its own process group (so the terminal's Ctrl-C
//!   does not reach it), reads the control folders from a pipe whose only writer is sparkform.
//!   When the pipe closes (sparkform exited, was interrupted, killed, or called `exit`), it ends
//!   their masters at once with `ssh -O exit` and removes the folders, then exits itself.
//! - **A sweep** at the creation of the first control folder: folders of sparkform processes
//!   that are gone (their janitor killed with them) are emptied the same way.
//!
//! [`shutdown`] does the janitor's work synchronously, for a caller about to `exit`.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

/// How long a master lives after its last client (the lifeline included) is gone. Long enough
/// for sparkform to connect its lifeline after `ssh -f` returns on a loaded machine.
pub const PERSIST_SECS: u64 = 10;

/// Where control folders go: unix socket paths are limited to 108 bytes, so a short root.
const ROOT: &str = "/tmp";
/// Every control folder's name starts with this; the janitor and the sweep touch nothing else.
const PREFIX: &str = "sf";
/// The file in a control folder that names the process owning it: `PID STARTTIME`.
const OWNER: &str = "owner";

#[derive(Default)]
struct Registry {
    lifelines: HashMap<PathBuf, UnixStream>,
    /// Lifelines of warm masters (`warm`): dropped with the process, their masters not ended.
    held: HashMap<PathBuf, UnixStream>,
    dirs: Vec<PathBuf>,
    janitor: Option<(Child, ChildStdin)>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static SWEEP: Once = Once::new();

fn registry() -> MutexGuard<'static, Option<Registry>> {
    // A panic elsewhere while holding the lock leaves data that is still consistent.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut g = registry();
    f(g.get_or_insert_with(Registry::default))
}

/// The options that start a background master connection whose life is bounded as above.
pub fn master_options() -> Vec<String> {
    master_options_persisting(Duration::from_secs(PERSIST_SECS))
}

/// [`master_options`] with another idle bound: a warm master's (`warm`).
pub fn master_options_persisting(persist: Duration) -> Vec<String> {
    [
        "-M",
        "-f",
        "-N",
        "-o",
        "ControlMaster=yes",
        "-o",
        &format!("ControlPersist={}s", persist.as_secs()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Called once the master behind `ctl` is up: connects its lifeline.
pub fn started(ctl: &Path) -> std::io::Result<()> {
    let stream = UnixStream::connect(ctl)?;
    with_registry(|r| r.lifelines.insert(ctl.to_path_buf(), stream));
    Ok(())
}

/// Called once a warm master behind `ctl` is up or found: it stays up while this process lives
/// and counts its idle bound from the moment the process is gone. Nothing ends it at exit.
pub fn hold(ctl: &Path) -> std::io::Result<()> {
    let stream = UnixStream::connect(ctl)?;
    with_registry(|r| r.held.insert(ctl.to_path_buf(), stream));
    Ok(())
}

/// Let go of a warm master's lifeline: its idle bound starts counting now.
pub fn release(ctl: &Path) {
    with_registry(|r| r.held.remove(ctl));
}

/// The command that ends the master behind `ctl` now; the master is forgotten.
pub fn exit_master(ctl: &Path) -> Command {
    with_registry(|r| r.lifelines.remove(ctl));
    exit_command(ctl)
}

pub(crate) fn exit_command(ctl: &Path) -> Command {
    let mut c = Command::new("ssh");
    c.args(["-F", "/dev/null", "-S"])
        .arg(ctl)
        .args(["-O", "exit", "sparkform"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// A new control folder, `/tmp/sfXXXXXX`, removed on drop and by the janitor if sparkform
/// dies first. The first call also sweeps folders of dead sparkform processes.
pub fn control_dir() -> std::io::Result<tempfile::TempDir> {
    SWEEP.call_once(|| sweep(Path::new(ROOT)));
    let dir = tempfile::Builder::new().prefix(PREFIX).tempdir_in(ROOT)?;
    std::fs::write(dir.path().join(OWNER), format!("{}\n", owner_id(None)?))?;
    with_registry(|r| {
        r.dirs.push(dir.path().to_path_buf());
        tell_janitor(r, dir.path());
    });
    Ok(dir)
}

/// End every master this process started and remove its control folders; for a caller that is
/// about to `std::process::exit` (destructors do not run then).
pub fn shutdown() {
    let (ctls, dirs) = with_registry(|r| {
        let ctls: Vec<PathBuf> = r.lifelines.drain().map(|(p, _)| p).collect();
        (ctls, std::mem::take(&mut r.dirs))
    });
    let mut masters: Vec<PathBuf> = ctls;
    for d in &dirs {
        masters.extend(sockets_in(d));
    }
    masters.sort();
    masters.dedup();
    end_masters(&masters);
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Start (once) the janitor and hand it `dir`. A janitor that cannot start leaves the lifeline
/// and the sweep: the masters still end, the folder waits for the next sparkform.
fn tell_janitor(r: &mut Registry, dir: &Path) {
    if r.janitor.is_none() {
        r.janitor = spawn_janitor();
    }
    if let Some((_, stdin)) = r.janitor.as_mut() {
        if writeln!(stdin, "{}", dir.display()).is_err() {
            r.janitor = None;
        }
    }
}

/// Reads folders until its stdin closes, then ends their masters and removes them. Terminal
/// signals are ignored (its process group is not the terminal's anyway); it never reads the
/// terminal and writes nowhere.
const JANITOR: &str = r#"trap '' INT HUP QUIT TTIN TTOU
while IFS= read -r d; do set -- "$@" "$d"; done
for d; do
  case $d in /tmp/sf*) ;; *) continue ;; esac
  for s in "$d"/j* "$d"/m*/master; do
    [ -S "$s" ] && timeout -k 1 5 ssh -F /dev/null -S "$s" -O exit sparkform </dev/null >/dev/null 2>&1
  done
  rm -rf -- "$d"
done
"#;

fn spawn_janitor() -> Option<(Child, ChildStdin)> {
    let mut child = Command::new("sh")
        .args(["-c", JANITOR, "sparkform-janitor"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()?;
    // The pipe's write end is close-on-exec: no other child (an ssh master) keeps it open.
    let stdin = child.stdin.take()?;
    Some((child, stdin))
}

/// The master sockets in a control folder: `j*` (jump hosts) and `m*/master` (nodes).
fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt as _;
    let is_socket = |p: &Path| {
        std::fs::symlink_metadata(p)
            .map(|m| m.file_type().is_socket())
            .unwrap_or(false)
    };
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('j') && is_socket(&p) {
            out.push(p);
        } else if name.starts_with('m') && is_socket(&p.join("master")) {
            out.push(p.join("master"));
        }
    }
    out
}

/// `ssh -O exit` on every socket at once, each bounded to 5 s.
fn end_masters(ctls: &[PathBuf]) {
    let mut children: Vec<Child> = ctls
        .iter()
        .filter_map(|c| exit_command(c).spawn().ok())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !children.is_empty() {
        children.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        if Instant::now() > deadline {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `PID STARTTIME` of a process (this one for `None`): the start time tells a reused pid apart.
fn owner_id(pid: Option<u32>) -> std::io::Result<String> {
    let pid = pid.unwrap_or_else(std::process::id);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: fields after the last ')'.
    let start = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat")))?;
    Ok(format!("{pid} {start}"))
}

/// Whether the owner recorded in a control folder is still running.
fn owner_alive(recorded: &str) -> bool {
    let Some(pid) = recorded
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
    else {
        return false;
    };
    owner_id(Some(pid)).is_ok_and(|now| now == recorded.trim())
}

/// Empty the control folders under `root` whose owner is gone. Folders without an owner file
/// are left alone: being created right now, or not ours to judge.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    let mut stale = Vec::new();
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let p = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if !meta.is_dir() || Some(meta.uid()) != me {
            continue;
        }
        let Ok(recorded) = std::fs::read_to_string(p.join(OWNER)) else {
            continue;
        };
        if !owner_alive(&recorded) {
            stale.push(p);
        }
    }
    let masters: Vec<PathBuf> = stale.iter().flat_map(|d| sockets_in(d)).collect();
    end_masters(&masters);
    for d in stale {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let me = owner_id(None).unwrap();
        assert!(owner_alive(&me));
        let (pid, start) = me.split_once(' ').unwrap();
        let other_start: u64 = start.parse::<u64>().unwrap() + 1;
        assert!(!owner_alive(&format!("{pid} {other_start}")));
        assert!(!owner_alive("garbage"));
    }

    #[test]
    fn sweep_removes_folders_of_dead_owners_only() {
        let root = tempfile::tempdir().unwrap();
        let dead = root.path().join("sfdead");
        let live = root.path().join("sflive");
        let unowned = root.path().join("sfnew");
        let other = root.path().join("keep");
        for d in [&dead, &live, &unowned, &other] {
            std::fs::create_dir(d).unwrap();
        }
        // A child that has exited: its pid, with a start time no live process has.
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        std::fs::write(dead.join(OWNER), format!("{pid} 0\n")).unwrap();
        std::fs::write(live.join(OWNER), owner_id(None).unwrap()).unwrap();
        std::fs::write(other.join(OWNER), format!("{pid} 0\n")).unwrap();
        sweep(root.path());
        assert!(!dead.exists());
        assert!(live.exists() && unowned.exists() && other.exists());
    }

    #[test]
    fn sockets_of_jump_and_node_masters_are_found() {
        let root = tempfile::tempdir().unwrap();
        let _j = std::os::unix::net::UnixListener::bind(root.path().join("j0")).unwrap();
        std::fs::write(root.path().join("j0.log"), "").unwrap();
        std::fs::create_dir(root.path().join("mabc")).unwrap();
        let _m = std::os::unix::net::UnixListener::bind(root.path().join("mabc/master")).unwrap();
        let mut found = sockets_in(root.path());
        found.sort();
        assert_eq!(
            found,
            vec![root.path().join("j0"), root.path().join("mabc/master")]
        );
    }

    #[test]
    fn the_janitor_removes_its_folders_when_its_owner_goes() {
        let dir = tempfile::Builder::new()
            .prefix("sfjanitor-test")
            .tempdir_in(ROOT)
            .unwrap()
            .keep();
        let (mut child, mut stdin) = spawn_janitor().unwrap();
        writeln!(stdin, "{}", dir.display()).unwrap();
        assert!(dir.exists());
        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

//! The processes of this machine as /proc shows them, for tests that look for stopped or
//! leftover processes.

use std::collections::BTreeSet;

#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub session: u32,
    /// `R`, `S`, `T` (stopped), `Z`, …
    pub state: char,
    /// The arguments joined by spaces.
    pub cmdline: String,
}

/// Every process readable now (processes that exit while being read are left out).
pub fn all() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read)
        .collect()
}

fn read(pid: u32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(Proc {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        cmdline: String::from_utf8_lossy(&cmdline)
            .split('\0')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
    })
}

/// `root` and every process below it (by parent), plus every process in a session one of them
/// leads: daemons that fork away from their parent but keep the session (or start their own
/// below a descendant) still count.
pub fn family(root: u32, procs: &[Proc]) -> Vec<Proc> {
    let mut pids: BTreeSet<u32> = BTreeSet::from([root]);
    loop {
        let before = pids.len();
        for p in procs {
            if pids.contains(&p.ppid) || pids.contains(&p.session) && p.session != 0 {
                pids.insert(p.pid);
            }
        }
        if pids.len() == before {
            break;
        }
    }
    procs
        .iter()
        .filter(|p| pids.contains(&p.pid))
        .cloned()
        .collect()
}

/// Send a signal with kill(1) (`KILL`, `TERM`, `INT`, `STOP`, …).
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -s {sig} {pid} failed");
}

/// The control folders of sparkform process `pid` now: the `/tmp/sf*` folders whose `owner`
/// file names it.
pub fn control_dirs_of(pid: u32) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let owner = std::fs::read_to_string(p.join("owner")).ok()?;
            (e.file_name().to_string_lossy().starts_with("sf")
                && owner.split_whitespace().next() == Some(&pid.to_string()))
            .then_some(p)
        })
        .collect()
}

/// The ssh processes that name a run's control folder (masters, their ProxyJump hops).
pub fn ssh_of(dir: &std::path::Path) -> Vec<Proc> {
    let d = dir.to_string_lossy().to_string();
    all()
        .into_iter()
        .filter(|p| p.cmdline.starts_with("ssh ") && p.cmdline.contains(&d))
        .collect()
}

//! A throwaway PostgreSQL cluster for one test: `initdb` in a temp folder, the server on a unix
//! socket in that folder (no TCP port), stopped and removed on drop however the test ends.
//! PostgreSQL refuses to run as root: as root the cluster belongs to `nobody` (`runuser`).
//! The tests that use it are `#[ignore = "needs PostgreSQL binaries …"]`; `.ci/run` installs
//! Debian's `postgresql` and `.ci/test` runs every ignored test and fails unless each passed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const NEEDS: &str = "needs PostgreSQL binaries (apt install postgresql)";

/// The newest `/usr/lib/postgresql/*/bin` holding `initdb`, else the folder of `pg_ctl` on the
/// PATH.
pub fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|p| p.join("initdb").is_file() && p.join("pg_ctl").is_file())
    })
}

pub struct Pg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// `Some("nobody")` when the tests run as root.
    user: Option<&'static str>,
    /// The libpq connection string of the cluster (no password: `trust` on its socket).
    pub conn: String,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Pg {
    /// A running cluster; panics saying why when PostgreSQL is missing or does not start.
    pub fn start() -> Pg {
        let bin = bin_dir().unwrap_or_else(|| panic!("no PostgreSQL here: this test {NEEDS}"));
        let dir = tempfile::Builder::new()
            .prefix("sf-pg")
            .tempdir()
            .expect("temp folder");
        let user = if is_root() {
            let c =
                std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).expect("path");
            let name = std::ffi::CString::new("nobody").expect("name");
            // SAFETY: a valid C string; the entry is read before any other getpw* call.
            let (uid, gid) = unsafe {
                let pw = libc::getpwnam(name.as_ptr());
                assert!(!pw.is_null(), "no user nobody to run PostgreSQL as");
                ((*pw).pw_uid, (*pw).pw_gid)
            };
            // SAFETY: a valid C string naming the folder just created.
            let rc = unsafe { libc::chown(c.as_ptr(), uid, gid) };
            assert_eq!(rc, 0, "chown of the cluster folder to nobody");
            Some("nobody")
        } else {
            None
        };
        let pg = Pg {
            conn: format!(
                "host={} port=5432 user=sparkform dbname=postgres",
                dir.path().display()
            ),
            dir,
            bin,
            user,
        };
        let data = pg.data();
        let out = pg.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "sparkform",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(out.status.success(), "initdb failed: {}", text(&out));
        let options = format!(
            "-k {} -c listen_addresses='' -p 5432 -c fsync=off -c synchronous_commit=off",
            pg.dir.path().display()
        );
        let log = pg.dir.path().join("server.log").display().to_string();
        let out = pg.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
            ],
        );
        assert!(
            out.status.success(),
            "the server did not start: {}\n{}",
            text(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        pg
    }

    pub fn folder(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let exe = self.bin.join(program);
        let mut cmd = match self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(args)
            .current_dir(self.dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()))
    }

    /// Runs SQL through `psql` (for what a test inspects or breaks behind sparkform's back).
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.conn,
                "-c",
                sql,
            ])
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Drop for Pg {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        // The folder goes with `dir`.
    }
}

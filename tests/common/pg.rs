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
    /// With [`Pg::start_tls`]: `host=127.0.0.1 port=P … sslmode=require`.
    pub tcp_conn: Option<String>,
    /// The server's options (`pg_ctl -o`), for [`Pg::start_again`].
    options: String,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Pg {
    /// A running cluster; panics saying why when PostgreSQL is missing or does not start.
    pub fn start() -> Pg {
        Pg::start_with(false)
    }

    /// A cluster that also listens on a loopback port with TLS only (a certificate for
    /// `127.0.0.1` signed by a test CA, `ca.crt` in [`Pg::folder`]; its pg_hba takes TCP
    /// connections only over TLS).
    pub fn start_tls() -> Pg {
        Pg::start_with(true)
    }

    fn start_with(tls: bool) -> Pg {
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
        // The port names the socket too; a TLS cluster listens on it on loopback as well.
        let port = if tls { free_port() } else { 5432 };
        let mut pg = Pg {
            conn: format!(
                "host={} port={port} user=sparkform dbname=postgres",
                dir.path().display()
            ),
            dir,
            bin,
            user,
            tcp_conn: None,
            options: String::new(),
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
        let mut options = format!(
            "-k {} -p {port} -c fsync=off -c synchronous_commit=off",
            pg.dir.path().display()
        );
        if tls {
            options.push_str(&pg.tls_options());
            pg.tcp_conn = Some(format!(
                "host=127.0.0.1 port={port} user=sparkform dbname=postgres sslmode=require"
            ));
        } else {
            options.push_str(" -c listen_addresses=''");
        }
        pg.options = options;
        pg.start_again();
        pg
    }

    /// Starts the server (again, after [`Pg::stop`]), on the same socket and data.
    pub fn start_again(&self) {
        let data = self.data();
        let log = self.dir.path().join("server.log").display().to_string();
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "-o",
                &self.options,
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "the server did not start: {}\n{}",
            text(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Stops the server (`-m fast`: every connection is ended at once, what was committed is
    /// kept; `immediate` would lose it, the cluster runs with fsync and synchronous commit off).
    pub fn stop(&self) {
        let data = self.data();
        let out = self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
        assert!(
            out.status.success(),
            "the server did not stop: {}",
            text(&out)
        );
    }

    /// A self-signed certificate and key owned by the server's user, a pg_hba with `local`
    /// and `hostssl` only, and the server options that use them.
    fn tls_options(&self) -> String {
        let d = self.dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .expect("openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
        };
        // A CA, and the server's certificate it signs (webpki refuses a CA as the server's).
        let days = ["-days", "1"];
        openssl(
            &[
                &["req", "-x509", "-newkey", "rsa:2048", "-nodes"][..],
                &days,
                &[
                    "-subj",
                    "/CN=sparkform test CA",
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                ],
            ]
            .concat(),
        );
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            &[
                &[
                    "x509",
                    "-req",
                    "-in",
                    "server.csr",
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                ][..],
                &[
                    "-CAcreateserial",
                    "-out",
                    "server.crt",
                    "-extfile",
                    "server.ext",
                ],
                &days,
            ]
            .concat(),
        );
        std::fs::write(
            d.join("hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        if self.user.is_some() {
            for f in ["server.key", "server.crt", "hba.conf"] {
                let out = Command::new("chown")
                    .arg("nobody")
                    .arg(d.join(f))
                    .output()
                    .expect("chown");
                assert!(out.status.success(), "chown: {}", text(&out));
            }
        }
        format!(
            " -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key -c hba_file={0}/hba.conf",
            d.display()
        )
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

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
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

//! The PostgreSQL backend: one row per workspace in `SCHEMA.states` (the document, its serial
//! and lineage, the previous document), every write a compare-and-swap on the serial and
//! lineage the writer read; the lock a session advisory lock held on a connection of its own
//! for the life of the run (the server releases it when that connection drops, so a killed
//! run leaves no lock behind), with a holder row in `SCHEMA.locks` for `plan`'s note and
//! `force-unlock`.
//!
//! The calls are synchronous, as the local file's: each runs on a thread of its own with a
//! small runtime, so they work alike from plain code and from inside the commands' runtime.
//! They share one connection (one server backend, one TLS session) per backend, that is per
//! command run: opened at the first call (the tables checked, and created when missing, once),
//! driven by a thread of its own until the last user lets go. The lock is held on it too, so a
//! connection lost while the lock is held is never opened again behind the lock's back: every
//! later call fails, and the apply stops with the state as of its last write. Statements go
//! with their parameter types (no prepare round trip); the lock's status is one statement.
//! TLS (rustls, the server's certificate checked against the system's roots and the file
//! `SPARKFORM_PG_CA_FILE` or `PGSSLROOTCERT` names): required for a server that is not on a
//! unix socket or a loopback address (plain only with `SPARKFORM_PG_ALLOW_PLAINTEXT=1`); on this
//! machine only when the connection string says `sslmode=require`.

use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};

use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::backend::{Backend, PgTarget, WriteCondition};
use super::lock::RemoteLock;
use super::{holder_process, LockInfo, LockStatus, StateError, StateLock};

pub const CONN_ENV: &str = "SPARKFORM_PG_CONN";
const PLAINTEXT_ENV: &str = "SPARKFORM_PG_ALLOW_PLAINTEXT";
const CA_ENV: &str = "SPARKFORM_PG_CA_FILE";
/// How long one call may take, connecting included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct PgBackend {
    target: PgTarget,
    /// Holds the password, if any: never printed.
    config: Config,
    /// The TLS connector, unless the connection is plain (`sslmode` disabled).
    tls: Option<MakeRustlsConnect>,
    /// Where a local state would be: one there while the row is missing is refused.
    local_file: PathBuf,
    /// The connection every call of this run shares, once opened.
    session: Arc<Mutex<Option<Session>>>,
    /// The connection being opened, from the moment the backend is made (it opens while the
    /// command evaluates the definitions); the first call waits for it.
    opening: Mutex<Option<Opening>>,
}

/// A connection being opened on its thread.
type Opening = std::sync::mpsc::Receiver<Result<Conn, StateError>>;

/// A connection, and the runtime (on its own thread) that drives it and runs every call on it.
#[derive(Clone)]
struct Conn {
    client: Arc<Client>,
    runtime: tokio::runtime::Handle,
}

/// The run's connection, and the lock held on it.
struct Session {
    conn: Conn,
    /// The holder of the advisory lock this connection holds, if it holds it.
    locked: Option<LockInfo>,
    /// The tables were found or created on it (what a write or the lock needs first; a read
    /// takes a missing table for no state).
    tables: bool,
}

/// `SCHEMA.states`, `SCHEMA.locks`, `SCHEMA`, quoted.
/// The states, locks and keys tables, and the schema, quoted.
struct Tables {
    states: String,
    locks: String,
    keys: String,
    schema: String,
}

/// One statement parameter with its type, so a statement needs no prepare round trip.
type Param<'a> = (&'a (dyn ToSql + Sync), Type);

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("target", &self.target)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

fn backend_error(message: impl Into<String>) -> StateError {
    StateError::Backend {
        message: message.into(),
        help: format!(
            "{CONN_ENV} (or libpq's PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD) says how to reach the server; check that it runs and that the user may create the schema's tables"
        ),
    }
}

fn is_loopback(host: &Host) -> bool {
    match host {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name == "localhost"
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }
}

impl PgBackend {
    pub(crate) fn new(
        target: PgTarget,
        conn: &str,
        local_file: PathBuf,
    ) -> Result<Self, StateError> {
        // The parser's errors name the option, never its value.
        let config = Config::from_str(conn).map_err(|e| {
            backend_error(format!(
                "the PostgreSQL connection string is not valid: {e}"
            ))
        })?;
        Self::with_config(target, config, local_file)
    }

    pub(crate) fn from_env(target: PgTarget, local_file: PathBuf) -> Result<Self, StateError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut config = match var(CONN_ENV) {
            Some(conn) => Config::from_str(&conn).map_err(|e| {
                backend_error(format!("{CONN_ENV} is not a valid connection string: {e}"))
            })?,
            None if var("PGHOST").is_some() || var("PGDATABASE").is_some() => {
                let mut c = Config::new();
                if let Some(h) = var("PGHOST") {
                    c.host(&h);
                }
                if let Some(p) = var("PGPORT") {
                    let port = p
                        .parse()
                        .map_err(|_| backend_error("PGPORT is not a port number"))?;
                    c.port(port);
                }
                if let Some(u) = var("PGUSER") {
                    c.user(&u);
                }
                if let Some(d) = var("PGDATABASE") {
                    c.dbname(&d);
                }
                c
            }
            None => {
                return Err(StateError::Backend {
                    message: "the definitions keep the state in PostgreSQL, and the environment does not say how to reach it".into(),
                    help: format!("set {CONN_ENV} (e.g. \"host=/run/postgresql dbname=sparkform user=deploy\"), or PGHOST and PGDATABASE; a password goes in PGPASSWORD or ~/.pgpass, never in the definitions"),
                })
            }
        };
        if config.get_password().is_none() {
            if let Some(p) = var("PGPASSWORD") {
                config.password(p);
            }
        }
        Self::with_config(target, config, local_file)
    }

    fn with_config(
        target: PgTarget,
        mut config: Config,
        local_file: PathBuf,
    ) -> Result<Self, StateError> {
        if config.get_hosts().is_empty() {
            config.host("/run/postgresql");
        }
        let plaintext_ok = std::env::var(PLAINTEXT_ENV).is_ok_and(|v| v == "1");
        let remote = !config.get_hosts().iter().all(is_loopback);
        match (config.get_ssl_mode(), remote) {
            (SslMode::Disable, true) if !plaintext_ok => {
                return Err(StateError::Backend {
                    message: "the PostgreSQL server is on another machine, and the connection string turns TLS off (sslmode=disable)".into(),
                    help: format!("drop sslmode=disable (TLS is then required), or set {PLAINTEXT_ENV}=1 if the network in between is trusted"),
                })
            }
            // This machine: plain unless the connection string asks for TLS.
            (SslMode::Prefer, false) => {
                config.ssl_mode(SslMode::Disable);
            }
            (SslMode::Prefer, true) if !plaintext_ok => {
                config.ssl_mode(SslMode::Require);
            }
            _ => {}
        }
        let tls = match config.get_ssl_mode() {
            SslMode::Disable => None,
            _ => Some(tls_connector()?),
        };
        config.application_name("sparkform");
        config.connect_timeout(Duration::from_secs(10));
        let opening = start_session(&config, tls.clone());
        Ok(PgBackend {
            target,
            config,
            tls,
            local_file,
            session: Arc::new(Mutex::new(None)),
            opening: Mutex::new(Some(opening)),
        })
    }

    fn table(&self, name: &str) -> String {
        // The schema is checked to be a plain identifier (`config::backend`); quoted anyway.
        format!("\"{}\".{name}", self.target.schema.replace('"', "\"\""))
    }

    /// The advisory lock's key: this schema and workspace, as a non-negative 63-bit number.
    fn lock_key(&self) -> i64 {
        let digest = Sha256::digest(
            format!(
                "sparkform state lock\0{}\0{}",
                self.target.schema, self.target.workspace
            )
            .as_bytes(),
        );
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(bytes) >> 1) as i64
    }

    fn workspace(&self) -> &str {
        &self.target.workspace
    }

    fn tables(&self) -> Tables {
        Tables {
            states: self.table("states"),
            locks: self.table("locks"),
            keys: self.table("keys"),
            schema: self.schema(),
        }
    }

    /// The run's connection: the one open, or a new one when there is none or it closed
    /// without holding the lock. One that held the lock and closed is an error: the lock went
    /// with it, and another run may hold it now.
    fn client(&self) -> Result<(Conn, Option<LockInfo>), StateError> {
        let mut session = self
            .session
            .lock()
            .map_err(|_| backend_error("the PostgreSQL session was poisoned by a panic"))?;
        if let Some(open) = session.as_ref() {
            if !open.conn.client.is_closed() {
                return Ok((open.conn.clone(), open.locked.clone()));
            }
            if open.locked.is_some() {
                return Err(lost_lock());
            }
        }
        let pending = self.opening.lock().ok().and_then(|mut o| o.take());
        let pending = pending.unwrap_or_else(|| start_session(&self.config, self.tls.clone()));
        let conn = pending
            .recv()
            .unwrap_or_else(|_| Err(backend_error("the PostgreSQL client's thread ended early")))?;
        *session = Some(Session {
            conn: conn.clone(),
            locked: None,
            tables: false,
        });
        Ok((conn, None))
    }

    /// The tables, checked (and created when missing) once per connection: before a write or
    /// the lock.
    fn ensure_tables(&self) -> Result<(), StateError> {
        let (conn, _) = self.client()?;
        let client = conn.client.clone();
        let ready = |s: &Mutex<Option<Session>>| {
            s.lock().ok().is_some_and(|s| {
                s.as_ref()
                    .is_some_and(|o| o.tables && Arc::ptr_eq(&o.conn.client, &client))
            })
        };
        if ready(&self.session) {
            return Ok(());
        }
        let tables = self.tables();
        let c = client.clone();
        run_on(&conn, async move { ensure_tables(&c, &tables).await })?;
        if let Ok(mut s) = self.session.lock() {
            if let Some(open) = s.as_mut().filter(|o| Arc::ptr_eq(&o.conn.client, &client)) {
                open.tables = true;
            }
        }
        Ok(())
    }

    /// Runs `call` on the run's connection, on the thread that drives it.
    fn call<T, F, Fut>(&self, call: F) -> Result<T, StateError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, StateError>> + Send + 'static,
    {
        let (conn, locked) = self.client()?;
        run_on(&conn, call(conn.client.clone())).map_err(|e| {
            match (conn.client.is_closed(), locked) {
                (true, Some(_)) => lost_lock(),
                _ => e,
            }
        })
    }

    /// Marks the session's lock as held by `info`, or given back (`None`).
    fn set_locked(session: &Mutex<Option<Session>>, client: &Arc<Client>, info: Option<LockInfo>) {
        if let Ok(mut s) = session.lock() {
            if let Some(open) = s.as_mut().filter(|o| Arc::ptr_eq(&o.conn.client, client)) {
                open.locked = info;
            }
        }
    }

    fn schema(&self) -> String {
        format!("\"{}\"", self.target.schema.replace('"', "\"\""))
    }

    /// The row's serial and lineage now, for a refused write's message.
    async fn current(
        client: &Client,
        states: &str,
        workspace: &str,
    ) -> Result<Option<(u64, String)>, StateError> {
        let row = client
            .query_typed_opt(
                &format!("SELECT serial, lineage FROM {states} WHERE workspace = $1"),
                &[(&workspace, Type::TEXT)],
            )
            .await
            .map_err(query_error)?;
        Ok(row.map(|r| (r.get::<_, i64>(0).max(0) as u64, r.get::<_, String>(1))))
    }

    /// The text column `column` of this workspace's row of `table`, as bytes; `None` when
    /// there is no row, or no tables yet.
    fn workspace_text(&self, table: &str, column: &str) -> Result<Option<Vec<u8>>, StateError> {
        let table = self.table(table);
        let query = format!("SELECT {column} FROM {table} WHERE workspace = $1");
        let workspace = self.workspace().to_string();
        self.call(move |client| async move {
            let row = client
                .query_typed_opt(&query, &[(&workspace, Type::TEXT)])
                .await;
            match row {
                Err(e) if no_tables(&e) => Ok(None),
                r => Ok(r
                    .map_err(query_error)?
                    .map(|r| r.get::<_, String>(0).into_bytes())),
            }
        })
    }

    fn lock_place(&self) -> PathBuf {
        self.place()
    }

    /// The holder row, and whether the advisory lock is held by some session (this run's
    /// included): one statement.
    fn holder(&self) -> Result<(Option<LockInfo>, bool), StateError> {
        if let Some(ours) = self.client()?.1 {
            return Ok((Some(ours), true));
        }
        let locks = self.table("locks");
        let key = self.lock_key();
        let workspace = self.workspace().to_string();
        self.call(move |client| async move {
            // Taken and given back at once when free (a writer starting in that instant finds
            // the state locked and can retry).
            let row = client
                .query_typed_one(
                    &format!(
                        "SELECT CASE WHEN pg_try_advisory_lock($2) THEN NOT pg_advisory_unlock($2) ELSE true END, l.id, l.host, l.pid, l.started, l.operation, l.version FROM (SELECT 1) AS one LEFT JOIN {locks} AS l ON l.workspace = $1"
                    ),
                    &[(&workspace, Type::TEXT), (&key, Type::INT8)],
                )
                .await;
            // No tables yet: nothing was ever locked (the lock creates them first).
            let row = match row {
                Err(e) if no_tables(&e) => return Ok((None, false)),
                r => r.map_err(query_error)?,
            };
            Ok((holder_of(&row), row.get::<_, bool>(0)))
        })
    }
}

/// The schema or its tables do not exist (no state was ever written there).
fn no_tables(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME
    )
}

fn lost_lock() -> StateError {
    backend_error("the connection to PostgreSQL that held the state lock was lost, and the lock with it: nothing more is written in this run (the state is as of its last write)")
}

/// Opens a connection on a thread of its own, whose runtime drives it (and runs the calls on
/// it) until the last [`Client`] is dropped; what it comes to arrives on the receiver.
fn start_session(config: &Config, tls: Option<MakeRustlsConnect>) -> Opening {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let config = config.clone();
    let failed = ready_tx.clone();
    let spawned = std::thread::Builder::new()
        .name("sparkform-pg".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(backend_error(format!(
                        "cannot start the PostgreSQL client: {e}"
                    ))));
                    return;
                }
            };
            let runtime = rt.handle().clone();
            rt.block_on(async move {
                let opened = tokio::time::timeout(CALL_TIMEOUT, connect(&config, tls))
                    .await
                    .unwrap_or_else(|_| {
                        Err(backend_error(format!(
                            "PostgreSQL did not answer within {} s",
                            CALL_TIMEOUT.as_secs()
                        )))
                    });
                match opened {
                    Ok((client, driver)) => {
                        let conn = Conn {
                            client: Arc::new(client),
                            runtime,
                        };
                        if ready_tx.send(Ok(conn)).is_ok() {
                            driver.await;
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        });
    if let Err(e) = spawned {
        let _ = failed.send(Err(backend_error(format!(
            "cannot start the PostgreSQL client's thread: {e}"
        ))));
    }
    ready_rx
}

/// `fut` on `conn`'s runtime, bounded by [`CALL_TIMEOUT`]; this thread waits for it.
fn run_on<T: Send + 'static>(
    conn: &Conn,
    fut: impl Future<Output = Result<T, StateError>> + Send + 'static,
) -> Result<T, StateError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    conn.runtime.spawn(async move {
        let done = tokio::time::timeout(CALL_TIMEOUT, fut)
            .await
            .unwrap_or_else(|_| {
                Err(backend_error(format!(
                    "PostgreSQL did not answer within {} s",
                    CALL_TIMEOUT.as_secs()
                )))
            });
        let _ = tx.send(done);
    });
    rx.recv().unwrap_or_else(|_| {
        Err(backend_error(
            "the connection to PostgreSQL closed during the call",
        ))
    })
}

/// What drives a connection: it ends when the connection does.
type Driver = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

async fn connect(
    config: &Config,
    tls: Option<MakeRustlsConnect>,
) -> Result<(Client, Driver), StateError> {
    let failed = |e: tokio_postgres::Error| {
        use std::error::Error;
        // The cause says why (a certificate not trusted, a refused password); never the password.
        let cause = e.source().map(|c| format!(": {c}")).unwrap_or_default();
        backend_error(format!("cannot connect to PostgreSQL: {e}{cause}"))
    };
    Ok(match tls {
        Some(tls) => {
            let (client, connection) = config.connect(tls).await.map_err(failed)?;
            let driver: Driver = Box::pin(async move {
                let _ = connection.await;
            });
            (client, driver)
        }
        None => {
            let (client, connection) = config.connect(NoTls).await.map_err(failed)?;
            let driver: Driver = Box::pin(async move {
                let _ = connection.await;
            });
            (client, driver)
        }
    })
}

/// rustls with ring, the system's roots and the CA file the environment names.
fn tls_connector() -> Result<MakeRustlsConnect, StateError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let ca_file = std::env::var_os(CA_ENV).or_else(|| std::env::var_os("PGSSLROOTCERT"));
    if let Some(path) = ca_file {
        let shown = std::path::Path::new(&path).display().to_string();
        let bad = |why: String| backend_error(format!("the CA file {shown} ({CA_ENV}): {why}"));
        let certs = CertificateDer::pem_file_iter(&path).map_err(|e| bad(e.to_string()))?;
        for cert in certs {
            let cert = cert.map_err(|e| bad(e.to_string()))?;
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
    }
    if roots.is_empty() {
        return Err(backend_error(format!(
            "TLS to PostgreSQL needs CA certificates, and none were found: set {CA_ENV} to the PEM file of the server's CA"
        )));
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| backend_error(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn query_error(e: tokio_postgres::Error) -> StateError {
    let detail = e
        .as_db_error()
        .map(|d| format!("{}: {}", d.code().code(), d.message()))
        .unwrap_or_else(|| e.to_string());
    backend_error(format!("PostgreSQL refused the state's query: {detail}"))
}

/// The tables, created if missing (under a transaction-scoped advisory lock, so two first
/// runs do not race on the catalog).
async fn ensure_tables(client: &Client, tables: &Tables) -> Result<(), StateError> {
    let Tables {
        states,
        locks,
        keys,
        schema,
    } = tables;
    let present = client
        .query_typed_one(
            "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
             AND to_regclass($3) IS NOT NULL",
            &[
                (states, Type::TEXT),
                (locks, Type::TEXT),
                (keys, Type::TEXT),
            ],
        )
        .await
        .map_err(query_error)?;
    if present.get::<_, bool>(0) {
        return Ok(());
    }
    // `keys` came after the other two: a schema from an older sparkform gains it here.
    client
        .batch_execute(&format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(7283476192834761);
             CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {states} (
                 workspace text PRIMARY KEY,
                 serial bigint NOT NULL,
                 lineage text NOT NULL,
                 document text NOT NULL,
                 previous text,
                 updated timestamptz NOT NULL DEFAULT now()
             );
             CREATE TABLE IF NOT EXISTS {locks} (
                 workspace text PRIMARY KEY,
                 id text NOT NULL,
                 host text NOT NULL,
                 pid bigint NOT NULL,
                 started text NOT NULL,
                 operation text NOT NULL,
                 version text NOT NULL
             );
             CREATE TABLE IF NOT EXISTS {keys} (
                 workspace text PRIMARY KEY,
                 key text NOT NULL,
                 created timestamptz NOT NULL DEFAULT now()
             );
             COMMIT;"
        ))
        .await
        .map_err(query_error)
}

/// The holder row in columns 1 to 6 of `row` (a LEFT JOIN: none when the id is null).
fn holder_of(row: &tokio_postgres::Row) -> Option<LockInfo> {
    let id = row.try_get::<_, Option<String>>(1).ok().flatten()?;
    Some(LockInfo {
        id,
        host: row.try_get(2).unwrap_or_default(),
        pid: row
            .try_get::<_, i64>(3)
            .ok()
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
        started: row.try_get(4).unwrap_or_default(),
        operation: row.try_get(5).unwrap_or_default(),
        version: row.try_get(6).unwrap_or_default(),
    })
}

impl Backend for PgBackend {
    fn name(&self) -> &'static str {
        "pg"
    }

    fn describe(&self) -> String {
        format!(
            "PostgreSQL {}.states, workspace \"{}\"",
            self.target.schema, self.target.workspace
        )
    }

    fn read(&self) -> Result<Option<Vec<u8>>, StateError> {
        let doc = self.workspace_text("states", "document")?;
        if doc.is_none() && self.local_file.exists() {
            return Err(StateError::StillLocal {
                place: self.describe(),
                file: self.local_file.clone(),
            });
        }
        Ok(doc)
    }

    fn write(
        &self,
        doc: &[u8],
        serial: u64,
        lineage: &str,
        expect: WriteCondition,
    ) -> Result<(), StateError> {
        let text = String::from_utf8(doc.to_vec())
            .map_err(|_| backend_error("the state document is not UTF-8 text"))?;
        let serial_db = i64::try_from(serial).map_err(|_| backend_error("serial overflow"))?;
        self.ensure_tables()?;
        let states = self.table("states");
        let workspace = self.workspace().to_string();
        let lineage = lineage.to_string();
        let place = self.describe();
        self.call(move |client| async move {
            let params_new: [Param; 4] = [
                (&workspace, Type::TEXT),
                (&serial_db, Type::INT8),
                (&lineage, Type::TEXT),
                (&text, Type::TEXT),
            ];
            let (changed, read_serial) = match &expect {
                WriteCondition::Absent => (
                    client
                        .execute_typed(
                            &format!("INSERT INTO {states} (workspace, serial, lineage, document) VALUES ($1, $2, $3, $4) ON CONFLICT (workspace) DO NOTHING"),
                            &params_new,
                        )
                        .await
                        .map_err(query_error)?,
                    0,
                ),
                WriteCondition::Serial(read, read_lineage) => {
                    let read_db = i64::try_from(*read).map_err(|_| backend_error("serial overflow"))?;
                    (
                        client
                            .execute_typed(
                                &format!("UPDATE {states} SET previous = document, document = $4, serial = $2, lineage = $3, updated = now() WHERE workspace = $1 AND serial = $5 AND lineage = $6"),
                                &[
                                    (&workspace, Type::TEXT),
                                    (&serial_db, Type::INT8),
                                    (&lineage, Type::TEXT),
                                    (&text, Type::TEXT),
                                    (&read_db, Type::INT8),
                                    (read_lineage, Type::TEXT),
                                ],
                            )
                            .await
                            .map_err(query_error)?,
                        *read,
                    )
                }
                WriteCondition::Any => (
                    client
                        .execute_typed(
                            &format!("INSERT INTO {states} (workspace, serial, lineage, document) VALUES ($1, $2, $3, $4) ON CONFLICT (workspace) DO UPDATE SET previous = {states}.document, document = EXCLUDED.document, serial = EXCLUDED.serial, lineage = EXCLUDED.lineage, updated = now()"),
                            &params_new,
                        )
                        .await
                        .map_err(query_error)?,
                    0,
                ),
            };
            if changed == 1 {
                return Ok(());
            }
            let (found_serial, found_lineage) = PgBackend::current(&client, &states, &workspace)
                .await?
                .unwrap_or((0, "(none: the row is gone)".into()));
            Err(StateError::Stale {
                place,
                read_serial,
                found_serial,
                found_lineage,
            })
        })
    }

    fn set_aside(&self) -> Result<(), StateError> {
        let states = self.table("states");
        let workspace = self.workspace().to_string();
        let aside = format!("{workspace}.migrated");
        self.ensure_tables()?;
        self.call(move |client| async move {
            client.batch_execute("BEGIN").await.map_err(query_error)?;
            let moved = async {
                client
                    .execute_typed(
                        &format!("DELETE FROM {states} WHERE workspace = $1"),
                        &[(&aside, Type::TEXT)],
                    )
                    .await?;
                client
                    .execute_typed(
                        &format!("UPDATE {states} SET workspace = $2 WHERE workspace = $1"),
                        &[(&workspace, Type::TEXT), (&aside, Type::TEXT)],
                    )
                    .await
            }
            .await;
            match moved {
                Ok(_) => client.batch_execute("COMMIT").await.map_err(query_error),
                Err(e) => {
                    // The connection serves the rest of the run: no transaction left open.
                    let _ = client.batch_execute("ROLLBACK").await;
                    Err(query_error(e))
                }
            }
        })
    }

    fn lock(&self, operation: &str) -> Result<StateLock, StateError> {
        let info = LockInfo::new(operation);
        let (conn, held) = self.client()?;
        let client = conn.client.clone();
        if let Some(holder) = held {
            // This run holds it already (the advisory lock would be taken again on the same
            // connection): a second holder in one run is refused as one in another run is.
            return Err(StateError::Locked {
                path: self.lock_place(),
                holder: Box::new(holder),
            });
        }
        self.ensure_tables()?;
        let locks = self.table("locks");
        let key = self.lock_key();
        let workspace = self.workspace().to_string();
        let place = self.lock_place();
        let ours = info.clone();
        let taking = client.clone();
        let took_over = run_on(&conn, async move {
            take_lock(&taking, &locks, key, &workspace, place, &ours).await
        })
        .map_err(|e| match client.is_closed() {
            true => backend_error(format!(
                "the connection to PostgreSQL was lost while taking the lock: {e}"
            )),
            false => e,
        })?;
        Self::set_locked(&self.session, &client, Some(info.clone()));
        let held = PgLock {
            conn: Some(conn),
            session: self.session.clone(),
            locks: self.table("locks"),
            workspace: self.workspace().to_string(),
            id: info.id.clone(),
            key,
        };
        Ok(StateLock::remote(
            Box::new(held),
            self.lock_place(),
            info,
            took_over,
        ))
    }

    fn force_unlock(&self, id: &str, force: bool) -> Result<LockInfo, StateError> {
        let path = self.lock_place();
        let (info, held) = self.holder()?;
        let info = info.ok_or_else(|| StateError::NotLocked { path: path.clone() })?;
        if info.id != id {
            return Err(StateError::LockIdMismatch {
                path,
                expected: id.to_string(),
                found: info.id,
            });
        }
        if held && !force {
            let process = holder_process(&info).describe(&info);
            return Err(StateError::LockLive {
                path,
                holder: Box::new(info),
                process,
            });
        }
        let locks = self.table("locks");
        let workspace = self.workspace().to_string();
        let key = self.lock_key();
        let id = id.to_string();
        self.call(move |client| async move {
            if held {
                // `-force` on a live lock: its session is ended, so the lock is free, as the
                // local file's `-force` removes a lock file its holder still has open.
                client
                    .execute_typed(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1 AND pid <> pg_backend_pid()",
                        &[(&key, Type::INT8)],
                    )
                    .await
                    .map_err(query_error)?;
            }
            client
                .execute_typed(
                    &format!("DELETE FROM {locks} WHERE workspace = $1 AND id = $2"),
                    &[(&workspace, Type::TEXT), (&id, Type::TEXT)],
                )
                .await
                .map_err(query_error)?;
            Ok(())
        })?;
        Ok(info)
    }

    fn read_lock_info(&self) -> Result<Option<LockInfo>, StateError> {
        self.holder().map(|(info, _)| info)
    }

    fn lock_status(&self) -> Result<LockStatus, StateError> {
        Ok(match self.holder()? {
            (None, false) => LockStatus::Free,
            (None, true) => LockStatus::Starting,
            (Some(info), true) => LockStatus::Held(info),
            (Some(info), false) => LockStatus::Stale(info),
        })
    }

    fn keeps_hash_key(&self) -> bool {
        true
    }

    fn workspaces(&self) -> Result<Option<Vec<String>>, StateError> {
        let states = self.table("states");
        self.call(move |client| async move {
            let rows = client
                .query_typed(
                    &format!("SELECT workspace FROM {states} ORDER BY workspace"),
                    &[],
                )
                .await;
            match rows {
                Err(e) if no_tables(&e) => Ok(Some(Vec::new())),
                r => Ok(Some(
                    r.map_err(query_error)?
                        .iter()
                        .map(|r| r.get::<_, String>(0))
                        .collect(),
                )),
            }
        })
    }

    fn read_hash_key(&self) -> Result<Option<Vec<u8>>, StateError> {
        self.workspace_text("keys", "key")
    }

    fn create_hash_key(&self, stored: &[u8]) -> Result<Vec<u8>, StateError> {
        self.ensure_tables()?;
        let keys = self.table("keys");
        let workspace = self.workspace().to_string();
        let text = String::from_utf8_lossy(stored).into_owned();
        // One statement: a teammate's first apply racing this one keeps whichever came first,
        // and both read that one back.
        self.call(move |client| async move {
            client
                .execute_typed(
                    &format!(
                        "INSERT INTO {keys} (workspace, key) VALUES ($1, $2) \
                         ON CONFLICT (workspace) DO NOTHING"
                    ),
                    &[(&workspace, Type::TEXT), (&text, Type::TEXT)],
                )
                .await
                .map_err(query_error)?;
            let row = client
                .query_typed_one(
                    &format!("SELECT key FROM {keys} WHERE workspace = $1"),
                    &[(&workspace, Type::TEXT)],
                )
                .await
                .map_err(query_error)?;
            Ok(row.get::<_, String>(0).into_bytes())
        })
    }
}

/// Takes the advisory lock on the run's connection and records the holder: the holder row a
/// killed run left, if any. Refused, naming the holder, when another session holds it.
async fn take_lock(
    client: &Client,
    locks: &str,
    key: i64,
    workspace: &str,
    place: PathBuf,
    ours: &LockInfo,
) -> Result<Option<LockInfo>, StateError> {
    let workspace = workspace.to_string();
    // Taken, and the holder row read, in one statement.
    let row = client
        .query_typed_one(
            &format!("SELECT pg_try_advisory_lock($2), l.id, l.host, l.pid, l.started, l.operation, l.version FROM (SELECT 1) AS one LEFT JOIN {locks} AS l ON l.workspace = $1"),
            &[(&workspace, Type::TEXT), (&key, Type::INT8)],
        )
        .await
        .map_err(query_error)?;
    let got: bool = row.get(0);
    let previous = holder_of(&row);
    if !got {
        return Err(match previous {
            Some(holder) => StateError::Locked {
                path: place,
                holder: Box::new(holder),
            },
            None => StateError::LockBusy { path: place },
        });
    }
    // We hold it: a holder row left is a killed run's.
    let pid = i64::from(ours.pid);
    client
        .execute_typed(
            &format!("INSERT INTO {locks} (workspace, id, host, pid, started, operation, version) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (workspace) DO UPDATE SET id = EXCLUDED.id, host = EXCLUDED.host, pid = EXCLUDED.pid, started = EXCLUDED.started, operation = EXCLUDED.operation, version = EXCLUDED.version"),
            &[
                (&workspace, Type::TEXT),
                (&ours.id, Type::TEXT),
                (&ours.host, Type::TEXT),
                (&pid, Type::INT8),
                (&ours.started, Type::TEXT),
                (&ours.operation, Type::TEXT),
                (&ours.version, Type::TEXT),
            ],
        )
        .await
        .map_err(query_error)?;
    Ok(previous)
}

/// The held lock: the connection it is held on, and what giving it back deletes.
struct PgLock {
    conn: Option<Conn>,
    session: Arc<Mutex<Option<Session>>>,
    locks: String,
    workspace: String,
    id: String,
    key: i64,
}

impl std::fmt::Debug for PgLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLock")
            .field("workspace", &self.workspace)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl RemoteLock for PgLock {
    fn release(&mut self) -> Result<(), StateError> {
        let Some(conn) = self.conn.take() else {
            return Ok(());
        };
        let client = conn.client.clone();
        // A connection that closed gave the lock back with it.
        if !client.is_closed() {
            let (locks, workspace, id, key) = (
                self.locks.clone(),
                self.workspace.clone(),
                self.id.clone(),
                self.key,
            );
            let c = client.clone();
            let _ = run_on(&conn, async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    let _ = c
                        .execute_typed(
                            &format!("DELETE FROM {locks} WHERE workspace = $1 AND id = $2"),
                            &[(&workspace, Type::TEXT), (&id, Type::TEXT)],
                        )
                        .await;
                    let _ = c
                        .query_typed_one("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)])
                        .await;
                })
                .await;
                Ok(())
            });
        }
        PgBackend::set_locked(&self.session, &client, None);
        Ok(())
    }
}

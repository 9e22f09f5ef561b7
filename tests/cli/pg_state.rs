//! The `state` block and the state commands through the binary: a connection written in the
//! definitions is refused, a missing connection is a clear error, and (with a throwaway
//! PostgreSQL, `common::pg`) `state migrate`, `pull` and `push`.

use crate::common;
use crate::common::pg::Pg;

use assert_cmd::Command;
use sparkform::state::{ResourceState, State, StateStore};

pub(crate) fn sparkform() -> Command {
    let mut c = Command::cargo_bin("sparkform").expect("binary");
    for v in [
        "SPARKFORM_PG_CONN",
        "PGHOST",
        "PGDATABASE",
        "PGPASSWORD",
        "SPARKFORM_STATE_KEY",
        "SPARKFORM_STATE_KEY_FILE",
    ] {
        c.env_remove(v);
    }
    c
}

/// Exit code, stdout, and stderr with miette's wrapping undone (one line, single spaces).
pub(crate) fn out(c: &mut Command) -> (i32, String, String) {
    let o = c.output().expect("run");
    let err = String::from_utf8_lossy(&o.stderr).replace('│', " ");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        err.split_whitespace().collect::<Vec<_>>().join(" "),
    )
}

/// A deployment folder: `block` (a `state` block, or nothing) and one node.
pub(crate) fn folder(block: &str) -> tempfile::TempDir {
    definitions(&format!(
        "{block}\nnode \"n1\" {{\n  address = \"10.0.0.1\"\n}}\n"
    ))
}

/// A temp folder whose `main.hcl` is `text`.
fn definitions(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), text).unwrap();
    dir
}

#[test]
fn a_connection_in_the_state_block_is_refused_with_its_line() {
    let dir = folder("state {\n  backend  = \"pg\"\n  password = \"hunter2\"\n}");
    let (code, _, err) = out(sparkform().arg("validate").arg(dir.path()));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("comes from the environment only"), "{err}");
    assert!(err.contains("main.hcl:3"), "{err}");
    assert!(err.contains("SPARKFORM_PG_CONN"), "{err}");
    assert!(!err.contains("hunter2"), "the password is shown: {err}");
    let dir = folder("state {\n  backend = \"postgres://u:pw@db/x\"\n}");
    let (code, _, err) = out(sparkform().arg("validate").arg(dir.path()));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("looks like a connection string"), "{err}");
    assert!(!err.contains("pw@"), "{err}");
    let dir = folder("state {\n  backend = \"s3\"\n}");
    let (code, _, err) = out(sparkform().args(["state", "list"]).arg(dir.path()));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown state backend \"s3\""), "{err}");
}

#[test]
fn the_pg_backend_without_a_connection_says_what_to_set() {
    let dir = folder("state {\n  backend = \"pg\"\n}");
    let (code, _, err) = out(sparkform().arg("validate").arg(dir.path()));
    assert_eq!(code, 0, "the block itself is valid: {err}");
    let (code, _, err) = out(sparkform().args(["state", "list"]).arg(dir.path()));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not say how to reach it"), "{err}");
    assert!(err.contains("SPARKFORM_PG_CONN"), "{err}");
    // A remote server without TLS is refused before anything is sent.
    let (code, _, err) = out(sparkform().args(["state", "list"]).arg(dir.path()).env(
        "SPARKFORM_PG_CONN",
        "host=db.example.org user=u password=secret sslmode=disable",
    ));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("turns TLS off"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

#[test]
fn a_wrong_state_key_is_an_error_and_the_file_stays() {
    let dir = folder("");
    let store = StateStore::new(dir.path().join("state/sparkform.json"))
        .with_key(Some(sparkform::state::StateKey::from_bytes([3; 32])));
    store.write(&mut State::new()).unwrap();
    let before = std::fs::read(store.path()).unwrap();
    let other = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="; // 32 bytes of 2
    let (code, _, err) = out(sparkform()
        .args(["state", "list"])
        .arg(dir.path())
        .env("SPARKFORM_STATE_KEY", other));
    assert_eq!(code, 1);
    assert!(err.contains("does not open with the key"), "{err}");
    let (code, _, err) = out(sparkform().args(["state", "pull"]).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("is encrypted, and no key is set"), "{err}");
    let (code, _, err) = out(sparkform()
        .args(["state", "list"])
        .arg(dir.path())
        .env("SPARKFORM_STATE_KEY", "c2hvcnQ="));
    assert_eq!(code, 1);
    assert!(err.contains("not 32"), "{err}");
    assert_eq!(std::fs::read(store.path()).unwrap(), before);
}

pub(crate) fn sample() -> State {
    let mut s = State::new();
    s.resources.insert(
        "network.fabric.attach.n1".into(),
        ResourceState {
            kind: sparkform::vocabulary::KindId::Attachment,
            node: Some("n1".into()),
            config_hash: "sha256:00".into(),
            config: serde_json::json!({"address": "192.168.1.1"}).into(),
            attributes: Default::default(),
            depends_on: vec![],
            last_apply_secs: None,
            schema_version: 1,
        },
    );
    s
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_state_migrate_pull_and_push_through_the_binary() {
    let pg = Pg::start();
    let dir = folder("state {\n  backend   = \"pg\"\n  workspace = \"cli\"\n}");
    let local = StateStore::new(dir.path().join("state/sparkform.json"));
    let mut s = sample();
    local.write(&mut s).unwrap();
    let original = std::fs::read(local.path()).unwrap();
    let sf = || {
        let mut c = sparkform();
        c.env("SPARKFORM_PG_CONN", &pg.conn);
        c
    };

    // The block says pg, the state is still in the file: refused, pointing at migrate.
    let (code, _, err) = out(sf().args(["state", "list"]).arg(dir.path()));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("state migrate --to pg"), "{err}");

    let (code, stdout, err) = out(sf().args(["state", "migrate", "-to", "pg"]).arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("workspace \"cli\""), "{stdout}");
    let (code, stdout, err) = out(sf().args(["state", "list"]).arg(dir.path()));
    assert_eq!(
        (code, stdout.trim()),
        (0, "network.fabric.attach.n1"),
        "{err}"
    );
    let (code, pulled, err) = out(sf().args(["state", "pull"]).arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        pulled.as_bytes(),
        &original[..],
        "pull prints the document as it was"
    );

    // Push: an older serial is refused, -force writes it.
    let mut newer = s.clone();
    let file = dir.path().join("pushed.json");
    newer.serial = 5;
    std::fs::write(&file, serde_json::to_vec_pretty(&newer).unwrap()).unwrap();
    let (code, _, err) = out(sf().args(["state", "push"]).arg(&file).arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    std::fs::write(&file, &original).unwrap();
    let (code, _, err) = out(sf().args(["state", "push"]).arg(&file).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("older than the serial 5"), "{err}");
    let mut theirs = State::new();
    theirs.serial = 9;
    let other = dir.path().join("other.json");
    std::fs::write(&other, serde_json::to_vec_pretty(&theirs).unwrap()).unwrap();
    let (code, _, err) = out(sf().args(["state", "push"]).arg(&other).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("another deployment's"), "{err}");
    let (code, _, err) = out(sf()
        .args(["state", "push", "-force"])
        .arg(&file)
        .arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    let (_, pulled, _) = out(sf().args(["state", "pull"]).arg(dir.path()));
    assert_eq!(pulled.as_bytes(), &original[..]);

    // Back to the file.
    let (code, _, err) = out(sf()
        .args(["state", "migrate", "-to", "local"])
        .arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(local.path()).unwrap(), original);
    // The block still says pg and its row is set aside: refused until the block says local.
    let (code, _, err) = out(sf().args(["state", "list"]).arg(dir.path()));
    assert_eq!(code, 1, "{err}");
    common::pg::bin_dir().expect("binaries");
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_state_over_tls_checks_the_servers_certificate() {
    let pg = Pg::start_tls();
    let dir = folder("state {\n  backend = \"pg\"\n}");
    let file = dir.path().join("doc.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&sample()).unwrap()).unwrap();
    let conn = pg.tcp_conn.clone().expect("a TLS server");
    let sf = |conn: &str| {
        let mut c = sparkform();
        c.env("SPARKFORM_PG_CONN", conn);
        c
    };
    // Trusted through the CA file: pushed and read back over TLS (the server takes no
    // plain TCP connection: its pg_hba has only hostssl).
    let ca = pg.folder().join("ca.crt");
    let (code, _, err) = out(sf(&conn)
        .env("SPARKFORM_PG_CA_FILE", &ca)
        .args(["state", "push"])
        .arg(&file)
        .arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    let (code, pulled, err) = out(sf(&conn)
        .env("SPARKFORM_PG_CA_FILE", &ca)
        .args(["state", "pull"])
        .arg(dir.path()));
    assert_eq!(code, 0, "{err}");
    assert_eq!(pulled.as_bytes(), &std::fs::read(&file).unwrap()[..]);
    // Not trusted without it.
    let (code, _, err) = out(sf(&conn).args(["state", "pull"]).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Plain TCP is refused by this server: what passed above went over TLS.
    let plain = conn.replace("sslmode=require", "sslmode=disable");
    let (code, _, err) = out(sf(&plain).args(["state", "pull"]).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("no pg_hba.conf entry"), "{err}");
}

/// A copy of the plan fixture `cluster` (whose containers carry a sensitive token) keeping its
/// state in PostgreSQL's workspace `team`: one teammate's checkout.
fn checkout() -> tempfile::TempDir {
    let text = std::fs::read_to_string("tests/fixtures/plan/cluster/main.hcl").unwrap();
    definitions(&format!(
        "state {{\n  backend   = \"pg\"\n  workspace = \"team\"\n}}\n{text}"
    ))
}

/// The store of a [`checkout`]: PostgreSQL's workspace `team`.
fn team_store(pg: &Pg, dir: &tempfile::TempDir) -> StateStore {
    StateStore::postgres(
        dir.path().join("state/sparkform.json"),
        sparkform::state::PgTarget {
            schema: "sparkform".into(),
            workspace: "team".into(),
        },
        &pg.conn,
    )
    .unwrap_or_else(|e| panic!("{e:?}"))
}

/// Two checkouts of one state: what the first applied (its sensitive values hashed under the
/// key its apply created) the second plans as "No changes", with no key file of its own: the
/// key is kept in PostgreSQL with the state, sealed under the state key. With the kept key gone
/// the second plans every sensitive value as changed, which is what a key beside each checkout
/// did.
#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_a_teammates_checkout_plans_no_changes_with_the_key_kept_in_the_state() {
    let pg = Pg::start();
    let (first, second) = (checkout(), checkout());
    let state_key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let store = |dir: &tempfile::TempDir| {
        team_store(&pg, dir).with_key(Some(
            sparkform::state::StateKey::from_base64(state_key).unwrap(),
        ))
    };
    // The first checkout's apply: the key it creates, the plan recorded under it.
    let a = store(&first);
    let key = a.key_or_create().unwrap_or_else(|e| panic!("{e:?}"));
    let (config, graph) = common::load(first.path());
    let opts = sparkform::plan::PlanOptions::with_key(key.clone());
    let mut state = State::new();
    let p = sparkform::plan::plan(&config, &graph, &state, &opts).unwrap();
    sparkform::plan::record(&p, &mut state);
    a.write(&mut state).unwrap_or_else(|e| panic!("{e:?}"));
    let row = pg.psql("SELECT key FROM sparkform.keys WHERE workspace = 'team'");
    assert!(
        !row.is_empty() && !row.trim().chars().all(|c| c.is_ascii_hexdigit()),
        "the kept key is not sealed: {row:?}"
    );

    let plan_second = || {
        out(sparkform()
            .args(["plan", "-refresh=false"])
            .arg(second.path())
            .env("SPARKFORM_PG_CONN", &pg.conn)
            .env("SPARKFORM_STATE_KEY", state_key))
    };
    let (code, stdout, err) = plan_second();
    assert_eq!(code, 0, "{stdout}\n{err}");
    assert!(stdout.contains("No changes"), "{stdout}\n{err}");
    assert!(!stdout.contains("key for sensitive values"), "{stdout}");
    for dir in [&first, &second] {
        assert!(
            !dir.path().join("state/sparkform.key").exists(),
            "a key file beside a checkout"
        );
    }

    pg.psql("DELETE FROM sparkform.keys WHERE workspace = 'team'");
    let (code, stdout, err) = plan_second();
    assert_eq!(code, 0, "{stdout}\n{err}");
    assert!(
        stdout.contains("key for sensitive values"),
        "without the kept key the second checkout planned: {stdout}"
    );
}

/// A key file an earlier sparkform left beside a checkout is adopted by the first apply on
/// PostgreSQL (kept there from then on); another checkout's different file is then an error
/// that names both, for a plan and an apply alike.
#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_a_key_file_from_before_is_adopted_and_a_different_one_is_refused_naming_both() {
    let pg = Pg::start();
    let (old, stray, fresh) = (checkout(), checkout(), checkout());
    let pg_store = |dir: &tempfile::TempDir| team_store(&pg, dir);
    let file_store =
        |dir: &tempfile::TempDir| StateStore::new(dir.path().join("state/sparkform.json"));
    let file_key = file_store(&old).key_or_create().unwrap();
    // Before the first apply on PostgreSQL the file is the key; the apply keeps it there.
    assert_eq!(pg_store(&old).read_key().unwrap(), Some(file_key.clone()));
    assert_eq!(pg_store(&fresh).read_key().unwrap(), None);
    assert_eq!(pg_store(&old).key_or_create().unwrap(), file_key);
    assert_eq!(pg_store(&fresh).read_key().unwrap(), Some(file_key.clone()));
    assert_eq!(pg_store(&fresh).key_or_create().unwrap(), file_key);

    let other = file_store(&stray).key_or_create().unwrap();
    assert_ne!(other, file_key);
    for result in [
        pg_store(&stray).read_key().map(|_| ()),
        pg_store(&stray).key_or_create().map(|_| ()),
    ] {
        let e = result.expect_err("two keys for one state");
        let text = e.to_string();
        assert!(
            text.contains("PostgreSQL sparkform.states, workspace \"team\"")
                && text.contains(
                    &stray
                        .path()
                        .join("state/sparkform.key")
                        .display()
                        .to_string()
                ),
            "{text}"
        );
    }
    let (code, _, err) = out(sparkform()
        .args(["plan", "-refresh=false"])
        .arg(stray.path())
        .env("SPARKFORM_PG_CONN", &pg.conn));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("two keys for the hashes of sensitive values"),
        "{err}"
    );
}

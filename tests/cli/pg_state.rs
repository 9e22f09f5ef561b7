//! The `state` block and the state commands through the binary: a connection written in the
//! definitions is refused, a missing connection is a clear error, and (with a throwaway
//! PostgreSQL, `common::pg`) `state migrate`, `pull` and `push`.

use crate::common;
use crate::common::pg::Pg;

use assert_cmd::Command;
use sparkform::state::{ResourceState, State, StateStore};

fn sparkform() -> Command {
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
fn out(c: &mut Command) -> (i32, String, String) {
    let o = c.output().expect("run");
    let err = String::from_utf8_lossy(&o.stderr).replace('│', " ");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        err.split_whitespace().collect::<Vec<_>>().join(" "),
    )
}

fn folder(block: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("main.hcl"),
        format!("{block}\nnode \"n1\" {{\n  address = \"10.0.0.1\"\n}}\n"),
    )
    .unwrap();
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

fn sample() -> State {
    let mut s = State::new();
    s.resources.insert(
        "network.fabric.attach.n1".into(),
        ResourceState {
            kind: sparkform::kinds::KindId::Attachment,
            node: Some("n1".into()),
            config_hash: "sha256:00".into(),
            config: serde_json::json!({"address": "192.168.1.1"}),
            attributes: Default::default(),
            depends_on: vec![],
            last_apply_secs: None,
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

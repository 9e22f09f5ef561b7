//! Workspaces: `-workspace NAME` (or `SPARKFORM_WORKSPACE`) selects another state of the same
//! definitions without editing them: the local file DIR/state/workspaces/NAME/sparkform.json,
//! or PostgreSQL's row of that name; `workspace list` shows them, the one in use marked; a plan
//! names a workspace that is not `default`.

use crate::common::pg::Pg;
use crate::pg_state::{folder, out, sample, sparkform};

use sparkform::state::StateStore;

/// `state push` of a state document (as `state pull` prints one) into the deployment `dir`,
/// with `env`: its exit code and stderr.
fn push(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let file = dir.join("pushed.json");
    StateStore::new(&file).write(&mut sample()).unwrap();
    let mut c = sparkform();
    c.args(["state", "push"]).arg(&file).arg(dir).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let (code, _, err) = out(&mut c);
    (code, err)
}

#[test]
fn a_local_workspace_is_a_state_file_of_its_own_and_the_list_marks_the_one_in_use() {
    let dir = folder("");
    let d = dir.path();
    let (code, err) = push(d, &["-workspace", "staging"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(d.join("state/workspaces/staging/sparkform.json").exists());
    assert!(
        !d.join("state/sparkform.json").exists(),
        "default's file written"
    );

    let list = |env: Option<&str>, args: &[&str]| {
        let mut c = sparkform();
        c.args(["state", "list"]).arg(d).args(args);
        if let Some(w) = env {
            c.env("SPARKFORM_WORKSPACE", w);
        }
        out(&mut c)
    };
    let (_, stdout, _) = list(None, &["-workspace", "staging"]);
    assert_eq!(stdout.trim(), "network.fabric.attach.n1");
    let (code, stdout, err) = list(None, &[]);
    assert_eq!((code, stdout.trim()), (0, ""), "{err}");
    assert!(err.contains("No state at"), "{err}");
    let (_, stdout, _) = list(Some("staging"), &[]);
    assert_eq!(stdout.trim(), "network.fabric.attach.n1");

    let workspaces = |env: Option<&str>| {
        let mut c = sparkform();
        c.args(["workspace", "list"]).arg(d);
        if let Some(w) = env {
            c.env("SPARKFORM_WORKSPACE", w);
        }
        out(&mut c).1
    };
    assert_eq!(workspaces(None), "* default  (no state yet)\n  staging\n");
    assert_eq!(
        workspaces(Some("staging")),
        "  default  (no state yet)\n* staging\n"
    );

    let (code, stdout, err) = out(sparkform()
        .args(["plan", "-refresh=false"])
        .arg(d)
        .args(["-workspace", "staging"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.starts_with("Workspace \"staging\": the state in"),
        "{stdout}"
    );
    assert!(stdout.contains("network.fabric.attach.n1"), "{stdout}");
    let (_, stdout, _) = out(sparkform().args(["plan", "-refresh=false"]).arg(d));
    assert!(!stdout.contains("Workspace"), "{stdout}");
}

#[test]
fn a_workspace_that_is_no_name_or_that_contradicts_state_is_refused() {
    let dir = folder("");
    let d = dir.path();
    for bad in ["../escape", ".hidden", "a/b", ""] {
        let (code, _, err) = out(sparkform()
            .args(["state", "list"])
            .arg(d)
            .args(["-workspace", bad]));
        assert_ne!(code, 0, "{bad:?} accepted");
        assert!(err.contains("is not a workspace name"), "{bad:?}: {err}");
    }
    let (code, _, err) = out(sparkform().args(["plan", "-refresh=false"]).arg(d).args([
        "-state",
        "elsewhere.json",
        "-workspace",
        "staging",
    ]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("give one of them"), "{err}");
    assert!(!d.join("state").exists(), "something was written");
}

#[test]
#[ignore = "needs PostgreSQL binaries (apt install postgresql)"]
fn pg_a_workspace_is_a_row_of_its_own_whatever_the_block_names() {
    let pg = Pg::start();
    let dir = folder("state {\n  backend = \"pg\"\n}");
    let d = dir.path();
    let (code, err) = push(
        d,
        &[],
        &[
            ("SPARKFORM_PG_CONN", &pg.conn),
            ("SPARKFORM_WORKSPACE", "staging"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        pg.psql("SELECT workspace FROM sparkform.states ORDER BY 1"),
        "staging"
    );
    let (code, stdout, err) = out(sparkform()
        .args(["workspace", "list"])
        .arg(d)
        .env("SPARKFORM_PG_CONN", &pg.conn));
    assert_eq!(code, 0, "{err}");
    assert_eq!(stdout, "* default  (no state yet)\n  staging\n");
    let (_, stdout, _) = out(sparkform()
        .args(["state", "list"])
        .arg(d)
        .args(["-workspace", "staging"])
        .env("SPARKFORM_PG_CONN", &pg.conn));
    assert_eq!(stdout.trim(), "network.fabric.attach.n1");
}

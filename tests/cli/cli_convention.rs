//! One convention for where the deployment is: every command that reads a deployment takes its
//! folder as a positional argument (default `.`), finds the state at DIR/state/sparkform.json
//! (or `-state PATH`), and names the state file it looked for when there is none. Run from
//! another working directory, so nothing can come from the current folder by accident.

use crate::common;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use sparkform::state::{State, StateStore};

/// A deployment on this machine (`address = "local"`): an attachment nothing touches without a
/// refresh, a probe that runs `true` here, a warning and an output.
const DEPLOYMENT: &str = r#"
node "n1" {
  address = "local"
}

network "fabric" {
  subnet = "192.168.77.0/24"
  attach "n1" {
    node      = node.n1
    interface = "eth9"
    address   = "192.168.77.1"
  }
}

probe "up" {
  timeout    = "5s"
  depends_on = [network.fabric]
  exec {
    node    = node.n1
    command = ["true"]
  }
}

check "warned" {
  condition     = false
  error_message = "this deployment warns"
  severity      = "warning"
}

output "where" {
  value = network.fabric.attach.n1.address
}
"#;

/// `root/deploy` holds the definitions, `root/elsewhere` is where the commands run.
struct Bed {
    root: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        let root =
            common::write_config(&[("deploy/main.hcl", DEPLOYMENT), ("elsewhere/.keep", "")]);
        Bed { root }
    }

    fn deploy(&self) -> PathBuf {
        self.root.path().join("deploy")
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.deploy().join("state/sparkform.json"))
    }

    /// Record the definitions as applied, as an apply would have left them.
    fn applied(&self) -> State {
        let mut state = common::applied(&self.deploy());
        self.store().write(&mut state).unwrap();
        state
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        run_in(&self.root.path().join("elsewhere"), args)
    }
}

fn run_in(cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::cargo_bin("sparkform")
        .expect("binary")
        .current_dir(cwd)
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(args)
        .output()
        .expect("run");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn every_deployment_reading_command_takes_the_folder_positionally_and_reads_its_state() {
    let bed = Bed::new();
    let state = bed.applied();
    let d = "../deploy";
    let serial = format!("serial {}", state.serial);

    let (code, stdout, stderr) = bed.run(&["validate", d]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid: 1 node, 2 resources"), "{stdout}");

    let (code, stdout, _) = bed.run(&["graph", d]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("\"network.fabric.attach.n1\" -> \"probe.up\""),
        "{stdout}"
    );

    // nodes looks at this machine, the deployment's only node, with the folder's definitions.
    let (_, stdout, stderr) = bed.run(&["nodes", d]);
    assert!(
        stdout.contains("network.fabric.attach.n1 uses interface eth9"),
        "{stdout}{stderr}"
    );

    // Planned against the recorded state: nothing to do.
    let (code, stdout, stderr) = bed.run(&["plan", d, "-refresh=false", "-detailed-exitcode"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("No changes."), "{stdout}");

    let (code, stdout, stderr) = bed.run(&["apply", d, "-refresh=false"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("No changes."), "{stdout}");

    // Destroy plans the removal of what the state records, then asks (no terminal here).
    let (code, stdout, stderr) = bed.run(&["destroy", d]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("network.fabric.attach.n1") && stdout.contains("destroy"),
        "{stdout}"
    );
    assert!(stderr.contains("-auto-approve"), "{stderr}");

    // The probe's dependency is in the state, so it runs (`true`, here).
    let (code, stdout, stderr) = bed.run(&["verify", d]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("1 probe passed, 0 failed"), "{stdout}");

    let (code, stdout, _) = bed.run(&["show", d]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("deploy/state/sparkform.json")
            && stdout.contains(&serial)
            && stdout.contains(&state.lineage),
        "{stdout}"
    );

    let (code, stdout, _) = bed.run(&["output", d]);
    assert_eq!((code, stdout.trim()), (0, "where = \"192.168.77.1\""));
    let (code, stdout, _) = bed.run(&["output", "where", d]);
    assert_eq!((code, stdout.trim()), (0, "192.168.77.1"));

    let (code, stdout, _) = bed.run(&["state", "list", d]);
    assert_eq!(code, 0);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["network.fabric.attach.n1", "probe.up"]
    );
    let (code, stdout, _) = bed.run(&["state", "show", "probe.up", d]);
    assert_eq!(code, 0);
    assert!(
        stdout.starts_with("# probe.up (probe on node.n1)"),
        "{stdout}"
    );

    // The holder (this test) still runs: only -force removes its lock.
    let lock = bed.store().lock("apply").unwrap();
    let id = lock.info().id.clone();
    let (code, stdout, stderr) = bed.run(&["force-unlock", "-force", &id, d]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("Removed the lock"), "{stdout}");
    drop(lock);

    // From inside the folder, `.` is the default and reads the same state.
    let (code, stdout, _) = run_in(&bed.deploy(), &["state", "list"]);
    assert_eq!((code, stdout.lines().count()), (0, 2), "{stdout}");
    let (code, stdout, _) = run_in(&bed.deploy(), &["show"]);
    assert_eq!(code, 0);
    assert!(stdout.contains(&serial), "{stdout}");
}

#[test]
fn every_command_names_the_state_file_it_did_not_find() {
    let bed = Bed::new();
    let d = "../deploy";
    let missing = "No state at ../deploy/state/sparkform.json: nothing has been applied";
    for args in [
        &["show", d][..],
        &["state", "list", d],
        &["state", "show", "probe.up", d],
        &["output", d],
        &["verify", d],
    ] {
        let (_, stdout, stderr) = bed.run(args);
        assert!(
            stdout.contains(missing) || stderr.contains(missing),
            "{args:?}:\n{stdout}{stderr}"
        );
    }
    // Run where no deployment is, the message names the folder's default place.
    let (code, stdout, _) = bed.run(&["show"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("No state at ./state/sparkform.json: nothing has been applied"),
        "{stdout}"
    );
}

#[test]
fn verify_with_nothing_deployed_says_so_at_once() {
    let bed = Bed::new();
    let (code, _, stderr) = bed.run(&["verify", "../deploy"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("nothing to verify"), "{stderr}");
    assert!(
        stderr.contains("sparkform apply ../deploy"),
        "the hint says how to deploy: {stderr}"
    );
    // A state that records nothing (everything destroyed or rolled back) is the same.
    bed.store().write(&mut State::new()).unwrap();
    let (code, _, stderr) = bed.run(&["verify", "../deploy"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("records nothing: nothing is deployed"),
        "{stderr}"
    );
    // A probe whose dependency the state does not record is refused by name, without
    // retrying: its 5 s timeout would otherwise run out first.
    let mut state = bed.applied();
    state.resources.remove("network.fabric.attach.n1");
    bed.store().write(&mut state).unwrap();
    let (code, stdout, stderr) = bed.run(&["verify", "../deploy"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.contains("probe.up cannot run: network.fabric.attach.n1 is not deployed"),
        "{stderr}"
    );
    assert!(!stdout.contains("passed"), "no probe ran: {stdout}");
}

#[test]
fn state_file_option_and_the_old_dir_spelling_still_work() {
    let bed = Bed::new();
    let state = bed.applied();
    // The state elsewhere, named with -state: read without any folder.
    let moved = bed.root.path().join("elsewhere/kept.json");
    std::fs::rename(bed.store().path(), &moved).unwrap();
    for args in [
        &["state", "list", "-state", "kept.json"][..],
        &["show", "-state", "kept.json"],
        &["plan", "../deploy", "-refresh=false", "-state", "kept.json"],
    ] {
        let (code, stdout, stderr) = bed.run(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(
            stdout.contains("probe.up") || stdout.contains("No changes."),
            "{args:?}: {stdout}"
        );
    }
    std::fs::rename(&moved, bed.store().path()).unwrap();
    // Scripts written with --dir keep working.
    let (code, stdout, _) = bed.run(&["state", "list", "--dir", "../deploy"]);
    assert_eq!((code, stdout.lines().count()), (0, 2), "{stdout}");
    let (code, stdout, _) = bed.run(&["output", "where", "--dir", "../deploy"]);
    assert_eq!((code, stdout.trim()), (0, "192.168.77.1"));
    let (code, stdout, _) = bed.run(&["show", "--dir", "../deploy"]);
    assert!(code == 0 && stdout.contains(&state.lineage), "{stdout}");
    // Two different folders are refused rather than one silently chosen.
    let (code, _, stderr) = bed.run(&["state", "list", "../deploy", "--dir", "."]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("give the deployment's folder once"),
        "{stderr}"
    );
}

#[test]
fn a_folder_a_plan_file_and_neither_are_told_apart() {
    let bed = Bed::new();
    let (code, _, stderr) = bed.run(&["plan", "../deploy", "-refresh=false", "-out", "tb.plan"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, _) = bed.run(&["show", "tb.plan"]);
    assert_eq!(code, 0);
    assert!(stdout.starts_with("Plan made "), "{stdout}");
    let (code, stdout, _) = bed.run(&["show", "../deploy"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("No state at ../deploy/state"), "{stdout}");
    let (code, _, stderr) = bed.run(&["show", "../nowhere"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("../nowhere is neither a folder nor a plan file"),
        "{stderr}"
    );
    // A file where a folder is needed, and a folder that does not exist, say what they are.
    let (code, _, stderr) = bed.run(&["state", "list", "tb.plan"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("tb.plan is a file, not a folder"),
        "{stderr}"
    );
    let (code, _, stderr) = bed.run(&["output", "../nowhere"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no folder ../nowhere"), "{stderr}");
}

#[test]
fn warnings_are_in_the_json_and_on_stderr_in_text() {
    let bed = Bed::new();
    let d = "../deploy";
    let warned = |v: &serde_json::Value| {
        let w = &v["diagnostics"][0];
        assert_eq!(w["severity"], "warning", "{v}");
        assert!(
            w["message"]
                .as_str()
                .is_some_and(|m| m.contains("this deployment warns")),
            "{w}"
        );
        assert!(
            w["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("deploy/main.hcl")),
            "{w}"
        );
        assert_eq!(
            (w["line"].as_u64(), w["column"].as_u64()),
            (Some(25), Some(19)),
            "{w}"
        );
    };
    let (code, stdout, stderr) = bed.run(&["plan", d, "-refresh=false", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    warned(&serde_json::from_str(&stdout).unwrap());
    assert!(
        !stderr.contains("warns"),
        "JSON mode keeps stderr quiet: {stderr}"
    );
    let (code, stdout, _) = bed.run(&["validate", d, "--json"]);
    assert_eq!(code, 0);
    warned(&serde_json::from_str(&stdout).unwrap());
    // apply --json: the warnings are the first JSON line, ahead of the progress.
    let (code, stdout, stderr) = bed.run(&["apply", d, "-refresh=false", "--json"]);
    assert_eq!(code, 1, "no terminal and no -auto-approve: {stderr}");
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"], "diagnostics");
    warned(&first);
    // Text mode: on stderr, with the place.
    let (code, _, stderr) = bed.run(&["plan", d, "-refresh=false"]);
    assert_eq!(code, 0);
    assert!(
        stderr.contains("this deployment warns") && stderr.contains("main.hcl:25:19"),
        "{stderr}"
    );
}

/// Terraform's `-no-color` (one dash, as the single-dash list names it) is taken by every
/// command, before or after the folder, and changes nothing else.
#[test]
fn no_color_is_taken_as_terraform_spells_it() {
    let d = Bed::new();
    let dir = d.deploy();
    let dir = dir.to_str().unwrap();
    for args in [
        vec!["validate", "-no-color", dir],
        vec!["validate", dir, "--no-color"],
        vec!["plan", dir, "-no-color", "-refresh=false"],
    ] {
        let (code, out, err) = d.run(&args);
        assert_eq!(code, 0, "{args:?}: {out}\n{err}");
        assert!(!err.contains("unexpected argument"), "{err}");
        assert!(
            !out.contains('\u{1b}') && !err.contains('\u{1b}'),
            "{args:?}"
        );
    }
}

//! The command line as a user runs it: exit codes, files written, messages.

use crate::common;

use assert_cmd::Command;
use sparkform::plan::planfile::PlanFile;
use sparkform::state::{State, StateStore};

fn sparkform() -> Command {
    let mut c = Command::cargo_bin("sparkform").expect("binary");
    c.env_remove("SPARKFORM_VAR_ray_image");
    c
}

fn out(c: &mut Command) -> (i32, String, String) {
    let o = c.output().expect("run");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

/// A copy of the cluster fixture in a temp dir, so state files land there.
fn cluster() -> tempfile::TempDir {
    let text = std::fs::read_to_string("tests/fixtures/plan/cluster/main.hcl").unwrap();
    common::write_config(&[("main.hcl", &text)])
}

/// The definitions in `dir` recorded as applied (nothing runs): its state's store.
fn record_as_applied(dir: &std::path::Path) -> StateStore {
    let (c, g) = common::load(dir);
    let store = StateStore::new(dir.join("state/sparkform.json"));
    let mut state = State::new();
    let p = sparkform::plan::plan(&c, &g, &state, &Default::default()).unwrap();
    sparkform::plan::record(&p, &mut state);
    store.write(&mut state).unwrap();
    store
}

/// Definitions of one container `name` on this machine's Docker Engine, recorded as applied
/// though no such container runs (its image is none the engine has): the state's store.
fn recorded_gone_container(name: &str) -> (tempfile::TempDir, StateStore) {
    let dir = common::write_config(&[(
        "main.hcl",
        &format!("node \"here\" {{\n  address = \"local\"\n}}\n\ncontainer \"gone\" {{\n  node  = node.here\n  name  = \"{name}\"\n  image = \"sf-none:never\"\n}}\n"),
    )]);
    let store = record_as_applied(dir.path());
    (dir, store)
}

#[test]
fn validate_ok_and_error_exit_codes() {
    let (code, stdout, _) = out(sparkform().args(["validate", "examples/qwen35-two-sparks"]));
    assert_eq!(code, 0);
    assert!(stdout.contains("valid: 2 nodes, 9 resources"), "{stdout}");
    let (code, _, stderr) =
        out(sparkform().args(["validate", "tests/fixtures/diagnostics/wrong_type"]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("Error: 4 errors in the configuration."),
        "{stderr}"
    );
    let (code, stdout, _) = out(sparkform().args([
        "validate",
        "tests/fixtures/diagnostics/wrong_type",
        "--json",
    ]));
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["diagnostics"][0]["labels"][0]["line"], 3);
}

#[test]
fn plan_detailed_exitcode_and_json() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    let (code, stdout, _) =
        out(sparkform().args(["plan", d, "-refresh=false", "-detailed-exitcode"]));
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("Plan: 7 to add"), "{stdout}");
    let (code, stdout, _) = out(sparkform().args(["plan", d, "-refresh=false", "--json"]));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["plan"]["summary"]["create"], 7);
    // Record it as applied: planning again exits 0 with -detailed-exitcode.
    record_as_applied(dir.path());
    let (code, stdout, _) =
        out(sparkform().args(["plan", d, "-refresh=false", "-detailed-exitcode"]));
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("No changes."), "{stdout}");
    // -var changes the plan; an unknown -var is an error naming the closest variable.
    let (code, stdout, _) = out(sparkform().args([
        "plan",
        d,
        "-refresh=false",
        "-var",
        "ray_image=ray:3",
        "-detailed-exitcode",
    ]));
    assert_eq!(code, 2);
    assert!(
        stdout.contains("3 to replace") || stdout.contains("4 to replace"),
        "{stdout}"
    );
    let (code, _, stderr) = out(sparkform().args(["plan", d, "-var", "ray_imgae=x"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("did you mean `ray_image`?"), "{stderr}");
    // The environment sets variables too.
    let (code, _, _) = out(sparkform()
        .args(["plan", d, "-refresh=false", "-detailed-exitcode"])
        .env("SPARKFORM_VAR_ray_image", "ray:4"));
    assert_eq!(code, 2);
    // A var file (outside the configuration folder, or it would be read as definitions).
    let vars = common::write_config(&[
        ("prod.vars", "restart = \"always\"\n"),
        ("bad.vars", "restart = 1\nrestrat = \"x\"\n"),
    ]);
    let var_file = vars.path().join("prod.vars");
    let (code, stdout, stderr) = out(sparkform().args([
        "plan",
        d,
        "-refresh=false",
        "-var-file",
        var_file.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("restart = \"no\" → \"always\""), "{stdout}");
    let bad = vars.path().join("bad.vars");
    let (code, _, stderr) = out(sparkform().args(["plan", d, "-var-file", bad.to_str().unwrap()]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("bad.vars:2:1") || stderr.contains("bad.vars:2"),
        "{stderr}"
    );
    assert!(stderr.contains("did you mean `restart`?"), "{stderr}");
}

#[test]
fn stale_planfile_is_refused() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    let plan_path = dir.path().join("out.plan");
    let (code, _, stderr) = out(sparkform().args([
        "plan",
        d,
        "-refresh=false",
        "-out",
        plan_path.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stderr}");
    let pf = PlanFile::read(&plan_path).unwrap();
    assert_eq!(pf.state_lineage, None);
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    // Fresh against the state it was made from (none).
    pf.check_fresh(&plan_path, None).unwrap();
    // The state changes: the plan is stale.
    let mut state = State::new();
    store.write(&mut state).unwrap();
    let err = pf.check_fresh(&plan_path, Some(&state)).unwrap_err();
    assert!(err.to_string().contains("stale"), "{err}");
    // A plan made against serial 1 is refused at serial 2, and against another lineage.
    let (code, _, _) = out(sparkform().args([
        "plan",
        d,
        "-refresh=false",
        "-out",
        plan_path.to_str().unwrap(),
    ]));
    assert_eq!(code, 0);
    let pf = PlanFile::read(&plan_path).unwrap();
    assert_eq!(pf.state_serial, 1);
    pf.check_fresh(&plan_path, Some(&state)).unwrap();
    store.write(&mut state).unwrap();
    let err = pf.check_fresh(&plan_path, Some(&state)).unwrap_err();
    assert!(
        err.to_string()
            .contains("serial 1, and the state is now at serial 2"),
        "{err}"
    );
    let other = State::new();
    assert!(pf.check_fresh(&plan_path, Some(&other)).is_err());
    // show reads it back.
    let (code, stdout, _) = out(sparkform().args(["show", plan_path.to_str().unwrap()]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("at serial 1") && stdout.contains("Plan: 7 to add"),
        "{stdout}"
    );
    // Garbage is not a plan file.
    std::fs::write(&plan_path, "{}").unwrap();
    let (code, _, stderr) = out(sparkform().args(["show", plan_path.to_str().unwrap()]));
    assert_eq!(code, 1);
    assert!(stderr.contains("not a sparkform plan file"), "{stderr}");
}

#[test]
fn state_commands_and_corrupt_state() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    let (code, _, _) = out(sparkform().args(["state", "list", d]));
    assert_eq!(code, 0);
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    let mut state = common::applied(dir.path());
    store.write(&mut state).unwrap();
    let (code, stdout, _) = out(sparkform().args(["state", "list", d]));
    assert_eq!(code, 0);
    assert!(
        stdout.lines().any(|l| l == "container.worker[\"n2\"]"),
        "{stdout}"
    );
    let (code, stdout, _) = out(sparkform().args(["state", "show", "container.head", d]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("image") && stdout.contains("sha256:"),
        "{stdout}"
    );
    assert!(!stdout.contains("hf_plan_fixture_secret"), "{stdout}");
    let (code, _, stderr) = out(sparkform().args(["state", "show", "container.haed", d]));
    assert_eq!(code, 1);
    assert!(stderr.contains("Did you mean container.head?"), "{stderr}");
    let (code, stdout, _) = out(sparkform().args(["output", d]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("endpoint = \"http://192.168.200.1:8000\"")
            && stdout.contains("token = (sensitive)"),
        "{stdout}"
    );
    let (code, stdout, _) = out(sparkform().args(["output", "endpoint", d]));
    assert_eq!((code, stdout.trim()), (0, "http://192.168.200.1:8000"));
    // -raw, as Terraform's: the value exactly, no newline; a map refused with the way to get it.
    let (code, stdout, _) = out(sparkform().args(["output", "-raw", "endpoint", d]));
    assert_eq!((code, stdout.as_str()), (0, "http://192.168.200.1:8000"));
    let mut with_map = state.clone();
    with_map.outputs.insert(
        "ports".into(),
        sparkform::state::OutputState {
            value: serde_json::json!({ "api": 8000 }),
            sensitive: false,
        },
    );
    store.write(&mut with_map).unwrap();
    let (code, stdout, stderr) = out(sparkform().args(["output", "-raw", "ports", d]));
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.contains("output \"ports\" is a map") && stderr.contains("output -json ports"),
        "{stderr}"
    );
    let (code, _, stderr) = out(sparkform().args(["output", "-raw", "token", d]));
    assert_eq!(code, 1);
    assert!(stderr.contains("sensitive"), "{stderr}");
    // A corrupt state is an error that names the line, and plan refuses to go on.
    std::fs::write(
        store.path(),
        "{\n  \"format_version\": 1,\n  \"serial\": oops\n}",
    )
    .unwrap();
    let (code, _, stderr) = out(sparkform().args(["plan", d, "-refresh=false"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("line 3"), "{stderr}");
    // A newer format is refused with an upgrade hint.
    std::fs::write(
        store.path(),
        r#"{"format_version": 99, "serial": 1, "lineage": "x"}"#,
    )
    .unwrap();
    let (code, _, stderr) = out(sparkform().args(["plan", d, "-refresh=false"]));
    assert_eq!(code, 1);
    assert!(stderr.to_lowercase().contains("newer"), "{stderr}");
}

#[test]
fn lock_held_and_force_unlock() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    let lock = store.lock("apply").unwrap();
    let id = lock.info().id.clone();
    // A second writer fails at once and names the holder.
    let err = match store.lock("apply") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("second lock granted"),
    };
    assert!(err.contains(&std::process::id().to_string()), "{err}");
    let (code, _, stderr) = out(sparkform().args(["force-unlock", "not-the-id", d]));
    assert_eq!(code, 1, "{stderr}");
    // The holder (this test) still runs: refused without -force.
    let (code, _, stderr) = out(sparkform().args(["force-unlock", &id, d]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("lock_live") && stderr.contains("-force"),
        "{stderr}"
    );
    assert!(store.lock_path().exists());
    let (code, stdout, _) = out(sparkform().args(["force-unlock", "-force", &id, d]));
    assert_eq!(code, 0);
    assert!(stdout.contains("Removed the lock"), "{stdout}");
    drop(lock);
}

#[test]
fn fmt_check_reports_and_fmt_fixes() {
    let dir = common::write_config(&[(
        "main.hcl",
        "# keep me\nnode \"a\" {\naddress = \"local\"   # here\n    user = \"root\"\n}\n",
    )]);
    let d = dir.path().to_str().unwrap();
    let (code, stdout, stderr) = out(sparkform().args(["fmt", "--check", d]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.contains("+  address = \"local\" # here"), "{stdout}");
    let (code, _, _) = out(sparkform().args(["fmt", d]));
    assert_eq!(code, 0);
    let text = std::fs::read_to_string(dir.path().join("main.hcl")).unwrap();
    assert_eq!(
        text,
        "# keep me\nnode \"a\" {\n  address = \"local\" # here\n  user    = \"root\"\n}\n"
    );
    let (code, _, _) = out(sparkform().args(["fmt", "-check", d]));
    assert_eq!(code, 0);
}

#[test]
fn every_command_explains_itself_with_an_example() {
    // Every command `sparkform --help` lists, so a new one cannot go without an example.
    let (code, top, _) = out(sparkform().args(["--help"]));
    assert_eq!(code, 0);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Options:"))
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help" && c != "state")
        .collect();
    assert!(
        commands.len() >= 18 && commands.iter().any(|c| c == "connections"),
        "{commands:?}"
    );
    for cmd in &commands {
        let (code, stdout, _) = out(sparkform().args([cmd.as_str(), "--help"]));
        assert_eq!(code, 0, "{cmd}");
        assert!(
            stdout.contains("Example"),
            "{cmd} --help has no example:\n{stdout}"
        );
    }
    // `state` is a group: its subcommands carry the examples.
    for sub in ["list", "show", "pull", "push", "migrate"] {
        let (_, stdout, _) = out(sparkform().args(["state", sub, "--help"]));
        assert!(stdout.contains("Example"), "state {sub}");
    }
}

#[test]
fn graph_prints_dot_in_dependency_order() {
    let (code, stdout, _) = out(sparkform().args(["graph", "examples/qwen35-two-sparks"]));
    assert_eq!(code, 0);
    assert!(stdout.starts_with("digraph sparkform {"));
    assert!(
        stdout.contains(
            "\"module.qwen.module.ray.probe.ray_members\" -> \"module.qwen.container.vllm\";"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"module.qwen.container.vllm\" -> \"probe.hello\";"),
        "{stdout}"
    );
}

/// Functions work wherever an expression can be: a variable's validation, a local, an attach
/// block, a container attribute, a nested ready block, a probe, a check and an output (contexts
/// get the function table only where a call is, so each place is checked).
#[test]
fn functions_work_in_every_kind_of_block() {
    let dir = common::write_config(&[(
        "main.hcl",
        r#"
variable "name" {
  default = "web"
  validation {
    condition     = length(var.name) > 2
    error_message = "too short"
  }
}
locals {
  port = tonumber("8080")
}
node "n1" {
  address = "10.0.0.1"
}
network "fabric" {
  subnet = "192.168.200.0/24"
  attach "n1" {
    node      = node.n1
    interface = lower("ENP1S0")
    address   = cidrhost("192.168.200.0/24", 7)
  }
}
container "web" {
  node    = node.n1
  name    = upper(var.name)
  image   = format("%s:%s", "busybox", "1")
  command = split(" ", "httpd -f")
  ready {
    http = "http://${network.fabric.attach.n1.address}:${tostring(local.port)}/"
  }
}
probe "hello" {
  http {
    via = node.n1
    url = join("", ["http://", network.fabric.attach.n1.address, ":", tostring(local.port)])
  }
  expect {
    contains = trimspace(" hello ")
  }
}
check "port" {
  condition     = max(local.port, 1) == 8080
  error_message = "port"
}
output "where" {
  value = format("%s:%d", network.fabric.attach.n1.address, local.port)
}
"#,
    )]);
    let d = dir.path().to_str().unwrap();
    let (code, stdout, stderr) = out(sparkform().args(["plan", d, "-refresh=false", "--json"]));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let text = v.to_string();
    for expected in [
        "\"enp1s0\"",
        "\"192.168.200.7\"",
        "\"WEB\"",
        "\"busybox:1\"",
        "http://192.168.200.7:8080/",
        "\"hello\"",
    ] {
        assert!(text.contains(expected), "{expected} missing from {text}");
    }
    // The validation calls length(): a short name fails it rather than erroring on the call.
    let (code, _, stderr) = out(sparkform().args(["validate", d, "-var", "name=ab"]));
    assert_eq!(code, 1);
    assert!(stderr.contains("too short"), "{stderr}");
}

/// `--persist` (and `SPARKFORM_PERSIST`) takes a bounded duration; anything else is refused
/// before anything connects, naming the value and the form. `connections` with nothing kept
/// says so and creates nothing.
#[test]
fn persist_takes_a_bounded_duration_and_connections_lists_nothing_kept() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    for (how, bad) in [("flag", "5s"), ("env", "forever")] {
        let mut c = sparkform();
        c.args(["plan", d, "-refresh=false"]);
        match how {
            "flag" => c.args(["-persist", bad]),
            _ => c.env("SPARKFORM_PERSIST", bad),
        };
        let (code, _, stderr) = out(&mut c);
        assert_eq!(code, 1, "{how} {bad}: {stderr}");
        assert!(
            stderr.contains(bad) && stderr.contains("--persist"),
            "{stderr}"
        );
    }
    let (code, stdout, stderr) = out(sparkform()
        .args(["plan", d, "-refresh=false"])
        .env("SPARKFORM_PERSIST", "off"));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let runtime = tempfile::tempdir().unwrap();
    let (code, stdout, _) = out(sparkform()
        .args(["connections"])
        .env("XDG_RUNTIME_DIR", runtime.path()));
    assert_eq!(code, 0);
    assert!(stdout.contains("No kept connections"), "{stdout}");
    assert!(!runtime.path().join("sparkform-warm").exists());
}

/// `-chdir=DIR` before the command, as Terraform's: the command runs as if started there; a
/// folder that does not exist is an error naming it, exit 1.
#[test]
fn chdir_runs_the_command_in_that_folder() {
    let dir = cluster();
    let (code, stdout, stderr) =
        out(sparkform().args([&format!("-chdir={}", dir.path().display()), "validate"]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("The configuration is valid"), "{stdout}");
    let missing = dir.path().join("no-such-folder");
    let (code, _, stderr) =
        out(sparkform().args([&format!("-chdir={}", missing.display()), "validate"]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!("-chdir={}: cannot run there", missing.display())),
        "{stderr}"
    );
}

#[test]
fn the_folders_own_var_files_load_in_terraforms_order() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    // The head's restart policy as the plan creates it.
    let restart_is = |stdout: &str, want: &str| {
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("+ restart") && l.ends_with(&format!("\"{want}\"")))
    };
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan", d, "-refresh=false"];
        args.extend_from_slice(extra);
        out(sparkform().args(&args))
    };
    // sparkform.tfvars is read by itself.
    std::fs::write(
        dir.path().join("sparkform.tfvars"),
        "restart = \"always\"\n",
    )
    .unwrap();
    let (code, stdout, stderr) = plan(&[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(restart_is(&stdout, "always"), "{stdout}");
    // *.auto.tfvars after it, by name: the last one wins.
    std::fs::write(
        dir.path().join("a.auto.tfvars"),
        "restart = \"on-failure\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.auto.tfvars"),
        "restart = \"unless-stopped\"\n",
    )
    .unwrap();
    let (_, stdout, _) = plan(&[]);
    assert!(restart_is(&stdout, "unless-stopped"), "{stdout}");
    // -var-file, then -var, after the folder's own files.
    let vars = common::write_config(&[("given.vars", "restart = \"on-failure\"\n")]);
    let given = vars.path().join("given.vars");
    let (_, stdout, _) = plan(&["-var-file", given.to_str().unwrap()]);
    assert!(restart_is(&stdout, "on-failure"), "{stdout}");
    let (_, stdout, _) = plan(&[
        "-var-file",
        given.to_str().unwrap(),
        "-var",
        "restart=always",
    ]);
    assert!(restart_is(&stdout, "always"), "{stdout}");
    // An auto-loaded file with an unknown variable, or one that does not parse: exit 1,
    // naming the file and its line.
    std::fs::write(
        dir.path().join("c.auto.tfvars"),
        "restart = \"no\"\nrestrat = \"x\"\n",
    )
    .unwrap();
    let (code, _, stderr) = plan(&[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("c.auto.tfvars:2"), "{stderr}");
    assert!(stderr.contains("did you mean `restart`?"), "{stderr}");
    std::fs::write(dir.path().join("c.auto.tfvars"), "restart = \n").unwrap();
    let (code, _, stderr) = plan(&[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("the auto-loaded"), "{stderr}");
    assert!(stderr.contains("c.auto.tfvars"), "{stderr}");
}

#[test]
fn a_destroy_saved_as_a_plan_file_applies_exactly_and_only_once() {
    // A container on this machine's Docker Engine that is no longer there: its removal
    // finds it gone, so the test needs no image.
    let (dir, store) = recorded_gone_container("sf-cli-destroy-plan-gone");
    let d = dir.path().to_str().unwrap();
    let plan_path = dir.path().join("down.plan");
    let down = plan_path.to_str().unwrap();
    // -destroy with an apply's flag: refused before anything is read.
    let (code, _, stderr) =
        out(sparkform().args(["plan", d, "-destroy", "-replace", "container.gone"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("-destroy plans a removal"), "{stderr}");
    let (code, stdout, stderr) = out(sparkform().args([
        "plan",
        d,
        "-destroy",
        "-refresh=false",
        "-out",
        down,
        "-detailed-exitcode",
    ]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stdout.contains("1 to destroy"), "{stdout}");
    // Nothing changed yet; show names it a destroy.
    assert_eq!(store.load().unwrap().unwrap().resources.len(), 1);
    let (code, stdout, _) = out(sparkform().args(["show", down]));
    assert_eq!(code, 0);
    assert!(stdout.starts_with("Destroy plan made"), "{stdout}");
    let (code, stdout, stderr) = out(sparkform().args(["apply", down]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("1 destroyed"), "{stdout}");
    assert!(store.load().unwrap().unwrap().resources.is_empty());
    // The state moved on: the same file again is refused, changing nothing.
    let (code, _, stderr) = out(sparkform().args(["apply", down]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("stale") || stderr.contains("changed"),
        "{stderr}"
    );
}

#[test]
fn state_mv_and_state_rm_rewrite_only_the_records_they_name() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    let store = record_as_applied(dir.path());
    let before = store.load().unwrap().unwrap();
    let head = before.resources["container.head"].clone();
    let list = || {
        let (code, stdout, stderr) = out(sparkform().args(["state", "list", d]));
        assert_eq!(code, 0, "{stderr}");
        stdout.lines().map(str::to_string).collect::<Vec<_>>()
    };
    assert!(list().contains(&"container.head".to_string()));
    // mv: the record under its new address, the same record; the serial moves on.
    let (code, stdout, stderr) =
        out(sparkform().args(["state", "mv", "container.head", "container.ray_head", d]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("Moved container.head to container.ray_head"),
        "{stdout}"
    );
    let after = store.load().unwrap().unwrap();
    assert!(!after.resources.contains_key("container.head"));
    assert_eq!(after.resources["container.ray_head"].config, head.config);
    assert_eq!(after.resources.len(), before.resources.len());
    assert!(after.serial > before.serial);
    // mv to an address that is recorded already, or from one that is not: refused, nothing
    // written.
    let (code, _, stderr) = out(sparkform().args([
        "state",
        "mv",
        "container.ray_head",
        "network.fabric.attach.n1",
        d,
    ]));
    assert_eq!(code, 1, "{stderr}");
    let (code, _, stderr) =
        out(sparkform().args(["state", "mv", "container.nope", "container.x", d]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("container.nope"), "{stderr}");
    assert_eq!(store.load().unwrap().unwrap().serial, after.serial);
    // rm: every instance of a resource; the rest stays.
    let workers = after
        .resources
        .keys()
        .filter(|a| a.starts_with("container.worker["))
        .count();
    assert!(workers > 0);
    let (code, stdout, stderr) = out(sparkform().args(["state", "rm", "container.worker", d]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("forgotten") || stdout.contains("Removed"),
        "{stdout}"
    );
    let now = list();
    assert!(
        now.iter().all(|a| !a.starts_with("container.worker")),
        "{now:?}"
    );
    assert_eq!(now.len(), after.resources.len() - workers, "{now:?}");
    let (code, _, stderr) = out(sparkform().args(["state", "rm", "container.worker", d]));
    assert_eq!(code, 1, "{stderr}");
}

#[test]
fn sparkform_log_writes_what_ran_and_never_a_secret() {
    // A port nothing listens on: the probe fails, after its requests are logged.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = common::write_config(&[(
        "main.hcl",
        &format!(
            "variable \"token\" {{\n  type      = string\n  sensitive = true\n}}\n\nnode \"here\" {{\n  address = \"local\"\n}}\n\nprobe \"canary\" {{\n  timeout = \"2s\"\n  http {{\n    via = node.here\n    url = \"http://127.0.0.1:{port}/v1/models?key=${{var.token}}\"\n  }}\n  expect {{\n    status = 200\n  }}\n}}\n"
        ),
    )]);
    let d = dir.path().to_str().unwrap();
    let log = dir.path().join("sparkform.log");
    let marker = "marker-7f3a9c-do-not-log";
    let (code, stdout, stderr) = out(sparkform()
        .args(["apply", d, "-auto-approve"])
        .env("SPARKFORM_VAR_token", marker)
        .env("SPARKFORM_LOG", "trace")
        .env("SPARKFORM_LOG_PATH", &log));
    assert_eq!(code, 1, "the probe cannot pass: {stdout}{stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    // What ran where, and how long it took: the node's glance, the probe's requests, the
    // state's write.
    assert!(
        text.contains("remote command node=\"node.here\"") && text.contains(" ms="),
        "{text}"
    );
    assert!(text.contains("HTTP request method=GET"), "{text}");
    assert!(text.contains("state written"), "{text}");
    // The URL holds the sensitive value: the log shows the placeholder, never the value.
    assert!(!text.contains(marker), "{text}");
    assert!(text.contains("(sensitive value)"), "{text}");
    assert!(!stdout.contains(marker) && !stderr.contains(marker));
    // No SPARKFORM_LOG, no log; a level that is none: a warning naming it, and the command
    // runs.
    std::fs::remove_file(&log).unwrap();
    let (code, _, _) = out(sparkform()
        .args(["validate", d])
        .env("SPARKFORM_VAR_token", marker)
        .env("SPARKFORM_LOG_PATH", &log));
    assert_eq!(code, 0);
    assert!(!log.exists());
    let (code, stdout, stderr) = out(sparkform()
        .args(["validate", d])
        .env("SPARKFORM_VAR_token", marker)
        .env("SPARKFORM_LOG", "banana"));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("SPARKFORM_LOG=\"banana\" is not a log level"),
        "{stderr}"
    );
    assert!(stdout.contains("valid"), "{stdout}");
}

#[test]
fn validate_warns_of_gpu_memory_utilization_it_cannot_check_yet() {
    let modules = std::fs::canonicalize("modules").unwrap();
    let example = std::fs::read_to_string("examples/qwen35-two-sparks/main.hcl").unwrap();
    let with = |text: &str| {
        common::write_config(&[(
            "main.hcl",
            &text.replace("../../modules", modules.to_str().unwrap()),
        )])
    };
    let validate = |dir: &tempfile::TempDir| {
        let (code, _, stderr) = out(sparkform().args(["validate", dir.path().to_str().unwrap()]));
        assert_eq!(code, 0, "a warning, not an error: {stderr}");
        stderr
    };
    // The checks by name (miette wraps their messages).
    let unchecked = "check `utilization_unknown_memory`: could not check";
    let above = "check `utilization_on_unified_memory`";
    // The nodes do not say whether they are unified-memory: a warning that says it could not
    // check, naming them.
    let unknown = with(&example.replace("  unified_memory = true\n", "").replace(
        "gpu_memory_utilization = 0.80",
        "gpu_memory_utilization = 0.9",
    ));
    let stderr = validate(&unknown);
    assert!(stderr.contains(unchecked), "{stderr}");
    assert!(
        stderr.contains("spark1") && !stderr.contains(above),
        "{stderr}"
    );
    // They say so: the warning that checked.
    let unified = with(&example.replace(
        "gpu_memory_utilization = 0.80",
        "gpu_memory_utilization = 0.9",
    ));
    let stderr = validate(&unified);
    assert!(
        stderr.contains(above) && !stderr.contains(unchecked),
        "{stderr}"
    );
    // Within the limit: neither, known or not.
    let within = with(&example.replace("  unified_memory = true\n", ""));
    let stderr = validate(&within);
    assert!(
        !stderr.contains(unchecked) && !stderr.contains(above),
        "{stderr}"
    );
}

#[test]
fn refresh_only_shows_what_is_gone_and_records_it_only_when_approved() {
    // A container on this machine's Docker Engine that is no longer there.
    let (dir, store) = recorded_gone_container("sf-cli-refresh-only-gone");
    let d = dir.path().to_str().unwrap();
    let serial = store.load().unwrap().unwrap().serial;
    let (code, stdout, stderr) =
        out(sparkform().args(["plan", d, "-refresh-only", "-detailed-exitcode"]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stdout.contains("  - container.gone: gone"), "{stdout}");
    assert!(stdout.contains("refresh-only plan"), "{stdout}");
    // With a flag that plans changes: refused.
    let (code, _, stderr) = out(sparkform().args(["plan", d, "-refresh-only", "-out", "x.plan"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("-refresh-only only looks"), "{stderr}");
    // Not approved (no terminal to ask on): the state is as it was.
    let (code, stdout, _) = out(sparkform().args(["apply", d, "-refresh-only"]));
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("Refresh cancelled"), "{stdout}");
    assert_eq!(store.load().unwrap().unwrap().serial, serial);
    // Approved: the record of what is gone dropped, nothing else.
    let (code, stdout, stderr) =
        out(sparkform().args(["apply", d, "-refresh-only", "-auto-approve"]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("Refresh complete: 1 record"), "{stdout}");
    let after = store.load().unwrap().unwrap();
    assert!(after.resources.is_empty() && after.serial == serial + 1);
    let (code, stdout, _) =
        out(sparkform().args(["plan", d, "-refresh-only", "-detailed-exitcode"]));
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("No changes. The machines match the state."),
        "{stdout}"
    );
}

#[test]
fn console_evaluates_expressions_and_refuses_a_secret() {
    let dir = cluster();
    let d = dir.path().to_str().unwrap();
    let console = |input: &str, env: &[(&str, &str)]| {
        let mut c = sparkform();
        c.args(["console", d]).write_stdin(input.to_string());
        for (k, v) in env {
            c.env(k, v);
        }
        out(&mut c)
    };
    // One line, one value, as HCL writes it, in order; a function; -var's values.
    let (code, stdout, stderr) = console(
        "var.restart\ncidrhost(\"10.0.0.0/24\", 5)\n{ a = [1, 2] }\n",
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "\"no\"\n\"10.0.0.5\"\n{\n  a = [\n    1,\n    2,\n  ]\n}\n"
    );
    // A syntax error and an unknown name: named at their place in the expression, exit 1, and
    // the lines after them still run.
    let (code, stdout, stderr) = console("var.restart +\nvar.restrat\nvar.mtu\n", &[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stderr.contains("<console>:1:"), "{stderr}");
    assert!(stderr.contains("restrat"), "{stderr}");
    assert!(stdout.contains("9000"), "{stdout}");
    // Read-only: no state was written.
    assert!(!dir.path().join("state/sparkform.json").exists());
    // A sensitive value is refused, never shown.
    let secret = common::write_config(&[(
        "main.hcl",
        "variable \"token\" {\n  type      = string\n  sensitive = true\n}\n\nnode \"n\" {\n  address = \"10.0.0.1\"\n}\n",
    )]);
    let mut c = sparkform();
    c.args(["console", secret.path().to_str().unwrap()])
        .write_stdin("var.token\nupper(var.token)\n")
        .env("SPARKFORM_VAR_token", "marker-c0ns0le");
    let (code, stdout, stderr) = out(&mut c);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("sensitive"), "{stderr}");
    assert!(
        !stdout.contains("marker-c0ns0le") && !stdout.to_uppercase().contains("MARKER-C0NS0LE")
    );
    assert!(!stderr.contains("marker-c0ns0le") && !stderr.contains("MARKER-C0NS0LE"));
}

/// A container started by hand on this machine's Docker Engine, removed with the guard.
struct HandMade(String);

impl HandMade {
    fn start(name: &str) -> HandMade {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", name])
            .output();
        let run = std::process::Command::new("docker")
            .args(["run", "-d", "--name", name, TINY, "sleep", "600"])
            .output()
            .expect("docker");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        HandMade(name.to_string())
    }
}

impl Drop for HandMade {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// The testbed's smallest image, on this machine's Docker Engine once the testbed is built.
const TINY: &str = "sparkform-testbed/tiny:latest";

#[test]
#[ignore = "needs this machine's Docker Engine with the testbed's images (tests/testbed/testbed images)"]
fn import_and_generate_config_out_adopt_what_runs_through_the_binary() {
    let web = HandMade::start("sf-cli-import-web");
    let other = HandMade::start("sf-cli-import-other");
    let definitions = format!(
        "node \"here\" {{\n  address = \"local\"\n}}\n\ncontainer \"web\" {{\n  node    = node.here\n  name    = \"{}\"\n  image   = \"{TINY}\"\n  command = [\"sleep\", \"600\"]\n}}\n",
        web.0
    );
    let dir = common::write_config(&[("main.hcl", &definitions)]);
    let d = dir.path().to_str().unwrap();
    // `import ADDR NODE:NAME`: recorded by its ID, nothing restarted, and the plan after it
    // has nothing to change.
    let (code, stdout, stderr) =
        out(sparkform().args(["import", d, "container.web", &format!("here:{}", web.0)]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("nothing was restarted"), "{stdout}");
    assert!(stdout.contains("No changes."), "{stdout}");
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    let state = store.load().unwrap().unwrap();
    let id = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Id}}", &web.0])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&id.stdout).trim().to_string();
    assert_eq!(
        state.resources["container.web"].attributes["container_id"],
        serde_json::json!(id)
    );
    // An import block with no resource block: `plan -generate-config-out` writes the block
    // as the container runs, and refuses to write over a file.
    let with_import = format!(
        "{definitions}\nimport {{\n  to = container.other\n  id = \"here:{}\"\n}}\n",
        other.0
    );
    std::fs::write(dir.path().join("main.hcl"), with_import).unwrap();
    let generated = dir.path().join("generated.hcl.txt");
    let (code, stdout, stderr) = out(sparkform().args([
        "plan",
        d,
        "-generate-config-out",
        generated.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let text = std::fs::read_to_string(&generated).unwrap();
    assert!(text.contains("container \"other\" {"), "{text}");
    let attribute = |name: &str, value: &str| {
        text.lines().any(|l| {
            l.split_once('=')
                .is_some_and(|(k, v)| k.trim() == name && v.trim() == value)
        })
    };
    assert!(attribute("image", &format!("\"{TINY}\"")), "{text}");
    assert!(attribute("node", "node.here"), "{text}");
    // Laid out as `sparkform fmt` would: keeping it changes nothing.
    assert_eq!(sparkform::fmt::format_source(&text).unwrap(), text);
    let (code, _, stderr) = out(sparkform().args([
        "plan",
        d,
        "-generate-config-out",
        generated.to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("the file exists"), "{stderr}");
    // Nothing was restarted: the hand-made container is the one that was there.
    let still = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Id}} {{.State.Running}}", &web.0])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&still.stdout).trim(),
        format!("{id} true")
    );
}

//! A sensitive variable given as `-var name=value` sits in sparkform's process arguments
//! (`ps`, /proc/PID/cmdline): the commands warn, naming the variable and never its value, and
//! point to the environment and var-files; those ways give no warning.

use crate::common;

use assert_cmd::Command;

const DEFS: &str = r#"
variable "hf_token" {
  type      = string
  sensitive = true
}

variable "port" {
  type    = number
  default = 8000
}

node "a" { address = "local" }

container "vllm" {
  node  = node.a
  image = "vllm:1"
  env   = { HF_TOKEN = var.hf_token, PORT = tostring(var.port) }
}
"#;

const SECRET: &str = "hf_abcdefghijklmnopqrstuvwxyz012345";

fn validate(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let dir = common::write_config(&[("main.hcl", DEFS)]);
    let mut c = Command::cargo_bin("sparkform").expect("binary");
    c.env_remove("SPARKFORM_VAR_hf_token");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut full = vec!["validate", dir.path().to_str().unwrap()];
    full.extend_from_slice(args);
    let o = c.args(&full).output().expect("run");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), all)
}

#[test]
fn a_sensitive_variable_on_the_command_line_is_warned_about_by_name_only() {
    let var = format!("hf_token={SECRET}");
    let (code, out) = validate(&["-var", &var, "-var", "port=9000"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("the sensitive variable `hf_token` was given as `-var hf_token=…`"),
        "{out}"
    );
    assert!(out.contains("SPARKFORM_VAR_hf_token"), "{out}");
    assert!(out.contains("-var-file"), "{out}");
    assert!(
        !out.contains(SECRET),
        "the warning shows the secret:\n{out}"
    );
    // Only the sensitive one is named.
    assert!(!out.contains("`port`"), "{out}");
}

#[test]
fn the_environment_and_a_var_file_give_no_warning() {
    let (code, out) = validate(&[], &[("SPARKFORM_VAR_hf_token", SECRET)]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("sensitive variable"), "{out}");

    let files = tempfile::tempdir().unwrap();
    let f = files.path().join("secrets.hcl");
    std::fs::write(&f, format!("hf_token = \"{SECRET}\"\n")).unwrap();
    let (code, out) = validate(&["-var-file", f.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("sensitive variable"), "{out}");
    // A public variable on the command line is fine.
    let (code, out) = validate(
        &["-var", "port=9000"],
        &[("SPARKFORM_VAR_hf_token", SECRET)],
    );
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("sensitive variable"), "{out}");
}

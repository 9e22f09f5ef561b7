//! A sensitive variable given as `-var name=value` sits in sparkform's process arguments
//! (`ps`, /proc/PID/cmdline): the commands warn, naming the variable and never its value, and
//! point to the environment and var-files; those ways give no warning. And its value, or a
//! value derived from it, shows in no plan, apply message or `--json` event.

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

/// The key of the endpoint the probe below asks; the server answers 401, echoing it.
const API_KEY: &str = "sk-live-0123456789abcdefghij";

/// An HTTP probe on this machine whose URL and header carry a sensitive key
/// (`?key=${var.api_key}`, `Bearer ${var.api_key}`) and whose expected answer is derived from
/// it.
const PROBED: &str = r#"
variable "api_key" {
  type      = string
  sensitive = true
}

node "a" { address = "local" }

locals {
  bearer = "Bearer ${var.api_key}"
}

probe "hello" {
  timeout  = "1s"
  interval = "1s"
  http {
    via     = node.a
    url     = "http://127.0.0.1:PORT/v1/models?key=${var.api_key}"
    headers = { Authorization = local.bearer }
  }
  expect {
    contains = "welcome ${var.api_key}"
  }
}
"#;

/// A server on loopback that answers every request 401 with a body that echoes the key alone
/// and the header it was sent (as a gateway's error page may); until the test ends.
fn echoing_server() -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut header = String::new();
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                if line == "\r\n" {
                    break;
                }
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    header = line.trim_end().to_string();
                }
                line.clear();
            }
            let body = format!("{{\"error\": \"invalid key {API_KEY}\", \"sent\": \"{header}\"}}");
            let _ = write!(
                conn,
                "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// The key, and what is derived from it (inside the probe's URL, its header, its expected
/// answer), is shown by none of: the plan (text and `--json`), the failing probe's apply (its
/// progress and error, the `--json` events, the closing error), the state.
#[test]
fn a_sensitive_value_and_what_derives_from_it_show_in_no_plan_apply_or_json_output() {
    let port = echoing_server();
    let defs = PROBED.replace("PORT", &port.to_string());
    let dir = common::write_config(&[("main.hcl", &defs)]);
    let d = dir.path().to_str().unwrap();
    let env = [("SPARKFORM_VAR_api_key", API_KEY)];
    let run = |args: &[&str]| -> (i32, String) {
        let mut c = Command::cargo_bin("sparkform").expect("binary");
        c.env_remove("SPARKFORM_VAR_api_key").env("NO_COLOR", "1");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.args(args).output().expect("run");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.code().unwrap_or(-1), all)
    };
    for args in [
        &["plan", "-refresh=false", d][..],
        &["plan", "-refresh=false", "--json", d][..],
    ] {
        let (code, out) = run(args);
        assert_eq!(code, 0, "{args:?}: {out}");
        assert!(!out.contains(API_KEY), "{args:?} shows the key:\n{out}");
    }
    for args in [
        &["apply", "-refresh=false", "-auto-approve", d][..],
        &["apply", "-refresh=false", "-auto-approve", "--json", d][..],
    ] {
        let (code, out) = run(args);
        assert_ne!(code, 0, "{args:?}: the probe passed\n{out}");
        // The probe did reach the server and report what it answered.
        assert!(out.contains("answered 401"), "{args:?}: {out}");
        assert!(!out.contains(API_KEY), "{args:?} shows the key:\n{out}");
        assert!(out.contains("(sensitive value)"), "{args:?}: {out}");
    }
    let state = std::fs::read_to_string(dir.path().join("state/sparkform.json")).expect("state");
    assert!(
        !state.contains(API_KEY),
        "the state holds the key:\n{state}"
    );
}

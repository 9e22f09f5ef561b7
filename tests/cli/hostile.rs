//! Definitions from an unreviewed pull request: `validate` and `plan -refresh=false` on each case
//! of `tests/fixtures/hostile/` (and on generated ones too big to keep in the repository) must
//! exit with a located error, without a panic, in bounded time and memory, printing no control
//! byte and no more than a few kilobytes.
//!
//! Each fixture folder holds `main.hcl` and `expect.txt`, a piece of text the error must contain.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Address space of one run: evaluation budgets keep a hostile definition far below this.
const MEMORY_LIMIT: u64 = 2 << 30;
/// Wall time of one run. Generous: the debug binary on two shared cores; the slowest case (the
/// step budget) takes about 9 s there.
const TIME_LIMIT: Duration = Duration::from_secs(90);
/// Output of one run: one error, its excerpt and its help.
const OUTPUT_LIMIT: usize = 16 * 1024;

struct Run {
    code: Option<i32>,
    output: Vec<u8>,
    elapsed: Duration,
}

fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out_path = dir.join(".out");
    let out = std::fs::File::create(&out_path).expect("output file");
    let err = out.try_clone().expect("output file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sparkform"));
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .env_remove("SPARKFORM_FILE_OUTSIDE_MODULE")
        .env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: MEMORY_LIMIT,
                rlim_max: MEMORY_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("start sparkform");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = Vec::new();
    std::fs::File::open(&out_path)
        .and_then(|mut f| f.read_to_end(&mut output))
        .expect("read output");
    let _ = std::fs::remove_file(&out_path);
    let elapsed = start.elapsed();
    assert!(
        status.is_some(),
        "{args:?} in {} did not finish within {TIME_LIMIT:?}",
        dir.display()
    );
    Run {
        code: status.and_then(|s| s.code()),
        output,
        elapsed,
    }
}

/// A copy of fixture `name` in a temp folder, so that `plan` writes nothing into the repository.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile")
        .join(name);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dst = tmp.path().join(name);
    copy_dir(&src, &dst);
    (tmp, dst)
}

pub(crate) fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("mkdir");
    for entry in std::fs::read_dir(src).expect("read fixture") {
        let entry = entry.expect("entry");
        let to = dst.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).expect("copy");
        }
    }
}

/// Control bytes other than a line break or a tab, and C1 controls, are terminal commands.
fn control_byte(output: &[u8]) -> Option<char> {
    String::from_utf8_lossy(output)
        .chars()
        .find(|&c| c.is_control() && c != '\n' && c != '\t')
}

/// `validate` and `plan -refresh=false` on `dir` fail with `expect` in a located error, and
/// hold every bound.
fn assert_refused(dir: &Path, expect: &str, env: &[(&str, &str)]) {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    for args in [&["validate", "."][..], &["plan", "-refresh=false", "."][..]] {
        let r = run(dir, args, env);
        let text = String::from_utf8_lossy(&r.output);
        let case = format!(
            "{name}: {args:?} ({:?}, {} bytes)",
            r.elapsed,
            r.output.len()
        );
        assert_eq!(r.code, Some(1), "{case}: exit code\n{text}");
        assert!(!text.contains("panicked"), "{case}: panic\n{text}");
        assert!(text.contains(expect), "{case}: no {expect:?} in\n{text}");
        let located = text.contains(".hcl:")
            && text
                .split(".hcl:")
                .skip(1)
                .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
        assert!(located, "{case}: no file:line in\n{text}");
        assert_eq!(
            control_byte(&r.output),
            None,
            "{case}: control byte in\n{text:?}"
        );
        assert!(
            r.output.len() <= OUTPUT_LIMIT,
            "{case}: too much output\n{}",
            &text[..2000.min(text.len())]
        );
    }
}

/// The value of the sensitive variable `token` in every run of the corpus: long enough that a
/// message cutting a quoted value would show a prefix of it.
const SECRET: &str =
    "Zq8-vW3xK9-pL2mN7-rT5yB1-hG4jD6-fS0aE8-uI3oP9-cV7nM2-xQ1wR5-kJ6lH0-bY4tU8-gF2dA9";

/// A part of [`SECRET`] (six characters or more, in any case) found in `text`.
fn secret_in(text: &str) -> Option<String> {
    let hay = text.to_lowercase();
    let secret: Vec<char> = SECRET.to_lowercase().chars().collect();
    (0..=secret.len() - 6)
        .map(|i| secret[i..i + 6].iter().collect::<String>())
        .find(|part| hay.contains(part.as_str()))
}

fn assert_no_secret(case: &str, output: &[u8]) {
    let text = String::from_utf8_lossy(output);
    if let Some(part) = secret_in(&text) {
        panic!("{case}: a part of the secret ({part:?}) in\n{text}");
    }
}

#[test]
fn every_hostile_fixture_is_refused_within_bounds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("fixtures")
        .filter_map(Result::ok)
        .filter(|e| e.path().join("expect.txt").is_file())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert!(names.len() >= 20, "the corpus lost cases: {names:?}");
    for name in names {
        let expect =
            std::fs::read_to_string(root.join(&name).join("expect.txt")).expect("expect.txt");
        let (_tmp, dir) = copy_fixture(&name);
        let env = [("SPARKFORM_VAR_token", SECRET)];
        assert_refused(&dir, expect.trim_end(), &env);
        if name.starts_with("secret_") {
            for args in [
                &["plan", "-refresh=false", "--json", "."][..],
                &["graph", "."][..],
            ] {
                let r = run(&dir, args, &env);
                let case = format!("{name}: {args:?}");
                assert_eq!(r.code, Some(1), "{case}: exit code");
                assert_no_secret(&case, &r.output);
            }
        }
    }
}

#[test]
fn a_valid_definition_shows_its_secret_nowhere() {
    let (_tmp, dir) = copy_fixture("secrets_ok");
    let env = [("SPARKFORM_VAR_token", SECRET)];
    for args in [
        &["validate", "."][..],
        &["plan", "-refresh=false", "."][..],
        &["plan", "-refresh=false", "--json", "."][..],
        &["graph", "."][..],
        &["plan", "-refresh=false", "-out", "t.plan", "."][..],
        &["show", "t.plan"][..],
    ] {
        let r = run(&dir, args, &env);
        let case = format!("secrets_ok: {args:?}");
        let text = String::from_utf8_lossy(&r.output);
        assert_eq!(r.code, Some(0), "{case}: exit code\n{text}");
        assert_no_secret(&case, &r.output);
    }
    let plan = std::fs::read(dir.join("t.plan")).expect("plan file");
    assert_no_secret("the plan file", &plan);
    let plan = String::from_utf8_lossy(&plan);
    // The plan file holds keyed hashes only: hashing a guess without the key confirms nothing.
    assert!(plan.contains("hmac-sha256:"), "{plan}");
    for guess in [SECRET.to_string(), format!("Bearer {SECRET}")] {
        let unkeyed = sparkform::state::sha256_hex(&serde_json::to_vec(&guess).expect("json"));
        assert!(
            !plan.contains(&unkeyed),
            "the unkeyed hash of {guess:?} is in the plan file"
        );
    }
    // Writing the plan file created the key, private and ignored by git.
    let key = dir.join("state/sparkform.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key).expect("key").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let ignore = std::fs::read_to_string(dir.join("state/.gitignore")).expect(".gitignore");
    assert!(ignore.lines().any(|l| l == "sparkform.key"), "{ignore}");
}

fn write_case(files: &[(&str, &[u8])]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("case");
    std::fs::create_dir(&dir).expect("mkdir");
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write");
    }
    (tmp, dir)
}

const NODE: &str = "node \"a\" {\n  address = \"10.0.0.1\"\n  gpus    = 1\n}\n";

#[test]
fn an_error_past_column_65535_renders_a_window() {
    let text = format!(
        "locals {{\n  x = [\"{}\", nosuch(1)]\n}}\n{NODE}output \"x\" {{ value = local.x }}\n",
        "y".repeat(100_000)
    );
    let (_tmp, dir) = write_case(&[("main.hcl", text.as_bytes())]);
    assert_refused(&dir, "main.hcl:2:100012", &[]);
}

#[test]
fn a_multi_megabyte_invalid_value_prints_a_few_lines() {
    // Also file contents: the file is read, is no address, and only a few characters show.
    let big = "x".repeat(3 << 20) + "\n";
    let text = "node \"a\" {\n  address = file(\"big.txt\")\n  gpus    = 1\n}\n";
    let (_tmp, dir) = write_case(&[("main.hcl", text.as_bytes()), ("big.txt", big.as_bytes())]);
    assert_refused(&dir, "invalid `address`", &[]);
    let secret = "root-password-line-2\n".repeat(1000);
    let text = "node \"a\" {\n  address = file(\"conf.txt\")\n  gpus    = 1\n}\n";
    let (_tmp, dir) = write_case(&[
        ("main.hcl", text.as_bytes()),
        ("conf.txt", format!("first line\n{secret}").as_bytes()),
    ]);
    assert_refused(&dir, "invalid `address`", &[]);
    let r = run(&dir, &["validate", "."], &[]);
    assert!(
        !String::from_utf8_lossy(&r.output).contains("root-password"),
        "the file's contents are echoed"
    );
}

#[test]
fn file_refuses_fifos_devices_and_links_out_of_the_folder() {
    let text = "node \"a\" {\n  address = file(\"pipe\")\n  gpus    = 1\n}\n";
    let (_tmp, dir) = write_case(&[("main.hcl", text.as_bytes())]);
    let fifo = std::ffi::CString::new(dir.join("pipe").to_string_lossy().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    assert_refused(&dir, "\"pipe\" is not a regular file", &[]);

    let text = "node \"a\" {\n  address = file(\"passwd\")\n  gpus    = 1\n}\n";
    let (_tmp, dir) = write_case(&[("main.hcl", text.as_bytes())]);
    std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd")).expect("symlink");
    assert_refused(&dir, "is outside the module folder", &[]);

    // With the opt-in, outside files are read, but still only regular ones.
    let opt_in = [("SPARKFORM_FILE_OUTSIDE_MODULE", "1")];
    for dev in ["/dev/zero", "/dev/stdin", "/dev/urandom"] {
        let text = format!("node \"a\" {{\n  address = file(\"{dev}\")\n  gpus    = 1\n}}\n");
        let (_tmp, dir) = write_case(&[("main.hcl", text.as_bytes())]);
        assert_refused(&dir, "is not a regular file", &opt_in);
    }
    let text = "node \"a\" {\n  address = file(\"/etc/hostname\")\n  gpus    = 1\n}\n";
    let (_tmp, dir) = write_case(&[("main.hcl", text.as_bytes())]);
    if Path::new("/etc/hostname").is_file() {
        assert_refused(&dir, "invalid `address`", &opt_in);
    }
}

#[test]
fn a_byte_order_mark_is_accepted_by_validate_plan_and_fmt() {
    let (_tmp, dir) = copy_fixture("bom_valid");
    for args in [
        &["validate", "."][..],
        &["plan", "-refresh=false", "."][..],
        &["fmt", "-check", "."][..],
    ] {
        let r = run(&dir, args, &[]);
        let text = String::from_utf8_lossy(&r.output);
        assert_eq!(r.code, Some(0), "{args:?}\n{text}");
    }
    let text = std::fs::read(dir.join("main.hcl")).expect("read");
    assert!(
        text.starts_with("\u{feff}".as_bytes()),
        "fmt keeps the mark"
    );
}

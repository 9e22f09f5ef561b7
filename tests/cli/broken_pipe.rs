//! A reader that goes away (`sparkform plan --json | head`) ends the output, not the command:
//! no panic, the command's own exit code.

use std::process::{Command, Stdio};

fn run_with_stdout_closed(args: &[&str]) -> (Option<i32>, String) {
    let repo = env!("CARGO_MANIFEST_DIR");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparkform"))
        .args(args)
        .current_dir(repo)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sparkform");
    // Close the read end before sparkform writes anything: every write to stdout fails with
    // EPIPE (Rust ignores SIGPIPE, so the write returns the error).
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for sparkform");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The stand-in hub's commit of its `main` (the same on every start): a plan without a refresh
/// needs the model's revision pinned to a commit.
const PINNED: &str = "rev=ad8e4dd7462353a884a81d46803a03b7a8230b75";

#[test]
fn plan_graph_and_help_survive_a_closed_stdout() {
    for args in [
        &[
            "plan",
            "examples/testbed-standin",
            "-refresh=false",
            "-var",
            PINNED,
            "--json",
        ][..],
        &[
            "plan",
            "examples/testbed-standin",
            "-refresh=false",
            "-var",
            PINNED,
        ][..],
        &["graph", "examples/testbed-standin"][..],
        &["validate", "examples/testbed-standin"][..],
    ] {
        let (code, stderr) = run_with_stdout_closed(args);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
}

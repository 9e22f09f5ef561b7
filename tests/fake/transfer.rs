//! The model kind's transfer program (`src/kinds/model/transfer.py`) on loopback, between temp
//! folders: serve + pull, resume after a kill, a corrupted byte caught, nothing trusted after a
//! failure, observe; and `resolve` against the testbed's stand-in hub. python3 is required. The
//! `download` test needs a Python with huggingface_hub, named by SPARKFORM_TEST_HF_PYTHON: it is
//! `#[ignore]`d (reported as skipped) in a plain `cargo test`; `.ci/test` makes that Python and
//! runs it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const REPO: &str = "org/model";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// The transfer's token serve requires and pull sends (sparkform makes a random one per
/// transfer); on standard input, with `--auth-stdin`.
const AUTH: &str = "5f0c9a7e3b1d4c2a8e6f0b9d7c5a3e1f2b4d6c8a0e9f7b5d3c1a2e4f6b8d0c9a";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kinds/model/transfer.py")
}

fn hub_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testbed/hub-standin.py")
}

fn python() -> String {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "python3 is required to test the transfer program (it runs inside the vLLM image)"
    );
    "python3".into()
}

/// Pseudo-random bytes (xorshift), so files are incompressible and differ by seed.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn storage(cache: &Path) -> PathBuf {
    cache.join("models--org--model")
}

fn snapshot_file(cache: &Path, path: &str) -> PathBuf {
    storage(cache).join("snapshots").join(COMMIT).join(path)
}

/// Writes files into a hub-style cache (blobs + relative symlinks) and returns the manifest.
fn make_source(cache: &Path, files: &[(&str, Vec<u8>)]) -> Value {
    let st = storage(cache);
    std::fs::create_dir_all(st.join("blobs")).unwrap();
    let mut list = vec![];
    for (path, data) in files {
        let sha = sha256(data);
        std::fs::write(st.join("blobs").join(&sha), data).unwrap();
        let link = snapshot_file(cache, path);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let depth = path.matches('/').count() + 2;
        let target = format!("{}blobs/{sha}", "../".repeat(depth));
        std::os::unix::fs::symlink(target, &link).unwrap();
        list.push(
            json!({"path": path, "size": data.len(), "sha256": sha, "git_sha1": null, "blob": sha}),
        );
    }
    let total: usize = files.iter().map(|(_, d)| d.len()).sum();
    json!({"format": "sparkform-model-manifest/1", "repo": REPO, "revision": "main",
           "commit": COMMIT, "total_bytes": total, "files": list})
}

struct Out {
    code: i32,
    events: Vec<Value>,
    stderr: String,
}

impl Out {
    fn result(&self) -> &Value {
        self.events
            .iter()
            .rev()
            .find(|e| e["event"] == "result")
            .unwrap_or_else(|| panic!("no result event; stderr: {}", self.stderr))
    }
    fn files(&self, status: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .events
            .iter()
            .filter(|e| e["event"] == "file" && e["status"] == status)
            .map(|e| e["path"].as_str().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    }
}

fn parse_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

fn run_with(py: &str, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(py);
    cmd.arg(script())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("HF_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    // A program that reads no input may be gone before it is written: not this test's matter.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let o = child.wait_with_output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        events: parse_lines(&String::from_utf8_lossy(&o.stdout)),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A run with the transfer's token on standard input (what serve and pull read with
/// `--auth-stdin`; the other modes read nothing there).
fn run(py: &str, args: &[&str]) -> Out {
    run_with(py, args, &format!("{AUTH}\n"), &[])
}

/// Writes the transfer's token to a child's standard input and closes it.
fn give_auth(child: &mut Child) {
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!("{AUTH}\n").as_bytes());
    }
}

fn cache_arg(p: &Path) -> String {
    p.display().to_string()
}

/// Records a hand-made source as verified (what download ends with).
fn verify_source(py: &str, cache: &Path, manifest: &Value) {
    let o = run_with(
        py,
        &[
            "verify",
            "--cache",
            &cache_arg(cache),
            "--repo",
            REPO,
            "--commit",
            COMMIT,
            "--manifest",
            "-",
        ],
        &manifest.to_string(),
        &[],
    );
    assert_eq!(o.code, 0, "verify failed: {}", o.stderr);
}

/// A running `serve`; killed and reaped on drop, so no test leaves it behind.
struct Serve {
    child: Child,
    port: u16,
    out: BufReader<ChildStdout>,
}

impl Serve {
    fn start(py: &str, cache: &Path, extra: &[&str]) -> Serve {
        Serve::start_env(py, cache, extra, &[])
    }
    /// A serve of the snapshot in `cache`, its token [`AUTH`] on its standard input.
    fn start_env(py: &str, cache: &Path, extra: &[&str], env: &[(&str, &str)]) -> Serve {
        Serve::start_on(py, cache, "127.0.0.1", extra, env)
    }
    /// [`Serve::start_env`] on `addresses` (comma-separated).
    fn start_on(
        py: &str,
        cache: &Path,
        addresses: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Serve {
        let mut child = Command::new(py)
            .arg(script())
            .args([
                "serve",
                addresses,
                "0",
                "--cache",
                &cache_arg(cache),
                "--repo",
                REPO,
            ])
            .args([
                "--commit",
                COMMIT,
                "--idle-timeout",
                "60",
                "--max-time",
                "120",
                "--auth-stdin",
            ])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let stdin = child.stdin.take();
        // the guard exists before anything can panic, so a failed start leaves no process behind
        let mut s = Serve {
            child,
            port: 0,
            out,
        };
        if let Some(mut stdin) = stdin {
            stdin.write_all(format!("{AUTH}\n").as_bytes()).unwrap();
        }
        loop {
            let mut line = String::new();
            s.out.read_line(&mut line).unwrap();
            let ev: Value =
                serde_json::from_str(&line).unwrap_or_else(|_| panic!("serve said: {line:?}"));
            if ev["event"] == "listening" {
                s.port = ev["port"].as_u64().unwrap() as u16;
                return s;
            }
            assert_eq!(ev["event"], "warning", "{line}");
        }
    }
    fn port(&self) -> String {
        self.port.to_string()
    }
    /// Everything it printed: asks it to stop (POST /stop), so every transfer's event is out.
    fn stop(mut self) -> Vec<Value> {
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = c.write_all(
                format!("POST /stop HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {AUTH}\r\nContent-Length: 0\r\n\r\n")
                    .as_bytes(),
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        parse_lines(&rest)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sample_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "config.json",
            br#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}"#.to_vec(),
        ),
        ("tokenizer.json", bytes(1, 40_000)),
        ("model-00001-of-00002.safetensors", bytes(2, 3 << 20)),
        ("model-00002-of-00002.safetensors", bytes(3, 2 << 20)),
        ("sub/dir/extra.bin", bytes(4, 100_000)),
    ]
}

fn pull_args<'a>(cache: &'a str, port: &'a str) -> Vec<&'a str> {
    vec![
        "pull",
        "127.0.0.1",
        port,
        "--cache",
        cache,
        "--repo",
        REPO,
        "--commit",
        COMMIT,
        "--auth-stdin",
    ]
}

fn observe(py: &str, cache: &Path, deep: bool) -> Value {
    let c = cache_arg(cache);
    let mut a = vec!["observe", "--cache", &c, "--repo", REPO, "--commit", COMMIT];
    if deep {
        a.push("--deep");
    }
    let o = run(py, &a);
    assert_eq!(o.code, 0, "observe: {}", o.stderr);
    o.result().clone()
}

fn paths(v: &Value) -> Vec<String> {
    let mut p: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["path"].as_str().unwrap().to_string())
        .collect();
    p.sort();
    p
}

/// One request to a serve on loopback, `Authorization: Bearer AUTH` when `auth` is given:
/// the status and the body.
fn request(port: u16, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
    use std::io::Read;
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = auth
        .map(|a| format!("Authorization: Bearer {a}\r\n"))
        .unwrap_or_default();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// serve answers nothing to a request without the transfer's token: 403 and the same body
/// whether the path is served, not served or no endpoint at all, for GET, HEAD and POST /stop
/// (which leaves it serving); with the token it serves. A pull with another token fails.
#[test]
fn serve_answers_only_requests_with_the_transfers_token() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let manifest = make_source(&src, &sample_files());
    verify_source(&py, &src, &manifest);
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port;
    let wrong = AUTH.replace('5', "6");
    let mut refused = Vec::new();
    for auth in [None, Some(wrong.as_str()), Some(&AUTH[..63])] {
        for (method, path) in [
            ("GET", "/manifest"),
            ("GET", "/file/config.json"),
            ("GET", "/file/no-such-file"),
            ("GET", "/nothing-here"),
            ("HEAD", "/file/config.json"),
            ("POST", "/stop"),
            ("POST", "/nothing-here"),
        ] {
            let (status, body) = request(port, method, path, auth);
            assert_eq!(status, 403, "{method} {path} with {auth:?}: {body}");
            refused.push(body);
        }
    }
    refused.retain(|b| !b.is_empty()); // HEAD has no body
    refused.dedup();
    assert_eq!(
        refused,
        vec![r#"{"error": "forbidden"}"#],
        "a 403 tells paths apart"
    );
    // POST /stop without the token stopped nothing: it serves with the token
    let (status, body) = request(port, "GET", "/manifest", Some(AUTH));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["commit"],
        COMMIT
    );
    let (status, body) = request(port, "GET", "/file/config.json", Some(AUTH));
    assert_eq!(status, 200);
    assert!(body.contains("Qwen3ForCausalLM"), "{body}");
    assert_eq!(
        request(port, "GET", "/file/no-such-file", Some(AUTH)).0,
        404
    );
    // a pull with another token gets nothing
    let d = cache_arg(&dst);
    let port_arg = serve.port();
    let o = run_with(&py, &pull_args(&d, &port_arg), &format!("{wrong}\n"), &[]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("refused this transfer's token (HTTP 403)"),
        "{}",
        o.stderr
    );
    assert!(
        !o.stderr.contains(&wrong) && !o.stderr.contains(AUTH),
        "{}",
        o.stderr
    );
    // with the token, a POST /stop stops it; nothing it printed holds the token
    let (status, _) = request(port, "POST", "/stop", Some(AUTH));
    assert_eq!(status, 200);
    let events = serve.stop();
    let result = events
        .iter()
        .find(|e| e["event"] == "result")
        .expect("a result");
    assert_eq!(result["reason"], "stopped");
    let printed = serde_json::to_string(&events).unwrap();
    assert!(
        !printed.contains(AUTH) && !printed.contains(&wrong),
        "{printed}"
    );
    assert!(
        printed.contains("refused a request without this transfer's token"),
        "{printed}"
    );
}

#[test]
fn serve_and_pull_copy_every_file_and_verify_it() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let files = sample_files();
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let serve = Serve::start(&py, &src, &[]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a = pull_args(&d, &port);
    a.extend(["--ref", "main", "--jobs", "3"]);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "pull: {}", o.stderr);
    let mut want: Vec<String> = files.iter().map(|(p, _)| p.to_string()).collect();
    want.sort();
    assert_eq!(o.files("verified"), want);
    let r = o.result();
    assert_eq!(r["bytes_copied"], manifest["total_bytes"]);
    assert_eq!(r["config"]["architectures"][0], "Qwen3ForCausalLM");
    // same bytes, hub cache layout: snapshot entries are relative links into blobs/, refs/main
    for (p, data) in &files {
        let link = snapshot_file(&dst, p);
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{p}"
        );
        assert_eq!(&std::fs::read(&link).unwrap(), data, "{p}");
    }
    let main = std::fs::read_to_string(storage(&dst).join("refs/main")).unwrap();
    assert_eq!(main, COMMIT);
    let obs = observe(&py, &dst, true);
    assert_eq!(obs["complete"], true, "{obs}");
    assert_eq!(obs["missing_bytes"], 0);
    // a second pull fetches nothing
    let o = run(&py, &pull_args(&d, &port));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.files("skipped"), want);
    assert_eq!(o.result()["bytes_copied"], 0);
    let served = serve.stop();
    assert_eq!(
        served.iter().filter(|e| e["event"] == "served").count(),
        files.len()
    );
}

/// A node with two fabric addresses: serve listens on both, pull spreads its connections over
/// them, and the server's events show files sent on each; every file is still verified.
#[test]
fn a_pull_over_two_addresses_spreads_its_files_over_both() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let files = sample_files();
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let serve = Serve::start_on(&py, &src, "127.0.0.1,127.0.0.2", &[], &[]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a = pull_args(&d, &port);
    a[1] = "127.0.0.1,127.0.0.2";
    a.extend(["--jobs", "4"]);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "pull: {}", o.stderr);
    assert_eq!(o.files("verified").len(), files.len());
    for (p, data) in &files {
        assert_eq!(&std::fs::read(snapshot_file(&dst, p)).unwrap(), data, "{p}");
    }
    let served = serve.stop();
    let mut by_address: std::collections::BTreeMap<String, usize> = Default::default();
    for e in served.iter().filter(|e| e["event"] == "served") {
        *by_address
            .entry(e["local"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        by_address.keys().collect::<Vec<_>>(),
        ["127.0.0.1", "127.0.0.2"],
        "files travel on both addresses: {by_address:?}"
    );
    assert_eq!(by_address.values().sum::<usize>(), files.len());
}

#[test]
fn a_killed_pull_resumes_and_keeps_what_it_verified() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let files = vec![
        ("a.safetensors", bytes(10, 6 << 20)),
        ("b.safetensors", bytes(11, 6 << 20)),
        ("config.json", b"{}".to_vec()),
    ];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    // 4 MB/s: each large file takes 1.5 s, time enough to kill the pull inside the second
    let serve = Serve::start(&py, &src, &["--max-rate", "4000000"]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a = pull_args(&d, &port);
    a.extend(["--jobs", "1"]);
    let mut child = Command::new(&py)
        .arg(script())
        .args(&a)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    give_auth(&mut child);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut first_done: Option<String> = None;
    let mut in_flight: Option<String> = None;
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        let ev: Value = serde_json::from_str(&line).unwrap();
        if ev["event"] == "file" && ev["status"] == "verified" && first_done.is_none() {
            first_done = ev["path"].as_str().map(String::from);
        }
        if ev["event"] == "progress" && first_done.is_some() {
            if let Some(f) = ev["files"].as_array().and_then(|f| f.first()) {
                if f["done"].as_u64().unwrap_or(0) > (1 << 20) {
                    in_flight = f["path"].as_str().map(String::from);
                    break;
                }
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (first, second) = (
        first_done.expect("a first file"),
        in_flight.expect("a file in flight"),
    );
    let sha = |p: &str| sha256(&files.iter().find(|(q, _)| *q == p).unwrap().1);
    let blobs = storage(&dst).join("blobs");
    // the killed file: a partial file only, not under its final name, not linked, not trusted
    assert!(blobs
        .join(format!("{}.sparkform-partial", sha(&second)))
        .exists());
    assert!(!blobs.join(sha(&second)).exists());
    assert!(!snapshot_file(&dst, &second).exists());
    let obs = observe(&py, &dst, false);
    assert!(paths(&obs["missing"]).contains(&second), "{obs}");
    assert_eq!(obs["complete"], false);
    // the rerun resumes the partial file and does not fetch the verified one again
    let o = run(&py, &pull_args(&d, &port));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.files("skipped"), vec![first.clone()]);
    let resumed = o
        .events
        .iter()
        .find(|e| e["event"] == "file" && e["path"] == second.as_str())
        .unwrap();
    assert!(resumed["resumed_from"].as_u64().unwrap() > 0, "{resumed}");
    assert_eq!(observe(&py, &dst, true)["complete"], true);
    let served = serve.stop();
    let offsets: Vec<u64> = served
        .iter()
        .filter(|e| e["event"] == "served" && e["path"] == second.as_str())
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert!(
        offsets.iter().any(|o| *o > 0),
        "no ranged GET for {second}: {offsets:?}"
    );
    assert_eq!(
        served
            .iter()
            .filter(|e| e["event"] == "served" && e["path"] == first.as_str())
            .count(),
        1
    );
}

#[test]
fn a_corrupted_byte_is_caught_and_nothing_is_trusted() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let files = sample_files();
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let serve = Serve::start(&py, &src, &[]);
    // the source's copy goes bad after it was verified: one bit of one shard
    let bad = "model-00001-of-00002.safetensors";
    let blob = std::fs::canonicalize(snapshot_file(&src, bad)).unwrap();
    let mut data = std::fs::read(&blob).unwrap();
    data[123_456] ^= 0x01;
    std::fs::write(&blob, &data).unwrap();
    let (d, port) = (cache_arg(&dst), serve.port());
    let o = run(&py, &pull_args(&d, &port));
    assert_eq!(
        o.code, 3,
        "exit code 3 (verification) expected: {}",
        o.stderr
    );
    assert!(
        o.stderr.contains(bad) && o.stderr.contains("sha256"),
        "{}",
        o.stderr
    );
    let last = o.events.last().unwrap();
    assert_eq!(last["event"], "error");
    assert_eq!(last["code"], 3);
    let sha = sha256(&files.iter().find(|(p, _)| *p == bad).unwrap().1);
    let blobs = storage(&dst).join("blobs");
    assert!(
        !blobs.join(&sha).exists(),
        "a mismatching file kept its final name"
    );
    assert!(
        !blobs.join(format!("{sha}.sparkform-partial")).exists(),
        "a mismatching partial was kept"
    );
    assert!(!snapshot_file(&dst, bad).exists());
    let rec: Value = serde_json::from_slice(
        &std::fs::read(storage(&dst).join(format!("sparkform/{COMMIT}.json"))).unwrap(),
    )
    .unwrap();
    assert!(
        !paths(&rec["files"]).contains(&bad.to_string()),
        "the bad file is recorded as verified"
    );
    let obs = observe(&py, &dst, false);
    assert_eq!(paths(&obs["missing"]), vec![bad.to_string()]);
    // the same corruption on the destination is found by observe --deep, and repaired by pull
    let served = serve.stop();
    let warned = served.iter().any(|e| e["event"] == "warning");
    assert!(!warned, "{served:?}");
    // repaired at the source; a changed file is served again only once it is verified again
    std::fs::write(&blob, &files.iter().find(|(p, _)| *p == bad).unwrap().1).unwrap();
    let serve = Serve::start(&py, &src, &[]);
    let o = run(&py, &pull_args(&d, &serve.port()));
    assert_eq!(
        o.code, 5,
        "a file changed since its verification must not be served: {}",
        o.stderr
    );
    drop(serve);
    verify_source(&py, &src, &manifest);
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port();
    let o = run(&py, &pull_args(&d, &port));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let tok = "tokenizer.json";
    let local = std::fs::canonicalize(snapshot_file(&dst, tok)).unwrap();
    let mut t = std::fs::read(&local).unwrap();
    let mtime = std::fs::metadata(&local).unwrap().modified().unwrap();
    t[10] ^= 0x80;
    std::fs::write(&local, &t).unwrap();
    // keep the size and the mtime: only a checksum can tell
    let f = std::fs::File::options().write(true).open(&local).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(
        observe(&py, &dst, false)["complete"],
        true,
        "a shallow observe trusts size and mtime"
    );
    let deep = observe(&py, &dst, true);
    assert_eq!(deep["complete"], false);
    assert_eq!(paths(&deep["differ"]), vec![tok.to_string()]);
    assert_eq!(deep["differ"][0]["why"], "checksum");
    let mut a = pull_args(&d, &port);
    a.push("--deep");
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(observe(&py, &dst, true)["complete"], true);
}

#[test]
fn a_peer_that_dies_mid_file_leaves_only_a_partial_file() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let files = vec![("big.safetensors", bytes(20, 8 << 20))];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let mut serve = Serve::start(&py, &src, &["--max-rate", "4000000"]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let a: Vec<String> = pull_args(&d, &port).iter().map(|s| s.to_string()).collect();
    let py2 = py.clone();
    let puller = std::thread::spawn(move || {
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        run(&py2, &a)
    });
    let sha = sha256(&files[0].1);
    let blobs = storage(&dst).join("blobs");
    let partial = blobs.join(format!("{sha}.sparkform-partial"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) < (1 << 20) {
        assert!(Instant::now() < deadline, "the pull did not start in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = serve.child.kill();
    let _ = serve.child.wait();
    let o = puller.join().unwrap();
    assert_eq!(
        o.code, 4,
        "exit code 4 (peer failed) expected: {}",
        o.stderr
    );
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(
        kept > 0 && kept < files[0].1.len() as u64,
        "partial of {kept} bytes"
    );
    assert!(!blobs.join(&sha).exists());
    assert_eq!(
        paths(&observe(&py, &dst, true)["missing"]),
        vec!["big.safetensors".to_string()]
    );
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port();
    let o = run(&py, &pull_args(&d, &port));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o
        .events
        .iter()
        .any(|e| e["event"] == "file" && e["resumed_from"].as_u64() == Some(kept)));
    assert_eq!(observe(&py, &dst, true)["complete"], true);
}

#[test]
fn bad_requests_are_refused_with_their_exit_codes() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let c = cache_arg(tmp.path());
    // serve binds one address, never all of them
    let o = run(
        &py,
        &[
            "serve", "0.0.0.0", "0", "--cache", &c, "--repo", REPO, "--commit", COMMIT,
        ],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("fabric address"), "{}", o.stderr);
    // no transfer token, or one too short to be sparkform's
    let serve = [
        "serve",
        "127.0.0.1",
        "0",
        "--cache",
        &c,
        "--repo",
        REPO,
        "--commit",
        COMMIT,
    ];
    let o = run(&py, &serve);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("--auth-stdin"), "{}", o.stderr);
    let with_auth = [&serve[..], &["--auth-stdin"]].concat();
    let o = run_with(&py, &with_auth, "short\n", &[]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("shorter than 32"), "{}", o.stderr);
    // nothing verified to serve
    let o = run(&py, &with_auth);
    assert_eq!(o.code, 5, "{}", o.stderr);
    assert!(o.stderr.contains("run download first"), "{}", o.stderr);
    // a manifest whose paths escape the snapshot
    let m = json!({"format": "sparkform-model-manifest/1", "repo": REPO, "commit": COMMIT,
                   "files": [{"path": "../../etc/passwd", "size": 1, "sha256": "0".repeat(64)}]});
    let o = run_with(
        &py,
        &[
            "observe",
            "--cache",
            &c,
            "--repo",
            REPO,
            "--commit",
            COMMIT,
            "--manifest",
            "-",
        ],
        &m.to_string(),
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("unsafe file path"), "{}", o.stderr);
    // a branch name where a pinned commit is needed
    let o = run(&py, &["download", REPO, "main", "--cache", &c]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("pinned 40-hex commit"), "{}", o.stderr);
    // nobody listening
    let o = run(
        &py,
        &[
            "pull",
            "127.0.0.1",
            "1",
            "--cache",
            &c,
            "--repo",
            REPO,
            "--commit",
            COMMIT,
            "--auth-stdin",
        ],
    );
    assert_eq!(o.code, 4, "{}", o.stderr);
}

/// The stand-in hub, on a free loopback port; killed and reaped on drop.
struct Hub {
    child: Child,
    url: String,
}

impl Hub {
    fn start(py: &str, data: &Path, token_file: Option<&Path>) -> Hub {
        let port_file = data.join("port");
        let mut cmd = Command::new(py);
        cmd.arg(hub_script())
            .args(["--port", "0", "--shard-mib", "1", "--data"])
            .arg(data.join("hub"))
            .arg("--port-file")
            .arg(&port_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(t) = token_file {
            cmd.arg("--token-file").arg(t);
        }
        // the guard exists before anything can panic, so a failed start leaves no process behind
        let mut hub = Hub {
            child: cmd.spawn().unwrap(),
            url: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                hub.url = format!("http://127.0.0.1:{}", p.trim());
                return hub;
            }
            assert!(
                Instant::now() < deadline,
                "the stand-in hub did not start in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    fn post(&self, py: &str, path: &str) -> Value {
        let code = format!(
            "import urllib.request,sys;print(urllib.request.urlopen(urllib.request.Request('{}{}', data=b'', method='POST')).read().decode())",
            self.url, path
        );
        let o = Command::new(py).args(["-c", &code]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }
    fn get(&self, py: &str, path: &str) -> String {
        let code = format!(
            "import urllib.request;print(urllib.request.urlopen('{}{}').read().decode(), end='')",
            self.url, path
        );
        let o = Command::new(py).args(["-c", &code]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const HUB_REPO: &str = "testbed/standin-qwen3";

#[test]
fn resolve_pins_the_branch_and_sees_it_move_on_the_stand_in_hub() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let hub = Hub::start(&py, tmp.path(), None);
    let env = [("HF_ENDPOINT", hub.url.as_str())];
    let repos: Value = serde_json::from_str(&hub.get(&py, "/_standin/repos")).unwrap();
    let commits = &repos[HUB_REPO]["commits"];
    let (c0, c1) = (
        commits[0]["id"].as_str().unwrap(),
        commits[1]["id"].as_str().unwrap(),
    );
    assert_eq!(repos[HUB_REPO]["refs"]["main"], c0);
    let o = run_with(&py, &["resolve", HUB_REPO, "main"], "", &env);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let r = o.result();
    assert_eq!(r["commit"], c0);
    assert_eq!(r["config"]["architectures"][0], "Qwen3ForCausalLM");
    // LFS files carry the hub's sha256, small ones the git blob sha1; sizes as the hub has them
    let files = r["files"].as_array().unwrap();
    let hubfiles = commits[0]["files"].as_array().unwrap();
    assert_eq!(files.len(), hubfiles.len());
    for (f, h) in files.iter().zip(hubfiles) {
        assert_eq!(f["path"], h["path"]);
        assert_eq!(f["size"], h["size"]);
        if h["lfs"] == true {
            assert_eq!(f["sha256"], h["sha256"], "{f}");
        } else {
            assert!(f["sha256"].is_null(), "{f}");
            assert_eq!(f["git_sha1"], h["git_sha1"], "{f}");
        }
    }
    // include/exclude as huggingface_hub's allow/ignore patterns
    let o = run_with(
        &py,
        &[
            "resolve",
            HUB_REPO,
            "main",
            "--include",
            "*.json",
            "--exclude",
            "vocab*",
        ],
        "",
        &env,
    );
    let got: Vec<&str> = o.result()["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        got.contains(&"config.json")
            && !got.contains(&"vocab.json")
            && got.iter().all(|p| p.ends_with(".json")),
        "{got:?}"
    );
    // "main now points at <commit>"
    hub.post(
        &py,
        "/_standin/move?repo=testbed/standin-qwen3&ref=main&to=1",
    );
    let o = run_with(&py, &["resolve", HUB_REPO, "main"], "", &env);
    assert_eq!(o.result()["commit"], c1);
    let changed: Vec<String> = o.result()["files"]
        .as_array()
        .unwrap()
        .iter()
        .zip(files)
        .filter(|(a, b)| a["sha256"] != b["sha256"] || a["git_sha1"] != b["git_sha1"])
        .map(|(a, _)| a["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        changed,
        vec!["config.json", "model-00002-of-00003.safetensors"]
    );
    // unknown repository and revision: exit 5 with the hub's reason
    let o = run_with(&py, &["resolve", "testbed/nope", "main"], "", &env);
    assert_eq!(o.code, 5, "{}", o.stderr);
    assert!(o.stderr.contains("RepoNotFound"), "{}", o.stderr);
    let o = run_with(&py, &["resolve", HUB_REPO, "v9"], "", &env);
    assert_eq!(o.code, 5);
    assert!(o.stderr.contains("RevisionNotFound"), "{}", o.stderr);
}

#[test]
fn the_token_comes_from_the_environment_or_stdin_and_is_never_printed() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let secret = "hf_standinSECRETtoken42";
    let tf = tmp.path().join("token");
    std::fs::write(&tf, format!("{secret}\n")).unwrap();
    let hub = Hub::start(&py, tmp.path(), Some(&tf));
    let ep = [("HF_ENDPOINT", hub.url.as_str())];
    let o = run_with(&py, &["resolve", HUB_REPO, "main"], "", &ep);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("refused access") && o.stderr.contains("token"),
        "{}",
        o.stderr
    );
    let with_env = [("HF_ENDPOINT", hub.url.as_str()), ("HF_TOKEN", secret)];
    let o = run_with(&py, &["resolve", HUB_REPO, "main"], "", &with_env);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o2 = run_with(
        &py,
        &["resolve", HUB_REPO, "main", "--token-stdin"],
        &format!("{secret}\n"),
        &ep,
    );
    assert_eq!(o2.code, 0, "{}", o2.stderr);
    let o3 = run_with(
        &py,
        &["resolve", HUB_REPO, "main", "--token-env", "MY_TOKEN"],
        "",
        &[("HF_ENDPOINT", hub.url.as_str()), ("MY_TOKEN", secret)],
    );
    assert_eq!(o3.code, 0, "{}", o3.stderr);
    for out in [&o, &o2, &o3] {
        let all = format!("{:?}{}", out.events, out.stderr);
        assert!(!all.contains(secret), "the token was printed");
    }
}

/// download with the real huggingface_hub against the stand-in: every file fetched once, then
/// verified; a second download fetches nothing. Needs SPARKFORM_TEST_HF_PYTHON.
#[test]
#[ignore = "needs a python3 with huggingface_hub named by SPARKFORM_TEST_HF_PYTHON (bash .ci/test sets it)"]
fn download_with_huggingface_hub_fetches_each_file_once_and_verifies() {
    let sys_py = python();
    let hf_py = std::env::var("SPARKFORM_TEST_HF_PYTHON").unwrap_or_else(|_| {
        panic!("set SPARKFORM_TEST_HF_PYTHON to a python3 that has huggingface_hub (bash .ci/test makes one)")
    });
    let tmp = tempfile::tempdir().unwrap();
    let hub = Hub::start(&sys_py, tmp.path(), None);
    let env = [("HF_ENDPOINT", hub.url.as_str())];
    let r = run_with(
        &sys_py,
        &["resolve", HUB_REPO, "main", "--no-config"],
        "",
        &env,
    );
    let manifest = r.result().clone();
    let commit = manifest["commit"].as_str().unwrap().to_string();
    let cache = tmp.path().join("cache");
    let c = cache_arg(&cache);
    let o = run_with(
        &hf_py,
        &[
            "download", HUB_REPO, &commit, "--cache", &c, "--ref", "main",
        ],
        "",
        &env,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let n = manifest["files"].as_array().unwrap().len();
    assert_eq!(o.files("verified").len(), n);
    assert_eq!(o.result()["config"]["architectures"][0], "Qwen3ForCausalLM");
    let log = hub.get(&sys_py, "/_standin/log");
    let gets: Vec<Value> = parse_lines(&log)
        .into_iter()
        .filter(|e| e["method"] == "GET")
        .collect();
    assert_eq!(gets.len(), n, "each file fetched exactly once: {log}");
    let o = run_with(
        &hf_py,
        &["download", HUB_REPO, &commit, "--cache", &c],
        "",
        &env,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.result()["files_downloaded"], 0);
    let log = hub.get(&sys_py, "/_standin/log");
    assert_eq!(
        parse_lines(&log)
            .iter()
            .filter(|e| e["method"] == "GET")
            .count(),
        n
    );
    // one flipped byte in the cache: caught by --deep, removed, fetched once more, verified
    let shard = "model-00002-of-00003.safetensors";
    let snap = cache
        .join("models--testbed--standin-qwen3/snapshots")
        .join(&commit)
        .join(shard);
    let blob = std::fs::canonicalize(&snap).unwrap();
    let mut data = std::fs::read(&blob).unwrap();
    data[5000] ^= 0x04;
    std::fs::write(&blob, &data).unwrap();
    let o = run_with(
        &hf_py,
        &["download", HUB_REPO, &commit, "--cache", &c, "--deep"],
        "",
        &env,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.result()["files_refetched"], json!([shard]));
    let again = parse_lines(&hub.get(&sys_py, "/_standin/log"))
        .into_iter()
        .filter(|e| e["method"] == "GET" && e["file"] == shard)
        .count();
    assert_eq!(again, 2, "the corrupted shard is fetched once more");

    // The hub goes away. What the node keeps is verified against the manifest recorded when it
    // was downloaded, and a revision it keeps resolves from its refs, with a warning.
    let url = hub.url.clone();
    drop(hub);
    let env = [("HF_ENDPOINT", url.as_str())];
    let o = run_with(
        &hf_py,
        &["download", HUB_REPO, &commit, "--cache", &c],
        "",
        &env,
    );
    assert_eq!(o.code, 0, "a kept commit needs no hub: {}", o.stderr);
    assert_eq!(o.result()["files_downloaded"], 0);
    assert_eq!(o.result()["hub_asked"], false);
    let o = run_with(
        &sys_py,
        &["resolve", HUB_REPO, "main", "--cache", &c],
        "",
        &env,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.result()["commit"], commit.as_str());
    assert!(o.result()["offline"].is_string(), "{:?}", o.result());
    assert_eq!(
        o.result()["files"].as_array().map(Vec::len),
        manifest["files"].as_array().map(Vec::len)
    );
    assert_eq!(o.result()["config"]["architectures"][0], "Qwen3ForCausalLM");
    // Without the cache, or for a revision the node does not keep, the hub is still needed.
    let o = run_with(&sys_py, &["resolve", HUB_REPO, "main"], "", &env);
    assert_eq!(o.code, 4, "{}", o.stderr);
    let o = run_with(
        &sys_py,
        &["resolve", HUB_REPO, "v2", "--cache", &c],
        "",
        &env,
    );
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("cannot be reached")
            && o.stderr
                .contains("keeps no complete snapshot of testbed/standin-qwen3 at v2"),
        "{}",
        o.stderr
    );
    // A byte flipped in a kept file: found, the file removed, and with no hub to fetch it from,
    // refused naming the file and the manifest it was checked against.
    let blob = std::fs::canonicalize(&snap).unwrap();
    let mut data = std::fs::read(&blob).unwrap();
    data[100] ^= 0x10;
    std::fs::write(&blob, &data).unwrap();
    let o = run_with(
        &hf_py,
        &["download", HUB_REPO, &commit, "--cache", &c],
        "",
        &env,
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr.contains(shard)
            && o.stderr.contains("recorded when it was downloaded")
            && o.stderr.contains("fetching them again from the hub failed"),
        "{}",
        o.stderr
    );
}

#[test]
fn remove_deletes_one_commit_and_keeps_blobs_another_snapshot_uses() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("c");
    let files = sample_files();
    let manifest = make_source(&cache, &files);
    let c = cache_arg(&cache);
    let o = run_with(
        &py,
        &[
            "verify",
            "--cache",
            &c,
            "--repo",
            REPO,
            "--commit",
            COMMIT,
            "--ref",
            "main",
            "--manifest",
            "-",
        ],
        &manifest.to_string(),
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // another commit's snapshot that shares the tokenizer's blob
    let shared = sha256(&files[1].1);
    let other = storage(&cache).join("snapshots").join("f".repeat(40));
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{shared}"),
        other.join("tokenizer.json"),
    )
    .unwrap();
    let o = run(
        &py,
        &["remove", "--cache", &c, "--repo", REPO, "--commit", COMMIT],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let r = o.result();
    assert_eq!(r["blobs_removed"], files.len() - 1);
    assert_eq!(r["blobs_kept_shared"], 1);
    assert_eq!(r["refs_removed"], json!(["main"]));
    let st = storage(&cache);
    assert!(!st.join("snapshots").join(COMMIT).exists());
    assert!(!st.join(format!("sparkform/{COMMIT}.json")).exists());
    assert!(!st.join("refs/main").exists());
    let left: Vec<String> = std::fs::read_dir(st.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec![shared.clone()]);
    assert_eq!(
        std::fs::read(other.join("tokenizer.json")).unwrap(),
        files[1].1
    );
    assert_eq!(r["repo_folder_removed"], false, "another snapshot is left");

    // The last commit removed: the repository's folder (refs, .no_exist, the hub client's
    // lock folder) goes with it.
    std::fs::create_dir_all(st.join(".no_exist").join("f".repeat(40))).unwrap();
    let locks = cache.join(".locks").join(st.file_name().unwrap());
    std::fs::create_dir_all(&locks).unwrap();
    let last = "f".repeat(40);
    let o = run(
        &py,
        &["remove", "--cache", &c, "--repo", REPO, "--commit", &last],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.result()["repo_folder_removed"], true);
    assert!(!st.exists(), "the repository's folder is left");
    assert!(!locks.exists(), "its lock folder is left");
    assert!(cache.exists(), "the cache folder itself is the user's");
}

/// Runs the program after `prelude` (Python that patches `os` or `mmap` the way a kernel, a
/// file system or an older Python would behave), as `python3 transfer.py ARGS` would run it.
fn run_patched(py: &str, prelude: &str, args: &[&str]) -> Out {
    let code = format!(
        "{prelude}\nimport os, runpy, sys\nscript = os.environ['SPARKFORM_TEST_SCRIPT']\n\
         sys.argv = [script] + sys.argv[1:]\nrunpy.run_path(script, run_name='__main__')\n"
    );
    let mut child = Command::new(py)
        .arg("-c")
        .arg(code)
        .args(args)
        .env("SPARKFORM_TEST_SCRIPT", script())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("HF_TOKEN")
        .spawn()
        .unwrap();
    give_auth(&mut child);
    let o = child.wait_with_output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        events: parse_lines(&String::from_utf8_lossy(&o.stdout)),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Counts the splice calls and says how many at exit.
const COUNT_SPLICE: &str = r#"
import atexit, os, sys
real = os.splice
calls = [0]
def splice(*a, **k):
    calls[0] += 1
    return real(*a, **k)
os.splice = splice
atexit.register(lambda: sys.stderr.write("test: %d splice calls\n" % calls[0]))
"#;

/// splice from a socket refused, as on a kernel or socket type without it.
const REFUSE_FROM_SOCKET: &str = r#"
import errno, os, sys
def splice(*a, **k):
    sys.stderr.write("test: splice refused\n")
    raise OSError(errno.EINVAL, "Invalid argument")
os.splice = splice
"#;

/// splice into the file refused (a file system without it), after the socket filled the pipe.
const REFUSE_INTO_FILE: &str = r#"
import errno, os, stat, sys
real = os.splice
def splice(src, dst, *a, **k):
    if stat.S_ISREG(os.fstat(dst).st_mode):
        sys.stderr.write("test: splice refused\n")
        raise OSError(errno.EINVAL, "Invalid argument")
    return real(src, dst, *a, **k)
os.splice = splice
"#;

/// A Python older than 3.10: no os.splice.
const NO_SPLICE: &str = "import os\ndel os.splice";

/// A file system whose files cannot be mapped: the hasher reads them back instead.
const NO_MMAP: &str = r#"
import errno, mmap, sys
def refuse(*a, **k):
    sys.stderr.write("test: mmap refused\n")
    raise OSError(errno.ENODEV, "No such device")
mmap.mmap = refuse
"#;

#[test]
fn every_byte_is_hashed_once_whichever_way_it_reaches_the_file() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // larger than the writeback step (32 MiB) and many hash windows (4 MiB), of an odd size
    let big = bytes(20, (37 << 20) + 12_345);
    let files = vec![
        ("big.safetensors", big.clone()),
        ("small.bin", bytes(21, 5_000)),
        ("config.json", b"{}".to_vec()),
    ];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port();
    // a kept prefix that ends inside a page, so the first range hashed starts unaligned
    let kept = 5_000_001usize;
    let partial = format!("{}.sparkform-partial", sha256(&big));
    let cases: [(&str, &str, &[&str], &str); 7] = [
        ("splice", COUNT_SPLICE, &[], ""),
        ("--no-splice", COUNT_SPLICE, &["--no-splice"], ""),
        (
            "refused from the socket",
            REFUSE_FROM_SOCKET,
            &[],
            "test: splice refused",
        ),
        (
            "refused into the file",
            REFUSE_INTO_FILE,
            &[],
            "test: splice refused",
        ),
        ("no os.splice", NO_SPLICE, &[], ""),
        ("no mmap", NO_MMAP, &[], "test: mmap refused"),
        ("a bad kept prefix", COUNT_SPLICE, &[], ""),
    ];
    for (i, (case, prelude, extra, marker)) in cases.iter().enumerate() {
        let dst = tmp.path().join(format!("dst{i}"));
        let blobs = storage(&dst).join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        let mut prefix = big[..kept].to_vec();
        if *case == "a bad kept prefix" {
            prefix[4_321] ^= 1;
        }
        std::fs::write(blobs.join(&partial), &prefix).unwrap();
        let d = cache_arg(&dst);
        let mut a = pull_args(&d, &port);
        a.extend(["--jobs", "2"]);
        a.extend(extra.iter());
        let o = run_patched(&py, prelude, &a);
        assert_eq!(o.code, 0, "{case}: {}", o.stderr);
        let mut want: Vec<String> = files.iter().map(|(p, _)| p.to_string()).collect();
        want.sort();
        assert_eq!(o.files("verified"), want, "{case}");
        let resumed = o
            .events
            .iter()
            .find(|e| e["event"] == "file" && e["path"] == "big.safetensors")
            .unwrap();
        for (p, data) in &files {
            assert_eq!(
                &std::fs::read(snapshot_file(&dst, p)).unwrap(),
                data,
                "{case}: {p}"
            );
        }
        assert!(!blobs.join(&partial).exists(), "{case}");
        if *case == "a bad kept prefix" {
            // the kept prefix is what was wrong: fetched again from zero, and then it matches
            assert!(
                o.events.iter().any(|e| e["event"] == "warning"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("did not match after resuming"))),
                "{case}: {:?}",
                o.events
            );
            assert_eq!(resumed["resumed_from"], 0, "{case}");
        } else {
            assert_eq!(resumed["resumed_from"], kept, "{case}");
            // what crossed the network, not the whole file
            let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
            assert_eq!(o.result()["bytes_copied"], total - kept as u64, "{case}");
        }
        let calls: Option<u64> = o.stderr.lines().find_map(|l| {
            l.strip_prefix("test: ")?
                .strip_suffix(" splice calls")?
                .parse()
                .ok()
        });
        match *case {
            "splice" | "a bad kept prefix" => {
                assert!(
                    calls.unwrap_or(0) > 0,
                    "{case}: splice unused: {}",
                    o.stderr
                )
            }
            "--no-splice" => assert_eq!(calls, Some(0), "{case}: {}", o.stderr),
            _ => {}
        }
        if !marker.is_empty() {
            // refused once per file in flight at most: the rest of the run does not try again
            let n = o.stderr.matches(marker).count();
            assert!(
                (1..=2).contains(&n) || marker.contains("mmap"),
                "{case}: {n} refusals: {}",
                o.stderr
            );
            assert!(n >= 1, "{case}: the refusal never happened: {}", o.stderr);
        }
        assert_eq!(observe(&py, &dst, true)["complete"], true, "{case}");
    }
    let served = serve.stop();
    assert!(served
        .iter()
        .any(|e| e["event"] == "served" && e["path"] == "big.safetensors" && e["offset"] == kept));
}

/// A large file as ranged GETs at once: small sizes by the flags, so a few MiB make many ranges.
const SPLIT: [&str; 6] = [
    "--split-at",
    "1048576",
    "--range-bytes",
    "262144",
    "--streams",
    "4",
];

/// The served events for `path`: (offset, bytes) in the order they were sent.
fn served_ranges(served: &[Value], path: &str) -> Vec<(u64, u64)> {
    served
        .iter()
        .filter(|e| e["event"] == "served" && e["path"] == path)
        .map(|e| (e["offset"].as_u64().unwrap(), e["bytes"].as_u64().unwrap()))
        .collect()
}

/// The completed ranges a split pull's sidecar records, in bytes.
fn sidecar_done(path: &Path) -> Option<u64> {
    let doc: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some(
        doc["done"]
            .as_array()?
            .iter()
            .map(|r| r[1].as_u64().unwrap() - r[0].as_u64().unwrap())
            .sum(),
    )
}

#[test]
fn a_large_file_comes_as_ranges_at_once_and_is_hashed_in_order() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    // of an odd size, so the last range is short; the small ones under --split-at
    let big = bytes(30, (6 << 20) + 4_321);
    let files = vec![
        ("big.safetensors", big.clone()),
        ("small.bin", bytes(31, 700_000)),
        ("config.json", b"{}".to_vec()),
    ];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let serve = Serve::start(&py, &src, &[]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a = pull_args(&d, &port);
    a.extend(SPLIT);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "pull: {}", o.stderr);
    for (p, data) in &files {
        assert_eq!(&std::fs::read(snapshot_file(&dst, p)).unwrap(), data, "{p}");
    }
    let mut want: Vec<String> = files.iter().map(|(p, _)| p.to_string()).collect();
    want.sort();
    assert_eq!(o.files("verified"), want);
    let ranges = big.len().div_ceil(262_144) as u64;
    let ev = o
        .events
        .iter()
        .find(|e| e["event"] == "file" && e["path"] == "big.safetensors")
        .unwrap();
    assert_eq!(ev["ranges"], ranges, "{ev}");
    assert_eq!(ev["streams"], 4, "{ev}");
    // the files in flight: from the cores usable here (less one, 2..16), no more than the files
    let start = o.events.iter().find(|e| e["event"] == "start").unwrap();
    let cores = start["cores"].as_u64().unwrap() as usize;
    assert!(cores >= 1, "{start}");
    assert_eq!(start["jobs_from"], "cores", "{start}");
    assert_eq!(
        start["jobs"],
        (cores.saturating_sub(1)).clamp(2, 16).min(files.len()),
        "{start}"
    );
    assert_eq!(start["streams"], 4);
    let blobs = storage(&dst).join("blobs");
    let sha = sha256(&big);
    assert!(!blobs.join(format!("{sha}.sparkform-partial")).exists());
    assert!(!blobs
        .join(format!("{sha}.sparkform-partial.ranges"))
        .exists());
    assert_eq!(observe(&py, &dst, true)["complete"], true);
    // --jobs wins over the cores
    let dst2 = tmp.path().join("dst2");
    let d2 = cache_arg(&dst2);
    let mut a = pull_args(&d2, &port);
    a.extend(["--jobs", "1", "--streams", "1"]);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let start = o.events.iter().find(|e| e["event"] == "start").unwrap();
    assert_eq!(start["jobs"], 1, "{start}");
    assert_eq!(start["jobs_from"], "--jobs", "{start}");
    let served = serve.stop();
    // the first pull: one ranged GET per range, each within --range-bytes, together the file once
    let mut got = served_ranges(&served, "big.safetensors");
    let whole: Vec<(u64, u64)> = got
        .iter()
        .filter(|r| r.0 == 0 && r.1 == big.len() as u64)
        .copied()
        .collect();
    assert_eq!(
        whole.len(),
        1,
        "the --streams 1 pull: one GET of the whole file: {got:?}"
    );
    got.retain(|r| !whole.contains(r));
    got.sort();
    assert_eq!(got.len() as u64, ranges, "{got:?}");
    let mut at = 0;
    for (off, n) in &got {
        assert_eq!(*off, at, "{got:?}");
        assert!(*n <= 262_144, "{got:?}");
        at += n;
    }
    assert_eq!(at, big.len() as u64);
    assert_eq!(
        served_ranges(&served, "small.bin").len(),
        2,
        "under --split-at: one GET a pull"
    );
}

#[test]
fn a_pull_killed_mid_file_refetches_only_the_ranges_it_had_not_completed() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let big = bytes(40, (8 << 20) + 777);
    let files = vec![("big.safetensors", big.clone())];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    // 1 MB/s a range, 4 at once: the file takes about 2 s, time enough to kill the pull inside it
    let serve = Serve::start(&py, &src, &["--max-rate", "1000000"]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a = pull_args(&d, &port);
    a.extend(SPLIT);
    let mut child = Command::new(&py)
        .arg(script())
        .args(&a)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    give_auth(&mut child);
    let sha = sha256(&big);
    let blobs = storage(&dst).join("blobs");
    let partial = blobs.join(format!("{sha}.sparkform-partial"));
    let side = blobs.join(format!("{sha}.sparkform-partial.ranges"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while sidecar_done(&side).unwrap_or(0) < (2 << 20) {
        assert!(Instant::now() < deadline, "no ranges completed in 30 s");
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "the pull ended before the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL: no handler runs
    child.wait().unwrap();
    let done = sidecar_done(&side).unwrap();
    let size = big.len() as u64;
    assert!(
        done < size,
        "the pull finished before the kill ({done} bytes)"
    );
    // preallocated: the file's length says nothing of what arrived, only the sidecar does
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), size);
    assert!(!blobs.join(&sha).exists());
    assert!(!snapshot_file(&dst, "big.safetensors").exists());
    assert_eq!(observe(&py, &dst, false)["complete"], false);
    let first = serve.stop();
    assert!(
        served_ranges(&first, "big.safetensors").len() >= 4,
        "{first:?}"
    );
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port();
    let mut a = pull_args(&d, &port);
    a.extend(SPLIT);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        std::fs::read(snapshot_file(&dst, "big.safetensors")).unwrap(),
        big
    );
    assert!(
        !o.events.iter().any(|e| e["event"] == "warning"),
        "the kept ranges were right: {:?}",
        o.events
    );
    let ev = o.events.iter().find(|e| e["event"] == "file").unwrap();
    assert_eq!(ev["status"], "verified");
    assert_eq!(ev["resumed_from"], done, "{ev}");
    assert_eq!(o.result()["bytes_copied"], size - done);
    assert!(!side.exists() && !partial.exists());
    assert_eq!(observe(&py, &dst, true)["complete"], true);
    // the second peer served exactly what the sidecar did not name as completed
    let second = serve.stop();
    let again: u64 = served_ranges(&second, "big.safetensors")
        .iter()
        .map(|r| r.1)
        .sum();
    assert_eq!(again, size - done, "{second:?}");
    assert!(again < size);
}

#[test]
fn a_range_corrupted_by_the_peer_fails_the_file_and_a_good_peer_repairs_it() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let big = bytes(50, (5 << 20) + 99);
    let files = vec![
        ("big.safetensors", big.clone()),
        ("config.json", b"{}".to_vec()),
    ];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    // one byte in the middle of a range that is neither the first nor the last
    let serve = Serve::start_env(
        &py,
        &src,
        &[],
        &[("SPARKFORM_TEST_CORRUPT_SERVED", "big.safetensors@3000001")],
    );
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a = pull_args(&d, &port);
    a.extend(SPLIT);
    let o = run(&py, &a);
    assert_eq!(
        o.code, 3,
        "exit code 3 (verification) expected: {}",
        o.stderr
    );
    let last = o.events.last().unwrap();
    assert_eq!(last["event"], "error");
    let msg = last["message"].as_str().unwrap();
    assert!(
        msg.contains("big.safetensors") && msg.contains("sha256"),
        "{msg}"
    );
    assert_eq!(o.files("failed"), vec!["big.safetensors".to_string()]);
    let sha = sha256(&big);
    let blobs = storage(&dst).join("blobs");
    for name in [
        sha.clone(),
        format!("{sha}.sparkform-partial"),
        format!("{sha}.sparkform-partial.ranges"),
    ] {
        assert!(!blobs.join(&name).exists(), "{name} kept after a mismatch");
    }
    let rec: Value = serde_json::from_slice(
        &std::fs::read(storage(&dst).join(format!("sparkform/{COMMIT}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(paths(&rec["files"]), vec!["config.json".to_string()]);
    let bad = serve.stop();
    assert!(served_ranges(&bad, "big.safetensors").len() > 4, "{bad:?}");
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port();
    let mut a = pull_args(&d, &port);
    a.extend(SPLIT);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.files("skipped"), vec!["config.json".to_string()]);
    assert_eq!(
        std::fs::read(snapshot_file(&dst, "big.safetensors")).unwrap(),
        big
    );
    assert_eq!(observe(&py, &dst, true)["complete"], true);
}

#[test]
fn a_peer_lost_during_ranges_fails_the_pull_and_one_stream_resumes_from_the_recorded_prefix() {
    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let big = bytes(60, (6 << 20) + 5);
    let files = vec![("big.safetensors", big.clone())];
    let manifest = make_source(&src, &files);
    verify_source(&py, &src, &manifest);
    let mut serve = Serve::start(&py, &src, &["--max-rate", "1000000"]);
    let (d, port) = (cache_arg(&dst), serve.port());
    let mut a: Vec<String> = pull_args(&d, &port).iter().map(|s| s.to_string()).collect();
    a.extend(SPLIT.iter().map(|s| s.to_string()));
    let py2 = py.clone();
    let puller = std::thread::spawn(move || {
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        run(&py2, &a)
    });
    let sha = sha256(&big);
    let side = storage(&dst)
        .join("blobs")
        .join(format!("{sha}.sparkform-partial.ranges"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while sidecar_done(&side).unwrap_or(0) < (1 << 20) {
        assert!(Instant::now() < deadline, "no ranges completed in 30 s");
        assert!(
            !puller.is_finished(),
            "the pull ended before the peer was lost"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = serve.child.kill();
    let _ = serve.child.wait();
    // every stream ends (none waits out its socket timeout), the first error is the one reported
    let o = puller.join().unwrap();
    assert_eq!(
        o.code, 4,
        "exit code 4 (peer failed) expected: {}",
        o.stderr
    );
    assert!(o.stderr.contains("big.safetensors"), "{}", o.stderr);
    let done = sidecar_done(&side).unwrap();
    assert!(done >= 1 << 20 && done < big.len() as u64, "{done}");
    // resumed as one stream (--streams 1): only the recorded prefix is kept, the rest is one GET
    let doc: Value = serde_json::from_slice(&std::fs::read(&side).unwrap()).unwrap();
    let prefix = match &doc["done"][0] {
        r if r[0] == 0 => r[1].as_u64().unwrap(),
        _ => 0,
    };
    let serve = Serve::start(&py, &src, &[]);
    let port = serve.port();
    let mut a = pull_args(&d, &port);
    a.extend(["--streams", "1"]);
    let o = run(&py, &a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let size = big.len() as u64;
    assert_eq!(o.result()["bytes_copied"], size - prefix);
    let ev = o.events.iter().find(|e| e["event"] == "file").unwrap();
    assert_eq!(ev["resumed_from"], prefix, "{ev}");
    assert_eq!(
        std::fs::read(snapshot_file(&dst, "big.safetensors")).unwrap(),
        big
    );
    assert!(!side.exists());
    let served = serve.stop();
    assert_eq!(
        served_ranges(&served, "big.safetensors"),
        vec![(prefix, size - prefix)]
    );
}

/// The model kind's observe reads a node's copies with one `sh` command, no container. On a
/// copy transfer.py verified it agrees with transfer.py's own `observe`: in sync, then a file
/// touched since it was verified, then a file gone. A snapshot of another commit that
/// sparkform verified in the same folder is listed as untracked, with its size, and a snapshot
/// with no record of sparkform's is not.
#[test]
fn the_one_command_observe_agrees_with_transfer_py() {
    use sparkform::hosts::local::LocalHost;
    use sparkform::kinds::machine::{machine, ReadMode};
    use sparkform::kinds::model::Desired;
    use sparkform::plan::Drift;
    use sparkform::state::ResourceState;
    use sparkform::vocabulary::KindId;

    let py = python();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hf");
    let files = sample_files();
    let manifest = make_source(&cache, &files);
    verify_source(&py, &cache, &manifest);
    let desired = Desired {
        block: "model.m".into(),
        repo: REPO.into(),
        revision: "main".into(),
        commit: Some(COMMIT.into()),
        cache: cache_arg(&cache),
        image: "not-used".into(),
        node_name: "a".into(),
        role: "download".into(),
        download_node: "node.a".into(),
        ..Default::default()
    };
    let address = "model.m[\"a\"]".to_string();
    let recorded = vec![(
        address.clone(),
        ResourceState {
            kind: KindId::Model,
            node: Some("node.a".into()),
            config_hash: "sha256:0".into(),
            config: serde_json::to_value(&desired).unwrap().into(),
            attributes: Default::default(),
            depends_on: Vec::new(),
            last_apply_secs: None,
            schema_version: 1,
        },
    )];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let host = LocalHost::new("node.a");
    let look = || {
        rt.block_on(machine(KindId::Model).observe(&host, "lineage", &recorded, ReadMode::Normal))
            .unwrap()
    };
    // What transfer.py says, judged as the kind judges it.
    let theirs = |cache: &Path| {
        let r = observe(&py, cache, false);
        match sparkform::kinds::model::judge_observed("a", &r) {
            _ if r["recorded"] == false => "missing",
            None => "in sync",
            Some(_) => "drifted",
        }
    };
    let ours = |o: &Drift| match o {
        Drift::InSync => "in sync",
        Drift::Drifted(_) => "drifted",
        Drift::Missing(_) => "missing",
    };
    let (seen, untracked) = look();
    assert_eq!(ours(&seen[&address]), "in sync", "{seen:?}");
    assert_eq!(theirs(&cache), "in sync");
    // (A container would have failed: the image "not-used" is on no Docker Engine.)
    assert!(untracked.is_empty(), "{untracked:?}");

    // Touched since it was verified: the same bytes, no longer the verified file.
    let (first, _) = &files[0];
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(snapshot_file(&cache, first))
        .unwrap()
        .set_modified(later)
        .unwrap();
    let (seen, _) = look();
    assert_eq!(ours(&seen[&address]), "drifted", "{seen:?}");
    assert_eq!(theirs(&cache), "drifted");

    // Gone.
    std::fs::remove_file(snapshot_file(&cache, first)).unwrap();
    let (seen, _) = look();
    let Drift::Drifted(why) = &seen[&address] else {
        panic!("{seen:?}")
    };
    assert!(why.join(" ").contains(first), "{why:?}");
    assert_eq!(theirs(&cache), "drifted");

    // Another commit's verified snapshot beside it is untracked; a bare snapshot folder of a
    // third commit (no record of sparkform's: not its to remove) is not.
    let other = "fedcba9876543210fedcba9876543210fedcba98";
    let records = storage(&cache).join("sparkform");
    let mut rec: Value =
        serde_json::from_slice(&std::fs::read(records.join(format!("{COMMIT}.json"))).unwrap())
            .unwrap();
    rec["commit"] = json!(other);
    rec["total_bytes"] = json!(3 << 20);
    std::fs::write(records.join(format!("{other}.json")), rec.to_string()).unwrap();
    std::fs::create_dir_all(storage(&cache).join("snapshots").join("1".repeat(40))).unwrap();
    let (_, untracked) = look();
    assert_eq!(untracked.len(), 1, "{untracked:?}");
    assert_eq!(untracked[0].id, other);
    assert_eq!(untracked[0].address, address);
    assert!(!untracked[0].running);
    assert!(
        untracked[0].name.contains("fedcba987654") && untracked[0].name.contains("3.0 MiB"),
        "{}",
        untracked[0].name
    );
}

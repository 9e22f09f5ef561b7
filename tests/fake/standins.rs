//! The testbed's stand-ins, run locally (python3, loopback, temp folders; no testbed): the hub
//! stand-in generates real safetensors shards whose `__metadata__` carries the data's sha256,
//! serves two revisions (branch `main`, tag `v2`) and logs every fetch, and a complete tiny
//! Qwen3 (`testbed/tiny-qwen3`: config, tokenizer, every tensor) with other weights at `v2`;
//! the vLLM stand-in serves a good local snapshot and refuses a missing, truncated or corrupted
//! one, or an architecture its registry lacks, with vLLM's own messages and exit code 1; the
//! stand-in `vllm` package answers `ModelRegistry.get_supported_archs()` as vLLM does. One test
//! needs the testbed: the Ray image and its `:noarch` tag on the nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common;
use common::testbed::testbed;

const REPO: &str = "testbed/standin-qwen3";

fn testbed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testbed")
}

fn python() -> &'static str {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "python3 is required to test the testbed's stand-ins");
    "python3"
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A child process killed when the test ends, passed or not.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Hub {
    _child: Guard,
    url: String,
    data: PathBuf,
}

impl Hub {
    fn start(dir: &Path) -> Hub {
        let port_file = dir.join("hub-port");
        let data = dir.join("hub");
        let child = Command::new(python())
            .arg(testbed_dir().join("hub-standin.py"))
            .args(["--port", "0", "--shard-mib", "2", "--data"])
            .arg(&data)
            .arg("--port-file")
            .arg(&port_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hub-standin.py");
        let child = Guard(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                return Hub {
                    _child: child,
                    url: format!("http://127.0.0.1:{}", p.trim()),
                    data,
                };
            }
            assert!(
                Instant::now() < deadline,
                "the hub stand-in did not start in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn request(&self, method: &str, path: &str) -> Vec<u8> {
        let code = format!(
            "import sys,urllib.request\n\
             r = urllib.request.Request('{}{}', method='{method}', data=b'' if '{method}' == 'POST' else None)\n\
             sys.stdout.buffer.write(urllib.request.urlopen(r, timeout=20).read())",
            self.url, path
        );
        let o = Command::new(python())
            .args(["-c", &code])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{method} {path}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    fn json(&self, method: &str, path: &str) -> Value {
        serde_json::from_slice(&self.request(method, path)).unwrap()
    }

    /// path -> sha256 of every file of a commit, from the control endpoint.
    fn files(&self, commit: &str) -> BTreeMap<String, String> {
        self.files_of(REPO, commit)
    }

    fn files_of(&self, repo: &str, commit: &str) -> BTreeMap<String, String> {
        let repos = self.json("GET", "/_standin/repos");
        let c = repos[repo]["commits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == commit)
            .unwrap_or_else(|| panic!("no commit {commit} in {repos}"));
        c["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["path"].as_str().unwrap().to_string(),
                    f["sha256"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn refs(&self) -> (String, String) {
        self.refs_of(REPO)
    }

    fn refs_of(&self, repo: &str) -> (String, String) {
        let repos = self.json("GET", "/_standin/repos");
        let refs = &repos[repo]["refs"];
        (
            refs["main"].as_str().unwrap().to_string(),
            refs["v2"].as_str().unwrap().to_string(),
        )
    }

    /// A snapshot folder of `commit`, as a download leaves it (plain files).
    fn snapshot(&self, commit: &str, dest: &Path) -> PathBuf {
        std::fs::create_dir_all(dest).unwrap();
        for (path, sha) in self.files(commit) {
            std::fs::copy(self.data.join("objects").join(&sha), dest.join(&path)).unwrap();
        }
        dest.to_path_buf()
    }
}

/// The header of a safetensors file, checked the way the format defines it.
fn parse_safetensors(bytes: &[u8]) -> (serde_json::Map<String, Value>, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0, "the header is padded to 8 bytes");
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("the header is JSON");
    let data = &bytes[8 + n..];
    let mut tensors: Vec<(u64, u64)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, t)| {
            assert_eq!(t["dtype"], "BF16", "{k}");
            let elems: u64 = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product();
            let (s, e) = (
                t["data_offsets"][0].as_u64().unwrap(),
                t["data_offsets"][1].as_u64().unwrap(),
            );
            assert_eq!(e - s, elems * 2, "{k}: offsets match shape and dtype");
            (s, e)
        })
        .collect();
    tensors.sort();
    let mut at = 0;
    for (s, e) in &tensors {
        assert_eq!(*s, at, "tensors are contiguous");
        at = *e;
    }
    assert_eq!(
        at as usize,
        data.len(),
        "the offsets cover the data section"
    );
    (header.as_object().unwrap().clone(), data)
}

#[test]
fn hub_serves_real_safetensors_two_revisions_and_logs_each_fetch() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = Hub::start(tmp.path());
    let (main, v2) = hub.refs();
    assert_ne!(main, v2, "the tag v2 is another commit than main");

    // the commit changes config.json and the second shard, and nothing else
    let (a, b) = (hub.files(&main), hub.files(&v2));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "same file list"
    );
    let changed: Vec<&String> = a.keys().filter(|p| a[*p] != b[*p]).collect();
    assert_eq!(
        changed,
        ["config.json", "model-00002-of-00003.safetensors"],
        "what v2 changes"
    );

    // every shard is a real safetensors file whose metadata carries the data's sha256, and the
    // index names every tensor of every shard
    let index: Value = serde_json::from_slice(&hub.request(
        "GET",
        &format!("/{REPO}/resolve/{main}/model.safetensors.index.json"),
    ))
    .unwrap();
    let weight_map = index["weight_map"].as_object().unwrap();
    let mut named = BTreeSet::new();
    let mut data_bytes = 0;
    for path in a.keys().filter(|p| p.ends_with(".safetensors")) {
        let bytes = hub.request("GET", &format!("/{REPO}/resolve/{main}/{path}"));
        assert_eq!(sha256(&bytes), a[path], "{path}: served as listed");
        assert!(bytes.len() > 1 << 19, "{path}: MiBs, not a placeholder");
        let (header, data) = parse_safetensors(&bytes);
        assert_eq!(
            header["__metadata__"]["standin_data_sha256"],
            sha256(data),
            "{path}: the metadata's sha256 is the data section's"
        );
        data_bytes += data.len() as u64;
        for t in header.keys().filter(|k| *k != "__metadata__") {
            assert_eq!(weight_map[t], path.as_str(), "{t} in the index");
            named.insert(t.clone());
        }
    }
    assert_eq!(
        named.len(),
        weight_map.len(),
        "the index names no other tensor"
    );
    assert_eq!(index["metadata"]["total_size"], data_bytes);

    // the access log: one complete GET per file fetched above, with the commit
    let log = String::from_utf8(hub.request("GET", "/_standin/log")).unwrap();
    let gets: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["method"] == "GET")
        .collect();
    assert_eq!(gets.len(), 4, "three shards and the index: {log}");
    assert!(gets
        .iter()
        .all(|e| e["complete"] == true && e["commit"] == main.as_str()));

    // v2 resolves by name; main moves to it without a restart
    let info = hub.json("GET", &format!("/api/models/{REPO}/revision/v2"));
    assert_eq!(info["sha"], v2.as_str());
    hub.json("POST", &format!("/_standin/move?repo={REPO}&ref=main&to=1"));
    let info = hub.json("GET", &format!("/api/models/{REPO}/revision/main"));
    assert_eq!(
        info["sha"],
        v2.as_str(),
        "main now points at the second commit"
    );
}

/// `testbed/tiny-qwen3`: a complete tiny Qwen3 (what the real vLLM's CPU build loads and serves;
/// that is checked by hand, see tests/testbed/README.md), here its parts: every tensor of the
/// architecture at the config's shapes in one safetensors file, a byte-level BPE tokenizer whose
/// vocabulary is exactly the config's, and a v2 with other weights only; the same bytes and
/// commit ids from a second hub.
#[test]
fn hub_serves_a_complete_tiny_qwen3_with_other_weights_at_v2() {
    const TINY: &str = "testbed/tiny-qwen3";
    let tmp = tempfile::tempdir().unwrap();
    let hub = Hub::start(tmp.path());
    let (main, v2) = hub.refs_of(TINY);
    assert_ne!(main, v2);
    let (a, b) = (hub.files_of(TINY, &main), hub.files_of(TINY, &v2));
    assert_eq!(
        a.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            ".gitattributes",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    let changed: Vec<&String> = a.keys().filter(|p| a[*p] != b[*p]).collect();
    assert_eq!(
        changed,
        ["model.safetensors"],
        "v2 changes the weights only"
    );

    let get = |rev: &str, path: &str| hub.request("GET", &format!("/{TINY}/resolve/{rev}/{path}"));
    let json = |path: &str| -> Value { serde_json::from_slice(&get(&main, path)).unwrap() };
    let cfg = json("config.json");
    assert_eq!(cfg["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(cfg["model_type"], "qwen3");
    assert_eq!(cfg["tie_word_embeddings"], true);
    let n = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("{k} in {cfg}"));
    let (vocab, h, inter, hd) = (
        n("vocab_size"),
        n("hidden_size"),
        n("intermediate_size"),
        n("head_dim"),
    );
    let (q, kv) = (n("num_attention_heads") * hd, n("num_key_value_heads") * hd);
    assert_eq!((h, inter, hd, n("num_hidden_layers")), (256, 512, 64, 2));

    // the tokenizer: 256 byte-level symbols, merges, three special tokens; exactly vocab_size ids
    let tok = json("tokenizer.json");
    assert_eq!(tok["pre_tokenizer"]["type"], "ByteLevel");
    assert_eq!(tok["decoder"]["type"], "ByteLevel");
    let model_vocab = tok["model"]["vocab"].as_object().unwrap();
    let mut ids: Vec<u64> = model_vocab.values().map(|v| v.as_u64().unwrap()).collect();
    let mut specials = BTreeMap::new();
    for t in tok["added_tokens"].as_array().unwrap() {
        ids.push(t["id"].as_u64().unwrap());
        specials.insert(
            t["content"].as_str().unwrap().to_string(),
            t["id"].as_u64().unwrap(),
        );
    }
    ids.sort();
    assert_eq!(
        ids,
        (0..vocab).collect::<Vec<_>>(),
        "ids 0..vocab_size, once each"
    );
    assert_eq!(
        model_vocab
            .keys()
            .filter(|k| k.chars().count() == 1)
            .count(),
        256
    );
    for m in tok["model"]["merges"].as_array().unwrap() {
        let (l, r) = m.as_str().unwrap().split_once(' ').unwrap();
        for t in [l, r, &format!("{l}{r}")] {
            assert!(
                model_vocab.contains_key(t),
                "merge {m}: {t} in the vocabulary"
            );
        }
    }
    assert_eq!(cfg["eos_token_id"], specials["<|im_end|>"]);
    assert_eq!(cfg["bos_token_id"], specials["<|endoftext|>"]);
    let tc = json("tokenizer_config.json");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>assistant\n"));
    assert_eq!(
        json("generation_config.json")["eos_token_id"][0],
        cfg["eos_token_id"]
    );

    // the weights: every tensor of Qwen3ForCausalLM at these shapes (no lm_head: tied), the
    // norms 1.0, the rest random; v2's are other values
    let mut want = BTreeMap::from([
        ("model.embed_tokens.weight".to_string(), vec![vocab, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ]);
    for l in 0..n("num_hidden_layers") {
        for (t, shape) in [
            ("input_layernorm", vec![h]),
            ("post_attention_layernorm", vec![h]),
            ("self_attn.q_proj", vec![q, h]),
            ("self_attn.k_proj", vec![kv, h]),
            ("self_attn.v_proj", vec![kv, h]),
            ("self_attn.o_proj", vec![h, q]),
            ("self_attn.q_norm", vec![hd]),
            ("self_attn.k_norm", vec![hd]),
            ("mlp.gate_proj", vec![inter, h]),
            ("mlp.up_proj", vec![inter, h]),
            ("mlp.down_proj", vec![h, inter]),
        ] {
            want.insert(format!("model.layers.{l}.{t}.weight"), shape);
        }
    }
    let weights = get(&main, "model.safetensors");
    let other = get(&v2, "model.safetensors");
    assert_eq!(sha256(&weights), a["model.safetensors"]);
    assert_eq!(weights.len(), other.len());
    let (header, data) = parse_safetensors(&weights);
    assert_eq!(header["__metadata__"], serde_json::json!({"format": "pt"}));
    let got: BTreeMap<String, Vec<u64>> = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, t)| {
            let shape = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (k.clone(), shape)
        })
        .collect();
    assert_eq!(got, want, "every tensor, at its shape");
    let (v2_header, v2_data) = parse_safetensors(&other);
    assert_eq!(v2_header, header, "v2: the same header");
    for (name, t) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let (s, e) = (
            t["data_offsets"][0].as_u64().unwrap() as usize,
            t["data_offsets"][1].as_u64().unwrap() as usize,
        );
        let values: BTreeSet<&[u8]> = data[s..e].chunks(2).collect();
        if name.ends_with("norm.weight") {
            assert_eq!(
                values,
                BTreeSet::from([&[0x80, 0x3f][..]]),
                "{name}: 1.0 (BF16)"
            );
        } else {
            assert!(values.len() > 100, "{name}: random values");
            assert_ne!(data[s..e], v2_data[s..e], "{name}: other values at v2");
        }
    }
    assert!(weights.len() < 8 << 20, "a few MB: {}", weights.len());

    // deterministic: a second hub, on another data folder, has the same commits and bytes
    let again = tempfile::tempdir().unwrap();
    let hub2 = Hub::start(again.path());
    assert_eq!(hub2.refs_of(TINY), (main.clone(), v2.clone()));
    assert_eq!(hub2.files_of(TINY, &main), a);
    assert_eq!(hub2.files_of(TINY, &v2), b);
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Served {
    code: Option<i32>,
    output: String,
    healthy: bool,
}

/// `vllm serve DIR` with the stand-in on one node without Ray (the mp backend), until it exits
/// or answers /health 200 (then it is stopped), bounded by 30 s.
fn serve(model: &Path) -> Served {
    let port = free_port();
    let log = model.with_extension("log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(python())
        .arg(testbed_dir().join("vllm-standin.py"))
        .arg("serve")
        .arg(model)
        .args([
            "--distributed-executor-backend",
            "mp",
            "--host",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string()])
        .env("VLLM_STANDIN_PHASE_SECS", "0")
        // it imports the checkout's vllm package: no __pycache__ left in the checkout
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let mut child = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut code, mut healthy) = (None, false);
    while Instant::now() < deadline {
        if let Some(status) = child.0.try_wait().unwrap() {
            code = status.code();
            break;
        }
        if health(port) == Some(200) {
            healthy = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(child);
    Served {
        code,
        output: std::fs::read_to_string(&log).unwrap(),
        healthy,
    }
}

fn health(port: u16) -> Option<u16> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

fn refused(s: &Served, messages: &[&str]) {
    assert!(!s.healthy, "it must not start:\n{}", s.output);
    assert_eq!(s.code, Some(1), "exit code 1, as vLLM's:\n{}", s.output);
    for m in messages {
        assert!(s.output.contains(m), "expected {m:?} in:\n{}", s.output);
    }
}

/// One request to the stand-in on loopback: the status code.
fn status_of(port: u16, request: &str) -> Option<u16> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn vllm_standin_asks_for_the_api_key_on_v1_as_vllm_does() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = Hub::start(tmp.path());
    let (main, _) = hub.refs();
    let model = hub.snapshot(&main, &tmp.path().join("keyed"));
    let port = free_port();
    let child = Command::new(python())
        .arg(testbed_dir().join("vllm-standin.py"))
        .arg("serve")
        .arg(&model)
        .args([
            "--distributed-executor-backend",
            "mp",
            "--host",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string()])
        .env("VLLM_STANDIN_PHASE_SECS", "0")
        .env("VLLM_API_KEY", "k-123")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _child = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while health(port) != Some(200) {
        assert!(Instant::now() < deadline, "the stand-in did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let get = |auth: &str| {
        status_of(
            port,
            &format!("GET /v1/models HTTP/1.0\r\nHost: x\r\n{auth}\r\n"),
        )
    };
    assert_eq!(get(""), Some(401), "no key");
    assert_eq!(
        get("Authorization: Bearer wrong\r\n"),
        Some(401),
        "a wrong key"
    );
    assert_eq!(get("Authorization: Bearer k-123\r\n"), Some(200), "the key");
    assert_eq!(health(port), Some(200), "/health stays open");
}

/// The stand-in `sglang` package: `python3 -m sglang.launch_server` with SGLang's flags, the API
/// key from its `--config` file (as modules/sglang-mp writes it), SGLang's start lines, and a key
/// asked for on /v1.
#[test]
fn sglang_standin_reads_its_key_from_the_config_file_and_prints_sglangs_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(&settings, r#"{"api-key": "k-456"}"#).unwrap();
    let log = tmp.path().join("sglang.log");
    let out = std::fs::File::create(&log).unwrap();
    let port = free_port();
    let child = Command::new(python())
        .args(["-m", "sglang.launch_server", "--model-path", "org/model"])
        .args(["--tp-size", "1", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .arg("--config")
        .arg(&settings)
        .env("PYTHONPATH", testbed_dir().join("sglang-package"))
        .env("VLLM_STANDIN_PHASE_SECS", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let _child = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while health(port) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the stand-in did not come up:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let get = |auth: &str| {
        status_of(
            port,
            &format!("GET /v1/models HTTP/1.0\r\nHost: x\r\n{auth}\r\n"),
        )
    };
    assert_eq!(get(""), Some(401), "no key");
    assert_eq!(get("Authorization: Bearer k-456\r\n"), Some(200), "the key");
    let said = std::fs::read_to_string(&log).unwrap();
    for line in [
        "] Load weight begin. avail mem=",
        "] Load weight end. elapsed=",
        "] Memory pool end. avail mem=",
        "] Capture target decode CUDA graph begin.",
        "] The server is fired up and ready to roll!",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    assert!(!said.contains("k-456"), "the key is in no line:\n{said}");
}

const ENGINE_FAILED: &str = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}";

#[test]
fn vllm_standin_serves_a_good_snapshot_and_refuses_a_broken_one() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = Hub::start(tmp.path());
    let (main, _) = hub.refs();
    let good = hub.snapshot(&main, &tmp.path().join("good"));
    let shard = "model-00002-of-00003.safetensors";

    let s = serve(&good);
    assert!(
        s.healthy,
        "a complete snapshot loads and serves:\n{}",
        s.output
    );
    assert!(s
        .output
        .contains("Loading safetensors checkpoint shards: 100% Completed | 3/3"));

    let broken = |name: &str, damage: &dyn Fn(&Path)| -> Served {
        let dir = hub.snapshot(&main, &tmp.path().join(name));
        damage(&dir);
        serve(&dir)
    };

    let s = broken("missing", &|d| std::fs::remove_file(d.join(shard)).unwrap());
    refused(
        &s,
        &[
            "ValueError: Following weights were not initialized from checkpoint: {'model.layers.1.",
            ENGINE_FAILED,
        ],
    );

    let s = broken("truncated", &|d| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join(shard))
            .unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len - 4096).unwrap();
    });
    refused(
        &s,
        &[
            "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered",
            "EngineCore failed to start.",
            ENGINE_FAILED,
        ],
    );

    let s = broken("cut-header", &|d| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join(shard))
            .unwrap();
        f.set_len(64).unwrap();
    });
    refused(
        &s,
        &["Error while deserializing header: invalid header length"],
    );

    let s = broken("flipped", &|d| {
        let p = d.join(shard);
        let mut b = std::fs::read(&p).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x01;
        std::fs::write(&p, b).unwrap();
    });
    refused(
        &s,
        &[
            "the data section's sha256 is",
            "its header's __metadata__ says",
            ENGINE_FAILED,
        ],
    );

    let s = broken("no-config", &|d| {
        std::fs::remove_file(d.join("config.json")).unwrap()
    });
    refused(
        &s,
        &["ValueError: Invalid repository ID or local directory specified:"],
    );

    let s = broken("other-arch", &|d| {
        let p = d.join("config.json");
        let c = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, c.replace("Qwen3ForCausalLM", "MadeUpForCausalLM")).unwrap();
    });
    refused(
        &s,
        &[
            "Value error, Model architectures ['MadeUpForCausalLM'] are not supported for now. Supported architectures: dict_keys([",
            "'Qwen3ForCausalLM'",
        ],
    );
}

#[test]
fn the_vllm_package_lists_its_architectures_as_vllm_does() {
    let o = Command::new(python())
        .args([
            "-c",
            "from vllm import ModelRegistry; print(ModelRegistry.get_supported_archs())",
        ])
        .env("PYTHONPATH", testbed_dir().join("vllm-package"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("dict_keys([") && out.contains("'Qwen3ForCausalLM'"),
        "{out}"
    );
    assert!(
        !out.contains("UnsupportedForCausalLM"),
        "the hub's unsupported-arch model stays unsupported: {out}"
    );
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn the_ray_image_and_its_noarch_tag_differ_only_by_the_test_models_architecture() {
    let tb = testbed();
    let list = "python3 -c 'from vllm import ModelRegistry; print(sorted(ModelRegistry.get_supported_archs()))'";
    // a folder with only a config: the architecture check comes before any weight is read
    let dir = format!("/tmp/sf-standins-{}", std::process::id());
    for node in ["sf-node1", "sf-node2"] {
        let full = tb.ssh(
            node,
            &format!("docker run --rm sparkform-testbed/ray:latest {list}"),
        );
        let noarch = tb.ssh(
            node,
            &format!("docker run --rm sparkform-testbed/ray:noarch {list}"),
        );
        assert!(full.contains("'Qwen3ForCausalLM'"), "{node}: {full}");
        assert!(
            noarch.starts_with('[') && !noarch.contains("Qwen3ForCausalLM"),
            "{node}: {noarch}"
        );
        assert_eq!(
            full.replace("'Qwen3ForCausalLM', ", ""),
            noarch,
            "{node}: nothing else differs"
        );

        let serve = |tag: &str| {
            tb.ssh(
                node,
                &format!(
                    "mkdir -p {dir} && printf '{{\"architectures\": [\"Qwen3ForCausalLM\"]}}' > {dir}/config.json && \
                     docker run --rm -e VLLM_STANDIN_PHASE_SECS=0 -v {dir}:/model:ro sparkform-testbed/ray:{tag} \
                     timeout 60 vllm serve /model --distributed-executor-backend mp 2>&1; echo rc=$?; rm -rf {dir}"
                ),
            )
        };
        let refused = serve("noarch");
        assert!(
            refused.contains("Model architectures ['Qwen3ForCausalLM'] are not supported for now. Supported architectures: dict_keys([")
                && refused.trim_end().ends_with("rc=1"),
            "{node}: the noarch image refuses the architecture:\n{refused}"
        );
        let past = serve("latest");
        assert!(
            !past.contains("are not supported for now")
                && past.contains("RuntimeError: Cannot find any model weights with `/model`")
                && past.trim_end().ends_with("rc=1"),
            "{node}: the full image accepts the architecture and stops at the missing weights:\n{past}"
        );
    }
}

//! The compile cache surviving a replacement, on the testbed (examples/testbed-mp, whose
//! vLLM stand-in compiles for `standin_compile_secs` unless its cache folder holds what an
//! earlier start of the same image and model compiled): a replacement with the cache warm skips
//! the compile phase (its log says so, the plan says so beforehand and leaves the phase out of
//! the expected time), a destroy keeps the folder, a new image ID starts cold in a folder of its
//! own, and `destroy -purge-caches` removes the folder.

use crate::common;

use common::testbed::{sparkform, testbed, Testbed};

const EXAMPLE: &str = "examples/testbed-mp";
const ROOT: &str = "/var/cache/sparkform-jit";
const RANK0: &str = "sparkform-vllm-node1";
/// The headless rank: its ready check waits for the whole engine, so its start's phases
/// (its own compile among them) are what the state records.
const RANK1: &str = "module.qwen.container.rank[\"node2\"]";
const COMPILE_SECS: &str = "standin_compile_secs=4";

fn logs(tb: &Testbed) -> String {
    tb.ssh("sf-node1", &format!("docker logs {RANK0} 2>&1"))
}

/// The state's record of the headless rank: its cache folder and what its compile phase took.
fn rank1(state: &str) -> (String, Option<f64>) {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    let r = &s["resources"][RANK1]["attributes"];
    (
        r["cache_folder"].as_str().unwrap_or_default().to_string(),
        r["phase_secs"]["compiling"].as_f64(),
    )
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_replacement_with_the_same_image_skips_the_compile_and_a_new_image_starts_cold() {
    let tb = testbed();
    tb.clear_leftovers();
    for node in ["sf-node1", "sf-node2"] {
        tb.ssh(node, &format!("rm -rf {ROOT}"));
    }
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("state.json");
    let st = st.to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["-state", st.as_str(), "-var", COMPILE_SECS]);
        sparkform(&a)
    };

    // Cold: the stand-in compiles, and the state records how long that took.
    let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve", "-upgrade"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("cold: nothing for image sha256:"), "{out}");
    assert!(
        logs(&tb).contains("Compiling a graph for compile range"),
        "{}",
        logs(&tb)
    );
    let (folder, compiled) = rank1(&st);
    assert!(folder.starts_with(&format!("{ROOT}/")), "{folder}");
    assert!(compiled.is_some_and(|s| s >= 3.5), "{compiled:?}");
    assert!(
        !tb.ssh(
            "sf-node2",
            &format!("find {folder} -name vllm_compile_cache.py")
        )
        .is_empty(),
        "the artefact is in the node's folder"
    );

    // Warm: the plan says what the cache skips, and the new rank 0 loads instead of compiling.
    let (code, out, err) = run(&["plan", EXAMPLE, "-replace", "module.qwen.container.rank0"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!("{RANK1} on node.node2: warm for image sha256:"))
            && out.contains("skips compiling ("),
        "{out}"
    );
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-replace",
        "module.qwen.container.rank0",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let log = logs(&tb);
    assert!(
        log.contains(
            "Directly load the compiled graph(s) for compile range (1, 2048) from the cache"
        ) && !log.contains("Compiling a graph"),
        "{log}"
    );
    let (same, warm) = rank1(&st);
    assert_eq!(same, folder, "the same image, the same folder");
    assert!(warm.is_some_and(|s| s < 2.0), "{warm:?}");

    // A destroy keeps the folder for a later apply, and says so.
    let (code, out, err) = run(&["destroy", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("Kept for a later apply of the same image"),
        "{out}"
    );
    assert!(out.contains(&folder), "{out}");
    assert!(!tb.ssh("sf-node2", &format!("ls -A {folder}")).is_empty());

    // Another build under another tag: another image ID, a folder of its own, a cold start.
    let other = "sparkform-testbed/ray:jit-cache-test";
    tb.ssh(
        "sf-node1",
        &format!(
            "printf 'FROM sparkform-testbed/ray:latest\\nLABEL sparkform.test=jit-cache\\n' | DOCKER_BUILDKIT=0 docker build -q -t {other} - >/dev/null 2>&1"
        ),
    );
    // The same build on both nodes (node parity): copied, not built twice.
    let config = tb.known_hosts().with_file_name("ssh_config");
    let copied = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ssh -F {cfg} sf-node1 'docker save {other}' | ssh -F {cfg} sf-node2 'docker load -q'",
            cfg = config.display()
        ))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(copied.status.success(), "{copied:?}");
    let image = format!("image={other}");
    let (code, out, err) = run(&[
        "apply",
        EXAMPLE,
        "-auto-approve",
        "-upgrade",
        "-var",
        &image,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("cold: nothing for image sha256:"), "{out}");
    assert!(logs(&tb).contains("Compiling a graph for compile range"));
    let (new_folder, _) = rank1(&st);
    assert_ne!(
        new_folder, folder,
        "a new image ID never reads the old one's artefacts"
    );

    // -purge-caches removes the folder of what it destroys.
    let (code, out, err) = run(&[
        "destroy",
        EXAMPLE,
        "-auto-approve",
        "-purge-caches",
        "-var",
        &image,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("-purge-caches: the deletes remove also"),
        "{out}"
    );
    for node in ["sf-node1", "sf-node2"] {
        assert!(
            tb.ssh(node, &format!("test -e {new_folder} && echo left"))
                .is_empty(),
            "{new_folder} is gone from {node}"
        );
    }
    assert!(
        tb.ssh(
            "sf-node1",
            "docker ps -a --filter label=sparkform.purge --format '{{.Names}}'"
        )
        .is_empty(),
        "no purge helper is left"
    );
    for node in ["sf-node1", "sf-node2"] {
        tb.ssh(
            node,
            &format!("rm -rf {ROOT}; docker rmi {other} >/dev/null 2>&1"),
        );
    }
}

/// A probe's soak on the testbed: the probe passes, then fails halfway through its soak (a file
/// the test drops in the container makes its check fail); the apply fails naming the soak and
/// rolls back, so the container it created is gone.
#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_soak_that_fails_halfway_rolls_back() {
    let tb = testbed();
    let name = "sparkform-soak-sleeper";
    tb.ssh("sf-node1", &format!("docker rm -f {name} >/dev/null 2>&1"));
    let dir = tempfile::tempdir().unwrap();
    let mut hcl = tb.hcl(&[("node1", "sf-node1")], &tb.known_hosts(), 2222);
    hcl.push_str(&format!(
        r#"
container "sleeper" {{
  node         = node.node1
  name         = "{name}"
  image        = "sparkform-testbed/tiny:latest"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
}}
probe "serving" {{
  exec {{
    container = container.sleeper
    command   = ["sh", "-c", "test ! -e /tmp/wedged"]
  }}
  timeout  = "10s"
  interval = "1s"
  soak {{
    duration = "16s"
    interval = "1s"
  }}
}}
"#
    ));
    std::fs::write(dir.path().join("main.hcl"), hcl).unwrap();
    let st = dir.path().join("state.json");
    let apply = {
        let (dir, st) = (dir.path().to_path_buf(), st.clone());
        std::thread::spawn(move || {
            sparkform(&[
                "apply",
                dir.to_str().unwrap(),
                "-auto-approve",
                "-state",
                st.to_str().unwrap(),
            ])
        })
    };
    // Halfway: a few seconds after the container runs (the probe passed right after it started).
    let started = std::time::Instant::now();
    while tb.running_id("sf-node1", name).is_none() {
        assert!(started.elapsed().as_secs() < 120, "the sleeper never ran");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    std::thread::sleep(std::time::Duration::from_secs(6));
    tb.ssh("sf-node1", &format!("docker exec {name} touch /tmp/wedged"));
    let (code, out, err) = apply.join().unwrap();
    assert_eq!(code, 1, "{out}\n{err}");
    let all = format!("{out}\n{err}");
    assert!(all.contains("soak"), "{all}");
    assert!(all.to_lowercase().contains("rolled back"), "{all}");
    assert!(
        tb.running_id("sf-node1", name).is_none()
            && tb
                .ssh("sf-node1", &format!("docker ps -aq --filter name=^{name}$"))
                .is_empty(),
        "the rollback removed what the apply created"
    );
}

//! Node parity on the testbed: one image reference naming different images on the two nodes is
//! refused before any container starts, a retag after an apply plans as drift (and, against the
//! lock file's digest, is refused until `-upgrade`), and `sparkform
//! nodes` shows the nodes alike with the testbed's expected differences explained.

use crate::common;

use common::testbed::{sparkform, testbed, Testbed};

// The Ray example: the testbed image the coordinator built has a stand-in without the
// multiprocessing mode; the check is the container kind's, the same for both launchers.
const EXAMPLE: &str = "examples/testbed-standin";
/// The example's image for Ray and vLLM.
const RAY: &str = "sparkform-testbed/ray:latest";
/// A reference of the Ray image that only the containers use (`-var image=`): the model's
/// transfer keeps running in RAY, so a retag here is the containers' drift alone.
const IMAGE: &str = "sparkform-testbed/ray:parity";
const OTHER: &str = "sparkform-testbed/tiny:latest";

/// IMAGE tagged on both nodes, and removed however the test ends.
struct Tagged<'a>(&'a Testbed);

impl<'a> Tagged<'a> {
    fn new(tb: &'a Testbed) -> Tagged<'a> {
        for node in ["sf-node1", "sf-node2"] {
            tb.ssh(node, &format!("docker tag {RAY} {IMAGE}"));
        }
        Tagged(tb)
    }
}

impl Drop for Tagged<'_> {
    fn drop(&mut self) {
        for node in ["sf-node1", "sf-node2"] {
            self.0.ssh(node, &format!("docker rmi {IMAGE} >/dev/null"));
        }
    }
}

fn image_id(tb: &Testbed, node: &str, image: &str) -> String {
    tb.ssh(
        node,
        &format!("docker image inspect -f '{{{{.Id}}}}' {image}"),
    )
    .trim()
    .to_string()
}

fn short(id: &str) -> String {
    id.chars().take("sha256:".len() + 12).collect()
}

/// Puts the reference back on the image it named, however the test ends.
struct Retag<'a> {
    tb: &'a Testbed,
    node: &'static str,
    original: String,
}

impl<'a> Retag<'a> {
    fn to(tb: &'a Testbed, node: &'static str, other: &str) -> Retag<'a> {
        let original = image_id(tb, node, IMAGE);
        assert!(original.starts_with("sha256:"), "no {IMAGE} on {node}");
        tb.ssh(node, &format!("docker tag {other} {IMAGE}"));
        Retag { tb, node, original }
    }
}

impl Drop for Retag<'_> {
    fn drop(&mut self) {
        self.tb
            .ssh(self.node, &format!("docker tag {} {IMAGE}", self.original));
    }
}

fn ours(tb: &Testbed, node: &str) -> Vec<String> {
    tb.containers(node, "sparkform.lineage")
        .into_iter()
        .map(|c| c.0)
        .filter(|n| n.starts_with("sparkform-"))
        .collect()
}

/// No leftovers, and no lock file in the example: one another test's run wrote pins IMAGE to
/// what it ran then, and the refusals here are the node parity check's.
fn clean(tb: &Testbed) {
    tb.clear_leftovers();
    let _ = std::fs::remove_file(std::path::Path::new(EXAMPLE).join("sparkform.lock.hcl"));
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn image_parity_on_the_testbed() {
    let tb = testbed();
    clean(&tb);
    let _tagged = Tagged::new(&tb);
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("state.json").to_str().unwrap().to_string();
    let image = format!("image={IMAGE}");
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend(["-state", st.as_str(), "-var", image.as_str()]);
        sparkform(&a)
    };

    let good = image_id(&tb, "sf-node1", IMAGE);
    {
        let retag = Retag::to(&tb, "sf-node2", OTHER);
        let other = image_id(&tb, "sf-node2", IMAGE);
        assert_ne!(good, other);
        let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve"]);
        let all = format!("{out}\n{err}");
        assert_ne!(code, 0, "{all}");
        assert!(all.contains("node parity"), "{all}");
        assert!(
            all.contains(&short(&good)) && all.contains(&short(&other)),
            "both IDs: {all}"
        );
        for node in ["sf-node1", "sf-node2"] {
            assert!(
                ours(&tb, node).is_empty(),
                "a container was created on {node}: {all}"
            );
        }
        drop(retag);
    }

    // The same image everywhere: it applies; a retag on one node afterwards is drift.
    let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, _) = run(&["plan", EXAMPLE, "-detailed-exitcode"]);
    assert_eq!(code, 0, "a re-plan is not a no-op:\n{out}");
    let lock = std::path::Path::new(EXAMPLE).join("sparkform.lock.hcl");
    let locked = std::fs::read_to_string(&lock).expect("the apply wrote the lock file");
    assert!(
        locked.contains(&format!("image \"{IMAGE}\" {{\n  node1 = \"{good}\"")),
        "{locked}"
    );
    {
        let _retag = Retag::to(&tb, "sf-node2", OTHER);
        let other = image_id(&tb, "sf-node2", IMAGE);
        let (code, out, err) = run(&["plan", EXAMPLE, "-detailed-exitcode"]);
        assert_eq!(code, 2, "a retag is drift:\n{out}\n{err}");
        assert!(out.contains("pulled or retagged"), "{out}");
        assert!(out.contains(&short(&good)), "{out}");
        // The lock pins what ran: the plan names both digests, an apply refuses to run another.
        // As one line: the diagnostic is wrapped to the terminal's width.
        let all = format!("{out}\n{err}")
            .replace('│', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            all.contains(&format!(
                "image {IMAGE} on node.node2 is {} (pulled or retagged since it was locked); sparkform.lock.hcl pins {}",
                short(&other),
                short(&good)
            )),
            "{all}"
        );
        let (code, out, err) = run(&["apply", EXAMPLE, "-auto-approve"]);
        assert_ne!(code, 0, "{out}\n{err}");
        assert!(format!("{out}\n{err}").contains("-upgrade"), "{out}\n{err}");
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), locked);
    }
    let (code, out, _) = run(&["plan", EXAMPLE, "-detailed-exitcode"]);
    assert_eq!(code, 0, "the tag is back, no drift:\n{out}");
    let (code, out, err) = run(&["destroy", EXAMPLE, "-auto-approve"]);
    assert_eq!(code, 0, "{out}\n{err}");
    clean(&tb);
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn nodes_shows_the_testbed_alike_and_explains_it() {
    let tb = testbed();
    let (code, out, err) = sparkform(&["nodes", "examples/testbed-standin"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let id = short(&image_id(&tb, "sf-node1", RAY));
    for node in ["node.node1", "node.node2"] {
        assert!(out.contains(&format!("{node}: image {RAY}: {id}")), "{out}");
        assert!(out.contains(&format!("{node}: memlock: ")), "{out}");
        assert!(out.contains(&format!("{node}: rdma: none")), "{out}");
        assert!(
            out.contains(&format!(
                "- {node}: declares 1 logical GPU without devices (gpu_devices = false)"
            )),
            "{out}"
        );
    }
    assert!(
        out.contains("KERNEL") && out.contains("DRIVER") && out.contains("CUDA"),
        "{out}"
    );
    // The nodes are alike and the definitions say what to expect: no warning at all.
    assert!(!out.lines().any(|l| l.starts_with("! ")), "{out}");
}

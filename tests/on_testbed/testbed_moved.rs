//! Refactoring a deployment's definitions on the testbed: a module renamed with a `moved` block
//! plans nothing on the nodes and its container (named from its address) keeps running with the
//! same ID; a `removed` block forgets a container and leaves it running, and later plans do
//! not take it for a leftover.

use crate::common;

use std::path::Path;

use common::testbed::{sparkform, testbed, Testbed};

const TINY: &str = "sparkform-testbed/tiny:latest";

/// The module's container has no `name`: Docker's name is derived from its address.
const MODULE: &str = r#"
variable "node" {}
container "engine" {
  node         = var.node
  image        = "sparkform-testbed/tiny:latest"
  stop_timeout = "1s"
  command      = ["sleep", "3600"]
}
"#;

fn definitions(tb: &Testbed, module: &str, side: bool, extra: &str) -> String {
    let mut s = tb.hcl(
        &[("node1", tb.nodes[0]), ("node2", tb.nodes[1])],
        &tb.known_hosts(),
        2222,
    );
    s.push_str(&format!(
        "module \"{module}\" {{\n  source = \"./engine\"\n  node   = node.node1\n}}\n{extra}\n"
    ));
    if side {
        s.push_str(&format!(
            "container \"side\" {{\n  node         = node.node2\n  name         = \"sf-moved-side\"\n  image        = \"{TINY}\"\n  stop_timeout = \"1s\"\n  command      = [\"sleep\", \"3600\"]\n}}\n"
        ));
    }
    s
}

fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let mut a = args.to_vec();
    a.push(dir.to_str().unwrap_or_default());
    let (code, out, err) = sparkform(&a);
    (code, format!("{out}\n{err}"))
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn a_moved_module_keeps_its_container_and_a_removed_one_runs_on() {
    let tb = testbed();
    for (node, name) in [(tb.nodes[0], "sfmv-engine"), (tb.nodes[1], "sf-moved-side")] {
        tb.ssh(node, &format!("docker rm -f {name} >/dev/null 2>&1; true"));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("engine")).unwrap();
    std::fs::write(dir.join("engine/main.hcl"), MODULE).unwrap();
    let write = |hcl: String| std::fs::write(dir.join("main.hcl"), hcl).unwrap();

    write(definitions(&tb, "sfmv", true, ""));
    let (code, out) = run(dir, &["apply", "-auto-approve"]);
    assert_eq!(code, 0, "{out}");
    let engine = tb.running_id(tb.nodes[0], "sfmv-engine");
    let side = tb.running_id(tb.nodes[1], "sf-moved-side");
    assert!(engine.is_some() && side.is_some(), "{out}");

    // The module renamed, with its `moved` block: the state moves, nothing on the nodes.
    write(definitions(
        &tb,
        "sfmv2",
        true,
        "moved {\n  from = module.sfmv\n  to   = module.sfmv2\n}\n",
    ));
    let (code, out) = run(dir, &["plan", "-detailed-exitcode"]);
    assert_eq!(code, 2, "a move is a change of the state: {out}");
    assert!(
        out.contains("# module.sfmv.container.engine has moved to module.sfmv2.container.engine"),
        "{out}"
    );
    assert!(
        out.contains("Plan: 1 to move, 0 to add, 0 to change, 0 to replace, 0 to destroy"),
        "{out}"
    );
    let (code, out) = run(dir, &["apply", "-auto-approve"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(tb.running_id(tb.nodes[0], "sfmv-engine"), engine, "{out}");
    // Refresh finds it by its recorded ID (its labels name the old address): nothing to do.
    let (code, out) = run(dir, &["plan", "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}");

    // The side container forgotten by a `removed` block: it runs on.
    write(definitions(
        &tb,
        "sfmv2",
        false,
        "moved {\n  from = module.sfmv\n  to   = module.sfmv2\n}\nremoved {\n  from = container.side\n  lifecycle {\n    destroy = false\n  }\n}\n",
    ));
    let (code, out) = run(dir, &["apply", "-auto-approve"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("# container.side will no longer be managed"),
        "{out}"
    );
    assert_eq!(tb.running_id(tb.nodes[1], "sf-moved-side"), side, "{out}");
    // With the `removed` block gone, still nothing: it carries this state's labels for an
    // address the state forgot, not one it lost. (The `moved` block stays: without it the
    // module's container would take the name of its new address, a replacement.)
    write(definitions(
        &tb,
        "sfmv2",
        false,
        "moved {\n  from = module.sfmv\n  to   = module.sfmv2\n}\n",
    ));
    let (code, out) = run(dir, &["plan", "-detailed-exitcode"]);
    assert_eq!(code, 0, "{out}");

    let (code, out) = run(dir, &["destroy", "-auto-approve"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(tb.running_id(tb.nodes[0], "sfmv-engine"), None);
    assert_eq!(
        tb.running_id(tb.nodes[1], "sf-moved-side"),
        side,
        "destroy removed a forgotten container"
    );
    tb.ssh(tb.nodes[1], "docker rm -f sf-moved-side >/dev/null");
}

//! The multi-host testbed (tests/testbed/testbed) as the integration tests see it.

use std::path::{Path, PathBuf};

pub struct Testbed {
    pub dir: PathBuf,
}

/// The running testbed, or `None` (with a note on stderr) when SPARKFORM_TESTBED is not set.
/// When it is set, a testbed that is not up is a test failure, not a skip.
pub fn testbed() -> Option<Testbed> {
    if std::env::var_os("SPARKFORM_TESTBED").is_none() {
        eprintln!(
            "SPARKFORM_TESTBED is not set: skipping a testbed test (bash .ci/test runs them)"
        );
        return None;
    }
    let dir = std::env::var_os("SPARKFORM_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/sparkform-testbed"));
    assert!(
        dir.join("known_hosts").is_file(),
        "SPARKFORM_TESTBED is set but the testbed is not up: run `tests/testbed/testbed up`"
    );
    Some(Testbed { dir })
}

impl Testbed {
    pub fn key(&self) -> PathBuf {
        self.dir.join("id_ed25519")
    }
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// A `jump` block and one `node` block per (name, address), with the node's known_hosts.
    pub fn hcl(&self, nodes: &[(&str, &str)], node_known_hosts: &Path, jump_port: u16) -> String {
        let mut s = format!(
            "jump \"testbed\" {{\n  address     = \"127.0.0.1\"\n  user        = \"root\"\n  port        = {jump_port}\n  known_hosts = \"{}\"\n  identity_file = \"{}\"\n}}\n",
            self.known_hosts().display(),
            self.key().display()
        );
        for (name, address) in nodes {
            s.push_str(&format!(
                "node \"{name}\" {{\n  address       = \"{address}\"\n  user          = \"root\"\n  jump          = jump.testbed\n  identity_file = \"{}\"\n  known_hosts   = \"{}\"\n}}\n",
                self.key().display(),
                node_known_hosts.display()
            ));
        }
        s
    }

    /// Run a command on a testbed node through plain ssh (independent of sparkform).
    pub fn ssh(&self, node: &str, command: &str) -> String {
        let out = std::process::Command::new("ssh")
            .arg("-F")
            .arg(self.dir.join("ssh_config"))
            .arg(node)
            .arg(command)
            .output()
            .expect("ssh");
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

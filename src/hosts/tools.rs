//! The programs sparkform runs on a node that a minimal system may lack, the Debian/Ubuntu
//! package that brings each, and how a command's failure is told apart from a program that is
//! not installed: a section of the node facts that needs a missing program is not read (the
//! others stand), and a kind that needs it refuses its plan naming the program and the package.

/// A program sparkform runs on nodes, and the package that brings it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub command: &'static str,
    /// What to install on Debian or Ubuntu, as it reads after "install ".
    pub package: &'static str,
}

/// Reads and changes interfaces: `nodes`, the attachment kind.
pub const IP: Tool = Tool {
    command: "ip",
    package: "iproute2",
};

/// GPUs, driver and CUDA version: `nodes`, a plan's node facts.
pub const NVIDIA_SMI: Tool = Tool {
    command: "nvidia-smi",
    package: "the NVIDIA driver: nvidia-utils-<version>",
};

/// The fabric check between a network's attachments.
pub const PING: Tool = Tool {
    command: "ping",
    package: "iputils-ping",
};

/// dockerd's own locked-memory limit: `nodes`.
pub const PIDOF: Tool = Tool {
    command: "pidof",
    package: "procps, or sysvinit-utils on older releases",
};

/// `cat`, `uname`, `nproc`, `timeout`: every Debian or Ubuntu system has them.
const COREUTILS: &[&str] = &["cat", "uname", "nproc", "timeout"];

/// The tool `command` is, where sparkform knows its package.
pub fn tool(command: &str) -> Option<Tool> {
    if let Some(t) = [IP, NVIDIA_SMI, PING, PIDOF]
        .into_iter()
        .find(|t| t.command == command)
    {
        return Some(t);
    }
    COREUTILS
        .iter()
        .find(|c| **c == command)
        .map(|&command| Tool {
            command,
            package: "coreutils",
        })
}

/// Whether a run of `command` that exited `code` with `stderr` failed because the program is not
/// installed: exit code 127 (the shell's, or `timeout`'s when it cannot run it), or the shell's
/// `not found` naming it (`sh: 1: ip: not found`, `bash: line 1: ip: command not found`).
pub fn is_missing(command: &str, code: Option<i32>, stderr: &str) -> bool {
    let says = |l: &str| {
        [": not found", ": command not found"].iter().any(|tail| {
            let said = format!("{command}{tail}");
            l == said || l.ends_with(&format!(" {said}"))
        })
    };
    code == Some(127) || stderr.lines().map(str::trim).any(says)
}

/// `` `ip` is missing on the node (install iproute2) ``.
pub fn missing(command: &str) -> String {
    match tool(command) {
        Some(t) => format!("`{command}` is missing on the node (install {})", t.package),
        None => format!("`{command}` is missing on the node"),
    }
}

/// Why a command did not give what was asked: the program missing (and its package), or the
/// command's own error (the first line of its stderr, else of its stdout, where nvidia-smi
/// says it). `display` is the command as it reads in messages.
pub fn why(command: &str, display: &str, code: Option<i32>, stdout: &str, stderr: &str) -> String {
    if is_missing(command, code, stderr) {
        return missing(command);
    }
    let first = |text: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    };
    let said = first(stderr)
        .or_else(|| first(stdout))
        .unwrap_or_else(|| "no error text".into());
    match code {
        Some(c) if c >= 0 => format!("`{display}` failed (exit code {c}): {said}"),
        _ => format!("`{display}` did not run: {said}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named_with_its_package() {
        for (code, stderr) in [
            (Some(127), "sh: 1: ip: not found"),
            (Some(127), "bash: line 1: ip: command not found"),
            (Some(1), "sh: 1: ip: not found"),
        ] {
            assert!(is_missing("ip", code, stderr), "{code:?} {stderr}");
            assert_eq!(
                why("ip", "ip -j addr", code, "", stderr),
                "`ip` is missing on the node (install iproute2)"
            );
        }
        assert_eq!(
            missing("nvidia-smi"),
            "`nvidia-smi` is missing on the node (install the NVIDIA driver: nvidia-utils-<version>)"
        );
        assert_eq!(
            missing("ping"),
            "`ping` is missing on the node (install iputils-ping)"
        );
        assert_eq!(
            missing("nproc"),
            "`nproc` is missing on the node (install coreutils)"
        );
        assert_eq!(missing("frob"), "`frob` is missing on the node");
    }

    #[test]
    fn another_failure_is_the_commands_own_error() {
        let smi = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nMake sure that the latest NVIDIA driver is installed and running.";
        assert!(!is_missing("nvidia-smi", Some(9), smi));
        assert_eq!(
            why("nvidia-smi", "nvidia-smi", Some(9), "", smi),
            "`nvidia-smi` failed (exit code 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        );
        assert_eq!(
            why(
                "ip",
                "ip -j addr",
                Some(255),
                "",
                "Option \"-j\" is unknown, try \"ip -help\"."
            ),
            "`ip -j addr` failed (exit code 255): Option \"-j\" is unknown, try \"ip -help\"."
        );
        assert_eq!(
            why("ip", "ip -j addr", Some(-1), "", ""),
            "`ip -j addr` did not run: no error text"
        );
        // nvidia-smi says why on its stdout.
        assert_eq!(
            why("nvidia-smi", "nvidia-smi", Some(9), smi, ""),
            why("nvidia-smi", "nvidia-smi", Some(9), "", smi)
        );
        // Another program's absence is not this one's.
        assert!(!is_missing("ip", Some(1), "sh: 1: ipx: not found"));
        assert!(!is_missing("ip", Some(1), "sh: 1: skip: not found"));
    }
}

//! A node at a glance, for a plan: one `sh` program runs the commands a plan's readers would
//! each run (the fabric's sysfs read, `cat /proc/meminfo`, nvidia-smi's GPU list, `ip -j addr`)
//! and prints each one's output, error text and exit code as a section, parsed apart here. The
//! node facts, the fabric read and the attachments' observation then cost one round trip, not
//! four. nvidia-smi runs under `timeout` where the node has it: a driver that hangs makes the
//! facts unreadable (as before), not the fabric.

use std::sync::LazyLock;

use std::sync::Arc;

use crate::hosts::memo::remembered;
use crate::hosts::{shell_quote, tools, Cmd, Host, HostError, HostPool};

/// One command's part of the glance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    /// Its exit code (127: not installed; [`TIMED_OUT`]: stopped by `timeout`).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Section {
    /// Why the section `name` (of [`sections`]) gave nothing to read, None where its command
    /// ran well: the program missing and the package that brings it ([`tools`]),
    /// nvidia-smi stopped by `timeout`, or the command's own error.
    pub fn failure(&self, name: &str) -> Option<String> {
        if self.code == 0 {
            return None;
        }
        let words = sections()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, w)| w)
            .unwrap_or_default();
        let program = words.first().copied().unwrap_or(name);
        if name == "smi" && self.code == TIMED_OUT {
            return Some(format!(
                "`{program}` did not answer within {SMI_TIMEOUT_SECS} s"
            ));
        }
        let display = match name {
            // The script is long; what it reads is said in its own module.
            "fabric" => "the fabric's sysfs read".to_string(),
            _ => words.join(" "),
        };
        Some(tools::why(
            program,
            &display,
            Some(self.code),
            &self.stdout,
            &self.stderr,
        ))
    }
}

/// What one glance saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Glance {
    /// `sh -c` of the fabric's script (`FABRIC`): `inspect::fabric::parse` reads it.
    pub fabric: Section,
    /// `cat /proc/meminfo`.
    pub meminfo: Section,
    /// nvidia-smi's GPU list (`name, memory.total`), under `timeout` where there is one.
    pub smi: Section,
    /// `ip -j addr`.
    pub ip: Section,
    /// `cat /proc/net/tcp /proc/net/tcp6`: the ports something listens on
    /// ([`listening_ports`]).
    pub tcp: Section,
}

/// How long nvidia-smi may take.
pub const SMI_TIMEOUT_SECS: u64 = 20;
/// `timeout`'s exit code when it stopped the command.
pub const TIMED_OUT: i32 = 124;

/// The fabric's section (parsed by `fabric`): prints `PATH:VALUE` lines for the files read (every network interface's MTU among them), `net:DEVICE:NETDEV` for each network device an
/// RDMA device drives, `linger:USER` for each lingering user. `grep` reads the GID table (256
/// files a port) in one process; a GID's type cannot be read for an empty entry (EINVAL),
/// which `2>/dev/null` drops.
const FABRIC: &str = r#"grep -H '' /sys/class/net/*/mtu 2>/dev/null
C=/sys/class/infiniband
if [ -d "$C" ]; then
  for d in "$C"/*; do
    [ -d "$d" ] || continue
    for n in "$d"/device/net/*; do [ -e "$n" ] && echo "net:${d##*/}:${n##*/}"; done
  done
  grep -H '' "$C"/*/ports/*/state "$C"/*/ports/*/phys_state "$C"/*/ports/*/link_layer "$C"/*/ports/*/rate "$C"/*/ports/*/gids/* "$C"/*/ports/*/gid_attrs/types/* "$C"/*/ports/*/gid_attrs/ndevs/* "$C"/*/device/current_link_width "$C"/*/device/max_link_width "$C"/*/device/current_link_speed "$C"/*/device/max_link_speed 2>/dev/null
fi
grep -H '^[[:space:]]*RemoveIPC' /etc/systemd/logind.conf /etc/systemd/logind.conf.d/*.conf 2>/dev/null
for u in /var/lib/systemd/linger/*; do [ -e "$u" ] && echo "linger:${u##*/}"; done
exit 0
"#;

/// The sections in the order the program runs them: name, and the command as it would run
/// alone (what the fake node answers each section with).
pub fn sections() -> [(&'static str, Vec<&'static str>); 5] {
    [
        ("fabric", vec!["sh", "-c", FABRIC]),
        ("meminfo", vec!["cat", "/proc/meminfo"]),
        (
            "smi",
            vec![
                "nvidia-smi",
                "--query-gpu=name,memory.total",
                "--format=csv,noheader,nounits",
            ],
        ),
        ("ip", vec!["ip", "-j", "addr"]),
        ("tcp", vec!["cat", "/proc/net/tcp", "/proc/net/tcp6"]),
    ]
}

const MARK: &str = "@@sparkform-glance";

/// The program: `s NAME COMMAND…` runs the command with its stdout on the program's and its
/// stderr and exit code captured, then prints them after markers.
static SCRIPT: LazyLock<String> = LazyLock::new(|| {
    let mut s = format!(
        "exec 3>&1\n\
         s() {{ n=$1; shift; printf '{MARK} %s\\n' \"$n\"; e=$(\"$@\" 2>&1 1>&3); r=$?; \
         printf '\\n{MARK}-stderr %s\\n%s\\n{MARK}-code %s %s\\n' \"$n\" \"$e\" \"$n\" \"$r\"; }}\n\
         T=; command -v timeout >/dev/null 2>&1 && T=\"timeout {SMI_TIMEOUT_SECS}\"\n"
    );
    for (name, cmd) in sections() {
        let words: Vec<String> = cmd.iter().map(|w| shell_quote(w)).collect();
        let timed = if name == "smi" { "$T " } else { "" };
        s.push_str(&format!("s {name} {timed}{}\n", words.join(" ")));
    }
    s.push_str("exit 0\n");
    s
});

/// The program `sh -c` runs.
pub fn script() -> &'static str {
    &SCRIPT
}

/// The glance as a command.
pub fn command() -> Cmd {
    Cmd::new("sh").args(["-c", script()])
}

/// Take a glance at `host`: one command.
/// The node at a glance, in one command; a pool that reads for a plan runs it once for every
/// reader.
pub async fn glance(host: &dyn Host) -> Result<Arc<Glance>, HostError> {
    remembered(host, "glance", || async { read(host).await.map(Arc::new) }).await
}

/// Run the glance's command on `host` now.
pub async fn read<H: Host + ?Sized>(host: &H) -> Result<Glance, HostError> {
    let out = host.exec(&command()).await?;
    if !out.stdout.contains(MARK) {
        return Err(HostError::Other {
            node: host.node().to_string(),
            message: format!(
                "`sh` printed nothing of what it was asked (exit code {:?}): {}",
                out.code,
                out.stderr.trim()
            ),
        });
    }
    Ok(parse(&out.stdout))
}

/// The glance of each of `nodes` on `pool`, at once: by node address. A node that cannot be
/// connected or read is left out (the refresh reports it).
pub async fn read_each(
    pool: &HostPool,
    nodes: &[String],
) -> std::collections::BTreeMap<String, std::sync::Arc<Glance>> {
    let reads = nodes.iter().filter_map(|n| {
        let host = pool.get(n).ok()?;
        Some(async move { (n.clone(), glance(host.as_ref()).await) })
    });
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .filter_map(|(node, read)| Some((node, read.ok()?)))
        .collect()
}

/// The program's output as sections. Pure; a section missing is empty with code -1.
pub fn parse(out: &str) -> Glance {
    let missing = Section {
        code: -1,
        ..Section::default()
    };
    let mut g = Glance {
        fabric: missing.clone(),
        meminfo: missing.clone(),
        smi: missing.clone(),
        ip: missing.clone(),
        tcp: missing,
    };
    let mut rest = out;
    while let Some(start) = rest.find(&format!("{MARK} ")) {
        let after = &rest[start + MARK.len() + 1..];
        let Some((name, body)) = after.split_once('\n') else {
            break;
        };
        let name = name.trim().to_string();
        let err_mark = format!("\n{MARK}-stderr {name}\n");
        let code_mark = format!("\n{MARK}-code {name} ");
        let (Some(e), Some(c)) = (body.find(&err_mark), body.find(&code_mark)) else {
            break;
        };
        if c < e {
            break;
        }
        let stdout = &body[..e];
        let stderr = &body[e + err_mark.len()..c];
        let tail = &body[c + code_mark.len()..];
        let (code, next) = tail.split_once('\n').unwrap_or((tail, ""));
        let section = Section {
            code: code.trim().parse().unwrap_or(-1),
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
        };
        match name.as_str() {
            "fabric" => g.fabric = section,
            "meminfo" => g.meminfo = section,
            "smi" => g.smi = section,
            "ip" => g.ip = section,
            "tcp" => g.tcp = section,
            _ => {}
        }
        rest = next;
    }
    g
}

/// The TCP ports something listens on, from `/proc/net/tcp` and `/proc/net/tcp6` (the local
/// address's port, in hex after the colon, of each socket in state `0A`, LISTEN).
pub fn listening_ports(proc_net_tcp: &str) -> std::collections::BTreeSet<u16> {
    proc_net_tcp
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let (local, state) = (fields.get(1)?, fields.get(3)?);
            if *state != "0A" {
                return None;
            }
            u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()
        })
        .collect()
}

/// What the program prints for these sections (name, code, stdout, stderr): the fake node's
/// answer to it.
pub fn render(sections: &[(&str, i32, &str, &str)]) -> String {
    let mut out = String::new();
    for (name, code, stdout, stderr) in sections {
        out.push_str(&format!(
            "{MARK} {name}\n{stdout}\n{MARK}-stderr {name}\n{stderr}\n{MARK}-code {name} {code}\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_parsed_apart_with_their_codes() {
        let text = render(&[
            ("fabric", 0, "/sys/class/net/eth1/mtu:9000\n", ""),
            ("meminfo", 0, "MemTotal: 1024 kB\n", ""),
            ("smi", 127, "", "sh: nvidia-smi: not found"),
            ("ip", 0, "[]", ""),
        ]);
        let g = parse(&text);
        assert_eq!(g.fabric.code, 0);
        assert!(g
            .fabric
            .stdout
            .starts_with("/sys/class/net/eth1/mtu:9000\n"));
        assert_eq!(g.meminfo.stdout.trim(), "MemTotal: 1024 kB");
        assert_eq!(
            (g.smi.code, g.smi.stderr.trim()),
            (127, "sh: nvidia-smi: not found")
        );
        assert_eq!((g.ip.code, g.ip.stdout.trim()), (0, "[]"));
    }

    #[test]
    fn a_sections_failure_names_a_missing_program_and_its_package() {
        let g = parse(&render(&[
            ("fabric", 0, "", ""),
            ("meminfo", 0, "MemTotal: 1024 kB", ""),
            ("smi", TIMED_OUT, "", ""),
            ("ip", 127, "", "sh: 1: ip: not found"),
        ]));
        assert_eq!(g.meminfo.failure("meminfo"), None);
        assert_eq!(
            g.ip.failure("ip").as_deref(),
            Some("`ip` is missing on the node (install iproute2)")
        );
        assert_eq!(
            g.smi.failure("smi").as_deref(),
            Some("`nvidia-smi` did not answer within 20 s")
        );
        let smi = parse(&render(&[(
            "smi",
            127,
            "",
            "timeout: failed to run command 'nvidia-smi': No such file or directory",
        )]));
        assert_eq!(
            smi.smi.failure("smi").as_deref(),
            Some("`nvidia-smi` is missing on the node (install the NVIDIA driver: nvidia-utils-<version>)")
        );
        let old_ip = parse(&render(&[(
            "ip",
            255,
            "",
            "Option \"-j\" is unknown, try \"ip -help\".",
        )]));
        assert_eq!(
            old_ip.ip.failure("ip").as_deref(),
            Some(
                "`ip -j addr` failed (exit code 255): Option \"-j\" is unknown, try \"ip -help\"."
            )
        );
        assert_eq!(
            g.fabric.failure("fabric"),
            None,
            "a section that ran is no failure"
        );
        assert_eq!(
            parse("").ip.failure("ip").as_deref(),
            Some("`ip -j addr` did not run: no error text")
        );
    }

    #[test]
    fn a_section_that_did_not_print_is_missing() {
        let g = parse(&render(&[("meminfo", 0, "MemTotal: 1 kB", "")]));
        assert_eq!(g.ip.code, -1);
        assert_eq!(g.meminfo.code, 0);
        assert_eq!(parse("garbage").fabric.code, -1);
    }

    /// The program itself, run by this machine's `sh`: every section there, nvidia-smi's
    /// absence a code, not a failure.
    #[tokio::test]
    async fn the_program_runs_under_sh() {
        let out = tokio::process::Command::new("sh")
            .args(["-c", script()])
            .output()
            .await
            .unwrap();
        assert!(out.status.success());
        let g = parse(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(g.fabric.code, 0, "{g:?}");
        assert!(g.meminfo.stdout.contains("MemTotal:"), "{g:?}");
        assert!(g.smi.code != -1, "{g:?}");
        assert!(g.ip.code != -1, "{g:?}");
    }
}

#[cfg(test)]
mod listening_tests {
    #[test]
    fn the_ports_in_listen_state_are_read_from_proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   1: 0100007F:0016 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3\n";
        assert_eq!(
            super::listening_ports(text).into_iter().collect::<Vec<_>>(),
            [8000, 30000]
        );
        assert!(super::listening_ports("cat: /proc/net/tcp6: No such file").is_empty());
    }
}

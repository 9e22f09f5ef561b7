//! What a node is: OS, kernel, architecture, CPUs, memory, GPUs and their driver, RDMA
//! devices, memlock limits, Docker and the images the definitions use (with the NCCL each
//! carries, which `nodes` adds: `super::nccl`), interfaces. Read over a `Host`; judged against
//! the definitions for `sparkform nodes`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::{Config, Node, NodeReadings};
use crate::hosts::{tools, Cmd, Host, HostError, Output};
use crate::inspect::glance::Section;
use crate::inspect::ip_addr::{parse_ip_addr, Interface};
use crate::kind::Registered;
use crate::runtime::image::{image_ids, short_id};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Gpu {
    pub name: String,
    pub memory_mib: Option<u64>,
}

/// What `nvidia-smi` says about the driver stack.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Nvidia {
    pub driver: String,
    /// The highest CUDA version the driver supports.
    pub cuda: Option<String>,
}

/// An RDMA device (`/sys/class/infiniband/mlx5_0`) and the network interfaces it drives.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RdmaDevice {
    pub name: String,
    pub netdevs: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Facts {
    pub os: String,
    pub kernel: String,
    pub arch: String,
    pub cpus: u32,
    pub memory_gib: f64,
    pub gpus: Vec<Gpu>,
    /// None when the node has no NVIDIA driver (`nvidia-smi` missing or failing).
    pub nvidia: Option<Nvidia>,
    pub rdma: Vec<RdmaDevice>,
    /// The RDMA ports, GID tables, PCIe links and logind's IPC removal.
    pub fabric: super::fabric::RdmaFabric,
    /// The locked-memory limit of the ssh user's processes (`ulimit -l`).
    pub memlock: Option<String>,
    /// The locked-memory limit containers get by default: daemon.json's `default-ulimits`,
    /// else what dockerd itself runs with (containers inherit it).
    pub docker_memlock: Option<String>,
    /// `28.2.2 (API 1.50)`, or why it could not be read.
    pub docker: Result<String, String>,
    /// Image reference → image ID on this node (None: not there).
    pub images: BTreeMap<String, Option<String>>,
    /// Image reference → the NCCL it carries, for the images the node has. Empty from
    /// [`gather`]: only `nodes` reads it ([`super::nccl::read`], a container per image, too
    /// slow for a plan).
    pub nccl: super::nccl::ImagesNccl,
    pub interfaces: Vec<Interface>,
    /// The sections not read, by the field each fills (`interfaces`, `gpus`, `nvidia`,
    /// `memory_gib`, `docker_memlock`, `os`, `kernel`, `arch`, `cpus`), and why: the program
    /// missing on the node and the package that brings it (`` `ip` is missing on the node
    /// (install iproute2) ``), or the command's own error. Such a field stays empty or
    /// unknown; the others stand.
    pub not_read: BTreeMap<String, String>,
}

fn other(node: &str, message: String) -> HostError {
    HostError::Other {
        node: node.to_string(),
        message,
    }
}

/// The sections of the facts not read, by the name of the field each fills, and why.
#[derive(Default)]
struct NotRead(BTreeMap<String, String>);

impl NotRead {
    /// `out`'s stdout where `cmd` ran well; else why not, noted for `section`.
    fn stdout(&mut self, section: &str, cmd: &Cmd, out: Output) -> Option<String> {
        if out.success() {
            return Some(out.stdout);
        }
        self.note(
            section,
            tools::why(
                &cmd.program,
                &cmd.display(),
                out.code,
                &out.stdout,
                &out.stderr,
            ),
        );
        None
    }

    /// The glance's section `name` where it ran well; else why not, noted for `section`.
    fn glance<'g>(&mut self, section: &str, name: &str, s: &'g Section) -> Option<&'g str> {
        match s.failure(name) {
            None => Some(&s.stdout),
            Some(why) => {
                self.note(section, why);
                None
            }
        }
    }

    fn note(&mut self, section: &str, why: String) {
        self.0.insert(section.to_string(), why);
    }
}

/// Gather facts, with the IDs of `images` there; the commands run in parallel over the node's
/// one connection. Each section stands alone: one whose command fails (a program the node
/// lacks: `ip`, `nvidia-smi`) is left empty or unknown and said in [`Facts::not_read`], the
/// others are read. An error is the node's: its connection, or its `sh` answering nothing.
pub async fn gather(host: &dyn Host, images: &[String]) -> Result<Facts, HostError> {
    let os_release = Cmd::new("cat").arg("/etc/os-release");
    let uname = Cmd::new("uname").arg("-m");
    let kernel_cmd = Cmd::new("uname").arg("-r");
    let nproc = Cmd::new("nproc");
    // The glance: the fabric's sysfs, meminfo, nvidia-smi's GPUs and `ip -j addr` at once.
    let (os, arch, cpus, glance, docker) = tokio::join!(
        host.exec(&os_release),
        host.exec(&uname),
        host.exec(&nproc),
        crate::inspect::glance::glance(host),
        docker_version(host),
    );
    let (kernel, nvidia, memlock, docker_memlock, images) = tokio::join!(
        host.exec(&kernel_cmd),
        driver(host),
        own_memlock(host),
        docker_memlock(host),
        image_ids(host, images),
    );
    let glance = glance?;
    let mut not_read = NotRead::default();
    let fabric = super::fabric::parse(&glance.fabric.stdout);
    let os = not_read
        .stdout("os", &os_release, os?)
        .map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
                .unwrap_or_else(|| "unknown".into())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = not_read
        .stdout("kernel", &kernel_cmd, kernel?)
        .map_or_else(|| "unknown".into(), |k| k.trim().to_string());
    let arch = not_read
        .stdout("arch", &uname, arch?)
        .map_or_else(|| "unknown".into(), |a| a.trim().to_string());
    let cpus = not_read
        .stdout("cpus", &nproc, cpus?)
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    let memory_gib = match not_read.glance("memory_gib", "meminfo", &glance.meminfo) {
        Some(text) => mem_total_gib(text).unwrap_or_else(|| {
            not_read.note("memory_gib", "/proc/meminfo has no MemTotal".into());
            0.0
        }),
        None => 0.0,
    };
    let interfaces = match not_read.glance("interfaces", "ip", &glance.ip) {
        Some(json) => parse_ip_addr(json).unwrap_or_else(|e| {
            not_read.note("interfaces", e);
            Vec::new()
        }),
        None => Vec::new(),
    };
    let gpus = not_read
        .glance("gpus", "smi", &glance.smi)
        .map(parse_nvidia_smi)
        .unwrap_or_default();
    // Without the program there is no driver (`None`), said once, where the GPUs are; a
    // driver that fails or hangs leaves its version unknown.
    let nvidia = nvidia?.unwrap_or_else(|why| {
        if why != tools::missing(tools::NVIDIA_SMI.command) {
            not_read.note("nvidia", why);
        }
        None
    });
    let docker_memlock = docker_memlock?.unwrap_or_else(|why| {
        not_read.note("docker_memlock", why);
        None
    });
    Ok(Facts {
        os,
        kernel,
        arch,
        cpus,
        memory_gib,
        gpus,
        nvidia,
        rdma: rdma_devices(&fabric),
        fabric,
        memlock: memlock?,
        docker_memlock,
        docker,
        images,
        nccl: BTreeMap::new(),
        interfaces,
        not_read: not_read.0,
    })
}

/// The driver and CUDA version, or why `nvidia-smi` could not say (missing, failing, hung):
/// under the glance's bound, so that a hung driver leaves the rest of the facts.
async fn driver(host: &dyn Host) -> Result<Result<Option<Nvidia>, String>, HostError> {
    let cmd = Cmd::new("nvidia-smi").timeout(std::time::Duration::from_secs(
        crate::inspect::glance::SMI_TIMEOUT_SECS,
    ));
    match host.exec(&cmd).await {
        Ok(out) if out.success() => Ok(Ok(parse_smi_header(&out.stdout))),
        Ok(out) => Ok(Err(tools::why(
            &cmd.program,
            &cmd.display(),
            out.code,
            &out.stdout,
            &out.stderr,
        ))),
        Err(HostError::Timeout { seconds, .. }) => Ok(Err(format!(
            "`nvidia-smi` did not answer within {seconds} s"
        ))),
        Err(e) => Err(e),
    }
}

/// `MemTotal` of `/proc/meminfo`, in GiB.
pub fn mem_total_gib(meminfo: &str) -> Option<f64> {
    meminfo_gib(meminfo, "MemTotal")
}

/// A field of `/proc/meminfo` (`MemFree`, `Cached`…), in GiB.
pub fn meminfo_gib(meminfo: &str, field: &str) -> Option<f64> {
    let kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    Some(kib / 1024.0 / 1024.0)
}

/// Whether the node's GPUs use its memory (unified memory: DGX Spark's GB10, Jetson) rather
/// than memory of their own; `None` without a GPU to ask. The driver reports no memory size
/// for a GPU without memory of its own (`[N/A]`), and GB10 by name where a shim reports one.
pub fn unified_memory(gpus: &[Gpu]) -> Option<bool> {
    if gpus.is_empty() {
        return None;
    }
    Some(
        gpus.iter()
            .any(|g| g.memory_mib.is_none() || g.name.contains("GB10")),
    )
}

/// What the facts say about the three node attributes a definition may leave to them.
pub fn node_readings(facts: &Facts) -> NodeReadings {
    NodeReadings {
        unified_memory: unified_memory(&facts.gpus),
        memory_gib: (facts.memory_gib > 0.0).then(|| round_gib(facts.memory_gib)),
        gpus: Some(facts.gpus.len() as u32),
    }
}

fn round_gib(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// The node attributes a definition may leave unset, read cheaply for a plan: `/proc/meminfo`
/// and `nvidia-smi`'s GPU list, from the node's glance (one round trip, shared with the fabric
/// read and the attachments' observation). Without a working `nvidia-smi` the GPUs and unified
/// memory stay unknown; one that did not answer in time is an error.
pub async fn observe_sizes(host: &dyn Host) -> Result<NodeReadings, HostError> {
    let g = crate::inspect::glance::glance(host).await?;
    if g.smi.code == crate::inspect::glance::TIMED_OUT {
        return Err(other(
            host.node(),
            format!(
                "`nvidia-smi` did not answer within {} s",
                crate::inspect::glance::SMI_TIMEOUT_SECS
            ),
        ));
    }
    let memory_gib = (g.meminfo.code == 0)
        .then(|| mem_total_gib(&g.meminfo.stdout))
        .flatten()
        .filter(|m| *m > 0.0)
        .map(round_gib);
    let gpus = (g.smi.code == 0).then(|| parse_nvidia_smi(&g.smi.stdout));
    Ok(NodeReadings {
        unified_memory: gpus.as_deref().and_then(unified_memory),
        memory_gib,
        gpus: gpus.map(|g| g.len() as u32),
    })
}

/// The driver and CUDA version from `nvidia-smi`'s header; None where there is no driver.
pub async fn nvidia(host: &dyn Host) -> Result<Option<Nvidia>, HostError> {
    let out = host.exec(&Cmd::new("nvidia-smi")).await?;
    Ok(if out.success() {
        parse_smi_header(&out.stdout)
    } else {
        None
    })
}

/// `| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |`
pub fn parse_smi_header(text: &str) -> Option<Nvidia> {
    let after = |key: &str| {
        text.split_once(key).and_then(|(_, rest)| {
            rest.split_whitespace()
                .next()
                .map(|v| v.trim_matches('|').to_string())
                .filter(|v| !v.is_empty())
        })
    };
    Some(Nvidia {
        driver: after("Driver Version:")?,
        cuda: after("CUDA Version:"),
    })
}

/// The RDMA devices and the network devices each drives.
fn rdma_devices(fabric: &super::fabric::RdmaFabric) -> Vec<RdmaDevice> {
    let mut names: BTreeSet<&String> = fabric.netdevs.keys().collect();
    names.extend(fabric.ports.iter().map(|p| &p.device));
    names
        .into_iter()
        .map(|name| RdmaDevice {
            name: name.clone(),
            netdevs: fabric.netdevs.get(name).cloned().unwrap_or_default(),
        })
        .collect()
}

/// `cat` inherits the ssh session's limits: its own are the user's.
async fn own_memlock(host: &dyn Host) -> Result<Option<String>, HostError> {
    let out = host.exec(&Cmd::new("cat").arg("/proc/self/limits")).await?;
    Ok(out.success().then(|| parse_memlock(&out.stdout)).flatten())
}

/// The limit containers get by default, None where neither daemon.json nor a running dockerd
/// says; why not where `pidof` is missing.
async fn docker_memlock(host: &dyn Host) -> Result<Result<Option<String>, String>, HostError> {
    let daemon = host
        .exec(&Cmd::new("cat").arg("/etc/docker/daemon.json"))
        .await?;
    if daemon.success() {
        if let Some(m) = daemon_default_memlock(&daemon.stdout) {
            return Ok(Ok(Some(format!("{m} (daemon.json default-ulimits)"))));
        }
    }
    let pid = host.exec(&Cmd::new("pidof").arg("dockerd")).await?;
    if tools::is_missing("pidof", pid.code, &pid.stderr) {
        return Ok(Err(tools::missing("pidof")));
    }
    let Some(pid) = pid
        .stdout
        .split_whitespace()
        .next()
        .filter(|_| pid.success())
    else {
        return Ok(Ok(None));
    };
    let limits = host
        .exec(&Cmd::new("cat").arg(format!("/proc/{pid}/limits")))
        .await?;
    Ok(Ok(limits
        .success()
        .then(|| parse_memlock(&limits.stdout))
        .flatten()
        .map(|m| format!("{m} (dockerd's own)"))))
}

/// The `Max locked memory` line of `/proc/PID/limits`, as `soft` or `soft/hard`.
pub fn parse_memlock(limits: &str) -> Option<String> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let mut fields = rest.split_whitespace();
    let soft = human_limit(fields.next()?);
    let hard = human_limit(fields.next()?);
    Some(if soft == hard {
        soft
    } else {
        format!("{soft}/{hard}")
    })
}

fn human_limit(v: &str) -> String {
    match v.parse::<u64>() {
        Ok(b) if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        Ok(b) if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        Ok(b) if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        Ok(b) => format!("{b} B"),
        Err(_) => v.to_string(),
    }
}

fn daemon_default_memlock(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let m = v.get("default-ulimits")?.get("memlock")?;
    let one = |k: &str| {
        m.get(k).and_then(|x| x.as_i64()).map(|n| {
            if n < 0 {
                "unlimited".to_string()
            } else {
                human_limit(&n.to_string())
            }
        })
    };
    let (soft, hard) = (one("Soft")?, one("Hard")?);
    Some(if soft == hard {
        soft
    } else {
        format!("{soft}/{hard}")
    })
}

/// The image references the definitions' resources use, for `gather`.
pub fn images_of(config: &Config) -> Vec<String> {
    let set: BTreeSet<String> = config
        .resources
        .iter()
        .flat_map(|r| r.kind.kind().images(&r.config, None))
        .map(|(image, _)| image)
        .collect();
    set.into_iter().collect()
}

/// What differs between nodes that should be alike (kernel, driver, CUDA, image IDs, the
/// NCCL of an image), one line per property naming each node's value; and images that carry
/// both a pip and a system NCCL. Pure.
pub fn differences(facts: &BTreeMap<String, Facts>) -> Vec<String> {
    let mut out = Vec::new();
    let mut compare = |what: String, values: Vec<(&String, Option<String>)>| {
        let distinct: BTreeSet<&Option<String>> = values.iter().map(|(_, v)| v).collect();
        if distinct.len() > 1 {
            let each: Vec<String> = values
                .iter()
                .map(|(n, v)| format!("{n} {}", v.as_deref().unwrap_or("none")))
                .collect();
            out.push(format!("{what} differs: {}", each.join(", ")));
        }
    };
    compare(
        "kernel".into(),
        facts
            .iter()
            .map(|(n, f)| (n, Some(f.kernel.clone())))
            .collect(),
    );
    // Without any driver there is nothing to compare (the testbed); one node without it is.
    if facts.values().any(|f| f.nvidia.is_some()) {
        compare(
            "NVIDIA driver".into(),
            facts
                .iter()
                .map(|(n, f)| (n, f.nvidia.as_ref().map(|v| v.driver.clone())))
                .collect(),
        );
        compare(
            "CUDA version".into(),
            facts
                .iter()
                .map(|(n, f)| (n, f.nvidia.as_ref().and_then(|v| v.cuda.clone())))
                .collect(),
        );
    }
    // A GID index pinned from one node is wrong on another whose index differs.
    if facts.values().any(|f| !f.fabric.ports.is_empty()) {
        compare(
            "RoCE v2 GID index of the IPv4 addresses".into(),
            facts
                .iter()
                .map(|(n, f)| {
                    let idx: BTreeSet<u32> = f
                        .fabric
                        .ports
                        .iter()
                        .flat_map(|p| &p.gids)
                        .filter(|g| g.is_roce_v2() && g.ipv4().is_some())
                        .map(|g| g.index)
                        .collect();
                    let idx: Vec<String> = idx.iter().map(u32::to_string).collect();
                    (n, (!idx.is_empty()).then(|| idx.join(" ")))
                })
                .collect(),
        );
        compare(
            "RDMA ports up".into(),
            facts
                .iter()
                .map(|(n, f)| {
                    let up = f.fabric.ports.iter().filter(|p| p.is_active()).count();
                    (n, Some(up.to_string()))
                })
                .collect(),
        );
    }
    let images: BTreeSet<&String> = facts.values().flat_map(|f| f.images.keys()).collect();
    for image in images {
        compare(
            format!("image {image}"),
            facts
                .iter()
                .map(|(n, f)| {
                    (
                        n,
                        f.images.get(image).cloned().flatten().map(|i| short_id(&i)),
                    )
                })
                .collect(),
        );
    }
    out.extend(super::nccl::differences(
        facts.iter().map(|(n, f)| (n, &f.nccl)),
    ));
    out
}

/// Differences from the definitions that are expected and why, so they are not taken for
/// warnings. Pure.
pub fn explanations(node: &Node, facts: &Facts) -> Vec<String> {
    let mut out = Vec::new();
    if !node.gpu_devices {
        if let Some(g) = node.gpus {
            out.push(format!(
                "declares {g} logical GPU{} without devices (gpu_devices = false); the machine shows {}",
                if g == 1 { "" } else { "s" },
                facts.gpus.len()
            ));
        }
    }
    // A driver that is there but failed is said where it was not read, not explained away.
    if facts.nvidia.is_none() && !facts.not_read.contains_key("nvidia") {
        out.push("no NVIDIA driver: driver and CUDA parity are not checked here".into());
    }
    if facts.rdma.is_empty() {
        out.push("no RDMA devices (/sys/class/infiniband is empty): NCCL uses TCP sockets".into());
    }
    out
}

/// The engine's version, or why it cannot be used (with what to check).
async fn docker_version(host: &dyn Host) -> Result<String, String> {
    let docker = host.docker().await.map_err(|e| match &e {
        HostError::Docker {
            help: Some(help), ..
        } => format!("{e} ({help})"),
        _ => e.to_string(),
    })?;
    let v = docker.version().await.map_err(|e| e.to_string())?;
    Ok(format!(
        "{} (API {})",
        v.version.unwrap_or_default(),
        v.api_version.unwrap_or_default()
    ))
}

pub fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut parts = l.split(',').map(str::trim);
            Gpu {
                name: parts.next().unwrap_or_default().to_string(),
                memory_mib: parts.next().and_then(|m| m.parse().ok()),
            }
        })
        .collect()
}

/// Where the definitions disagree with the machine. Pure, for `sparkform nodes`.
pub fn disagreements(config: &Config, node: &Node, facts: &Facts) -> Vec<String> {
    let mut out = Vec::new();
    // The same rule as a plan's warnings (`NodeReadings::disagreements`), on what the
    // definition itself sets.
    let declared = NodeReadings {
        unified_memory: node.unified_memory,
        memory_gib: node.memory_gib,
        gpus: node.gpus,
    };
    for d in node_readings(facts).disagreements(&declared, node.gpu_devices) {
        out.push(match d.attribute {
            "gpus" => format!(
                "declares {} GPU{}, the machine shows {}",
                d.declared,
                if d.declared == "1" { "" } else { "s" },
                d.observed
            ),
            "memory_gib" => format!(
                "declares {} GiB of memory, the machine has {} GiB",
                d.declared, d.observed
            ),
            _ => format!(
                "declares {} = {}, but {}",
                d.attribute,
                d.declared,
                d.what_the_node_shows()
            ),
        });
    }
    // The node's attachments: their interfaces must exist; a different MTU is what apply fixes.
    let interfaces = config
        .resources
        .iter()
        .filter(|r| r.node.as_deref() == Some(&node.address))
        .filter_map(|r| Some((r, r.kind.kind().placement(&r.config).interface?)));
    for (r, d) in interfaces {
        let iface = d.name.as_str();
        if let Some(why) = facts.not_read.get("interfaces") {
            out.push(format!(
                "{} uses interface {iface}, which cannot be checked: {why}; plan and apply need it",
                r.address
            ));
            continue;
        }
        match facts.interfaces.iter().find(|i| i.name == iface) {
            None => out.push(format!(
                "{} uses interface {iface}, which does not exist (interfaces: {})",
                r.address,
                facts
                    .interfaces
                    .iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(i) => {
                if i.mtu != d.mtu {
                    out.push(format!(
                        "{iface} has MTU {}, {} sets {} (apply will change it)",
                        i.mtu, r.address, d.mtu
                    ));
                }
            }
        }
    }
    if let Err(e) = &facts.docker {
        out.push(format!("Docker Engine not usable: {e}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_driver_and_cuda_version() {
        let header = "+-----------------------------------------------------------------------------------------+\n\
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |\n";
        assert_eq!(
            parse_smi_header(header),
            Some(Nvidia {
                driver: "580.95.05".into(),
                cuda: Some("13.0".into())
            })
        );
        assert_eq!(parse_smi_header("command not found"), None);
    }

    #[test]
    fn reads_memlock_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
Max open files            1024                 1048576              files\n\
Max locked memory         8388608              8388608              bytes\n";
        assert_eq!(parse_memlock(limits).as_deref(), Some("8 MiB"));
        let unlimited =
            "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(parse_memlock(unlimited).as_deref(), Some("unlimited"));
        let mixed = "Max locked memory         65536            unlimited            bytes\n";
        assert_eq!(parse_memlock(mixed).as_deref(), Some("64 KiB/unlimited"));
        assert_eq!(
            daemon_default_memlock(
                r#"{"default-ulimits":{"memlock":{"Name":"memlock","Soft":-1,"Hard":-1}}}"#
            )
            .as_deref(),
            Some("unlimited")
        );
        assert_eq!(
            daemon_default_memlock(r#"{"log-driver":"json-file"}"#),
            None
        );
    }

    fn facts(kernel: &str, driver: Option<&str>, image: Option<&str>) -> Facts {
        Facts {
            os: "Ubuntu 24.04".into(),
            kernel: kernel.into(),
            arch: "aarch64".into(),
            cpus: 20,
            memory_gib: 119.6,
            gpus: Vec::new(),
            nvidia: driver.map(|d| Nvidia {
                driver: d.into(),
                cuda: Some("13.0".into()),
            }),
            rdma: Vec::new(),
            fabric: Default::default(),
            memlock: None,
            docker_memlock: None,
            docker: Ok("28.2.2".into()),
            images: [("vllm:x".to_string(), image.map(str::to_string))].into(),
            nccl: BTreeMap::new(),
            interfaces: Vec::new(),
            not_read: BTreeMap::new(),
        }
    }

    #[test]
    fn flags_what_differs_between_nodes() {
        let same: BTreeMap<String, Facts> = [
            (
                "node.a".to_string(),
                facts("6.11", None, Some("sha256:aaaa")),
            ),
            (
                "node.b".to_string(),
                facts("6.11", None, Some("sha256:aaaa")),
            ),
        ]
        .into();
        assert!(differences(&same).is_empty(), "{:?}", differences(&same));
        let differ: BTreeMap<String, Facts> = [
            (
                "node.a".to_string(),
                facts("6.11", Some("580.95.05"), Some("sha256:aaaaaaaaaaaaaaaa")),
            ),
            ("node.b".to_string(), facts("6.8", Some("570.1"), None)),
        ]
        .into();
        let d = differences(&differ);
        assert_eq!(
            d,
            [
                "kernel differs: node.a 6.11, node.b 6.8",
                "NVIDIA driver differs: node.a 580.95.05, node.b 570.1",
                "image vllm:x differs: node.a sha256:aaaaaaaaaaaa, node.b none",
            ]
        );
    }

    #[test]
    fn reads_nvidia_smi() {
        let g = parse_nvidia_smi("NVIDIA GB10, 122880\n");
        assert_eq!(
            g,
            vec![Gpu {
                name: "NVIDIA GB10".into(),
                memory_mib: Some(122880)
            }]
        );
    }
}

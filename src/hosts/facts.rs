//! What a node is: OS, architecture, CPUs, memory, GPUs, Docker, interfaces.

use serde::Serialize;

use super::{Cmd, Host, HostError};
use crate::config::{Config, Node};
use crate::kinds::{attachment, KindId};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Interface {
    pub name: String,
    pub mtu: u32,
    pub state: String,
    /// `address/prefix`
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Gpu {
    pub name: String,
    pub memory_mib: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Facts {
    pub os: String,
    pub arch: String,
    pub cpus: u32,
    pub memory_gib: f64,
    pub gpus: Vec<Gpu>,
    /// `28.2.2 (API 1.50)`, or why it could not be read.
    pub docker: Result<String, String>,
    pub interfaces: Vec<Interface>,
}

fn other(node: &str, message: String) -> HostError {
    HostError::Other {
        node: node.to_string(),
        message,
    }
}

/// Gather facts; the commands run in parallel over the node's one connection.
pub async fn gather(host: &dyn Host) -> Result<Facts, HostError> {
    let node = host.node().to_string();
    let os_release = Cmd::new("cat").arg("/etc/os-release");
    let uname = Cmd::new("uname").arg("-m");
    let nproc = Cmd::new("nproc");
    let meminfo = Cmd::new("cat").arg("/proc/meminfo");
    let ip = Cmd::new("ip").args(["-j", "addr"]);
    let smi = Cmd::new("nvidia-smi").args([
        "--query-gpu=name,memory.total",
        "--format=csv,noheader,nounits",
    ]);
    let (os, arch, cpus, mem, ip, smi, docker) = tokio::join!(
        host.exec(&os_release),
        host.exec(&uname),
        host.exec(&nproc),
        host.exec(&meminfo),
        host.exec(&ip),
        host.exec(&smi),
        docker_version(host),
    );
    let os = os?;
    let os = os
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    let arch = arch?.stdout.trim().to_string();
    let cpus = cpus?.stdout.trim().parse().unwrap_or(0);
    let mem = mem?;
    let memory_kib: f64 = mem
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let ip = ip?;
    if !ip.success() {
        return Err(other(
            &node,
            format!("`ip -j addr` failed: {}", ip.stderr.trim()),
        ));
    }
    let interfaces = parse_ip_addr(&ip.stdout).map_err(|e| other(&node, e))?;
    let smi = smi?;
    let gpus = if smi.success() {
        parse_nvidia_smi(&smi.stdout)
    } else {
        Vec::new()
    };
    Ok(Facts {
        os,
        arch,
        cpus,
        memory_gib: memory_kib / 1024.0 / 1024.0,
        gpus,
        docker,
        interfaces,
    })
}

async fn docker_version(host: &dyn Host) -> Result<String, String> {
    let docker = host.docker().await.map_err(|e| e.to_string())?;
    let v = docker.version().await.map_err(|e| e.to_string())?;
    Ok(format!(
        "{} (API {})",
        v.version.unwrap_or_default(),
        v.api_version.unwrap_or_default()
    ))
}

/// `ip -j addr` output.
pub fn parse_ip_addr(json: &str) -> Result<Vec<Interface>, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("cannot read `ip -j addr`: {e}"))?;
    let list = v.as_array().ok_or("`ip -j addr` did not print a list")?;
    Ok(list
        .iter()
        .filter_map(|i| {
            Some(Interface {
                name: i.get("ifname")?.as_str()?.to_string(),
                mtu: i.get("mtu").and_then(|m| m.as_u64()).unwrap_or(0) as u32,
                state: i
                    .get("operstate")
                    .and_then(|s| s.as_str())
                    .unwrap_or("UNKNOWN")
                    .to_string(),
                addresses: i
                    .get("addr_info")
                    .and_then(|a| a.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| {
                                Some(format!(
                                    "{}/{}",
                                    x.get("local")?.as_str()?,
                                    x.get("prefixlen")?.as_u64()?
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect())
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
    if let Some(g) = node.gpus {
        let found = facts.gpus.len() as u32;
        if g != found {
            out.push(format!(
                "declares {g} GPU{}, the machine shows {found}",
                if g == 1 { "" } else { "s" }
            ));
        }
    }
    if let Some(m) = node.memory_gib {
        // Firmware and the kernel keep some memory: allow 10% below the declared size.
        if facts.memory_gib < m * 0.9 {
            out.push(format!(
                "declares {m} GiB of memory, the machine has {:.1} GiB",
                facts.memory_gib
            ));
        }
    }
    // The node's attachments: their interfaces must exist; a different MTU is what apply fixes.
    let attachments = config
        .resources
        .iter()
        .filter(|r| r.kind == KindId::Attachment && r.node.as_deref() == Some(&node.address))
        .filter_map(|r| Some((r, attachment::Desired::from_json(&r.config)?)));
    for (r, d) in attachments {
        let iface = d.interface.as_str();
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
    fn reads_ip_json() {
        let j = r#"[{"ifindex":1,"ifname":"lo","mtu":65536,"operstate":"UNKNOWN","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
                  {"ifindex":5,"ifname":"enp1s0f0np0","mtu":9000,"operstate":"UP","addr_info":[]}]"#;
        let i = parse_ip_addr(j).unwrap();
        assert_eq!(i[0].addresses, vec!["127.0.0.1/8"]);
        assert_eq!((i[1].name.as_str(), i[1].mtu), ("enp1s0f0np0", 9000));
        assert!(parse_ip_addr("not json").is_err());
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

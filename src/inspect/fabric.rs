//! The RDMA fabric as a node's sysfs shows it, read in one command over the node's session (no
//! tool beyond `sh`, `ls` and `grep`): each RDMA device's ports (state, link layer, rate), its
//! GID table with each entry's type and network device, the PCIe link it sits on (width and
//! speed against their maximum), the network devices it drives; and systemd-logind's
//! `RemoveIPC` with the users that linger. What real two-node clusters lose days to (a port
//! down, a GID index that moved, a x4 card in a x1 slot, semaphores deleted at logout) is read
//! here and judged where the fabric is declared (the attachment kind).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::Serialize;

use crate::hosts::{Host, HostError};

/// An entry of a port's GID table that is set.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Gid {
    pub index: u32,
    /// As sysfs writes it: eight groups of four hex digits.
    pub gid: String,
    /// `RoCE v2`, `IB/RoCE v1`.
    pub kind: Option<String>,
    /// The network device the entry belongs to.
    pub netdev: Option<String>,
}

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let groups: Vec<u16> = self
            .gid
            .split(':')
            .map(|g| u16::from_str_radix(g, 16).ok())
            .collect::<Option<_>>()?;
        match groups.as_slice() {
            [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(Ipv4Addr::new(
                (hi >> 8) as u8,
                (hi & 0xff) as u8,
                (lo >> 8) as u8,
                (lo & 0xff) as u8,
            )),
            _ => None,
        }
    }

    pub fn is_roce_v2(&self) -> bool {
        self.kind.as_deref() == Some("RoCE v2")
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Port {
    pub device: String,
    pub port: u32,
    /// `4: ACTIVE` as sysfs writes it.
    pub state: Option<String>,
    pub phys_state: Option<String>,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: Option<String>,
    /// `200 Gb/sec (4X HDR)`.
    pub rate: Option<String>,
    pub gids: Vec<Gid>,
}

impl Port {
    /// Whether the port is up: `4: ACTIVE`.
    pub fn is_active(&self) -> bool {
        self.state.as_deref().is_some_and(|s| s.ends_with("ACTIVE"))
    }
}

/// The PCIe link of an RDMA device: what it runs at and what it could.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct PcieLink {
    pub width: Option<String>,
    pub max_width: Option<String>,
    pub speed: Option<String>,
    pub max_speed: Option<String>,
}

impl PcieLink {
    /// `x1 of x4`: a link narrower than its device can run (the card in the wrong slot, or a
    /// riser); `None` when it runs at its maximum or either is unknown.
    pub fn below_max(&self) -> Option<String> {
        let w = |s: &Option<String>| s.as_deref()?.trim().parse::<u32>().ok();
        let (now, max) = (w(&self.width)?, w(&self.max_width)?);
        (now < max).then(|| format!("x{now} of x{max}"))
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct RdmaFabric {
    /// By device, the network devices it drives.
    pub netdevs: BTreeMap<String, Vec<String>>,
    pub ports: Vec<Port>,
    pub pcie: BTreeMap<String, PcieLink>,
    /// logind's `RemoveIPC` as the last file that sets it says (`None`: unset, which is
    /// systemd's default, yes).
    pub remove_ipc: Option<bool>,
    pub lingering: Vec<String>,
    /// Every network interface's MTU, by name.
    pub mtu: BTreeMap<String, u32>,
}

impl RdmaFabric {
    /// The ports of the devices that drive `netdev`.
    pub fn ports_on(&self, netdev: &str) -> Vec<&Port> {
        self.ports
            .iter()
            .filter(|p| {
                self.netdevs
                    .get(&p.device)
                    .is_some_and(|n| n.iter().any(|d| d == netdev))
            })
            .collect()
    }

    /// Which device, port and GID index carry `address` as RoCE v2: what `NCCL_IB_GID_INDEX`
    /// must be on this node.
    pub fn roce_v2_gid(&self, address: Ipv4Addr) -> Option<(&Port, &Gid)> {
        self.ports.iter().find_map(|p| {
            p.gids
                .iter()
                .find(|g| g.is_roce_v2() && g.ipv4() == Some(address))
                .map(|g| (p, g))
        })
    }

    /// The active ports that carry a fabric: those of the devices that drive `netdev`, and
    /// those with a RoCE v2 GID inside `subnet` (a twin device that drives another interface
    /// on the same cable). In device and port order, each once.
    pub fn fabric_ports(&self, netdev: &str, subnet: &ipnet::IpNet) -> Vec<&Port> {
        let driving = self.ports_on(netdev);
        self.ports
            .iter()
            .filter(|p| p.is_active())
            .filter(|p| {
                driving.iter().any(|d| std::ptr::eq(*d, *p))
                    || p.gids.iter().any(|g| {
                        g.is_roce_v2()
                            && g.ipv4()
                                .is_some_and(|a| subnet.contains(&std::net::IpAddr::V4(a)))
                    })
            })
            .collect()
    }

    /// Whether logind removes a user's IPC objects at logout: `RemoveIPC` is yes (or unset)
    /// and `user` (not root, whose objects logind never removes) does not linger.
    pub fn removes_ipc_of(&self, user: &str) -> bool {
        user != "root"
            && self.remove_ipc != Some(false)
            && !self.lingering.iter().any(|u| u == user)
    }
}

/// Read the fabric of `host`: its part of the node's glance (one command, shared with the
/// other readers of a plan).
pub async fn read(host: &dyn Host) -> Result<RdmaFabric, HostError> {
    Ok(parse(
        &crate::inspect::glance::glance(host).await?.fabric.stdout,
    ))
}

/// Read the fabric of each of `nodes` on `pool`, at once: by node address. A node that cannot
/// be connected or read is left out (the refresh reports it).
pub async fn read_each(
    pool: &crate::hosts::HostPool,
    nodes: &[String],
) -> BTreeMap<String, RdmaFabric> {
    of_each(&crate::inspect::glance::read_each(pool, nodes).await)
}

/// The fabric in each node's glance.
pub fn of_each(
    glances: &BTreeMap<String, std::sync::Arc<crate::inspect::glance::Glance>>,
) -> BTreeMap<String, RdmaFabric> {
    glances
        .iter()
        .map(|(node, g)| (node.clone(), parse(&g.fabric.stdout)))
        .collect()
}

/// The script's output as facts. Pure; lines it does not know are skipped.
pub fn parse(out: &str) -> RdmaFabric {
    let mut f = RdmaFabric::default();
    let mut ports: BTreeMap<(String, u32), Port> = BTreeMap::new();
    // GID entries by (device, port, index): value, type, netdev.
    type Entry = (Option<String>, Option<String>, Option<String>);
    let mut gids: BTreeMap<(String, u32, u32), Entry> = BTreeMap::new();
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("net:") {
            if let Some((dev, net)) = rest.split_once(':') {
                f.netdevs
                    .entry(dev.to_string())
                    .or_default()
                    .push(net.to_string());
            }
            continue;
        }
        if let Some(user) = line.strip_prefix("linger:") {
            f.lingering.push(user.to_string());
            continue;
        }
        let Some((path, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        if path.starts_with("/etc/systemd/") {
            if let Some((_, v)) = value.split_once('=') {
                match v.trim().to_ascii_lowercase().as_str() {
                    "yes" | "true" | "1" | "on" => f.remove_ipc = Some(true),
                    "no" | "false" | "0" | "off" => f.remove_ipc = Some(false),
                    _ => {}
                }
            }
            continue;
        }
        if let Some(netdev) = path
            .strip_prefix("/sys/class/net/")
            .and_then(|p| p.strip_suffix("/mtu"))
        {
            if let Ok(mtu) = value.parse() {
                f.mtu.insert(netdev.to_string(), mtu);
            }
            continue;
        }
        let Some(rel) = path.strip_prefix("/sys/class/infiniband/") else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        match parts.as_slice() {
            [dev, "device", file] => {
                let link = f.pcie.entry(dev.to_string()).or_default();
                let slot = match *file {
                    "current_link_width" => &mut link.width,
                    "max_link_width" => &mut link.max_width,
                    "current_link_speed" => &mut link.speed,
                    "max_link_speed" => &mut link.max_speed,
                    _ => continue,
                };
                *slot = Some(value);
            }
            [dev, "ports", port, rest @ ..] => {
                let Ok(port) = port.parse::<u32>() else {
                    continue;
                };
                let p = ports
                    .entry((dev.to_string(), port))
                    .or_insert_with(|| Port {
                        device: dev.to_string(),
                        port,
                        ..Port::default()
                    });
                let gid = |i: &str| i.parse::<u32>().ok().map(|i| (dev.to_string(), port, i));
                match rest {
                    ["state"] => p.state = Some(value),
                    ["phys_state"] => p.phys_state = Some(value),
                    ["link_layer"] => p.link_layer = Some(value),
                    ["rate"] => p.rate = Some(value),
                    ["gids", i] => {
                        if let Some(k) = gid(i) {
                            gids.entry(k).or_default().0 = Some(value);
                        }
                    }
                    ["gid_attrs", "types", i] => {
                        if let Some(k) = gid(i) {
                            gids.entry(k).or_default().1 = Some(value);
                        }
                    }
                    ["gid_attrs", "ndevs", i] => {
                        if let Some(k) = gid(i) {
                            gids.entry(k).or_default().2 = Some(value);
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    for ((dev, port, index), (gid, kind, netdev)) in gids {
        let Some(gid) = gid.filter(|g| g.chars().any(|c| c != '0' && c != ':')) else {
            continue;
        };
        if let Some(p) = ports.get_mut(&(dev, port)) {
            p.gids.push(Gid {
                index,
                gid,
                kind,
                netdev,
            });
        }
    }
    f.ports = ports.into_values().collect();
    for n in f.netdevs.values_mut() {
        n.sort();
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of a DGX Spark's sysfs (ConnectX-7, two twin devices per port, one cable on
    /// port 1; GID 3 is the fabric address as RoCE v2), as the script prints it.
    pub const SPARK: &str = "\
/sys/class/net/enp1s0f1np1/mtu:9000
/sys/class/net/lo/mtu:65536
net:rocep1s0f1:enp1s0f1np1
net:roceP2p1s0f1:enP2p1s0f1np1
/sys/class/infiniband/rocep1s0f1/ports/1/state:4: ACTIVE
/sys/class/infiniband/rocep1s0f1/ports/1/phys_state:5: LinkUp
/sys/class/infiniband/rocep1s0f1/ports/1/link_layer:Ethernet
/sys/class/infiniband/rocep1s0f1/ports/1/rate:200 Gb/sec (4X HDR)
/sys/class/infiniband/rocep1s0f1/ports/1/gids/0:fe80:0000:0000:0000:0e42:a1ff:fe2b:3c01
/sys/class/infiniband/rocep1s0f1/ports/1/gids/1:fe80:0000:0000:0000:0e42:a1ff:fe2b:3c01
/sys/class/infiniband/rocep1s0f1/ports/1/gids/2:0000:0000:0000:0000:0000:ffff:c0a8:c801
/sys/class/infiniband/rocep1s0f1/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:c0a8:c801
/sys/class/infiniband/rocep1s0f1/ports/1/gids/4:0000:0000:0000:0000:0000:0000:0000:0000
/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/0:IB/RoCE v1
/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/1:RoCE v2
/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/2:IB/RoCE v1
/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3:RoCE v2
/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/ndevs/3:enp1s0f1np1
/sys/class/infiniband/roceP2p1s0f1/ports/1/state:1: DOWN
/sys/class/infiniband/roceP2p1s0f1/ports/1/link_layer:Ethernet
/sys/class/infiniband/rocep1s0f1/device/current_link_width:4
/sys/class/infiniband/rocep1s0f1/device/max_link_width:4
/sys/class/infiniband/rocep1s0f1/device/current_link_speed:32.0 GT/s PCIe
/sys/class/infiniband/rocep1s0f1/device/max_link_speed:32.0 GT/s PCIe
/sys/class/infiniband/roceP2p1s0f1/device/current_link_width:1
/sys/class/infiniband/roceP2p1s0f1/device/max_link_width:4
/etc/systemd/logind.conf:#RemoveIPC=yes
/etc/systemd/logind.conf.d/50-sparkform.conf:RemoveIPC=no
linger:nvidia
";

    #[test]
    fn reads_ports_gids_pcie_and_logind() {
        let f = parse(SPARK);
        assert_eq!(f.ports.len(), 2);
        let up = &f.ports_on("enp1s0f1np1");
        assert_eq!(up.len(), 1);
        assert!(up[0].is_active());
        assert_eq!(up[0].rate.as_deref(), Some("200 Gb/sec (4X HDR)"));
        // The empty entry is left out.
        assert_eq!(up[0].gids.len(), 4);
        let (port, gid) = f
            .roce_v2_gid("192.168.200.1".parse().unwrap())
            .expect("the address's RoCE v2 GID");
        assert_eq!((port.device.as_str(), gid.index), ("rocep1s0f1", 3));
        assert!(f.roce_v2_gid("192.168.200.2".parse().unwrap()).is_none());
        // The twin device is down: the fabric is the one port.
        let subnet: ipnet::IpNet = "192.168.200.0/24".parse().unwrap();
        let on: Vec<(&str, u32)> = f
            .fabric_ports("enp1s0f1np1", &subnet)
            .iter()
            .map(|p| (p.device.as_str(), p.port))
            .collect();
        assert_eq!(on, [("rocep1s0f1", 1)]);
        assert!(f
            .fabric_ports("eth9", &"10.0.0.0/8".parse().unwrap())
            .is_empty());
        let down = &f.ports_on("enP2p1s0f1np1");
        assert!(!down[0].is_active());
        assert_eq!(f.pcie["rocep1s0f1"].below_max(), None);
        assert_eq!(
            f.pcie["roceP2p1s0f1"].below_max().as_deref(),
            Some("x1 of x4")
        );
        // The commented line does not count; the drop-in says no.
        assert_eq!(f.remove_ipc, Some(false));
        assert_eq!(f.lingering, ["nvidia"]);
        assert!(!f.removes_ipc_of("nvidia"));
        assert_eq!(f.mtu["enp1s0f1np1"], 9000);
        assert_eq!(f.mtu.len(), 2);
    }

    #[test]
    fn logind_removes_the_ipc_of_a_user_who_does_not_linger_unless_told_not_to() {
        let unset = parse("");
        assert!(unset.removes_ipc_of("nvidia"), "systemd's default is yes");
        assert!(!unset.removes_ipc_of("root"));
        let yes = parse("/etc/systemd/logind.conf:RemoveIPC=yes\nlinger:other\n");
        assert!(yes.removes_ipc_of("nvidia"));
        assert!(!yes.removes_ipc_of("other"));
        assert!(unset.ports.is_empty() && unset.netdevs.is_empty());
    }
}

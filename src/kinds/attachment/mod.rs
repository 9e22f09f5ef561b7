//! A fabric attachment: an address and MTU on one interface of one node.

pub(crate) mod lower;
pub mod machine;

use serde::{Deserialize, Serialize};

use crate::kind::Kind;
use crate::schema::{self, opt, req, spec, BlockSpec, Child};
use crate::vocabulary::OnDrift;

/// The block that declares it.
pub static ATTACH: BlockSpec = spec(
    "attach",
    &["name"],
    &[
        req("node", schema::ValueType::Node),
        req("interface", schema::ValueType::Str),
        req("address", schema::ValueType::Str),
    ],
    &[],
);

/// The top-level block: a network's attachments are its `attach` blocks.
pub static NETWORK: BlockSpec = spec(
    "network",
    &["name"],
    &[
        req("subnet", schema::ValueType::Str),
        opt("mtu", schema::ValueType::Num),
        opt("on_mtu_mismatch", schema::ValueType::Str),
    ],
    &[Child {
        name: "attach",
        spec: &ATTACH,
        multiple: true,
    }],
);

pub static TOP_BLOCK: &BlockSpec = &NETWORK;

pub struct Attachment;
pub static KIND: Attachment = Attachment;
super::register!(Attachment, KIND, TOP_BLOCK, lower::lower);

impl Kind for Attachment {
    type Desired = Desired;
    type Recorded = Recorded;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &ATTACH,
        in_place: IN_PLACE,
        whole_attributes: &[],
        lifecycle: crate::vocabulary::Lifecycle::Converges,
        on_drift: OnDrift::Update,
        service: false,
        disruption: Some(crate::kind::Disruption {
            replaced: "is replaced: its fabric address is removed and added again",
            removed: "is removed: its fabric address goes away",
        }),
        found_untracked: false,
        dot_shape: "cds",
    };
    fn placement(&self, desired: &Desired) -> crate::kind::Placement {
        crate::kind::Placement {
            node_address: Some(desired.address.clone()),
            interface: Some(crate::kind::ConfiguredInterface {
                name: desired.interface.clone(),
                mtu: desired.mtu,
            }),
            ..Default::default()
        }
    }
}

/// What the state keeps of an attachment: the interface, and its MTU and addresses before
/// the apply first changed them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_addresses: Option<Vec<String>>,
}

impl crate::kind::RecordedFacts for Recorded {}

/// An attachment's desired configuration, as lowered from its `attach` block and as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    /// The network block's address (`network.roce`).
    pub network: String,
    pub node: String,
    pub interface: String,
    pub address: String,
    pub prefix_len: u8,
    pub mtu: u32,
    /// The RDMA ports that carry this fabric on the node, as the plan-time read found them
    /// (`None`: no RDMA device on the fabric, or not read): what the modules hand NCCL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce: Option<Roce>,
}

impl crate::kind::DesiredConfig for Desired {}

/// What NCCL must be told to use RoCE on one node's side of a fabric, read from its sysfs at
/// plan time and recorded, so that `-refresh=false` plans with what the last apply used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roce {
    /// The index of the attachment address's RoCE v2 GID (`NCCL_IB_GID_INDEX`); `None` while
    /// the address is not on the node (the attachment adds it: NCCL then picks the GID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u32>,
    /// Every active RDMA port on the fabric, `DEVICE:PORT` (`NCCL_IB_HCA`): the ports of the
    /// devices that drive the interface and those with a RoCE v2 GID in the subnet (the twin
    /// device of a ConnectX-7 port on a DGX Spark).
    pub ports: Vec<String>,
}

impl Desired {
    /// `192.168.200.1/24`.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.prefix_len)
    }
}

/// Changing the address or MTU is done on the live interface, and what the fabric's RDMA ports
/// are is only recorded; another node or interface is a new attachment.
pub const IN_PLACE: &[&str] = &["address", "prefix_len", "mtu", "roce"];

/// Interface names reach `ip` commands on the node: allow only what the kernel accepts and no
/// shell metacharacters.
pub fn check_interface(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("{name:?} is not 1 to 15 characters long"));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is not an interface name"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "{name:?} contains {c:?}, which an interface name cannot"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names() {
        assert!(check_interface("enp1s0f0np0").is_ok());
        assert!(check_interface("eth0.100").is_ok());
        assert!(check_interface("").is_err());
        assert!(check_interface("a_very_long_interface").is_err());
        assert!(check_interface("eth0;reboot").is_err());
        assert!(check_interface("eth 0").is_err());
        assert!(check_interface("..").is_err());
    }
}

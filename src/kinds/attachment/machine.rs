//! An attachment on the machine: `ip addr` and `ip link` on the node, observed with
//! `ip -j addr`, and the fabric check after a network's attachments change.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Desired, Recorded};
use crate::config::{Config, Resource};
use crate::hosts::{tools, Cmd, Host, HostError, HostPool};
use crate::inspect::glance::Glance;
use crate::inspect::ip_addr::{parse_ip_addr, Interface};
use crate::kinds::machine::{
    Changed, Check, CheckRun, Done, Machine, NodeObservations, ReadCx, ReadError, ReadMode, Record,
    Step, StepError,
};
use crate::plan::{Action, Drift};

pub struct AttachmentMachine;
pub static MACHINE: AttachmentMachine = AttachmentMachine;

/// The attachment's settings, from a desired or recorded configuration.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    interface: String,
    cidr: String,
    mtu: u32,
}

fn settings(d: &Desired) -> Settings {
    Settings {
        cidr: d.cidr(),
        interface: d.interface.clone(),
        mtu: d.mtu,
    }
}

/// What an attachment's step undoes.
#[derive(Debug, Clone, Default)]
pub enum Undo {
    /// Nothing was changed.
    #[default]
    Nothing,
    /// A delete took `cidr` off `interface`: it goes back.
    PutBack { interface: String, cidr: String },
    /// A create or update added `added` (and took `removed`, the old address, off): the
    /// interface goes back to its MTU and addresses before.
    Restore {
        interface: String,
        added: String,
        removed: Option<String>,
        previous_mtu: u32,
        previous_addresses: Vec<String>,
    },
}

async fn run(host: &dyn Host, args: &[&str]) -> Result<String, StepError> {
    let cmd = Cmd::new("ip")
        .args(args.iter().copied())
        .timeout(Duration::from_secs(30));
    let out = host.exec(&cmd).await?;
    if tools::is_missing(tools::IP.command, out.code, &out.stderr) {
        return Err(StepError::new(format!(
            "{}: {}",
            host.node(),
            tools::missing(tools::IP.command)
        ))
        .help(IP_HELP));
    }
    if !out.success() {
        return Err(StepError::new(format!(
            "{}: `{}` failed: {}",
            host.node(),
            cmd.display(),
            out.stderr.trim()
        ))
        .help(
            "sparkform changes interfaces with `ip`: the node's user needs root (or CAP_NET_ADMIN)",
        ));
    }
    Ok(out.stdout)
}

/// What an attachment needs `ip` for, and how to get it.
const IP_HELP: &str = "an attachment reads and sets its interface's address and MTU with `ip` (iproute2): install it on the node (`apt-get install iproute2`), then plan again";

async fn interfaces(host: &dyn Host) -> Result<Vec<Interface>, StepError> {
    let text = run(host, &["-j", "addr"]).await?;
    parse_ip_addr(&text).map_err(StepError::new)
}

async fn find(host: &dyn Host, name: &str) -> Result<Interface, StepError> {
    let all = interfaces(host).await?;
    let names: Vec<String> = all.iter().map(|i| i.name.clone()).collect();
    all.into_iter().find(|i| i.name == name).ok_or_else(|| {
        StepError::new(format!("{}: interface {name} does not exist", host.node())).help(format!(
            "the node has: {}. Set `interface` in the attach block to one of them",
            names.join(", ")
        ))
    })
}

/// Remove one address and nothing else. Deleting the primary address of a subnet makes the
/// kernel delete that subnet's secondary addresses too unless `promote_secondaries` is on (it is
/// off without systemd), and those may belong to someone else. When others share the subnet it
/// is turned on for the interface first, and the kernel keeps them. Where it cannot be, any
/// that went with the deletion are put back; then a concurrent removal by another sparkform on
/// the node could be undone, which the sysctl rules out.
async fn remove_address(host: &dyn Host, iface: &str, cidr: &str) -> Result<(), StepError> {
    let before = find(host, iface).await?;
    if !before.addresses.iter().any(|a| a == cidr) {
        return Ok(());
    }
    let shared = shares_its_subnet(cidr, &before.addresses);
    let kept_by_the_kernel = shared && promote_secondaries(host, iface).await;
    run(host, &["addr", "del", cidr, "dev", iface]).await?;
    if !shared || kept_by_the_kernel {
        return Ok(());
    }
    let after = find(host, iface).await?;
    for lost in before
        .addresses
        .iter()
        .filter(|a| *a != cidr && !after.addresses.contains(a))
    {
        run(host, &["addr", "replace", lost, "dev", iface]).await?;
    }
    Ok(())
}

/// Whether another of `addresses` is in `cidr`'s subnet (its deletion could take them along).
fn shares_its_subnet(cidr: &str, addresses: &[String]) -> bool {
    let Ok(net) = cidr.parse::<ipnet::IpNet>() else {
        return false;
    };
    addresses.iter().any(|a| {
        a != cidr
            && a.parse::<ipnet::IpNet>()
                .is_ok_and(|o| o.prefix_len() == net.prefix_len() && o.trunc() == net.trunc())
    })
}

/// `promote_secondaries` on for `iface`: deleting a primary address then promotes a secondary
/// instead of deleting them all. Whether it is on; where /proc/sys cannot be written, the
/// removal puts back what the kernel dropped. The interface name reaches the shell as an
/// argument, never as code; a name holds no `/`.
async fn promote_secondaries(host: &dyn Host, iface: &str) -> bool {
    let cmd = Cmd::new("sh")
        .args([
            "-c",
            "printf 1 > \"/proc/sys/net/ipv4/conf/$1/promote_secondaries\"",
            "sh",
            iface,
        ])
        .timeout(Duration::from_secs(10));
    host.exec(&cmd).await.is_ok_and(|out| out.success())
}

/// Set the address and MTU; returns the interface as it was and the old address this took off,
/// for undo.
async fn configure(
    host: &dyn Host,
    s: &Settings,
    old_cidr: Option<&str>,
) -> Result<(Interface, Option<String>), StepError> {
    let before = find(host, &s.interface).await?;
    let mut removed = None;
    if let Some(old) = old_cidr.filter(|o| *o != s.cidr) {
        if before.addresses.iter().any(|a| a == old) {
            remove_address(host, &s.interface, old).await?;
            removed = Some(old.to_string());
        }
    }
    run(host, &["addr", "replace", &s.cidr, "dev", &s.interface]).await?;
    run(
        host,
        &[
            "link",
            "set",
            "dev",
            &s.interface,
            "mtu",
            &s.mtu.to_string(),
            "up",
        ],
    )
    .await?;
    Ok((before, removed))
}

/// One address change at a time on a node: a change reads the interface's addresses, changes
/// one and puts back any other the kernel dropped with it (deleting a primary address drops its
/// secondaries); two at once on one interface would each see the other's deletion as such a
/// loss and put it back.
async fn node_lock(node: &str) -> tokio::sync::OwnedMutexGuard<()> {
    crate::kinds::machine::one_at_a_time(&format!("address changes on {node}")).await
}

#[async_trait]
impl Machine for AttachmentMachine {
    type Kind = super::Attachment;
    type Undo = Undo;

    async fn apply(
        &self,
        cx: &Step<'_, super::Attachment>,
        action: Action,
    ) -> Result<Done<Self>, StepError> {
        let host = cx.host()?;
        let _one_at_a_time = node_lock(host.node()).await;
        let recorded = cx.recorded_config().map(settings);
        if action == Action::Delete {
            let Some(old) = recorded else {
                return Ok(Done::summary(""));
            };
            if find(host.as_ref(), &old.interface).await.is_ok() {
                remove_address(host.as_ref(), &old.interface, &old.cidr).await?;
            }
            return Ok(Done {
                recorded: Recorded::default(),
                summary: format!("removed {} from {}", old.cidr, old.interface),
                undo: Undo::PutBack {
                    interface: old.interface,
                    cidr: old.cidr,
                },
            });
        }
        let desired = settings(cx.desired()?);
        let old_cidr = recorded
            .as_ref()
            .filter(|o| o.interface == desired.interface)
            .map(|o| o.cidr.clone());
        cx.progress(
            format!("{} {} mtu {}", desired.interface, desired.cidr, desired.mtu),
            None,
            None,
        );
        let (before, removed) = configure(host.as_ref(), &desired, old_cidr.as_deref()).await?;
        Ok(Done {
            recorded: Recorded {
                interface: Some(desired.interface.clone()),
                previous_mtu: Some(before.mtu),
                previous_addresses: Some(before.addresses.clone()),
            },
            summary: format!("{} {} mtu {}", desired.interface, desired.cidr, desired.mtu),
            undo: Undo::Restore {
                interface: desired.interface,
                added: desired.cidr,
                removed,
                previous_mtu: before.mtu,
                previous_addresses: before.addresses,
            },
        })
    }

    async fn undo(
        &self,
        cx: &Step<'_, super::Attachment>,
        _action: Action,
        done: &Done<Self>,
    ) -> Result<String, StepError> {
        let host = cx.host()?;
        let _one_at_a_time = node_lock(host.node()).await;
        let (iface, added, removed, previous_mtu, previous) = match &done.undo {
            Undo::Nothing => return Ok("nothing to undo".into()),
            Undo::PutBack { interface, cidr } => {
                run(host.as_ref(), &["addr", "replace", cidr, "dev", interface]).await?;
                return Ok(format!("put {cidr} back on {interface}"));
            }
            Undo::Restore {
                interface,
                added,
                removed,
                previous_mtu,
                previous_addresses,
            } => (interface, added, removed, previous_mtu, previous_addresses),
        };
        if !previous.iter().any(|p| p == added) {
            remove_address(host.as_ref(), iface, added).await?;
        }
        // Only what this step took off goes back: an address someone else removed since (another
        // apply on the same interface) stays removed.
        if let Some(removed) = removed {
            run(host.as_ref(), &["addr", "replace", removed, "dev", iface]).await?;
        }
        run(
            host.as_ref(),
            &[
                "link",
                "set",
                "dev",
                iface,
                "mtu",
                &previous_mtu.to_string(),
            ],
        )
        .await?;
        Ok(format!(
            "restored {iface} (mtu {previous_mtu}, {})",
            if previous.is_empty() {
                "no address".into()
            } else {
                previous.join(", ")
            }
        ))
    }

    async fn observe(
        &self,
        host: &dyn Host,
        _lineage: &str,
        recorded: &[(String, Record<'_, super::Attachment>)],
        _mode: ReadMode,
    ) -> Result<NodeObservations, HostError> {
        let mut out = NodeObservations::default();
        if recorded.is_empty() {
            return Ok(out);
        }
        let node = host.node().to_string();
        // A plan's refresh takes the `ip -j addr` of the node's glance (the read phase's).
        let (code, stdout, stderr) = if host.memo().is_some() {
            let g = crate::inspect::glance::glance(host).await?;
            (Some(g.ip.code), g.ip.stdout.clone(), g.ip.stderr.clone())
        } else {
            let cmd = Cmd::new("ip")
                .args(["-j", "addr"])
                .timeout(Duration::from_secs(30));
            let ip = host.exec(&cmd).await?;
            (ip.code, ip.stdout, ip.stderr)
        };
        if tools::is_missing(tools::IP.command, code, &stderr) {
            return Err(HostError::ProgramMissing {
                node,
                command: tools::IP.command.into(),
                help: Some(IP_HELP.into()),
            });
        }
        if code != Some(0) {
            return Err(HostError::Other {
                node,
                message: tools::why(tools::IP.command, "ip -j addr", code, &stdout, &stderr),
            });
        }
        let interfaces =
            parse_ip_addr(&stdout).map_err(|message| HostError::Other { node, message })?;
        for (address, r) in recorded {
            out.0.insert(
                address.clone(),
                observe_attachment(r.config.as_ref(), &interfaces),
            );
        }
        Ok(out)
    }

    async fn import(
        &self,
        host: &dyn Host,
        address: &str,
        object: &str,
        desired: Option<&Desired>,
    ) -> Result<crate::kinds::machine::Imported, StepError> {
        import_attachment(host, address, object, desired).await
    }

    fn read_nodes(&self, config: &Config) -> Vec<String> {
        let mut nodes: Vec<String> = attachments(config).map(|(n, _, _)| n.to_string()).collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// The fabric as each node's sysfs shows it, judged against the attachments
    /// ([`judge_fabric`]): a port down refuses the plan, a narrow PCIe link is a warning.
    async fn read(&self, cx: &ReadCx<'_>) -> Result<crate::config::Readings, ReadError> {
        let mut out = crate::config::Readings::default();
        if !cx.mode.looks() {
            return Ok(not_looking(cx));
        }
        let nodes = self.read_nodes(cx.config);
        let glances = crate::inspect::glance::read_each(cx.pool, &nodes).await;
        let fabrics = crate::inspect::fabric::of_each(&glances);
        let (mut errors, warnings) = judge_fabric(cx.config, &fabrics);
        errors.extend(judge_ip(cx.config, &glances));
        if !errors.is_empty() {
            return Err(ReadError::Config(crate::diag::Diagnostics(errors)));
        }
        let (refused, mtu_warnings) = judge_mtu(cx.config, &fabrics);
        if !refused.is_empty() {
            return Err(ReadError::Config(crate::diag::Diagnostics(refused)));
        }
        out.warnings = warnings;
        out.warnings.extend(mtu_warnings);
        for (node, r, d) in attachments(cx.config) {
            let Some(roce) = fabrics.get(node).and_then(|f| roce_of(&d, f)) else {
                continue;
            };
            if roce.gid_index.is_none() {
                out.warnings.push(gid_unknown(node, &d, &roce));
            }
            out.kinds.insert(r.address.clone(), serde_json::json!(roce));
        }
        Ok(out)
    }

    fn checks(&self, config: &Config, changed: &Changed<'_>) -> Vec<Check> {
        let changed = |a: &str| changed.is(a);
        let changed: &dyn Fn(&str) -> bool = &changed;
        let by_address: std::collections::HashMap<&str, &Resource> = config
            .resources
            .iter()
            .map(|r| (r.address.as_str(), r))
            .collect();
        let mut out = Vec::new();
        for net in config.networks.values() {
            let after: Vec<String> = net
                .attachments
                .iter()
                .filter(|a| changed(a))
                .cloned()
                .collect();
            // The fabric may have changed under unchanged attachments (a switch port's MTU, a
            // cable): whatever starts on it in this apply is checked first.
            if net.attachments.len() < 2
                || (after.is_empty() && !dependent_changed(config, &net.attachments, changed))
            {
                continue;
            }
            let members: Vec<Member> = net
                .attachments
                .iter()
                .filter_map(|a| by_address.get(a.as_str()).copied())
                .filter_map(member)
                .collect();
            out.push(Check {
                address: format!("{} (fabric check)", net.address),
                after,
                covers: net.attachments.clone(),
                before: Vec::new(),
                nodes: members.iter().map(|m| m.node.clone()).collect(),
                keeps: Vec::new(),
                run: Arc::new(Mesh {
                    members,
                    mtu: net.mtu,
                }),
            });
        }
        out
    }
}

/// What stands in for the fabric when the machines are not looked at: what the state
/// recorded of each attachment (`-refresh=false`, said in a warning so the plan shows it), or
/// what a saved plan was made with.
fn not_looking(cx: &ReadCx<'_>) -> crate::config::Readings {
    let mut out = crate::config::Readings::default();
    let recorded = |address: &str| -> Option<super::Roce> {
        let config = match cx.mode {
            ReadMode::Recorded => &cx.state?.resources.get(address)?.config,
            ReadMode::Planned => cx
                .plan?
                .changes
                .iter()
                .find(|c| c.address == address)?
                .after
                .as_ref()?,
            _ => return None,
        };
        config.typed::<Desired>().ok()?.roce
    };
    let mut used = Vec::new();
    for (node, r, _) in attachments(cx.config) {
        let Some(roce) = recorded(&r.address) else {
            continue;
        };
        used.push(format!("{node} {}", describe(&roce)));
        out.kinds.insert(r.address.clone(), serde_json::json!(roce));
    }
    if cx.mode == ReadMode::Recorded && cx.complete && !used.is_empty() {
        out.warnings.push(crate::diag::Diag::warning(
            "fabric::recorded",
            format!(
                "-refresh=false: the fabric is not read; the RDMA ports and GID indexes are those the last apply recorded: {}",
                used.join("; ")
            ),
        )
        .help("a reboot or a firmware update can move a GID index: plan with -refresh=true before an apply that starts NCCL"));
    }
    out
}

/// `GID 3, ports rocep1s0f1:1, roceP2p1s0f1:1`.
fn describe(roce: &super::Roce) -> String {
    let gid = roce
        .gid_index
        .map_or("GID not known".to_string(), |i| format!("GID {i}"));
    format!("{gid}, ports {}", roce.ports.join(", "))
}

/// The RDMA ports that carry the attachment's fabric on a node whose sysfs `fabric` shows, and
/// the index of the RoCE v2 GID of its address: `None` when no active RDMA port is on the
/// fabric (no RDMA hardware, as on the testbed). Pure.
pub fn roce_of(d: &Desired, fabric: &crate::inspect::fabric::RdmaFabric) -> Option<super::Roce> {
    let subnet = d.cidr().parse::<ipnet::IpNet>().ok()?.trunc();
    let ports: Vec<String> = fabric
        .fabric_ports(&d.interface, &subnet)
        .iter()
        .map(|p| format!("{}:{}", p.device, p.port))
        .collect();
    if ports.is_empty() {
        return None;
    }
    let gid_index = match d.address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => fabric.roce_v2_gid(a).map(|(_, g)| g.index),
        _ => None,
    };
    Some(super::Roce { gid_index, ports })
}

/// An attachment whose address is not on its node yet has no GID to read.
fn gid_unknown(node: &str, d: &Desired, roce: &super::Roce) -> crate::diag::Diag {
    crate::diag::Diag::warning(
        "fabric::gid_unknown",
        format!(
            "{node}: no RoCE v2 GID carries {} yet (ports {}), so NCCL_IB_GID_INDEX is left to NCCL",
            d.address,
            roce.ports.join(", ")
        ),
    )
    .help("the attachment adds the address in this apply and the kernel gives it a GID then; the next plan reads its index and replaces what uses it")
}

/// Whether a changed resource depends, directly or through others, on one of `on`.
fn dependent_changed(config: &Config, on: &[String], changed: &dyn Fn(&str) -> bool) -> bool {
    let mut reached: std::collections::BTreeSet<&str> = on.iter().map(String::as_str).collect();
    loop {
        let before = reached.len();
        for r in &config.resources {
            if r.deps.iter().any(|d| reached.contains(d.as_str())) {
                if changed(&r.address) {
                    return true;
                }
                reached.insert(&r.address);
            }
        }
        if reached.len() == before {
            return false;
        }
    }
}

fn member(r: &Resource) -> Option<Member> {
    let d = r.config.typed::<Desired>().ok()?;
    Some(Member {
        address: r.address.clone(),
        node: r.node.clone()?,
        interface: d.interface,
        ip: d.address,
    })
}

/// An attachment as recorded, against the node's interfaces. Pure.
/// Every attachment of the definitions: (node address, its resource, its settings).
fn attachments(config: &Config) -> impl Iterator<Item = (&str, &Resource, Desired)> {
    config.resources.iter().filter_map(|r| {
        if r.kind != crate::vocabulary::KindId::Attachment {
            return None;
        }
        Some((r.node.as_deref()?, r, r.config.typed::<Desired>().ok()?))
    })
}

/// Each attachment's node must answer `ip -j addr` (its part of the node's glance): an apply
/// reads and sets the interface with `ip`, so a node without it (iproute2 not installed) or
/// whose `ip` fails refuses the plan, naming the program and its package. Pure.
pub fn judge_ip(
    config: &Config,
    glances: &std::collections::BTreeMap<String, Arc<Glance>>,
) -> Vec<crate::diag::Diag> {
    use crate::diag::Diag;
    let mut errors = Vec::new();
    for (node, r, _) in attachments(config) {
        let Some(why) = glances.get(node).and_then(|g| g.ip.failure("ip")) else {
            continue;
        };
        let missing = why == tools::missing(tools::IP.command);
        let code = if missing {
            "attachment::ip_missing"
        } else {
            "attachment::ip_failed"
        };
        errors.push(
            Diag::error(code, format!("{node}: cannot read its interfaces: {why}"))
                .label(
                    &r.span,
                    "this attachment sets its address and MTU with `ip`",
                )
                .help(IP_HELP),
        );
    }
    errors
}

/// The RDMA ports behind each attachment's interface, as `fabrics` (by node address) shows
/// them: (errors, warnings). A port that is down refuses the plan (NCCL would fall back to
/// sockets or fail); a PCIe link narrower than its device's maximum is a warning. An interface
/// no RDMA device drives (no RDMA hardware, as on the testbed) is not judged. Pure.
pub fn judge_fabric(
    config: &Config,
    fabrics: &std::collections::BTreeMap<String, crate::inspect::fabric::RdmaFabric>,
) -> (Vec<crate::diag::Diag>, Vec<crate::diag::Diag>) {
    use crate::diag::Diag;
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for (node, r, d) in attachments(config) {
        let Some(f) = fabrics.get(node) else {
            continue;
        };
        for p in f.ports_on(&d.interface) {
            if !p.is_active() {
                errors.push(
                    Diag::error(
                        "fabric::port_down",
                        format!(
                            "{node}: RDMA port {}/{} behind {} is {}",
                            p.device,
                            p.port,
                            d.interface,
                            p.state.as_deref().unwrap_or("in an unknown state")
                        ),
                    )
                    .label(&r.span, "this attachment's fabric")
                    .help(format!(
                        "bring the link up: check the cable and the switch port, `ip link show {}` and `ibdev2netdev` on the node; a port that is down leaves NCCL on TCP sockets or failing",
                        d.interface
                    )),
                );
            }
            if let Some(narrow) = f.pcie.get(&p.device).and_then(|l| l.below_max()) {
                if !warnings
                    .iter()
                    .any(|w: &Diag| w.message.contains(&p.device))
                {
                    warnings.push(
                        Diag::warning(
                            "fabric::pcie_width",
                            format!(
                                "{node}: RDMA device {} runs its PCIe link at {narrow}",
                                p.device
                            ),
                        )
                        .help("the card is in a narrower slot or behind a riser than it can use: the fabric's bandwidth is capped by the link; reseat it or use a full-width slot"),
                    );
                }
            }
        }
    }
    (errors, warnings)
}

/// Each network whose attached interfaces run different MTUs, as `fabrics` shows them, every
/// end named: (errors, warnings). By default a refusal: an end that fell back (a firmware
/// reboot resets a NIC to 1500) is an event on the node someone should see before anything
/// runs over it. With `on_mtu_mismatch = "fix"` a warning: the apply sets the network's MTU on
/// every attached interface (an MTU the state does not record is drift it corrects) and checks
/// a full-size frame between every pair before anything starts on the fabric. Pure.
pub fn judge_mtu(
    config: &Config,
    fabrics: &std::collections::BTreeMap<String, crate::inspect::fabric::RdmaFabric>,
) -> (Vec<crate::diag::Diag>, Vec<crate::diag::Diag>) {
    let (mut errors, mut out) = (Vec::new(), Vec::new());
    for net in config.networks.values() {
        let ends: Vec<(String, u32, &Resource)> = net
            .attachments
            .iter()
            .filter_map(|a| {
                let r = config.resource(a)?;
                let d = r.config.typed::<Desired>().ok()?;
                let mtu = *fabrics.get(r.node.as_deref()?)?.mtu.get(&d.interface)?;
                Some((
                    format!("{} {} {mtu}", r.node.as_deref()?, d.interface),
                    mtu,
                    r,
                ))
            })
            .collect();
        let first = ends.first().map(|e| e.1);
        if ends.len() < 2 || ends.iter().all(|e| Some(e.1) == first) {
            continue;
        }
        let named: Vec<&str> = ends.iter().map(|e| e.0.as_str()).collect();
        let message = format!(
            "{}: the MTU differs between the ends of the fabric: {} (the network sets {})",
            net.address,
            named.join(", "),
            net.mtu
        );
        let mut d = if net.fix_mtu_mismatch {
            crate::diag::Diag::warning("fabric::mtu_differs", message)
        } else {
            crate::diag::Diag::error("fabric::mtu_differs", message)
        };
        for (text, mtu, r) in &ends {
            if *mtu != net.mtu {
                d = d.label(&r.span, text.clone());
            }
        }
        if net.fix_mtu_mismatch {
            out.push(d.help(format!(
                "RoCE between ends of different MTUs fails (IBV_WC_RETRY_EXC_ERR) or falls back: the apply sets {} on every attached interface and checks a full-size frame between every pair before anything starts on the fabric; if an end falls back again (a firmware reboot, a switch port), fix it there",
                net.mtu
            )));
        } else {
            let fix: Vec<String> = ends
                .iter()
                .filter(|e| e.1 != net.mtu)
                .filter_map(|(_, _, r)| {
                    let d = r.config.typed::<Desired>().ok()?;
                    Some(format!(
                        "on {}: ip link set dev {} mtu {}",
                        r.node.as_deref().unwrap_or_default(),
                        d.interface,
                        net.mtu
                    ))
                })
                .collect();
            errors.push(d.help(format!(
                "RoCE between ends of different MTUs fails (IBV_WC_RETRY_EXC_ERR) or falls back to TCP: set it back ({}) and find why it fell back (a firmware reboot resets a NIC to 1500); or let the apply set it on every end with `on_mtu_mismatch = \"fix\"` in the network block",
                fix.join("; ")
            )));
        }
    }
    (errors, out)
}

pub fn observe_attachment(config: Option<&Desired>, interfaces: &[Interface]) -> Drift {
    let Some(d) = config else {
        return Drift::Drifted(vec![
            "the state records an incomplete attachment configuration".into(),
        ]);
    };
    let iface = d.interface.as_str();
    let Some(i) = interfaces.iter().find(|i| i.name == iface) else {
        return Drift::Missing(format!("interface {iface} does not exist any more"));
    };
    let want = d.cidr();
    let mtu = d.mtu;
    let mut notes = Vec::new();
    if !i.addresses.contains(&want) {
        notes.push(format!(
            "{want} is not on {iface} (it has {})",
            if i.addresses.is_empty() {
                "no address".to_string()
            } else {
                i.addresses.join(", ")
            }
        ));
    }
    if i.mtu != mtu {
        notes.push(format!(
            "{iface} has MTU {}, the state records {mtu}",
            i.mtu
        ));
    }
    if i.state == "DOWN" {
        notes.push(format!("{iface} is down"));
    }
    if notes.is_empty() {
        Drift::InSync
    } else {
        Drift::Drifted(notes)
    }
}

/// Every member of a network reaches every other with a full-size frame.
struct Mesh {
    members: Vec<Member>,
    mtu: u32,
}

#[async_trait]
impl CheckRun for Mesh {
    async fn run(&self, pool: &HostPool) -> Result<String, StepError> {
        check_mesh(pool, &self.members, self.mtu).await
    }
}

/// One member of a network for the reachability check.
#[derive(Debug, Clone)]
pub struct Member {
    pub address: String,
    pub node: String,
    pub interface: String,
    pub ip: String,
}

/// Every pair of members reaches each other over the fabric with a full-size frame that may
/// not be fragmented: a wrong MTU anywhere on the path fails here, not in NCCL later.
pub async fn check_mesh(
    pool: &HostPool,
    members: &[Member],
    mtu: u32,
) -> Result<String, StepError> {
    let size = mtu.saturating_sub(28).to_string();
    let mut tasks = crate::tasks::KeyedTasks::new();
    for a in members {
        for b in members {
            if a.address == b.address {
                continue;
            }
            let host = pool.get(&a.node)?;
            let cmd = Cmd::new("ping")
                .args([
                    "-M",
                    "do",
                    "-s",
                    size.as_str(),
                    "-c",
                    "2",
                    "-i",
                    "0.2",
                    "-W",
                    "2",
                    "-I",
                    a.interface.as_str(),
                    b.ip.as_str(),
                ])
                .timeout(Duration::from_secs(20));
            tasks.spawn((a.clone(), b.clone()), async move { host.exec(&cmd).await });
        }
    }
    let mut failures = Vec::new();
    let mut unreachable = Vec::new();
    let mut no_ping = Vec::new();
    let mut pairs = 0;
    while let Some(((from, to), out)) = tasks.next().await {
        pairs += 1;
        match out {
            Ok(Ok(o)) if o.success() => {}
            Ok(Ok(o)) if tools::is_missing(tools::PING.command, o.code, &o.stderr) => {
                no_ping.push(from.node.clone())
            }
            Ok(Ok(o)) => failures.push(format!(
                "{} ({}) → {} ({}): {}",
                from.node,
                from.interface,
                to.node,
                to.ip,
                o.stdout
                    .lines()
                    .chain(o.stderr.lines())
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("no reply")
            )),
            Ok(Err(e)) => unreachable.push(format!("{}: {e}", from.node)),
            Err(e) => unreachable.push(format!("{}: {e}", from.node)),
        }
    }
    if !no_ping.is_empty() {
        no_ping.sort();
        no_ping.dedup();
        return Err(StepError::new(format!(
            "cannot check the fabric: `{}` is missing on {} (install {})",
            tools::PING.command,
            no_ping.join(", "),
            tools::PING.package
        ))
        .help("the fabric check sends full-size frames between the attachments with `ping`: install iputils-ping on the node, then run apply again"));
    }
    if !unreachable.is_empty() {
        unreachable.sort();
        unreachable.dedup();
        return Err(StepError::new(
            "cannot check the fabric: a node stopped answering".to_string(),
        )
        .details(unreachable)
        .help("the node or its management network went down; check it and run apply again"));
    }
    if failures.is_empty() {
        Ok(format!(
            "{pairs} pair{} reach each other with {mtu}-byte frames",
            if pairs == 1 { "" } else { "s" }
        ))
    } else {
        failures.sort();
        Err(StepError::new(format!(
            "the fabric does not carry {mtu}-byte frames between {} pair{}",
            failures.len(),
            if failures.len() == 1 { "" } else { "s" }
        ))
        .details(failures)
        .help(format!("every interface and switch port on the path needs MTU {mtu}; check `ip link` on both nodes and the switch (ping -M do -s {size})")))
    }
}

/// Import the fabric address `object` (`ADDRESS/PREFIX`) on `host`: the interface that holds it
/// and that interface's MTU, changing nothing.
async fn import_attachment(
    host: &dyn Host,
    address: &str,
    object: &str,
    desired: Option<&Desired>,
) -> Result<crate::kinds::machine::Imported, StepError> {
    let node = host.node().to_string();
    let parsed = object
        .split_once('/')
        .and_then(|(ip, p)| {
            Some((
                ip.parse::<std::net::Ipv4Addr>().ok()?,
                p.parse::<u8>().ok()?,
            ))
        })
        .filter(|(_, p)| *p <= 32);
    let Some((ip, prefix_len)) = parsed else {
        return Err(StepError::new(format!(
            "{address}: {object:?} is not an IPv4 ADDRESS/PREFIX"
        ))
        .help("write the id of a fabric address as NODE:ADDRESS/PREFIX, e.g. \"spark1:192.168.200.1/24\""));
    };
    let cidr = format!("{ip}/{prefix_len}");
    let all = interfaces(host).await?;
    let Some(iface) = all.iter().find(|i| i.addresses.contains(&cidr)) else {
        return Err(
            StepError::new(format!("{address}: no interface on {node} holds {cidr}")).help(
                format!(
            "`ip addr` on {node} shows its addresses; import one that is there, or let apply add it"
        ),
            ),
        );
    };
    let config = Desired {
        network: desired.map(|d| d.network.clone()).unwrap_or_default(),
        node: desired.map_or(node, |d| d.node.clone()),
        interface: iface.name.clone(),
        address: ip.to_string(),
        prefix_len,
        mtu: iface.mtu,
        roce: None,
    };
    // Deleting it later takes only its address off; the MTU stays as it was found.
    let recorded = Recorded {
        interface: Some(iface.name.clone()),
        previous_mtu: Some(iface.mtu),
        previous_addresses: Some(iface.addresses.clone()),
    };
    Ok(crate::kinds::machine::Imported {
        config: crate::kind::Configuration::of(config),
        attributes: crate::kind::Attributes::of(&recorded),
        notes: Vec::new(),
        secret_paths: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_shares_its_subnet_only_with_one_of_the_same_network_and_prefix() {
        let on = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let cidr = "192.168.201.47/24";
        assert!(shares_its_subnet(cidr, &on(&[cidr, "192.168.201.44/24"])));
        assert!(!shares_its_subnet(cidr, &on(&[cidr])));
        assert!(!shares_its_subnet(cidr, &on(&[cidr, "192.168.202.44/24"])));
        assert!(!shares_its_subnet(cidr, &on(&[cidr, "192.168.201.44/25"])));
        assert!(!shares_its_subnet("not an address", &on(&[cidr])));
    }

    fn iface(addrs: &[&str], mtu: u32, state: &str) -> Vec<Interface> {
        vec![Interface {
            name: "enp1s0f0np0".into(),
            mtu,
            state: state.into(),
            addresses: addrs.iter().map(|s| s.to_string()).collect(),
        }]
    }

    #[test]
    fn attachment_drift() {
        let cfg = serde_json::json!({"network": "network.roce", "node": "node.spark1", "interface": "enp1s0f0np0", "address": "192.168.200.1", "prefix_len": 24, "mtu": 9000});
        let cfg = <Desired as crate::kind::DesiredConfig>::from_config(&cfg).ok();
        let cfg = cfg.as_ref();
        assert_eq!(
            observe_attachment(cfg, &iface(&["192.168.200.1/24"], 9000, "UP")),
            Drift::InSync
        );
        match observe_attachment(cfg, &iface(&[], 1500, "UP")) {
            Drift::Drifted(n) => {
                assert_eq!(n.len(), 2, "{n:?}");
                assert!(n[0].contains("192.168.200.1/24 is not on enp1s0f0np0"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(observe_attachment(cfg, &[]), Drift::Missing(_)));
    }

    /// On a node without iproute2 the refresh of a recorded attachment and an apply's `ip`
    /// say that `ip` is missing and which package brings it, never that the node is
    /// unreachable nor that its user needs root.
    #[tokio::test]
    async fn a_node_without_ip_is_said_so_with_its_package() {
        use crate::fake::{Answer, FakeHost, FakeWorld};
        let host = FakeHost::new("node.h200", &FakeWorld::new());
        host.on(
            &["ip"],
            Answer::Exit(127, String::new(), "sh: 1: ip: not found".into()),
        );
        let recorded = crate::state::ResourceState {
            kind: crate::vocabulary::KindId::Attachment,
            node: Some("node.h200".into()),
            config_hash: String::new(),
            config: serde_json::json!({"network": "network.fabric", "node": "node.h200", "interface": "eth1", "address": "192.168.10.1", "prefix_len": 24, "mtu": 9000}).into(),
            attributes: Default::default(),
            depends_on: Vec::new(),
            last_apply_secs: None,
            schema_version: 1,
        };
        let seen = crate::kinds::machine::AnyMachine::observe(
            &MACHINE,
            &host,
            "lineage",
            &[("network.fabric.attach.h200".into(), recorded)],
            ReadMode::Normal,
        )
        .await;
        match seen {
            Err(e @ HostError::ProgramMissing { .. }) => {
                assert_eq!(
                    e.to_string(),
                    "node.h200: `ip` is missing on the node (install iproute2)"
                );
            }
            other => panic!("{other:?}"),
        }
        let step = interfaces(&host)
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}"));
        let Err(step) = step else {
            panic!("read interfaces without `ip`")
        };
        assert!(
            step.contains("`ip` is missing on the node (install iproute2)"),
            "{step}"
        );
        assert!(!step.contains("root"), "{step}");
    }

    /// A node without `ping` cannot check the fabric: said so, with iputils-ping, not taken
    /// for a fabric that drops full-size frames.
    #[tokio::test]
    async fn the_fabric_check_names_a_missing_ping() {
        use crate::fake::{Answer, FakeHost, FakeWorld};
        let world = FakeWorld::new();
        let a = FakeHost::new("node.a", &world);
        a.on(
            &["ping"],
            Answer::Exit(127, String::new(), "sh: 1: ping: not found".into()),
        );
        let b = FakeHost::new("node.b", &world);
        let pool = HostPool::from_hosts(
            [
                ("node.a".to_string(), Arc::new(a) as Arc<dyn Host>),
                ("node.b".to_string(), Arc::new(b) as Arc<dyn Host>),
            ]
            .into(),
        );
        let member = |n: &str, ip: &str| Member {
            address: format!("network.f.attach.{n}"),
            node: format!("node.{n}"),
            interface: "eth1".into(),
            ip: ip.into(),
        };
        let members = [member("a", "192.168.10.1"), member("b", "192.168.10.2")];
        let err = check_mesh(&pool, &members, 9000)
            .await
            .map_err(|e| format!("{e:?}"));
        let Err(err) = err else {
            panic!("checked the fabric without `ping` on node.a")
        };
        assert!(
            err.contains(
                "cannot check the fabric: `ping` is missing on node.a (install iputils-ping)"
            ),
            "{err}"
        );
    }
}

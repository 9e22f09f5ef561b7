//! A fabric attachment: an address and MTU on one interface of one node.

/// Changing the address or MTU is done on the live interface; another node or interface is a new
/// attachment.
pub const IN_PLACE: &[&str] = &["address", "prefix_len", "mtu"];

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

// ----- on the machine -----

use std::time::Duration;

use async_trait::async_trait;

use super::{Applied, Handler, StepCx, StepError};
use crate::hosts::facts::{parse_ip_addr, Interface};
use crate::hosts::{Cmd, Host};
use crate::plan::Action;

pub struct AttachmentHandler;

/// The attachment's settings, from a desired or recorded configuration.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    interface: String,
    cidr: String,
    mtu: u32,
}

fn settings(config: &serde_json::Value) -> Option<Settings> {
    Some(Settings {
        interface: config.get("interface")?.as_str()?.to_string(),
        cidr: format!(
            "{}/{}",
            config.get("address")?.as_str()?,
            config.get("prefix_len")?.as_u64()?
        ),
        mtu: config.get("mtu")?.as_u64()? as u32,
    })
}

async fn run(host: &dyn Host, args: &[&str]) -> Result<String, StepError> {
    let cmd = Cmd::new("ip")
        .args(args.iter().copied())
        .timeout(Duration::from_secs(30));
    let out = host.exec(&cmd).await?;
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
/// off without systemd), and those may belong to someone else: put back any that went with it.
async fn remove_address(host: &dyn Host, iface: &str, cidr: &str) -> Result<(), StepError> {
    let before = find(host, iface).await?;
    if !before.addresses.iter().any(|a| a == cidr) {
        return Ok(());
    }
    run(host, &["addr", "del", cidr, "dev", iface]).await?;
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

/// Set the address and MTU; returns the interface as it was, for undo.
async fn configure(
    host: &dyn Host,
    s: &Settings,
    old_cidr: Option<&str>,
) -> Result<Interface, StepError> {
    let before = find(host, &s.interface).await?;
    if let Some(old) = old_cidr.filter(|o| *o != s.cidr) {
        if before.addresses.iter().any(|a| a == old) {
            remove_address(host, &s.interface, old).await?;
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
    Ok(before)
}

#[async_trait]
impl Handler for AttachmentHandler {
    async fn apply(&self, cx: &StepCx<'_>, action: Action) -> Result<Applied, StepError> {
        let host = cx.host()?;
        let recorded = cx.recorded.and_then(|r| settings(&r.config));
        if action == Action::Delete {
            let Some(old) = recorded else {
                return Ok(Applied::default());
            };
            if find(host.as_ref(), &old.interface).await.is_ok() {
                remove_address(host.as_ref(), &old.interface, &old.cidr).await?;
            }
            return Ok(Applied {
                attributes: Default::default(),
                undo: serde_json::json!({ "deleted": old.cidr, "interface": old.interface }),
                summary: format!("removed {} from {}", old.cidr, old.interface),
            });
        }
        let desired = cx.desired.and_then(settings).ok_or_else(|| {
            StepError::new(format!(
                "{}: incomplete attachment configuration",
                cx.address
            ))
        })?;
        let old_cidr = recorded
            .as_ref()
            .filter(|o| o.interface == desired.interface)
            .map(|o| o.cidr.clone());
        cx.progress(
            format!("{} {} mtu {}", desired.interface, desired.cidr, desired.mtu),
            None,
            None,
        );
        let before = configure(host.as_ref(), &desired, old_cidr.as_deref()).await?;
        let mut attributes = std::collections::BTreeMap::new();
        attributes.insert("interface".into(), serde_json::json!(desired.interface));
        attributes.insert("previous_mtu".into(), serde_json::json!(before.mtu));
        attributes.insert(
            "previous_addresses".into(),
            serde_json::json!(before.addresses),
        );
        Ok(Applied {
            attributes,
            undo: serde_json::json!({
                "interface": desired.interface,
                "added": desired.cidr,
                "previous_mtu": before.mtu,
                "previous_addresses": before.addresses,
            }),
            summary: format!("{} {} mtu {}", desired.interface, desired.cidr, desired.mtu),
        })
    }

    async fn undo(
        &self,
        cx: &StepCx<'_>,
        action: Action,
        applied: &Applied,
    ) -> Result<String, StepError> {
        let host = cx.host()?;
        let u = &applied.undo;
        let iface = u
            .get("interface")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        if action == Action::Delete {
            if let Some(cidr) = u.get("deleted").and_then(|v| v.as_str()) {
                run(host.as_ref(), &["addr", "replace", cidr, "dev", iface]).await?;
                return Ok(format!("put {cidr} back on {iface}"));
            }
            return Ok("nothing to undo".into());
        }
        let previous: Vec<String> = u
            .get("previous_addresses")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(added) = u.get("added").and_then(|v| v.as_str()) {
            if !previous.iter().any(|p| p == added) {
                remove_address(host.as_ref(), iface, added).await?;
            }
        }
        for p in &previous {
            run(host.as_ref(), &["addr", "replace", p, "dev", iface]).await?;
        }
        if let Some(mtu) = u.get("previous_mtu").and_then(|v| v.as_u64()) {
            run(
                host.as_ref(),
                &["link", "set", "dev", iface, "mtu", &mtu.to_string()],
            )
            .await?;
        }
        Ok(format!(
            "restored {iface} (mtu {}, {})",
            u.get("previous_mtu").cloned().unwrap_or_default(),
            if previous.is_empty() {
                "no address".into()
            } else {
                previous.join(", ")
            }
        ))
    }

    async fn finalize(
        &self,
        _cx: &StepCx<'_>,
        _action: Action,
        _applied: &Applied,
    ) -> Result<(), StepError> {
        Ok(())
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
    pool: &crate::hosts::HostPool,
    members: &[Member],
    mtu: u32,
) -> Result<String, StepError> {
    let size = mtu.saturating_sub(28).to_string();
    let mut tasks = tokio::task::JoinSet::new();
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
            let (from, to) = (a.clone(), b.clone());
            tasks.spawn(async move { (from, to, host.exec(&cmd).await) });
        }
    }
    let mut failures = Vec::new();
    let mut unreachable = Vec::new();
    let mut pairs = 0;
    while let Some(Ok((from, to, out))) = tasks.join_next().await {
        pairs += 1;
        match out {
            Ok(o) if o.success() => {}
            Ok(o) => failures.push(format!(
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
            Err(e) => unreachable.push(format!("{}: {e}", from.node)),
        }
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

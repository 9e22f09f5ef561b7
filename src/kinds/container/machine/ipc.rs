//! systemd-logind's `RemoveIPC`, judged at plan time for the containers it can break: one that
//! shares the node's IPC namespace (`ipc_mode = "host"`, as multi-node vLLM workers do for
//! their shared-memory broadcast) and runs as a user other than root. logind deletes that
//! user's semaphores and shared memory when its last session ends — when sparkform's ssh
//! session closes — and the head then waits forever for the worker (`SemLock._rebuild
//! FileNotFoundError`). A container in its own IPC namespace, or running as root, is out of
//! logind's reach and not judged.

use super::*;
use crate::diag::Diag;
use crate::inspect::fabric::RdmaFabric;

/// The containers logind's `RemoveIPC` can reach: (node address, resource, user as written).
fn reachable(config: &Config) -> impl Iterator<Item = (&str, &Resource, String)> {
    config.resources.iter().filter_map(|r| {
        if r.kind != crate::vocabulary::KindId::Container {
            return None;
        }
        let d = r.config.typed::<Desired>().ok()?;
        if d.ipc_mode.as_deref() != Some("host") {
            return None;
        }
        let user = d.user?;
        let name = user.split(':').next().unwrap_or_default();
        (!name.is_empty() && name != "root" && name != "0")
            .then(|| (r.node.as_deref(), r, user.clone()))
            .and_then(|(n, r, u)| Some((n?, r, u)))
    })
}

/// The nodes whose logind settings the plan reads.
pub fn ipc_nodes(config: &Config) -> Vec<String> {
    let mut nodes: Vec<String> = reachable(config).map(|(n, _, _)| n.to_string()).collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// (errors, warnings) for the containers whose user's IPC logind removes on the node, as
/// `logind` (by node address) shows it. A user named by its number cannot be matched against
/// the lingering users (their files are named), so it is a warning. Pure.
pub fn judge_remove_ipc(
    config: &Config,
    logind: &std::collections::BTreeMap<String, RdmaFabric>,
) -> (Vec<Diag>, Vec<Diag>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for (node, r, user) in reachable(config) {
        let Some(f) = logind.get(node) else {
            continue;
        };
        let name = user.split(':').next().unwrap_or_default();
        if !f.removes_ipc_of(name) {
            continue;
        }
        let setting = match f.remove_ipc {
            Some(true) => "RemoveIPC=yes",
            _ => "RemoveIPC is unset (systemd's default: yes)",
        };
        let message = format!(
            "{node}: systemd-logind removes the semaphores and shared memory of user {name} when its last session ends ({setting}), and {} runs as {name} in the node's IPC namespace",
            r.address
        );
        let help = format!(
            "on the node, set `RemoveIPC=no` in /etc/systemd/logind.conf and `systemctl restart systemd-logind`, or `loginctl enable-linger {name}`; otherwise the worker's semaphores vanish when the ssh session closes and the head waits for it forever"
        );
        if name.chars().all(|c| c.is_ascii_digit()) {
            warnings.push(
                Diag::warning("host::remove_ipc", message)
                    .label(&r.span, "this container's user")
                    .help(format!(
                        "{help} (a user named by number is not matched against the lingering users)"
                    )),
            );
        } else {
            errors.push(
                Diag::error("host::remove_ipc", message)
                    .label(&r.span, "this container's user")
                    .help(help),
            );
        }
    }
    (errors, warnings)
}

//! The fabric test on the machines: one one-shot container per rank, each on its node, of the
//! test's image, on the host network with the rank's environment, devices and GPUs, running
//! `fabric_test.py` (uploaded as a file before the start, never in the command line). Rank 0's
//! table gives the bus bandwidth; the step fails below the floor, naming the figure, the
//! transport NCCL chose and the fixes. Every container is removed however the step ends; one
//! a killed run left carries the same name and is removed by the next run before it starts.

use std::time::Duration;

use async_trait::async_trait;

use super::{parse_busbw, Desired};
use crate::hosts::HostPool;
use crate::kinds::known;
use crate::kinds::machine::{
    remove_container, tar_of, ContainerIndex, Done, Machine, Step, StepError,
};
use crate::plan::Action;
use crate::runtime::one_shot;
use crate::runtime::spec::ContainerSpec;
use crate::vocabulary::Gpus;

pub struct FabricTestMachine;
pub static MACHINE: FabricTestMachine = FabricTestMachine;

/// The program the ranks run.
pub const FABRIC_TEST_PY: &str = include_str!("fabric_test.py");

/// The label of the test's containers, valued with the deployment's lineage (not the label
/// refresh observes containers by: these are no resource).
pub const LABEL_HELPER: &str = "sparkform.fabric-test";

/// The lines of each rank's output kept for the result and the error (the table is a few
/// dozen; NCCL's INFO lines are many).
const KEEP_LINES: usize = 400;

/// How the container runs the program: arguments passed as `"$@"`, never pasted into a shell
/// line.
const RUNNER: &str = "exec python3 /sparkform/fabric_test.py \"$@\"";

/// A rank's container name: the test's address and the node, as Docker accepts it.
pub fn helper_name(address: &str, node: &str) -> String {
    crate::kinds::machine::docker_name(&format!("sparkform-{address}-{node}"))
}

/// How one rank ended.
#[derive(Debug, Default)]
struct RankEnd {
    node: String,
    code: i64,
    lines: Vec<String>,
}

/// The transport NCCL reported (`NET/IB`, `NET/Socket`), from `NCCL_DEBUG=INFO` lines.
pub fn transport(lines: &[String]) -> Option<String> {
    let re = regex::Regex::new(r"NCCL INFO (?:NET/(IB|Socket)\b|Channel .* via (NET/\S+))").ok()?;
    let mut found: Option<String> = None;
    for l in lines {
        if let Some(c) = re.captures(l) {
            let t = c
                .get(1)
                .map(|m| format!("NET/{}", m.as_str()))
                .or_else(|| c.get(2).map(|m| m.as_str().to_string()));
            if let Some(t) = t {
                if t.contains("GDRDMA") || found.is_none() {
                    found = Some(t);
                }
            }
        }
    }
    found
}

fn create_for(d: &Desired, rank: usize, lineage: &str) -> bollard::models::ContainerCreateBody {
    let r = &d.ranks[rank];
    let master = &d.ranks[0].address;
    let mut env: std::collections::BTreeMap<String, String> = d
        .env
        .get(r.name())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
                .collect()
        })
        .unwrap_or_default();
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    let container = ContainerSpec {
        image: d.image.clone(),
        entrypoint: Some(vec![
            "sh".into(),
            "-c".into(),
            RUNNER.into(),
            "fabric_test.py".into(),
        ]),
        command: Some(
            [
                "--rank".to_string(),
                rank.to_string(),
                "--world-size".into(),
                d.ranks.len().to_string(),
                "--master-addr".into(),
                master.clone(),
                "--master-port".into(),
                d.port().to_string(),
                "--size".into(),
                d.size().to_string(),
                "--iterations".into(),
                d.iterations().to_string(),
                "--timeout".into(),
                d.timeout_secs().to_string(),
            ]
            .into(),
        ),
        env: Some(env),
        network_mode: Some("host".into()),
        ipc_mode: Some("host".into()),
        shm_size: d.shm_size.as_ref().and_then(serde_json::Number::as_i64),
        gpus: d.gpus.get(r.name()).and_then(Gpus::request_count),
        devices: d.devices.as_deref().map(known),
        cap_add: d.cap_add.as_deref().map(known),
        ulimits: d.ulimits.clone(),
        ..Default::default()
    };
    container.helper_body(LABEL_HELPER, lineage)
}

/// Create, fill and start one rank's container (removing one a killed run left).
async fn spawn(
    docker: &bollard::Docker,
    name: &str,
    node: &str,
    body: bollard::models::ContainerCreateBody,
) -> Result<String, StepError> {
    let tar = tar_of(&[("fabric_test.py", FABRIC_TEST_PY.as_bytes(), 0o755)])?;
    one_shot::start(docker, name, body, Some(tar))
        .await
        .map_err(|e| {
            crate::kinds::machine::helper_not_started(
                node,
                "the fabric test's container",
                "the test runs in the deployment's image: it must be on every node of the test",
                e,
            )
        })
}

/// Follow a rank's output to its end; its exit code.
async fn follow(docker: &bollard::Docker, id: &str, node: &str) -> RankEnd {
    let mut end = RankEnd {
        node: node.to_string(),
        ..Default::default()
    };
    let mut buf = String::new();
    let lines = &mut end.lines;
    one_shot::follow(docker, id, &mut |_, text| {
        buf.push_str(text);
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            lines.push(line.trim_end().to_string());
            if lines.len() > KEEP_LINES {
                // The table comes last: keep the newest lines.
                lines.remove(0);
            }
        }
        if buf.len() > 64 * 1024 {
            buf.clear();
        }
        true
    })
    .await;
    if !buf.trim().is_empty() {
        end.lines.push(buf.trim_end().to_string());
    }
    end.code = one_shot::exit_code(docker, id).await.unwrap_or(-1);
    end
}

/// Why a rank failed, from its exit code.
fn exit_help(code: i64) -> &'static str {
    match code {
        6 => "the image has no torch: set the test's image to the deployment's vLLM image",
        7 => "no CUDA device in the container: give the test the nodes' GPUs (`gpus`) as the vLLM containers get them",
        4 => "the ranks could not meet or the collective failed: check that every node reaches rank 0's fabric address on the test's port, and the NCCL lines above",
        3 => "the all-reduce gave wrong values: the fabric or a driver corrupts data; do not serve on it",
        _ => "see the rank's last lines above",
    }
}

/// Run the test: every rank at once, bounded by the test's timeout (plus the containers'
/// start), all removed however it ends. Ok((GB/s, summary)).
pub async fn run(
    d: &Desired,
    pool: &HostPool,
    address: &str,
    lineage: &str,
    cancel: &tokio_util::sync::CancellationToken,
    progress: &(dyn Fn(String, u64) + Send + Sync),
) -> Result<(f64, String), StepError> {
    let mut started: Vec<(bollard::Docker, String, String)> = Vec::new();
    let mut outcome = Ok(());
    for (i, r) in d.ranks.iter().enumerate() {
        let docker = match pool.get(&r.node) {
            Ok(h) => h.docker().await.map_err(StepError::from),
            Err(e) => Err(StepError::from(e)),
        };
        let docker = match docker {
            Ok(dk) => dk,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        };
        let name = helper_name(address, r.name());
        match spawn(&docker, &name, r.name(), create_for(d, i, lineage)).await {
            Ok(id) => started.push((docker, id, r.name().to_string())),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    let ends = match outcome {
        Err(e) => Err(e),
        Ok(()) => {
            progress(
                format!(
                    "all-reduce of {} MiB between {} ranks",
                    d.size() >> 20,
                    d.ranks.len()
                ),
                d.timeout_secs(),
            );
            let all = futures_util::future::join_all(
                started.iter().map(|(dk, id, node)| follow(dk, id, node)),
            );
            // The program bounds itself by the timeout; this bounds a container that hangs.
            let limit = Duration::from_secs(d.timeout_secs() + 30);
            tokio::select! {
                ends = all => Ok(ends),
                _ = tokio::time::sleep(limit) => Err(StepError::new(format!(
                    "the fabric test did not end within {} s", limit.as_secs()
                )).help("a rank is stuck: check that the nodes reach each other on the fabric and that the GPUs are free")),
                _ = cancel.cancelled() => Err(StepError::new("interrupted")),
            }
        }
    };
    for (dk, id, _) in &started {
        remove_container(dk, id).await;
    }
    judge(d, &ends?)
}

/// The verdict on the ranks' ends: a failed rank, no figure, or a figure under the floor fail.
fn judge(d: &Desired, ends: &[RankEnd]) -> Result<(f64, String), StepError> {
    let all_lines: Vec<String> = ends.iter().flat_map(|e| e.lines.clone()).collect();
    let net = transport(&all_lines);
    if let Some(bad) = ends.iter().find(|e| e.code != 0) {
        let tail: Vec<String> = bad.lines.iter().rev().take(12).rev().cloned().collect();
        return Err(StepError::new(format!(
            "the fabric test's rank on {} exited {}",
            bad.node, bad.code
        ))
        .details(tail)
        .help(exit_help(bad.code)));
    }
    let rank0 = ends.first().map(|e| e.lines.join("\n")).unwrap_or_default();
    let Some(b) = parse_busbw(&rank0) else {
        let tail: Vec<String> = ends
            .first()
            .map(|e| e.lines.iter().rev().take(12).rev().cloned().collect())
            .unwrap_or_default();
        return Err(StepError::new("the fabric test printed no bandwidth table")
            .details(tail)
            .help("rank 0 prints nccl-tests' table: see its last lines"));
    };
    let at = b
        .size_bytes
        .map(|s| format!(" at {} MiB", s >> 20))
        .unwrap_or_default();
    let via = net.map(|n| format!(", over {n}")).unwrap_or_default();
    let floor = d.floor();
    if b.gbps < floor {
        let socket = via.contains("Socket");
        return Err(StepError::new(format!(
            "bus bandwidth {:.2} GB/s{at} is below the floor of {floor} GB/s{via}",
            b.gbps
        ))
        .help(if socket {
            "NCCL used TCP sockets, not RDMA: the containers need /dev/infiniband, IPC_LOCK and memlock unlimited (the modules' `rdma = true`), and NCCL_IB_HCA naming the fabric's RoCE ports"
        } else {
            "name every RoCE port of the fabric in NCCL_IB_HCA (both twin devices of one cable), set MTU 9000 on both ends, check each RDMA device's PCIe link width (`sparkform nodes`); or lower min_busbw_gbps"
        }));
    }
    Ok((
        b.gbps,
        format!(
            "bus bandwidth {:.2} GB/s{at}{via} (floor {floor} GB/s)",
            b.gbps
        ),
    ))
}

#[async_trait]
impl Machine for FabricTestMachine {
    type Kind = super::FabricTest;
    type Undo = ();

    async fn apply(
        &self,
        cx: &Step<'_, super::FabricTest>,
        action: Action,
    ) -> Result<Done<Self>, StepError> {
        if action == Action::Delete {
            return Ok(Done::summary(""));
        }
        let d = cx.desired()?;
        let progress = |m: String, t: u64| cx.progress(m, None, Some(t));
        let (gbps, summary) = run(d, cx.pool, cx.address, cx.lineage, cx.cancel, &progress)
            .await
            .map_err(|e| e.scrubbed(cx.secrets))?;
        Ok(Done {
            recorded: super::Recorded {
                busbw_gbps: Some((gbps * 100.0).round() / 100.0).filter(|g| g.is_finite()),
            },
            undo: (),
            summary,
        })
    }

    async fn undo(
        &self,
        _cx: &Step<'_, super::FabricTest>,
        _action: Action,
        _done: &Done<Self>,
    ) -> Result<String, StepError> {
        Ok("nothing to undo".into())
    }

    async fn verify(
        &self,
        d: &Desired,
        pool: &HostPool,
        _containers: &ContainerIndex,
        _retry_for: Duration,
        cancel: &tokio_util::sync::CancellationToken,
        progress: &(dyn Fn(String, u64) + Send + Sync),
    ) -> Option<Result<(Duration, String), StepError>> {
        let t = std::time::Instant::now();
        // `verify` changes nothing and has no lineage of its own to label with.
        let out = run(d, pool, "fabric_test-verify", "verify", cancel, progress).await;
        Some(out.map(|(_, s)| (t.elapsed(), s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_is_read_from_nccl_info_lines() {
        let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            transport(&lines(&[
                "n1:1:1 [0] NCCL INFO NET/Socket : Using [0]eth1:192.168.200.1<0>"
            ])),
            Some("NET/Socket".into())
        );
        assert_eq!(
            transport(&lines(&[
                "x NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE",
                "x NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
            ])),
            Some("NET/IB/0/GDRDMA".into())
        );
        assert_eq!(transport(&lines(&["nothing"])), None);
    }

    #[test]
    fn helper_names_are_docker_names() {
        assert_eq!(
            helper_name("module.fabric.fabric_test.busbw", "spark1"),
            "sparkform-module.fabric.fabric_test.busbw-spark1"
        );
        assert!(helper_name("a b/c", "n")
            .chars()
            .all(|c| c != ' ' && c != '/'));
    }
}

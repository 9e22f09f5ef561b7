//! Before a container starts, what its start needs of nodes' memory (`memory`): on a
//! unified-memory node (DGX Spark) the GPU's memory is the node's, so the page cache of weights
//! just copied and an old engine that has not released its memory yet both make vLLM's load
//! fail ("Free memory on device … is less than desired", a load dying at 97 %). The clean page
//! cache of the named files is dropped, then the start waits, bounded, until `MemFree` covers
//! the need, and fails naming the figures and what holds the GPU's memory.

use std::time::{Duration, Instant};

use super::super::MemoryNeed;
use crate::hosts::{Cmd, Host};
use crate::inspect::facts;
use crate::kinds::machine::{StepCx, StepError};

const DEFAULT_WAIT_SECS: u64 = 120;

/// Every need of `needs`, one after the other (each on its node).
pub(super) async fn ensure(
    cx: &StepCx<'_>,
    name: &str,
    needs: &[MemoryNeed],
) -> Result<(), StepError> {
    for need in needs {
        let host = cx.pool.get(&need.node)?;
        if !need.drop_page_cache.is_empty() {
            drop_page_cache(cx, host.as_ref(), need).await;
        }
        wait_free(cx, host.as_ref(), name, need).await?;
    }
    Ok(())
}

/// `; node.spark1 has 110.2 GiB free`, for each node of `needs` (after a container that held
/// their memory stopped): what a destroy reports; empty without needs.
pub(super) async fn free_now(cx: &StepCx<'_>, needs: &[MemoryNeed]) -> String {
    let mut out = String::new();
    for need in needs {
        let Ok(host) = cx.pool.get(&need.node) else {
            continue;
        };
        if let Some(f) = free_gib(host.as_ref()).await {
            out.push_str(&format!("; {} has {f:.1} GiB free", need.node));
        }
    }
    out
}

/// `dd iflag=nocache count=0` on every file under the paths: the kernel drops their clean
/// pages (GNU dd's `posix_fadvise(DONTNEED)`), no tool beyond coreutils and findutils needed.
async fn drop_page_cache(cx: &StepCx<'_>, host: &dyn Host, need: &MemoryNeed) {
    let cmd = Cmd::new("find")
        .arg("-L")
        .args(need.drop_page_cache.iter().map(String::as_str))
        .args([
            "-type",
            "f",
            "-exec",
            "dd",
            "if={}",
            "iflag=nocache",
            "count=0",
            "status=none",
            ";",
        ])
        .timeout(Duration::from_secs(600));
    let before = free_gib(host).await;
    match host.exec(&cmd).await {
        Ok(o) if o.success() => {
            let after = free_gib(host).await;
            if let (Some(b), Some(a)) = (before, after) {
                cx.progress(
                    format!(
                        "{}: dropped the page cache of {} ({b:.1} → {a:.1} GiB free)",
                        need.node,
                        need.drop_page_cache.join(", ")
                    ),
                    None,
                    None,
                );
            }
        }
        Ok(o) => warn(cx, need, o.stderr.trim()),
        Err(e) => warn(cx, need, &e.to_string()),
    }
}

fn warn(cx: &StepCx<'_>, need: &MemoryNeed, why: &str) {
    cx.emit(crate::events::Event::StepWarning {
        address: cx.address.to_string(),
        message: format!(
            "{}: could not drop the page cache of {}: {why}",
            need.node,
            need.drop_page_cache.join(", ")
        ),
        help: "the weights' pages stay in memory the GPU shares; `sync; echo 1 > /proc/sys/vm/drop_caches` on the node frees them".into(),
    });
}

/// `MemFree` of the node, in GiB.
async fn free_gib(host: &dyn Host) -> Option<f64> {
    let o = host
        .exec(
            &Cmd::new("cat")
                .arg("/proc/meminfo")
                .timeout(Duration::from_secs(30)),
        )
        .await
        .ok()?;
    facts::meminfo_gib(&o.stdout, "MemFree")
}

async fn wait_free(
    cx: &StepCx<'_>,
    host: &dyn Host,
    name: &str,
    need: &MemoryNeed,
) -> Result<(), StepError> {
    let wait = Duration::from_secs(need.timeout.unwrap_or(DEFAULT_WAIT_SECS));
    let start = Instant::now();
    loop {
        let free = free_gib(host).await;
        match free {
            Some(f) if f >= need.min_free_gib => return Ok(()),
            None => {
                return Err(StepError::new(format!(
                    "{}: cannot read MemFree from /proc/meminfo before starting {name}",
                    need.node
                )))
            }
            Some(f) if start.elapsed() >= wait => {
                let holders = gpu_holders(host).await;
                return Err(StepError::new(format!(
                    "{}: {f:.1} GiB of memory free after {} s, {name} needs {:.1} GiB; {holders}",
                    need.node,
                    wait.as_secs(),
                    need.min_free_gib
                ))
                .help("an engine that was stopped may still hold the GPU's memory (an orphaned VLLM::EngineCore): stop it, or lower gpu_memory_utilization; on unified memory the page cache counts as used (`sync; echo 1 > /proc/sys/vm/drop_caches`)"));
            }
            Some(f) => cx.progress(
                format!(
                    "waiting for {:.1} GiB free on {} ({f:.1} GiB free)",
                    need.min_free_gib, need.node
                ),
                None,
                Some(wait.as_secs()),
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = cx.cancel.cancelled() => {
                return Err(StepError::new(format!("{name}: cancelled while waiting for {}'s memory", need.node)));
            }
        }
    }
}

/// What holds the GPU's memory, as `nvidia-smi` lists its compute processes.
async fn gpu_holders(host: &dyn Host) -> String {
    let cmd = Cmd::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader",
        ])
        .timeout(Duration::from_secs(30));
    match host.exec(&cmd).await {
        Ok(o) if o.success() && !o.stdout.trim().is_empty() => format!(
            "the GPU's memory is held by: {}",
            o.stdout
                .trim()
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join("; ")
        ),
        Ok(o) if o.success() => "nvidia-smi lists no process on the GPU".into(),
        _ => "nvidia-smi could not say what holds the GPU".into(),
    }
}

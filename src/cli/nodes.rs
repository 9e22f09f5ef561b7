//! `sparkform nodes`: connect to every node and show what it is, flagging where the definitions
//! disagree with the machine.

use std::process::ExitCode;

use clap::Args;

use super::prelude::{ConfigArgs, ConnectArgs};
use std::collections::BTreeMap;

use crate::config::Config;
use crate::ops::definitions::Pins;
use crate::ops::nodes::{
    differences, disagreements, explanations, short_id, Facts, ImageNccl, NodeReport, RdmaFabric,
};

/// Connect to every node and show its facts (OS, kernel, GPUs, driver, RDMA, memlock, Docker, images and their NCCL, interfaces)
#[derive(Args, Debug)]
#[command(
    long_about = "Connect to every node (through its jump host, with strict host-key checking) in parallel \
and show its OS, kernel, architecture, CPUs, memory, GPUs, NVIDIA driver and CUDA version, RDMA \
devices and their interfaces, the locked-memory limit (the ssh user's and the one containers get \
from Docker), the Docker Engine, the IDs of the images the definitions use and the NCCL each \
carries (its version, from a pip wheel or the system's; read by a short one-shot container of \
each image the node has, never pulled), and the network interfaces. Lines marked `!` are where \
the nodes differ from each other (kernel, driver, CUDA, image IDs, an image's NCCL), an image \
that carries both a pip and a system NCCL, or where they differ from the definitions (declared \
GPUs or memory, an attachment's interface that does not exist); lines marked `-` explain expected differences (logical GPUs with `gpu_devices = \
false`, no NVIDIA driver, no RDMA device). A part a node cannot show (a program it lacks, such as \
`ip` or `nvidia-smi`, named with the Debian/Ubuntu package that brings it) is said on its own line \
(`interfaces: not read: ...`, a `?` in the table) and the rest is shown. Exits 1 when a node cannot \
be reached or its facts cannot be read at all.",
    after_help = "Example:\n  sparkform nodes examples/testbed\n  sparkform nodes examples/testbed --json"
)]
pub struct NodesArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: NodesArgs, rt: &tokio::runtime::Runtime) -> ExitCode {
    // The nodes and ports are the same whatever the kinds read at plan time.
    let config = match args.config.definitions(args.json, Pins::Unresolved) {
        Ok(d) => d.config,
        Err(code) => return code,
    };
    let opts = args.connect.options();
    rt.block_on(async {
        let results: Results = crate::ops::nodes::gather(&config, &opts)
            .await
            .into_iter()
            .map(|(name, r)| (name, shown(r)))
            .collect();
        let unreachable = results.values().any(|r| r.is_err());
        if args.json {
            println!("{}", render_json(&config, &results));
        } else {
            print!("{}", render_text(&config, &results));
        }
        if unreachable {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Why a node shows no facts at all.
#[derive(Debug, Clone)]
struct NotShown {
    /// Not connected; else connected, but its facts could not be gathered.
    unreachable: bool,
    why: String,
}

type Results = BTreeMap<String, Result<Facts, NotShown>>;

fn shown(r: NodeReport) -> Result<Facts, NotShown> {
    match r {
        NodeReport::Facts(f) => Ok(*f),
        NodeReport::Failed(why) => Err(NotShown {
            unreachable: false,
            why,
        }),
        NodeReport::Unreachable(e) => Err(NotShown {
            unreachable: true,
            why: format!(
                "{:?}",
                miette::Report::new(super::prelude::SharedHostError(e))
            ),
        }),
    }
}

/// How a section of [`Facts::not_read`] reads in the text.
fn section_label(field: &str) -> &str {
    match field {
        "memory_gib" => "memory",
        "nvidia" => "driver",
        "docker_memlock" => "containers' memlock",
        other => other,
    }
}

fn reached(results: &Results) -> BTreeMap<String, Facts> {
    results
        .iter()
        .filter_map(|(n, r)| Some((n.clone(), r.as_ref().ok()?.clone())))
        .collect()
}

fn render_json(config: &Config, results: &Results) -> String {
    let nodes: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|(name, r)| {
            let v = match r {
                Ok(f) => {
                    let node = config.nodes.get(name);
                    serde_json::json!({
                        "facts": f,
                        "disagreements": node.map(|n| disagreements(config, n, f)).unwrap_or_default(),
                        "explanations": node.map(|n| explanations(n, f)).unwrap_or_default(),
                    })
                }
                Err(e) => serde_json::json!({ "error": e.why, "unreachable": e.unreachable }),
            };
            (name.clone(), v)
        })
        .collect();
    let doc = serde_json::json!({
        "nodes": nodes,
        "differences": differences(&reached(results)),
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// The table, each node's details, then what differs between the nodes. Pure.
fn render_text(config: &Config, results: &Results) -> String {
    let mut rows = vec![[
        "NODE", "OS", "KERNEL", "ARCH", "CPUS", "MEMORY", "GPUS", "DRIVER", "CUDA", "DOCKER",
    ]
    .map(String::from)
    .to_vec()];
    let mut notes = Vec::new();
    for (name, r) in results {
        let f = match r {
            Ok(f) => f,
            Err(e) => {
                let what = if e.unreachable {
                    "unreachable"
                } else {
                    "not read"
                };
                let mut row = vec![name.clone(), what.into()];
                row.resize(rows[0].len(), String::new());
                rows.push(row);
                notes.push(format!("! {name}: {}", e.why));
                continue;
            }
        };
        // A section the node could not show reads `?`, said on its own line below.
        let or_unknown = |field: &str, value: String| {
            if f.not_read.contains_key(field) {
                "?".to_string()
            } else {
                value
            }
        };
        rows.push(vec![
            name.clone(),
            or_unknown("os", f.os.clone()),
            or_unknown("kernel", f.kernel.clone()),
            or_unknown("arch", f.arch.clone()),
            or_unknown("cpus", f.cpus.to_string()),
            or_unknown("memory_gib", format!("{:.1} GiB", f.memory_gib)),
            or_unknown(
                "gpus",
                match f.gpus.first() {
                    None => "0".into(),
                    Some(g) => format!("{} × {}", f.gpus.len(), g.name),
                },
            ),
            or_unknown(
                "nvidia",
                f.nvidia
                    .as_ref()
                    .map_or("none".into(), |n| n.driver.clone()),
            ),
            or_unknown(
                "nvidia",
                f.nvidia
                    .as_ref()
                    .and_then(|n| n.cuda.clone())
                    .unwrap_or_else(|| "none".into()),
            ),
            f.docker.clone().unwrap_or_else(|_| "unavailable".into()),
        ]);
        for (field, why) in f.not_read.iter().filter(|(k, _)| *k != "interfaces") {
            notes.push(format!("{name}: {}: not read: {why}", section_label(field)));
        }
        let rdma: Vec<String> = f
            .rdma
            .iter()
            .map(|d| {
                if d.netdevs.is_empty() {
                    d.name.clone()
                } else {
                    format!("{} → {}", d.name, d.netdevs.join(" "))
                }
            })
            .collect();
        notes.push(format!(
            "{name}: rdma: {}",
            if rdma.is_empty() {
                "none".into()
            } else {
                rdma.join(", ")
            }
        ));
        notes.extend(fabric_lines(name, &f.fabric));
        notes.push(format!(
            "{name}: memlock: {} (ssh user), {} (containers by default)",
            f.memlock.as_deref().unwrap_or("unknown"),
            f.docker_memlock.as_deref().unwrap_or("unknown")
        ));
        for (image, id) in &f.images {
            notes.push(format!(
                "{name}: image {image}: {}",
                id.as_deref().map_or("not on this node".into(), short_id)
            ));
            if let Some(read) = f.nccl.get(image) {
                notes.push(nccl_line(name, image, read));
            }
        }
        let ifaces: Vec<String> = f
            .interfaces
            .iter()
            .filter(|i| i.name != "lo")
            .map(|i| {
                format!(
                    "{} mtu {} {} {}",
                    i.name,
                    i.mtu,
                    i.state,
                    i.addresses.join(" ")
                )
                .trim_end()
                .to_string()
            })
            .collect();
        match f.not_read.get("interfaces") {
            Some(why) => notes.push(format!("{name}: interfaces: not read: {why}")),
            None => notes.push(format!("{name}: interfaces: {}", ifaces.join("; "))),
        }
        if let Some(n) = config.nodes.get(name) {
            for e in explanations(n, f) {
                notes.push(format!("- {name}: {e}"));
            }
            for d in disagreements(config, n, f) {
                notes.push(format!("! {name}: {d}"));
            }
        }
    }
    for d in differences(&reached(results)) {
        notes.push(format!("! {d}"));
    }
    let mut out = super::prelude::table(&rows);
    out.push('\n');
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// `node.a: NCCL 2.27.3 (pip wheel nvidia-nccl-cu12) in vllm/vllm-openai:v0.21.0`.
fn nccl_line(name: &str, image: &str, read: &Result<ImageNccl, String>) -> String {
    match read {
        Ok(nccl) => match nccl.summary() {
            Some(s) => format!("{name}: NCCL {s} in {image}"),
            None => format!("{name}: no NCCL library in {image}"),
        },
        Err(why) => format!("{name}: NCCL in {image} not read: {why}"),
    }
}

/// Each RDMA port (state, link layer, rate, the PCIe link of its device, the fabric addresses
/// its GID table carries as RoCE v2 with their index) and logind's IPC removal.
fn fabric_lines(name: &str, f: &RdmaFabric) -> Vec<String> {
    let mut out = Vec::new();
    for p in &f.ports {
        let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        let pcie = f.pcie.get(&p.device).map(|l| {
            format!(
                "; PCIe x{} of x{} at {}",
                text(&l.width),
                text(&l.max_width),
                text(&l.speed)
            )
        });
        let gids: Vec<String> = p
            .gids
            .iter()
            .filter(|g| g.is_roce_v2())
            .filter_map(|g| Some(format!("{} = {}", g.index, g.ipv4()?)))
            .collect();
        out.push(format!(
            "{name}: rdma {} port {}: {}, {}, {}{}; RoCE v2 GIDs: {}",
            p.device,
            p.port,
            text(&p.state),
            text(&p.link_layer),
            text(&p.rate),
            pcie.unwrap_or_default(),
            if gids.is_empty() {
                "none with an IPv4 address".into()
            } else {
                gids.join(", ")
            }
        ));
    }
    out.push(format!(
        "{name}: logind RemoveIPC: {}{}",
        match f.remove_ipc {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unset (systemd's default: yes)",
        },
        if f.lingering.is_empty() {
            String::new()
        } else {
            format!("; lingering: {}", f.lingering.join(", "))
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::facts::{Nvidia, RdmaDevice};

    fn config(gpu_devices: bool) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let flag = if gpu_devices {
            ""
        } else {
            "gpu_devices = false"
        };
        std::fs::write(
            dir.path().join("main.hcl"),
            format!(
                "node \"a\" {{\n  address = \"10.0.0.1\"\n  gpus = 1\n  {flag}\n}}\nnode \"b\" {{\n  address = \"10.0.0.2\"\n  gpus = 1\n  {flag}\n}}\n"
            ),
        )
        .unwrap();
        crate::config::load(dir.path(), &Default::default()).unwrap()
    }

    fn facts(driver: &str, image: &str) -> Facts {
        Facts {
            os: "Ubuntu 24.04.3 LTS".into(),
            kernel: "6.11.0-1016-nvidia".into(),
            arch: "aarch64".into(),
            cpus: 20,
            memory_gib: 119.7,
            gpus: Vec::new(),
            nvidia: Some(Nvidia {
                driver: driver.into(),
                cuda: Some("13.0".into()),
            }),
            fabric: Default::default(),
            rdma: vec![RdmaDevice {
                name: "rocep1s0f0".into(),
                netdevs: vec!["enp1s0f0np0".into()],
            }],
            memlock: Some("8 MiB".into()),
            docker_memlock: Some("unlimited (dockerd's own)".into()),
            docker: Ok("28.2.2 (API 1.50)".into()),
            images: [("vllm:26.01".to_string(), Some(image.to_string()))].into(),
            nccl: BTreeMap::new(),
            interfaces: Vec::new(),
            not_read: BTreeMap::new(),
        }
    }

    #[test]
    fn shows_the_driver_stack_and_flags_what_differs() {
        let c = config(true);
        let results: Results = [
            (
                "node.a".to_string(),
                Ok(facts("580.95.05", "sha256:1111111111111111")),
            ),
            (
                "node.b".to_string(),
                Ok(facts("580.82.07", "sha256:2222222222222222")),
            ),
        ]
        .into();
        let text = render_text(&c, &results);
        assert!(text.contains("580.95.05"), "{text}");
        assert!(
            text.contains("node.a: rdma: rocep1s0f0 → enp1s0f0np0"),
            "{text}"
        );
        assert!(
            text.contains("node.a: memlock: 8 MiB (ssh user), unlimited (dockerd's own) (containers by default)"),
            "{text}"
        );
        assert!(
            text.contains("node.b: image vllm:26.01: sha256:222222222222"),
            "{text}"
        );
        assert!(
            text.contains("! NVIDIA driver differs: node.a 580.95.05, node.b 580.82.07"),
            "{text}"
        );
        assert!(
            text.contains("! image vllm:26.01 differs: node.a sha256:111111111111, node.b sha256:222222222222"),
            "{text}"
        );
        // Declared GPUs with devices expected, none found: a real disagreement.
        assert!(
            text.contains("! node.a: declares 1 GPU, the machine shows 0"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&render_json(&c, &results)).unwrap();
        assert_eq!(json["differences"].as_array().unwrap().len(), 2, "{json}");
    }

    /// What the NCCL probe prints in an image with the `nvidia-nccl-cu12` wheel `version`, and
    /// the system's `libnccl.so.2.27.3` too where `system`.
    fn nccl(version: &str, system: bool) -> ImageNccl {
        let packages = "/usr/local/lib/python3.12/dist-packages";
        let mut out = format!(
            "nccl-probe 1\nnccl-lib\t{packages}/nvidia/nccl/lib/libnccl.so.2\n\
nccl-wheel\t{packages}/nvidia_nccl_cu12-{version}.dist-info\t{version}\n"
        );
        if system {
            out.push_str("nccl-lib\t/usr/lib/aarch64-linux-gnu/libnccl.so.2.27.3\n");
        }
        out.push_str("nccl-end\n");
        crate::inspect::nccl::parse_probe(&out).unwrap()
    }

    #[test]
    fn shows_each_images_nccl_per_node_and_flags_a_difference_and_two_in_one_image() {
        let c = config(true);
        let mut a = facts("580.95.05", "sha256:1111111111111111");
        a.nccl = [("vllm:26.01".to_string(), Ok(nccl("2.27.3", false)))].into();
        let mut b = a.clone();
        b.nccl = [("vllm:26.01".to_string(), Ok(nccl("2.26.2", true)))].into();
        let mut unread = a.clone();
        unread.nccl = [(
            "vllm:26.01".to_string(),
            Err("the probe did not finish within 60 s".to_string()),
        )]
        .into();
        let results: Results = [
            ("node.a".to_string(), Ok(a)),
            ("node.b".to_string(), Ok(b)),
            ("node.c".to_string(), Ok(unread)),
        ]
        .into();
        let text = render_text(&c, &results);
        assert!(
            text.contains("node.a: NCCL 2.27.3 (pip wheel nvidia-nccl-cu12) in vllm:26.01\n"),
            "{text}"
        );
        assert!(
            text.contains("node.b: NCCL 2.26.2 (pip wheel nvidia-nccl-cu12) and 2.27.3 (system, /usr/lib/aarch64-linux-gnu/libnccl.so.2.27.3) in vllm:26.01\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "node.c: NCCL in vllm:26.01 not read: the probe did not finish within 60 s\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("! NCCL in image vllm:26.01 differs: node.a 2.27.3 (pip wheel nvidia-nccl-cu12), node.b 2.26.2"),
            "{text}"
        );
        assert!(
            text.contains("! image vllm:26.01 carries two NCCL libraries (node.b): the pip wheel nvidia-nccl-cu12 2.26.2"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&render_json(&c, &results)).unwrap();
        let pip = &json["nodes"]["node.a"]["facts"]["nccl"]["vllm:26.01"]["Ok"]["libraries"][0];
        assert_eq!(pip["version"], "2.27.3", "{json}");
        assert_eq!(pip["source"], "pip_wheel", "{json}");
        assert_eq!(pip["package"], "nvidia-nccl-cu12", "{json}");
        assert_eq!(
            json["nodes"]["node.c"]["facts"]["nccl"]["vllm:26.01"]["Err"],
            "the probe did not finish within 60 s"
        );
        assert_eq!(json["differences"].as_array().unwrap().len(), 2, "{json}");
    }

    /// The node (no iproute2): its row shows the GPU, driver, CUDA and memory, its
    /// interfaces line names `ip` and iproute2; a part not read is `?` in the table. Only a
    /// node not connected reads "unreachable"; one connected whose facts failed, "not read".
    #[test]
    fn a_section_not_read_is_said_alone_and_the_rest_shown() {
        let c = config(true);
        let mut h200 = facts("580.159.04", "sha256:1111111111111111");
        h200.gpus = vec![crate::inspect::facts::Gpu {
            name: "NVIDIA H200".into(),
            memory_mib: Some(143771),
        }];
        h200.memory_gib = 2048.0;
        h200.not_read = [
            (
                "interfaces".to_string(),
                "`ip` is missing on the node (install iproute2)".to_string(),
            ),
            (
                "docker_memlock".to_string(),
                "`pidof` is missing on the node (install procps, or sysvinit-utils on older releases)"
                    .to_string(),
            ),
            ("cpus".to_string(), "`nproc` is missing on the node (install coreutils)".to_string()),
        ]
        .into();
        let results: Results = [
            ("node.a".to_string(), Ok(h200)),
            (
                "node.b".to_string(),
                Err(NotShown {
                    unreachable: false,
                    why: "gathering facts took over 60 s".into(),
                }),
            ),
            (
                "node.c".to_string(),
                Err(NotShown {
                    unreachable: true,
                    why: "node.c: cannot reach 10.0.0.3: connection refused".into(),
                }),
            ),
        ]
        .into();
        let text = render_text(&c, &results);
        let row = |node: &str| {
            text.lines()
                .find(|l| l.starts_with(node) && !l.contains(": "))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            row("node.a"),
            "node.a Ubuntu 24.04.3 LTS 6.11.0-1016-nvidia aarch64 ? 2048.0 GiB 1 × NVIDIA H200 580.159.04 13.0 28.2.2 (API 1.50)",
            "{text}"
        );
        assert!(
            text.contains(
                "node.a: interfaces: not read: `ip` is missing on the node (install iproute2)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("node.a: containers' memlock: not read: `pidof` is missing on the node"),
            "{text}"
        );
        assert!(
            text.contains(
                "node.a: cpus: not read: `nproc` is missing on the node (install coreutils)\n"
            ),
            "{text}"
        );
        assert_eq!(row("node.b"), "node.b not read", "{text}");
        assert!(
            text.contains("! node.b: gathering facts took over 60 s"),
            "{text}"
        );
        assert_eq!(row("node.c"), "node.c unreachable", "{text}");
        assert!(!row("node.a").contains("unreachable"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&render_json(&c, &results)).unwrap();
        assert_eq!(
            json["nodes"]["node.a"]["facts"]["not_read"]["interfaces"],
            "`ip` is missing on the node (install iproute2)"
        );
        assert_eq!(json["nodes"]["node.b"]["unreachable"], false);
        assert_eq!(json["nodes"]["node.c"]["unreachable"], true);
    }

    #[test]
    fn logical_gpus_are_explained_not_warned_about() {
        let c = config(false);
        let mut f = facts("580.95.05", "sha256:1111111111111111");
        f.nvidia = None;
        let results: Results = [
            ("node.a".to_string(), Ok(f.clone())),
            ("node.b".to_string(), Ok(f)),
        ]
        .into();
        let text = render_text(&c, &results);
        assert!(!text.contains("! "), "no warning expected:\n{text}");
        assert!(
            text.contains("- node.a: declares 1 logical GPU without devices (gpu_devices = false)"),
            "{text}"
        );
        assert!(text.contains("- node.b: no NVIDIA driver"), "{text}");
    }
}

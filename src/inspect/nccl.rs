//! The NCCL library each image of the deployment carries, for `sparkform nodes`: its version,
//! and whether it is a pip wheel's (`nvidia-nccl-cu12`/`-cu13`, a `libnccl.so.2` under
//! `…-packages/nvidia/nccl/lib/`) or the system's (`/usr/lib/*/libnccl.so*`, `/usr/local/…`),
//! or both. An image with both can put two builds of NCCL into one process (torch loads the
//! wheel's through its RPATH, vLLM's pynccl asks the dynamic loader for `libnccl.so.2` and may
//! get the system's): field reports of that wedged serving after 20–26 min with `Watchdog
//! caught collective operation timeout` (vLLM issue #42354), even at the same version.
//!
//! Read with one short one-shot container per image present on the node (never pulled), on no
//! network, bounded in time and removed however it ends, running a POSIX `sh` script that needs
//! nothing but `sh` and, where the image has them, `find` and `python3` (torch's own answer).
//! Only `nodes` runs it: a container per image is too slow for a plan.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::hosts::{remove_container, Host};
use crate::runtime::one_shot;

/// How long one image's probe may take, from create to exit: `import torch` of a large image
/// takes seconds, a `find` over its files a few more.
const PROBE_SECS: u64 = 60;

/// How long removing the probe's container may take, so an engine that stopped answering
/// does not hold `nodes` up.
const REMOVE_SECS: u64 = 20;

/// At most this many lines of the probe's output are kept (a few libraries and wheels; the
/// rest would be noise from the image).
const KEEP_LINES: usize = 2000;

/// The label of the probe's containers (not the lineage label refresh observes containers by:
/// these are no resource of any deployment).
pub const LABEL_PROBE: &str = "sparkform.nccl-probe";

/// The first and last lines the script prints: output without both is not the probe's whole
/// answer (a shell that is not one, a run cut short).
const HEADER: &str = "nccl-probe 1";
const END: &str = "nccl-end";

/// Prints `nccl-lib\tPATH` for every `libnccl.so*`, `nccl-wheel\tDIST-INFO\tVERSION` for every
/// `nvidia_nccl_cu*` wheel (the `Version:` line of its `METADATA`, read by `sh` itself), then
/// what torch says (`$1`, a Python program, passed as an argument so no quoting nests). Without
/// `find` it looks where libraries and wheels live, with the shell's own globs.
const SCRIPT: &str = r#"echo 'nccl-probe 1'
if command -v find >/dev/null 2>&1; then
  find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \( -name 'libnccl.so*' -o -name 'nvidia_nccl_cu*.dist-info' \) -print 2>/dev/null
else
  for f in /usr/lib/libnccl.so* /usr/lib/*/libnccl.so* /usr/lib64/libnccl.so* /usr/local/lib/libnccl.so* /usr/local/*/lib/libnccl.so* /usr/local/*/lib64/libnccl.so* /opt/*/lib/libnccl.so* \
    /usr/lib/python3*/*-packages/nvidia/nccl/lib/libnccl.so* /usr/local/lib/python3*/*-packages/nvidia/nccl/lib/libnccl.so* /opt/*/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so* /root/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so* \
    /usr/lib/python3*/*-packages/nvidia_nccl_cu*.dist-info /usr/local/lib/python3*/*-packages/nvidia_nccl_cu*.dist-info /opt/*/lib/python3*/site-packages/nvidia_nccl_cu*.dist-info /root/.local/lib/python3*/site-packages/nvidia_nccl_cu*.dist-info; do
    if [ -e "$f" ]; then echo "$f"; fi
  done
fi | while IFS= read -r f; do
  case "$f" in
    *.dist-info)
      v=
      if [ -r "$f/METADATA" ]; then
        while IFS= read -r l; do
          case "$l" in 'Version: '*) v=${l#Version: }; break ;; esac
        done < "$f/METADATA"
      fi
      printf 'nccl-wheel\t%s\t%s\n' "$f" "$v" ;;
    *) printf 'nccl-lib\t%s\n' "$f" ;;
  esac
done
if command -v python3 >/dev/null 2>&1; then
  python3 -c "$1" 2>/dev/null || printf 'nccl-torch-error\tpython3 failed\n'
else
  printf 'nccl-torch-error\tno python3\n'
fi
echo 'nccl-end'
"#;

/// What torch says: the NCCL version it runs with (an int before torch 1.x's tuple: 2708 is
/// 2.7.8, 21803 is 2.18.3) and the libnccl files its process maps (the one it loaded).
const TORCH_PY: &str = r#"import sys
try:
    import torch
    v = torch.cuda.nccl.version()
except Exception as e:
    print('nccl-torch-error\t%s: %s' % (type(e).__name__, (str(e).splitlines() or [''])[0]))
    sys.exit(0)
if isinstance(v, int):
    v = (v // 10000, v % 10000 // 100, v % 100) if v >= 10000 else (v // 1000, v % 1000 // 100, v % 100)
print('nccl-torch\t' + '.'.join(map(str, v)))
try:
    for p in sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libnccl' in l}):
        print('nccl-loaded\t' + p)
except Exception:
    pass
"#;

/// Where a library comes from.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum LibrarySource {
    /// Inside a Python package folder (`site-packages`, `dist-packages`).
    PipWheel,
    /// Anywhere else: the distribution's package, CUDA's folders, a build under `/usr/local`.
    System,
}

/// One folder's NCCL library.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Library {
    /// `libnccl.so.2` of its folder (what the dynamic loader resolves) when it is there, else
    /// the first file found.
    pub path: String,
    /// What torch runs with where it loaded this one, else the wheel's `METADATA`, else the
    /// file's name (`libnccl.so.2.27.3`).
    pub version: Option<String>,
    pub source: LibrarySource,
    /// The pip package it came with: `nvidia-nccl-cu12`, or the package folder it sits in
    /// (`torch`, which bundled NCCL once).
    pub package: Option<String>,
}

impl Library {
    /// `2.27.3 (pip wheel nvidia-nccl-cu12)`, `2.27.3 (system, /usr/lib/…/libnccl.so.2)`.
    pub fn describe(&self) -> String {
        let version = self.version.as_deref().unwrap_or("unknown version");
        match (self.source, &self.package) {
            (LibrarySource::PipWheel, Some(p)) => format!("{version} (pip wheel {p})"),
            (LibrarySource::PipWheel, None) => format!("{version} (pip wheel, {})", self.path),
            (LibrarySource::System, _) => format!("{version} (system, {})", self.path),
        }
    }
}

/// The NCCL an image carries.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct ImageNccl {
    /// One per folder holding a `libnccl.so*`, pip wheels first.
    pub libraries: Vec<Library>,
    /// The version `torch.cuda.nccl.version()` gives, where torch imports.
    pub torch: Option<String>,
    /// The libnccl files torch's process maps: the library it runs with.
    pub loaded: Vec<String>,
    /// Why torch gave no version (no python3, no torch, a build without NCCL).
    pub torch_error: Option<String>,
}

impl ImageNccl {
    /// What `nodes` shows and compares between nodes: each library's version and source, and
    /// what torch runs with where that is not simply the one library there is. `None` when
    /// the image has no NCCL at all.
    pub fn summary(&self) -> Option<String> {
        let mut text = self
            .libraries
            .iter()
            .map(Library::describe)
            .collect::<Vec<_>>()
            .join(" and ");
        let torch_says = match self.libraries.as_slice() {
            [only] => only.version != self.torch,
            _ => true,
        };
        if let (Some(v), true) = (&self.torch, torch_says) {
            if !text.is_empty() {
                text.push_str("; ");
            }
            text.push_str(&format!("torch runs {v}"));
            if !self.loaded.is_empty() {
                text.push_str(&format!(" from {}", self.loaded.join(", ")));
            }
        }
        (!text.is_empty()).then_some(text)
    }

    /// Both a pip wheel's library and the system's: (the wheel's, the system's).
    pub fn pip_and_system(&self) -> Option<(&Library, &Library)> {
        let pip = self
            .libraries
            .iter()
            .find(|l| l.source == LibrarySource::PipWheel)?;
        let system = self
            .libraries
            .iter()
            .find(|l| l.source == LibrarySource::System)?;
        Some((pip, system))
    }
}

/// What the probe said of each image: its NCCL, or why it could not be read.
pub type ImagesNccl = BTreeMap<String, Result<ImageNccl, String>>;

/// The NCCL of each of `images` (references the node has: nothing is pulled), one one-shot
/// container each, at once.
pub async fn read(host: &dyn Host, images: &[String]) -> ImagesNccl {
    let docker = match host.docker().await {
        Ok(d) => d,
        Err(e) => {
            let why = e.to_string();
            return images
                .iter()
                .map(|i| (i.clone(), Err(why.clone())))
                .collect();
        }
    };
    let reads = images.iter().map(|image| {
        let docker = &docker;
        async move { (image.clone(), read_image(docker, image).await) }
    });
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .collect()
}

/// The probe container's name for `image`: Docker's characters, and a hash of the reference so
/// two references never share one (`a/b:c`, `a-b:c`). One a killed run left is removed by the
/// next run before it starts.
pub fn probe_container_name(image: &str) -> String {
    let clean: String = image
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(80)
        .collect();
    let hash: String = Sha256::digest(image.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sparkform-nccl-probe-{clean}-{hash}")
}

/// One image's probe, bounded in time; its container removed however the run ended.
async fn read_image(docker: &bollard::Docker, image: &str) -> Result<ImageNccl, String> {
    let name = probe_container_name(image);
    let run = tokio::time::timeout(
        Duration::from_secs(PROBE_SECS),
        run_probe(docker, &name, image),
    )
    .await;
    // By name: a run cut short may have created the container without learning its ID. One
    // whose removal did not finish in time is removed by the next run (same name).
    let _ = tokio::time::timeout(
        Duration::from_secs(REMOVE_SECS),
        remove_container(docker, &name),
    )
    .await;
    let end = run.map_err(|_| format!("the probe did not finish within {PROBE_SECS} s"))??;
    parse_probe(&end.stdout).map_err(|why| match (end.code, end.stderr.last()) {
        (0, _) => why,
        (code, Some(last)) => format!("the probe exited {code}: {last}"),
        (code, None) => format!("the probe exited {code}: {why}"),
    })
}

/// How a probe's container ended.
struct ProbeEnd {
    code: i64,
    stdout: String,
    stderr: Vec<String>,
}

/// Create (removing one a killed run left), start, follow to the end, read the exit code.
async fn run_probe(docker: &bollard::Docker, name: &str, image: &str) -> Result<ProbeEnd, String> {
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(
            ["sh", "-c", SCRIPT, "nccl-probe", TORCH_PY]
                .map(String::from)
                .to_vec(),
        ),
        labels: Some([(LABEL_PROBE.to_string(), "nodes".to_string())].into()),
        env: Some(vec!["PYTHONDONTWRITEBYTECODE=1".into()]),
        // It reads its own files: no network, nothing of the node's.
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = one_shot::start(docker, name, body, None)
        .await
        .map_err(|e| {
            let what = match e.stage {
                one_shot::Stage::Create => "create",
                one_shot::Stage::Upload | one_shot::Stage::Start => "start",
            };
            format!("cannot {what} the probe's container: {}", e.error)
        })?;
    let mut stdout = String::new();
    let mut kept = 0;
    let mut stderr = Vec::new();
    one_shot::follow(docker, &id, &mut |is_stderr, text| {
        if is_stderr {
            stderr.extend(text.lines().map(str::to_string));
            let over = stderr.len().saturating_sub(5);
            stderr.drain(..over);
        } else if kept < KEEP_LINES {
            kept += text.matches('\n').count();
            stdout.push_str(text);
        }
        true
    })
    .await;
    let code = one_shot::exit_code(docker, &id).await.unwrap_or(-1);
    Ok(ProbeEnd {
        code,
        stdout,
        stderr,
    })
}

/// The probe's output as the image's NCCL. Pure. Lines it does not know are skipped (what the
/// image prints of its own); an output without the probe's first and last lines is an error
/// naming what came instead.
pub fn parse_probe(out: &str) -> Result<ImageNccl, String> {
    let lines: Vec<&str> = out.lines().map(|l| l.trim_end_matches('\r')).collect();
    if !lines.contains(&HEADER) {
        let first = lines.iter().find(|l| !l.trim().is_empty());
        return Err(match first {
            None => "the probe printed nothing".into(),
            Some(l) => format!(
                "the image did not run the probe; it printed: {}",
                l.chars().take(200).collect::<String>()
            ),
        });
    }
    if !lines.contains(&END) {
        return Err("the probe stopped before its end".into());
    }
    let mut files: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut wheels: Vec<(&str, Option<&str>)> = Vec::new();
    let mut found = ImageNccl::default();
    for line in &lines {
        let mut fields = line.split('\t');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("nccl-lib"), Some(path), None) if path.starts_with('/') => {
                if let Some((folder, file)) = path.rsplit_once('/') {
                    files.entry(folder).or_default().push(file);
                }
            }
            (Some("nccl-wheel"), Some(path), version) if path.starts_with('/') => {
                wheels.push((path, version.map(str::trim).filter(|v| is_version(v))));
            }
            (Some("nccl-torch"), Some(v), None) if is_version(v.trim()) => {
                found.torch = Some(v.trim().to_string());
            }
            (Some("nccl-torch-error"), Some(why), _) => {
                found.torch_error = Some(why.chars().take(200).collect());
            }
            (Some("nccl-loaded"), Some(path), None) if path.starts_with('/') => {
                found.loaded.push(path.to_string());
            }
            _ => {}
        }
    }
    found.libraries = files
        .into_iter()
        .map(|(folder, names)| library(folder, &names, &wheels))
        .collect();
    found
        .libraries
        .sort_by(|a, b| (a.source, &a.path).cmp(&(b.source, &b.path)));
    // What torch runs with is the truest version of the library it loaded (or of the only one
    // there is, when its file and wheel said none).
    if let Some(v) = &found.torch {
        let only = found.libraries.len() == 1;
        let loaded: BTreeSet<&str> = found.loaded.iter().map(|p| folder_of(p)).collect();
        for lib in &mut found.libraries {
            if loaded.contains(folder_of(&lib.path)) || (only && lib.version.is_none()) {
                lib.version = Some(v.clone());
            }
        }
    }
    Ok(found)
}

fn folder_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(folder, _)| folder)
}

/// `2.27.3`: digits and dots, starting with a digit.
fn is_version(v: &str) -> bool {
    v.starts_with(|c: char| c.is_ascii_digit()) && v.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// A folder's library: its source from where the folder is, its version from the wheel that
/// installed it or from its files' names.
fn library(folder: &str, names: &[&str], wheels: &[(&str, Option<&str>)]) -> Library {
    let file = names
        .iter()
        .find(|n| **n == "libnccl.so.2")
        .or_else(|| names.first())
        .copied()
        .unwrap_or("libnccl.so");
    let by_name = names
        .iter()
        .filter_map(|n| n.strip_prefix("libnccl.so."))
        .filter(|v| v.split('.').count() >= 3 && is_version(v))
        .max_by_key(|v| version_key(v))
        .map(str::to_string);
    let path = format!("{folder}/{file}");
    let Some((packages, inside)) = packages_folder(folder) else {
        return Library {
            path,
            version: by_name,
            source: LibrarySource::System,
            package: None,
        };
    };
    // NCCL's wheels install into `nvidia/nccl/lib` beside their `.dist-info`; a library
    // bundled in another package (`torch/lib`) is named by that package's folder.
    let (package, version) = if inside == "nvidia/nccl/lib" {
        match nccl_wheel(packages, wheels) {
            Some((package, version)) => (Some(package), version.or(by_name)),
            None => (None, by_name),
        }
    } else {
        let folder = inside.split('/').next().filter(|p| !p.is_empty());
        (folder.map(str::to_string), by_name)
    };
    Library {
        path,
        version,
        source: LibrarySource::PipWheel,
        package,
    }
}

/// The NCCL wheel installed in `packages` (`nvidia_nccl_cu12-2.27.3.dist-info`): its package
/// name as pip spells it and its version (`METADATA`'s, else the folder name's).
fn nccl_wheel(packages: &str, wheels: &[(&str, Option<&str>)]) -> Option<(String, Option<String>)> {
    wheels
        .iter()
        .filter_map(|(path, version)| {
            let name = path.strip_prefix(packages)?.strip_prefix('/')?;
            let stem = name.strip_suffix(".dist-info")?;
            let (package, named) = stem.split_once('-').unwrap_or((stem, ""));
            let version = version
                .map(str::to_string)
                .or_else(|| is_version(named).then(|| named.to_string()));
            Some((package.replace('_', "-"), version))
        })
        .min()
}

/// `/usr/lib/python3/dist-packages/nvidia/nccl/lib` → (`…/dist-packages`, `nvidia/nccl/lib`).
fn packages_folder(folder: &str) -> Option<(&str, &str)> {
    ["/site-packages/", "/dist-packages/"]
        .iter()
        .filter_map(|marker| {
            let i = folder.find(marker)?;
            Some((&folder[..i + marker.len() - 1], &folder[i + marker.len()..]))
        })
        .next()
        .or_else(|| {
            ["/site-packages", "/dist-packages"]
                .iter()
                .find(|m| folder.ends_with(*m))
                .map(|_| (folder, ""))
        })
}

/// `2.27.3` → [2, 27, 3], to order versions as numbers.
fn version_key(v: &str) -> Vec<u64> {
    v.split('.').filter_map(|p| p.parse().ok()).collect()
}

/// What differs between nodes for one image reference, and images that carry both a pip and
/// a system NCCL (once per image and pair of libraries, naming the nodes). Pure.
pub fn differences<'a>(
    per_node: impl IntoIterator<Item = (&'a String, &'a ImagesNccl)>,
) -> Vec<String> {
    let per_node: Vec<(&String, &ImagesNccl)> = per_node.into_iter().collect();
    let mut out = Vec::new();
    let images: BTreeSet<&String> = per_node.iter().flat_map(|(_, m)| m.keys()).collect();
    for image in images {
        // Only the nodes that read it: one without the image is the image ID's difference, one
        // whose read failed says why on its own line.
        let read: Vec<(&String, &ImageNccl)> = per_node
            .iter()
            .filter_map(|(n, m)| Some((*n, m.get(image)?.as_ref().ok()?)))
            .collect();
        let summaries: Vec<(&String, String)> = read
            .iter()
            .map(|(n, i)| (*n, i.summary().unwrap_or_else(|| "none".into())))
            .collect();
        let distinct: BTreeSet<&String> = summaries.iter().map(|(_, s)| s).collect();
        if distinct.len() > 1 {
            let each: Vec<String> = summaries.iter().map(|(n, s)| format!("{n} {s}")).collect();
            out.push(format!(
                "NCCL in image {image} differs: {}",
                each.join(", ")
            ));
        }
        let mut both: BTreeMap<(&Library, &Library), Vec<&String>> = BTreeMap::new();
        for (n, i) in &read {
            if let Some(pair) = i.pip_and_system() {
                both.entry(pair).or_default().push(n);
            }
        }
        for ((pip, system), nodes) in both {
            out.push(format!(
                "image {image} carries two NCCL libraries ({}): {} at {} and the system's {} at {}; \
one process with both builds wedged serving after 20–26 min with `Watchdog caught collective \
operation timeout` (vLLM issue #42354), even at the same version: set VLLM_NCCL_SO_PATH to the \
one torch runs with, or use an image with one",
                nodes.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", "),
                match &pip.package {
                    Some(p) => format!("the pip wheel {p} {}", version_text(pip)),
                    None => format!("a pip wheel's {}", version_text(pip)),
                },
                pip.path,
                version_text(system),
                system.path,
            ));
        }
    }
    out
}

fn version_text(l: &Library) -> &str {
    l.version.as_deref().unwrap_or("(unknown version)")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIP: &str = "/usr/local/lib/python3.12/dist-packages";

    /// What the probe prints for `body`, between its first and last lines.
    fn probe(body: &[&str]) -> String {
        let mut out = vec![HEADER];
        out.extend(body);
        out.push(END);
        out.join("\n") + "\n"
    }

    /// vllm/vllm-openai as released: torch's wheel dependency `nvidia-nccl-cu12`, nothing of
    /// the system's, a warning torch prints on standard output.
    #[test]
    fn a_pip_wheel_only_gives_its_version_and_package() {
        let lib = format!("nccl-lib\t{PIP}/nvidia/nccl/lib/libnccl.so.2");
        let wheel = format!("nccl-wheel\t{PIP}/nvidia_nccl_cu12-2.27.3.dist-info\t2.27.3");
        let loaded = format!("nccl-loaded\t{PIP}/nvidia/nccl/lib/libnccl.so.2");
        let out = probe(&[
            &lib,
            &wheel,
            "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:63: FutureWarning",
            "nccl-torch\t2.27.3",
            &loaded,
        ]);
        let n = parse_probe(&out).unwrap();
        assert_eq!(
            n.libraries,
            [Library {
                path: format!("{PIP}/nvidia/nccl/lib/libnccl.so.2"),
                version: Some("2.27.3".into()),
                source: LibrarySource::PipWheel,
                package: Some("nvidia-nccl-cu12".into()),
            }]
        );
        assert_eq!(n.torch.as_deref(), Some("2.27.3"));
        assert_eq!(
            n.summary().as_deref(),
            Some("2.27.3 (pip wheel nvidia-nccl-cu12)")
        );
        assert_eq!(n.pip_and_system(), None);
    }

    /// An NGC-style image: the distribution's libnccl2 (a versioned file and its links), torch
    /// built against it.
    #[test]
    fn a_system_library_only_takes_its_version_from_the_file_name() {
        let out = probe(&[
            "nccl-lib\t/usr/lib/aarch64-linux-gnu/libnccl.so",
            "nccl-lib\t/usr/lib/aarch64-linux-gnu/libnccl.so.2.27.7",
            "nccl-lib\t/usr/lib/aarch64-linux-gnu/libnccl.so.2",
            "nccl-torch\t2.27.7",
        ]);
        let n = parse_probe(&out).unwrap();
        assert_eq!(
            n.summary().as_deref(),
            Some("2.27.7 (system, /usr/lib/aarch64-linux-gnu/libnccl.so.2)")
        );
        assert_eq!(n.libraries[0].source, LibrarySource::System);
    }

    #[test]
    fn a_pip_wheel_and_the_system_library_are_both_named_with_the_one_torch_runs() {
        let out = probe(&[
            "nccl-lib\t/usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3",
            "nccl-lib\t/usr/lib/x86_64-linux-gnu/libnccl.so.2",
            &format!("nccl-lib\t{PIP}/nvidia/nccl/lib/libnccl.so.2"),
            // METADATA unreadable: the folder's name has the version.
            &format!("nccl-wheel\t{PIP}/nvidia_nccl_cu12-2.27.3.dist-info\t"),
            "nccl-torch\t2.27.3",
            &format!("nccl-loaded\t{PIP}/nvidia/nccl/lib/libnccl.so.2"),
        ]);
        let n = parse_probe(&out).unwrap();
        let (pip, system) = n.pip_and_system().unwrap();
        assert_eq!(
            (pip.version.as_deref(), pip.package.as_deref()),
            (Some("2.27.3"), Some("nvidia-nccl-cu12"))
        );
        assert_eq!(system.path, "/usr/lib/x86_64-linux-gnu/libnccl.so.2");
        assert_eq!(
            n.summary().as_deref(),
            Some(&*format!(
                "2.27.3 (pip wheel nvidia-nccl-cu12) and 2.27.3 (system, /usr/lib/x86_64-linux-gnu/libnccl.so.2); \
torch runs 2.27.3 from {PIP}/nvidia/nccl/lib/libnccl.so.2"
            ))
        );
    }

    /// The script's own output, run by busybox `sh` in a root with a pip wheel (its `METADATA`
    /// written with CRLF), the system's versioned library and its links, and a `python3` that
    /// answers as torch does.
    #[test]
    fn the_scripts_own_output_parses() {
        let out = "nccl-probe 1\n\
nccl-lib\t/usr/lib/x86_64-linux-gnu/libnccl.so.2\n\
nccl-lib\t/usr/lib/x86_64-linux-gnu/libnccl.so\n\
nccl-lib\t/usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3\n\
nccl-wheel\t/usr/local/lib/python3.12/dist-packages/nvidia_nccl_cu12-2.27.3.dist-info\t2.27.3\r\n\
nccl-lib\t/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2\n\
nccl-torch\t2.27.3\n\
nccl-loaded\t/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2\n\
nccl-end\n";
        let n = parse_probe(out).unwrap();
        let (pip, system) = n.pip_and_system().unwrap();
        assert_eq!(pip.describe(), "2.27.3 (pip wheel nvidia-nccl-cu12)");
        assert_eq!(
            system.describe(),
            "2.27.3 (system, /usr/lib/x86_64-linux-gnu/libnccl.so.2)"
        );
    }

    /// The script is plain POSIX `sh` (a syntax check; nothing runs).
    #[test]
    fn the_script_is_sh() {
        let checked = std::process::Command::new("sh")
            .args(["-n", "-c", SCRIPT])
            .output()
            .unwrap();
        assert!(
            checked.status.success(),
            "{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }

    #[test]
    fn an_image_without_nccl_says_none_and_why_torch_did_not_answer() {
        let n = parse_probe(&probe(&["nccl-torch-error\tno python3"])).unwrap();
        assert!(n.libraries.is_empty());
        assert_eq!(n.summary(), None);
        assert_eq!(n.torch_error.as_deref(), Some("no python3"));
        // torch with NCCL linked in statically: its version is the only one there is.
        let n = parse_probe(&probe(&["nccl-torch\t2.18.3"])).unwrap();
        assert_eq!(n.summary().as_deref(), Some("torch runs 2.18.3"));
    }

    #[test]
    fn a_library_bundled_in_another_package_is_named_by_it() {
        let out =
            probe(&["nccl-lib\t/opt/venv/lib/python3.10/site-packages/torch/lib/libnccl.so.2"]);
        let n = parse_probe(&out).unwrap();
        assert_eq!(
            n.summary().as_deref(),
            Some("unknown version (pip wheel torch)")
        );
        // Where torch imports, its answer is the version.
        let n = parse_probe(&(out.replace(END, "nccl-torch\t2.5.6\n") + END)).unwrap();
        assert_eq!(n.summary().as_deref(), Some("2.5.6 (pip wheel torch)"));
    }

    #[test]
    fn garbage_is_an_error_naming_what_came_and_unknown_lines_are_skipped() {
        assert_eq!(parse_probe("").unwrap_err(), "the probe printed nothing");
        assert_eq!(
            parse_probe("\nexec /bin/sh: exec format error\n").unwrap_err(),
            "the image did not run the probe; it printed: exec /bin/sh: exec format error"
        );
        assert_eq!(
            parse_probe("nccl-probe 1\nnccl-lib\t/usr/lib/libnccl.so.2\n").unwrap_err(),
            "the probe stopped before its end"
        );
        let n = parse_probe(&probe(&[
            "nccl-lib\trelative/libnccl.so.2",
            "nccl-lib",
            "nccl-lib\t/a\tb",
            "nccl-torch\tnot a version",
            "nccl-wheel\t/x/site-packages/nvidia_nccl_cu12-garbage.dist-info\tv2",
            "\u{0}\u{1}binary",
        ]))
        .unwrap();
        assert_eq!(n, ImageNccl::default());
        assert!(parse_probe(&probe(&[])).unwrap().libraries.is_empty());
    }

    #[test]
    fn probe_names_are_docker_names_and_differ_for_references_that_clean_alike() {
        let a = probe_container_name("vllm/vllm-openai:v0.21.0");
        assert!(
            a.starts_with("sparkform-nccl-probe-vllm-vllm-openai-v0.21.0-"),
            "{a}"
        );
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')));
        assert_ne!(probe_container_name("a/b:c"), probe_container_name("a-b:c"));
    }

    fn read(summary_lines: &[&str]) -> ImagesNccl {
        [("vllm:x".to_string(), parse_probe(&probe(summary_lines)))].into()
    }

    #[test]
    fn flags_a_version_that_differs_between_nodes_and_an_image_with_both() {
        let pip = |v: &str| {
            vec![
                format!("nccl-lib\t{PIP}/nvidia/nccl/lib/libnccl.so.2"),
                format!("nccl-wheel\t{PIP}/nvidia_nccl_cu12-{v}.dist-info\t{v}"),
            ]
        };
        let lines = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join("\n");
        let (a, b) = ("node.a".to_string(), "node.b".to_string());
        let same = [
            (&a, read(&[&lines(&pip("2.27.3"))])),
            (&b, read(&[&lines(&pip("2.27.3"))])),
        ];
        assert!(differences(same.iter().map(|(n, m)| (*n, m))).is_empty());
        let differ = [
            (&a, read(&[&lines(&pip("2.27.3"))])),
            (&b, read(&[&lines(&pip("2.26.2"))])),
        ];
        assert_eq!(
            differences(differ.iter().map(|(n, m)| (*n, m))),
            ["NCCL in image vllm:x differs: node.a 2.27.3 (pip wheel nvidia-nccl-cu12), node.b 2.26.2 (pip wheel nvidia-nccl-cu12)"]
        );
        // A node whose read failed is not a difference: its own line says why.
        let failed: ImagesNccl = [("vllm:x".to_string(), Err("no sh".to_string()))].into();
        let one = [(&a, read(&[&lines(&pip("2.27.3"))])), (&b, failed)];
        assert!(differences(one.iter().map(|(n, m)| (*n, m))).is_empty());
        let mut both = pip("2.27.3");
        both.push("nccl-lib\t/usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3".into());
        let both = [(&a, read(&[&lines(&both)])), (&b, read(&[&lines(&both)]))];
        let d = differences(both.iter().map(|(n, m)| (*n, m)));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with(&format!(
                "image vllm:x carries two NCCL libraries (node.a, node.b): the pip wheel nvidia-nccl-cu12 2.27.3 at {PIP}/nvidia/nccl/lib/libnccl.so.2 and the system's 2.27.3 at /usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3;"
            )),
            "{d:?}"
        );
        assert!(
            d[0].contains("Watchdog caught collective operation timeout"),
            "{d:?}"
        );
    }
}

//! `sparkform fmt` as an operation: the .hcl files under the given paths, each formatted
//! (`crate::fmt`), rewritten atomically where asked and where it changed.

use std::path::{Path, PathBuf};

/// What `sparkform fmt` does.
pub struct FmtRequest {
    /// Files or folders.
    pub paths: Vec<PathBuf>,
    pub recursive: bool,
    /// Rewrite the files that change (`--check` does not).
    pub write: bool,
}

/// Why a file could not be formatted.
pub enum FmtFailure {
    Read(std::io::Error),
    /// It is not HCL that parses.
    Parse(crate::fmt::FormatError),
}

/// One file: as it was and as formatted, or why it could not be.
pub struct Formatted {
    pub path: PathBuf,
    pub outcome: Result<(String, String), FmtFailure>,
    /// Why a changed file could not be written.
    pub write_error: Option<String>,
}

impl Formatted {
    /// Whether its layout was not the canonical one.
    pub fn changed(&self) -> bool {
        matches!(&self.outcome, Ok((original, formatted)) if original != formatted)
    }
}

/// The files `req.paths` name, formatted, in path order; `Err` names a path that does not
/// exist.
pub fn fmt(req: &FmtRequest) -> Result<Vec<Formatted>, PathBuf> {
    let mut files = Vec::new();
    for root in &req.paths {
        if root.is_dir() {
            collect(root, req.recursive, &mut files);
        } else if root.is_file() {
            files.push(root.clone());
        } else {
            return Err(root.clone());
        }
    }
    files.sort();
    Ok(files
        .into_iter()
        .map(|f| format_file(f, req.write))
        .collect())
}

fn format_file(path: PathBuf, write: bool) -> Formatted {
    let outcome = std::fs::read_to_string(&path)
        .map_err(FmtFailure::Read)
        .and_then(|original| {
            crate::fmt::format_source(&original)
                .map(|formatted| (original, formatted))
                .map_err(FmtFailure::Parse)
        });
    let write_error = match &outcome {
        Ok((original, formatted)) if write && original != formatted => {
            write_atomic(&path, formatted).err().map(|e| e.to_string())
        }
        _ => None,
    };
    Formatted {
        path,
        outcome,
        write_error,
    }
}

fn collect(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let hidden = name.to_string_lossy().starts_with('.');
        if p.is_dir() && recursive && !hidden && name != "target" {
            collect(&p, recursive, out);
        } else if p.is_file() && p.extension().is_some_and(|x| x == "hcl") {
            out.push(p);
        }
    }
}

fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.fmt-{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    if let Ok(meta) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

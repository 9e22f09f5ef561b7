//! `sparkform fmt`: rewrite .hcl files in the canonical layout, keeping comments.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::fmt::{format_source, unified_diff};

/// Rewrite .hcl files in the canonical layout (comments kept)
#[derive(Args, Debug)]
#[command(
    long_about = "Normalise the layout of .hcl files: two-space indentation, aligned `=`, single blank \
lines, no trailing whitespace. Comments and string contents are kept exactly. With --check, change \
nothing: print the diff and exit 1 if any file is not formatted (for CI).",
    after_help = "Examples:\n  sparkform fmt examples/testbed\n  sparkform fmt --check -recursive .     # in CI"
)]
pub struct FmtArgs {
    /// Files or folders (default: the current folder)
    pub paths: Vec<PathBuf>,
    /// Change nothing; show the diff and exit 1 when a file needs formatting
    #[arg(long)]
    pub check: bool,
    /// Also print the diff when rewriting
    #[arg(long)]
    pub diff: bool,
    /// Descend into sub-folders
    #[arg(long)]
    pub recursive: bool,
}

pub fn run(args: FmtArgs) -> ExitCode {
    let roots = if args.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.paths.clone()
    };
    let mut files = Vec::new();
    for root in &roots {
        if root.is_dir() {
            collect(root, args.recursive, &mut files);
        } else if root.is_file() {
            files.push(root.clone());
        } else {
            eprintln!("Error: {} does not exist", root.display());
            return ExitCode::from(1);
        }
    }
    files.sort();
    let mut failed = false;
    let mut unformatted = 0usize;
    for file in &files {
        let shown = crate::diag::display_path(file);
        let original = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("Error: cannot read {shown}: {e}");
                failed = true;
                continue;
            }
        };
        let formatted = match format_source(&original) {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "{:?}",
                    miette::Report::new(e).wrap_err(format!("cannot format {shown}"))
                );
                failed = true;
                continue;
            }
        };
        if formatted == original {
            continue;
        }
        unformatted += 1;
        if args.check || args.diff {
            print!("{}", unified_diff(&shown, &original, &formatted));
        }
        if args.check {
            continue;
        }
        if let Err(e) = write_atomic(file, &formatted) {
            eprintln!("Error: cannot write {shown}: {e}");
            failed = true;
            continue;
        }
        println!("{shown}");
    }
    if failed || (args.check && unformatted > 0) {
        if args.check && unformatted > 0 {
            eprintln!(
                "{unformatted} file{} not formatted; run `sparkform fmt` to fix.",
                if unformatted == 1 { " is" } else { "s are" }
            );
        }
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
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

//! Reading a folder of `.hcl` files into syntax trees with spans.

use std::path::Path;
use std::sync::Arc;

use hcl_edit::structure::Body;

use crate::diag::{Diag, Diagnostics, SourceFile, Span};

/// The parsed files of one folder (the root configuration or one module).
#[derive(Debug, Clone)]
pub struct ModuleFiles {
    pub dir: std::path::PathBuf,
    pub files: Vec<(Arc<SourceFile>, Body)>,
}

/// Files bigger than this are refused: definitions are small, and a runaway file should not eat memory.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Parse every `*.hcl` file of `dir` (sorted by name, so errors come in a stable order).
pub fn read_folder(dir: &Path, diags: &mut Diagnostics) -> Option<ModuleFiles> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            diags.push(
                Diag::error(
                    "config::folder",
                    format!("cannot read the configuration folder {}: {e}", dir.display()),
                )
                .help("pass the folder that holds your .hcl files, e.g. `sparkform plan examples/testbed`"),
            );
            return None;
        }
    };
    let mut paths: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "hcl") && p.is_file())
        // The lock file beside the definitions is sparkform's record, not a definition.
        .filter(|p| p.file_name().is_none_or(|n| n != crate::lock_file::FILE))
        .collect();
    paths.sort();
    if paths.is_empty() {
        diags.push(
            Diag::error(
                "config::empty",
                format!("no .hcl files in {}", crate::diag::display_path(dir)),
            )
            .help("sparkform reads every *.hcl file of the folder it is given"),
        );
        return None;
    }
    let mut files = Vec::new();
    for path in paths {
        if let Some(parsed) = read_file(&path, diags) {
            files.push(parsed);
        }
    }
    Some(ModuleFiles {
        dir: dir.to_path_buf(),
        files,
    })
}

pub fn read_file(path: &Path, diags: &mut Diagnostics) -> Option<(Arc<SourceFile>, Body)> {
    let too_big = std::fs::metadata(path).is_ok_and(|m| m.len() > MAX_FILE_BYTES);
    if too_big {
        diags.push(Diag::error(
            "config::file",
            format!("{} is larger than 64 MiB", path.display()),
        ));
        return None;
    }
    let text = match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                let at = e.utf8_error().valid_up_to();
                // The lossy text has the same bytes up to the bad one, so the label lands on it.
                let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
                let file = Arc::new(SourceFile::new(path, lossy));
                let (line, col) = file.line_col(at);
                diags.push(
                    Diag::error(
                        "config::encoding",
                        format!(
                            "{} is not UTF-8 (invalid byte at line {line}, column {col})",
                            file.display
                        ),
                    )
                    .label(
                        &Span::new(&file, at..at + '\u{fffd}'.len_utf8()),
                        "not UTF-8",
                    )
                    .help("save the file as UTF-8"),
                );
                return None;
            }
        },
        Err(e) => {
            diags.push(Diag::error(
                "config::file",
                format!("cannot read {}: {e}", path.display()),
            ));
            return None;
        }
    };
    let text = match strip_bom(&text) {
        Some(rest) => rest.to_string(),
        None => text,
    };
    let file = Arc::new(SourceFile::new(path, text));
    parse_source(file, diags)
}

/// The text after a UTF-8 byte-order mark, if it starts with one. Editors on Windows save one;
/// it is not part of the HCL, and offsets after it are still right for line and column.
pub fn strip_bom(text: &str) -> Option<&str> {
    text.strip_prefix('\u{feff}')
}

pub fn parse_source(
    file: Arc<SourceFile>,
    diags: &mut Diagnostics,
) -> Option<(Arc<SourceFile>, Body)> {
    if refused_nesting(&file, diags) {
        return None;
    }
    match hcl_edit::parser::parse_body(&file.text) {
        Ok(body) => Some((file, body)),
        Err(e) => {
            diags.push(syntax_error(&file, &e));
            None
        }
    }
}

/// Whether `file` holds exactly one expression (`sparkform console`'s line); its syntax error
/// is reported against it.
pub fn is_one_expression(file: &Arc<SourceFile>, diags: &mut Diagnostics) -> bool {
    if refused_nesting(file, diags) {
        return false;
    }
    match hcl_edit::parser::parse_expr(&file.text) {
        Ok(_) => true,
        Err(e) => {
            diags.push(syntax_error(file, &e));
            false
        }
    }
}

/// hcl-edit's parser recurses per nesting level: absurd nesting is refused before it can
/// overflow the stack.
fn refused_nesting(file: &Arc<SourceFile>, diags: &mut Diagnostics) -> bool {
    let Some(offset) = too_deep(&file.text, 256) else {
        return false;
    };
    let span = Span::new(file, offset..offset + 1);
    diags.push(
        Diag::error(
            "config::syntax",
            "expressions are nested more than 256 levels deep",
        )
        .label(&span, "too deeply nested here"),
    );
    true
}

/// The parser's error as a diagnostic at its place in `file`.
fn syntax_error(file: &Arc<SourceFile>, e: &hcl_edit::parser::Error) -> Diag {
    let mut offset = e.location().offset().min(file.text.len());
    while !file.text.is_char_boundary(offset) {
        offset -= 1;
    }
    let end = file.text[offset..]
        .char_indices()
        .nth(1)
        .map_or(file.text.len(), |(i, _)| offset + i);
    let span = Span::new(file, offset..end.max(offset));
    let message = e.message().to_string();
    Diag::error(
        "config::syntax",
        format!("syntax error in {}: {message}", span.location()),
    )
    .label(&span, message)
    .help("check for an unclosed brace, bracket or quote just before this point")
}

/// The byte offset where bracket nesting first exceeds `limit`. Brackets inside strings count
/// too: templates nest expressions inside strings, and over-counting only refuses absurd input.
fn too_deep(text: &str, limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' | '[' | '(' => {
                depth += 1;
                if depth > limit {
                    return Some(i);
                }
            }
            '}' | ']' | ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_order_mark_is_accepted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("main.hcl");
        std::fs::write(&path, "\u{feff}node \"a\" {\n  address = \"x\"\n}\n").expect("write");
        let mut diags = Diagnostics::default();
        let (file, body) = read_file(&path, &mut diags).expect("parses");
        assert!(diags.0.is_empty());
        assert_eq!(body.iter().count(), 1);
        assert_eq!(
            file.line_col(file.text.find("address").unwrap_or(0)),
            (2, 3)
        );
        // Only at the start: elsewhere it is still a syntax error.
        std::fs::write(&path, "node \"a\" {\n\u{feff}}\n").expect("write");
        assert!(read_file(&path, &mut diags).is_none());
    }
}

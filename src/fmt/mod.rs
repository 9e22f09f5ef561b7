//! `sparkform fmt`: canonical layout for HCL source files, in the spirit of `terraform fmt`.
//!
//! The source is parsed with `hcl-edit` (which keeps every comment and whitespace run as
//! "decor") and printed again by a small layout engine that walks the syntax tree:
//!
//! * indentation is two spaces per open block / bracket level, where several brackets opened
//!   on the same line count as one level (as `terraform fmt` does);
//! * spacing between tokens is canonical (`key = value`, `[a, b]`, `{ a = 1 }`, `f(x, y)`,
//!   `a + b`, `c ? x : y`, `[for v in xs : v]`, `{ for k, v in m : k => v }`);
//! * every newline of the original is kept (runs of blank lines collapse to one, blank lines
//!   right after an opening or before a closing bracket are dropped), and every comment is
//!   kept at its place, re-indented;
//! * leaf tokens (strings, templates, heredocs, numbers) are copied byte for byte from the
//!   source;
//! * the `=` of consecutive single-line attributes (and object items) is aligned.
//!
//! As a safety net the output is parsed again and compared with the input's syntax tree
//! (ignoring layout); a mismatch is reported as an error instead of rewriting the file.

use hcl_edit::expr::{
    Array, Expression, ForExpr, FuncCall, Object, ObjectKey, ObjectValueAssignment,
    ObjectValueTerminator, TraversalOperator,
};
use hcl_edit::structure::{Attribute, Block, BlockLabel, Body, Structure};
use hcl_edit::{Decorate, Decorated, Ident, RawString, Span};
use std::borrow::Cow;

mod writer;

use writer::Writer;

/// Error returned by [`format_source`] when the input is not valid HCL.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{kind} at line {line}, column {column}: {message}")]
#[diagnostic(code(sparkform::fmt::parse_error))]
pub struct FormatError {
    /// The parser's message (e.g. `invalid expression; expected ...`).
    pub message: String,
    /// 1-based line of the error.
    pub line: usize,
    /// 1-based column of the error.
    pub column: usize,
    kind: &'static str,
    #[source_code]
    source_code: String,
    #[label("here")]
    span: miette::SourceSpan,
}

impl FormatError {
    fn parse(src: &str, err: &hcl_edit::parser::Error) -> Self {
        let loc = err.location();
        FormatError {
            message: err.message().to_string(),
            kind: "HCL parse error",
            line: loc.line(),
            column: loc.column(),
            source_code: src.to_string(),
            span: (loc.offset(), 0).into(),
        }
    }

    fn internal(src: &str, what: &str) -> Self {
        FormatError {
            message: format!("{what}; the file was left unchanged"),
            kind: "internal formatter error",
            line: 1,
            column: 1,
            source_code: src.to_string(),
            span: (0, 0).into(),
        }
    }
}

/// Normalise the layout of one HCL source file, keeping every comment.
pub fn format_source(src: &str) -> Result<String, FormatError> {
    // A byte-order mark is kept, as the editor that wrote it expects it back.
    if let Some(rest) = crate::config::strip_bom(src) {
        return format_source(rest).map(|out| format!("\u{feff}{out}"));
    }
    let body = hcl_edit::parser::parse_body(src).map_err(|e| FormatError::parse(src, &e))?;

    let out = std::panic::catch_unwind(|| {
        let mut w = Writer::new(src);
        w.body_items(&body);
        w.finish()
    })
    .map_err(|_| FormatError::internal(src, "panic while printing"))?;

    // Safety net: the output must parse to the same tree (layout aside).
    let reparsed = hcl_edit::parser::parse_body(&out)
        .map_err(|_| FormatError::internal(src, "output does not parse"))?;
    if !same_tree(body, reparsed) {
        return Err(FormatError::internal(src, "output differs in meaning"));
    }
    Ok(out)
}

/// A unified diff (3 lines context) between the original and formatted text, headed with the
/// file name, for `fmt --check`. Empty when both are equal.
pub fn unified_diff(path: &str, original: &str, formatted: &str) -> String {
    if original == formatted {
        return String::new();
    }
    similar::TextDiff::from_lines(original, formatted)
        .unified_diff()
        .context_radius(3)
        .header(&format!("old/{path}"), &format!("new/{path}"))
        .to_string()
}

/// Compares two syntax trees, ignoring layout (decor and the whitespace before closing
/// brackets, which `hcl-edit` keeps inside the tree).
fn same_tree(mut a: Body, mut b: Body) -> bool {
    use hcl_edit::visit_mut::{self, VisitMut};

    struct ClearTrailing;
    impl VisitMut for ClearTrailing {
        fn visit_array_mut(&mut self, node: &mut Array) {
            node.set_trailing("");
            visit_mut::visit_array_mut(self, node);
        }
        fn visit_object_mut(&mut self, node: &mut Object) {
            node.set_trailing("");
            visit_mut::visit_object_mut(self, node);
        }
        fn visit_func_args_mut(&mut self, node: &mut hcl_edit::expr::FuncArgs) {
            node.set_trailing("");
            visit_mut::visit_func_args_mut(self, node);
        }
    }
    ClearTrailing.visit_body_mut(&mut a);
    ClearTrailing.visit_body_mut(&mut b);
    a == b
}

// ---------------------------------------------------------------------------------------------
// Decor (whitespace and comments) tokens
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trivia<'a> {
    Newline,
    /// `# ...` or `// ...`, without the line ending.
    LineComment(&'a str),
    /// `/* ... */`, possibly spanning lines; also any unexpected non-blank text.
    BlockComment(&'a str),
}

fn trivia(raw: &str) -> Vec<Trivia<'_>> {
    let mut toks = Vec::new();
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        if c == '\n' {
            toks.push(Trivia::Newline);
            rest = &rest[1..];
        } else if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else if c == '#' || rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            toks.push(Trivia::LineComment(&rest[..end]));
            rest = &rest[end..];
        } else if rest.starts_with("/*") {
            let end = rest[2..].find("*/").map_or(rest.len(), |i| i + 4);
            toks.push(Trivia::BlockComment(&rest[..end]));
            rest = &rest[end..];
        } else {
            // Not expected in decor; keep it verbatim up to the next blank.
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            toks.push(Trivia::BlockComment(&rest[..end]));
            rest = &rest[end..];
        }
    }
    toks
}

fn has_comment(src: &str, raw: Option<&RawString>) -> bool {
    raw.is_some_and(|r| {
        trivia(raw_str(src, r))
            .iter()
            .any(|t| !matches!(t, Trivia::Newline))
    })
}

/// The text of a decor string.
///
/// `hcl-edit` 0.10 leaves a few decor strings as unresolved source spans after parsing (the
/// whitespace around binary operators and before `.`/`[` traversal operators), which then read
/// as empty. The span is only exposed through `Debug`, so it is recovered from there and the
/// text taken from the source.
fn raw_str<'a>(src: &'a str, raw: &'a RawString) -> &'a str {
    let text: &str = raw;
    if !text.is_empty() {
        return text;
    }
    let debug = format!("{raw:?}");
    let Some(range) = debug
        .strip_prefix("RawString(Spanned(")
        .and_then(|rest| rest.strip_suffix("))"))
    else {
        return "";
    };
    let Some((start, end)) = range.split_once("..") else {
        return "";
    };
    match (start.parse::<usize>(), end.parse::<usize>()) {
        (Ok(start), Ok(end)) => src.get(start..end).unwrap_or(""),
        _ => "",
    }
}

/// Removes trailing blanks from every line of a (multi-line) block comment.
fn tidy_block_comment(text: &str) -> Cow<'_, str> {
    if !text.contains('\n') {
        return Cow::Borrowed(text);
    }
    let lines: Vec<&str> = text.split('\n').map(str::trim_end).collect();
    Cow::Owned(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(src: &str) -> String {
        match format_source(src) {
            Ok(out) => out,
            Err(e) => panic!("format failed: {e}\n--- input ---\n{src}"),
        }
    }

    #[track_caller]
    fn check(src: &str, expected: &str) {
        let out = fmt(src);
        assert_eq!(
            out, expected,
            "\n--- got ---\n{out}\n--- want ---\n{expected}"
        );
        let again = fmt(&out);
        assert_eq!(again, out, "not idempotent");
    }

    const REALISTIC: &str = r#"# seed deployment
jump "proxmox" {
address = "10.1.230.180"
  user = "root"   # bastion
}
node "spark1" {
  address = "spark1"
  user       = "nvidia"
  jump = jump.proxmox
  gpus = 1
  memory_gib = 120
}
network "roce" {
  subnet = "192.168.200.0/24"
  mtu    = 9000


  attach "spark1" {
    node = node.spark1
    interface = "enp1s0f0np0"
    address = "192.168.200.1"
  }
}
module "qwen" {
  source = "../../modules/vllm-ray"
  extra_args = ["--enable-auto-tool-choice", "--reasoning-parser", "qwen3"]
  env = {
    A = "1"
      LONGER_NAME = "2"
  }
}
probe "hello" {
  http {
    via = node.spark1
    url = "${module.qwen.endpoint}/v1/chat/completions"
    json = {
      model = module.qwen.served_model_name
      messages = [{ role = "user", content = "Hello" }]
    }
  }
  timeout = "30m"
}
"#;

    const REALISTIC_FORMATTED: &str = r#"# seed deployment
jump "proxmox" {
  address = "10.1.230.180"
  user    = "root" # bastion
}
node "spark1" {
  address    = "spark1"
  user       = "nvidia"
  jump       = jump.proxmox
  gpus       = 1
  memory_gib = 120
}
network "roce" {
  subnet = "192.168.200.0/24"
  mtu    = 9000

  attach "spark1" {
    node      = node.spark1
    interface = "enp1s0f0np0"
    address   = "192.168.200.1"
  }
}
module "qwen" {
  source     = "../../modules/vllm-ray"
  extra_args = ["--enable-auto-tool-choice", "--reasoning-parser", "qwen3"]
  env = {
    A           = "1"
    LONGER_NAME = "2"
  }
}
probe "hello" {
  http {
    via = node.spark1
    url = "${module.qwen.endpoint}/v1/chat/completions"
    json = {
      model    = module.qwen.served_model_name
      messages = [{ role = "user", content = "Hello" }]
    }
  }
  timeout = "30m"
}
"#;

    #[test]
    fn realistic_file() {
        check(REALISTIC, REALISTIC_FORMATTED);
    }

    #[test]
    fn comments_of_all_styles_survive() {
        let src = "# hash leading\n// slash leading\n/* block leading */\na = 1 # hash trailing\nbb = 2 // slash trailing\nccc = 3 /* block trailing */\nblk {\n# inside\n  x = [\n 1, # one\n    // before two\n   2 /* two */,\n  ]\n  /* multi\n     line */\n}\n# end of file\n";
        let out = fmt(src);
        for comment in [
            "# hash leading",
            "// slash leading",
            "/* block leading */",
            "# hash trailing",
            "// slash trailing",
            "/* block trailing */",
            "# inside",
            "# one",
            "// before two",
            "/* two */",
            "/* multi\n     line */",
            "# end of file",
        ] {
            assert!(out.contains(comment), "lost {comment:?} in:\n{out}");
        }
        check(
            src,
            "# hash leading\n// slash leading\n/* block leading */\na   = 1 # hash trailing\nbb  = 2 // slash trailing\nccc = 3 /* block trailing */\nblk {\n  # inside\n  x = [\n    1, # one\n    // before two\n    2 /* two */,\n  ]\n  /* multi\n     line */\n}\n# end of file\n",
        );
    }

    #[test]
    fn comments_inside_expressions() {
        check(
            "a = { # obj\n  k = 1 # one\n  // next\n  kk = /* inline */ 2\n}\n",
            "a = { # obj\n  k = 1 # one\n  // next\n  kk = /* inline */ 2\n}\n",
        );
        // Around binary operators and traversal operators (decor hcl-edit leaves as spans).
        check(
            "a = (x # c\n  && /* d */ y)\nb = (var.list\n  # why\n  .attr)\n",
            "a = (x # c\n  && /* d */ y)\nb = (var.list\n  # why\n  .attr)\n",
        );
        check(
            "f = concat( # why\n[1], # first\n  [2]\n)\n",
            "f = concat( # why\n  [1], # first\n  [2]\n)\n",
        );
    }

    #[test]
    fn alignment_runs_reset_on_blank_line_block_and_multiline() {
        check(
            "a = 1\nlong_name = 2\n\nb = 3\nccc = 4\nblk {}\ndd = 5\ne = 6\nobj = {\n  x = 1\n}\nffff = 7\ng = 8\n",
            "a         = 1\nlong_name = 2\n\nb   = 3\nccc = 4\nblk {}\ndd = 5\ne  = 6\nobj = {\n  x = 1\n}\nffff = 7\ng    = 8\n",
        );
    }

    #[test]
    fn comment_line_starts_new_alignment_run() {
        check(
            "a = 1\nlonger = 2\n# note\nb = 3\n",
            "a      = 1\nlonger = 2\n# note\nb = 3\n",
        );
    }

    #[test]
    fn object_items_are_aligned() {
        check(
            "x = {\n  a = 1\n  bbb = 2\n\n  cc: 3\n  d = 4\n}\n",
            "x = {\n  a   = 1\n  bbb = 2\n\n  cc : 3\n  d  = 4\n}\n",
        );
    }

    #[test]
    fn nested_blocks_are_reindented() {
        check(
            "outer \"a\"   \"b\"{\n\tinner {\n\t\t  deep {\n   x=1\n\t\t}\n\t}\n     y =   2\n}\n",
            "outer \"a\" \"b\" {\n  inner {\n    deep {\n      x = 1\n    }\n  }\n  y = 2\n}\n",
        );
    }

    #[test]
    fn multiline_arrays_and_calls_are_reindented() {
        check(
            "a {\nlist = [\n\"x\",\n      \"y\",\n]\ncall = merge(\n{\nk = 1\n},\nvar.m,\n)\n}\n",
            "a {\n  list = [\n    \"x\",\n    \"y\",\n  ]\n  call = merge(\n    {\n      k = 1\n    },\n    var.m,\n  )\n}\n",
        );
        // Brackets opened on one line count once.
        check("x = [{\n      a = 1\n      }]\n", "x = [{\n  a = 1\n}]\n");
    }

    #[test]
    fn heredoc_is_untouched() {
        let src = "blk {\n      text = <<EOT\n   keep   \n\tthis   exactly  \nEOT\n  ind = <<-EOT\n\t\ttabs\n\t\t  more\n\t\tEOT\n}\n";
        let out = fmt(src);
        assert!(
            out.contains("<<EOT\n   keep   \n\tthis   exactly  \nEOT\n"),
            "{out}"
        );
        assert!(
            out.contains("<<-EOT\n\t\ttabs\n\t\t  more\n\t\tEOT\n"),
            "{out}"
        );
        assert!(out.starts_with("blk {\n  text = <<EOT"), "{out}");
        assert_eq!(fmt(&out), out);
    }

    #[test]
    fn heredoc_in_call_and_object() {
        check(
            "x = yamldecode(<<EOT\na: 1\nEOT\n)\ny = {\nk = <<EOT\n  z\nEOT\n}\n",
            "x = yamldecode(<<EOT\na: 1\nEOT\n)\ny = {\n  k = <<EOT\n  z\nEOT\n}\n",
        );
    }

    #[test]
    fn blank_lines_are_collapsed() {
        check(
            "\n\n\na = 1\n\n\n\nb = 2\nblk {\n\n\n  c = 3\n\n\n}\n\n\n",
            "a = 1\n\nb = 2\nblk {\n  c = 3\n}\n",
        );
        check(
            "o = {\n\n  a = 1\n\n\n\n  b = 2\n\n}\nl = [\n\n  1,\n\n]\n",
            "o = {\n  a = 1\n\n  b = 2\n}\nl = [\n  1,\n]\n",
        );
    }

    #[test]
    fn trailing_whitespace_and_final_newline() {
        check("a = 1   \t\nb = 2", "a = 1\nb = 2\n");
        check("", "");
        check("\n\n  \n", "");
        check("# only a comment   ", "# only a comment\n");
    }

    #[test]
    fn block_headers_and_empty_blocks() {
        check("x   \"a\"    {\n}\n", "x \"a\" {}\n");
        check("x \"a\" {   }\n", "x \"a\" {}\n");
        check("x   lbl {   y=1 }\n", "x lbl { y = 1 }\n");
        check("x { # why\n}\n", "x { # why\n}\n");
    }

    #[test]
    fn expressions_get_canonical_spacing() {
        check(
            "a = [1,2 ,3]\nb = {x=1,y=2}\nc = f( 1 ,2 )\nd = var.a?1:2\ne = (1+2)*3\nf = [for v in var.l: upper(v) if v!=\"\"]\ng = {for k,v in var.m: k=>v...}\nh = !var.x\ni = -1\nj = var.a[0].b[*].c\nk = provider::ns::fn(1)\n",
            "a = [1, 2, 3]\nb = { x = 1, y = 2 }\nc = f(1, 2)\nd = var.a ? 1 : 2\ne = (1 + 2) * 3\nf = [for v in var.l : upper(v) if v != \"\"]\ng = { for k, v in var.m : k => v... }\nh = !var.x\ni = -1\nj = var.a[0].b[*].c\nk = provider::ns::fn(1)\n",
        );
    }

    #[test]
    fn strings_are_kept_verbatim() {
        check(
            "a = \"\\u00e9 ${var.x} %{if true}y%{endif}\"\nb = 1.50\n",
            "a = \"\\u00e9 ${var.x} %{if true}y%{endif}\"\nb = 1.50\n",
        );
    }

    #[test]
    fn parse_error_reports_line_and_column() {
        let err = match format_source("a = 1\nb = = 2\n") {
            Err(e) => e,
            Ok(out) => panic!("expected an error, got {out:?}"),
        };
        assert_eq!(err.line, 2);
        assert_eq!(err.column, 5);
        assert!(!err.message.is_empty());
        assert!(err.to_string().contains("line 2, column 5"), "{err}");

        let err = match format_source("blk {\n  x = 1\n") {
            Err(e) => e,
            Ok(out) => panic!("expected an error, got {out:?}"),
        };
        assert_eq!(err.line, 2);
    }

    #[test]
    fn diff_is_headed_with_path() {
        let diff = unified_diff("deploy.hcl", "a=1\nb = 2\n", "a = 1\nb = 2\n");
        assert!(
            diff.starts_with("--- old/deploy.hcl\n+++ new/deploy.hcl\n"),
            "{diff}"
        );
        assert!(diff.contains("-a=1\n+a = 1\n"), "{diff}");
        assert!(unified_diff("x.hcl", "a\n", "a\n").is_empty());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn ws() -> impl Strategy<Value = String> {
            prop::sample::select(vec!["", " ", "  ", "\t", "   "]).prop_map(str::to_string)
        }

        fn key() -> impl Strategy<Value = String> {
            "[a-z][a-z0-9_]{0,8}"
        }

        fn leaf() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u32..100000).prop_map(|n| n.to_string()),
                "[a-z ]{0,6}".prop_map(|s| format!("\"{s}\"")),
                Just("true".to_string()),
                Just("null".to_string()),
                key().prop_map(|k| format!("var.{k}")),
                Just("\"${var.x}-y\"".to_string()),
            ]
        }

        fn value() -> impl Strategy<Value = String> {
            leaf().prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    (
                        prop::collection::vec((inner.clone(), comment(), blank()), 0..4),
                        ws(),
                        any::<bool>()
                    )
                        .prop_map(|(items, sp, multiline)| {
                            if multiline {
                                let body: String = items
                                    .iter()
                                    .map(|(i, c, b)| format!("{b}\n{sp}{i},{c}"))
                                    .collect();
                                format!("[{body}\n]")
                            } else {
                                let items: Vec<&str> =
                                    items.iter().map(|(i, _, _)| i.as_str()).collect();
                                format!("[{}]", items.join(&format!(",{sp}")))
                            }
                        }),
                    (
                        prop::collection::btree_map(
                            key(),
                            (inner.clone(), comment(), blank()),
                            0..4
                        ),
                        ws(),
                        any::<bool>()
                    )
                        .prop_map(|(items, sp, multiline)| {
                            if multiline {
                                let body: String = items
                                    .iter()
                                    .map(|(k, (v, c, b))| format!("{b}\n{sp}{k}{sp}={sp}{v}{c}"))
                                    .collect();
                                format!("{{{body}\n}}")
                            } else {
                                let body: Vec<String> = items
                                    .iter()
                                    .map(|(k, (v, _, _))| format!("{k} = {v}"))
                                    .collect();
                                format!("{{{}}}", body.join(", "))
                            }
                        }),
                    (key(), prop::collection::vec(inner.clone(), 0..3))
                        .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
                    (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} +\n {b})")),
                    (inner.clone(), inner.clone(), inner.clone())
                        .prop_map(|(a, b, c)| format!("{a} ? {b} : {c}")),
                    inner.clone().prop_map(|a| format!("[for x in {a} : x]")),
                    (inner.clone(), ws()).prop_map(|(a, sp)| {
                        format!("{{{sp}for k,{sp}v in {a}{sp}:\n{sp}k => v...}}")
                    }),
                ]
            })
        }

        fn blank() -> impl Strategy<Value = String> {
            prop::sample::select(vec!["", "", "\n", "\n\n"]).prop_map(str::to_string)
        }

        fn comment() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "[a-z ]{0,8}".prop_map(|c| format!(" # {c}")),
                "[a-z ]{0,8}".prop_map(|c| format!(" // {c}")),
                "[a-z ]{0,8}".prop_map(|c| format!(" /* {c} */")),
            ]
        }

        fn line() -> impl Strategy<Value = String> {
            prop_oneof![
                (ws(), key(), ws(), value(), comment())
                    .prop_map(|(a, k, b, v, c)| format!("{a}{k}{b}={b}{v}{c}")),
                (ws(), "[a-z ]{0,8}").prop_map(|(a, c)| format!("{a}# {c}")),
                Just(String::new()),
                (ws(), key(), "[a-z]{1,5}").prop_map(|(a, k, l)| format!("{a}{k} \"{l}\" {{}}")),
                Just("  heredoc_x = <<EOT\n  keep  me \nEOT".to_string()),
            ]
        }

        /// Bodies whose attribute keys are unique (duplicates are a parse error).
        fn body(depth: u32) -> BoxedStrategy<String> {
            let lines = prop::collection::vec(line(), 0..6);
            if depth == 0 {
                return lines.prop_map(|l| dedup(&l).join("\n")).boxed();
            }
            (
                lines,
                prop::collection::vec((key(), ws(), body(depth - 1)), 0..3),
            )
                .prop_map(|(lines, blocks)| {
                    let mut out = dedup(&lines);
                    for (name, sp, inner) in blocks {
                        out.push(format!("{sp}{name} \"l\" {{\n{inner}\n{sp}}}"));
                    }
                    out.join("\n")
                })
                .boxed()
        }

        fn dedup(lines: &[String]) -> Vec<String> {
            let mut seen = std::collections::HashSet::new();
            lines
                .iter()
                .filter(|l| {
                    let t = l.trim_start();
                    match t.find('=') {
                        Some(i) if !t.starts_with('#') && !t[..i].contains(['"', '{']) => {
                            seen.insert(t[..i].trim().to_string())
                        }
                        _ => true,
                    }
                })
                .cloned()
                .collect()
        }

        /// Anything the parser accepts must format, and formatting must be idempotent.
        fn check_accepted(src: &str) -> Result<(), TestCaseError> {
            let parsed = hcl_edit::parser::parse_body(src).is_ok();
            match format_source(src) {
                Ok(once) => {
                    let twice = format_source(&once);
                    prop_assert!(twice.is_ok(), "output does not format: {:?}", once);
                    prop_assert_eq!(twice.unwrap_or_default(), once);
                }
                Err(e) => prop_assert!(!parsed, "valid input {:?} rejected: {}", src, e),
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn never_panics_on_printable_input(src in "[ -~\t\n]{0,200}") {
                check_accepted(&src)?;
            }

            #[test]
            fn never_panics_on_hcl_like_noise(
                src in prop::collection::vec(
                    prop::sample::select(vec![
                        "a", "b", "=", " ", "\n", "{", "}", "[", "]", "(", ")", ",", "\"",
                        "x\"", "#", "//", "/*", "*/", "<<EOT\n", "EOT", "${", "1", ".", ":",
                        "?", "for", "in", "=>", "\t",
                    ]),
                    0..60,
                ).prop_map(|parts| parts.concat())
            ) {
                check_accepted(&src)?;
            }

            #[test]
            fn mutated_valid_input(
                src in body(2),
                edits in prop::collection::vec(
                    (
                        any::<prop::sample::Index>(),
                        prop::sample::select(vec![
                            " ", "\n", "\n\n", "\t", "# c\n", "// c\n", "/* c */", "/*\n*/",
                            ",", "(", ")", "[", "]", "{", "}", "=", "1", "x", ".", "\r\n", "",
                        ]),
                        any::<bool>(),
                    ),
                    1..4,
                )
            ) {
                let mut text = src.clone();
                for (at, token, delete) in edits {
                    let positions: Vec<usize> =
                        (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
                    let pos = positions[at.index(positions.len())];
                    if delete && pos < text.len() {
                        text.remove(pos);
                    } else {
                        text.insert_str(pos, token);
                    }
                }
                check_accepted(&text)?;
            }

            #[test]
            fn formatting_valid_input_is_idempotent(src in body(2)) {
                let once = format_source(&src);
                prop_assert!(once.is_ok(), "failed on valid input {:?}: {:?}", src, once.err());
                let once = once.unwrap_or_default();
                let twice = format_source(&once);
                prop_assert!(twice.is_ok(), "output does not parse: {:?}", once);
                prop_assert_eq!(twice.unwrap_or_default(), once);
            }
        }
    }
}

//! Configuration diagnostics: every error found in one run, each with its file, span, label and hint.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use miette::{Diagnostic, LabeledSpan, NamedSource, Severity, SourceCode};

/// One loaded configuration file. Shared by every diagnostic that points into it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: PathBuf,
    /// The path as shown to the user (relative to where sparkform was started when possible).
    pub display: String,
    pub text: Arc<str>,
    /// What miette reads labelled lines from; shares `text`.
    pub named: NamedSource<Arc<str>>,
}

impl SourceFile {
    pub fn new(path: &Path, text: String) -> Self {
        let display = display_path(path);
        let text: Arc<str> = Arc::from(text);
        SourceFile {
            path: path.to_path_buf(),
            named: NamedSource::new(&display, text.clone()),
            display,
            text,
        }
    }

    /// 1-based line and column of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = char_boundary(&self.text, offset);
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let col = before
            .rfind('\n')
            .map_or(before.chars().count(), |i| before[i + 1..].chars().count())
            + 1;
        (line, col)
    }
}

/// The largest char boundary at or before `offset` (offsets from parsers may land anywhere).
fn char_boundary(text: &str, offset: usize) -> usize {
    let mut o = offset.min(text.len());
    while !text.is_char_boundary(o) {
        o -= 1;
    }
    o
}

pub fn display_path(path: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = path.strip_prefix(&cwd) {
            return rel.display().to_string();
        }
    }
    path.display().to_string()
}

/// A place in a configuration file.
#[derive(Debug, Clone)]
pub struct Span {
    pub file: Arc<SourceFile>,
    pub range: Range<usize>,
}

impl Span {
    pub fn new(file: &Arc<SourceFile>, range: Range<usize>) -> Self {
        let start = char_boundary(&file.text, range.start);
        let end = char_boundary(&file.text, range.end.max(start));
        Span {
            file: file.clone(),
            range: start..end,
        }
    }

    pub fn location(&self) -> String {
        let (line, col) = self.file.line_col(self.range.start);
        format!("{}:{}:{}", self.file.display, line, col)
    }
}

/// One error or warning about the configuration.
#[derive(Debug, Clone)]
pub struct Diag {
    pub code: &'static str,
    pub severity: Severity,
    pub message: String,
    pub help: Option<String>,
    /// The file the labels point into; `None` for errors with no place (e.g. a missing folder).
    pub source: Option<Arc<SourceFile>>,
    pub labels: Vec<(Range<usize>, String)>,
    /// Notes that point into other files (e.g. the other half of a duplicate or a cycle).
    pub related: Vec<Diag>,
}

impl Diag {
    pub fn error(code: &'static str, message: impl Into<String>) -> Self {
        Diag {
            code,
            severity: Severity::Error,
            message: message.into(),
            help: None,
            source: None,
            labels: Vec::new(),
            related: Vec::new(),
        }
    }

    pub fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Diag {
            severity: Severity::Warning,
            ..Diag::error(code, message)
        }
    }

    /// Add a labelled span. Labels in another file than the first become related notes, since a
    /// miette report shows one source.
    pub fn label(mut self, span: &Span, text: impl Into<String>) -> Self {
        let text = text.into();
        match &self.source {
            None => {
                self.source = Some(span.file.clone());
                self.labels.push((span.range.clone(), text));
            }
            Some(file) if Arc::ptr_eq(file, &span.file) || file.path == span.file.path => {
                self.labels.push((span.range.clone(), text));
            }
            Some(_) => {
                let mut note = Diag::error(self.code, format!("{} (continued)", self.message));
                note.severity = Severity::Advice;
                note.source = Some(span.file.clone());
                note.labels.push((span.range.clone(), text));
                self.related.push(note);
            }
        }
        self
    }

    pub fn maybe_label(self, span: Option<&Span>, text: impl Into<String>) -> Self {
        match span {
            Some(span) => self.label(span, text),
            None => self,
        }
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `file:line:col` of the first label, for one-line renderings.
    pub fn location(&self) -> Option<String> {
        let file = self.source.as_ref()?;
        let (range, _) = self.labels.first()?;
        let (line, col) = file.line_col(range.start);
        Some(format!("{}:{}:{}", file.display, line, col))
    }
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Diag {}

impl Diagnostic for Diag {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.code))
    }
    fn severity(&self) -> Option<Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h.as_str()) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.source.as_ref().map(|f| &f.named as &dyn SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            return None;
        }
        Some(Box::new(self.labels.iter().enumerate().map(
            |(i, (r, t))| {
                let span = (r.start, r.end - r.start);
                if i == 0 {
                    LabeledSpan::new_primary_with_span(Some(t.clone()), span)
                } else {
                    LabeledSpan::new_with_span(Some(t.clone()), span)
                }
            },
        )))
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(self.related.iter().map(|d| d as &dyn Diagnostic)))
    }
}

/// Every diagnostic of one run. An `Err` of this type means at least one is an error.
#[derive(Debug, Default, Clone)]
pub struct Diagnostics(pub Vec<Diag>);

impl Diagnostics {
    pub fn push(&mut self, d: Diag) {
        self.0.push(d);
    }
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(Diag::is_error)
    }
    pub fn error_count(&self) -> usize {
        self.0.iter().filter(|d| d.is_error()).count()
    }
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }
    /// Sorted by file and position so output is stable whatever order checks ran in.
    pub fn sort(&mut self) {
        self.0.sort_by(|a, b| {
            let key = |d: &Diag| {
                (
                    d.source.as_ref().map(|s| s.display.clone()),
                    d.labels.first().map(|l| l.0.start),
                )
            };
            key(a).cmp(&key(b))
        });
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.error_count();
        write!(
            f,
            "{} error{} in the configuration",
            n,
            if n == 1 { "" } else { "s" }
        )
    }
}

impl std::error::Error for Diagnostics {}

/// Render diagnostics without colour or unicode art, for snapshots and non-terminals.
pub fn render_plain(diags: &[Diag]) -> String {
    let handler =
        miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
            .with_width(100)
            .with_links(false);
    let mut out = String::new();
    for d in diags {
        if handler.render_report(&mut out, d).is_err() {
            out.push_str(&d.message);
        }
        out.push('\n');
    }
    out
}

/// Render for a terminal (colour when stderr is a TTY).
pub fn render_for_terminal(diags: &[Diag]) -> String {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return render_plain(diags);
    }
    let handler = miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode())
        .with_width(110);
    let mut out = String::new();
    for d in diags {
        if handler.render_report(&mut out, d).is_err() {
            out.push_str(&d.message);
        }
        out.push('\n');
    }
    out
}

/// "did you mean" over a set of candidates.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let mut best: Option<(f64, &str)> = None;
    for c in candidates {
        let score = strsim::jaro_winkler(name, c);
        if score > 0.8 && best.is_none_or(|(s, _)| score > s) {
            best = Some((score, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}

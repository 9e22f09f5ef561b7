//! Configuration diagnostics: every error found in one run, each with its file, span, label and hint.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use miette::{
    Diagnostic, LabeledSpan, MietteError, MietteSpanContents, Severity, SourceCode, SourceSpan,
    SpanContents,
};

/// One loaded configuration file. Shared by every diagnostic that points into it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: PathBuf,
    /// The path as shown to the user (relative to where sparkform was started when possible).
    pub display: String,
    pub text: Arc<str>,
    /// Byte offsets where lines start, computed on first use.
    line_starts: std::sync::OnceLock<Vec<usize>>,
}

impl SourceFile {
    pub fn new(path: &Path, text: String) -> Self {
        let display = display_path(path);
        SourceFile {
            path: path.to_path_buf(),
            display,
            text: Arc::from(text),
            line_starts: std::sync::OnceLock::new(),
        }
    }

    fn line_starts(&self) -> &[usize] {
        self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(self.text.match_indices('\n').map(|(i, _)| i + 1))
                .collect()
        })
    }

    /// 0-based line of a byte offset.
    fn line_of(&self, offset: usize) -> usize {
        let starts = self.line_starts();
        starts.partition_point(|&s| s <= offset).saturating_sub(1)
    }

    /// Byte range of 0-based line `line`, without its line break.
    fn line_range(&self, line: usize) -> Range<usize> {
        let starts = self.line_starts();
        let start = starts.get(line).copied().unwrap_or(self.text.len());
        let mut end = starts
            .get(line + 1)
            .map_or(self.text.len(), |next| next - 1);
        if self.text[start..end].ends_with('\r') {
            end -= 1;
        }
        start..end
    }

    /// 1-based line and column of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = char_boundary(&self.text, offset);
        let line = self.line_of(offset);
        let start = self.line_starts().get(line).copied().unwrap_or(0);
        (line + 1, self.text[start..offset].chars().count() + 1)
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
            message: clean(&message.into(), MAX_MESSAGE),
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
        let text = clean(&text.into(), MAX_LABEL);
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
        self.help = Some(clean(&help.into(), MAX_MESSAGE));
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

/// Without its source: a `Diag` is shown through [`render_plain`] or [`render_for_terminal`],
/// which give miette a bounded, escaped window of the file instead of the file itself.
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
}

/// A `Diag` as miette renders it: labels point into a [`Snippet`].
struct Rendered<'d> {
    diag: &'d Diag,
    snippet: Option<Snippet>,
    labels: Vec<LabeledSpan>,
    related: Vec<Rendered<'d>>,
}

impl<'d> Rendered<'d> {
    fn new(diag: &'d Diag) -> Self {
        let (snippet, labels) = match &diag.source {
            Some(file) if !diag.labels.is_empty() => {
                let (snippet, ranges) = Snippet::build(file, &diag.labels);
                let labels = ranges
                    .into_iter()
                    .zip(&diag.labels)
                    .enumerate()
                    .map(|(i, (r, (_, text)))| {
                        let span = (r.start, r.end - r.start);
                        if i == 0 {
                            LabeledSpan::new_primary_with_span(Some(text.clone()), span)
                        } else {
                            LabeledSpan::new_with_span(Some(text.clone()), span)
                        }
                    })
                    .collect();
                (Some(snippet), labels)
            }
            _ => (None, Vec::new()),
        };
        Rendered {
            diag,
            snippet,
            labels,
            related: diag.related.iter().map(Rendered::new).collect(),
        }
    }
}

impl fmt::Debug for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.diag, f)
    }
}

impl fmt::Display for Rendered<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl std::error::Error for Rendered<'_> {}

impl Diagnostic for Rendered<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diag.code()
    }
    fn severity(&self) -> Option<Severity> {
        Some(self.diag.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Diagnostic::help(self.diag)
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.snippet.as_ref().map(|s| s as &dyn SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            return None;
        }
        Some(Box::new(self.labels.iter().cloned()))
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(self.related.iter().map(|d| d as &dyn Diagnostic)))
    }
}

/// Longest message or help kept, in characters; longer ones end with a note of what was cut.
const MAX_MESSAGE: usize = 2000;
/// Longest label kept.
const MAX_LABEL: usize = 300;
/// Characters of one source line shown around a label.
const WINDOW: usize = 160;
/// Characters shown before the first label of a long line.
const LEAD: usize = 40;
/// Labels whose excerpts miette would join (its rule, see `Snippet::build`) share one excerpt
/// with the lines between them, unless more than this many lines lie between.
const MAX_GAP: usize = 20;
/// A label over more lines than this is shown on its first line only.
const MAX_LABEL_LINES: usize = 10;

/// Whether `c` is shown escaped: control characters (terminal escapes, carriage returns) and
/// the invisible characters that make text read differently from what it is (bidi overrides,
/// zero-width characters).
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{61c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

fn push_escaped(out: &mut String, c: char) {
    use fmt::Write as _;
    if hidden(c) {
        let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
    } else {
        out.push(c);
    }
}

/// Longest quoted value kept inside a message, in characters.
const MAX_QUOTED: usize = 60;

thread_local! {
    // Beginnings of the files `file()` read (as messages quote them), with the path shown.
    // Messages are built on the thread that evaluates.
    static FILE_STARTS: std::cell::RefCell<Vec<(String, String)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// What a message says where a value derived from a sensitive variable would be.
pub const SENSITIVE_VALUE: &str = crate::secrets::HIDDEN;

thread_local! {
    // The sensitive values of the load running on this thread, as they can appear in a message
    // (`secrets::Secrets`, the one scrubber): the load hands them on in `Config::secrets`.
    static SECRETS: std::cell::RefCell<crate::secrets::Secrets> =
        std::cell::RefCell::new(crate::secrets::Secrets::default());
}

/// Remember a sensitive value's text, so that no message, label, help or snippet built on this
/// thread shows it: the backstop behind the evaluator's taint, which gives messages about
/// sensitive expressions generic text.
pub fn note_secret(text: &str) {
    SECRETS.with(|s| s.borrow_mut().add(text));
}

/// Forget the sensitive values remembered on this thread (the start of a load).
pub fn forget_secrets() {
    SECRETS.with(|s| *s.borrow_mut() = crate::secrets::Secrets::default());
}

/// The sensitive values remembered on this thread: what the load hands on, so that what a run
/// shows later, on any thread, is scrubbed of the same values.
pub fn noted_secrets() -> crate::secrets::Secrets {
    SECRETS.with(|s| s.borrow().clone())
}

/// `s` with every remembered sensitive value replaced by [`SENSITIVE_VALUE`].
pub fn scrub(s: &str) -> std::borrow::Cow<'_, str> {
    SECRETS.with(|secrets| secrets.borrow().scrub(s))
}

/// Byte ranges of `text` that hold a remembered sensitive value, for masking source lines.
fn secret_ranges(text: &str) -> Vec<Range<usize>> {
    SECRETS.with(|secrets| secrets.borrow().ranges(text))
}

/// Shortest file content that [`note_file_contents`] remembers: shorter ones say too little to
/// tell a file from any other value.
const MIN_FILE_START: usize = 8;

/// Remember that a file with `text` was read, so that a message quoting a value that starts
/// like it names the file instead of echoing its contents.
pub fn note_file_contents(shown_path: &str, text: &str) {
    if text.chars().count() < MIN_FILE_START {
        return;
    }
    let start: String = text.chars().take(24).collect();
    let debug = format!("{start:?}");
    let escaped = debug[1..debug.len() - 1].to_string();
    FILE_STARTS.with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < 1000 && !f.iter().any(|(s, _)| *s == escaped) {
            f.push((escaped, shown_path.to_string()));
        }
    });
}

fn file_quoted(inner: &str) -> Option<String> {
    FILE_STARTS.with(|f| {
        f.borrow()
            .iter()
            .find(|(start, _)| inner.starts_with(start.as_str()))
            .map(|(_, path)| format!("(the contents of file {path:?})"))
    })
}

/// `s` with each quoted part (`"…"`) longer than [`MAX_QUOTED`] characters cut, and one that
/// starts like a file `file()` read replaced by the file's name: messages quote values, and a
/// value can be a whole file or megabytes built by an expression.
fn clip_quoted(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains('"') {
        return s.into();
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        let body = &rest[open + 1..];
        // The closing quote: the first one not escaped by a backslash.
        let mut close = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    close = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(close) = close else {
            rest = body;
            break;
        };
        let inner = &body[..close];
        if let Some(file) = file_quoted(inner) {
            out.pop();
            out.push_str(&file);
            rest = &body[close + 1..];
            continue;
        }
        if inner.chars().count() > MAX_QUOTED {
            out.extend(inner.chars().take(MAX_QUOTED));
            out.push('…');
        } else {
            out.push_str(inner);
        }
        out.push('"');
        rest = &body[close + 1..];
    }
    out.push_str(rest);
    out.into()
}

/// `s` with long quoted values cut, hidden characters escaped (`\u{1b}`), cut to `max`
/// characters.
pub fn clean(s: &str, max: usize) -> String {
    // Secrets go first: cutting a quoted value could leave a prefix no longer matching.
    let s = scrub(s);
    let s = clip_quoted(&s);
    let mut out = String::with_capacity(s.len().min(max + 16));
    for (n, (i, c)) in s.char_indices().enumerate() {
        if n == max {
            let _ = fmt::Write::write_fmt(&mut out, format_args!("… ({} more bytes)", s.len() - i));
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// `s` cut to `max` characters with `…`, hidden characters escaped: for values and source text
/// quoted inside messages.
pub fn clip(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// The lines a diagnostic shows, each cut to a window around its labels and escaped, so that a
/// long line, a huge file or terminal escapes in the source cannot reach the renderer.
struct Snippet {
    name: String,
    text: String,
    /// Per snippet line: its byte offset in `text`, its 0-based line in the file and the last
    /// file line of the excerpt it belongs to.
    lines: Vec<(usize, usize, usize)>,
    /// The primary label in snippet offsets, with its true 0-based line and column.
    primary: Option<(Range<usize>, usize, usize)>,
}

impl Snippet {
    /// The snippet and each label's range in it.
    fn build(file: &SourceFile, labels: &[(Range<usize>, String)]) -> (Snippet, Vec<Range<usize>>) {
        let text = &*file.text;
        // The empty "line" after a final line break is not shown.
        let last_line = file.line_of(text.len()) - usize::from(text.ends_with('\n'));
        // Each label's lines, a long label cut to its first line.
        let mut spans: Vec<Range<usize>> = Vec::new();
        let mut intervals: Vec<(usize, usize)> = Vec::new();
        for (r, _) in labels {
            let start = char_boundary(text, r.start);
            let mut end = char_boundary(text, r.end.max(start));
            let l0 = file.line_of(start);
            let l1 = file.line_of(end.saturating_sub(1).max(start));
            if l1 - l0 > MAX_LABEL_LINES {
                end = file.line_range(l0).end.max(start);
            }
            let l1 = file.line_of(end.saturating_sub(1).max(start)).max(l0);
            spans.push(start..end);
            intervals.push((l0.saturating_sub(1), (l1 + 1).min(last_line)));
        }
        intervals.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (a, b) in intervals {
            match merged.last_mut() {
                // miette joins the next excerpt when `first line + lines read` reaches it,
                // where `lines read` counts from the top of the file.
                Some(last) if a <= last.0 + last.1 + 1 && a <= last.1 + 1 + MAX_GAP => {
                    last.1 = last.1.max(b);
                }
                _ => merged.push((a, b)),
            }
        }
        let mut out = String::new();
        let mut lines = Vec::new();
        let mut mapped: Vec<(Option<usize>, Option<usize>)> = vec![(None, None); spans.len()];
        for (a, b) in merged {
            for line in a..=b {
                lines.push((out.len(), line, b));
                let lr = file.line_range(line);
                let content = &text[lr.clone()];
                // Where the window starts: a little before the first label on this line.
                let first_col = spans
                    .iter()
                    .filter(|s| s.start >= lr.start && s.start <= lr.end)
                    .map(|s| text[lr.start..s.start].chars().count())
                    .min()
                    .unwrap_or(0);
                let total = content.chars().count();
                let from = if total <= WINDOW {
                    0
                } else {
                    first_col.saturating_sub(LEAD)
                };
                let line_start = out.len();
                if from > 0 {
                    out.push('…');
                }
                let mut shown = 0usize;
                let mut cut_at = None;
                // A sensitive value written in the source (a variable's default) is masked
                // character for character, so the labels keep their columns.
                let masked = secret_ranges(content);
                let mark =
                    |offset: usize, pos: usize, m: &mut Vec<(Option<usize>, Option<usize>)>| {
                        for (i, s) in spans.iter().enumerate() {
                            if s.start == offset && m[i].0.is_none() {
                                m[i].0 = Some(pos);
                            }
                            if s.end == offset && m[i].1.is_none() {
                                m[i].1 = Some(pos);
                            }
                        }
                    };
                for (n, (i, c)) in content.char_indices().enumerate() {
                    if n < from {
                        continue;
                    }
                    if shown == WINDOW {
                        cut_at = Some(lr.start + i);
                        break;
                    }
                    let pos = out.len();
                    mark(lr.start + i, pos, &mut mapped);
                    if masked.iter().any(|m| m.contains(&i)) {
                        out.push('*');
                    } else {
                        push_escaped(&mut out, c);
                    }
                    shown += 1;
                }
                let end_pos = out.len();
                if cut_at.is_some() {
                    out.push('…');
                }
                // Label ends past the window or at the line end land on the window's end;
                // starts before the window on its start.
                let next_line = file
                    .line_starts()
                    .get(line + 1)
                    .copied()
                    .unwrap_or(usize::MAX);
                for (i, s) in spans.iter().enumerate() {
                    if s.start >= lr.start && s.start < next_line && mapped[i].0.is_none() {
                        let before_window =
                            text[lr.start..s.start.min(lr.end)].chars().count() < from;
                        mapped[i].0 = Some(if before_window { line_start } else { end_pos });
                    }
                    if s.end >= lr.start && s.end <= next_line && mapped[i].1.is_none() {
                        // A label that takes the line break takes the snippet's line break.
                        let takes_break = s.end == next_line && cut_at.is_none();
                        mapped[i].1 = Some(end_pos + usize::from(takes_break));
                    }
                }
                if next_line != usize::MAX {
                    out.push('\n');
                }
            }
        }
        let ranges: Vec<Range<usize>> = mapped
            .iter()
            .map(|(a, b)| {
                let a = a.unwrap_or(0).min(out.len());
                let b = b.unwrap_or(a).clamp(a, out.len());
                a..b
            })
            .collect();
        let primary = spans.first().zip(ranges.first()).map(|(orig, r)| {
            let (line, col) = file.line_col(orig.start);
            (r.clone(), line - 1, col - 1)
        });
        (
            Snippet {
                name: file.display.clone(),
                text: out,
                lines,
                primary,
            },
            ranges,
        )
    }

    fn file_line(&self, snippet_line: usize) -> (usize, usize) {
        self.lines
            .get(snippet_line)
            .map_or((snippet_line, snippet_line), |l| (l.1, l.2))
    }
}

impl SourceCode for Snippet {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self.text.as_str().read_span(span, before, after)?;
        let (mut line, excerpt_end) = self.file_line(inner.line());
        let mut column = inner.column();
        if let Some((r, l, c)) = &self.primary {
            if before == 0 && after == 0 && span.offset() == r.start {
                (line, column) = (*l, *c);
            }
        }
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            line,
            column,
            // miette joins two labels' excerpts when `line + line_count` reaches the next
            // one's first line: only excerpts joined in `build` may be, since the lines
            // between excerpts are not in the snippet.
            (excerpt_end + 1).saturating_sub(line),
        )))
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
        if handler.render_report(&mut out, &Rendered::new(d)).is_err() {
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
        if handler.render_report(&mut out, &Rendered::new(d)).is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Arc<SourceFile> {
        Arc::new(SourceFile::new(Path::new("t.hcl"), text.to_string()))
    }

    #[test]
    fn noted_secrets_are_scrubbed_before_long_values_are_cut_and_masked_in_snippets() {
        forget_secrets();
        let secret = format!("tok-{}", "k".repeat(100));
        note_secret(&secret);
        note_secret("abc");
        let d =
            Diag::error("t", format!("bad value {secret:?} and abc")).help(format!("was {secret}"));
        assert_eq!(d.message, "bad value \"(sensitive value)\" and abc");
        assert_eq!(d.help.as_deref(), Some("was (sensitive value)"));
        let text = format!("x = \"{secret}\" + y\n");
        let f = file(&text);
        let at = text.find("+ y").unwrap_or(0);
        let out =
            render_plain(&[Diag::error("t", "bad").label(&Span::new(&f, at..at + 3), "here")]);
        assert!(!out.contains("tok-k") && out.contains("\"****"), "{out}");
        forget_secrets();
        let d = Diag::error("t", format!("bad value {secret:?}"));
        assert!(d.message.contains("tok-kkk"), "forgotten: {}", d.message);
    }

    #[test]
    fn messages_escape_control_bytes_and_cut_long_values() {
        let value = format!("{:?}", "x".repeat(5000));
        let d = Diag::error("t", format!("invalid `a`: {value} is \x1b[31mbad\u{202e}"))
            .help("h".repeat(10_000));
        assert!(d.message.contains("\"xxxxxxxxxx") && d.message.contains("x…\" is"));
        assert!(d.message.len() < 200, "{}", d.message);
        assert!(d.message.contains("\\u{1b}[31m") && d.message.contains("\\u{202e}"));
        let help = d.help.unwrap_or_default();
        assert!(help.ends_with("more bytes)") && help.len() < 2100, "{help}");
    }

    #[test]
    fn a_label_past_column_65535_renders_a_window() {
        let text = format!("a = \"{}\" + x\nb = 1\n", "y".repeat(70_000));
        let f = file(&text);
        let at = text.find("+ x").unwrap_or(0);
        let d = Diag::error("t", "bad").label(&Span::new(&f, at..at + 3), "here");
        let out = render_plain(&[d]);
        assert!(out.contains("[t.hcl:1:70008]"), "{out}");
        assert!(out.contains("…yyyy") && out.contains("\" + x"), "{out}");
        assert!(out.len() < 2000, "{} bytes", out.len());
    }

    #[test]
    fn snippets_escape_terminal_bytes_and_keep_line_numbers() {
        let text = "one\ntwo = \"\x1b]0;title\x07\"\nthree\n".to_string()
            + &"pad\n".repeat(50)
            + "last = 1\n";
        let f = file(&text);
        let two = text.find("two").unwrap_or(0);
        let last = text.find("last").unwrap_or(0);
        let d = Diag::error("t", "bad")
            .label(&Span::new(&f, two..two + 3), "first")
            .label(&Span::new(&f, last..last + 4), "second");
        let out = render_plain(&[d]);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(out.contains("\\u{1b}]0;title\\u{7}"), "{out}");
        assert!(
            out.contains(" 2 │ two") && out.contains("54 │ last"),
            "{out}"
        );
        assert!(
            !out.contains(" 30 │"),
            "lines between the labels are left out: {out}"
        );
    }

    #[test]
    fn a_label_over_many_lines_shows_its_first_line() {
        let text = "x = [\n".to_string() + &"  1,\n".repeat(5000) + "]\n";
        let f = file(&text);
        let d = Diag::error("t", "bad").label(&Span::new(&f, 4..text.len() - 1), "this list");
        let out = render_plain(&[d]);
        assert!(
            out.contains("[t.hcl:1:5]") && out.lines().count() < 20,
            "{out}"
        );
    }
}

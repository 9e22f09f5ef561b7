//! The layout engine: tokens streamed into the output with newlines and spaces resolved when
//! the next token arrives.

use super::*;

/// Streams tokens into `out`. Newlines and spaces are not written eagerly: they are recorded as
/// pending and resolved when the next token arrives, so that a closing bracket can be placed at
/// the indentation of the line that opened it and blank lines can be collapsed.
pub(super) struct Writer<'s> {
    src: &'s str,
    out: String,
    /// Indentation level for a new line at the current nesting; one entry per open bracket
    /// (plus the file level).
    levels: Vec<usize>,
    /// Indentation level of the line being written.
    line_indent: usize,
    /// Newlines seen since the last token.
    pending_nl: usize,
    /// A line comment was written: the next token must start a new line.
    need_nl: bool,
    /// A block comment was written: separate the next token by a space.
    pending_sp: bool,
    /// The last token opened a bracket (no blank line may follow).
    after_open: bool,
    /// Runs of `=` positions (byte offsets in `out`) to align.
    runs: Vec<Vec<usize>>,
}

/// Collects one alignment run at a time for a body or an object.
#[derive(Default)]
pub(super) struct AlignmentRun(Vec<usize>);

impl<'s> Writer<'s> {
    pub(super) fn new(src: &'s str) -> Self {
        Writer {
            src,
            out: String::with_capacity(src.len() + src.len() / 8),
            levels: vec![0],
            line_indent: 0,
            pending_nl: 0,
            need_nl: false,
            pending_sp: false,
            after_open: false,
            runs: Vec::new(),
        }
    }

    fn level(&self) -> usize {
        self.levels.last().copied().unwrap_or(0)
    }

    fn at_line_start(&self) -> bool {
        self.pending_nl > 0 || self.need_nl
    }

    /// Writes `text` (which must not be empty), first resolving pending newlines (placing the
    /// token at `level`) or spacing. Returns the byte offset of `text` in the output.
    fn put_at(&mut self, text: &str, space: bool, level: usize, closing: bool) -> usize {
        let mut nl = self.pending_nl;
        if self.need_nl {
            nl = nl.max(1);
        }
        if nl > 0 && !self.out.is_empty() {
            let n = if closing || self.after_open {
                1
            } else {
                nl.min(2)
            };
            for _ in 0..n {
                self.out.push('\n');
            }
            for _ in 0..level {
                self.out.push_str("  ");
            }
            self.line_indent = level;
        } else if (space || (self.pending_sp && !text.starts_with([',', ')', ']'])))
            && !self.out.is_empty()
            && !self.out.ends_with([' ', '\n'])
        {
            self.out.push(' ');
        }
        self.pending_nl = 0;
        self.need_nl = false;
        self.pending_sp = false;
        self.after_open = false;
        let start = self.out.len();
        self.out.push_str(text);
        start
    }

    fn put(&mut self, text: &str, space: bool) -> usize {
        let level = self.level();
        self.put_at(text, space, level, false)
    }

    fn open(&mut self, text: &str, space: bool) {
        self.put(text, space);
        self.levels.push(self.line_indent + 1);
        self.after_open = true;
    }

    fn close(&mut self, text: &str, space: bool) {
        let inner = if self.levels.len() > 1 {
            self.levels.pop().unwrap_or(1)
        } else {
            1
        };
        self.put_at(text, space, inner.saturating_sub(1), true);
    }

    /// Feeds whitespace and comments. Returns whether it held a comment.
    fn decor(&mut self, raw: Option<&RawString>) -> bool {
        let Some(raw) = raw else { return false };
        let src = self.src;
        let mut comment = false;
        for tok in trivia(raw_str(src, raw)) {
            match tok {
                Trivia::Newline => self.pending_nl += 1,
                Trivia::LineComment(text) => {
                    comment = true;
                    self.put(text.trim_end(), true);
                    self.need_nl = true;
                }
                Trivia::BlockComment(text) => {
                    comment = true;
                    let text = tidy_block_comment(text);
                    self.put(&text, true);
                    self.pending_sp = true;
                }
            }
        }
        comment
    }

    fn close_run(&mut self, run: &mut AlignmentRun) {
        if run.0.len() > 1 {
            self.runs.push(std::mem::take(&mut run.0));
        } else {
            run.0.clear();
        }
    }

    /// Whether the output from `start` (ignoring the line break and indentation written before
    /// the first token) stays on one line.
    fn single_line_since(&self, start: usize) -> bool {
        !self.out[start..]
            .trim_start_matches(['\n', ' '])
            .contains('\n')
    }

    pub(super) fn finish(mut self) -> String {
        let mut inserts: Vec<(usize, usize)> = Vec::new();
        for run in &self.runs {
            let cols: Vec<usize> = run
                .iter()
                .map(|&off| {
                    let line_start = self.out[..off].rfind('\n').map_or(0, |i| i + 1);
                    self.out[line_start..off].chars().count()
                })
                .collect();
            let max = cols.iter().copied().max().unwrap_or(0);
            for (&off, &col) in run.iter().zip(&cols) {
                if col < max {
                    inserts.push((off, max - col));
                }
            }
        }
        inserts.sort_unstable_by_key(|&(off, _)| std::cmp::Reverse(off));
        for (off, pad) in inserts {
            self.out.insert_str(off, &" ".repeat(pad));
        }
        let trimmed = self.out.trim_end().len();
        self.out.truncate(trimmed);
        if !self.out.is_empty() {
            self.out.push('\n');
        }
        self.out
    }

    // -- structure ----------------------------------------------------------------------------

    pub(super) fn body_items(&mut self, body: &Body) {
        let mut run = AlignmentRun::default();
        for structure in body.iter() {
            // The line ending before this structure (after `{`, or after the previous one).
            self.pending_nl += 1;
            let comment = self.decor(structure.decor().prefix());
            let blank = self.pending_nl >= 2;
            match structure {
                Structure::Attribute(attr) => {
                    let starts_line = self.at_line_start();
                    if comment || blank || !starts_line {
                        self.close_run(&mut run);
                    }
                    let (start, eq) = self.attribute(attr, false);
                    if starts_line && self.single_line_since(start) {
                        run.0.push(eq);
                    } else {
                        self.close_run(&mut run);
                    }
                }
                Structure::Block(block) => {
                    self.close_run(&mut run);
                    self.block(block);
                }
            }
            self.decor(structure.decor().suffix());
        }
        self.close_run(&mut run);
        self.pending_nl += 1;
        self.decor(body.decor().suffix());
    }

    /// Writes `key = value`; returns the offsets of the start and of the `=`.
    fn attribute(&mut self, attr: &Attribute, space: bool) -> (usize, usize) {
        let start = self.out.len();
        self.decor(attr.key.decor().prefix());
        self.put(attr.key.as_str(), space);
        self.decor(attr.key.decor().suffix());
        let eq = self.put("=", true);
        self.expr(&attr.value, true);
        (start, eq)
    }

    fn block(&mut self, block: &Block) {
        self.ident(&block.ident, false);
        for label in &block.labels {
            self.decor(label.decor().prefix());
            match label {
                BlockLabel::Ident(ident) => self.put(ident.as_str(), true),
                BlockLabel::String(string) => {
                    let text = match string.span().and_then(|r| self.src.get(r)) {
                        Some(text) => Cow::Borrowed(text),
                        None => Cow::Owned(label_fallback(label)),
                    };
                    self.put(&text, true)
                }
            };
            self.decor(label.decor().suffix());
        }

        let body = &block.body;
        let decor = body.decor();
        let empty = body.is_empty()
            && !has_comment(self.src, decor.prefix())
            && !has_comment(self.src, decor.suffix());
        if empty {
            self.put("{}", true);
            return;
        }
        let single_attr = body.len() == 1 && body.iter().all(Structure::is_attribute);
        if body.prefer_oneline() && (body.is_empty() || single_attr) {
            self.open("{", true);
            self.decor(decor.prefix());
            if let Some(Structure::Attribute(attr)) = body.iter().next() {
                let structure_decor = attr.decor();
                self.decor(structure_decor.prefix());
                self.attribute(attr, true);
                self.decor(structure_decor.suffix());
            }
            self.decor(decor.suffix());
            self.close("}", true);
        } else {
            self.open("{", true);
            self.decor(decor.prefix());
            self.body_items(body);
            self.close("}", false);
        }
    }

    fn ident(&mut self, ident: &Decorated<Ident>, space: bool) {
        self.decor(ident.decor().prefix());
        self.put(ident.as_str(), space);
        self.decor(ident.decor().suffix());
    }

    // -- expressions --------------------------------------------------------------------------

    fn expr(&mut self, expr: &Expression, space: bool) {
        self.decor(expr.decor().prefix());
        self.expr_inner(expr, space);
        self.decor(expr.decor().suffix());
    }

    fn expr_inner(&mut self, expr: &Expression, space: bool) {
        match expr {
            Expression::Null(_)
            | Expression::Bool(_)
            | Expression::Number(_)
            | Expression::String(_)
            | Expression::StringTemplate(_)
            | Expression::HeredocTemplate(_)
            | Expression::Variable(_) => {
                let text = match expr.span().and_then(|r| self.src.get(r)) {
                    Some(text) => Cow::Borrowed(text),
                    None => Cow::Owned(expr_fallback(expr)),
                };
                self.put(&text, space);
            }
            Expression::Array(array) => self.array(array, space),
            Expression::Object(object) => self.object(object, space),
            Expression::Parenthesis(paren) => {
                self.open("(", space);
                self.expr(paren.inner(), false);
                self.close(")", false);
            }
            Expression::ForExpr(for_expr) => self.for_expr(for_expr, space),
            Expression::Conditional(cond) => {
                self.expr(&cond.cond_expr, space);
                self.put("?", true);
                self.expr(&cond.true_expr, true);
                self.put(":", true);
                self.expr(&cond.false_expr, true);
            }
            Expression::FuncCall(call) => self.func_call(call, space),
            Expression::UnaryOp(op) => {
                self.put(op.operator.as_str(), space);
                self.expr(&op.expr, false);
            }
            Expression::BinaryOp(op) => {
                self.expr(&op.lhs_expr, space);
                self.decor(op.operator.decor().prefix());
                self.put(op.operator.as_str(), true);
                self.decor(op.operator.decor().suffix());
                self.expr(&op.rhs_expr, true);
            }
            Expression::Traversal(traversal) => {
                self.expr(&traversal.expr, space);
                for op in &traversal.operators {
                    self.decor(op.decor().prefix());
                    self.traversal_operator(op.value());
                    self.decor(op.decor().suffix());
                }
            }
        }
    }

    fn traversal_operator(&mut self, op: &TraversalOperator) {
        match op {
            TraversalOperator::GetAttr(ident) => {
                self.put(".", false);
                self.ident(ident, false);
            }
            TraversalOperator::AttrSplat(splat) => {
                self.put(".", false);
                self.decor(splat.decor().prefix());
                self.put("*", false);
                self.decor(splat.decor().suffix());
            }
            TraversalOperator::LegacyIndex(index) => {
                self.put(".", false);
                self.decor(index.decor().prefix());
                self.put(&index.value().to_string(), false);
                self.decor(index.decor().suffix());
            }
            TraversalOperator::Index(expr) => {
                self.open("[", false);
                self.expr(expr, false);
                self.close("]", false);
            }
            TraversalOperator::FullSplat(splat) => {
                self.open("[", false);
                self.decor(splat.decor().prefix());
                self.put("*", false);
                self.decor(splat.decor().suffix());
                self.close("]", false);
            }
        }
    }

    fn array(&mut self, array: &Array, space: bool) {
        self.open("[", space);
        for (i, value) in array.iter().enumerate() {
            if i > 0 {
                self.put(",", false);
            }
            self.expr(value, i > 0);
        }
        if array.trailing_comma() && !array.is_empty() {
            self.put(",", false);
        }
        self.decor(Some(array.trailing()));
        self.close("]", false);
    }

    fn object(&mut self, object: &Object, space: bool) {
        self.open("{", space);
        let mut run = AlignmentRun::default();
        for (key, value) in object.iter() {
            let start = self.out.len();
            let comment = self.decor(key.decor().prefix());
            let starts_line = self.at_line_start();
            if comment || !starts_line || self.pending_nl >= 2 {
                self.close_run(&mut run);
            }
            match key {
                ObjectKey::Ident(ident) => {
                    self.put(ident.as_str(), true);
                }
                ObjectKey::Expression(expr) => self.expr_inner(expr, true),
            }
            self.decor(key.decor().suffix());
            let eq = match value.assignment() {
                ObjectValueAssignment::Colon => self.put(":", true),
                ObjectValueAssignment::Equals => self.put("=", true),
            };
            self.expr(value.expr(), true);
            if starts_line && self.single_line_since(start) {
                run.0.push(eq);
            } else {
                self.close_run(&mut run);
            }
            match value.terminator() {
                ObjectValueTerminator::Comma => {
                    self.put(",", false);
                }
                ObjectValueTerminator::Newline => self.pending_nl += 1,
                ObjectValueTerminator::None => {}
            }
        }
        self.close_run(&mut run);
        self.decor(Some(object.trailing()));
        self.close("}", !object.is_empty());
    }

    fn for_expr(&mut self, for_expr: &ForExpr, space: bool) {
        let is_object = for_expr.key_expr.is_some();
        let (open, close) = if is_object { ("{", "}") } else { ("[", "]") };
        self.open(open, space);

        let intro = &for_expr.intro;
        self.decor(intro.decor().prefix());
        self.put("for", is_object);
        if let Some(key_var) = &intro.key_var {
            self.ident(key_var, true);
            self.put(",", false);
        }
        self.ident(&intro.value_var, true);
        self.put("in", true);
        self.expr(&intro.collection_expr, true);
        self.put(":", true);
        self.decor(intro.decor().suffix());

        if let Some(key_expr) = &for_expr.key_expr {
            self.expr(key_expr, true);
            self.put("=>", true);
        }
        self.expr(&for_expr.value_expr, true);
        if for_expr.grouping {
            self.put("...", false);
        }
        if let Some(cond) = &for_expr.cond {
            self.decor(cond.decor().prefix());
            self.put("if", true);
            self.expr(&cond.expr, true);
            self.decor(cond.decor().suffix());
        }
        self.close(close, is_object);
    }

    fn func_call(&mut self, call: &FuncCall, space: bool) {
        let mut first = true;
        for component in &call.name.namespace {
            self.ident(component, space && first);
            self.put("::", false);
            first = false;
        }
        self.ident(&call.name.name, space && first);

        let args = &call.args;
        self.open("(", false);
        for (i, arg) in args.iter().enumerate() {
            if i > 0 {
                self.put(",", false);
            }
            self.expr(arg, i > 0);
        }
        if !args.is_empty() {
            if args.expand_final() {
                self.put("...", false);
            } else if args.trailing_comma() {
                self.put(",", false);
            }
        }
        self.decor(Some(args.trailing()));
        self.close(")", false);
    }
}

/// Text of a leaf expression without its decor, for the (unexpected) case of a missing span.
pub(super) fn expr_fallback(expr: &Expression) -> String {
    let mut expr = expr.clone();
    expr.decor_mut().clear();
    expr.to_string()
}

pub(super) fn label_fallback(label: &BlockLabel) -> String {
    match label {
        BlockLabel::Ident(ident) => ident.as_str().to_string(),
        BlockLabel::String(string) => {
            let mut expr = Expression::String(Decorated::new(string.value().clone()));
            expr.decor_mut().clear();
            expr.to_string()
        }
    }
}

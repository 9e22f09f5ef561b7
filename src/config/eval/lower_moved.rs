//! Lowering `moved` and `removed` blocks: their addresses checked for their form here, and
//! against the whole configuration once it is evaluated ([`Loader::check_moves`]); what the
//! state records at them is for the plan (`plan::moves`).

use super::*;
use crate::config::model::{Move, Removal};
use crate::vocabulary::address_within;

const ADDRESS_HELP: &str = "write the address unquoted, as plans show it: a resource (module.qwen.container.rank0), an instance (container.rank[\"node2\"]) or a module (module.qwen)";

impl Loader {
    /// A `moved` or `removed` block of the root module (checked by `check_nested` for its
    /// attributes) into `config.moves` or `config.removals`.
    pub(super) fn lower_moved(&mut self, file: &Arc<SourceFile>, block: &Block, header: Span) {
        let kind = block.ident.as_str();
        if self.stack.len() > 1 {
            self.diags.push(
                Diag::error(
                    "config::moved_in_module",
                    format!("`{kind}` blocks belong in the root module"),
                )
                .label(&header, "inside a module")
                .help("move it to the definitions you run sparkform on, naming the resources through their module: from = module.NAME.container.C"),
            );
            return;
        }
        let Some((from, from_span)) = self.address_attr(
            file,
            &block.body,
            "from",
            "config::moved_address",
            ADDRESS_HELP,
        ) else {
            return;
        };
        if kind == "removed" {
            let destroy = match block
                .body
                .get_blocks("lifecycle")
                .next()
                .and_then(|l| l.body.get_attribute("destroy"))
            {
                None => true,
                Some(a) => match &a.value {
                    Expression::Bool(b) => *b.value(),
                    other => {
                        self.diags.push(
                            Diag::error(
                                "config::removed_destroy",
                                "`destroy` is `true` or `false`, written as such",
                            )
                            .label(&span_of(file, other.span()), "not a literal bool")
                            .help("write destroy = false to forget the resource and leave it running, or delete the `removed` block to destroy it"),
                        );
                        return;
                    }
                },
            };
            self.config.removals.push(Removal {
                from,
                destroy,
                span: header,
                from_span,
            });
            return;
        }
        let Some((to, to_span)) = self.address_attr(
            file,
            &block.body,
            "to",
            "config::moved_address",
            ADDRESS_HELP,
        ) else {
            return;
        };
        if from == to {
            self.diags.push(
                Diag::error(
                    "config::moved_to_itself",
                    format!("this `moved` block moves {from} to itself"),
                )
                .label(&to_span, "the same address as `from`")
                .help(
                    "name the old address in `from` and the new one in `to`, or delete the block",
                ),
            );
            return;
        }
        self.config.moves.push(Move {
            from,
            to,
            span: header,
            from_span,
            to_span,
        });
    }

    /// Once everything is evaluated: a `moved` block's `from` and a `removed` block's address
    /// must be gone from the definitions (else the block contradicts them); two moves may not
    /// end at one address, nor follow each other round in a loop.
    pub(crate) fn check_moves(&mut self) {
        let declared: Vec<&str> = self
            .config
            .resources
            .iter()
            .map(|r| r.address.as_str())
            .collect();
        let still = |from: &str| declared.iter().find(|a| address_within(a, from)).copied();
        let mut diags = Vec::new();
        for m in &self.config.moves {
            if let Some(a) = still(&m.from) {
                diags.push(
                    Diag::error(
                        "config::moved_from_declared",
                        format!("`moved` from {}, which the definitions still declare ({a})", m.from),
                    )
                    .label(&m.from_span, "still declared")
                    .help("a move renames: rename the block (or module) to the `to` address too, or delete this `moved` block"),
                );
            }
        }
        for (i, m) in self.config.moves.iter().enumerate() {
            if let Some(other) = self.config.moves[..i].iter().find(|o| o.to == m.to) {
                diags.push(
                    Diag::error(
                        "config::moved_twice_to",
                        format!("two `moved` blocks move to {}", m.to),
                    )
                    .label(&other.to_span, "first here")
                    .label(&m.to_span, "and here")
                    .help("one address can hold one thing: keep one of the moves"),
                );
            }
        }
        if let Some(cycle) = move_cycle(&self.config.moves) {
            let first = &self.config.moves[cycle[0]];
            let mut d = Diag::error(
                "config::moved_cycle",
                format!(
                    "these `moved` blocks go round in a loop: {}",
                    cycle
                        .iter()
                        .map(|&i| self.config.moves[i].from.as_str())
                        .chain(std::iter::once(first.from.as_str()))
                        .collect::<Vec<_>>()
                        .join(" → ")
                ),
            );
            for &i in &cycle {
                d = d.label(&self.config.moves[i].span, "part of the loop");
            }
            diags.push(d.help("each address moves once, from the old name to the new one: delete the move that goes back"));
        }
        for r in &self.config.removals {
            if let Some(a) = still(&r.from) {
                diags.push(
                    Diag::error(
                        "config::removed_declared",
                        format!("`removed` names {}, which the definitions still declare ({a})", r.from),
                    )
                    .label(&r.from_span, "still declared")
                    .help("delete the resource's block (or the module call) together with adding the `removed` block, or delete the `removed` block"),
                );
            }
        }
        for d in diags {
            self.diags.push(d);
        }
    }
}

/// The indexes of moves that lead back to where they started (`a → b`, `b → a`), if any: a
/// move follows another when its `from` lies within the other's `to`.
fn move_cycle(moves: &[Move]) -> Option<Vec<usize>> {
    for start in 0..moves.len() {
        let mut path = vec![start];
        let mut at = start;
        // Each step follows a different move; more steps than moves is a loop already seen.
        for _ in 0..moves.len() {
            let Some(next) = (0..moves.len())
                .find(|&j| j != at && address_within(&moves[j].from, &moves[at].to))
            else {
                break;
            };
            if next == start {
                return Some(path);
            }
            if path.contains(&next) {
                break;
            }
            path.push(next);
            at = next;
        }
    }
    None
}

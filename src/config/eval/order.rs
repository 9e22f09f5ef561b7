//! The items ordered by their references: each reference resolved to the item it names,
//! cycles reported with every member.

use super::*;
use crate::kind::Registered;

impl Loader {
    /// Resolve references to items, report unknown ones and cycles; return the evaluation order.
    pub(super) fn order(&mut self, scope: &mut Scope<'_>) -> Vec<usize> {
        let n = scope.items.len();
        let mut graph: DiGraph<usize, Span> = DiGraph::with_capacity(n, n * 2);
        let nodes: Vec<NodeIndex> = (0..n).map(|i| graph.add_node(i)).collect();
        for i in 0..n {
            let item = &scope.items[i];
            let has_for_each = item.block.is_some_and(|b| b.body.has_attribute("for_each"));
            let mut broken = false;
            let mut edges = Vec::new();
            for r in item.refs.iter().chain(item.edge_refs.iter()) {
                match self.resolve_ref_target(scope, item, r, has_for_each) {
                    Ok(Some(target)) => edges.push((target, Span::new(&item.file, r.span.clone()))),
                    Ok(None) => {}
                    Err(d) => {
                        self.diags.push(*d);
                        broken = true;
                    }
                }
            }
            if broken {
                scope.items[i].broken = true;
            }
            for (t, span) in edges {
                graph.add_edge(nodes[i], nodes[t], span);
            }
        }
        // Cycles: every strongly connected component with more than one member, or a self-loop.
        for comp in petgraph::algo::tarjan_scc(&graph) {
            let self_loop = comp.len() == 1 && graph.contains_edge(comp[0], comp[0]);
            if comp.len() < 2 && !self_loop {
                continue;
            }
            let members: BTreeSet<NodeIndex> = comp.iter().copied().collect();
            let cycle = walk_cycle(&graph, &members);
            let names: Vec<String> = cycle
                .iter()
                .map(|&ix| scope.address_of(graph[ix]))
                .collect();
            let mut shown = names.clone();
            if let Some(first) = names.first() {
                shown.push(first.clone());
            }
            let mut d = Diag::error(
                "config::cycle",
                format!("dependency cycle: {}", shown.join(" → ")),
            )
            .help("break the cycle: one of these must not refer to the next (check depends_on and references through locals and modules)");
            for (k, &ix) in cycle.iter().enumerate() {
                let next = cycle[(k + 1) % cycle.len()];
                let label_span = graph
                    .edges_connecting(ix, next)
                    .next()
                    .map(|e| e.weight().clone())
                    .unwrap_or_else(|| scope.items[graph[ix]].header.clone());
                d = d.label(
                    &label_span,
                    format!("{} refers to {}", names[k], scope.address_of(graph[next])),
                );
            }
            self.diags.push(d);
            for ix in comp {
                scope.items[graph[ix]].broken = true;
            }
        }
        // Evaluation order: dependencies first. Cycle members are broken and skipped.
        let mut order = Vec::with_capacity(n);
        let mut state = vec![0u8; n];
        for start in 0..n {
            visit_post(&graph, &nodes, start, &mut state, &mut order);
        }
        order
    }

    /// The item a reference points at, `None` for references that need no item (`each`).
    pub(super) fn resolve_ref_target(
        &self,
        scope: &Scope<'_>,
        item: &Item<'_>,
        r: &Ref,
        has_for_each: bool,
    ) -> Result<Option<usize>, Box<Diag>> {
        let span = Span::new(&item.file, r.span.clone());
        if r.root == "each" {
            if has_for_each {
                return Ok(None);
            }
            return Err(Box::new(
                Diag::error(
                    "config::each_outside_for_each",
                    "`each` is only available in a block with `for_each`",
                )
                .label(&span, "no for_each here")
                .help("add `for_each = …` to this block, or refer to a value directly"),
            ));
        }
        let Some(root) = Root::referable(&r.root) else {
            let mut d = Diag::error(
                "config::unknown_reference",
                format!("unknown reference `{}`", r.display(1)),
            )
            .label(
                &span,
                format!("`{}` is not something that can be referred to", r.root),
            );
            d = match did_you_mean(&r.root, referable()) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None if r.root == "output" => {
                    d.help("a module's outputs are read as module.NAME.OUTPUT")
                }
                None => {
                    let kinds: Vec<String> = KindId::ALL
                        .iter()
                        .map(|k| format!("{}.", k.top_block().kind))
                        .collect();
                    d.help(format!(
                        "references start with var., local., node., jump., {} or module.",
                        kinds.join(", ")
                    ))
                }
            };
            return Err(Box::new(d));
        };
        let Some(name) = r.first_key() else {
            return Err(Box::new(
                Diag::error(
                    "config::incomplete_reference",
                    format!("`{}` needs a name after it", r.root),
                )
                .label(&span, format!("write {}.NAME", r.root)),
            ));
        };
        match scope.index.get(&(root, name.to_string())) {
            Some(&i) => Ok(Some(i)),
            None => {
                let candidates: Vec<&str> = scope
                    .items
                    .iter()
                    .filter(|it| it.root == root)
                    .map(|it| it.name.as_str())
                    .collect();
                let what = match root {
                    Root::Var => "variable",
                    Root::Local => "local value",
                    r => r.ident(),
                };
                let name_span = r
                    .step_spans
                    .get(1)
                    .map(|s| Span::new(&item.file, s.clone()))
                    .unwrap_or(span.clone());
                let mut d = Diag::error(
                    "config::unknown_reference",
                    format!(
                        "unknown reference `{}`: no {what} named `{name}`",
                        r.display(1)
                    ),
                )
                .label(&name_span, format!("no {what} `{name}` in this module"));
                d = match did_you_mean(name, candidates.iter().copied()) {
                    Some(s) => d.help(format!("did you mean `{}.{s}`?", r.root)),
                    None if candidates.is_empty() => {
                        d.help(format!("this module declares no {what}"))
                    }
                    None => d.help(format!("declared: {}", candidates.join(", "))),
                };
                Err(Box::new(d))
            }
        }
    }
}

/// Walk one cycle through the members of a strongly connected component.
pub(super) fn walk_cycle(
    graph: &DiGraph<usize, Span>,
    members: &BTreeSet<NodeIndex>,
) -> Vec<NodeIndex> {
    let Some(&start) = members.iter().next() else {
        return Vec::new();
    };
    let mut path = vec![start];
    let mut seen = HashSet::from([start]);
    let mut cur = start;
    loop {
        let next = graph
            .neighbors(cur)
            .filter(|n| members.contains(n))
            .min_by_key(|n| (if *n == start { 0 } else { 1 }, n.index()));
        match next {
            Some(n) if n == start => return path,
            Some(n) if seen.contains(&n) => {
                // Reached a loop not through `start`: cut the path to that loop.
                let pos = path.iter().position(|p| *p == n).unwrap_or(0);
                return path.split_off(pos);
            }
            Some(n) => {
                seen.insert(n);
                path.push(n);
                cur = n;
            }
            None => return path,
        }
    }
}

/// Depth-first post-order (dependencies before dependents), iterative so deep chains can't overflow.
pub(super) fn visit_post(
    graph: &DiGraph<usize, Span>,
    nodes: &[NodeIndex],
    start: usize,
    state: &mut [u8],
    order: &mut Vec<usize>,
) {
    if state[start] != 0 {
        return;
    }
    let mut stack: Vec<(usize, Vec<usize>)> = Vec::new();
    state[start] = 1;
    let succ = |i: usize| -> Vec<usize> {
        let mut v: Vec<usize> = graph.neighbors(nodes[i]).map(|n| graph[n]).collect();
        v.sort_unstable();
        v.reverse();
        v
    };
    stack.push((start, succ(start)));
    while let Some((node, pending)) = stack.last_mut() {
        match pending.pop() {
            Some(next) if state[next] == 0 => {
                state[next] = 1;
                let s = succ(next);
                stack.push((next, s));
            }
            Some(_) => {}
            None => {
                state[*node] = 2;
                order.push(*node);
                stack.pop();
            }
        }
    }
}

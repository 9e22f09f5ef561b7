//! The dependency graph of a configuration's resources: order, parallel levels, DOT.

use crate::kind::Registered;
use crate::vocabulary::KindId;
use std::collections::{BTreeSet, HashMap};

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;

use crate::config::Config;
use crate::diag::Diag;

/// Resources as nodes, an edge from each dependency to what depends on it.
#[derive(Debug, Clone)]
pub struct Graph {
    pub graph: DiGraph<String, ()>,
    index: HashMap<String, NodeIndex>,
    kinds: HashMap<String, KindId>,
}

impl Graph {
    pub fn build(config: &Config) -> Result<Graph, Box<Diag>> {
        let n = config.resources.len();
        let mut graph = DiGraph::with_capacity(n, n * 2);
        let mut index = HashMap::with_capacity(n);
        let mut kinds = HashMap::with_capacity(n);
        for r in &config.resources {
            index.insert(r.address.clone(), graph.add_node(r.address.clone()));
            kinds.insert(r.address.clone(), r.kind);
        }
        for r in &config.resources {
            let to = index[&r.address];
            for d in r.deps.iter().chain(r.replace_triggered_by.iter()) {
                if let Some(&from) = index.get(d) {
                    if from != to {
                        graph.update_edge(from, to, ());
                    }
                }
            }
        }
        let g = Graph {
            graph,
            index,
            kinds,
        };
        // Configuration evaluation already refuses cycles between blocks; this guards the
        // resource graph itself (e.g. from edges added by depends_on between modules).
        for comp in petgraph::algo::tarjan_scc(&g.graph) {
            if comp.len() > 1 {
                let mut names: Vec<String> = comp.iter().map(|&i| g.graph[i].clone()).collect();
                names.sort();
                let mut d = Diag::error(
                    "graph::cycle",
                    format!("dependency cycle between resources: {}", names.join(" → ")),
                );
                for &i in &comp {
                    if let Some(r) = config.resource(&g.graph[i]) {
                        d = d.label(&r.span, format!("{} is part of the cycle", r.address));
                    }
                }
                return Err(Box::new(d));
            }
        }
        g.replicas_apart(config)?;
        Ok(g)
    }

    /// The replicas behind a router (`Kind::rolling`) can be taken out one at a time: no
    /// member of one depends on a member of another, and no process group (a launcher whose
    /// ranks restart together) spans two of them; otherwise replacing one would stop another.
    fn replicas_apart(&self, config: &Config) -> Result<(), Box<Diag>> {
        for r in &config.resources {
            let Some(rolling) = r.kind.kind().rolling(&r.config) else {
                continue;
            };
            let owner: std::collections::BTreeMap<&str, &str> = rolling
                .replicas
                .iter()
                .flat_map(|(k, ms)| ms.iter().map(move |m| (m.as_str(), k.as_str())))
                .collect();
            let group_of = |m: &str| config.resource(m).and_then(|x| x.group.clone());
            let mut groups: std::collections::BTreeMap<String, (&str, &str)> = Default::default();
            for (&member, &key) in &owner {
                let reason = self
                    .ancestors(member)
                    .iter()
                    .find_map(|a| {
                        let other = owner.get(a.as_str()).filter(|&&o| o != key)?;
                        Some(format!("{member} (replica `{key}`) depends on {a} (replica `{other}`)"))
                    })
                    .or_else(|| {
                        let group = group_of(member)?;
                        let (m2, k2) = *groups.entry(group.clone()).or_insert((member, key));
                        (k2 != key).then(|| {
                            format!("{member} (replica `{key}`) and {m2} (replica `{k2}`) are one process group, `{group}`: their ranks restart together")
                        })
                    });
                if let Some(reason) = reason {
                    return Err(Box::new(
                        Diag::error(
                            "graph::replicas_not_apart",
                            format!("{}: its replicas cannot be taken out one at a time: {reason}", r.address),
                        )
                        .label(&r.span, "the router of these replicas")
                        .help("give each replica its own launcher and resources (its own ranks, Ray cluster or process group): a replica is replaced and drained alone"),
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn contains(&self, address: &str) -> bool {
        self.index.contains_key(address)
    }

    /// Steps grouped by level: every step of a level can run in parallel once the levels
    /// before it are done. Within a level, declaration order.
    pub fn levels(&self) -> Vec<Vec<String>> {
        let n = self.graph.node_count();
        let mut remaining: Vec<usize> = (0..n)
            .map(|i| {
                self.graph
                    .neighbors_directed(NodeIndex::new(i), Direction::Incoming)
                    .count()
            })
            .collect();
        let mut current: Vec<usize> = (0..n).filter(|&i| remaining[i] == 0).collect();
        let mut levels = Vec::new();
        while !current.is_empty() {
            current.sort_unstable();
            let mut next = Vec::new();
            for &i in &current {
                for s in self.graph.neighbors(NodeIndex::new(i)) {
                    remaining[s.index()] -= 1;
                    if remaining[s.index()] == 0 {
                        next.push(s.index());
                    }
                }
            }
            levels.push(
                current
                    .iter()
                    .map(|&i| self.graph[NodeIndex::new(i)].clone())
                    .collect(),
            );
            current = next;
        }
        levels
    }

    /// A topological order (dependencies first), level by level.
    pub fn order(&self) -> Vec<String> {
        self.levels().into_iter().flatten().collect()
    }

    /// Everything `address` depends on, transitively.
    pub fn ancestors(&self, address: &str) -> BTreeSet<String> {
        self.walk(address, Direction::Incoming)
    }

    /// Everything that depends on `address`, transitively.
    pub fn descendants(&self, address: &str) -> BTreeSet<String> {
        self.walk(address, Direction::Outgoing)
    }

    fn walk(&self, address: &str, dir: Direction) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Some(&start) = self.index.get(address) else {
            return out;
        };
        let mut stack = vec![start];
        while let Some(n) = stack.pop() {
            for m in self.graph.neighbors_directed(n, dir) {
                if out.insert(self.graph[m].clone()) {
                    stack.push(m);
                }
            }
        }
        out
    }

    /// Graphviz DOT: one cluster per level, shapes by kind.
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph sparkform {\n  rankdir = LR;\n  node [fontname = \"Helvetica\", fontsize = 10];\n");
        for (i, level) in self.levels().iter().enumerate() {
            out.push_str(&format!("  subgraph level_{i} {{\n    rank = same;\n"));
            for a in level {
                let shape = self
                    .kinds
                    .get(a)
                    .map_or("ellipse", |k| k.kind().description().dot_shape);
                out.push_str(&format!("    {} [shape = {shape}];\n", quote(a)));
            }
            out.push_str("  }\n");
        }
        let mut edges: Vec<(String, String)> = self
            .graph
            .edge_indices()
            .filter_map(|e| self.graph.edge_endpoints(e))
            .map(|(a, b)| (self.graph[a].clone(), self.graph[b].clone()))
            .collect();
        edges.sort();
        for (a, b) in edges {
            out.push_str(&format!("  {} -> {};\n", quote(&a), quote(&b)));
        }
        out.push_str("}\n");
        out
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

//! A fabric bandwidth test: an all-reduce between the nodes, one rank per node, in one-shot
//! containers of the deployment's image, gating what depends on it on a bus bandwidth floor.
//! It changes nothing and runs like a probe (when it is new, when its configuration changes,
//! when something it depends on changed), never on a no-op plan; `sparkform verify` runs it only
//! when named with `-target` (it loads the fabric and the GPUs of a serving deployment).
//!
//! The program the ranks run is `fabric_test.py` (torch.distributed's NCCL all-reduce, what vLLM
//! itself runs its collectives on); it prints nccl-tests' table, and the same parser
//! ([`parse_busbw`]) reads nccl-tests' own output.

pub(crate) mod lower;
pub mod machine;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Number;

use super::Texts;
use crate::kind::Kind;
use crate::schema::{self, opt, req, spec, BlockSpec};
use crate::vocabulary::Gpus;
use crate::vocabulary::{Lifecycle, OnDrift};

/// The block that declares it.
pub static FABRIC_TEST: BlockSpec = spec(
    "fabric_test",
    &["name"],
    &[
        req("image", schema::ValueType::Str),
        req("nodes", schema::ValueType::Any),
        req("network", schema::ValueType::Any),
        req("min_busbw_gbps", schema::ValueType::Num),
        opt("env", schema::ValueType::Any),
        opt("gpus", schema::ValueType::Any),
        opt("devices", schema::ValueType::ListStr),
        opt("cap_add", schema::ValueType::ListStr),
        opt("ulimits", schema::ValueType::MapStr),
        opt("shm_size", schema::ValueType::Size),
        opt("port", schema::ValueType::Num),
        opt("size", schema::ValueType::Size),
        opt("iterations", schema::ValueType::Num),
        opt("timeout", schema::ValueType::Duration),
        opt("depends_on", schema::ValueType::RefList),
    ],
    &[],
);

/// The top-level block that declares it.
pub static TOP_BLOCK: &BlockSpec = &FABRIC_TEST;

pub const DEFAULT_PORT: u64 = 29600;
/// 1 GiB: large enough that the bus, not the latency, sets the figure.
pub const DEFAULT_SIZE: u64 = 1 << 30;
pub const DEFAULT_ITERATIONS: u64 = 20;
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// What the state keeps of a run: the bus bandwidth it measured, in GB/s.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
}

impl crate::kind::RecordedFacts for Recorded {}

/// Its desired configuration: the ranks in order (rank 0's address is the rendezvous) and
/// what each rank's container gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Desired {
    pub image: String,
    pub ranks: Vec<Rank>,
    /// Each rank's container environment, by node name (as the definitions' `env` is keyed,
    /// so a sensitive value's path is the same in both). A value the first evaluation cannot
    /// know yet (a node fact) is null.
    #[serde(default)]
    pub env: BTreeMap<String, BTreeMap<String, Option<String>>>,
    /// Each rank's GPUs, by node name.
    #[serde(default)]
    pub gpus: BTreeMap<String, Gpus>,
    pub min_busbw_gbps: Number,
    #[serde(default = "default_port")]
    pub port: Number,
    /// Bytes of the all-reduce buffer.
    #[serde(default = "default_size")]
    pub size: Number,
    #[serde(default = "default_iterations")]
    pub iterations: Number,
    /// Seconds for the whole test.
    #[serde(default = "default_timeout")]
    pub timeout: Number,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Texts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_add: Option<Texts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ulimits: Option<BTreeMap<String, String>>,
}

/// One rank: its node (`node.spark1`, as resources name nodes) and its fabric address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rank {
    pub node: String,
    pub address: String,
}

impl Rank {
    /// The node's name (`spark1`), as `env` and `gpus` are keyed.
    pub fn name(&self) -> &str {
        self.node.strip_prefix("node.").unwrap_or(&self.node)
    }
}

impl crate::kind::DesiredConfig for Desired {}

fn default_port() -> Number {
    Number::from(DEFAULT_PORT)
}
fn default_size() -> Number {
    Number::from(DEFAULT_SIZE)
}
fn default_iterations() -> Number {
    Number::from(DEFAULT_ITERATIONS)
}
fn default_timeout() -> Number {
    Number::from(DEFAULT_TIMEOUT_SECS)
}

impl Desired {
    pub fn floor(&self) -> f64 {
        self.min_busbw_gbps.as_f64().unwrap_or(0.0)
    }
    pub fn port(&self) -> u64 {
        self.port.as_u64().unwrap_or(DEFAULT_PORT)
    }
    pub fn size(&self) -> u64 {
        self.size.as_u64().unwrap_or(DEFAULT_SIZE)
    }
    pub fn iterations(&self) -> u64 {
        self.iterations.as_u64().unwrap_or(DEFAULT_ITERATIONS)
    }
    pub fn timeout_secs(&self) -> u64 {
        self.timeout.as_u64().unwrap_or(DEFAULT_TIMEOUT_SECS)
    }
}

/// The value checks of a block's attributes: (attribute, message, help).
pub fn check(d: &Desired) -> Vec<(&'static str, String, &'static str)> {
    let mut problems = Vec::new();
    let floor = d.min_busbw_gbps.as_f64().unwrap_or(-1.0);
    if !(floor > 0.0 && floor <= 10_000.0) {
        problems.push((
            "min_busbw_gbps",
            format!("{} is not a bus bandwidth in GB/s", d.min_busbw_gbps),
            "a number of GB/s above 0, such as 20 (two Sparks over one 200 Gb/s cable reach about 24)",
        ));
    }
    if !(1024..=1u64 << 36).contains(&d.size()) {
        problems.push((
            "size",
            format!("{} bytes is outside 1 KiB to 64 GiB", d.size),
            "the all-reduce buffer, such as \"1g\"; the largest sizes have frozen a Spark",
        ));
    }
    if !(1..=10_000).contains(&d.iterations()) {
        problems.push((
            "iterations",
            format!("{} is not between 1 and 10000", d.iterations),
            "such as 20",
        ));
    }
    if !(1..=65_535).contains(&d.port()) {
        problems.push((
            "port",
            format!("{} is not a TCP port", d.port),
            "such as 29600",
        ));
    }
    if d.timeout_secs() == 0 {
        problems.push(("timeout", "0 s".into(), "such as \"5m\""));
    }
    problems
}

/// What a bandwidth benchmark's output says: the bus bandwidth at its largest message size
/// (the best of the out-of-place and in-place columns), in GB/s, with that size; the average
/// line when the table has no rows. nccl-tests (`all_reduce_perf`, `all_gather_perf`) and
/// `fabric_test.py` print the same table.
#[derive(Debug, Clone, PartialEq)]
pub struct Busbw {
    pub gbps: f64,
    pub size_bytes: Option<u64>,
}

pub fn parse_busbw(output: &str) -> Option<Busbw> {
    let mut best: Option<(u64, f64)> = None;
    let mut avg = None;
    for line in output.lines() {
        // mpirun prefixes each rank's lines: `[1,0]<stdout>:`.
        let line = line.split_once("<stdout>:").map_or(line, |(_, l)| l).trim();
        if let Some(rest) = line
            .strip_prefix("# Avg bus bandwidth")
            .or_else(|| line.strip_prefix("Avg bus bandwidth"))
        {
            avg = rest
                .trim_start_matches([' ', ':'])
                .trim()
                .parse::<f64>()
                .ok();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        // size count type redop root time algbw busbw #wrong time algbw busbw #wrong
        // (all_gather and the like have no redop and root: read the columns from the end).
        let cols: Vec<&str> = line.split_whitespace().collect();
        let Some(size) = cols.first().and_then(|c| c.parse::<u64>().ok()) else {
            continue;
        };
        if cols.len() < 9 || cols.get(1).and_then(|c| c.parse::<u64>().ok()).is_none() {
            continue;
        }
        let n = cols.len();
        let figures = [cols.get(n - 6), cols.get(n - 2)];
        let bw = figures
            .iter()
            .flatten()
            .filter_map(|c| c.parse::<f64>().ok())
            .filter(|b| b.is_finite() && *b >= 0.0)
            .fold(None, |m: Option<f64>, b| Some(m.map_or(b, |m| m.max(b))));
        if let Some(bw) = bw {
            if best.is_none_or(|(s, _)| size >= s) {
                best = Some((size, bw));
            }
        }
    }
    match (best, avg) {
        (Some((size, gbps)), _) => Some(Busbw {
            gbps,
            size_bytes: Some(size),
        }),
        (None, Some(gbps)) if gbps.is_finite() => Some(Busbw {
            gbps,
            size_bytes: None,
        }),
        _ => None,
    }
}

pub struct FabricTest;
pub static KIND: FabricTest = FabricTest;
super::register!(FabricTest, KIND, TOP_BLOCK, lower::lower);

impl Kind for FabricTest {
    type Desired = Desired;
    type Recorded = Recorded;
    const DESCRIPTION: crate::kind::Description = crate::kind::Description {
        block: &FABRIC_TEST,
        // It changes nothing: every attribute is "in place" (a change makes it run again).
        in_place: &[
            "image",
            "ranks",
            "env",
            "gpus",
            "min_busbw_gbps",
            "port",
            "size",
            "iterations",
            "timeout",
            "shm_size",
            "devices",
            "cap_add",
            "ulimits",
        ],
        whole_attributes: &[],
        lifecycle: Lifecycle::Runs,
        on_drift: OnDrift::Ignore,
        service: false,
        disruption: None,
        found_untracked: false,
        dot_shape: "diamond",
    };
    /// Its first rank runs on its own node, the others on theirs.
    fn placement(&self, desired: &Desired) -> crate::kind::Placement {
        crate::kind::Placement {
            other_nodes: desired
                .ranks
                .iter()
                .skip(1)
                .map(|r| r.node.clone())
                .collect(),
            ..Default::default()
        }
    }
    /// It loads a serving deployment's fabric and GPUs: `verify` and `watch` run it only when
    /// named.
    fn checking(&self, _desired: &Desired) -> crate::kind::Checking {
        crate::kind::Checking {
            unnamed: false,
            soak_secs: None,
            readiness: false,
        }
    }
    fn images(&self, desired: &Desired, _: Option<&Recorded>) -> Vec<(String, Option<String>)> {
        vec![(desired.image.clone(), None)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!(
            "{}/tests/fixtures/nccl-tests/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn figure(name: &str) -> (f64, Option<u64>) {
        let b = parse_busbw(&fixture(name)).unwrap_or_else(|| panic!("{name}: no figure"));
        (b.gbps, b.size_bytes)
    }

    #[test]
    fn the_figure_is_the_best_column_at_the_largest_size_of_real_outputs() {
        // Two Sparks, 16 GiB all-gather: in-place 20.95 beats out-of-place 18.94.
        assert_eq!(
            figure("spark-all-gather-16g.txt"),
            (20.95, Some(17179869184))
        );
        assert_eq!(figure("spark-all-reduce-head.txt"), (1.01, Some(65536)));
        // The largest size, not the largest figure, and not the average line.
        assert_eq!(
            figure("large-all-reduce-tail.txt"),
            (361.17, Some(17179869184))
        );
        // mpirun's prefix; all zeros is a figure (0), not "no figure".
        assert_eq!(figure("mpirun-prefixed.txt"), (0.0, Some(32)));
        // No root column, an `error` column of floats.
        assert_eq!(figure("old-error-column.txt"), (0.62, Some(131072)));
    }

    #[test]
    fn without_rows_the_average_line_is_the_figure() {
        let b = parse_busbw("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 12.5 \n");
        assert_eq!(
            b,
            Some(Busbw {
                gbps: 12.5,
                size_bytes: None
            })
        );
        assert_eq!(
            parse_busbw("NCCL WARN NET/Socket : no interface\nerror"),
            None
        );
        assert_eq!(
            parse_busbw("   8  2  float  sum  -1  nan  nan  nan  0\n"),
            None
        );
    }

    #[test]
    fn bad_values_are_named() {
        let mut d = Desired {
            image: "i".into(),
            ranks: Vec::new(),
            env: BTreeMap::new(),
            gpus: BTreeMap::new(),
            min_busbw_gbps: Number::from(0),
            port: default_port(),
            size: Number::from(10),
            iterations: default_iterations(),
            timeout: default_timeout(),
            shm_size: None,
            devices: None,
            cap_add: None,
            ulimits: None,
        };
        let named: Vec<&str> = check(&d).iter().map(|p| p.0).collect();
        assert_eq!(named, ["min_busbw_gbps", "size"]);
        d.min_busbw_gbps = Number::from(20);
        d.size = default_size();
        assert!(check(&d).is_empty());
    }
}

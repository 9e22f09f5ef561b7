//! Replicas behind a router (`kinds::router`): an apply that replaces them takes one out of the
//! router, replaces it, passes its probe, puts it back, then the next; a replica whose
//! replacement fails is rolled back and put back while the ones done before keep their new
//! version. On fake nodes with fake Docker Engines: the router's HAProxy commands are `docker
//! exec`s in its container, which the fake engine answers and records in order.

use std::path::Path;
use std::sync::Arc;

use sparkform::apply::ApplyOutcome;
use sparkform::config::VarInputs;
use sparkform::hosts::{Host, HostOptions};
use sparkform::kinds::machine::ReadMode;
use sparkform::ops::apply::{lock_and_plan, LockedPlan, PlanRequest, PlanSource, RunOptions};
use sparkform::ops::OpError;
use sparkform::plan::{Action, PlanOptions};
use sparkform::state::StateStore;
use sparkform::workspace::Workspace;
use sparkform_testkit::fake::{node_with_engine, Answer, FakeHost, FakeNodes, FakeWorld};
use sparkform_testkit::fake_docker::{FakeDocker, Fault};

/// Two replicas (`a` on n1, `b` on n2), each an engine and its own probe, behind a router on
/// n1; the engines run `serve FLAG`.
fn write(dir: &Path, flag: &str) {
    write_replicas(dir, flag, "a = node.n1, b = node.n2");
}

/// The same with the replicas `REPLICAS` (`a = node.n1`).
fn write_replicas(dir: &Path, flag: &str, replicas: &str) {
    let hcl = format!(
        r#"
node "n1" {{ address = "10.0.0.1" }}
node "n2" {{ address = "10.0.0.2" }}

locals {{
  replicas = {{ {replicas} }}
}}

container "engine" {{
  for_each = local.replicas
  node     = each.value
  image    = "eng:1"
  command  = ["serve", "{flag}"]
  ready {{
    exec     = ["true"]
    timeout  = "2s"
    interval = "1s"
  }}
}}

probe "direct" {{
  for_each = local.replicas
  exec {{
    container = container.engine[each.key]
    command   = ["answer"]
  }}
  timeout  = "2s"
  interval = "1s"
}}

container "haproxy" {{
  node  = node.n1
  image = "haproxy:1"
}}

router "api" {{
  container     = container.haproxy
  drain_timeout = "5s"
  port          = 8000
  replicas = {{
    for k in keys(local.replicas) : k => {{
      address = "${{local.replicas[k].address}}:8000"
      members = [container.engine[k], probe.direct[k]]
    }}
  }}
}}

probe "endpoint" {{
  exec {{
    container = container.haproxy
    command   = ["answer", router.api.name]
  }}
  timeout = "2s"
}}
"#
    );
    std::fs::write(dir.join("main.hcl"), hcl).unwrap();
}

struct Bed {
    dir: tempfile::TempDir,
    hosts: Vec<(String, Arc<dyn Host>)>,
    n1: Arc<FakeDocker>,
    n2: Arc<FakeDocker>,
    /// n3, n4… where a test has more nodes.
    others: Vec<Arc<FakeDocker>>,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "1");
        Bed::on(dir, 2)
    }

    /// `nodes` fake nodes (node.n1…) for the definitions in `dir`.
    fn on(dir: tempfile::TempDir, nodes: usize) -> Bed {
        Bed::listening(dir, nodes, "")
    }

    /// The same, with n1's `/proc/net/tcp` saying `tcp` (what listens there).
    fn listening(dir: tempfile::TempDir, nodes: usize, tcp: &str) -> Bed {
        let world = FakeWorld::new();
        let mut hosts = Vec::new();
        let mut engines = Vec::new();
        for i in 1..=nodes {
            let (h, e) = if i == 1 {
                let engine = Arc::new(FakeDocker::start().unwrap());
                let host = FakeHost::new("node.n1", &world)
                    .interface("eth1", 1500, &[])
                    .docker_engine(engine.clone());
                host.on(
                    &["cat", "/proc/net/tcp"],
                    Answer::Exit(0, tcp.into(), String::new()),
                );
                (
                    ("node.n1".to_string(), Arc::new(host) as Arc<dyn Host>),
                    engine,
                )
            } else {
                node_with_engine(&format!("node.n{i}"), &world).unwrap()
            };
            hosts.push(h);
            engines.push(e);
        }
        let others = engines.split_off(2);
        let n2 = engines.pop().unwrap();
        let n1 = engines.pop().unwrap();
        Bed {
            dir,
            hosts,
            n1,
            n2,
            others,
        }
    }

    fn engines(&self) -> impl Iterator<Item = &Arc<FakeDocker>> {
        [&self.n1, &self.n2].into_iter().chain(&self.others)
    }

    async fn apply(&self) -> (sparkform::plan::Plan, String, ApplyOutcome) {
        self.run(PlanSource::Definitions {
            refresh: ReadMode::Normal,
            options: PlanOptions::default(),
        })
        .await
    }

    /// `sparkform rollback`: the generation before the one running now.
    async fn rollback(&self) -> (sparkform::plan::Plan, String, ApplyOutcome) {
        self.run(PlanSource::Generation { number: None }).await
    }

    fn hosts(&self) -> HostOptions {
        HostOptions {
            opener: FakeNodes::new(self.hosts.iter().cloned().collect()).opener(),
            ..HostOptions::default()
        }
    }

    /// The definitions in the folder planned from `source`, the state lock held.
    async fn plan(
        &self,
        source: PlanSource<'_>,
        tx: &sparkform::events::Sender,
    ) -> Result<LockedPlan, OpError> {
        let evaluated = sparkform::ops::definitions::load(
            &Workspace::new(self.dir.path(), None),
            &VarInputs::default(),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        lock_and_plan(
            PlanRequest {
                evaluated,
                lockfile_readonly: false,
                store: StateStore::new(self.dir.path().join("state/sparkform.json")),
                source,
                hosts: self.hosts(),
            },
            tx,
        )
        .await
    }

    async fn run(&self, source: PlanSource<'_>) -> (sparkform::plan::Plan, String, ApplyOutcome) {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let prepared = self
            .plan(source, &tx)
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        let plan = prepared.plan.clone();
        let text = sparkform::plan::render::render(&plan);
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            prepared.apply(
                RunOptions {
                    parallelism: 4,
                    rollback: true,
                    hosts: self.hosts(),
                },
                tx,
                tokio_util::sync::CancellationToken::new(),
            ),
        )
        .await
        .expect("the roll waited forever");
        (plan, text, outcome)
    }

    /// Both engines' requests and commands since `from`, in the order they came, as short
    /// words: `drain a`, `admit b`, `stop engine-a`, `create engine-b`; `drain a done` where
    /// the router's command was made to take a while (`Fault::ExecTakes`).
    fn events(&self, from: u64) -> Vec<String> {
        let mut all: Vec<(u64, String)> = self
            .engines()
            .flat_map(|e| e.timeline())
            .filter(|(at, _)| *at >= from)
            .collect();
        all.sort();
        all.into_iter()
            .filter_map(|(_, e)| {
                let (cmd, done) = match e.strip_prefix("exec done haproxy: ") {
                    Some(cmd) => (Some(cmd), " done"),
                    None => (e.strip_prefix("exec haproxy: "), ""),
                };
                if let Some(cmd) = cmd {
                    // The script's arguments: backend, server, bound, then the add's address
                    // and options.
                    let args = cmd.rsplit_once(" sh engines ")?.1;
                    let server = args.split_whitespace().next()?.to_string();
                    let what = if cmd.contains("del server") {
                        "delete"
                    } else if cmd.contains("add server") {
                        "add"
                    } else if cmd.contains("state drain") {
                        "drain"
                    } else if cmd.contains("state ready") {
                        "admit"
                    } else {
                        return None;
                    };
                    return Some(format!("{what} {server}{done}"));
                }
                if let Some(name) = e.strip_prefix("create ") {
                    return name
                        .starts_with("engine-")
                        .then(|| format!("create {name}"));
                }
                let name = e.strip_prefix("stop ")?;
                // A replaced container is stopped under the name it was renamed to.
                let engine = [
                    "engine-a0",
                    "engine-a1",
                    "engine-b0",
                    "engine-b1",
                    "engine-a",
                    "engine-b",
                ]
                .into_iter()
                .find(|n| name.starts_with(n))?;
                Some(format!("stop {engine}"))
            })
            .collect()
    }

    fn now(&self) -> u64 {
        self.engines()
            .filter_map(|d| d.timeline().last().map(|(at, _)| *at))
            .max()
            .unwrap_or(0)
            + 1
    }
}

#[tokio::test]
async fn a_change_rolls_through_the_replicas_one_at_a_time_behind_the_router() {
    let bed = Bed::new();
    let (_, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let from = bed.now();
    write(bed.dir.path(), "2");
    let (plan, text, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    for a in [r#"container.engine["a"]"#, r#"container.engine["b"]"#] {
        assert_eq!(plan.change(a).map(|c| c.action), Some(Action::Replace));
    }
    // One replica out at a time, even with four steps allowed at once: each taken out before
    // its engine stops, put back after its new engine (and its probe) before the next goes.
    assert_eq!(
        bed.events(from),
        [
            "drain a",
            "stop engine-a",
            "create engine-a",
            "admit a",
            "drain b",
            "stop engine-b",
            "create engine-b",
            "admit b",
        ]
    );
    // The plan said so, and no outage.
    assert!(
        text.contains("Rolling behind router.api, one replica at a time: the endpoint stays up.")
            && text.contains(
                "2 of 2 → 1 of 2 (a replaced, step 1) → 2 of 2 → 1 of 2 (b replaced, step 2) → 2 of 2"
            )
            && !text.contains("Expected outage"),
        "{text}"
    );
}

#[tokio::test]
async fn a_rollback_rolls_through_the_replicas_one_at_a_time_too() {
    let bed = Bed::new();
    let (_, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    write(bed.dir.path(), "2");
    let (_, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let from = bed.now();
    let (plan, text, outcome) = bed.rollback().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    for a in [r#"container.engine["a"]"#, r#"container.engine["b"]"#] {
        assert_eq!(plan.change(a).map(|c| c.action), Some(Action::Replace));
    }
    assert_eq!(
        bed.events(from),
        [
            "drain a",
            "stop engine-a",
            "create engine-a",
            "admit a",
            "drain b",
            "stop engine-b",
            "create engine-b",
            "admit b",
        ]
    );
    assert!(
        text.contains("one replica at a time: the endpoint stays up")
            && !text.contains("Expected outage"),
        "{text}"
    );
    let cmd = |d: &FakeDocker, name: &str| d.container(name).map(|c| c.created["Cmd"].clone());
    assert_eq!(
        cmd(&bed.n1, "engine-a"),
        Some(serde_json::json!(["serve", "1"]))
    );
    assert_eq!(
        cmd(&bed.n2, "engine-b"),
        Some(serde_json::json!(["serve", "1"]))
    );
}

#[tokio::test]
async fn a_replica_whose_replacement_fails_is_put_back_and_the_one_before_keeps_its_new_version() {
    let bed = Bed::new();
    let (_, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let from = bed.now();
    bed.n2.fault(
        "engine-b",
        Fault::CreateFails("no room for engine b".into()),
    );
    write(bed.dir.path(), "2");
    let (_, _, outcome) = bed.apply().await;
    assert!(!outcome.ok, "engine b could not be created");
    let failed: Vec<&str> = outcome.failures.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        failed,
        [r#"container.engine["b"]"#],
        "the error names the replica"
    );
    // a was rolled and put back; b was taken out, failed, and put back with its old engine.
    assert_eq!(
        bed.events(from),
        [
            "drain a",
            "stop engine-a",
            "create engine-a",
            "admit a",
            "drain b",
            "stop engine-b",
            "admit b",
        ]
    );
    let cmd = |d: &FakeDocker, name: &str| {
        let c = d
            .container(name)
            .unwrap_or_else(|| panic!("{name} is gone"));
        assert!(c.running, "{name} does not run");
        c.created["Cmd"].clone()
    };
    assert_eq!(cmd(&bed.n1, "engine-a"), serde_json::json!(["serve", "2"]));
    assert_eq!(cmd(&bed.n2, "engine-b"), serde_json::json!(["serve", "1"]));
    assert!(
        outcome
            .notes
            .iter()
            .any(|n| n.contains(r#"container.engine["a"]"#)),
        "{:?}",
        outcome.notes
    );
    // The next plan replaces b alone.
    bed.n2.heal();
    let (plan, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let replaced: Vec<&str> = plan
        .changes
        .iter()
        .filter(|c| c.action == Action::Replace)
        .map(|c| c.address.as_str())
        .collect();
    assert_eq!(replaced, [r#"container.engine["b"]"#]);
}

/// `show stat` as HAProxy answers it with servers `names` in the backend `engines`.
fn show_stat(names: &[&str]) -> String {
    let mut out = String::from("# pxname,svname,qcur,scur,status,addr\napi,FRONTEND,,0,OPEN,\n");
    for (i, n) in names.iter().enumerate() {
        out.push_str(&format!("engines,{n},0,0,UP,10.0.0.{}:8000\n", i + 1));
    }
    out.push_str("engines,BACKEND,0,0,UP,\n");
    out
}

#[tokio::test]
async fn a_removed_replica_is_drained_before_its_engine_stops_and_an_added_one_admitted_after_its_probe(
) {
    let bed = Bed::new();
    let (_, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    // HAProxy lists both servers; b goes.
    bed.n1.fault(
        "haproxy",
        Fault::ExecAnswers("show stat".into(), show_stat(&["a", "b"])),
    );
    // A drain takes a while: what waits for it starts after it ends.
    bed.n1
        .fault("haproxy", Fault::ExecTakes("state drain".into(), 300));
    let from = bed.now();
    write_replicas(bed.dir.path(), "1", "a = node.n1");
    let (plan, text, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(
        plan.change(r#"container.engine["b"]"#).map(|c| c.action),
        Some(Action::Delete)
    );
    assert_eq!(
        plan.change("router.api").map(|c| c.action),
        Some(Action::Update)
    );
    assert_eq!(
        bed.events(from),
        [
            "drain b",
            "drain b done",
            "stop engine-b",
            "delete b",
            "delete b done",
            "admit a"
        ],
        "drained before its engine stops; its server deleted by the router's update"
    );
    assert!(bed.n1.container("haproxy").is_some_and(|c| c.running));
    assert!(
        !text.contains("Expected outage")
            && text.contains("Scaling behind router.api: 2 → 1 replicas, with no restart of the router: the endpoint stays up.")
            && text.contains("b taken out of the router (drained) before it is removed."),
        "{text}"
    );
    // And back: b is created, passes its probe, then is added and admitted; the router is
    // not restarted.
    bed.n1.fault(
        "haproxy",
        Fault::ExecAnswers("show stat".into(), show_stat(&["a"])),
    );
    let haproxy = bed.n1.container("haproxy").map(|c| c.id);
    let from = bed.now();
    write(bed.dir.path(), "1");
    let (_, text, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    assert_eq!(
        bed.events(from),
        ["create engine-b", "admit a", "add b", "admit b"]
    );
    assert!(
        text.contains("1 → 2 replicas") && text.contains("b put in once its probes pass."),
        "{text}"
    );
    assert_eq!(bed.n1.container("haproxy").map(|c| c.id), haproxy);
}

/// Two tensor-parallel replicas, each a process group of two ranks over a pair of nodes (`a` on
/// n1 and n2, `b` on n3 and n4) with its own probe, behind a router on n1.
fn write_pairs(dir: &Path, flag: &str) {
    let hcl = format!(
        r#"
node "n1" {{ address = "10.0.0.1" }}
node "n2" {{ address = "10.0.0.2" }}
node "n3" {{ address = "10.0.0.3" }}
node "n4" {{ address = "10.0.0.4" }}

locals {{
  pairs = {{ a = [node.n1, node.n2], b = [node.n3, node.n4] }}
}}

container "rank0" {{
  for_each      = local.pairs
  name          = "engine-${{each.key}}0"
  node          = each.value[0]
  image         = "eng:1"
  command       = ["serve", "{flag}"]
  process_group = each.key
  ready {{
    exec     = ["true"]
    timeout  = "2s"
    interval = "1s"
  }}
}}

container "rank1" {{
  for_each      = local.pairs
  name          = "engine-${{each.key}}1"
  node          = each.value[1]
  image         = "eng:1"
  command       = ["serve", "{flag}", "--headless"]
  process_group = each.key
}}

probe "direct" {{
  for_each = local.pairs
  exec {{
    container = container.rank0[each.key]
    command   = ["answer", container.rank1[each.key].name]
  }}
  timeout  = "2s"
  interval = "1s"
}}

container "haproxy" {{
  node  = node.n1
  image = "haproxy:1"
}}

router "api" {{
  container     = container.haproxy
  drain_timeout = "5s"
  replicas = {{
    for k, nodes in local.pairs : k => {{
      address = "${{nodes[0].address}}:8000"
      members = [container.rank0[k], container.rank1[k], probe.direct[k]]
    }}
  }}
}}
"#
    );
    std::fs::write(dir.join("main.hcl"), hcl).unwrap();
}

#[tokio::test]
async fn tensor_parallel_replicas_roll_one_group_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    write_pairs(dir.path(), "1");
    let bed = Bed::on(dir, 4);
    let (_, _, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let from = bed.now();
    write_pairs(bed.dir.path(), "2");
    let (_, text, outcome) = bed.apply().await;
    assert!(outcome.ok, "{:?}", outcome.failures);
    let events = bed.events(from);
    // Each group's two ranks are replaced together (their start gate) between its drain and
    // its admit; b's ranks stop only once a is back.
    let at = |e: &str| {
        events
            .iter()
            .position(|x| x == e)
            .unwrap_or_else(|| panic!("no {e} in {events:?}"))
    };
    for (g, next) in [("a", Some("b")), ("b", None)] {
        for r in ["0", "1"] {
            assert!(
                at(&format!("drain {g}")) < at(&format!("stop engine-{g}{r}")),
                "{events:?}"
            );
            assert!(
                at(&format!("create engine-{g}{r}")) < at(&format!("admit {g}")),
                "{events:?}"
            );
            if let Some(n) = next {
                assert!(
                    at(&format!("admit {g}")) < at(&format!("drain {n}")),
                    "{events:?}"
                );
            }
        }
    }
    assert!(
        text.contains(
            "2 of 2 → 1 of 2 (a replaced, step 1) → 2 of 2 → 1 of 2 (b replaced, step 2) → 2 of 2"
        ),
        "{text}"
    );
}

/// The router's port held on its node by something the deployment does not run: refused at
/// plan, naming the router, the node and the fix; once the router's container is recorded, what
/// listens there is the router itself.
#[tokio::test]
async fn a_router_port_taken_on_its_node_is_refused_at_plan() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "1");
    // 8000 (0x1F40) in LISTEN (0A) on every address.
    let tcp = "  sl  local_address rem_address   st\n   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n";
    let bed = Bed::listening(dir, 2, tcp);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let refused = bed
        .plan(
            PlanSource::Definitions {
                refresh: ReadMode::Normal,
                options: PlanOptions::default(),
            },
            &tx,
        )
        .await;
    let Err(e) = refused else {
        panic!("the plan went ahead with the router's port taken");
    };
    let said = format!("{e:?}");
    assert!(
        said.contains("router.api: port 8000 is taken on node.n1")
            && said.contains("choose another `port`"),
        "{said}"
    );
    assert!(bed.n1.container("haproxy").is_none(), "nothing started");
}

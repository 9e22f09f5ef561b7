//! The `model` kind: its lowering (a resource per node, roles, fabric addresses, the value
//! modules reference), what a resolved revision changes in a plan, the errors of a bad block,
//! and on fake nodes the transfer token its serve and pull containers get.

use crate::common;

use sparkform::config::{self, ModelReadings, Readings, VarInputs};
use sparkform::diag::render_plain;
use sparkform::graph::Graph;
use sparkform::plan::{self, Action};

const COMMIT_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const COMMIT_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn base(model: &str) -> String {
    format!(
        r#"
variable "hf_token" {{
  type      = string
  default   = "hf_secret_value"
  sensitive = true
}}
node "a" {{
  address = "10.0.0.1"
}}
node "b" {{
  address = "10.0.0.2"
}}
network "roce" {{
  subnet = "192.168.200.0/24"
  attach "a" {{
    node      = node.a
    interface = "eth1"
    address   = "192.168.200.1"
  }}
  attach "b" {{
    node      = node.b
    interface = "eth1"
    address   = "192.168.200.2"
  }}
}}
{model}
output "path" {{
  value = model.m.path
}}
output "size" {{
  value = model.m.size_bytes
}}
output "arch" {{
  value = join(",", model.m.architectures)
}}
"#
    )
}

const MODEL: &str = r#"
model "m" {
  repo     = "org/name"
  nodes    = [node.a, node.b]
  cache    = "/data/hf"
  network  = network.roce
  token    = var.hf_token
  image    = "img:1"
}
"#;

fn observed(commit: &str, revision: &str) -> Readings {
    let mut o = Readings::default();
    o.models.insert(
        "model.m".into(),
        ModelReadings {
            revision: revision.into(),
            commit: commit.into(),
            manifest: serde_json::json!({"total_bytes": 3000, "files": [{"path": "a"}, {"path": "b"}]}),
            config: serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 3}),
        },
    );
    o
}

fn load(text: &str, obs: &Readings) -> (config::Config, Graph) {
    let dir = common::write_config(&[("main.hcl", text)]);
    match config::load_with_readings(dir.path(), &VarInputs::default(), obs) {
        Ok(c) => {
            let g = Graph::build(&c).expect("graph");
            (c, g)
        }
        Err(d) => panic!("{}", render_plain(&d.0)),
    }
}

fn errors(text: &str) -> String {
    let dir = common::write_config(&[("main.hcl", text)]);
    match config::load(dir.path(), &VarInputs::default()) {
        Ok(_) => panic!("loaded without errors"),
        Err(d) => render_plain(&d.0),
    }
}

fn output<'a>(c: &'a config::Config, name: &str) -> &'a serde_json::Value {
    &c.outputs.iter().find(|o| o.name == name).expect(name).value
}

#[test]
fn a_resource_per_node_the_first_downloads_the_others_pull_over_the_fabric() {
    let (c, _) = load(&base(MODEL), &observed(COMMIT_A, "main"));
    let a = c.resource("model.m[\"a\"]").expect("a");
    let b = c.resource("model.m[\"b\"]").expect("b");
    assert_eq!(a.node.as_deref(), Some("node.a"));
    assert_eq!(a.config["role"], "download");
    assert_eq!(b.config["role"], "pull");
    assert_eq!(b.config["source_address"], "192.168.200.1");
    assert_eq!(b.config["address"], "192.168.200.2");
    assert_eq!(a.config["commit"], COMMIT_A);
    assert_eq!(a.config["total_bytes"], 3000);
    assert_eq!(a.config["files"], 2);
    // the pull waits for the download; both wait for the fabric
    assert!(b.deps.contains("model.m[\"a\"]"), "{:?}", b.deps);
    assert!(a.deps.iter().any(|d| d.starts_with("network.roce.attach")));
    // the token is on the download node only, and sensitive there
    assert_eq!(a.config["token"], "hf_secret_value");
    assert_eq!(a.sensitive, vec![vec!["token".to_string()]]);
    assert!(b.config.get("token").is_none());
    assert_eq!(
        output(&c, "path"),
        &serde_json::json!(format!("/data/hf/models--org--name/snapshots/{COMMIT_A}"))
    );
    assert_eq!(output(&c, "size"), &serde_json::json!(3000));
    assert_eq!(output(&c, "arch"), &serde_json::json!("Qwen3ForCausalLM"));
}

#[test]
fn the_state_holds_the_tokens_hash_not_the_token() {
    let (c, g) = load(&base(MODEL), &observed(COMMIT_A, "main"));
    let p = common::plan(&c, &g, &sparkform::state::State::new());
    let text = serde_json::to_string(&p).unwrap();
    assert!(!text.contains("hf_secret_value"), "{text}");
    let rendered = plan::render::render(&p);
    assert!(!rendered.contains("hf_secret_value"));
    assert!(rendered.contains("(sensitive)"), "{rendered}");
}

#[test]
fn download_node_chooses_who_downloads() {
    let m = MODEL.replace("image    = \"img:1\"", "download_node = node.b");
    let (c, _) = load(&base(&m), &observed(COMMIT_A, "main"));
    assert_eq!(
        c.resource("model.m[\"b\"]").unwrap().config["role"],
        "download"
    );
    let a = c.resource("model.m[\"a\"]").unwrap();
    assert_eq!(a.config["role"], "pull");
    assert_eq!(a.config["source_address"], "192.168.200.2");
    assert_eq!(a.config["image"], "vllm/vllm-openai:latest");
}

#[test]
fn unresolved_the_commit_is_null_and_the_path_says_so() {
    let (c, _) = load(&base(MODEL), &Readings::default());
    assert!(c.resource("model.m[\"a\"]").unwrap().config["commit"].is_null());
    assert_eq!(output(&c, "arch"), &serde_json::json!(""));
    assert!(output(&c, "size").is_null());
    let path = output(&c, "path").as_str().unwrap().to_string();
    assert!(path.ends_with("/snapshots/unresolved-main"), "{path}");
    // an observation for another revision is not this one's
    let (c, _) = load(&base(MODEL), &observed(COMMIT_A, "v2"));
    assert!(c.resource("model.m[\"a\"]").unwrap().config["commit"].is_null());
    // a commit as the revision needs no resolution
    let m = MODEL.replace(
        "repo     = \"org/name\"",
        &format!("repo = \"org/name\"\n  revision = \"{COMMIT_B}\""),
    );
    let (c, _) = load(&base(&m), &Readings::default());
    assert_eq!(
        c.resource("model.m[\"a\"]").unwrap().config["commit"],
        COMMIT_B
    );
}

#[test]
fn a_new_commit_replaces_every_node_and_a_new_image_does_not() {
    let (c, g) = load(&base(MODEL), &observed(COMMIT_A, "main"));
    let state = {
        let mut s = sparkform::state::State::new();
        let p = common::plan(&c, &g, &s);
        plan::record(&p, &mut s);
        s
    };
    let same = common::plan(&c, &g, &state);
    assert!(!same.has_changes(), "re-plan has no change");
    let (c2, g2) = load(&base(MODEL), &observed(COMMIT_B, "main"));
    let p = common::plan(&c2, &g2, &state);
    for n in ["a", "b"] {
        let ch = p.change(&format!("model.m[\"{n}\"]")).unwrap();
        assert_eq!(ch.action, Action::Replace, "{n}");
        assert!(
            ch.replace_reasons
                .iter()
                .any(|r| r.contains("main now points at bbbbbbbbbbbb")),
            "{:?}",
            ch.replace_reasons
        );
    }
    let (c3, g3) = load(
        &base(&MODEL.replace("img:1", "img:2")),
        &observed(COMMIT_A, "main"),
    );
    let p = common::plan(&c3, &g3, &state);
    assert_eq!(p.change("model.m[\"a\"]").unwrap().action, Action::Update);
}

#[test]
fn a_container_using_the_path_depends_on_every_nodes_weights() {
    let text = base(MODEL)
        + r#"
container "vllm" {
  node    = node.a
  image   = "img:1"
  command = ["vllm", "serve", model.m.path]
}
"#;
    let (c, _) = load(&text, &observed(COMMIT_A, "main"));
    let v = c.resource("container.vllm").unwrap();
    assert!(
        v.deps.contains("model.m[\"a\"]") && v.deps.contains("model.m[\"b\"]"),
        "{:?}",
        v.deps
    );
}

#[test]
fn bad_blocks_say_what_and_how() {
    let e = errors(&base(&MODEL.replace("org/name", "no-slash")));
    assert!(e.contains("is not a repository id ORG/NAME"), "{e}");
    let e = errors(&base(&MODEL.replace("/data/hf", "relative/path")));
    assert!(e.contains("invalid `cache`"), "{e}");
    let e = errors(&base(&MODEL.replace("  network  = network.roce\n", "")));
    assert!(
        e.contains("`network` is required with more than one node"),
        "{e}"
    );
    let e = errors(&base(
        &MODEL.replace("[node.a, node.b]", "[node.a, node.a]"),
    ));
    assert!(e.contains("listed twice"), "{e}");
    let lonely = base(MODEL).replace(
        "  attach \"b\" {\n    node      = node.b\n    interface = \"eth1\"\n    address   = \"192.168.200.2\"\n  }\n",
        "",
    );
    let e = errors(&lonely);
    assert!(e.contains("has no attachment on node.b"), "{e}");
    let e = errors(&base(
        &MODEL.replace("image    = \"img:1\"", "download_node = \"elsewhere\""),
    ));
    assert!(e.contains("download_node"), "{e}");
}

/// The testbed example with a model block handed to the Ray launcher.
fn launcher_with_weights() -> String {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/testbed-standin/main.hcl"
    ))
    .unwrap();
    let modules = concat!(env!("CARGO_MANIFEST_DIR"), "/modules");
    // The example's own model block gives way to `m`.
    let start = example
        .find("model \"qwen\" {")
        .expect("the example's model block");
    let end = start + example[start..].find("\n}\n").expect("its end") + 3;
    let example = format!("{}{}", &example[..start], &example[end..]);
    example.replace("../../modules", modules).replace(
        "  weights                = model.qwen\n",
        "  weights                = model.m\n",
    ) + r#"
model "m" {
  repo    = "org/name"
  nodes   = [node.node1, node.node2]
  cache   = "/data/hf/hub"
  network = network.roce
}
"#
}

fn observed_main(commit: &str) -> Readings {
    observed(commit, "main")
}

#[test]
fn the_launcher_serves_the_snapshot_offline_and_a_new_commit_replaces_vllm_not_ray() {
    let text = launcher_with_weights();
    let (c, g) = load(&text, &observed_main(COMMIT_A));
    let vllm = c.resource("module.qwen.container.vllm").expect("vllm");
    let cmd = vllm.config["command"].to_string();
    assert!(
        cmd.contains(&format!(
            "/data/hf/hub/models--org--name/snapshots/{COMMIT_A}"
        )),
        "{cmd}"
    );
    assert!(
        cmd.contains("\"--served-model-name\",\"org/name\""),
        "{cmd}"
    );
    let ray_head = c
        .resources
        .iter()
        .find(|r| {
            r.address.starts_with("module.qwen.module.ray.container.") && r.address.contains("head")
        })
        .expect("ray head");
    for r in [vllm, ray_head] {
        assert_eq!(r.config["env"]["HF_HUB_OFFLINE"], "1", "{}", r.address);
        assert!(
            r.config["volumes"]
                .to_string()
                .contains("/data/hf/hub:/data/hf/hub:ro"),
            "{}",
            r.address
        );
        for n in ["node1", "node2"] {
            assert!(
                r.deps.contains(&format!("model.m[\"{n}\"]")),
                "{} waits for {n}'s weights: {:?}",
                r.address,
                r.deps
            );
        }
    }
    let mut state = sparkform::state::State::new();
    let p = common::plan(&c, &g, &state);
    plan::record(&p, &mut state);
    let (c2, g2) = load(&text, &observed_main(COMMIT_B));
    let p = common::plan(&c2, &g2, &state);
    assert_eq!(
        p.change("module.qwen.container.vllm").unwrap().action,
        Action::Replace
    );
    assert_eq!(
        p.change("model.m[\"node2\"]").unwrap().action,
        Action::Replace
    );
    for ch in p
        .changes
        .iter()
        .filter(|c| c.address.contains(".module.ray.container."))
    {
        assert_eq!(ch.action, Action::NoOp, "{} is left alone", ch.address);
    }
}

#[test]
fn the_architecture_check_runs_after_the_weights_and_before_every_container_using_them() {
    let text = launcher_with_weights().replace(
        "  network = network.roce\n}",
        "  network = network.roce\n  serve_image = \"sparkform-testbed/ray:latest\"\n}",
    );
    let (c, _) = load(&text, &observed_main(COMMIT_A));
    let all = |_: &str| true;
    let checks = sparkform::kinds::model::machine::architecture_checks(&c, &all);
    assert_eq!(checks.len(), 1, "{checks:?}");
    let ch = &checks[0];
    assert_eq!(ch.address, "model.m (architecture check)");
    assert!(ch.after.contains(&"model.m[\"node1\"]".to_string()));
    assert!(
        ch.before
            .contains(&"module.qwen.container.vllm".to_string()),
        "{:?}",
        ch.before
    );
    assert!(
        ch.before
            .iter()
            .any(|b| b.contains(".module.ray.container.")),
        "Ray waits too: {:?}",
        ch.before
    );
    // nothing changed: no check
    let none = |_: &str| false;
    assert!(sparkform::kinds::model::machine::architecture_checks(&c, &none).is_empty());
    // without serve_image there is none either
    let (c, _) = load(&launcher_with_weights(), &observed_main(COMMIT_A));
    assert!(sparkform::kinds::model::machine::architecture_checks(&c, &all).is_empty());
}

#[test]
fn a_registry_lacking_the_architecture_is_named() {
    use sparkform::kinds::model::machine::lacking;
    let want = vec!["Qwen3ForCausalLM".to_string()];
    let have = serde_json::json!({"architectures": ["LlamaForCausalLM", "Qwen3ForCausalLM"]});
    assert!(lacking(&want, &have).unwrap().is_empty());
    let noarch = serde_json::json!({"architectures": ["LlamaForCausalLM"]});
    assert_eq!(lacking(&want, &noarch).unwrap(), want);
    let broken = serde_json::json!({"error": "ModuleNotFoundError: No module named 'vllm'"});
    assert!(lacking(&want, &broken)
        .unwrap_err()
        .contains("No module named"));
}

/// What a recovery apply met after a kill left an untracked copy of a container that uses
/// the weights (issue: "Apply complete" after 2 of 10 steps): the untracked copy's delete
/// waited for the architecture check (it shares the guarded container's address), the check
/// for the new weights, and the weights (like every change) for every delete. The apply then
/// ran the two checks that waited for nothing and reported success.
#[test]
fn a_new_commit_with_an_untracked_copy_of_a_weights_user_plans_steps_that_can_all_start() {
    let text = launcher_with_weights().replace(
        "  network = network.roce\n}",
        "  network = network.roce\n  serve_image = \"sparkform-testbed/ray:latest\"\n}",
    );
    let (c, g) = load(&text, &observed_main(COMMIT_A));
    let mut state = sparkform::state::State::new();
    let p = common::plan(&c, &g, &state);
    plan::record(&p, &mut state);
    let (c2, g2) = load(&text, &observed_main(COMMIT_B));
    let vllm = "module.qwen.container.vllm";
    let observations = plan::Observations {
        resources: Default::default(),
        orphans: vec![plan::Orphan {
            kind: sparkform::vocabulary::KindId::Container,
            address: vllm.into(),
            node: "node.node1".into(),
            name: "sparkform-vllm".into(),
            id: "0123456789ab0123456789ab".into(),
            running: true,
        }],
        foreign: Vec::new(),
    };
    let p = plan::plan(
        &c2,
        &g2,
        &state,
        &plan::PlanOptions {
            observations: Some(observations),
            ..plan::PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
        },
    )
    .expect("plan");
    assert!(
        p.changes
            .iter()
            .any(|ch| ch.address == vllm && ch.orphan.is_some() && ch.action == Action::Delete),
        "{:#?}",
        p.changes
    );
    let steps = sparkform::apply::step_order(&c2, &g2, &p)
        .unwrap_or_else(|cycle| panic!("steps wait on each other: {}", cycle.join(" → ")));
    let check = "model.m (architecture check)";
    let waits = |address: &str, delete: bool| -> Vec<String> {
        let i = p
            .changes
            .iter()
            .filter(|ch| ch.action.is_change())
            .position(|ch| ch.address == address && (ch.action == Action::Delete) == delete)
            .unwrap_or_else(|| panic!("no step for {address}"));
        steps[i].1.clone()
    };
    // The untracked copy goes first, waiting for nothing; the new vLLM waits for the check.
    assert!(
        !waits(vllm, true).contains(&check.to_string()),
        "{:?}",
        waits(vllm, true)
    );
    assert!(
        waits(vllm, false).contains(&check.to_string()),
        "{:?}",
        waits(vllm, false)
    );
}

/// A hub token written as a literal is still a secret: the plan and the state hold its keyed
/// hash only, and the load warns that it is in the definitions.
#[test]
fn a_literal_token_is_hashed_in_the_state_and_warned_about() {
    const LITERAL: &str = "hf_literal_token_0123456789";
    let text = base(&MODEL.replace("var.hf_token", &format!("\"{LITERAL}\"")));
    assert!(text.contains(LITERAL), "the fixture changed");
    let (c, g) = load(&text, &observed(COMMIT_A, "main"));
    assert!(
        c.warnings.iter().any(|w| w
            .message
            .contains("its hub token is written in the definitions")),
        "{:?}",
        c.warnings.iter().map(|w| &w.message).collect::<Vec<_>>()
    );
    let mut state = sparkform::state::State::new();
    let p = common::plan(&c, &g, &state);
    plan::record(&p, &mut state);
    let plan_text = serde_json::to_string(&p).unwrap();
    let state_text = serde_json::to_string(&state).unwrap();
    assert!(!plan_text.contains(LITERAL), "the plan holds the token");
    assert!(!state_text.contains(LITERAL), "the state holds the token");
    assert!(
        !plan::render::render(&p).contains(LITERAL),
        "the rendered plan shows the token"
    );
}

/// The files of a tar archive (ustar, as the model kind builds it): (name, contents).
fn tar_files(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at] != 0 {
        let h = &tar[at..at + 512];
        let name = String::from_utf8_lossy(&h[..100])
            .trim_end_matches('\0')
            .to_string();
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&h[124..136]).trim_end_matches(['\0', ' ']),
            8,
        )
        .expect("an octal size");
        out.push((name, tar[at + 512..at + 512 + size].to_vec()));
        at += 512 + size.div_ceil(512) * 512;
    }
    out
}

/// Every pull is a transfer of its own with a random token: the serve on the download node and
/// the pull get it as their standard input (the `input` file put into each container before it
/// starts, which the container removes once open), never in a command line, the environment,
/// an event or the state.
#[tokio::test]
async fn each_transfer_has_a_random_token_given_as_input_never_as_an_argument() {
    use sparkform::apply::{apply, ApplyRequest};
    use sparkform::hosts::{Host, HostOptions, HostPool};
    use sparkform_testkit::fake::{FakeHost, FakeWorld};
    use sparkform_testkit::fake_docker::{FakeDocker, Fault};
    use std::sync::Arc;

    let text = base(&MODEL.replace("[node.a, node.b]", "[node.a, node.b, node.c]"))
        .replace(
            "node \"b\" {",
            "node \"c\" {\n  address = \"10.0.0.3\"\n}\nnode \"b\" {",
        )
        .replace(
            "  attach \"b\" {",
            "  attach \"c\" {\n    node      = node.c\n    interface = \"eth1\"\n    address   = \"192.168.200.3\"\n  }\n  attach \"b\" {",
        );
    let dir = common::write_config(&[("main.hcl", &text)]);
    let (c, g) = common::load_resolved(dir.path());
    let commit = common::RESOLVED_COMMIT;
    let line = |v: serde_json::Value| vec![v.to_string()];
    let a = Arc::new(FakeDocker::start().unwrap());
    a.fault(
        "sparkform-model.m-a-download",
        Fault::ExitsAfterStart(
            0,
            line(serde_json::json!({"event": "result", "mode": "download", "commit": commit,
                                    "bytes_total": 3000, "bytes_downloaded": 3000, "files_downloaded": 2})),
        ),
    );
    let mut pullers = Vec::new();
    for n in ["b", "c"] {
        a.fault(
            &format!("sparkform-model.m-{n}-serve"),
            Fault::Logs(line(
                serde_json::json!({"event": "listening", "address": "192.168.200.1", "port": 40000}),
            )),
        );
        let d = Arc::new(FakeDocker::start().unwrap());
        d.fault(
            &format!("sparkform-model.m-{n}-pull"),
            Fault::ExitsAfterStart(
                0,
                line(serde_json::json!({"event": "result", "mode": "pull", "commit": commit,
                                        "bytes_total": 3000, "bytes_copied": 3000, "files_copied": 2})),
            ),
        );
        pullers.push((n, d));
    }
    let world = FakeWorld::new();
    let host = |name: &str, d: &Arc<FakeDocker>| {
        let h = FakeHost::new(name, &world)
            .interface("eth1", 1500, &[])
            .docker_engine(d.clone());
        (name.to_string(), Arc::new(h) as Arc<dyn Host>)
    };
    let mut hosts = vec![host("node.a", &a)];
    hosts.extend(pullers.iter().map(|(n, d)| host(&format!("node.{n}"), d)));
    let store = sparkform::state::StateStore::new(dir.path().join("state/sparkform.json"));
    let fresh = sparkform::state::State::new();
    // What a killed run of this deployment left on node a: an exited helper (removed by the
    // next run's first transfer there) and one still running (left to the step that replaces
    // or stops it by name); an exited helper of another deployment stays.
    let left = hosts[0].1.docker().await.unwrap();
    for (name, lineage, start) in [
        ("sparkform-model.m-a-remove", fresh.lineage.as_str(), false),
        (
            "sparkform-model.m-b-serve-old",
            fresh.lineage.as_str(),
            true,
        ),
        ("sparkform-other-remove", "another-deployment", false),
    ] {
        let labels = [
            ("sparkform.model-helper".to_string(), lineage.to_string()),
            ("sparkform.run".to_string(), "a-killed-run".to_string()),
        ]
        .into();
        left.create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(name.into()),
                ..Default::default()
            }),
            bollard::models::ContainerCreateBody {
                image: Some("img:1".into()),
                labels: Some(labels),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        if start {
            left.start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .unwrap();
        }
    }
    let p = common::plan(&c, &g, &fresh);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let outcome = apply(ApplyRequest {
        config: &c,
        graph: &g,
        plan: &p,
        store: &store,
        state: fresh.clone(),
        parallelism: 4,
        rollback: true,
        hosts: HostOptions::default(),
        pool: Some(HostPool::from_hosts(hosts.into_iter().collect())),
        events: tx,
        cancel: tokio_util::sync::CancellationToken::new(),
    })
    .await;
    assert!(outcome.ok, "{:?} {:?}", outcome.failures, outcome.not_run);
    let names: Vec<String> = a.containers().iter().map(|c| c.name.clone()).collect();
    assert!(
        !names.iter().any(|n| n == "sparkform-model.m-a-remove"),
        "the killed run's exited helper is still there: {names:?}"
    );
    for stays in ["sparkform-model.m-b-serve-old", "sparkform-other-remove"] {
        assert!(
            names.iter().any(|n| n == stays),
            "{stays} was removed: {names:?}"
        );
    }
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(serde_json::to_string(&e).unwrap());
    }
    let input_of = |d: &FakeDocker, name: &str| -> String {
        let uploads = d.uploads();
        let (_, tar) = uploads
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("nothing put into {name}"));
        let files = tar_files(tar);
        let (_, input) = files
            .iter()
            .find(|(f, _)| f == "sparkform/input")
            .expect("an input file");
        String::from_utf8(input.clone()).unwrap()
    };
    let state = std::fs::read_to_string(dir.path().join("state/sparkform.json")).unwrap();
    let mut tokens = Vec::new();
    for (n, d) in &pullers {
        let served = input_of(&a, &format!("sparkform-model.m-{n}-serve"));
        let pulled = input_of(d, &format!("sparkform-model.m-{n}-pull"));
        let token = served.trim_end().to_string();
        assert!(
            token.len() == 64 && token.chars().all(|c| c.is_ascii_hexdigit()),
            "{served:?}"
        );
        assert_eq!(served, format!("{token}\n"));
        assert_eq!(
            pulled, served,
            "the pull sends the token its serve requires"
        );
        // In no command line (what `ps` and `docker inspect` show), environment, event or state.
        let created: Vec<(String, serde_json::Value)> =
            a.created().into_iter().chain(d.created()).collect();
        for (name, body) in &created {
            let shown = body.to_string();
            assert!(!shown.contains(&token), "{name}: {shown}");
            if name.ends_with("-serve") || name.ends_with("-pull") {
                assert!(shown.contains("--auth-stdin"), "{name}: {shown}");
            }
        }
        assert!(events.iter().all(|e| !e.contains(&token)));
        assert!(
            !state.contains(&token),
            "the state holds a transfer's token"
        );
        tokens.push(token);
    }
    assert_ne!(tokens[0], tokens[1], "two transfers share a token");
}

/// Untracked snapshots refresh found beside a recorded copy (a run killed before it removed
/// the previous revision; a rollback that kept a verified copy): the plan removes the one the
/// definitions do not want, saying what it is and that nothing running stops, and keeps the one
/// of the commit they want (the next apply takes it up without fetching it again); a destroy
/// removes both.
#[test]
fn untracked_snapshots_go_unless_they_are_the_wanted_commit() {
    let (c, g) = load(&base(MODEL), &observed(COMMIT_A, "main"));
    let mut state = sparkform::state::State::new();
    plan::record(&common::plan(&c, &g, &state), &mut state);
    let orphan = |commit: &str| plan::Orphan {
        kind: sparkform::vocabulary::KindId::Model,
        address: "model.m[\"b\"]".into(),
        node: "node.b".into(),
        name: format!("snapshot {} of org/name, 61.0 MiB", &commit[..12]),
        id: commit.into(),
        running: false,
    };
    let with = |orphans: Vec<plan::Orphan>| plan::PlanOptions {
        observations: Some(plan::Observations {
            orphans,
            ..Default::default()
        }),
        ..plan::PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32]))
    };
    // Recorded at A, the definitions want B; B's verified copy and an old C's are on node b.
    const COMMIT_C: &str = "cccccccccccccccccccccccccccccccccccccccc";
    let (c2, g2) = load(&base(MODEL), &observed(COMMIT_B, "main"));
    let p = plan::plan(
        &c2,
        &g2,
        &state,
        &with(vec![orphan(COMMIT_B), orphan(COMMIT_C)]),
    )
    .expect("plan");
    let removed: Vec<&str> = p
        .changes
        .iter()
        .filter_map(|ch| ch.orphan.as_ref())
        .map(|o| o.id.as_str())
        .collect();
    assert_eq!(removed, vec![COMMIT_C], "only the unwanted one goes");
    let out = sparkform::plan::render::render(&p);
    assert!(
        out.contains("has an untracked copy that does not run (snapshot cccccccccccc of org/name, 61.0 MiB): it will be removed; nothing running stops"),
        "{out}"
    );
    assert!(
        out.contains("was copied and verified by sparkform into the block's cache folder but the state does not record it"),
        "{out}"
    );
    assert!(
        sparkform::plan::impact::compute(&p, &c2, &g2, &state)
            .stopped
            .is_empty(),
        "removing a snapshot stops nothing"
    );
    // A destroy (nothing wanted) removes both, and the recorded copies.
    let empty = common::write_config(&[("main.hcl", "")]);
    let c0 = config::load(empty.path(), &VarInputs::default()).expect("empty");
    let g0 = Graph::build(&c0).expect("graph");
    let p = plan::plan(
        &c0,
        &g0,
        &state,
        &with(vec![orphan(COMMIT_B), orphan(COMMIT_C)]),
    )
    .expect("plan");
    let untracked = p.changes.iter().filter(|ch| ch.orphan.is_some()).count();
    let recorded = p
        .changes
        .iter()
        .filter(|ch| {
            ch.orphan.is_none()
                && ch.action == Action::Delete
                && ch.kind == sparkform::vocabulary::KindId::Model
        })
        .count();
    assert_eq!(
        (untracked, recorded),
        (2, 2),
        "{}",
        sparkform::plan::render::render(&p)
    );
}

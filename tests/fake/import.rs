//! Importing containers started by hand, on the fake Docker Engine: `docker inspect` mapped to
//! the desired shape (what `docker run` with the definition's flags starts imports as exactly
//! that definition), the plan that shows the import and what differs, the apply that records it
//! without restarting anything, refresh that finds it by its ID, and the errors.

use crate::common;

use std::sync::Arc;

use serde_json::json;
use sparkform::apply::{apply, ApplyRequest};
use sparkform::config::Config;
use sparkform::graph::Graph;
use sparkform::hosts::{Host, HostOptions, HostPool};
use sparkform::kinds::machine::machine;
use sparkform::plan::{self, render, Action, Import, Plan, PlanOptions};
use sparkform::state::{HashKey, State, StateStore};
use sparkform::vocabulary::KindId;
use sparkform_testkit::fake::{FakeHost, FakeWorld};
use sparkform_testkit::fake_docker::FakeDocker;
use tokio_util::sync::CancellationToken;

const HEAD: &str = r#"
node "n1" { address = "10.0.0.1" }

container "head" {
  node         = node.n1
  name         = "ray-head"
  image        = "ray:1"
  command      = ["ray", "start", "--head", "--block"]
  network_mode = "host"
  ipc_mode     = "host"
  shm_size     = "1g"
  devices      = ["/dev/infiniband"]
  cap_add      = ["IPC_LOCK"]
  ulimits      = { memlock = "-1", stack = "67108864" }
  volumes      = ["/tmp/ray:/tmp/ray"]
  env          = { NCCL_SOCKET_IFNAME = "enp1s0f0np0", FOO = "1" }
  restart      = "no"
  ready {
    exec     = ["ray", "status"]
    timeout  = "2s"
    interval = "1s"
  }
}
"#;

fn key() -> HashKey {
    HashKey::from_bytes([7; 32])
}

struct Bed {
    dir: tempfile::TempDir,
    config: Config,
    graph: Graph,
    engine: Arc<FakeDocker>,
    host: Arc<FakeHost>,
}

impl Bed {
    fn new(hcl: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.hcl"), hcl).unwrap();
        let (config, graph) = common::load(dir.path());
        let engine = Arc::new(FakeDocker::start().unwrap());
        // The image's own settings, which `docker run` merges into the container's.
        engine.image_config(
            "ray:1",
            json!({
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_VISIBLE_DEVICES=all"],
                "Cmd": ["bash"],
                "Labels": { "org.opencontainers.image.version": "22.04" },
                "WorkingDir": "/workspace",
            }),
        );
        let host =
            Arc::new(FakeHost::new("node.n1", &FakeWorld::new()).docker_engine(engine.clone()));
        Bed {
            dir,
            config,
            graph,
            engine,
            host,
        }
    }

    fn store(&self) -> StateStore {
        StateStore::new(self.dir.path().join("state/sparkform.json"))
    }

    fn state(&self) -> State {
        self.store().load().unwrap().unwrap_or_default()
    }

    /// What `docker run` sends for the definition's flags, with `env` for its `-e`s: the
    /// image's env and labels merged in, Docker's spellings (`CAP_`, device triples, ulimits
    /// as numbers), no sparkform labels. Started.
    async fn run_by_hand(&self, env: &[&str]) -> String {
        self.run_by_hand_binding(env, &[]).await
    }

    /// [`Self::run_by_hand`] with more binds.
    async fn run_by_hand_binding(&self, env: &[&str], more_binds: &[&str]) -> String {
        let docker = self.host.docker().await.unwrap();
        let mut all_env = vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            "NVIDIA_VISIBLE_DEVICES=all".to_string(),
        ];
        all_env.extend(env.iter().map(|e| e.to_string()));
        let body = bollard::models::ContainerCreateBody {
            image: Some("ray:1".into()),
            cmd: Some(vec![
                "ray".into(),
                "start".into(),
                "--head".into(),
                "--block".into(),
            ]),
            env: Some(all_env),
            working_dir: Some("/workspace".into()),
            labels: Some(
                [(
                    "org.opencontainers.image.version".to_string(),
                    "22.04".to_string(),
                )]
                .into_iter()
                .collect(),
            ),
            host_config: Some(bollard::models::HostConfig {
                network_mode: Some("host".into()),
                ipc_mode: Some("host".into()),
                shm_size: Some(1 << 30),
                devices: Some(vec![bollard::models::DeviceMapping {
                    path_on_host: Some("/dev/infiniband".into()),
                    path_in_container: Some("/dev/infiniband".into()),
                    cgroup_permissions: Some("rwm".into()),
                }]),
                cap_add: Some(vec!["CAP_IPC_LOCK".into()]),
                ulimits: Some(vec![
                    bollard::models::ResourcesUlimits {
                        name: Some("memlock".into()),
                        soft: Some(-1),
                        hard: Some(-1),
                    },
                    bollard::models::ResourcesUlimits {
                        name: Some("stack".into()),
                        soft: Some(67108864),
                        hard: Some(67108864),
                    },
                ]),
                binds: Some(
                    std::iter::once("/tmp/ray:/tmp/ray")
                        .chain(more_binds.iter().copied())
                        .map(String::from)
                        .collect(),
                ),
                restart_policy: Some(bollard::models::RestartPolicy {
                    name: Some(bollard::models::RestartPolicyNameEnum::NO),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = docker
            .create_container(
                Some(bollard::query_parameters::CreateContainerOptions {
                    name: Some("ray-head".into()),
                    ..Default::default()
                }),
                body,
            )
            .await
            .unwrap()
            .id;
        docker
            .start_container(
                &id,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .unwrap();
        id
    }

    async fn import(&self, object: &str) -> Result<Import, String> {
        let r = self.config.resource("container.head").unwrap();
        let i = machine(KindId::Container)
            .import(self.host.as_ref(), &r.address, object, Some(&r.config))
            .await
            .map_err(|e| e.render())?;
        Ok(Import {
            address: r.address.clone(),
            kind: r.kind,
            node: r.node.clone(),
            id: format!("n1:{object}"),
            config: i.config,
            attributes: i.attributes,
            notes: i.notes,
            secret_paths: i.secret_paths,
        })
    }

    fn plan(&self, imports: Vec<Import>, observations: Option<plan::Observations>) -> Plan {
        plan::plan(
            &self.config,
            &self.graph,
            &self.state(),
            &PlanOptions {
                key: Some(key()),
                imports,
                observations,
                ..PlanOptions::default()
            },
        )
        .unwrap()
    }

    async fn apply(&self, plan: &Plan) {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let pool = HostPool::from_hosts(
            [("node.n1".to_string(), self.host.clone() as Arc<dyn Host>)]
                .into_iter()
                .collect(),
        );
        let outcome = apply(ApplyRequest {
            config: &self.config,
            graph: &self.graph,
            plan,
            store: &self.store(),
            state: self.state(),
            parallelism: 4,
            rollback: true,
            hosts: HostOptions::default(),
            pool: Some(pool),
            events: tx,
            cancel: CancellationToken::new(),
        })
        .await;
        assert!(outcome.ok, "{:?}", outcome.failures);
    }

    async fn refreshed(&self) -> plan::Observations {
        sparkform::observe::observe_hosts(
            &self.state(),
            vec![("node.n1".to_string(), self.host.clone() as Arc<dyn Host>)],
        )
        .await
        .unwrap()
    }

    fn creates(&self) -> usize {
        self.engine
            .requests()
            .iter()
            .filter(|r| r.starts_with("POST /containers/create"))
            .count()
    }
}

#[tokio::test]
async fn a_container_run_with_the_definitions_flags_imports_as_that_definition() {
    let bed = Bed::new(HEAD);
    let id = bed
        .run_by_hand(&["NCCL_SOCKET_IFNAME=enp1s0f0np0", "FOO=1"])
        .await;
    let import = bed.import("ray-head").await.unwrap();
    let desired = &bed.config.resource("container.head").unwrap().config;
    assert_eq!(&import.config, desired, "what runs, mapped back");
    assert_eq!(import.attributes["container_id"], json!(id));
    assert!(
        import
            .notes
            .iter()
            .any(|n| n.contains("labels come with its next replacement")),
        "{:?}",
        import.notes
    );
    // By ID as well as by name.
    assert_eq!(bed.import(&id[..12]).await.unwrap().config, import.config);

    let p = bed.plan(vec![import], None);
    assert!(p.has_changes(), "an import is a change to the state");
    assert_eq!(p.summary.import, 1);
    assert_eq!(p.change("container.head").unwrap().action, Action::NoOp);
    let text = render::render(&p);
    assert!(
        text.contains("<= container.head will be imported"),
        "{text}"
    );
    assert!(text.contains("what runs matches the definitions"), "{text}");
    assert!(
        text.contains("Plan: 1 to import, 0 to add, 0 to change, 0 to replace"),
        "{text}"
    );

    bed.apply(&p).await;
    assert_eq!(
        bed.creates(),
        1,
        "only the hand-started one was ever created"
    );
    let c = bed.engine.container("ray-head").unwrap();
    assert!(c.running && c.id == id, "{c:?}");
    let recorded = &bed.state().resources["container.head"];
    assert_eq!(recorded.attributes["container_id"], json!(id));

    // Refresh finds the unlabelled container by its recorded ID: nothing to do.
    let obs = bed.refreshed().await;
    assert_eq!(
        obs.resources.get("container.head"),
        Some(&plan::Drift::InSync)
    );
    assert!(obs.orphans.is_empty());
    let next = bed.plan(Vec::new(), Some(obs));
    assert!(!next.has_changes(), "{}", render::render(&next));
    // An import block whose resource the state has is a no-op.
    let again = bed.import("ray-head").await.unwrap();
    assert!(!bed.plan(vec![again], None).has_changes());
}

/// A container with a `cache`: its cache folder's mount (one image's folder under the host
/// folder, at the path) is that `cache`, not a volume; one started without it imports all the
/// same (it gets the folder with its next replacement).
#[tokio::test]
async fn the_cache_folders_mount_imports_as_the_cache_not_as_a_volume() {
    let hcl = HEAD.replace(
        "  restart      = \"no\"",
        "  restart      = \"no\"\n  cache        = { host = \"/var/cache/jit\", path = \"/root/.cache/jit\" }",
    );
    for binds in [&["/var/cache/jit/0123abcd:/root/.cache/jit"][..], &[]] {
        let bed = Bed::new(&hcl);
        bed.run_by_hand_binding(&["NCCL_SOCKET_IFNAME=enp1s0f0np0", "FOO=1"], binds)
            .await;
        let import = bed.import("ray-head").await.unwrap();
        let desired = &bed.config.resource("container.head").unwrap().config;
        assert!(desired["cache"].is_object(), "{desired}");
        assert_eq!(&import.config, desired, "with {binds:?}");
    }
    // Another folder at the path is a volume of its own: the plan shows it.
    let bed = Bed::new(&hcl);
    bed.run_by_hand_binding(
        &["NCCL_SOCKET_IFNAME=enp1s0f0np0", "FOO=1"],
        &["/srv/other:/root/.cache/jit"],
    )
    .await;
    let import = bed.import("ray-head").await.unwrap();
    assert_eq!(
        import.config["volumes"],
        json!(["/tmp/ray:/tmp/ray", "/srv/other:/root/.cache/jit"])
    );
}

#[tokio::test]
async fn one_env_var_apart_plans_exactly_that_difference_and_replaces_on_apply() {
    let bed = Bed::new(HEAD);
    let old = bed
        .run_by_hand(&["NCCL_SOCKET_IFNAME=enp1s0f0np0", "FOO=2"])
        .await;
    let import = bed.import("ray-head").await.unwrap();
    let p = bed.plan(vec![import], None);
    let c = p.change("container.head").unwrap();
    assert_eq!(c.action, Action::Replace);
    let paths: Vec<&str> = c.attributes.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["env.FOO"]);
    assert_eq!(c.attributes[0].before, Some(json!("2")));
    assert_eq!(c.attributes[0].after, Some(json!("1")));
    assert_eq!(c.replace_reasons, ["`env` changes"]);
    let text = render::render(&p);
    assert!(
        text.contains("what runs differs from the definitions: step 1 below"),
        "{text}"
    );

    bed.apply(&p).await;
    assert!(
        bed.engine.container(&old).is_none(),
        "the hand-started one is removed"
    );
    let new = bed.engine.container("ray-head").unwrap();
    assert!(new.running && new.id != old);
    assert_eq!(
        new.labels.get("sparkform.address").map(String::as_str),
        Some("container.head"),
        "the labels came with the replacement"
    );
    let next = bed.plan(Vec::new(), Some(bed.refreshed().await));
    assert!(!next.has_changes(), "{}", render::render(&next));
}

#[tokio::test]
async fn defaults_are_left_out_and_what_docker_does_not_keep_comes_from_the_definition() {
    let bed = Bed::new(
        r#"
node "n1" { address = "10.0.0.1" }
container "head" {
  node  = node.n1
  name  = "plain"
  image = "ray:1"
  pull  = false
}
"#,
    );
    let docker = bed.host.docker().await.unwrap();
    // `docker run --name plain ray:1`: the image's env, command and working dir, Docker's
    // default network, IPC mode, shm and restart policy.
    let body = bollard::models::ContainerCreateBody {
        image: Some("ray:1".into()),
        cmd: Some(vec!["bash".into()]),
        env: Some(vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            "NVIDIA_VISIBLE_DEVICES=all".into(),
        ]),
        working_dir: Some("/workspace".into()),
        host_config: Some(bollard::models::HostConfig {
            network_mode: Some("bridge".into()),
            ipc_mode: Some("private".into()),
            shm_size: Some(64 << 20),
            ..Default::default()
        }),
        ..Default::default()
    };
    docker
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some("plain".into()),
                ..Default::default()
            }),
            body,
        )
        .await
        .unwrap();
    let i = bed.import("plain").await.unwrap();
    assert_eq!(
        i.config,
        json!({ "name": "plain", "node": bed.config.resource("container.head").unwrap().config["node"], "image": "ray:1", "restart": "no", "pull": false })
            .as_object()
            .map(|m| {
                let mut m = m.clone();
                // `restart = "no"` is Docker's default: recorded only when the definition says so.
                m.remove("restart");
                serde_json::Value::Object(m)
            })
            .unwrap()
    );
}

#[tokio::test]
async fn a_missing_container_or_a_kind_that_cannot_be_imported_is_an_error() {
    let bed = Bed::new(HEAD);
    let e = bed.import("nope").await.unwrap_err();
    assert!(e.contains("there is no container nope on node.n1"), "{e}");
    assert!(e.contains("docker ps -a"), "{e}");
    let e = machine(KindId::Probe)
        .import(bed.host.as_ref(), "probe.p", "x", None)
        .await
        .unwrap_err();
    assert!(e.message.contains("cannot be imported"), "{}", e.message);
}

#[tokio::test]
async fn a_fabric_address_imports_with_its_interface_and_mtu() {
    let hcl = r#"
node "n1" { address = "10.0.0.1" }
network "roce" {
  subnet = "192.168.200.0/24"
  mtu    = 9000
  attach "n1" {
    node      = node.n1
    interface = "eth1"
    address   = "192.168.200.1"
  }
}
"#;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.hcl"), hcl).unwrap();
    let (config, graph) = common::load(dir.path());
    let host =
        FakeHost::new("node.n1", &FakeWorld::new()).interface("eth1", 9000, &["192.168.200.1/24"]);
    let r = config.resource("network.roce.attach.n1").unwrap();
    let m = machine(KindId::Attachment);
    let i = m
        .import(&host, &r.address, "192.168.200.1/24", Some(&r.config))
        .await
        .unwrap();
    assert_eq!(i.config, r.config);
    let e = m
        .import(&host, &r.address, "192.168.200.9/24", Some(&r.config))
        .await
        .unwrap_err();
    assert!(
        e.message
            .contains("no interface on node.n1 holds 192.168.200.9/24"),
        "{}",
        e.message
    );
    let e = m
        .import(&host, &r.address, "eth1", Some(&r.config))
        .await
        .unwrap_err();
    assert!(
        e.message.contains("not an IPv4 ADDRESS/PREFIX"),
        "{}",
        e.message
    );
    // At MTU 1500 it imports as it is, and the plan puts the MTU right in place.
    let host =
        FakeHost::new("node.n1", &FakeWorld::new()).interface("eth1", 1500, &["192.168.200.1/24"]);
    let i = m
        .import(&host, &r.address, "192.168.200.1/24", Some(&r.config))
        .await
        .unwrap();
    let p = plan::plan(
        &config,
        &graph,
        &State::new(),
        &PlanOptions {
            key: Some(key()),
            imports: vec![Import {
                address: r.address.clone(),
                kind: r.kind,
                node: r.node.clone(),
                id: "n1:192.168.200.1/24".into(),
                config: i.config,
                attributes: i.attributes,
                notes: i.notes,
                secret_paths: i.secret_paths,
            }],
            ..PlanOptions::default()
        },
    )
    .unwrap();
    let c = p.change(&r.address).unwrap();
    assert_eq!(c.action, Action::Update);
    let paths: Vec<&str> = c.attributes.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["mtu"]);
}

fn import_errors(hcl: &str) -> String {
    common::diagnostics(&write(hcl))
}

fn write(hcl: &str) -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    std::fs::write(dir.join("main.hcl"), hcl).unwrap();
    dir
}

#[test]
fn import_blocks_with_a_bad_form_are_errors_with_their_place() {
    let base = HEAD.to_string();
    let e = import_errors(&format!(
        "{base}\nimport {{\n  to = container.head\n  id = \"n1\"\n}}\n"
    ));
    assert!(e.contains("import id \"n1\" is not NODE:OBJECT"), "{e}");
    assert!(e.contains("main.hcl"), "{e}");
    let e = import_errors(&format!(
        "{base}\nimport {{\n  to = \"container.head\"\n  id = \"n1:ray-head\"\n}}\n"
    ));
    assert!(
        e.contains("`to` is not a resource address: it is quoted"),
        "{e}"
    );
    let e = import_errors(&format!("{base}\nimport {{\n  to = container.head\n}}\n"));
    assert!(e.contains("missing the required attribute `id`"), "{e}");
}

#[tokio::test]
async fn import_blocks_naming_what_the_definitions_lack_are_errors_with_a_hint() {
    let dir = write(&format!(
        "{HEAD}\nimport {{\n  to = container.haed\n  id = \"n1:ray-head\"\n}}\nimport {{\n  to = container.head\n  id = \"n9:ray-head\"\n}}\n"
    ));
    let (config, _) = common::load(&dir);
    let mut pool = None;
    let e = sparkform::ops::import::observe_blocks(
        &config,
        &State::new(),
        false,
        &mut pool,
        &HostOptions::default(),
    )
    .await
    .expect_err("errors");
    let sparkform::ops::OpError::Config(d) = e else {
        panic!("not a configuration error")
    };
    let text = sparkform::diag::render_plain(&d.0);
    assert!(
        text.contains("import to container.haed: the definitions have no such resource"),
        "{text}"
    );
    assert!(text.contains("did you mean container.head?"), "{text}");
    assert!(text.contains("there is no node `n9`"), "{text}");
    assert!(text.contains("main.hcl"), "{text}");
    assert!(pool.is_none(), "nothing was connected");
}

#[test]
fn generated_blocks_load_as_the_imported_configuration() {
    let i = Import {
        address: "container.vllm".into(),
        kind: KindId::Container,
        node: Some("node.n1".into()),
        id: "n1:vllm".into(),
        config: json!({ "name": "vllm", "node": "n1", "image": "ray:1", "command": ["vllm", "serve"], "env": { "A": "1" }, "shm_size": 1073741824 }).into(),
        attributes: Default::default(),
        notes: Vec::new(),
        secret_paths: Vec::new(),
    };
    let inner = Import {
        address: "module.m.container.x".into(),
        ..i.clone()
    };
    let (text, skipped) = sparkform::ops::import::generated_hcl(&[i.clone(), inner]);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].starts_with("module.m.container.x"));
    let dir = write(&format!("node \"n1\" {{ address = \"10.0.0.1\" }}\n{text}"));
    let (config, _) = common::load(&dir);
    let r = config.resource("container.vllm").unwrap();
    for k in ["name", "image", "command", "env", "shm_size"] {
        assert_eq!(r.config[k], i.config[k], "{k}");
    }
}

#[tokio::test]
async fn an_env_var_the_definition_does_not_set_is_never_shown_or_recorded_in_clear() {
    let bed = Bed::new(HEAD);
    bed.run_by_hand(&[
        "NCCL_SOCKET_IFNAME=enp1s0f0np0",
        "FOO=1",
        "HF_TOKEN=hf_do_not_show_me",
    ])
    .await;
    let import = bed.import("ray-head").await.unwrap();
    assert_eq!(
        import.secret_paths,
        [vec!["env".to_string(), "HF_TOKEN".to_string()]]
    );
    let p = bed.plan(vec![import], None);
    let c = p.change("container.head").unwrap();
    let paths: Vec<&str> = c.attributes.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["env.HF_TOKEN"]);
    assert!(c.attributes[0].sensitive);
    let text = render::render(&p);
    let json = serde_json::to_string(&p).unwrap();
    assert!(
        !text.contains("hf_do_not_show_me") && !json.contains("hf_do_not_show_me"),
        "{text}"
    );
    bed.apply(&p).await;
    let on_disk = std::fs::read_to_string(bed.dir.path().join("state/sparkform.json")).unwrap();
    assert!(!on_disk.contains("hf_do_not_show_me"));
}

#[test]
fn binds_in_another_order_are_the_definitions() {
    let inspect = json!({
        "Name": "/c",
        "Config": { "Image": "img" },
        "HostConfig": { "Binds": ["/b:/b", "/a:/a", "/extra:/extra"] },
    });
    let desired = sparkform::kinds::container::Desired {
        volumes: Some(vec![Some("/a:/a".into()), Some("/b:/b".into())]),
        ..Default::default()
    };
    let c = sparkform::kinds::container::machine::imported_config(
        &inspect,
        &serde_json::Value::Null,
        "container.c",
        "node.n1",
        Some(&desired),
    );
    assert_eq!(
        sparkform::kinds::known(&c.volumes.unwrap()),
        ["/a:/a", "/b:/b", "/extra:/extra"]
    );
}

//! `plan` refreshes against the machines: drift and untracked containers, on the testbed.

use crate::common;

use common::testbed::testbed;
use sparkform::hosts::{HostOptions, HostPool};
use sparkform::plan::{self, Action, PlanOptions};
use sparkform::state::{State, StateStore};

const TINY: &str = "sparkform-testbed/tiny:latest";

fn config_text(tb: &common::testbed::Testbed) -> String {
    let mut s = tb.hcl(
        &[("n1", "sf-node1"), ("n2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    );
    s.push_str(&format!(
        r#"
network "fabric" {{
  subnet = "192.168.201.0/24"
  mtu    = 9000
  attach "n1" {{
    node      = node.n1
    interface = "enp1s0f0np0"
    address   = "192.168.201.31"
  }}
  attach "n2" {{
    node      = node.n2
    interface = "enp1s0f0np0"
    address   = "192.168.201.32"
  }}
}}

container "c" {{
  node    = node.n1
  name    = "sf-refresh-c"
  image   = "{TINY}"
  command = ["sleep", "600"]
}}
"#
    ));
    s
}

async fn start(docker: &bollard::Docker, name: &str, labels: Vec<(&str, String)>) {
    use bollard::query_parameters::{CreateContainerOptions, RemoveContainerOptions};
    let _ = docker
        .remove_container(
            name,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    let body = bollard::models::ContainerCreateBody {
        image: Some(TINY.into()),
        cmd: Some(vec!["sleep".into(), "600".into()]),
        labels: Some(
            labels
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        ),
        ..Default::default()
    };
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.into()),
                ..Default::default()
            }),
            body,
        )
        .await
        .unwrap();
    docker
        .start_container(
            name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .unwrap();
}

#[test]
#[ignore = "needs the testbed: bash .ci/test"]
fn plan_shows_drift_and_untracked_containers() {
    let tb = testbed();
    let dir = common::write_config(&[("main.hcl", &config_text(&tb))]);
    let (c, g) = common::load(dir.path());
    // The state says everything was applied.
    let mut state = State::new();
    plan::record(
        &plan::plan(
            &c,
            &g,
            &state,
            &PlanOptions::with_key(sparkform::state::HashKey::from_bytes([7; 32])),
        )
        .unwrap(),
        &mut state,
    );
    let store = StateStore::new(dir.path().join("state/sparkform.json"));
    store.write(&mut state).unwrap();
    let hash = state.resources["container.c"].config_hash.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = HostOptions {
        use_user_config: false,
        ..HostOptions::default()
    };
    // The machines: node1's address is there, node2's is not; container c runs with its
    // labels; an untracked container carries the deployment's lineage.
    tb.ssh(
        "sf-node1",
        "ip addr replace 192.168.201.31/24 dev enp1s0f0np0",
    );
    tb.ssh(
        "sf-node2",
        "ip addr del 192.168.201.32/24 dev enp1s0f0np0 2>/dev/null; true",
    );
    let docker = rt.block_on(async {
        let pool = HostPool::connect(&c, &["node.n1".to_string()], &opts).await;
        let d = pool.get("node.n1").unwrap().docker().await.unwrap();
        let labels = |addr: &str, h: &str| {
            vec![
                ("sparkform.lineage", state.lineage.clone()),
                ("sparkform.address", addr.to_string()),
                ("sparkform.config_hash", h.to_string()),
            ]
        };
        start(&d, "sf-refresh-c", labels("container.c", &hash)).await;
        start(
            &d,
            "sf-refresh-ghost",
            labels("container.ghost", "sha256:0"),
        )
        .await;
        (pool, d)
    });
    let run_plan = || {
        let o = assert_cmd::Command::cargo_bin("sparkform")
            .unwrap()
            .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
            .args(["plan", dir.path().to_str().unwrap(), "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let p: plan::Plan = serde_json::from_value(v["plan"].clone()).unwrap();
        p
    };
    let action = |p: &plan::Plan, a: &str| {
        p.changes
            .iter()
            .find(|c| c.address == a)
            .map(|c| (c.action, c.drift.clone()))
    };

    let p = run_plan();
    assert_eq!(
        action(&p, "network.fabric.attach.n1").unwrap().0,
        Action::NoOp
    );
    let (act, drift) = action(&p, "network.fabric.attach.n2").unwrap();
    assert_eq!(act, Action::Update);
    assert!(
        drift[0].contains("192.168.201.32/24 is not on enp1s0f0np0"),
        "{drift:?}"
    );
    assert_eq!(action(&p, "container.c").unwrap().0, Action::NoOp);
    let (act, drift) = action(&p, "container.ghost").unwrap();
    assert_eq!(act, Action::Delete);
    assert!(drift[0].contains("sf-refresh-ghost"), "{drift:?}");

    // Stopped behind sparkform's back: replaced.
    rt.block_on(async {
        docker
            .1
            .stop_container(
                "sf-refresh-c",
                None::<bollard::query_parameters::StopContainerOptions>,
            )
            .await
            .unwrap();
    });
    let p = run_plan();
    let (act, drift) = action(&p, "container.c").unwrap();
    assert_eq!(act, Action::Replace);
    assert!(drift[0].contains("exited"), "{drift:?}");

    // Removed: created again.
    rt.block_on(async {
        use bollard::query_parameters::RemoveContainerOptions;
        for n in ["sf-refresh-c", "sf-refresh-ghost"] {
            let _ = docker
                .1
                .remove_container(
                    n,
                    Some(RemoveContainerOptions {
                        force: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
    });
    let p = run_plan();
    let (act, drift) = action(&p, "container.c").unwrap();
    assert_eq!(act, Action::Create);
    assert!(drift[0].contains("gone"), "{drift:?}");
    assert!(action(&p, "container.ghost").is_none());

    tb.ssh("sf-node1", "ip addr del 192.168.201.31/24 dev enp1s0f0np0");
    rt.block_on(docker.0.close());
}

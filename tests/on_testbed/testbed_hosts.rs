//! Reaching the machines, against the testbed: a jump host and two nodes with their own Docker
//! Engines, reachable only through the jump host. Run by `bash .ci/test`.

use crate::common;

use std::time::{Duration, Instant};

use common::testbed::testbed;
use sparkform::config::{self, VarInputs};
use sparkform::hosts::{Cmd, HostError, HostOptions, HostPool};
use sparkform::inspect::facts;

fn opts() -> HostOptions {
    HostOptions {
        use_user_config: false,
        ..HostOptions::default()
    }
}

fn load(text: &str) -> (sparkform::config::Config, tempfile::TempDir) {
    let dir = common::write_config(&[("main.hcl", text)]);
    let c = config::load(dir.path(), &VarInputs::default())
        .unwrap_or_else(|d| panic!("{}", sparkform::diag::render_plain(&d.0)));
    (c, dir)
}

fn nodes(c: &sparkform::config::Config) -> Vec<String> {
    c.nodes.keys().cloned().collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn connects_to_both_nodes_through_the_jump_host_with_strict_keys() {
    let tb = testbed();
    let (c, _d) = load(&tb.hcl(
        &[("n1", "sf-node1"), ("n2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    ));
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    assert!(pool.errors().is_empty(), "{:?}", pool.errors());
    for (node, expect) in [("node.n1", "sf-node1"), ("node.n2", "sf-node2")] {
        let h = pool.get(node).unwrap();
        let out = h.exec(&Cmd::new("hostname")).await.unwrap();
        assert_eq!(out.stdout.trim(), expect);
    }
    // The nodes are not reachable from here without the jump host.
    let direct = std::process::Command::new("ip")
        .args(["route", "get", "10.199.0.11"])
        .output()
        .unwrap();
    assert!(
        !direct.status.success()
            || String::from_utf8_lossy(&direct.stdout).contains("unreachable")
            || !String::from_utf8_lossy(&direct.stdout).contains("10.199.0.11 dev"),
        "the test runner routes to the management network directly"
    );
    pool.close().await;
}

fn known_hosts_without(tb: &common::testbed::Testbed, host: &str) -> String {
    std::fs::read_to_string(tb.known_hosts())
        .unwrap()
        .lines()
        .filter(|l| {
            !l.split_whitespace()
                .next()
                .unwrap_or("")
                .split(',')
                .any(|h| h == host)
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn unknown_and_changed_host_keys_are_refused() {
    let tb = testbed();
    let tmp = tempfile::tempdir().unwrap();
    // Unknown: node1's key is not in its known_hosts.
    let unknown = tmp.path().join("unknown");
    std::fs::write(&unknown, known_hosts_without(&tb, "sf-node1")).unwrap();
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &unknown, 2222));
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    match pool.get("node.n1").err().as_deref() {
        Some(HostError::HostKeyUnknown { target, .. }) => assert_eq!(target, "sf-node1"),
        other => panic!("expected an unknown host key, got {other:?}"),
    }
    pool.close().await;
    // Changed: a different key recorded for node1.
    let keygen = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(tmp.path().join("other"))
        .status()
        .unwrap();
    assert!(keygen.success());
    let other_pub = std::fs::read_to_string(tmp.path().join("other.pub")).unwrap();
    let other_key: Vec<&str> = other_pub.split_whitespace().take(2).collect();
    let changed = tmp.path().join("changed");
    std::fs::write(
        &changed,
        format!(
            "{}sf-node1 {} {}\n",
            known_hosts_without(&tb, "sf-node1"),
            other_key[0],
            other_key[1]
        ),
    )
    .unwrap();
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &changed, 2222));
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    let err = pool
        .get("node.n1")
        .err()
        .expect("a changed key must be refused");
    match err.as_ref() {
        HostError::HostKeyChanged {
            target,
            known_hosts,
            ..
        } => {
            assert_eq!(target, "sf-node1");
            assert!(
                known_hosts.starts_with(&changed.display().to_string()),
                "{known_hosts}"
            );
        }
        other => panic!("expected a changed host key, got {other:?}"),
    }
    assert!(err.to_string().contains("sf-node1"), "{err}");
    pool.close().await;
    // -accept-new-host-keys trusts an unknown key, and records it.
    let fresh = tmp.path().join("fresh");
    std::fs::write(&fresh, known_hosts_without(&tb, "sf-node1")).unwrap();
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &fresh, 2222));
    let accept = HostOptions {
        accept_new_host_keys: true,
        ..opts()
    };
    let pool = HostPool::connect(&c, &nodes(&c), &accept).await;
    assert!(pool.errors().is_empty(), "{:?}", pool.errors());
    assert!(std::fs::read_to_string(&fresh)
        .unwrap()
        .contains("sf-node1"));
    pool.close().await;
    // ... but still refuses a changed one.
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &changed, 2222));
    let pool = HostPool::connect(&c, &nodes(&c), &accept).await;
    assert!(matches!(
        pool.get("node.n1").err().as_deref(),
        Some(HostError::HostKeyChanged { .. })
    ));
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn unreachable_node_fails_in_time_and_the_other_works() {
    let tb = testbed();
    // 10.199.0.99 is on the management network, where no machine has that address.
    let (c, _d) = load(&tb.hcl(
        &[("n1", "sf-node1"), ("ghost", "10.199.0.99")],
        &tb.known_hosts(),
        2222,
    ));
    let o = HostOptions {
        connect_timeout: Duration::from_secs(3),
        ..opts()
    };
    let start = Instant::now();
    let pool = HostPool::connect(&c, &nodes(&c), &o).await;
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(3 * 2 + 5 + 2),
        "took {elapsed:?}"
    );
    let err = pool.get("node.ghost").err().expect("ghost must fail");
    assert!(
        matches!(err.as_ref(), HostError::Unreachable { .. }),
        "{err:?}"
    );
    let text = format!(
        "{:?}",
        miette::Report::new(HostErrorWrap(err.to_string(), err.as_ref().to_string()))
    );
    assert!(
        text.contains("10.199.0.99") || text.contains("ghost"),
        "{text}"
    );
    let out = pool
        .get("node.n1")
        .unwrap()
        .exec(&Cmd::new("true"))
        .await
        .unwrap();
    assert!(out.success());
    pool.close().await;
    // A jump host that does not answer is named as such.
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &tb.known_hosts(), 2299));
    let pool = HostPool::connect(&c, &nodes(&c), &o).await;
    match pool.get("node.n1").err().as_deref() {
        Some(HostError::JumpUnreachable { jump, .. }) => assert_eq!(jump, "jump.testbed"),
        other => panic!("expected the jump host to be unreachable, got {other:?}"),
    }
    // A key the node does not accept.
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("stranger");
    assert!(std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap()
        .success());
    let text = tb
        .hcl(&[("n1", "sf-node1")], &tb.known_hosts(), 2222)
        .replace(
            &format!(
                "identity_file = \"{}\"\n  known_hosts   =",
                tb.key().display()
            ),
            &format!("identity_file = \"{}\"\n  known_hosts   =", key.display()),
        );
    let (c, _d) = load(&text);
    let pool = HostPool::connect(&c, &nodes(&c), &o).await;
    assert!(
        matches!(
            pool.get("node.n1").err().as_deref(),
            Some(HostError::AuthRefused { .. })
        ),
        "{:?}",
        pool.errors()
    );
}

#[derive(Debug)]
struct HostErrorWrap(String, String);
impl std::fmt::Display for HostErrorWrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}
impl std::error::Error for HostErrorWrap {}
impl miette::Diagnostic for HostErrorWrap {}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn fifty_concurrent_commands_on_one_node() {
    let tb = testbed();
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &tb.known_hosts(), 2222));
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    let h = pool.get("node.n1").unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50 {
        let h = h.clone();
        set.spawn(async move { h.exec(&Cmd::new("echo").arg(format!("n{i}"))).await });
    }
    let mut seen = Vec::new();
    while let Some(r) = set.join_next().await {
        let out = r.unwrap().unwrap();
        assert!(out.success(), "{out:?}");
        seen.push(out.stdout.trim().to_string());
    }
    seen.sort();
    let mut want: Vec<String> = (0..50).map(|i| format!("n{i}")).collect();
    want.sort();
    assert_eq!(seen, want);
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn docker_through_the_forwarded_socket_is_that_nodes_engine() {
    let tb = testbed();
    let (c, _d) = load(&tb.hcl(
        &[("n1", "sf-node1"), ("n2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    ));
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    let d1 = pool.get("node.n1").unwrap().docker().await.unwrap();
    assert_eq!(d1.ping().await.unwrap(), "OK");
    let v = d1.version().await.unwrap();
    assert!(v.api_version.is_some());
    let name = format!("sf-hosts-test-{}", std::process::id());
    let body = bollard::models::ContainerCreateBody {
        image: Some("sparkform-testbed/tiny:latest".into()),
        cmd: Some(vec!["sleep".into(), "60".into()]),
        ..Default::default()
    };
    d1.create_container(
        Some(bollard::query_parameters::CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        }),
        body,
    )
    .await
    .unwrap();
    d1.start_container(
        &name,
        None::<bollard::query_parameters::StartContainerOptions>,
    )
    .await
    .unwrap();
    let on1 = tb.ssh("sf-node1", "docker ps --format '{{.Names}}'");
    let on2 = tb.ssh("sf-node2", "docker ps -a --format '{{.Names}}'");
    let _ = d1
        .remove_container(
            &name,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    assert!(on1.lines().any(|l| l == name), "not on node1: {on1}");
    assert!(!on2.lines().any(|l| l == name), "also on node2: {on2}");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn facts_match_the_testbed_and_nodes_flags_a_missing_interface() {
    let tb = testbed();
    let mut text = tb.hcl(
        &[("n1", "sf-node1"), ("n2", "sf-node2")],
        &tb.known_hosts(),
        2222,
    );
    text.push_str(
        "network \"fabric\" {\n  subnet = \"192.168.201.0/24\"\n  mtu = 9000\n  attach \"n1\" {\n    node = node.n1\n    interface = \"enp1s0f0np0\"\n    address = \"192.168.201.1\"\n  }\n  attach \"n2\" {\n    node = node.n2\n    interface = \"ib0\"\n    address = \"192.168.201.2\"\n  }\n}\n",
    );
    let (c, d) = load(&text);
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    let f = facts::gather(pool.get("node.n1").unwrap().as_ref(), &[])
        .await
        .unwrap();
    assert!(f.os.contains("Debian"), "{}", f.os);
    let fabric = f
        .interfaces
        .iter()
        .find(|i| i.name == "enp1s0f0np0")
        .expect("fabric interface");
    assert_eq!(fabric.mtu, 9000);
    assert!(f
        .interfaces
        .iter()
        .any(|i| i.addresses.iter().any(|a| a == "10.199.0.11/24")));
    assert!(f.docker.as_ref().unwrap().contains("API"), "{:?}", f.docker);
    assert!(f.cpus >= 1 && f.memory_gib > 0.5);
    assert!(facts::disagreements(&c, &c.nodes["node.n1"], &f).is_empty());
    pool.close().await;
    let out = assert_cmd::Command::cargo_bin("sparkform")
        .unwrap()
        .env("SPARKFORM_NO_USER_SSH_CONFIG", "1")
        .args(["nodes", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "! node.n2: network.fabric.attach.n2 uses interface ib0, which does not exist"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("! node.n1"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn shell_metacharacters_arrive_as_literal_data() {
    let tb = testbed();
    let (c, _d) = load(&tb.hcl(&[("n1", "sf-node1")], &tb.known_hosts(), 2222));
    let pool = HostPool::connect(&c, &nodes(&c), &opts()).await;
    let h = pool.get("node.n1").unwrap();
    let values = [
        "; touch /tmp/sf-pwned-1",
        "$(touch /tmp/sf-pwned-2)",
        "`touch /tmp/sf-pwned-3`",
        "it's \"quoted\" && touch /tmp/sf-pwned-4",
        "line one\nline two; touch /tmp/sf-pwned-5",
        "| touch /tmp/sf-pwned-6 #",
        "* ? [a-z] ~ $HOME ${PATH}",
    ];
    for v in values {
        let out = h.exec(&Cmd::new("printf").arg("%s").arg(v)).await.unwrap();
        assert_eq!(out.stdout, v);
    }
    let ls = h.exec(&Cmd::new("ls").arg("/tmp")).await.unwrap();
    assert!(
        !ls.stdout.contains("sf-pwned"),
        "a value was executed: {}",
        ls.stdout
    );
    pool.close().await;
}

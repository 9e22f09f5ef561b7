//! The user's ~/.ssh/config still defines aliases: a node whose address is an alias there is
//! reached at the host the alias names. (Own test binary: it changes HOME for the process.)

use crate::common;

use common::testbed::testbed;
use sparkform::hosts::{Cmd, HostOptions, HostPool};

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: SPARKFORM_TESTBED=1 bash .ci/test"]
async fn an_alias_from_the_users_ssh_config_is_honoured() {
    let tb = testbed();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(
        home.path().join(".ssh/config"),
        "Host gpu-box-a\n  HostName sf-node2\n",
    )
    .unwrap();
    // SAFETY: this test binary has one test; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("HOME", home.path()) };
    let dir = common::write_config(&[(
        "main.hcl",
        &tb.hcl(&[("a", "gpu-box-a")], &tb.known_hosts(), 2222),
    )]);
    let (c, _) = common::load(dir.path());
    let pool = HostPool::connect(&c, &["node.a".to_string()], &HostOptions::default()).await;
    assert!(pool.errors().is_empty(), "{:?}", pool.errors());
    let out = pool
        .get("node.a")
        .unwrap()
        .exec(&Cmd::new("hostname"))
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "sf-node2");
    pool.close().await;
}

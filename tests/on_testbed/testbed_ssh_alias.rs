//! The user's ~/.ssh/config still defines aliases: a node whose address is an alias there is
//! reached at the host the alias names. It changes HOME for the process while it runs, alone:
//! this file has one test, and `testbed()` keeps the tests of the other files waiting.

use crate::common;

use common::testbed::testbed;
use sparkform::hosts::{Cmd, HostOptions, HostPool};

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the testbed: bash .ci/test"]
async fn an_alias_from_the_users_ssh_config_is_honoured() {
    let tb = testbed();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::write(
        home.path().join(".ssh/config"),
        "Host gpu-box-a\n  HostName sf-node2\n",
    )
    .unwrap();
    // HOME comes back when the test ends, failed or not, before the testbed goes to the tests of
    // another file: they run in this process after it.
    let _home = RestoreHome(std::env::var_os("HOME"));
    // SAFETY: no other test runs meanwhile (see above); nothing else reads the environment
    // concurrently.
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

/// Puts HOME back as it was when it drops.
struct RestoreHome(Option<std::ffi::OsString>);

impl Drop for RestoreHome {
    fn drop(&mut self) {
        // SAFETY: as for the `set_var` it undoes.
        unsafe {
            match self.0.take() {
                Some(home) => std::env::set_var("HOME", home),
                None => std::env::remove_var("HOME"),
            }
        }
    }
}

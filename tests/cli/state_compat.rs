//! A state written by an earlier sparkform loads with today's, its records upgraded to the
//! shapes the kinds write now, and plans no change: `tests/fixtures/state-4cba871` holds the
//! state sparkform wrote at 4cba871 (before records had versions) applying that commit's
//! `examples/testbed-mp` to the testbed, with those definitions and modules.

use sparkform::kind::Registered;
use std::path::Path;

use assert_cmd::Command;

#[test]
fn a_state_written_at_4cba871_loads_upgraded_and_plans_no_change() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-4cba871");
    let tmp = tempfile::tempdir().expect("tempdir");
    crate::hostile::copy_dir(&src, tmp.path());
    let file = tmp.path().join("examples/testbed-mp/state/sparkform.json");
    let text = std::fs::read_to_string(&file).expect("the fixture's state");
    assert!(
        !text.contains("schema_version"),
        "the fixture is a state from before record versions"
    );

    let state = sparkform::state::parse_document(&file, &text).expect("it loads");
    assert_eq!(state.resources.len(), 8);
    for (address, r) in &state.resources {
        assert_eq!(
            r.schema_version,
            r.kind.kind().recorded_version(),
            "{address} is upgraded to its kind's version"
        );
    }
    let rank: sparkform::kinds::container::Recorded =
        sparkform::kind::facts_of(&state.resources["module.qwen.container.rank0"].attributes)
            .expect("a container's facts as its type");
    assert!(
        rank.container_id.as_ref().is_some_and(|id| id.len() == 64)
            && rank
                .image_id
                .as_ref()
                .is_some_and(|id| id.starts_with("sha256:")),
        "{rank:?}"
    );
    let pull: sparkform::kinds::model::Recorded =
        sparkform::kind::facts_of(&state.resources["model.qwen[\"node2\"]"].attributes)
            .expect("a model's facts as its type");
    assert!(
        pull.peers_served.is_some() && pull.commit.is_some(),
        "{pull:?}"
    );

    // Planned by today's sparkform from what the state recorded (no machine is reached: the
    // testbed need not be up): the same configurations, hashed alike, so no change.
    let o = Command::cargo_bin("sparkform")
        .expect("binary")
        .current_dir(tmp.path())
        .env("SPARKFORM_VAR_testbed_dir", tmp.path().join("no-testbed"))
        .args([
            "plan",
            "-refresh=false",
            "-detailed-exitcode",
            "examples/testbed-mp",
        ])
        .output()
        .expect("run");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("No changes."), "{stdout}\n{stderr}");
}

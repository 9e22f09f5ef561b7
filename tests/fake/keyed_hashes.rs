//! Sensitive values are recorded as HMACs under the deployment's key: the same key plans no
//! change, a missing or other key plans every sensitive value as changed with the reason, and
//! a state from before the key (unkeyed `sha256:` hashes) plans them as changed once.

use crate::common;

use sparkform::plan::{self, Action, PlanOptions, NOTE_LEGACY, NOTE_NO_KEY};
use sparkform::state::{sha256_hex, HashKey, State};

const HEAD: &str = "container.head";

fn plan_with(key: Option<&HashKey>, state: &State) -> plan::Plan {
    let (c, g) = common::load(&common::fixture("plan/cluster"));
    let opts = PlanOptions {
        key: key.cloned(),
        ..PlanOptions::default()
    };
    plan::plan(&c, &g, state, &opts).expect("plan")
}

fn action(p: &plan::Plan, address: &str) -> Action {
    p.change(address)
        .map(|c| c.action)
        .expect("a change for the address")
}

fn applied(key: &HashKey) -> State {
    let mut state = State::new();
    let p = plan_with(Some(key), &state);
    plan::record(&p, &mut state);
    state
}

#[test]
fn the_same_key_plans_no_change_and_the_state_holds_no_unkeyed_hash() {
    let key = HashKey::from_bytes([1; 32]);
    let state = applied(&key);
    let p = plan_with(Some(&key), &state);
    assert!(!p.has_changes(), "{}", plan::render::render(&p));
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    let text = serde_json::to_string(&state).expect("json");
    let unkeyed = sha256_hex(br#""hf_plan_fixture_secret""#);
    assert!(!text.contains(&unkeyed), "the state holds the unkeyed hash");
    assert!(!text.contains("hf_plan_fixture_secret"));
    assert!(text.contains("hmac-sha256:"), "{text}");
}

#[test]
fn without_the_key_every_sensitive_value_plans_as_changed_with_the_reason() {
    let state = applied(&HashKey::from_bytes([1; 32]));
    let p = plan_with(None, &state);
    assert_ne!(action(&p, HEAD), Action::NoOp);
    // A resource with no sensitive value is unaffected.
    assert_eq!(action(&p, "network.fabric.attach.n1"), Action::NoOp);
    assert_eq!(p.notes, [NOTE_NO_KEY]);
    assert!(
        plan::render::render(&p).contains("key for sensitive values"),
        "{}",
        plan::render::render(&p)
    );
    // Another key is no better than none: nothing recorded under the first one matches.
    let p = plan_with(Some(&HashKey::from_bytes([2; 32])), &state);
    assert_ne!(action(&p, HEAD), Action::NoOp);
}

#[test]
fn a_state_with_unkeyed_hashes_plans_its_secrets_as_changed_once() {
    let key = HashKey::from_bytes([1; 32]);
    let mut state = applied(&key);
    let legacy = format!("sha256:{}", sha256_hex(br#""hf_plan_fixture_secret""#));
    let head = state.resources.get_mut(HEAD).expect("head recorded");
    let mut config = head.config.json().clone();
    config["env"]["HF_TOKEN"] = serde_json::Value::String(legacy);
    head.config = config.into();
    head.config_hash = plan::config_hash(&head.config);
    let p = plan_with(Some(&key), &state);
    assert_ne!(action(&p, HEAD), Action::NoOp);
    assert_eq!(p.notes, [NOTE_LEGACY]);
    let token = p
        .change(HEAD)
        .and_then(|c| c.attributes.iter().find(|a| a.path == "env.HF_TOKEN"))
        .expect("the token's change");
    assert!(token.sensitive);
    plan::record(&p, &mut state);
    assert!(!plan_with(Some(&key), &state).has_changes());
}

//! A Docker API error of a step, as the user reads it: a lost connection names the lost node,
//! a helper container that did not start says which and what to do.

use super::StepError;

/// Whether a Docker client error means the connection to the node is gone (the forwarded
/// socket broke: the node, or the way to it, went down), not a refusal by its engine.
pub fn docker_connection_lost(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    matches!(
        e,
        E::HyperLegacyError { .. }
            | E::IOError { .. }
            | E::RequestTimeoutError
            | E::HyperResponseError { .. }
    )
}

/// A Docker API error of a step (`what` names the node and what it did): a broken connection
/// names the lost node, as the ssh path does, not its engine, which was never asked.
pub fn docker_error(what: &str, e: bollard::errors::Error) -> StepError {
    if docker_connection_lost(&e) {
        StepError::new(format!(
            "{what}: the node was lost: the connection to it broke ({e})"
        ))
        .help("the node or its network went down during the step (its Docker Engine was not reached); check that the node is up and reachable, then run apply again (the state records what was done)")
    } else {
        StepError::new(format!("{what}: {e}"))
    }
}

/// A one-shot helper container (`hosts::one_shot`) that did not start, as a step's error:
/// `helper` names it ("the benchmark's container"), `image_help` says what to do when the node
/// lacks its image; a lost connection names the lost node, as [`docker_error`] does.
pub fn helper_not_started(
    node: &str,
    helper: &str,
    image_help: &str,
    e: crate::runtime::one_shot::StartError,
) -> StepError {
    use crate::runtime::one_shot::Stage;
    let doing = match e.stage {
        Stage::Create => "cannot create",
        Stage::Upload => "cannot put its files into",
        Stage::Start => "cannot start",
    };
    let missing = e.error.to_string().contains("No such image");
    let lost = docker_connection_lost(&e.error);
    let err = docker_error(&format!("{node}: {doing} {helper}"), e.error);
    match (e.stage, lost) {
        (Stage::Create, false) if missing => err.help(image_help),
        (Stage::Create, false) => err.help("check the node's Docker Engine"),
        _ => err,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_helper_that_did_not_start_says_where_and_a_missing_image_what_to_do() {
        use crate::runtime::one_shot::{Stage, StartError};
        let refused = |stage, message: &str| StartError {
            stage,
            error: bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                message: message.into(),
            },
        };
        let e = super::helper_not_started(
            "node1",
            "the benchmark's container",
            "load the image",
            refused(Stage::Create, "No such image: vllm:1"),
        );
        assert!(e
            .message
            .starts_with("node1: cannot create the benchmark's container: "));
        assert_eq!(e.help.as_deref(), Some("load the image"));
        let e = super::helper_not_started("node1", "it", "x", refused(Stage::Create, "no space"));
        assert_eq!(e.help.as_deref(), Some("check the node's Docker Engine"));
        let e = super::helper_not_started("node1", "it", "x", refused(Stage::Upload, "gone"));
        assert!(e
            .message
            .starts_with("node1: cannot put its files into it: "));
        assert_eq!(e.help, None);
    }
}

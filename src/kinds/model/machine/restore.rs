//! What a rollback's plan finds of a model's weights on a node (`Machine::restorable`): the
//! revision the generation ran, as the manifest recorded at its download says; a copy that is
//! gone or changed is fetched again from the hub (copied again from the download node, on a
//! pull node), and refused before anything runs when the hub cannot be reached.

use super::{observe, resolve, want_recorded, ResolveRequest};
use crate::hosts::Host;
use crate::kind::Registered;
use crate::kinds::machine::{Record, Restorable};

/// [`Machine::restorable`](crate::kinds::machine::Machine::restorable) of a model resource.
pub(super) async fn restorable(
    host: &dyn Host,
    address: &str,
    record: &Record<'_, super::super::Model>,
    number: u64,
) -> Vec<Restorable> {
    let r = record.state;
    let images = r.kind.kind().images(&r.config, Some(&r.attributes));
    let mut notes = crate::kinds::machine::restorable_images(host, address, images, number).await;
    let Ok(w) = want_recorded(address, record.config.as_ref()) else {
        return notes;
    };
    let Ok(Some(why)) = observe::kept_copy(host, &w.repo, &w.cache, &w.commit, &w.node_name).await
    else {
        return notes;
    };
    let short = &w.commit[..12.min(w.commit.len())];
    if w.role == super::super::desired::ROLE_PULL {
        notes.push(Restorable::Note(format!(
            "{address} ran {} at {short} in generation {number}, and its node does not keep it as recorded ({why}; a node keeps its last `keep_revisions` revisions): the rollback copies it again from {}",
            w.repo, w.download_node
        )));
        return notes;
    }
    // The download node fetches what it lacks from the hub: does the hub answer there?
    let asked = ResolveRequest {
        block: &w.block,
        repo: &w.repo,
        revision: &w.commit,
        image: &w.image,
        cache: &w.cache,
        endpoint: w.endpoint.as_deref(),
        token: w.token.as_deref(),
        include: &w.include,
        exclude: &w.exclude,
        offline: false,
    };
    match resolve(host, &asked).await {
        Ok(_) => notes.push(Restorable::Note(format!(
            "{address} ran {} at {short} in generation {number}, and its node does not keep it as recorded ({why}; a node keeps its last `keep_revisions` revisions): the rollback fetches it again from the hub",
            w.repo
        ))),
        Err(e) => notes.push(Restorable::Refused {
            message: format!(
                "{address}: generation {number} ran {} at {short}, which {} does not keep as recorded ({why}), and the hub cannot give it again: {}",
                w.repo, w.node_name, e.message
            ),
            help: "a node keeps its last `keep_revisions` revisions: bring the hub back (or set the model block's `endpoint` to one that answers) and roll back again, or roll back to a generation whose weights the nodes keep (`sparkform history`)".into(),
        }),
    }
    notes
}

//! What a rollback's plan asks of each resource it starts again (`Machine::restorable`), and
//! the default answer: the images it ran that its node's references no longer name.

use crate::hosts::Host;

/// What a rollback's plan learns of one resource it starts again (`Machine::restorable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restorable {
    /// Said in the plan: what the node no longer holds as recorded, and how the rollback does
    /// without it.
    Note(String),
    /// The rollback cannot start it again: refused before anything runs, with the fix.
    Refused { message: String, help: String },
}

/// [`Machine::restorable`]'s default: each image (reference, what it pinned) a rollback runs
/// again, where the node's reference no longer names it: run by its ID where the node still has
/// it, else named with the fix.
pub async fn restorable_images(
    host: &dyn Host,
    address: &str,
    images: Vec<(String, Option<String>)>,
    number: u64,
) -> Vec<Restorable> {
    use crate::runtime::image::short_id;
    let node = host.node().trim_start_matches("node.").to_string();
    let mut notes = Vec::new();
    for (reference, pinned) in images {
        let Some(pinned) = pinned else { continue };
        let short = short_id(&pinned);
        let now = match crate::runtime::image::image(host, &reference).await {
            None => format!("{node} no longer has {reference}"),
            Some(s) if !s.is(&pinned) => {
                format!("{reference} on {node} now names {}", short_id(&s.id))
            }
            Some(_) => continue,
        };
        notes.push(Restorable::Note(match crate::runtime::image::image(host, &pinned).await {
            Some(_) => format!(
                "{address} ran {reference} ({short}) in generation {number}; {now}, and the rollback runs {short} by its ID, which {node} still has"
            ),
            None => format!(
                "{address} ran {reference} ({short}) in generation {number}, but {now} and not {short} either: load that image on the node (the container's `image_archive`), or set `pull = true` to pull the reference again, before rolling back"
            ),
        }));
    }
    notes
}

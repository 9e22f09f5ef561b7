//! `sparkform lock DIR`: resolve every value a kind locks again, on the nodes, and write
//! `sparkform.lock.hcl` (`lock_file`).

use crate::events::Sender;
use crate::hosts::HostOptions;
use crate::kinds::machine::ReadMode;
use crate::plan::PlanOptions;

use super::lock_file::LockUpdate;
use super::OpError;

/// `sparkform lock DIR`: resolve every value a kind locks again (as `-upgrade` does), on the
/// nodes, and write the lock file; the state is neither read nor changed.
pub async fn lock(
    evaluated: super::definitions::Evaluated,
    hosts: &HostOptions,
    events: &Sender,
) -> Result<LockUpdate, OpError> {
    let evaluated = evaluated.upgrading(true);
    let before = evaluated.lock().cloned();
    let mut prepared = super::prepare::prepare(
        super::prepare::PrepareRequest {
            evaluated,
            recorded: None,
            refresh: ReadMode::Normal,
            options: PlanOptions::default(),
            hosts: hosts.clone(),
        },
        events,
    )
    .await?;
    prepared.close().await;
    let update = LockUpdate::new(
        &prepared.config,
        before.as_ref(),
        true,
        &prepared.images,
        None,
    );
    update.write()?;
    Ok(update)
}

//! A node as a [`super::HostPool`] hands it out: its round trips counted from the moment it
//! joined the pool, and, while the pool reads for a plan ([`super::HostPool::remember`]), the
//! memo every reader shares (the kinds' plan-time reads, the node facts, the lock file's image
//! read, the refresh: [`super::memo`]). Outside it (an apply, a rollback's check) every read
//! looks again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use super::memo::Memo;
use super::{Cmd, Endpoint, Host, HostError, Output, RoundTrips};

pub struct Pooled {
    inner: Arc<dyn Host>,
    /// The node's count when it joined the pool.
    baseline: RoundTrips,
    remembering: AtomicBool,
    memo: Memo,
}

impl Pooled {
    pub fn new(inner: Arc<dyn Host>) -> Pooled {
        Pooled {
            baseline: inner.round_trips(),
            inner,
            remembering: AtomicBool::new(false),
            memo: Memo::default(),
        }
    }

    /// Share the reads from now on, or stop and forget them.
    pub fn remember(&self, on: bool) {
        self.remembering.store(on, Ordering::SeqCst);
        if !on {
            self.memo.clear();
        }
    }
}

#[async_trait]
impl Host for Pooled {
    fn node(&self) -> &str {
        self.inner.node()
    }

    async fn exec(&self, cmd: &Cmd) -> Result<Output, HostError> {
        self.inner.exec(cmd).await
    }

    async fn docker(&self) -> Result<bollard::Docker, HostError> {
        self.inner.docker().await
    }

    async fn forward(&self, host: &str, port: u16) -> Result<Endpoint, HostError> {
        self.inner.forward(host, port).await
    }

    async fn close(&self) {
        self.inner.close().await
    }

    /// Since the node joined the pool.
    fn round_trips(&self) -> RoundTrips {
        self.inner.round_trips().since(self.baseline)
    }

    fn memo(&self) -> Option<&Memo> {
        self.remembering
            .load(Ordering::SeqCst)
            .then_some(&self.memo)
    }
}

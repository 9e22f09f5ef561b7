//! A node as a [`super::HostPool`] hands it out: its round trips counted from the moment it
//! joined the pool, and, while the pool reads for a plan ([`super::HostPool::remember`]), one
//! glance and one inspect per image reference shared by every reader (the kinds' plan-time
//! reads, the node facts, the lock file's image read, the refresh). Nothing changes the nodes
//! while a plan is made; outside it (an apply, a rollback's check) every call looks again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::glance::Glance;
use super::image::ImageSeen;
use super::{Cmd, Endpoint, Host, HostError, Output, RoundTrips};

type Shared<T> = Arc<OnceCell<T>>;

#[derive(Default)]
struct Memo {
    glance: Option<Shared<Result<Arc<Glance>, HostError>>>,
    images: HashMap<String, Shared<Option<ImageSeen>>>,
}

pub struct Pooled {
    inner: Arc<dyn Host>,
    /// The node's count when it joined the pool.
    baseline: RoundTrips,
    remembering: AtomicBool,
    memo: Mutex<Memo>,
}

impl Pooled {
    pub fn new(inner: Arc<dyn Host>) -> Pooled {
        Pooled {
            baseline: inner.round_trips(),
            inner,
            remembering: AtomicBool::new(false),
            memo: Mutex::new(Memo::default()),
        }
    }

    fn memo(&self) -> MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Share the glance and the image inspects from now on, or stop and forget them.
    pub fn remember(&self, on: bool) {
        self.remembering.store(on, Ordering::SeqCst);
        if !on {
            *self.memo() = Memo::default();
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

    async fn glance(&self) -> Result<Arc<Glance>, HostError> {
        if !self.remembers() {
            return self.inner.glance().await;
        }
        let cell = self.memo().glance.get_or_insert_with(Arc::default).clone();
        cell.get_or_init(|| self.inner.glance()).await.clone()
    }

    async fn image(&self, reference: &str) -> Option<ImageSeen> {
        if !self.remembers() {
            return self.inner.image(reference).await;
        }
        let cell = self
            .memo()
            .images
            .entry(reference.to_string())
            .or_default()
            .clone();
        cell.get_or_init(|| self.inner.image(reference))
            .await
            .clone()
    }

    fn remembers(&self) -> bool {
        self.remembering.load(Ordering::SeqCst)
    }
}

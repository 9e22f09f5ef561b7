//! What the reads of one plan share on a node: while a pool reads for a plan
//! ([`super::HostPool::remember`]), a read made through [`remembered`] runs once per node, key
//! and type of answer, and every reader gets its answer (the node's glance, one inspect per image
//! reference). Nothing changes the nodes while a plan is made; outside it every read looks
//! again. What is read lives with its reader (`inspect`, `runtime`); this only keeps it.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

use super::Host;

/// A node's answers by key and type, for the plan being made: each cell an `OnceCell<T>`.
#[derive(Default)]
pub struct Memo {
    cells: Mutex<HashMap<(TypeId, String), Arc<dyn Any + Send + Sync>>>,
}

impl Memo {
    fn cell<T: Send + Sync + 'static>(&self, key: &str) -> Arc<OnceCell<T>> {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        let cell = cells
            .entry((TypeId::of::<T>(), key.to_string()))
            .or_insert_with(|| Arc::new(OnceCell::<T>::new()))
            .clone();
        // A cell is keyed by its type, so it is always a `OnceCell<T>`; were it not, the read
        // would only not be shared.
        cell.downcast::<OnceCell<T>>()
            .unwrap_or_else(|_| Arc::new(OnceCell::new()))
    }

    /// Forget every answer.
    pub fn clear(&self) {
        self.cells.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// `read`'s answer on `host`: read once per key while its pool reads for a plan
/// ([`Host::memo`]), else read now.
pub async fn remembered<T, F, Fut>(host: &dyn Host, key: &str, read: F) -> T
where
    T: Clone + Send + Sync + 'static,
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    match host.memo() {
        Some(memo) => memo.cell::<T>(key).get_or_init(read).await.clone(),
        None => read().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::hosts::{Cmd, Endpoint, HostError, Output, RoundTrips};

    /// A node that only counts reads, with or without a memo.
    struct Counted {
        memo: Option<Memo>,
    }

    #[async_trait]
    impl Host for Counted {
        fn node(&self) -> &str {
            "n1"
        }
        async fn exec(&self, _cmd: &Cmd) -> Result<Output, HostError> {
            Err(HostError::Other {
                node: "n1".into(),
                message: "no commands here".into(),
            })
        }
        async fn docker(&self) -> Result<bollard::Docker, HostError> {
            Err(HostError::Other {
                node: "n1".into(),
                message: "no engine here".into(),
            })
        }
        async fn forward(&self, _host: &str, _port: u16) -> Result<Endpoint, HostError> {
            Err(HostError::Other {
                node: "n1".into(),
                message: "no ports here".into(),
            })
        }
        async fn close(&self) {}
        fn round_trips(&self) -> RoundTrips {
            RoundTrips::default()
        }
        fn memo(&self) -> Option<&Memo> {
            self.memo.as_ref()
        }
    }

    async fn read_counted(host: &dyn Host, key: &str, reads: &AtomicUsize) -> u64 {
        remembered(host, key, || async {
            reads.fetch_add(1, Ordering::SeqCst);
            7u64
        })
        .await
    }

    #[tokio::test]
    async fn a_read_runs_once_per_key_while_remembered_and_every_time_otherwise() {
        let reads = AtomicUsize::new(0);
        let remembering = Counted {
            memo: Some(Memo::default()),
        };
        for _ in 0..3 {
            assert_eq!(read_counted(&remembering, "glance", &reads).await, 7);
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        read_counted(&remembering, "image a", &reads).await;
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        // Another type under the same key is its own read.
        let text = remembered(&remembering, "glance", || async { "seen".to_string() }).await;
        assert_eq!(text, "seen");
        // Forgotten, it reads again.
        if let Some(memo) = remembering.memo() {
            memo.clear();
        }
        read_counted(&remembering, "glance", &reads).await;
        assert_eq!(reads.load(Ordering::SeqCst), 3);

        let looking = Counted { memo: None };
        for _ in 0..3 {
            read_counted(&looking, "glance", &reads).await;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 6);
    }
}

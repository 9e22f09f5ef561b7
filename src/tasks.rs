//! Tasks that each work on one thing (a node, a pair of nodes, a step), so that a task which
//! panics is reported against that thing instead of silently ending the loop that collects them.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinSet};

pub struct KeyedTasks<K, T> {
    set: JoinSet<T>,
    keys: HashMap<Id, K>,
}

impl<K, T: Send + 'static> Default for KeyedTasks<K, T> {
    fn default() -> Self {
        KeyedTasks {
            set: JoinSet::new(),
            keys: HashMap::new(),
        }
    }
}

impl<K, T: Send + 'static> KeyedTasks<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn spawn<F>(&mut self, key: K, task: F)
    where
        F: Future<Output = T> + Send + 'static,
    {
        let handle = self.set.spawn(task);
        self.keys.insert(handle.id(), key);
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The next task to end, with its key: its result, or why it ended without one (a panic,
    /// or an abort), as text. `None` once every task has been collected.
    pub async fn next(&mut self) -> Option<(K, Result<T, String>)> {
        loop {
            let joined = self.set.join_next_with_id().await?;
            let (id, result) = match joined {
                Ok((id, v)) => (id, Ok(v)),
                Err(e) => (e.id(), Err(abnormal_end(e))),
            };
            // Every task was spawned with a key; an id without one cannot happen, skip it.
            if let Some(key) = self.keys.remove(&id) {
                return Some((key, result));
            }
        }
    }
}

fn abnormal_end(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        let payload = e.into_panic();
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        format!("the task panicked: {text} (a bug in sparkform; please report it)")
    } else {
        "the task was cancelled".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_reported_under_its_key_and_the_others_still_arrive() {
        let mut tasks = KeyedTasks::new();
        for k in 0..5u32 {
            tasks.spawn(k, async move {
                if k == 1 {
                    panic!("boom on {k}");
                }
                k * 10
            });
        }
        let mut got = Vec::new();
        while let Some((k, r)) = tasks.next().await {
            got.push((k, r));
        }
        got.sort_by_key(|(k, _)| *k);
        assert_eq!(got.len(), 5);
        assert_eq!(got[0].1, Ok(0));
        let err = got[1].1.clone().unwrap_err();
        assert!(err.contains("boom on 1"), "{err}");
        assert_eq!(got[4].1, Ok(40));
    }
}

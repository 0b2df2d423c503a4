//! Wakes acquires that are waiting for a resource to come free.
//!
//! Each waited-on resource has a `watch` channel carrying a counter that is
//! bumped whenever a lease on it ends. A waiter subscribes *before* it tries
//! to acquire, so an ending that happens between its attempt and its wait is
//! never missed. Entries are removed when the last waiter goes away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

#[derive(Clone, Default)]
pub struct Waiters {
    inner: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

/// A waiter's subscription to one resource.
pub struct Subscription {
    name: String,
    rx: watch::Receiver<u64>,
    registry: Waiters,
}

impl Waiters {
    pub fn subscribe(&self, name: &str) -> Subscription {
        let mut map = self.lock();
        let sender = map
            .entry(name.to_owned())
            .or_insert_with(|| watch::channel(0).0);
        let rx = sender.subscribe();
        Subscription {
            name: name.to_owned(),
            rx,
            registry: self.clone(),
        }
    }

    /// A lease on `name` ended: wake everyone waiting for it.
    pub fn lease_ended(&self, name: &str) {
        if let Some(sender) = self.lock().get(name) {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every waiter (used after a lost notification connection, when
    /// endings may have been missed).
    pub fn wake_all(&self) {
        for sender in self.lock().values() {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// How many resources have waiters right now.
    pub fn waited_resources(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        // A poisoned map is still a valid map: every critical section is a
        // single insert, lookup or remove.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Subscription {
    /// Resolves once a lease on the resource has ended since the last call
    /// (or since subscribing).
    pub async fn lease_ended(&mut self) {
        // The sender lives in the map while this subscription exists, so
        // `changed` only fails if the map entry was dropped; then just return.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.registry.lock();
        if let Some(sender) = map.get(&self.name) {
            // Our own receiver is still alive here, so the last waiter sees 1.
            if sender.receiver_count() <= 1 {
                map.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn an_ending_before_the_wait_is_not_missed() {
        let waiters = Waiters::default();
        let mut sub = waiters.subscribe("r");
        waiters.lease_ended("r");
        tokio::time::timeout(Duration::from_secs(1), sub.lease_ended())
            .await
            .expect("woken by an ending that happened before the wait");
    }

    #[tokio::test]
    async fn other_resources_do_not_wake_a_waiter() {
        let waiters = Waiters::default();
        let mut sub = waiters.subscribe("r");
        waiters.lease_ended("other");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), sub.lease_ended())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn entries_are_removed_with_the_last_waiter() {
        let waiters = Waiters::default();
        let a = waiters.subscribe("r");
        let b = waiters.subscribe("r");
        assert_eq!(waiters.waited_resources(), 1);
        drop(a);
        assert_eq!(waiters.waited_resources(), 1);
        drop(b);
        assert_eq!(waiters.waited_resources(), 0);
    }
}

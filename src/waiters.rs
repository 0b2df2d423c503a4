//! Queues acquires that wait for a held resource, first come first served.
//!
//! Each waited-on resource has a FIFO queue of tickets. Only the head of the
//! queue is ever woken to retry: a lease ending wakes the head, the others
//! stay parked, so a release costs one retry instead of a stampede and
//! nobody is overtaken by later arrivals. When the head leaves without the
//! lease (timed out, cancelled, failed) or after a wake it did not use, it
//! passes the turn to the next ticket, so no ending is ever lost. A wake is
//! a stored flag, not an edge: an ending that arrives before the head starts
//! waiting is still seen. Queues are removed with their last ticket.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

#[derive(Clone, Default)]
pub struct Waiters {
    inner: Arc<Mutex<Registry>>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    queues: HashMap<String, VecDeque<Entry>>,
}

struct Entry {
    id: u64,
    /// Whether the resource may have come free since this entry last
    /// tried: only ever set on the head.
    woken: bool,
    notify: Arc<Notify>,
}

impl Entry {
    fn wake(&mut self) {
        self.woken = true;
        // `notify_one` stores a permit if the ticket is not parked yet.
        self.notify.notify_one();
    }
}

/// A waiter's place in one resource's queue; dropping it leaves the queue.
pub struct Ticket {
    name: String,
    id: u64,
    notify: Arc<Notify>,
    registry: Waiters,
    /// Set when the waiter got the lease: its departure needs no hand-on.
    served: bool,
}

impl Waiters {
    /// Joins the back of `name`'s queue. A waiter arriving at an empty queue
    /// may try at once; later arrivals wait for their turn.
    pub fn enqueue(&self, name: &str) -> Ticket {
        let mut registry = self.lock();
        registry.next_id += 1;
        let id = registry.next_id;
        let notify = Arc::new(Notify::new());
        let queue = registry.queues.entry(name.to_owned()).or_default();
        let first = queue.is_empty();
        queue.push_back(Entry {
            id,
            woken: first,
            notify: notify.clone(),
        });
        Ticket {
            name: name.to_owned(),
            id,
            notify,
            registry: self.clone(),
            served: false,
        }
    }

    /// A lease on `name` ended: wake the head of its queue.
    pub fn lease_ended(&self, name: &str) {
        if let Some(head) = self
            .lock()
            .queues
            .get_mut(name)
            .and_then(VecDeque::front_mut)
        {
            head.wake();
        }
    }

    /// Wakes the head of every queue (after a lost notification connection,
    /// when endings may have been missed).
    pub fn wake_all(&self) {
        for queue in self.lock().queues.values_mut() {
            if let Some(head) = queue.front_mut() {
                head.wake();
            }
        }
    }

    /// Whether anyone is queued for `name`.
    pub fn has_queue(&self, name: &str) -> bool {
        self.lock().queues.contains_key(name)
    }

    /// How many resources have waiters right now.
    #[cfg(test)]
    pub fn waited_resources(&self) -> usize {
        self.lock().queues.len()
    }

    /// How many waiters are queued for `name`.
    #[cfg(test)]
    pub fn queued(&self, name: &str) -> usize {
        self.lock().queues.get(name).map_or(0, VecDeque::len)
    }

    /// Claims the turn if `id` heads `name`'s queue and has been woken.
    fn take_turn(&self, name: &str, id: u64) -> bool {
        let mut registry = self.lock();
        match registry.queues.get_mut(name).and_then(VecDeque::front_mut) {
            Some(head) if head.id == id && head.woken => {
                head.woken = false;
                true
            }
            _ => false,
        }
    }

    fn leave(&self, name: &str, id: u64, served: bool) {
        let mut registry = self.lock();
        let Some(queue) = registry.queues.get_mut(name) else {
            return;
        };
        let Some(position) = queue.iter().position(|e| e.id == id) else {
            return;
        };
        let left = queue.remove(position);
        // A head that leaves without the lease, or with a wake it never
        // used, may be carrying the only news of an ending: hand it on.
        let hand_on = position == 0 && left.is_some_and(|e| !served || e.woken);
        if hand_on && let Some(next) = queue.front_mut() {
            next.wake();
        }
        if queue.is_empty() {
            registry.queues.remove(name);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A poisoned registry is still consistent: no critical section can
        // panic halfway through an update.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Ticket {
    /// Resolves when this ticket heads the queue and the resource may have
    /// come free (at once for the first arrival at an empty queue).
    pub async fn turn(&mut self) {
        while !self.registry.take_turn(&self.name, self.id) {
            self.notify.notified().await;
        }
    }

    /// Whether this ticket is at the head of its queue.
    #[cfg(test)]
    pub fn is_head(&self) -> bool {
        let registry = self.registry.lock();
        registry
            .queues
            .get(&self.name)
            .and_then(VecDeque::front)
            .is_some_and(|head| head.id == self.id)
    }

    /// The waiter got the lease: leave without waking the next in line,
    /// who now waits for this lease to end.
    pub fn served(mut self) {
        self.served = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.registry.leave(&self.name, self.id, self.served);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn gets_turn(ticket: &mut Ticket) -> bool {
        tokio::time::timeout(Duration::from_millis(50), ticket.turn())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn the_first_arrival_may_try_at_once_later_ones_wait() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let mut second = waiters.enqueue("r");
        assert!(gets_turn(&mut first).await);
        assert!(!gets_turn(&mut second).await);
        assert!(first.is_head() && !second.is_head());
    }

    #[tokio::test]
    async fn an_ending_before_the_wait_is_not_missed() {
        let waiters = Waiters::default();
        let mut sub = waiters.enqueue("r");
        assert!(gets_turn(&mut sub).await);
        waiters.lease_ended("r");
        assert!(gets_turn(&mut sub).await, "woken by an earlier ending");
    }

    #[tokio::test]
    async fn an_ending_wakes_only_the_head() {
        let waiters = Waiters::default();
        let mut tickets: Vec<Ticket> = (0..4).map(|_| waiters.enqueue("r")).collect();
        assert!(gets_turn(&mut tickets[0]).await);
        waiters.lease_ended("r");
        for ticket in &mut tickets[1..] {
            assert!(!gets_turn(ticket).await);
        }
        assert!(gets_turn(&mut tickets[0]).await);
    }

    #[tokio::test]
    async fn a_served_head_leaves_the_next_waiting_for_the_next_ending() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let mut second = waiters.enqueue("r");
        assert!(gets_turn(&mut first).await);
        first.served();
        assert!(second.is_head());
        assert!(!gets_turn(&mut second).await, "the resource is held now");
        waiters.lease_ended("r");
        assert!(gets_turn(&mut second).await);
    }

    #[tokio::test]
    async fn a_head_leaving_without_the_lease_passes_the_turn_on() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let mut second = waiters.enqueue("r");
        assert!(gets_turn(&mut first).await);
        waiters.lease_ended("r");
        drop(first);
        assert!(gets_turn(&mut second).await);
    }

    #[tokio::test]
    async fn an_unused_wake_is_handed_on_even_by_a_served_head() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let mut second = waiters.enqueue("r");
        assert!(gets_turn(&mut first).await);
        // An ending arrives while the head's winning attempt is in flight.
        waiters.lease_ended("r");
        first.served();
        assert!(gets_turn(&mut second).await);
    }

    #[tokio::test]
    async fn turns_come_in_arrival_order() {
        let waiters = Waiters::default();
        let mut tickets: Vec<Ticket> = (0..5).map(|_| waiters.enqueue("r")).collect();
        let mut order = Vec::new();
        for _ in 0..5 {
            let mut next = tickets.remove(0);
            for later in &mut tickets {
                assert!(!gets_turn(later).await);
            }
            assert!(gets_turn(&mut next).await);
            order.push(next.id);
            next.served();
            waiters.lease_ended("r");
        }
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    }

    #[tokio::test]
    async fn a_parked_waiter_leaving_does_not_disturb_the_head() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let middle = waiters.enqueue("r");
        let mut last = waiters.enqueue("r");
        assert!(gets_turn(&mut first).await);
        drop(middle);
        assert!(!gets_turn(&mut first).await);
        assert!(!gets_turn(&mut last).await);
        assert_eq!(waiters.queued("r"), 2);
    }

    #[tokio::test]
    async fn wake_all_wakes_each_head() {
        let waiters = Waiters::default();
        let mut a = waiters.enqueue("a");
        let mut b = waiters.enqueue("b");
        assert!(gets_turn(&mut a).await && gets_turn(&mut b).await);
        waiters.wake_all();
        assert!(gets_turn(&mut a).await && gets_turn(&mut b).await);
    }

    #[tokio::test]
    async fn other_resources_do_not_wake_a_waiter() {
        let waiters = Waiters::default();
        let mut sub = waiters.enqueue("r");
        assert!(gets_turn(&mut sub).await);
        waiters.lease_ended("other");
        assert!(!gets_turn(&mut sub).await);
    }

    #[tokio::test]
    async fn queues_are_removed_with_the_last_waiter() {
        let waiters = Waiters::default();
        let a = waiters.enqueue("r");
        let b = waiters.enqueue("r");
        assert_eq!(waiters.waited_resources(), 1);
        drop(a);
        assert_eq!(waiters.waited_resources(), 1);
        b.served();
        assert_eq!(waiters.waited_resources(), 0);
    }
}

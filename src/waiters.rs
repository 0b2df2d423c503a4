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
//!
//! With group commit a waiter also leaves a *standing acquire* in its
//! ticket: the batch that ends the resource's lease takes the head's
//! standing acquire and runs it in the same transaction, so one commit ends
//! one lease and grants the next, and the waiter is answered by that
//! commit instead of waking up to retry (see [`Waiters::claim`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};

use crate::domain::LeaseId;
use crate::store::{AcquireOutcome, AcquireRequest, Recorded, StoreResult};

/// An acquire a queued waiter leaves for the batch that ends the current
/// lease to run on its behalf.
pub struct StandingAcquire {
    pub request: AcquireRequest,
    /// Answered once the batch that ran it commits; dropped unanswered when
    /// the batch did not run it after all (the waiter then tries itself).
    pub reply: oneshot::Sender<StoreResult<Recorded<AcquireOutcome>>>,
}

/// Where a standing acquire's answer arrives.
pub type StandingAnswer = oneshot::Receiver<StoreResult<Recorded<AcquireOutcome>>>;

/// Endings a queue remembers as handed to a standing acquire (normally
/// one: an entry is taken by the wake that follows its commit).
const MAX_HANDED_OFF: usize = 8;

#[derive(Clone, Default)]
pub struct Waiters {
    inner: Arc<Mutex<Registry>>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    queues: HashMap<String, Queue>,
    /// Turns taken so far, for tests that count retries.
    #[cfg(test)]
    turns: u64,
}

#[derive(Default)]
struct Queue {
    entries: VecDeque<Entry>,
    /// Endings already handed to the waiter whose standing acquire ran in
    /// the same batch: the wake that follows their commit would only make
    /// the next waiter retry against the lease just granted.
    handed_off: Vec<LeaseId>,
}

struct Entry {
    id: u64,
    /// Whether the resource may have come free since this entry last
    /// tried: only ever set on the head.
    woken: bool,
    notify: Arc<Notify>,
    standing: Option<StandingAcquire>,
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
        let queue = &mut registry.queues.entry(name.to_owned()).or_default().entries;
        let first = queue.is_empty();
        queue.push_back(Entry {
            id,
            woken: first,
            notify: notify.clone(),
            standing: None,
        });
        Ticket {
            name: name.to_owned(),
            id,
            notify,
            registry: self.clone(),
            served: false,
        }
    }

    /// A lease on `name` ended (`lease`, when known: endings recorded by
    /// this instance): wake the head of its queue, unless that ending was
    /// already handed to a standing acquire.
    pub fn lease_ended(&self, name: &str, lease: Option<&LeaseId>) {
        let mut registry = self.lock();
        let Some(queue) = registry.queues.get_mut(name) else {
            return;
        };
        if let Some(at) = lease.and_then(|id| queue.handed_off.iter().position(|h| h == id)) {
            queue.handed_off.swap_remove(at);
            return;
        }
        if let Some(head) = queue.entries.front_mut() {
            head.wake();
        }
    }

    /// Wakes the head of every queue (after a lost notification connection,
    /// when endings may have been missed).
    pub fn wake_all(&self) {
        for queue in self.lock().queues.values_mut() {
            if let Some(head) = queue.entries.front_mut() {
                head.wake();
            }
        }
    }

    /// Takes the standing acquire of the head of `name`'s queue, for a
    /// batch in which a lease on `name` ended to run it (after every other
    /// request of the batch). Whoever takes it must answer it or drop it.
    pub fn claim(&self, name: &str) -> Option<StandingAcquire> {
        self.lock()
            .queues
            .get_mut(name)?
            .entries
            .front_mut()?
            .standing
            .take()
    }

    /// The batch that ran a claimed standing acquire committed: the ending
    /// `lease` it ran after needs no wake any more.
    pub fn handed_off(&self, name: &str, lease: &LeaseId) {
        if let Some(queue) = self.lock().queues.get_mut(name) {
            if queue.handed_off.len() == MAX_HANDED_OFF {
                queue.handed_off.remove(0);
            }
            queue.handed_off.push(lease.clone());
        }
    }

    /// How many resources have waiters right now.
    #[cfg(test)]
    pub fn waited_resources(&self) -> usize {
        self.lock().queues.len()
    }

    /// How many waiters are queued for `name`.
    #[cfg(test)]
    pub fn queued(&self, name: &str) -> usize {
        self.lock().queues.get(name).map_or(0, |q| q.entries.len())
    }

    /// How many turns waiters have taken (each is one retry).
    #[cfg(test)]
    pub fn turns_taken(&self) -> u64 {
        self.lock().turns
    }

    /// How many of `name`'s waiters have an acquire standing.
    #[cfg(test)]
    pub fn standing(&self, name: &str) -> usize {
        self.lock().queues.get(name).map_or(0, |q| {
            q.entries.iter().filter(|e| e.standing.is_some()).count()
        })
    }

    /// Claims the turn if `id` heads `name`'s queue and has been woken.
    fn take_turn(&self, name: &str, id: u64) -> bool {
        let mut registry = self.lock();
        match registry
            .queues
            .get_mut(name)
            .and_then(|q| q.entries.front_mut())
        {
            Some(head) if head.id == id && head.woken => {
                head.woken = false;
                #[cfg(test)]
                {
                    registry.turns += 1;
                }
                true
            }
            _ => false,
        }
    }

    /// The entry `id` of `name`'s queue, if it is still queued.
    fn entry(&self, name: &str, id: u64, f: impl FnOnce(&mut Entry)) {
        let mut registry = self.lock();
        let entries = registry.queues.get_mut(name).map(|q| &mut q.entries);
        if let Some(entry) = entries.and_then(|e| e.iter_mut().find(|e| e.id == id)) {
            f(entry);
        }
    }

    fn leave(&self, name: &str, id: u64, served: bool) {
        let mut registry = self.lock();
        let Some(queue) = registry.queues.get_mut(name).map(|q| &mut q.entries) else {
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

    /// Leaves `request` for the batch that next ends a lease on this
    /// resource while this ticket heads the queue (replacing any earlier
    /// one); its answer arrives on the returned receiver. Until a batch
    /// claims it, [`Ticket::withdraw`] takes it back.
    pub fn stand(&mut self, request: AcquireRequest) -> StandingAnswer {
        let (reply, answer) = oneshot::channel();
        let standing = StandingAcquire { request, reply };
        self.registry
            .entry(&self.name, self.id, |e| e.standing = Some(standing));
        answer
    }

    /// Takes back this ticket's standing acquire. False if there was none
    /// left: a batch claimed it, and its answer is on the way.
    pub fn withdraw(&mut self) -> bool {
        let mut withdrawn = false;
        self.registry.entry(&self.name, self.id, |e| {
            withdrawn = e.standing.take().is_some();
        });
        withdrawn
    }

    /// Whether this ticket is at the head of its queue.
    #[cfg(test)]
    pub fn is_head(&self) -> bool {
        let registry = self.registry.lock();
        registry
            .queues
            .get(&self.name)
            .and_then(|q| q.entries.front())
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
        waiters.lease_ended("r", None);
        assert!(gets_turn(&mut sub).await, "woken by an earlier ending");
    }

    #[tokio::test]
    async fn an_ending_wakes_only_the_head() {
        let waiters = Waiters::default();
        let mut tickets: Vec<Ticket> = (0..4).map(|_| waiters.enqueue("r")).collect();
        assert!(gets_turn(&mut tickets[0]).await);
        waiters.lease_ended("r", None);
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
        waiters.lease_ended("r", None);
        assert!(gets_turn(&mut second).await);
    }

    #[tokio::test]
    async fn a_head_leaving_without_the_lease_passes_the_turn_on() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let mut second = waiters.enqueue("r");
        assert!(gets_turn(&mut first).await);
        waiters.lease_ended("r", None);
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
        waiters.lease_ended("r", None);
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
            waiters.lease_ended("r", None);
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
        waiters.lease_ended("other", None);
        assert!(!gets_turn(&mut sub).await);
    }

    fn request() -> AcquireRequest {
        AcquireRequest::for_tests("r", "w", 1_000)
    }

    #[tokio::test]
    async fn only_the_heads_standing_acquire_is_claimed() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let mut second = waiters.enqueue("r");
        let _first_answer = first.stand(request());
        let second_request = request();
        let _second_answer = second.stand(second_request.clone());
        assert!(waiters.claim("r").is_some());
        assert!(waiters.claim("r").is_none(), "claimed once");
        assert!(!first.withdraw(), "the claimed one cannot be taken back");
        assert!(waiters.claim("other").is_none());
        drop(first);
        let claimed = waiters.claim("r").expect("the new head's");
        assert_eq!(claimed.request.lease_id, second_request.lease_id);
    }

    #[tokio::test]
    async fn a_withdrawn_or_departed_standing_acquire_is_never_claimed() {
        let waiters = Waiters::default();
        let mut first = waiters.enqueue("r");
        let _answer = first.stand(request());
        assert!(first.withdraw());
        assert!(!first.withdraw(), "nothing left to take back");
        assert!(waiters.claim("r").is_none());
        let answer = first.stand(request());
        drop(first);
        assert!(waiters.claim("r").is_none());
        assert!(answer.await.is_err(), "its answer will never come");
    }

    #[tokio::test]
    async fn a_handed_off_ending_does_not_wake_the_head_once() {
        let waiters = Waiters::default();
        let mut sub = waiters.enqueue("r");
        assert!(gets_turn(&mut sub).await);
        let ended = LeaseId::generate();
        waiters.handed_off("r", &ended);
        waiters.lease_ended("r", Some(&ended));
        assert!(!gets_turn(&mut sub).await, "that ending was handed on");
        waiters.lease_ended("r", Some(&ended));
        assert!(gets_turn(&mut sub).await, "a second report is a new ending");
        waiters.handed_off("r", &ended);
        waiters.lease_ended("r", Some(&LeaseId::generate()));
        assert!(gets_turn(&mut sub).await, "other endings still wake");
        waiters.lease_ended("r", None);
        assert!(gets_turn(&mut sub).await, "as do endings from elsewhere");
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

//! The lock service: what the HTTP handlers (and later the UI) call.
//!
//! It adds to the store what needs the process rather than the database:
//! waiting for a held resource (woken by lease endings, never by polling),
//! waking local waiters after a commit, and the background tasks that record
//! expiries and carry lease endings between instances. It is also where
//! lock metrics are recorded, so every front end (API, UI) is counted alike.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::{Lease, LeaseId, Reason, ResourceName, Token, Ttl, WaitTime};
use crate::metrics::Metrics;
use crate::store::{
    AcquireOutcome, AcquireRequest, Event, EventFilter, FenceOutcome, ForceReleaseOutcome,
    GroupCommit, GroupCommitConfig, Recorded, ReleaseOutcome, RenewOutcome, ResourceView, Store,
    StoreError, StoreResult, StoredValue, ValueWrite, WriteVia, WritersStopped,
};
use crate::waiters::{StandingAnswer, Waiters};

/// The largest value the fenced store accepts, in bytes of JSON text.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("too many acquires are already waiting")]
    Overloaded,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_ttl: Duration,
    /// Acquires that may wait at once in this instance.
    pub max_waiters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_ttl: Ttl::DEFAULT_MAX,
            max_waiters: 10_000,
        }
    }
}

/// A granted, re-issued or refused acquire, and how long it waited.
#[derive(Debug, Clone)]
pub struct Acquired {
    pub outcome: AcquireOutcome,
    pub waited: Duration,
}

#[derive(Clone)]
pub struct LockService {
    store: Store,
    waiters: Waiters,
    limits: Limits,
    /// Permits for waiting acquires: bounds the memory and wake-ups a flood
    /// of waiters can cost.
    wait_permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    metrics: Metrics,
    /// When set, writes go through shared batch transactions, and a batch
    /// that ends a lease grants it to the next waiter itself.
    group_commit: Option<GroupCommit>,
}

impl LockService {
    pub fn new(
        store: Store,
        limits: Limits,
        shutdown: CancellationToken,
        metrics: Metrics,
    ) -> Self {
        Self {
            store,
            waiters: Waiters::default(),
            wait_permits: Arc::new(Semaphore::new(limits.max_waiters)),
            limits,
            shutdown,
            metrics,
            group_commit: None,
        }
    }

    /// `lease` ended through this instance: wake the head of its queue
    /// (unless the batch that ended it granted the resource to that head).
    fn lease_ended(&self, lease: &Lease) {
        self.waiters
            .lease_ended(lease.resource.as_str(), Some(&lease.lease_id));
    }

    /// Sends every write through shared batch transactions (started here:
    /// their writers hand ended leases to this service's waiters).
    pub fn with_group_commit(mut self, config: GroupCommitConfig) -> Self {
        let group_commit = GroupCommit::start(&self.store, config, self.waiters.clone());
        self.group_commit = Some(group_commit);
        self
    }

    /// With group commit: resolves once its writers have ended (after the
    /// last clone of this service is gone) and closed their connections.
    pub fn writers_stopped(&self) -> Option<WritersStopped> {
        self.group_commit.as_ref().map(GroupCommit::stopped)
    }

    async fn store_acquire(&self, req: &AcquireRequest) -> StoreResult<Recorded<AcquireOutcome>> {
        match &self.group_commit {
            Some(batched) => batched.acquire(req).await,
            None => self.store.acquire(req).await,
        }
    }

    async fn store_renew(
        &self,
        id: &LeaseId,
        ttl: Option<Ttl>,
    ) -> StoreResult<Recorded<RenewOutcome>> {
        match &self.group_commit {
            Some(batched) => batched.renew(id, ttl).await,
            None => self.store.renew(id, ttl).await,
        }
    }

    async fn store_release(&self, id: &LeaseId) -> StoreResult<Recorded<ReleaseOutcome>> {
        match &self.group_commit {
            Some(batched) => batched.release(id).await,
            None => self.store.release(id).await,
        }
    }

    async fn store_force_release(
        &self,
        name: &ResourceName,
        reason: &Reason,
        actor: &str,
    ) -> StoreResult<Recorded<ForceReleaseOutcome>> {
        match &self.group_commit {
            Some(batched) => batched.force_release(name, reason, actor).await,
            None => self.store.force_release(name, reason, actor).await,
        }
    }

    async fn store_fence(
        &self,
        name: &ResourceName,
        token: Token,
        write: Option<&ValueWrite>,
    ) -> StoreResult<Recorded<FenceOutcome>> {
        match &self.group_commit {
            Some(batched) => batched.fence(name, token, write).await,
            None => self.store.fence(name, token, write).await,
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts and announces the expiry an operation recorded on the way, and
    /// hands back its outcome.
    fn settled<T>(&self, recorded: Recorded<T>) -> T {
        if let Some(lease) = &recorded.expired {
            self.metrics.expired(lease);
            self.lease_ended(lease);
        }
        recorded.outcome
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    /// Acquires, waiting up to `wait` while someone else holds the resource.
    ///
    /// Waiters on one resource queue up first come first served: only the
    /// head of the queue retries, when a lease on the resource ends (here
    /// or, on PostgreSQL, in any instance) or when the holder's deadline
    /// passes; the others stay parked until the head leaves. A waiter still
    /// queued at its own deadline makes one last attempt, so its answer
    /// names the current holder.
    ///
    /// With group commit, a waiter also leaves its acquire standing in the
    /// queue: when a batch here ends the lease while this waiter heads the
    /// queue, that batch runs the acquire after its own requests, and the
    /// waiter is answered by the commit that freed the resource.
    pub async fn acquire(
        &self,
        req: AcquireRequest,
        wait: WaitTime,
    ) -> Result<Acquired, ServiceError> {
        let started = Instant::now();
        if wait.as_duration().is_zero() {
            let outcome = self.settled(self.store_acquire(&req).await?);
            return Ok(self.acquired(outcome, started.elapsed()));
        }
        let deadline = started + wait.as_duration();
        let _permit = self
            .wait_permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| ServiceError::Overloaded)?;
        // Queue up before the first attempt so no ending slips between.
        let mut ticket = self.waiters.enqueue(req.resource.as_str());
        let stands = self.group_commit.is_some();
        let mut standing = stands.then(|| ticket.stand(req.clone()));
        let mut retry_at = deadline;
        loop {
            let handed = tokio::select! {
                () = ticket.turn() => None,
                () = tokio::time::sleep_until(retry_at) => None,
                answer = standing_answer(&mut standing) => Some(answer),
                () = self.shutdown.cancelled() => return Err(ServiceError::ShuttingDown),
            };
            let handed = match handed {
                Some(answer) => {
                    standing = None; // spent
                    answer
                }
                // Our turn (or the timer): try for ourselves, unless a batch
                // already runs the standing acquire; then its answer is ours.
                None => match standing.take() {
                    Some(answer) if !ticket.withdraw() => answer.await.ok(),
                    _ => None,
                },
            };
            // An error drops the ticket unserved, which passes the turn on.
            let recorded = match handed {
                Some(answer) => answer?,
                // Never run, or not claimed: try for ourselves.
                None => self.store_acquire(&req).await?,
            };
            let outcome = self.settled(recorded);
            let local_now = Instant::now();
            match &outcome {
                AcquireOutcome::Held { holder, now } if local_now < deadline => {
                    // Retry just after the holder's deadline even if nobody
                    // records the expiry: the acquire itself settles it.
                    let until_expiry = (holder.expires_at - *now).to_std().unwrap_or_default()
                        + Duration::from_millis(1);
                    retry_at = deadline.min(local_now + until_expiry);
                    if stands {
                        standing = Some(ticket.stand(req.clone()));
                    }
                }
                AcquireOutcome::Held { .. } => {
                    return Ok(self.acquired(outcome, started.elapsed()));
                }
                AcquireOutcome::Granted { .. } | AcquireOutcome::Existing(_) => {
                    ticket.served();
                    return Ok(self.acquired(outcome, started.elapsed()));
                }
            }
        }
    }

    /// The final answer of an acquire, counted once however many attempts
    /// it took.
    fn acquired(&self, outcome: AcquireOutcome, waited: Duration) -> Acquired {
        match &outcome {
            AcquireOutcome::Granted { .. } => self.metrics.acquire_granted(waited),
            AcquireOutcome::Existing(_) => self.metrics.acquire_reissued(),
            AcquireOutcome::Held { .. } => self.metrics.acquire_held(),
        }
        Acquired { outcome, waited }
    }

    pub async fn renew(
        &self,
        id: &LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<RenewOutcome, ServiceError> {
        let outcome = self.settled(self.store_renew(id, ttl).await?);
        match &outcome {
            RenewOutcome::Renewed { margin_ms, .. } => self.metrics.renewed(*margin_ms),
            RenewOutcome::NotActive(_) => self.metrics.renewal_refused(),
            RenewOutcome::NotFound => {}
        }
        Ok(outcome)
    }

    pub async fn release(&self, id: &LeaseId) -> Result<ReleaseOutcome, ServiceError> {
        let outcome = self.settled(self.store_release(id).await?);
        if let ReleaseOutcome::Released(lease) = &outcome {
            self.metrics.released(lease);
            self.lease_ended(lease);
        }
        Ok(outcome)
    }

    pub async fn force_release(
        &self,
        name: &ResourceName,
        reason: &Reason,
        actor: &str,
    ) -> Result<ForceReleaseOutcome, ServiceError> {
        let outcome = self.settled(self.store_force_release(name, reason, actor).await?);
        if let ForceReleaseOutcome::Released(lease) = &outcome {
            self.metrics.force_released(lease);
            self.lease_ended(lease);
        }
        Ok(outcome)
    }

    pub async fn fence(
        &self,
        name: &ResourceName,
        token: Token,
    ) -> Result<FenceOutcome, ServiceError> {
        let outcome = self.settled(self.store_fence(name, token, None).await?);
        self.metrics.fenced(name, WriteVia::Fence, &outcome);
        Ok(outcome)
    }

    /// The built-in fenced store: check and write in one transaction.
    pub async fn write_value(
        &self,
        name: &ResourceName,
        token: Token,
        value: ValueWrite,
    ) -> Result<FenceOutcome, ServiceError> {
        let outcome = self.settled(self.store_fence(name, token, Some(&value)).await?);
        self.metrics.fenced(name, WriteVia::Store, &outcome);
        Ok(outcome)
    }

    pub async fn value(&self, name: &ResourceName) -> Result<Option<StoredValue>, ServiceError> {
        Ok(self.store.value(name).await?)
    }

    pub async fn lease(&self, id: &LeaseId) -> Result<Option<Lease>, ServiceError> {
        Ok(self.store.lease(id).await?.map(|(lease, _)| lease))
    }

    pub async fn resource(
        &self,
        name: &ResourceName,
    ) -> Result<Option<ResourceView>, ServiceError> {
        Ok(self.store.resource(name).await?)
    }

    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<Event>, ServiceError> {
        Ok(self.store.events(filter).await?)
    }

    /// Records due expiries and wakes their waiters; returns how many.
    pub async fn expire_due_leases(&self, batch: i64) -> Result<Vec<Lease>, ServiceError> {
        let expired = match &self.group_commit {
            // Shared batches: a sweep costs a few commits, not one per lease.
            Some(batched) => {
                batched
                    .expire(&self.store.due_resources(batch).await?)
                    .await?
            }
            None => self.store.expire_due_leases(batch).await?,
        };
        for lease in &expired {
            self.metrics.expired(lease);
            self.lease_ended(lease);
        }
        Ok(expired)
    }

    pub async fn ready(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.store.ping()).await,
            Ok(Ok(()))
        )
    }
}

/// The answer to a standing acquire, once a batch ran it (`None`: the
/// batch dropped it unrun); never resolves while there is none.
async fn standing_answer(
    standing: &mut Option<StandingAnswer>,
) -> Option<StoreResult<Recorded<AcquireOutcome>>> {
    match standing {
        Some(answer) => answer.await.ok(),
        None => std::future::pending().await,
    }
}

/// Records expiries every `interval` until `shutdown`, so they show up in
/// the log about when they happen even if nobody touches the resource.
pub async fn run_expiry_sweeper(
    service: LockService,
    interval: Duration,
    shutdown: CancellationToken,
) {
    const BATCH: i64 = 500;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let started = Instant::now();
        match service.expire_due_leases(BATCH).await {
            Ok(expired) => {
                service.metrics().expiry_sweep(Some(started.elapsed()));
                if !expired.is_empty() {
                    tracing::debug!(count = expired.len(), "recorded lease expiries");
                }
            }
            Err(err) => {
                service.metrics().expiry_sweep(None);
                tracing::warn!(error = %err, "expiry sweep failed; retrying");
            }
        }
    }
}

/// On PostgreSQL, carries lease endings from every instance to this one's
/// waiters via LISTEN/NOTIFY. After a lost connection it wakes every waiter
/// (endings may have been missed; they simply retry) and reconnects.
pub async fn run_lease_ended_listener(service: LockService, shutdown: CancellationToken) {
    let Store::Postgres(pg) = service.store() else {
        return;
    };
    loop {
        match pg.lease_ended_listener().await {
            Ok(mut listener) => loop {
                tokio::select! {
                    received = listener.try_recv() => match received {
                        Ok(Some(n)) => {
                            // This instance woke its own waiters already.
                            if let Some(resource) = pg.announced_elsewhere(n.payload()) {
                                service.waiters().lease_ended(resource, None);
                            }
                        }
                        Ok(None) => {
                            tracing::warn!("lease notification connection lost; reconnecting");
                            service.waiters().wake_all();
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "lease notification listener failed");
                            service.waiters().wake_all();
                            break;
                        }
                    },
                    () = shutdown.cancelled() => return,
                }
            },
            Err(err) => tracing::warn!(error = %err, "cannot listen for lease notifications"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Read queries for the web UI. They go straight to the store: reads need
/// nothing from the process (no waiting, no waking).
impl LockService {
    /// Stops when the server shuts down: long-lived UI work (the demo,
    /// streams) watches it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    pub async fn list_resources(
        &self,
        query: &crate::store::ui::ResourceQuery,
    ) -> Result<crate::store::ui::ResourcePage, ServiceError> {
        Ok(self.store.list_resources(query).await?)
    }

    pub async fn leases_in_window(
        &self,
        resource: &ResourceName,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
        limit: i64,
    ) -> Result<Vec<crate::store::ui::PublicLease>, ServiceError> {
        Ok(self
            .store
            .leases_in_window(resource.as_str(), from, to, limit)
            .await?)
    }

    pub async fn public_lease(
        &self,
        resource: &ResourceName,
        token: i64,
    ) -> Result<Option<crate::store::ui::PublicLease>, ServiceError> {
        Ok(self.store.public_lease(resource.as_str(), token).await?)
    }

    pub async fn events_in_window(
        &self,
        resource: &ResourceName,
        kinds: &[crate::domain::EventKind],
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
        limit: i64,
    ) -> Result<Vec<Event>, ServiceError> {
        Ok(self
            .store
            .events_in_window(resource.as_str(), kinds, from, to, limit)
            .await?)
    }

    pub async fn query_events(
        &self,
        query: &crate::store::ui::EventQuery,
    ) -> Result<Vec<Event>, ServiceError> {
        Ok(self.store.query_events(query).await?)
    }

    pub async fn overview(
        &self,
        contended_limit: i64,
    ) -> Result<crate::store::ui::Overview, ServiceError> {
        Ok(self.store.overview(contended_limit).await?)
    }

    pub async fn db_now(&self) -> Result<chrono::DateTime<chrono::Utc>, ServiceError> {
        Ok(self.store.db_now().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsConfig;
    use crate::store::GroupCommitConfig;

    fn request(holder: &str) -> AcquireRequest {
        AcquireRequest::for_tests("handoff", holder, 30_000)
    }

    fn granted(acquired: Acquired) -> Lease {
        match acquired.outcome {
            AcquireOutcome::Granted { lease, .. } => lease,
            other => panic!("not granted: {other:?}"),
        }
    }

    /// A service whose writes go through group commit.
    fn batched_service(store: &Store) -> LockService {
        let metrics = Metrics::new(&MetricsConfig::default()).expect("metrics");
        LockService::new(
            store.clone(),
            Limits::default(),
            CancellationToken::new(),
            metrics,
        )
        .with_group_commit(GroupCommitConfig::DEFAULT)
    }

    /// Waiters queued behind a holder are granted the lease by the batch
    /// that releases it, in order, each token one higher: only the first
    /// one ever takes a turn (to find the resource held); the others are
    /// answered by the releases' commits without retrying.
    async fn queued_waiters_are_granted_by_the_releasing_batch(store: Store) {
        let service = batched_service(&store);
        let wait = WaitTime::from_millis(20_000).expect("wait");
        let first = granted(service.acquire(request("h0"), wait).await.expect("acquire"));
        let turns_before = service.waiters.turns_taken();
        let mut waiters = Vec::new();
        for i in 1..=3 {
            let waiting = service.clone();
            waiters.push(tokio::spawn(async move {
                waiting.acquire(request(&format!("h{i}")), wait).await
            }));
            // Queued in this order.
            while service.waiters.queued("handoff") < i {
                tokio::task::yield_now().await;
            }
        }
        // The head found it held and left its acquire standing.
        tokio::time::timeout(Duration::from_secs(10), async {
            while service.waiters.standing("handoff") < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("every waiter stands");
        let mut holder = first;
        for (i, waiter) in waiters.into_iter().enumerate() {
            service.release(&holder.lease_id).await.expect("release");
            let next = granted(waiter.await.expect("waiter").expect("acquire"));
            assert_eq!(next.holder.as_str(), format!("h{}", i + 1), "FIFO");
            assert_eq!(next.token.get(), holder.token.get() + 1);
            holder = next;
        }
        assert_eq!(
            service.waiters.turns_taken() - turns_before,
            1,
            "only the first waiter tried for itself"
        );
        service.release(&holder.lease_id).await.expect("release");
        assert_eq!(service.waiters.queued("handoff"), 0);
        store.close().await;
    }

    /// A standing waiter that gives up at its deadline leaves nothing
    /// behind: the release that follows grants nobody.
    async fn a_standing_waiter_that_times_out_is_not_granted(store: Store) {
        let service = batched_service(&store);
        let holder = granted(
            service
                .acquire(request("h0"), WaitTime::from_millis(0).expect("wait"))
                .await
                .expect("acquire"),
        );
        let short = WaitTime::from_millis(200).expect("wait");
        let gave_up = service
            .acquire(request("h1"), short)
            .await
            .expect("acquire");
        assert!(matches!(gave_up.outcome, AcquireOutcome::Held { .. }));
        assert_eq!(service.waiters.queued("handoff"), 0);
        service.release(&holder.lease_id).await.expect("release");
        let name = ResourceName::parse("handoff").expect("name");
        let view = store.resource(&name).await.expect("read").expect("exists");
        assert!(view.holder.is_none(), "nobody was granted: {view:?}");
        store.close().await;
    }

    crate::store::on_both_backends! {
        "service":
        queued_waiters_are_granted_by_the_releasing_batch =>
            queued_waiters_are_granted_by_the_releasing_batch_on_sqlite,
            queued_waiters_are_granted_by_the_releasing_batch_on_postgres;
        a_standing_waiter_that_times_out_is_not_granted =>
            a_standing_waiter_that_times_out_is_not_granted_on_sqlite,
            a_standing_waiter_that_times_out_is_not_granted_on_postgres;
    }
}

//! Group commit (on by default): concurrent write requests share one
//! transaction, and each is answered only after that transaction commits.
//!
//! A few writer tasks (one on SQLite, which has one writer connection; a
//! small number on PostgreSQL) each take the first waiting request, open a
//! transaction, then, holding a one-permit gate, drain whatever else is
//! waiting (up to a batch size) and run it: on the staged fast path
//! ([`super::staged`]: lock every resource in one sorted statement, load,
//! run in memory, flush in multi-row statements), or, when that cannot
//! answer for certain, request by request, each in its own savepoint so
//! one that fails is rolled back alone while its batch-mates still commit.
//! Rows are locked in resource-name order (a fixed global order), so two
//! batches can never deadlock; two requests on one resource keep their
//! arrival order, which keeps the event log a serial history. The gate is
//! given back once the batch has run in memory, before its writes are sent:
//! the next batch locks and loads while this one flushes and waits for the
//! disk (its row locks keep the two in order on any resource they share).
//! If the commit fails, no request of the batch was
//! acknowledged, and every one gets the error.
//!
//! A batch in which a lease ends also grants the resource to the next local
//! waiter, in the same transaction: after its own requests it runs the
//! standing acquire that the head of the resource's waiter queue left (see
//! [`crate::waiters`]). A hot resource's handoff then costs one commit, not
//! a commit, a wake-up and another commit.

use std::sync::Arc;

use tokio::sync::{Mutex, Semaphore, mpsc, oneshot, watch};

use super::ops;
use super::staged::{BatchTx, Plan, StagedTx};
use super::types::*;
use super::{ResourceTx, Store, StoreError, StoreResult, Writes};
use crate::domain::{Lease, LeaseId, Reason, ResourceName, Token, Ttl};
use crate::waiters::{StandingAcquire, Waiters};

/// Requests waiting for a writer, beyond which callers wait to enqueue.
const QUEUE_DEPTH: usize = 4096;

/// How long a transaction opened ahead waits for a request before the
/// writer opens a fresh one.
const AHEAD_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The largest batch after which a writer opens its next transaction ahead.
const LIGHT_BATCH: usize = 2;

/// Expiries a sweep has queued at once: half a default batch, so a batch
/// always has room for the clients' requests too.
const EXPIRIES_IN_FLIGHT: usize = 32;

/// One write operation, as the store's methods take it.
enum WriteRequest {
    Acquire(AcquireRequest),
    Renew(LeaseId, Option<Ttl>),
    Release(LeaseId),
    ForceRelease(ResourceName, Reason, String),
    Fence(ResourceName, Token, Option<ValueWrite>),
    /// Records the expiry of the resource's lease if it is due (the sweeper).
    Expire(ResourceName),
    /// Acquires, then fails: how tests show a failure is undone alone.
    #[cfg(test)]
    AcquireThenFail(AcquireRequest),
}

enum WriteReply {
    Acquire(Recorded<AcquireOutcome>),
    Renew(Recorded<RenewOutcome>),
    Release(Recorded<ReleaseOutcome>),
    ForceRelease(Recorded<ForceReleaseOutcome>),
    Fence(Recorded<FenceOutcome>),
    Expire(Option<Lease>),
}

struct Pending {
    request: WriteRequest,
    reply: oneshot::Sender<StoreResult<WriteReply>>,
}

/// How batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitConfig {
    /// Batch transactions in flight: one runs while the others commit
    /// (SQLite always uses one: it has one writer).
    pub writers: usize,
    /// Most requests in one transaction.
    pub max_batch: usize,
}

impl GroupCommitConfig {
    /// Measured best on a 2-core machine with PostgreSQL beside it (see
    /// docs/performance.md): more writers split the traffic into smaller
    /// batches and gain nothing.
    pub const DEFAULT: Self = Self {
        writers: 2,
        max_batch: 64,
    };
}

/// The handle write requests are submitted through; cheap to clone. The
/// writer tasks end when the last handle is dropped.
#[derive(Clone)]
pub struct GroupCommit {
    queue: mpsc::Sender<Pending>,
    stopped: WritersStopped,
}

/// Resolves once every writer has ended and closed its own connection
/// (SQLite's in-process writer has one), for a shutdown that leaves the
/// database file to itself. Holding it does not keep the writers running.
#[derive(Clone)]
pub struct WritersStopped(Arc<watch::Sender<()>>);

impl WritersStopped {
    /// Each writer holds a receiver of this channel until it has ended.
    pub async fn wait(&self) {
        self.0.closed().await;
    }
}

impl GroupCommit {
    /// Starts the writer tasks over `store`'s backend. A batch that ends a
    /// lease runs the standing acquire of the head of `waiters`' queue for
    /// that resource.
    pub fn start(store: &Store, config: GroupCommitConfig, waiters: Waiters) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH);
        let receiver = Arc::new(Mutex::new(receiver));
        let writers = match store {
            Store::Sqlite(_) => 1,
            Store::Postgres(_) => config.writers.max(1),
        };
        // One batch runs at a time; the others commit. Two or three running
        // at once split the traffic into smaller batches and measured 20–25%
        // slower (docs/performance.md).
        let gate = Arc::new(Semaphore::new(1));
        let (stopped, running) = watch::channel(());
        for _ in 0..writers {
            let writer = Writer {
                receiver: receiver.clone(),
                gate: gate.clone(),
                max_batch: config.max_batch.max(1),
                waiters: waiters.clone(),
                running: running.clone(),
            };
            match store {
                Store::Sqlite(b) => writer.start_sqlite(b),
                Store::Postgres(b) => {
                    tokio::spawn(writer.run(b.clone()));
                }
            };
        }
        Self {
            queue,
            stopped: WritersStopped(Arc::new(stopped)),
        }
    }

    /// See [`WritersStopped`].
    pub fn stopped(&self) -> WritersStopped {
        self.stopped.clone()
    }

    async fn submit(&self, request: WriteRequest) -> StoreResult<WriteReply> {
        answered(self.enqueue(request).await?).await
    }

    /// Puts `request` in the queue; its answer arrives on the receiver.
    async fn enqueue(&self, request: WriteRequest) -> StoreResult<Answer> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { request, reply })
            .await
            .map_err(|_| StoreError::Unavailable("group commit writers stopped".into()))?;
        Ok(answer)
    }

    pub async fn acquire(&self, req: &AcquireRequest) -> StoreResult<Recorded<AcquireOutcome>> {
        match self.submit(WriteRequest::Acquire(req.clone())).await? {
            WriteReply::Acquire(r) => Ok(r),
            _ => Err(mismatched()),
        }
    }

    pub async fn renew(
        &self,
        id: &LeaseId,
        ttl: Option<Ttl>,
    ) -> StoreResult<Recorded<RenewOutcome>> {
        match self.submit(WriteRequest::Renew(id.clone(), ttl)).await? {
            WriteReply::Renew(r) => Ok(r),
            _ => Err(mismatched()),
        }
    }

    pub async fn release(&self, id: &LeaseId) -> StoreResult<Recorded<ReleaseOutcome>> {
        match self.submit(WriteRequest::Release(id.clone())).await? {
            WriteReply::Release(r) => Ok(r),
            _ => Err(mismatched()),
        }
    }

    pub async fn force_release(
        &self,
        name: &ResourceName,
        reason: &Reason,
        actor: &str,
    ) -> StoreResult<Recorded<ForceReleaseOutcome>> {
        let request = WriteRequest::ForceRelease(name.clone(), reason.clone(), actor.to_owned());
        match self.submit(request).await? {
            WriteReply::ForceRelease(r) => Ok(r),
            _ => Err(mismatched()),
        }
    }

    pub async fn fence(
        &self,
        name: &ResourceName,
        token: Token,
        write: Option<&ValueWrite>,
    ) -> StoreResult<Recorded<FenceOutcome>> {
        let request = WriteRequest::Fence(name.clone(), token, write.cloned());
        match self.submit(request).await? {
            WriteReply::Fence(r) => Ok(r),
            _ => Err(mismatched()),
        }
    }

    /// Records the expiry of each of `due`'s leases that is past its
    /// deadline and returns the leases expired. They are submitted a chunk
    /// at a time, so they share batches without a long backlog of expiries
    /// queueing ahead of the clients' requests. An expiry that fails waits
    /// for the next sweep; the error is returned only when none was recorded.
    pub async fn expire(&self, due: &[ResourceName]) -> StoreResult<Vec<Lease>> {
        let mut expired = Vec::new();
        let mut failure = None;
        for chunk in due.chunks(EXPIRIES_IN_FLIGHT) {
            let mut answers = Vec::with_capacity(chunk.len());
            for name in chunk {
                match self.enqueue(WriteRequest::Expire(name.clone())).await {
                    Ok(answer) => answers.push(answer),
                    Err(err) => failure = Some(err),
                }
            }
            for answer in answers {
                match answered(answer).await {
                    Ok(WriteReply::Expire(lease)) => expired.extend(lease),
                    Ok(_) => failure = Some(mismatched()),
                    Err(err) => failure = Some(err),
                }
            }
        }
        match failure {
            Some(err) if expired.is_empty() => Err(err),
            Some(err) => {
                tracing::warn!(error = %err, "some expiries failed; the next sweep retries them");
                Ok(expired)
            }
            None => Ok(expired),
        }
    }
}

/// Where a queued request's answer arrives.
type Answer = oneshot::Receiver<StoreResult<WriteReply>>;

/// The answer to a queued request.
async fn answered(answer: Answer) -> StoreResult<WriteReply> {
    answer
        .await
        .map_err(|_| StoreError::Unavailable("group commit writer stopped".into()))?
}

/// A writer answers each request with the reply of its own kind; anything
/// else is a bug, reported rather than panicking.
fn mismatched() -> StoreError {
    StoreError::Corrupt("group commit answered with the wrong kind of reply".into())
}

/// One writer task's share of the batcher.
#[derive(Clone)]
struct Writer {
    receiver: Arc<Mutex<mpsc::Receiver<Pending>>>,
    /// One permit: the batch that holds it locks, loads and runs.
    gate: Arc<Semaphore>,
    max_batch: usize,
    waiters: Waiters,
    /// Dropped when the writer has ended (see [`WritersStopped`]).
    running: watch::Receiver<()>,
}

impl Writer {
    /// SQLite's one writer: on a thread of its own with its own connection
    /// (see [`super::sqlite_writer`]), or, for an in-memory database or
    /// when that cannot start, as a task on sqlx's writer connection.
    fn start_sqlite(self, backend: &super::sqlite::SqliteBackend) {
        let fallback = self.clone();
        let started = match backend.direct_writer() {
            Some(Ok(direct)) => std::thread::Builder::new()
                .name("sqlite-writer".into())
                .spawn(move || {
                    // Dropped last, once `run` has dropped the connection.
                    let running = self.running.clone();
                    match tokio::runtime::Builder::new_current_thread().build() {
                        Ok(runtime) => runtime.block_on(self.run(direct)),
                        Err(err) => tracing::error!(error = %err, "SQLite writer cannot run"),
                    }
                    drop(running);
                })
                .map_err(|err| err.to_string()),
            Some(Err(err)) => Err(err.to_string()),
            None => Err("an in-memory database has no second connection".into()),
        };
        if let Err(why) = started {
            tracing::warn!(%why, "SQLite group commit writes through sqlx");
            tokio::spawn(fallback.run(backend.clone()));
        }
    }

    async fn run<B: Writes>(self, backend: B) {
        let Self {
            receiver,
            gate,
            max_batch,
            waiters,
            running: _running,
        } = self;
        // A transaction opened before its first request (`B::BEGINS_AHEAD`),
        // when the last batch was light: under load, the round trip that
        // opening a transaction costs after the first request arrives is
        // time in which the batch fills (opening ahead under load measured
        // 8% fewer cycles at 32 clients, for 19% more single-client
        // acquires when idle).
        let mut ahead: Option<B::Tx> = None;
        let mut last_batch = 0;
        loop {
            // The first request, then a transaction for it, then the gate: a
            // writer opens its transaction (one round trip) while the batch
            // ahead of it still runs, or, where that blocks nobody, before
            // the request even arrives, and only forms, locks, loads and runs
            // its batch holding the gate's permit. It gives the permit back
            // before flushing: the next batch runs while this one's writes and
            // commit wait for the database, and batches stay as large as the
            // traffic allows instead of being split between idle writers.
            if B::BEGINS_AHEAD && ahead.is_none() && last_batch <= LIGHT_BATCH {
                // On failure, the request opens its own (and reports why).
                ahead = backend.begin_write().await.ok();
            }
            let next = async { receiver.lock().await.recv().await };
            let first = if ahead.is_some() {
                // An idle writer (also one waiting for another to give up
                // the queue) renews its transaction every second, well
                // inside the 30 s idle-in-transaction timeout the backend
                // sets, so a connection lost meanwhile fails at most the
                // batch that arrives within that second.
                match tokio::time::timeout(AHEAD_FOR, next).await {
                    Ok(first) => first,
                    Err(_) => {
                        ahead = None;
                        continue;
                    }
                }
            } else {
                next.await
            };
            let Some(first) = first else {
                return;
            };
            let tx = match ahead.take() {
                Some(tx) => Ok(tx),
                None => backend.begin_write().await,
            };
            let Ok(permit) = gate.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            // Never wait for the receiver here: another writer holding it is
            // waiting for a request, so none is queued, and waiting for it
            // would hold this batch (and the gate) until traffic arrives.
            if let Ok(mut receiver) = receiver.try_lock() {
                while batch.len() < max_batch {
                    match receiver.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
            }
            last_batch = batch.len();
            run_batch(&backend, tx, batch, permit, &waiters).await;
        }
    }
}

/// Runs one batch in one transaction and answers every request in it: on
/// the staged fast path when it can, else request by request.
async fn run_batch<B: Writes, G: Send>(
    backend: &B,
    tx: StoreResult<B::Tx>,
    batch: Vec<Pending>,
    gate: G,
    waiters: &Waiters,
) {
    let started = std::time::Instant::now();
    let staged = run_staged::<B, G>(tx, &batch, gate, waiters).await;
    tracing::trace!(
        requests = batch.len(),
        elapsed_us = started.elapsed().as_micros(),
        "batch"
    );
    match staged {
        Staged::Committed(results, handoffs) => {
            // Before any answer goes out: the releases' wakes must find
            // their endings already handed on.
            for handoff in &handoffs {
                for lease in &handoff.after {
                    waiters.handed_off(handoff.resource.as_str(), lease);
                }
            }
            for (pending, result) in batch.into_iter().zip(results) {
                // The caller may have gone away (request cancelled); its
                // write stands, like any committed write whose answer was lost.
                let _ = pending.reply.send(result);
            }
            for handoff in handoffs {
                let _ = handoff.reply.send(handoff.result);
            }
        }
        // The commit's fate is unknown: nothing may be run twice.
        Staged::CommitFailed(err, handoffs) => {
            for handoff in handoffs {
                let _ = handoff.reply.send(Err(batch_failed(&err)));
            }
            fail_all(batch, &err);
        }
        Staged::Unavailable(err) => fail_all(batch, &err),
        Staged::Retry(why) => {
            tracing::debug!(%why, requests = batch.len(), "batch runs request by request");
            run_one_by_one(backend, batch).await;
        }
    }
}

enum Staged {
    /// Each request's result, in order, and the standing acquires the
    /// batch ran after them.
    Committed(Vec<StoreResult<WriteReply>>, Vec<Handoff>),
    /// Nothing was committed and the database cannot be reached.
    Unavailable(StoreError),
    /// Nothing was committed; the slow path can run the batch (a standing
    /// acquire it claimed is dropped: its waiter tries for itself).
    Retry(String),
    CommitFailed(StoreError, Vec<Handoff>),
}

/// A waiter's standing acquire, run by the batch in which the resource's
/// lease ended.
struct Handoff {
    resource: ResourceName,
    /// The endings it ran after.
    after: Vec<LeaseId>,
    reply: oneshot::Sender<StoreResult<Recorded<AcquireOutcome>>>,
    result: StoreResult<Recorded<AcquireOutcome>>,
}

/// The fast path (see [`super::staged`]): lock and load once, run every
/// request in memory, flush with a few multi-row statements, commit.
///
/// `tx` is the transaction opened for it (or why it could not be); `gate`
/// is dropped once the batch has run in memory, before its writes are sent.
async fn run_staged<B: Writes, G: Send>(
    tx: StoreResult<B::Tx>,
    batch: &[Pending],
    gate: G,
    waiters: &Waiters,
) -> Staged {
    let not_committed = |err: StoreError| match err {
        StoreError::Unavailable(_) => Staged::Unavailable(err),
        other => Staged::Retry(other.to_string()),
    };
    let mut tx = match tx {
        Ok(tx) => tx,
        Err(err) => return not_committed(err),
    };
    let started = std::time::Instant::now();
    let mut plan = Plan::default();
    for pending in batch {
        plan_request(&mut plan, &pending.request);
    }
    let mut staged = match StagedTx::load(&mut tx, plan).await {
        Ok(staged) => staged,
        Err(err) => return not_committed(err),
    };
    tracing::trace!(elapsed_us = started.elapsed().as_micros(), "batch loaded");
    let mut results = Vec::with_capacity(batch.len());
    for pending in batch {
        match run_isolated(&mut staged, &pending.request).await {
            Ok(result) => results.push(result),
            Err(err) => return Staged::Retry(err.to_string()),
        }
    }
    let handoffs = match hand_on(&mut staged, &results, waiters).await {
        Ok(handoffs) => handoffs,
        Err(err) => return Staged::Retry(err.to_string()),
    };
    if let Some(why) = staged.missed() {
        return Staged::Retry(why.to_owned());
    }
    let changes = staged.into_changes();
    tracing::trace!(elapsed_us = started.elapsed().as_micros(), "batch ran");
    drop(gate);
    if let Err(err) = tx.flush(&changes).await {
        return not_committed(err);
    }
    tracing::trace!(elapsed_us = started.elapsed().as_micros(), "batch flushed");
    match B::commit(tx).await {
        Ok(()) => Staged::Committed(results, handoffs),
        Err(err) => Staged::CommitFailed(err, handoffs),
    }
}

/// Runs, after the batch's own requests, the standing acquire of the next
/// waiter on each resource whose lease one of them ended. The outer error
/// means the in-memory savepoint failed (the batch goes to the slow path).
async fn hand_on(
    staged: &mut StagedTx,
    results: &[StoreResult<WriteReply>],
    waiters: &Waiters,
) -> StoreResult<Vec<Handoff>> {
    let mut ended: Vec<(ResourceName, Vec<LeaseId>)> = Vec::new();
    for lease in results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .flat_map(ended_by)
    {
        match ended.iter_mut().find(|(name, _)| *name == lease.resource) {
            Some((_, ids)) => ids.push(lease.lease_id.clone()),
            None => ended.push((lease.resource.clone(), vec![lease.lease_id.clone()])),
        }
    }
    let mut handoffs = Vec::new();
    for (resource, after) in ended {
        let Some(StandingAcquire { request, reply }) = waiters.claim(resource.as_str()) else {
            continue;
        };
        let result = match run_isolated(staged, &WriteRequest::Acquire(request)).await? {
            Ok(WriteReply::Acquire(recorded)) => Ok(recorded),
            Ok(_) => Err(mismatched()),
            Err(err) => Err(err),
        };
        handoffs.push(Handoff {
            resource,
            after,
            reply,
            result,
        });
    }
    Ok(handoffs)
}

/// The leases a request's reply says it ended.
fn ended_by(reply: &WriteReply) -> impl Iterator<Item = &Lease> {
    let (expired, ended) = match reply {
        WriteReply::Acquire(r) => (&r.expired, None),
        WriteReply::Renew(r) => (&r.expired, None),
        WriteReply::Fence(r) => (&r.expired, None),
        WriteReply::Release(r) => (&r.expired, released(&r.outcome)),
        WriteReply::ForceRelease(r) => (
            &r.expired,
            match &r.outcome {
                ForceReleaseOutcome::Released(lease) => Some(lease),
                _ => None,
            },
        ),
        WriteReply::Expire(lease) => (&None, lease.as_ref()),
    };
    expired.iter().chain(ended)
}

fn released(outcome: &ReleaseOutcome) -> Option<&Lease> {
    match outcome {
        ReleaseOutcome::Released(lease) => Some(lease),
        _ => None,
    }
}

fn plan_request(plan: &mut Plan, request: &WriteRequest) {
    match request {
        WriteRequest::Acquire(req) => plan.acquire(&req.resource),
        #[cfg(test)]
        WriteRequest::AcquireThenFail(req) => plan.acquire(&req.resource),
        WriteRequest::Renew(id, _) | WriteRequest::Release(id) => plan.lease(id),
        WriteRequest::ForceRelease(name, ..) | WriteRequest::Expire(name) => {
            plan.lock_only(name);
        }
        WriteRequest::Fence(name, token, write) => plan.fence(name, *token, write.is_some()),
    }
}

/// The slow path: each request in its own savepoint of one transaction,
/// row locks taken in resource-name order.
async fn run_one_by_one<B: Writes>(backend: &B, batch: Vec<Pending>) {
    let mut tx = match backend.begin_write().await {
        Ok(tx) => tx,
        Err(err) => return fail_all(batch, &err),
    };
    let mut keyed = Vec::with_capacity(batch.len());
    for pending in batch {
        match lock_order_key(&mut tx, &pending.request).await {
            Ok(key) => keyed.push((key, pending)),
            Err(err) => {
                // The transaction may be unusable now: fail this batch.
                let mut rest: Vec<Pending> = keyed.into_iter().map(|(_, p)| p).collect();
                rest.push(pending);
                return fail_all(rest, &err);
            }
        }
    }
    // Stable: requests on one resource keep their arrival order.
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut answered = Vec::with_capacity(keyed.len());
    for (_, pending) in keyed {
        match run_isolated(&mut tx, &pending.request).await {
            Ok(result) => answered.push((pending, result)),
            Err(err) => {
                // A savepoint statement itself failed: nothing is certain
                // about this transaction any more.
                let mut rest: Vec<Pending> = answered.into_iter().map(|(p, _)| p).collect();
                rest.push(pending);
                return fail_all(rest, &err);
            }
        }
    }
    if let Err(err) = B::commit(tx).await {
        let all: Vec<Pending> = answered.into_iter().map(|(p, _)| p).collect();
        return fail_all(all, &err);
    }
    for (pending, result) in answered {
        let _ = pending.reply.send(result);
    }
}

/// The resource whose row the request will lock. Leases never move between
/// resources, so looking one up before locking is safe; an unknown lease
/// locks nothing.
async fn lock_order_key<T: ResourceTx>(tx: &mut T, request: &WriteRequest) -> StoreResult<String> {
    let name = match request {
        WriteRequest::Acquire(req) => Some(req.resource.as_str().to_owned()),
        #[cfg(test)]
        WriteRequest::AcquireThenFail(req) => Some(req.resource.as_str().to_owned()),
        WriteRequest::ForceRelease(name, ..)
        | WriteRequest::Fence(name, ..)
        | WriteRequest::Expire(name) => Some(name.as_str().to_owned()),
        WriteRequest::Renew(id, _) | WriteRequest::Release(id) => tx
            .lease_by_id(id)
            .await?
            .map(|lease| lease.resource.as_str().to_owned()),
    };
    Ok(name.unwrap_or_default())
}

/// Runs one request inside its own savepoint. The outer error means the
/// savepoint machinery failed; the inner result is the request's own.
async fn run_isolated<T: ResourceTx>(
    tx: &mut T,
    request: &WriteRequest,
) -> StoreResult<StoreResult<WriteReply>> {
    tx.savepoint().await?;
    let result = run_one(tx, request).await;
    match &result {
        Ok(_) => tx.release_savepoint().await?,
        Err(err) => {
            tracing::debug!(error = %err, "request failed inside a batch; rolled back alone");
            tx.rollback_to_savepoint().await?;
        }
    }
    Ok(result)
}

async fn run_one<T: ResourceTx>(tx: &mut T, request: &WriteRequest) -> StoreResult<WriteReply> {
    Ok(match request {
        WriteRequest::Acquire(req) => WriteReply::Acquire(ops::acquire_in(tx, req).await?),
        WriteRequest::Renew(id, ttl) => WriteReply::Renew(ops::renew_in(tx, id, *ttl).await?),
        WriteRequest::Release(id) => WriteReply::Release(ops::release_in(tx, id).await?),
        WriteRequest::ForceRelease(name, reason, actor) => {
            WriteReply::ForceRelease(ops::force_release_in(tx, name, reason, actor).await?)
        }
        WriteRequest::Fence(name, token, write) => {
            WriteReply::Fence(ops::fence_in(tx, name, *token, write.as_ref()).await?)
        }
        WriteRequest::Expire(name) => WriteReply::Expire(ops::expire_in(tx, name).await?),
        #[cfg(test)]
        WriteRequest::AcquireThenFail(req) => {
            ops::acquire_in(tx, req).await?;
            return Err(StoreError::Conflict("injected failure".into()));
        }
    })
}

fn fail_all(batch: Vec<Pending>, err: &StoreError) {
    tracing::warn!(error = %err, requests = batch.len(), "group commit batch failed");
    for pending in batch {
        let _ = pending.reply.send(Err(batch_failed(err)));
    }
}

fn batch_failed(err: &StoreError) -> StoreError {
    StoreError::Unavailable(format!("batch failed: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventKind, LeaseId, LeaseState, Ttl};
    use crate::store::EventFilter;
    use crate::store::postgres::PgBackend;
    use crate::store::sqlite::SqliteBackend;
    use crate::store::sqlite_writer::DirectWriter;
    use crate::store::staged::AfterLock;

    fn acquire(resource: &str) -> AcquireRequest {
        AcquireRequest::for_tests(resource, "batch-test", 30_000)
    }

    fn granted(recorded: Recorded<AcquireOutcome>) -> Lease {
        match recorded.outcome {
            AcquireOutcome::Granted { lease, .. } => lease,
            other => panic!("not granted: {other:?}"),
        }
    }

    fn pending(request: WriteRequest) -> (Pending, oneshot::Receiver<StoreResult<WriteReply>>) {
        let (reply, answer) = oneshot::channel();
        (Pending { request, reply }, answer)
    }

    fn name(n: &str) -> ResourceName {
        ResourceName::parse(n).expect("name")
    }

    fn value(n: i32) -> ValueWrite {
        ValueWrite {
            json: format!("{{\"n\": {n}}}"),
        }
    }

    /// The results of a batch that must commit on the fast path.
    fn committed(staged: Staged) -> Vec<StoreResult<WriteReply>> {
        match staged {
            Staged::Committed(results, _) => results,
            Staged::Retry(why) => panic!("fell back to the slow path: {why}"),
            Staged::Unavailable(err) | Staged::CommitFailed(err, _) => panic!("failed: {err}"),
        }
    }

    /// One batch: an acquire that fails after writing sits between two good
    /// acquires and a fenced write on a resource acquired in the same batch.
    async fn a_failure_is_undone_alone(store: Store) {
        let (good_a, answer_a) = pending(WriteRequest::Acquire(acquire("a")));
        let (bad_b, answer_b) = pending(WriteRequest::AcquireThenFail(acquire("b")));
        let (good_c, answer_c) = pending(WriteRequest::Acquire(acquire("c")));
        let value = ValueWrite {
            json: "{\"n\": 1}".into(),
        };
        let name_a = ResourceName::parse("a").expect("name");
        let token_1 = Token::parse(1).expect("token");
        let (write_a, answer_w) = pending(WriteRequest::Fence(name_a, token_1, Some(value)));
        run_on(&store, vec![bad_b, good_a, good_c, write_a]).await;
        let is_granted = |answer: StoreResult<WriteReply>| {
            matches!(
                answer,
                Ok(WriteReply::Acquire(Recorded {
                    outcome: AcquireOutcome::Granted { .. },
                    ..
                }))
            )
        };
        assert!(is_granted(answer_a.await.expect("answered")));
        assert!(is_granted(answer_c.await.expect("answered")));
        assert!(matches!(
            answer_b.await.expect("answered"),
            Err(StoreError::Conflict(_))
        ));
        // Sorted by resource, arrival order kept: `a` was acquired, then written.
        assert!(matches!(
            answer_w.await.expect("answered"),
            Ok(WriteReply::Fence(Recorded {
                outcome: FenceOutcome::Accepted { .. },
                ..
            }))
        ));
        let b = ResourceName::parse("b").expect("name");
        assert!(
            store.resource(&b).await.expect("read").is_none(),
            "b rolled back"
        );
        // Per resource: the whole-log listing on PostgreSQL holds back events
        // behind the fresh id gap the rolled-back request left.
        let mut kinds = Vec::new();
        for name in ["a", "b", "c"] {
            let filter = EventFilter {
                resource: Some(ResourceName::parse(name).expect("name")),
                kind: None,
                after: 0,
                limit: 100,
            };
            for event in store.events(&filter).await.expect("events") {
                kinds.push((event.resource, event.kind));
            }
        }
        assert_eq!(
            kinds,
            vec![
                ("a".to_owned(), EventKind::Acquired),
                ("a".to_owned(), EventKind::WriteAccepted),
                ("c".to_owned(), EventKind::Acquired),
            ]
        );
        store.close().await;
    }

    /// A batch whose flush fails (a lease id that already exists, which
    /// the in-memory view cannot know) runs again request by request: only
    /// the offending request fails.
    async fn a_failing_flush_falls_back_and_fails_one_request(store: Store) {
        let existing = granted(store.acquire(&acquire("x")).await.expect("acquire x"));
        let mut duplicate = acquire("dup");
        duplicate.lease_id = existing.lease_id.clone();
        let (good_a, answer_a) = pending(WriteRequest::Acquire(acquire("a")));
        let (bad, answer_bad) = pending(WriteRequest::Acquire(duplicate));
        let (good_c, answer_c) = pending(WriteRequest::Acquire(acquire("c")));
        run_on(&store, vec![good_a, bad, good_c]).await;
        for answer in [answer_a, answer_c] {
            assert!(matches!(
                answer.await.expect("answered"),
                Ok(WriteReply::Acquire(Recorded {
                    outcome: AcquireOutcome::Granted { .. },
                    ..
                }))
            ));
        }
        assert!(matches!(
            answer_bad.await.expect("answered"),
            Err(StoreError::Conflict(_))
        ));
        let dup = ResourceName::parse("dup").expect("name");
        assert!(store.resource(&dup).await.expect("read").is_none());
        store.close().await;
    }

    /// Every kind of request, several on one resource, is answered by the
    /// staged fast path itself (a read outside what it loaded would send the
    /// batch to the slow path, silently slower).
    async fn every_request_kind_runs_on_the_fast_path(store: Store) {
        every_request_kind_on_the_fast_path(store, Via::Writer).await;
    }

    /// The same through sqlx's own SQLite transaction: group commit's
    /// writer when the database is in memory.
    #[tokio::test]
    async fn every_request_kind_runs_on_the_fast_path_through_sqlx() {
        let dir = tempfile::tempdir().expect("temp dir");
        every_request_kind_on_the_fast_path(crate::store::test_sqlite_store(&dir).await, Via::Sqlx)
            .await;
    }

    async fn every_request_kind_on_the_fast_path(store: Store, via: Via) {
        let held = granted(store.acquire(&acquire("held")).await.expect("acquire"));
        let renewed = granted(store.acquire(&acquire("renewed")).await.expect("acquire"));
        let mut short = acquire("lapsed");
        short.ttl = Ttl::from_millis(100, Ttl::DEFAULT_MAX).expect("ttl");
        let lapsed = granted(store.acquire(&short).await.expect("acquire"));
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let requests = vec![
            WriteRequest::Acquire(acquire("fresh")),
            WriteRequest::Fence(
                name("fresh"),
                Token::parse(1).expect("token"),
                Some(value(1)),
            ),
            WriteRequest::Fence(name("held"), held.token, Some(value(2))),
            WriteRequest::Fence(name("held"), held.token, None),
            WriteRequest::Fence(name("never-used"), Token::parse(9).expect("token"), None),
            WriteRequest::Renew(renewed.lease_id.clone(), None),
            WriteRequest::Release(held.lease_id.clone()),
            WriteRequest::Release(LeaseId::generate()),
            WriteRequest::Acquire(acquire("held")),
            WriteRequest::Fence(name("held"), held.token, Some(value(3))),
            WriteRequest::ForceRelease(
                name("renewed"),
                crate::domain::Reason::parse("test").expect("reason"),
                "admin".into(),
            ),
            WriteRequest::Expire(name("lapsed")),
            WriteRequest::Expire(name("lapsed")),
            WriteRequest::Expire(name("fresh")),
            WriteRequest::Expire(name("never-used")),
        ];
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        for request in requests {
            let (p, a) = pending(request);
            batch.push(p);
            answers.push(a);
        }
        let results = committed(staged_via(&store, &batch, &Waiters::default(), via).await);
        let outcomes: Vec<String> = results
            .into_iter()
            .map(|r| match r.expect("request") {
                WriteReply::Acquire(r) => match r.outcome {
                    AcquireOutcome::Granted { lease, .. } => {
                        format!("granted {} {}", lease.resource.as_str(), lease.token.get())
                    }
                    other => format!("acquire {other:?}"),
                },
                WriteReply::Renew(r) => match r.outcome {
                    RenewOutcome::Renewed { lease, .. } => {
                        format!("renewed {}", lease.resource.as_str())
                    }
                    other => format!("renew {other:?}"),
                },
                WriteReply::Release(r) => match r.outcome {
                    ReleaseOutcome::Released(lease) => {
                        format!("released {}", lease.resource.as_str())
                    }
                    ReleaseOutcome::NotFound => "release not found".to_owned(),
                    other => format!("release {other:?}"),
                },
                WriteReply::ForceRelease(r) => match r.outcome {
                    ForceReleaseOutcome::Released(lease) => {
                        format!(
                            "force released {} {}",
                            lease.resource.as_str(),
                            lease.token.get()
                        )
                    }
                    other => format!("force release {other:?}"),
                },
                WriteReply::Fence(r) => match r.outcome {
                    FenceOutcome::Accepted { version, .. } => format!("accepted {version:?}"),
                    FenceOutcome::Rejected(rej) => format!("rejected unknown={}", rej.unknown),
                },
                WriteReply::Expire(lease) => {
                    format!("expired {:?}", lease.map(|l| (l.lease_id, l.state)))
                }
            })
            .collect();
        // The lease requests, each answered with its own outcome.
        assert_eq!(outcomes[0], "granted fresh 1");
        assert_eq!(outcomes[5], "renewed renewed");
        assert_eq!(outcomes[6], "released held");
        assert_eq!(outcomes[7], "release not found");
        assert_eq!(
            outcomes[8],
            format!("granted held {}", held.token.get() + 1)
        );
        assert_eq!(
            outcomes[10],
            format!("force released renewed {}", renewed.token.get())
        );
        // Fences: accepted on the lease acquired earlier in the batch, twice
        // on the held lease (a write then a check), unknown on a resource
        // never used, stale after the release and re-acquire.
        assert_eq!(outcomes[1], "accepted Some(1)");
        assert_eq!(outcomes[2], "accepted Some(1)");
        assert_eq!(outcomes[3], "accepted None");
        assert_eq!(outcomes[4], "rejected unknown=true");
        assert_eq!(outcomes[9], "rejected unknown=false");
        // The due lease expires once; a live lease and an unknown resource
        // have nothing to expire.
        assert_eq!(
            outcomes[11],
            format!("expired {:?}", Some((lapsed.lease_id, LeaseState::Expired)))
        );
        assert_eq!(outcomes[12..], ["expired None"; 3]);
        let value = store
            .value(&name("held"))
            .await
            .expect("read")
            .expect("value");
        assert_eq!((value.version, value.token), (1, held.token));
        let view = store
            .resource(&name("held"))
            .await
            .expect("read")
            .expect("held");
        let holder = view.holder.expect("re-acquired");
        assert_eq!(holder.token.get(), held.token.get() + 1);
        assert!(
            store
                .resource(&name("renewed"))
                .await
                .expect("read")
                .expect("renewed")
                .holder
                .is_none(),
            "force-released"
        );
        // Every lease row, made outside a batch or in this one (also the
        // grant that follows a release of the same resource), keeps its
        // own `acquired` event's id.
        assert_eq!(
            crate::store::lease_links(&store).await,
            (5, vec![]),
            "lease rows and those not linked to their acquired event"
        );
        drop(answers);
        store.close().await;
    }

    /// A batch that writes existing values and new ones, beside requests
    /// that load leases by id and by token: each write sees its own
    /// resource's stored value (versions go on from it), and nothing is
    /// mixed up between resources.
    async fn stored_values_are_loaded_with_the_leases(store: Store) {
        let a = granted(store.acquire(&acquire("values-a")).await.expect("acquire"));
        let b = granted(store.acquire(&acquire("values-b")).await.expect("acquire"));
        let c = granted(store.acquire(&acquire("values-c")).await.expect("acquire"));
        for (lease, n) in [(&a, 1), (&a, 2), (&b, 3)] {
            store
                .fence(&lease.resource, lease.token, Some(&value(n)))
                .await
                .expect("write");
        }
        let requests = vec![
            WriteRequest::Fence(name("values-a"), a.token, Some(value(10))),
            WriteRequest::Renew(c.lease_id.clone(), None),
            WriteRequest::Fence(name("values-b"), b.token, Some(value(20))),
            WriteRequest::Fence(name("values-c"), c.token, Some(value(30))),
            WriteRequest::Fence(name("values-a"), a.token, Some(value(11))),
        ];
        let (batch, answers): (Vec<_>, Vec<_>) = requests.into_iter().map(pending).unzip();
        let results = committed(staged_via(&store, &batch, &Waiters::default(), Via::Writer).await);
        let versions: Vec<Option<i64>> = results
            .into_iter()
            .map(|r| match r.expect("request") {
                WriteReply::Fence(r) => match r.outcome {
                    FenceOutcome::Accepted { version, .. } => version,
                    FenceOutcome::Rejected(rej) => panic!("refused: {rej:?}"),
                },
                WriteReply::Renew(_) => None,
                other => panic!("unexpected reply {:?}", std::mem::discriminant(&other)),
            })
            .collect();
        assert_eq!(versions, [Some(3), None, Some(2), Some(1), Some(4)]);
        for (resource, json, version) in [
            ("values-a", "{\"n\": 11}", 4),
            ("values-b", "{\"n\": 20}", 2),
            ("values-c", "{\"n\": 30}", 1),
        ] {
            let stored = store
                .value(&name(resource))
                .await
                .expect("read")
                .expect("value");
            let parsed: serde_json::Value = serde_json::from_str(&stored.json).expect("json");
            let expected: serde_json::Value = serde_json::from_str(json).expect("json");
            assert_eq!((parsed, stored.version), (expected, version), "{resource}");
        }
        drop(answers);
        store.close().await;
    }

    /// Refused writes are answered in the batch without reading the value
    /// they would have replaced; a write whose token only becomes live
    /// inside the batch sends the batch down the slow path instead of being
    /// answered from a value that was never read.
    async fn refused_writes_skip_the_value_read(store: Store) {
        let old = granted(store.acquire(&acquire("refusals")).await.expect("acquire"));
        store
            .fence(&old.resource, old.token, Some(&value(1)))
            .await
            .expect("write");
        store.release(&old.lease_id).await.expect("release");
        let live = granted(store.acquire(&acquire("refusals")).await.expect("acquire"));
        store
            .fence(&live.resource, live.token, Some(&value(2)))
            .await
            .expect("write");
        let requests = vec![
            WriteRequest::Fence(name("refusals"), old.token, Some(value(90))),
            WriteRequest::Fence(name("refusals"), live.token, Some(value(3))),
            WriteRequest::Fence(name("refusals"), old.token, Some(value(91))),
        ];
        let (batch, answers): (Vec<_>, Vec<_>) = requests.into_iter().map(pending).unzip();
        let results = committed(staged_via(&store, &batch, &Waiters::default(), Via::Writer).await);
        let accepted: Vec<bool> = results
            .into_iter()
            .map(|r| match r.expect("request") {
                WriteReply::Fence(r) => matches!(r.outcome, FenceOutcome::Accepted { .. }),
                other => panic!("unexpected reply {:?}", std::mem::discriminant(&other)),
            })
            .collect();
        assert_eq!(accepted, [false, true, false]);
        let stored = store
            .value(&name("refusals"))
            .await
            .expect("read")
            .expect("value");
        assert_eq!((stored.json.as_str(), stored.version), ("{\"n\": 3}", 3));
        drop(answers);

        // The next token, presented in the batch that issues it.
        store.release(&live.lease_id).await.expect("release");
        let next = Token::from_stored(live.token.get() + 1);
        let requests = vec![
            WriteRequest::Acquire(acquire("refusals")),
            WriteRequest::Fence(name("refusals"), next, Some(value(4))),
        ];
        let (batch, answers): (Vec<_>, Vec<_>) = requests.into_iter().map(pending).unzip();
        match staged_via(&store, &batch, &Waiters::default(), Via::Writer).await {
            Staged::Retry(why) => assert!(why.contains("value"), "{why}"),
            Staged::Committed(..) => panic!("answered without the value"),
            Staged::Unavailable(err) | Staged::CommitFailed(err, _) => panic!("failed: {err}"),
        }
        drop(answers);
        let stored = store
            .value(&name("refusals"))
            .await
            .expect("read")
            .expect("value");
        assert_eq!(stored.version, 3, "a retried batch leaves nothing behind");
        store.close().await;
    }

    /// Requests one at a time, with more writers than traffic: each is
    /// answered at once (a writer forming a batch never waits for another
    /// writer that is itself waiting for a request).
    async fn lone_requests_are_answered_with_idle_writers(store: Store) {
        let group = GroupCommit::start(
            &store,
            GroupCommitConfig {
                writers: 3,
                max_batch: 64,
            },
            Waiters::default(),
        );
        for i in 0..5 {
            let answer = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                group.acquire(&acquire(&format!("lone-{i}"))),
            )
            .await
            .expect("a lone request is answered");
            assert!(matches!(
                answer.expect("acquire").outcome,
                AcquireOutcome::Granted { .. }
            ));
        }
        drop(group);
        store.close().await;
    }

    /// PostgreSQL's idle writers open their next transaction ahead of any
    /// request: it holds no transaction id and no snapshot (so it holds
    /// back neither locks nor vacuum), and one whose connection is lost is
    /// replaced within a second, so the next request is still answered.
    #[tokio::test]
    #[cfg_attr(
        palisade_no_test_postgres,
        ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
    )]
    async fn transactions_opened_ahead_hold_nothing_and_are_renewed() {
        let Some((store, drop_db)) = crate::store::test_postgres_store("ahead").await else {
            return;
        };
        let pool = match &store {
            Store::Postgres(pg) => pg.pool().clone(),
            Store::Sqlite(_) => panic!("a PostgreSQL store"),
        };
        let group = GroupCommit::start(
            &store,
            GroupCommitConfig {
                writers: 2,
                max_batch: 64,
            },
            Waiters::default(),
        );
        let idle = "FROM pg_stat_activity WHERE datname = current_database() \
                    AND state = 'idle in transaction'";
        let count = |sql: String| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(&sql)
                    .fetch_one(&pool)
                    .await
                    .expect("count")
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while count(format!("SELECT count(*) {idle}")).await < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("both writers wait in an open transaction");
        let holding = format!(
            "SELECT count(*) {idle} AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
        );
        assert_eq!(count(holding).await, 0, "no xid, no snapshot");
        let killed = count(format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) {idle}) AS t"
        ))
        .await;
        assert_eq!(killed, 2);
        tokio::time::sleep(AHEAD_FOR + std::time::Duration::from_millis(500)).await;
        for i in 0..4 {
            let answer = group.acquire(&acquire(&format!("after-{i}"))).await;
            assert!(
                matches!(answer, Ok(ref a) if matches!(a.outcome, AcquireOutcome::Granted { .. })),
                "answered after the connections were lost: {answer:?}"
            );
        }
        drop(group);
        store.close().await;
        drop_db().await;
    }

    /// A sweep through group commit: many due leases expire in shared
    /// batches, each recorded exactly once, and a second sweep finds none.
    async fn a_sweep_expires_each_due_lease_once(store: Store) {
        let group = GroupCommit::start(
            &store,
            GroupCommitConfig {
                writers: 2,
                max_batch: 16,
            },
            Waiters::default(),
        );
        for i in 0..40 {
            let mut req = acquire(&format!("due-{i:02}"));
            if i % 4 != 0 {
                req.ttl = Ttl::from_millis(100, Ttl::DEFAULT_MAX).expect("ttl");
            }
            granted(group.acquire(&req).await.expect("acquire"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let due = store.due_resources(500).await.expect("due");
        assert_eq!(due.len(), 30, "every short lease is due, no long one");
        // Twice at once, as two instances' sweepers would: one records each.
        let (first, second) = tokio::join!(group.expire(&due), group.expire(&due));
        let mut expired: Vec<String> = first
            .expect("sweep")
            .into_iter()
            .chain(second.expect("sweep"))
            .map(|l| l.resource.as_str().to_owned())
            .collect();
        expired.sort();
        let mut wanted: Vec<String> = due.iter().map(|n| n.as_str().to_owned()).collect();
        wanted.sort();
        assert_eq!(expired, wanted);
        assert!(group.expire(&due).await.expect("sweep").is_empty());
        let filter = EventFilter {
            resource: None,
            kind: Some(EventKind::Expired),
            after: 0,
            limit: 1000,
        };
        assert_eq!(store.events(&filter).await.expect("events").len(), 30);
        drop(group);
        store.close().await;
    }

    /// A batch's load, run after its lock statement waited for a row lock,
    /// sees what the lock's holder committed (on PostgreSQL the load is a
    /// statement of its own, with a snapshot taken after the lock), and the
    /// tokens it reads follow the committed row.
    async fn a_load_after_a_lock_wait_sees_the_holders_commit(store: Store) {
        let name = ResourceName::parse("contended").expect("name");
        let first = granted(store.acquire(&acquire("contended")).await.expect("acquire"));
        store.release(&first.lease_id).await.expect("release");
        async fn race<B: Writes + Clone + 'static>(
            b: &B,
            name: &ResourceName,
            fence: Token,
        ) -> (Vec<ResourceRow>, AfterLock, Vec<Lease>) {
            let mut holder = b.begin_write().await.expect("begin");
            let won = ops::acquire_in(&mut holder, &acquire(name.as_str()))
                .await
                .expect("acquire");
            assert!(matches!(won.outcome, AcquireOutcome::Granted { .. }));
            let waiter = {
                let b = b.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let mut tx = b.begin_write().await.expect("begin");
                    let names = [name.clone()];
                    // A write fenced with the first token, now superseded.
                    let fences = [(name, fence, true)];
                    let (rows, created) =
                        tx.lock_resources(&names, &names, &[]).await.expect("lock");
                    let after = AfterLock::new(&names, &fences, &rows, &created);
                    let loaded = tx
                        .load(&after.lock, &[], &after.tokens, &after.values)
                        .await
                        .expect("load");
                    (rows, after, loaded.leases)
                })
            };
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            assert!(!waiter.is_finished(), "the batch waits for the lock");
            B::commit(holder).await.expect("commit");
            waiter.await.expect("waiter")
        }
        let (rows, after, leases) = match &store {
            Store::Sqlite(b) => race(b, &name, first.token).await,
            Store::Postgres(b) => race(b, &name, first.token).await,
        };
        let second = first.token.get() + 1;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            rows[0].last_token, second,
            "the locked row is the committed one"
        );
        let active: Vec<&Lease> = leases
            .iter()
            .filter(|l| l.state == LeaseState::Active)
            .collect();
        assert_eq!(active.len(), 1, "the committed lease is seen: {leases:?}");
        assert_eq!(active[0].token.get(), second);
        // The fence's own token and the resource's last token are known;
        // no write was accepted yet, so the old token's write may be, and
        // its value (none yet) is read.
        let tokens: Vec<i64> = after.tokens.iter().map(|(_, t)| t.get()).collect();
        assert_eq!(tokens, vec![first.token.get(), second]);
        assert_eq!(after.values, vec![name.clone()]);
        let mut by_token: Vec<(i64, LeaseState)> =
            leases.iter().map(|l| (l.token.get(), l.state)).collect();
        by_token.sort_by_key(|(t, _)| *t);
        assert_eq!(
            by_token,
            vec![
                (first.token.get(), LeaseState::Released),
                (second, LeaseState::Active)
            ]
        );
        store.close().await;
    }

    /// A batch that releases a lease then runs the standing acquire of the
    /// head of the resource's queue (only the head's): one commit ends one
    /// lease and grants the next, and the release's own wake afterwards is
    /// recognised as handed on, so the granted head is not woken to retry.
    async fn a_release_grants_the_standing_head_in_its_batch(store: Store) {
        let holder = granted(store.acquire(&acquire("hot")).await.expect("acquire"));
        let waiters = Waiters::default();
        let mut head = waiters.enqueue("hot");
        head.turn().await; // the first arrival's turn: it found the lease held
        let mut behind = waiters.enqueue("hot");
        let head_request = acquire("hot");
        let head_answer = head.stand(head_request.clone());
        let _behind_answer = behind.stand(acquire("hot"));
        let (release, released) = pending(WriteRequest::Release(holder.lease_id.clone()));
        run_with(&store, vec![release], &waiters).await;
        assert!(matches!(
            released.await.expect("answered"),
            Ok(WriteReply::Release(Recorded {
                outcome: ReleaseOutcome::Released(_),
                ..
            }))
        ));
        let next = granted(head_answer.await.expect("answered").expect("acquire"));
        assert_eq!(next.lease_id, head_request.lease_id);
        assert_eq!(next.token.get(), holder.token.get() + 1);
        assert_eq!(waiters.standing("hot"), 1, "the one behind still stands");
        // The release's wake, after its commit: already handed on.
        waiters.lease_ended("hot", Some(&holder.lease_id));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), head.turn())
                .await
                .is_err(),
            "the granted head is not woken"
        );
        let resource = ResourceName::parse("hot").expect("name");
        let view = store.resource(&resource).await.expect("read").expect("row");
        assert_eq!(view.holder.map(|l| l.lease_id), Some(next.lease_id));
        let filter = EventFilter {
            resource: Some(resource),
            kind: None,
            after: 0,
            limit: 100,
        };
        let history: Vec<(EventKind, Option<i64>)> = store
            .events(&filter)
            .await
            .expect("events")
            .into_iter()
            .map(|e| (e.kind, e.token))
            .collect();
        let t = holder.token.get();
        assert_eq!(
            history,
            vec![
                (EventKind::Acquired, Some(t)),
                (EventKind::Released, Some(t)),
                (EventKind::Acquired, Some(t + 1)),
            ]
        );
        drop(behind);
        store.close().await;
    }

    /// A batch that falls back to the slow path drops the standing acquire
    /// it claimed, unrun: the waiter learns it must try for itself, nothing
    /// was granted to it, and the release's wake still reaches it.
    async fn a_batch_on_the_slow_path_leaves_the_waiter_to_try(store: Store) {
        let holder = granted(store.acquire(&acquire("hot")).await.expect("acquire"));
        let existing = granted(store.acquire(&acquire("x")).await.expect("acquire x"));
        let waiters = Waiters::default();
        let mut head = waiters.enqueue("hot");
        head.turn().await;
        let head_answer = head.stand(acquire("hot"));
        let mut duplicate = acquire("dup");
        duplicate.lease_id = existing.lease_id.clone();
        let (release, released) = pending(WriteRequest::Release(holder.lease_id.clone()));
        let (bad, _bad_answer) = pending(WriteRequest::Acquire(duplicate));
        run_with(&store, vec![release, bad], &waiters).await;
        assert!(matches!(
            released.await.expect("answered"),
            Ok(WriteReply::Release(Recorded {
                outcome: ReleaseOutcome::Released(_),
                ..
            }))
        ));
        assert!(head_answer.await.is_err(), "dropped unrun");
        let resource = ResourceName::parse("hot").expect("name");
        let view = store.resource(&resource).await.expect("read").expect("row");
        assert!(view.holder.is_none(), "nobody was granted");
        waiters.lease_ended("hot", Some(&holder.lease_id));
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(1), head.turn())
                .await
                .is_ok(),
            "the release's wake reaches the waiter"
        );
        store.close().await;
    }

    /// Runs `batch` on the fast path alone, handing ended leases to
    /// `waiters`, and returns what it did (answering nobody).
    async fn staged_via(store: &Store, batch: &[Pending], waiters: &Waiters, via: Via) -> Staged {
        match (store, via) {
            (Store::Sqlite(b), Via::Writer) => {
                let direct = sqlite_writer(b);
                run_staged::<DirectWriter, _>(direct.begin_write().await, batch, (), waiters).await
            }
            (Store::Sqlite(b), Via::Sqlx) => {
                run_staged::<SqliteBackend, _>(b.begin_write().await, batch, (), waiters).await
            }
            (Store::Postgres(b), _) => {
                run_staged::<PgBackend, _>(b.begin_write().await, batch, (), waiters).await
            }
        }
    }

    /// Which SQLite connection a test batch writes through.
    #[derive(Clone, Copy)]
    enum Via {
        /// The in-process writer group commit uses for a database file.
        Writer,
        /// sqlx's writer connection.
        Sqlx,
    }

    fn sqlite_writer(b: &SqliteBackend) -> DirectWriter {
        b.direct_writer()
            .expect("a database file")
            .expect("writer opens")
    }

    /// Runs a hand-built batch on `store`'s backend.
    async fn run_on(store: &Store, batch: Vec<Pending>) {
        run_with(store, batch, &Waiters::default()).await;
    }

    /// Runs `batch` as one batch, handing ended leases to `waiters`.
    async fn run_with(store: &Store, batch: Vec<Pending>, waiters: &Waiters) {
        match store {
            Store::Sqlite(b) => {
                let direct = sqlite_writer(b);
                let tx = direct.begin_write().await;
                run_batch(&direct, tx, batch, (), waiters).await;
            }
            Store::Postgres(b) => run_batch(b, b.begin_write().await, batch, (), waiters).await,
        }
    }

    crate::store::on_both_backends! {
        "batch":
        a_failure_is_undone_alone => a_failure_is_undone_alone_on_sqlite,
            a_failure_is_undone_alone_on_postgres;
        a_failing_flush_falls_back_and_fails_one_request =>
            a_failing_flush_falls_back_and_fails_one_request_on_sqlite,
            a_failing_flush_falls_back_and_fails_one_request_on_postgres;
        every_request_kind_runs_on_the_fast_path =>
            every_request_kind_runs_on_the_fast_path_on_sqlite,
            every_request_kind_runs_on_the_fast_path_on_postgres;
        stored_values_are_loaded_with_the_leases =>
            stored_values_are_loaded_with_the_leases_on_sqlite,
            stored_values_are_loaded_with_the_leases_on_postgres;
        refused_writes_skip_the_value_read =>
            refused_writes_skip_the_value_read_on_sqlite,
            refused_writes_skip_the_value_read_on_postgres;
        lone_requests_are_answered_with_idle_writers =>
            lone_requests_are_answered_with_idle_writers_on_sqlite,
            lone_requests_are_answered_with_idle_writers_on_postgres;
        a_sweep_expires_each_due_lease_once => a_sweep_expires_each_due_lease_once_on_sqlite,
            a_sweep_expires_each_due_lease_once_on_postgres;
        a_load_after_a_lock_wait_sees_the_holders_commit =>
            a_load_after_a_lock_wait_sees_the_holders_commit_on_sqlite,
            a_load_after_a_lock_wait_sees_the_holders_commit_on_postgres;
        a_release_grants_the_standing_head_in_its_batch =>
            a_release_grants_the_standing_head_in_its_batch_on_sqlite,
            a_release_grants_the_standing_head_in_its_batch_on_postgres;
        a_batch_on_the_slow_path_leaves_the_waiter_to_try =>
            a_batch_on_the_slow_path_leaves_the_waiter_to_try_on_sqlite,
            a_batch_on_the_slow_path_leaves_the_waiter_to_try_on_postgres;
    }
}

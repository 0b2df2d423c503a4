//! Event retention: a background task that deletes events older than the
//! configured age, in small batches with a pause between them so the API
//! never waits long behind it. Only the event log is pruned — resources,
//! leases and values are state, never history — and each resource's newest
//! event is kept whatever its age.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::{Store, StoreResult};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Events older than this (by the database clock) are pruned.
    pub max_age: Duration,
    /// Time between pruning passes.
    pub interval: Duration,
    /// Events looked at per transaction.
    pub batch: i64,
    /// Pause between batches, leaving the database to the API.
    pub pause: Duration,
}

impl RetentionConfig {
    pub const DEFAULT_DAYS: u32 = 30;

    pub fn with_max_age(max_age: Duration) -> Self {
        Self {
            max_age,
            interval: Duration::from_secs(60),
            batch: 1000,
            pause: Duration::from_millis(50),
        }
    }
}

/// One pruning pass: walks the events older than the cutoff oldest first,
/// batch by batch, until none are left or `shutdown`. Returns how many it
/// deleted.
pub async fn prune_old_events(
    store: &Store,
    config: &RetentionConfig,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> StoreResult<u64> {
    let age = chrono::Duration::from_std(config.max_age).unwrap_or(chrono::Duration::MAX);
    let Some(cutoff) = store.now().await?.checked_sub_signed(age) else {
        // Older than the earliest representable time: nothing qualifies.
        return Ok(0);
    };
    let mut cursor = None;
    let mut deleted = 0;
    loop {
        let batch = store
            .prune_events_batch(cutoff, cursor, config.batch)
            .await?;
        deleted += batch.deleted;
        metrics.events_pruned(batch.deleted);
        if batch.scanned < usize::try_from(config.batch).unwrap_or(usize::MAX) {
            return Ok(deleted);
        }
        let Some(next) = batch.scanned_up_to else {
            return Ok(deleted);
        };
        cursor = Some(next);
        tokio::select! {
            () = tokio::time::sleep(config.pause) => {}
            () = shutdown.cancelled() => return Ok(deleted),
        }
    }
}

/// Prunes every `config.interval` until `shutdown`.
pub async fn run_event_retention(
    store: Store,
    metrics: Metrics,
    config: RetentionConfig,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match prune_old_events(&store, &config, &metrics, &shutdown).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "pruned old events"),
            Err(err) => tracing::warn!(error = %err, "event retention pass failed; retrying later"),
        }
    }
}

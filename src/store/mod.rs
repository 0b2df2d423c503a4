//! The storage seam: one [`Store`] over SQLite or PostgreSQL.
//!
//! Each backend supplies a small set of transactional primitives
//! ([`ResourceTx`]) and a few read queries ([`Backend`]); the operations
//! themselves (lock the resource row, settle a due expiry, ask the domain
//! rules, write state and event together) are written once in [`ops`].

mod batch;
mod ops;
pub mod postgres;
mod rows;
pub mod sqlite;
mod sqlite_repack;
mod sqlite_writer;
mod staged;
mod types;
pub mod ui;

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::domain::{Lease, LeaseId, ResourceName, Token};

pub use types::{
    AcquireOutcome, AcquireRequest, Event, EventCursor, EventFilter, FenceOutcome, FenceRejection,
    ForceReleaseOutcome, NewEvent, PruneBatch, Recorded, ReleaseOutcome, RenewOutcome, ResourceRow,
    ResourceView, StoredValue, ValueWrite, WriteVia,
};

pub use batch::{GroupCommit, GroupCommitConfig, WritersStopped};
pub use sqlite_repack::{PageLayout, Repacked, repack as repack_sqlite};

pub type StoreResult<T> = Result<T, StoreError>;

/// What can go wrong below the domain. Rejections (held, stale, …) are not
/// errors: they are outcomes, committed together with their events.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is overloaded; the caller may retry.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A concurrent transaction won a race the database refused to serialise.
    #[error("conflicting concurrent update: {0}")]
    Conflict(String),
    /// The database refused a value as malformed.
    #[error("invalid data: {0}")]
    InvalidData(String),
    /// A row did not decode into valid domain values.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &err {
            E::PoolTimedOut | E::PoolClosed | E::Io(_) | E::Tls(_) | E::WorkerCrashed => {
                StoreError::Unavailable(err.to_string())
            }
            E::Protocol(_) => StoreError::Unavailable(err.to_string()),
            E::Database(db) => {
                let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
                classify_database_error(&code, err.to_string())
                    .unwrap_or_else(|| StoreError::Other(Box::new(err)))
            }
            E::ColumnDecode { .. }
            | E::Decode(_)
            | E::ColumnNotFound(_)
            | E::TypeNotFound { .. } => StoreError::Corrupt(err.to_string()),
            _ => StoreError::Other(Box::new(err)),
        }
    }
}

/// Maps SQLSTATE codes (PostgreSQL) and result codes (SQLite) to our kinds.
fn classify_database_error(code: &str, message: String) -> Option<StoreError> {
    match code {
        // SQLite: BUSY, LOCKED (and their extended codes), FULL, IOERR.
        c if c == "5" || c == "6" || c == "13" || c == "10" => {
            Some(StoreError::Unavailable(message))
        }
        c if c
            .parse::<u32>()
            .is_ok_and(|n| n & 0xff == 5 || n & 0xff == 10) =>
        {
            Some(StoreError::Unavailable(message))
        }
        // PostgreSQL: connection exceptions, insufficient resources, operator
        // intervention (shutdown, cancel), statement/lock timeouts.
        c if c.starts_with("08") || c.starts_with("53") || c.starts_with("57") => {
            Some(StoreError::Unavailable(message))
        }
        // Lock timeout; the database is gone or renamed; credentials were
        // revoked; system I/O errors; a standby that cannot take writes
        // (during failover): all mean "not now", never "bad request".
        "55P03" | "3D000" | "25006" => Some(StoreError::Unavailable(message)),
        // "Database is not currently accepting connections" (an operator
        // turned connections off, e.g. during maintenance). Other 55000
        // errors are not about availability.
        "55000" if message.contains("not currently accepting connections") => {
            Some(StoreError::Unavailable(message))
        }
        c if c.starts_with("28") || c.starts_with("58") => Some(StoreError::Unavailable(message)),
        // PostgreSQL serialization failure, deadlock, unique violation;
        // SQLite's primary-key and unique-constraint violations.
        "40001" | "40P01" | "23505" | "1555" | "2067" => Some(StoreError::Conflict(message)),
        c if c.starts_with("22") => Some(StoreError::InvalidData(message)),
        _ => None,
    }
}

/// The transactional primitives each backend implements. Every method runs
/// inside the transaction the value represents.
pub trait ResourceTx: Send {
    /// The database clock, in milliseconds. Taken after the row lock so a
    /// transaction that waited never acts on a stale instant.
    fn now(&mut self) -> impl Future<Output = StoreResult<DateTime<Utc>>> + Send;
    fn ensure_resource(
        &mut self,
        name: &ResourceName,
    ) -> impl Future<Output = StoreResult<()>> + Send;
    /// Reads the resource row, locking it for the rest of the transaction
    /// when `for_update` (every write path does).
    fn resource(
        &mut self,
        name: &ResourceName,
        for_update: bool,
    ) -> impl Future<Output = StoreResult<Option<ResourceRow>>> + Send;
    fn save_resource(&mut self, row: &ResourceRow) -> impl Future<Output = StoreResult<()>> + Send;
    /// The lease in stored state `active`, which may be past its deadline.
    fn active_lease(
        &mut self,
        name: &ResourceName,
    ) -> impl Future<Output = StoreResult<Option<Lease>>> + Send;
    fn lease_by_id(
        &mut self,
        id: &LeaseId,
    ) -> impl Future<Output = StoreResult<Option<Lease>>> + Send;
    fn lease_by_token(
        &mut self,
        name: &ResourceName,
        token: Token,
    ) -> impl Future<Output = StoreResult<Option<Lease>>> + Send;
    /// Inserts a new lease after its `acquired` event (`insert_event`, in
    /// this transaction), whose id the row keeps: a lease's story is read
    /// from there.
    fn insert_lease(&mut self, lease: &Lease) -> impl Future<Output = StoreResult<()>> + Send;
    fn update_lease(&mut self, lease: &Lease) -> impl Future<Output = StoreResult<()>> + Send;
    /// Writes the fenced value and returns its new version.
    fn upsert_value(
        &mut self,
        name: &ResourceName,
        json: &str,
        token: Token,
        now: DateTime<Utc>,
    ) -> impl Future<Output = StoreResult<i64>> + Send;
    fn value(
        &mut self,
        name: &ResourceName,
    ) -> impl Future<Output = StoreResult<Option<StoredValue>>> + Send;
    fn insert_event(&mut self, event: &NewEvent) -> impl Future<Output = StoreResult<()>> + Send;
    /// Tells waiters in other instances that `name` may be free now
    /// (delivered on commit).
    fn announce_lease_ended(
        &mut self,
        name: &ResourceName,
    ) -> impl Future<Output = StoreResult<()>> + Send;
    /// Group commit: marks where one request of a batch begins, so a failing
    /// request can be undone without undoing its batch-mates.
    fn savepoint(&mut self) -> impl Future<Output = StoreResult<()>> + Send;
    /// Keeps the work since [`ResourceTx::savepoint`].
    fn release_savepoint(&mut self) -> impl Future<Output = StoreResult<()>> + Send;
    /// Undoes the work since [`ResourceTx::savepoint`].
    fn rollback_to_savepoint(&mut self) -> impl Future<Output = StoreResult<()>> + Send;
}

/// Write transactions: all that group commit's writers need.
pub trait Writes: Send + Sync {
    type Tx: staged::BatchTx;
    /// Whether an idle group-commit writer opens its next transaction
    /// before a request arrives, taking that round trip off the request's
    /// path. Only where an open, unused transaction blocks nobody: not on
    /// SQLite, whose write transaction holds the database's one write lock.
    const BEGINS_AHEAD: bool = false;
    fn begin_write(&self) -> impl Future<Output = StoreResult<Self::Tx>> + Send;
    fn commit(tx: Self::Tx) -> impl Future<Output = StoreResult<()>> + Send;
}

/// One database engine.
pub trait Backend: Writes {
    fn begin_read(&self) -> impl Future<Output = StoreResult<Self::Tx>> + Send;
    fn list_events(
        &self,
        filter: &EventFilter,
    ) -> impl Future<Output = StoreResult<Vec<Event>>> + Send;
    /// Resources whose active lease is past its deadline, oldest first.
    fn due_resources(
        &self,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<ResourceName>>> + Send;
    /// Leases active by the database clock, cluster-wide (a count over the
    /// partial index of active leases).
    fn count_active_leases(&self) -> impl Future<Output = StoreResult<i64>> + Send;
    /// One retention batch, in its own short write transaction: looks at up
    /// to `limit` events older than `cutoff` after `after` (in `(at, id)`
    /// order) and deletes those that are not their resource's newest event.
    fn prune_events_batch(
        &self,
        cutoff: DateTime<Utc>,
        after: Option<EventCursor>,
        limit: i64,
    ) -> impl Future<Output = StoreResult<PruneBatch>> + Send;
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send;
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// The storage handle the service uses: cheap to clone.
#[derive(Clone)]
pub enum Store {
    Sqlite(sqlite::SqliteBackend),
    Postgres(postgres::PgBackend),
}

macro_rules! with_backend {
    ($store:expr, $b:ident => $body:expr) => {
        match $store {
            Store::Sqlite($b) => $body,
            Store::Postgres($b) => $body,
        }
    };
}

/// Whether a database URL names PostgreSQL (anything else is SQLite's
/// `sqlite:` or refused).
pub(crate) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

impl Store {
    /// Connects to `url` (`sqlite://…` or `postgres://…`) and runs migrations.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        if is_postgres_url(url) {
            Ok(Store::Postgres(postgres::PgBackend::connect(url).await?))
        } else if url.starts_with("sqlite:") {
            Ok(Store::Sqlite(sqlite::SqliteBackend::connect(url).await?))
        } else {
            Err(StoreError::InvalidData(format!(
                "unsupported database URL {url:?}: use sqlite://PATH or postgres://…"
            )))
        }
    }

    pub fn backend_name(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    pub async fn acquire(&self, req: &AcquireRequest) -> StoreResult<Recorded<AcquireOutcome>> {
        with_backend!(self, b => ops::acquire(b, req).await)
    }

    pub async fn renew(
        &self,
        id: &LeaseId,
        ttl: Option<crate::domain::Ttl>,
    ) -> StoreResult<Recorded<RenewOutcome>> {
        with_backend!(self, b => ops::renew(b, id, ttl).await)
    }

    pub async fn release(&self, id: &LeaseId) -> StoreResult<Recorded<ReleaseOutcome>> {
        with_backend!(self, b => ops::release(b, id).await)
    }

    pub async fn force_release(
        &self,
        name: &ResourceName,
        reason: &crate::domain::Reason,
        actor: &str,
    ) -> StoreResult<Recorded<ForceReleaseOutcome>> {
        with_backend!(self, b => ops::force_release(b, name, reason, actor).await)
    }

    pub async fn fence(
        &self,
        name: &ResourceName,
        token: Token,
        write: Option<&ValueWrite>,
    ) -> StoreResult<Recorded<FenceOutcome>> {
        with_backend!(self, b => ops::fence(b, name, token, write).await)
    }

    pub async fn lease(&self, id: &LeaseId) -> StoreResult<Option<(Lease, DateTime<Utc>)>> {
        with_backend!(self, b => ops::lease(b, id).await)
    }

    pub async fn resource(&self, name: &ResourceName) -> StoreResult<Option<ResourceView>> {
        with_backend!(self, b => ops::resource(b, name).await)
    }

    pub async fn value(&self, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
        with_backend!(self, b => ops::value(b, name).await)
    }

    pub async fn events(&self, filter: &EventFilter) -> StoreResult<Vec<Event>> {
        with_backend!(self, b => b.list_events(filter).await)
    }

    /// Records the expiry of every lease past its deadline (up to `limit`
    /// resources) and returns the leases it expired. Safe to run in several
    /// instances at once: each expiry is recorded exactly once.
    pub async fn expire_due_leases(&self, limit: i64) -> StoreResult<Vec<Lease>> {
        with_backend!(self, b => ops::expire_due_leases(b, limit).await)
    }

    /// Up to `limit` resources whose active lease is past its deadline.
    pub async fn due_resources(&self, limit: i64) -> StoreResult<Vec<ResourceName>> {
        with_backend!(self, b => b.due_resources(limit).await)
    }

    pub async fn ping(&self) -> StoreResult<()> {
        with_backend!(self, b => b.ping().await)
    }

    /// Leases active right now by the database clock, across all instances.
    pub async fn count_active_leases(&self) -> StoreResult<i64> {
        with_backend!(self, b => b.count_active_leases().await)
    }

    /// The database clock.
    pub async fn now(&self) -> StoreResult<DateTime<Utc>> {
        with_backend!(self, b => ops::db_now(b).await)
    }

    pub async fn prune_events_batch(
        &self,
        cutoff: DateTime<Utc>,
        after: Option<EventCursor>,
        limit: i64,
    ) -> StoreResult<PruneBatch> {
        with_backend!(self, b => b.prune_events_batch(cutoff, after, limit).await)
    }

    pub async fn close(&self) {
        with_backend!(self, b => b.close().await)
    }
}

/// Closes `pool` and every connection it has. `Pool::close` alone can
/// return while a connection dropped just before (the retention task's,
/// say) is still on its way back: it then lies idle, unclosed, until the
/// pool is dropped, so a SQLite file is not yet free (and a PostgreSQL
/// session not yet ended) when the server says it has stopped. Taking each
/// connection and closing it first leaves none in flight (a few at most,
/// and only the ones shutdown has finished with).
async fn close_every_connection<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    const MAX_CONNECTIONS_CLOSED: usize = 64;
    for _ in 0..MAX_CONNECTIONS_CLOSED {
        if pool.size() == 0 {
            break;
        }
        match tokio::time::timeout(std::time::Duration::from_secs(1), pool.acquire()).await {
            Ok(Ok(conn)) => {
                if let Err(err) = conn.close().await {
                    tracing::warn!(error = %err, "closing a database connection failed");
                }
            }
            _ => break,
        }
    }
    pool.close().await;
}

/// A store on a fresh PostgreSQL database, and how to drop it; `None`
/// when PostgreSQL is not configured outside CI.
#[cfg(test)]
pub(crate) async fn test_postgres_store(tag: &str) -> Option<(Store, impl AsyncFnOnce())> {
    let (url, drop_db) = test_postgres_db(tag).await?;
    let store = Store::connect(&url).await.expect("connect");
    Some((store, drop_db))
}

/// A fresh, empty PostgreSQL database's URL, and how to drop it; `None`
/// when PostgreSQL is not configured outside CI.
#[cfg(test)]
pub(crate) async fn test_postgres_db(tag: &str) -> Option<(String, impl AsyncFnOnce())> {
    use sqlx::Connection;
    let Ok(admin_url) = std::env::var("PALISADE_TEST_POSTGRES_URL") else {
        let in_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
        assert!(
            !in_ci,
            "PALISADE_TEST_POSTGRES_URL is not set in CI: the test must run"
        );
        eprintln!("SKIPPED: PostgreSQL test (set PALISADE_TEST_POSTGRES_URL to run it)");
        return None;
    };
    // `palisade_t_…`: .ci/run drops what an interrupted run leaves.
    let name = format!(
        "palisade_t_{tag}_{}",
        hex::encode(rand::random::<[u8; 6]>())
    );
    let mut admin = sqlx::PgConnection::connect(&admin_url)
        .await
        .expect("admin");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .expect("create database");
    let (base, _) = admin_url.rsplit_once('/').expect("URL with a database");
    let url = format!("{base}/{name}");
    let drop_db = async move || {
        sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .expect("drop database");
    };
    Some((url, drop_db))
}

/// A store on a fresh SQLite database file in `dir`.
#[cfg(test)]
pub(crate) async fn test_sqlite_store(dir: &tempfile::TempDir) -> Store {
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    Store::connect(&url).await.expect("connect")
}

/// The number of lease rows in `store`, and the (resource, token) of those
/// whose `acquired_event_id` is not their own `acquired` event's id.
#[cfg(test)]
pub(crate) async fn lease_links(store: &Store) -> (i64, Vec<(String, i64)>) {
    const LINKS: &str = "SELECT resource, token, EXISTS (SELECT 1 FROM events AS e \
        WHERE e.id = l.acquired_event_id AND e.kind = 'acquired' \
          AND e.resource = l.resource AND e.token = l.token) \
        FROM leases AS l ORDER BY resource, token";
    let leases: Vec<(String, i64, bool)> = match store {
        Store::Sqlite(b) => sqlx::query_as(LINKS).fetch_all(b.readers()).await,
        Store::Postgres(b) => sqlx::query_as(LINKS).fetch_all(b.pool()).await,
    }
    .expect("lease links");
    let total = leases.len() as i64;
    let unlinked = leases
        .into_iter()
        .filter(|(_, _, linked)| !linked)
        .map(|(resource, token, _)| (resource, token))
        .collect();
    (total, unlinked)
}

/// Runs each `async fn case(store: Store)` as two tests, one per backend:
/// `case => name_on_sqlite, name_on_postgres;` (the PostgreSQL one skips
/// outside CI when PostgreSQL is not configured; in CI it must run).
#[cfg(test)]
macro_rules! on_both_backends {
    ($tag:literal: $($case:ident => $sqlite:ident, $postgres:ident;)*) => {$(
        #[tokio::test]
        async fn $sqlite() {
            let dir = tempfile::tempdir().expect("temp dir");
            $case($crate::store::test_sqlite_store(&dir).await).await;
        }

        #[tokio::test]
        #[cfg_attr(palisade_no_test_postgres, ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it")]
        async fn $postgres() {
            if let Some((store, drop_db)) = $crate::store::test_postgres_store($tag).await {
                $case(store).await;
                drop_db().await;
            }
        }
    )*};
}
#[cfg(test)]
pub(crate) use on_both_backends;

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(code: &str) -> &'static str {
        match classify_database_error(code, String::new()) {
            Some(StoreError::Unavailable(_)) => "unavailable",
            Some(StoreError::Conflict(_)) => "conflict",
            Some(StoreError::InvalidData(_)) => "invalid",
            Some(_) => "other",
            None => "unclassified",
        }
    }

    #[test]
    fn database_errors_that_mean_not_now_are_unavailable() {
        // SQLite BUSY, LOCKED, BUSY_SNAPSHOT (517), IOERR.
        for code in ["5", "6", "517", "10"] {
            assert_eq!(kind(code), "unavailable", "sqlite {code}");
        }
        // PostgreSQL: connection lost, admin shutdown, too many connections,
        // lock timeout, database dropped, auth revoked, read-only standby.
        for code in [
            "08006", "57P01", "53300", "55P03", "3D000", "28P01", "25006",
        ] {
            assert_eq!(kind(code), "unavailable", "postgres {code}");
        }
        let refused = classify_database_error(
            "55000",
            "database \"x\" is not currently accepting connections".into(),
        );
        assert!(matches!(refused, Some(StoreError::Unavailable(_))));
        assert_eq!(kind("55000"), "unclassified");
    }

    #[test]
    fn races_and_bad_data_are_told_apart() {
        assert_eq!(kind("40001"), "conflict");
        assert_eq!(kind("40P01"), "conflict");
        assert_eq!(kind("23505"), "conflict");
        assert_eq!(kind("1555"), "conflict");
        assert_eq!(kind("2067"), "conflict");
        assert_eq!(kind("22P02"), "invalid");
        assert_eq!(kind("42P01"), "unclassified");
    }
}

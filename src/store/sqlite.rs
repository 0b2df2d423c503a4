//! SQLite backend: the embedded default.
//!
//! One writer connection (SQLite has one writer anyway) whose transactions
//! start with `BEGIN IMMEDIATE`, so a write transaction holds the database
//! write lock from its first statement; a small pool of read-only
//! connections serves reads concurrently thanks to WAL. `synchronous=FULL`
//! makes every acknowledged commit durable.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, Sqlite, SqlitePool, Transaction};

use super::rows::{
    ClockedLeaseRow, EventRow, LeaseRow, NamedValueRow, ResourceDbRow, ValueRow, into_lease,
    unix_ms,
};
use super::sqlite_writer::DirectWriter;
use super::staged::{BatchTx, Changes};
use super::types::{
    Event, EventCursor, EventFilter, NewEvent, PruneBatch, ResourceRow, StoredValue,
};
use super::{Backend, ResourceTx, StoreError, StoreResult, Writes};
use crate::domain::{Lease, LeaseId, ResourceName, Token};

use sql::NOW_MS;

/// The write path's statements, shared by the sqlx transaction here and the
/// in-process group-commit writer ([`super::sqlite_writer`]).
pub(super) mod sql {
    macro_rules! lease_columns {
        () => {
            "lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at, request_id"
        };
    }
    macro_rules! now_ms {
        () => {
            "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
        };
    }
    macro_rules! resource_columns {
        () => {
            "SELECT name, last_token, accepted_token, created_at, last_activity_at FROM resources"
        };
    }

    pub const NOW_MS: &str = now_ms!();
    pub const NOW: &str = concat!("SELECT ", now_ms!());
    pub const ENSURE_RESOURCE: &str = concat!(
        "INSERT INTO resources (name, created_at, last_activity_at) VALUES (?, ",
        now_ms!(),
        ", ",
        now_ms!(),
        ") ON CONFLICT (name) DO NOTHING"
    );
    pub const RESOURCE: &str = concat!(resource_columns!(), " WHERE name = ?");
    pub const SAVE_RESOURCE: &str = "UPDATE resources SET last_token = ?, accepted_token = ?, \
        last_activity_at = ? WHERE name = ?";
    pub const ACTIVE_LEASE: &str = concat!(
        "SELECT ",
        lease_columns!(),
        " FROM leases WHERE resource = ? AND state = 'active'"
    );
    pub const LEASE_BY_ID: &str = concat!(
        "SELECT ",
        lease_columns!(),
        " FROM leases WHERE lease_id = ?"
    );
    pub const LEASE_BY_TOKEN: &str = concat!(
        "SELECT ",
        lease_columns!(),
        " FROM leases WHERE resource = ? AND token = ?"
    );
    /// The lease row keeps its `acquired` event's id: the event is written
    /// first, and found as the newest `acquired` event of the resource
    /// with that token (a few index entries from the end of the
    /// resource's range).
    macro_rules! acquired_event_of {
        ($resource:literal, $token:literal) => {
            concat!(
                "(SELECT id FROM events INDEXED BY events_by_resource WHERE resource = ",
                $resource,
                " AND token = ",
                $token,
                " AND kind = 'acquired' ORDER BY id DESC LIMIT 1)"
            )
        };
    }
    pub const INSERT_LEASE: &str = concat!(
        "INSERT INTO leases (",
        lease_columns!(),
        ", acquired_event_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ",
        acquired_event_of!("?2", "?3"),
        ")"
    );
    pub const UPDATE_LEASE: &str =
        "UPDATE leases SET state = ?, ttl_ms = ?, expires_at = ?, ended_at = ? WHERE lease_id = ?";
    pub const UPSERT_VALUE: &str = "INSERT INTO fenced_values \
        (resource, value, token, version, updated_at) VALUES (?, ?, ?, 1, ?) \
        ON CONFLICT (resource) DO UPDATE SET value = excluded.value, token = excluded.token, \
        version = fenced_values.version + 1, updated_at = excluded.updated_at RETURNING version";
    /// A value as the batch computed it (its version included).
    pub const WRITE_VALUE: &str = "INSERT INTO fenced_values \
        (resource, value, token, version, updated_at) VALUES (?1, ?2, ?3, ?4, ?5) \
        ON CONFLICT (resource) DO UPDATE SET value = excluded.value, \
        token = excluded.token, version = excluded.version, updated_at = excluded.updated_at";
    pub const VALUE: &str =
        "SELECT value, token, version, updated_at FROM fenced_values WHERE resource = ?";
    pub const INSERT_EVENT: &str = "INSERT INTO events (at, kind, resource, token, holder, detail) \
        VALUES (?, ?, ?, ?, ?, ?)";
    pub const SAVEPOINT: &str = "SAVEPOINT batch_request";
    pub const RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT batch_request";
    pub const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT batch_request";

    // Batches: each statement takes its rows as one JSON array parameter
    // (`json_each`), so its text never changes with the batch's size.

    /// `WHERE true`: SQLite's grammar needs it before an upsert's
    /// ON CONFLICT when the rows come from a SELECT.
    pub const CREATE_RESOURCES: &str = concat!(
        "INSERT INTO resources (name, created_at, last_activity_at) SELECT value, ",
        now_ms!(),
        ", ",
        now_ms!(),
        " FROM json_each(?1) WHERE true ON CONFLICT (name) DO NOTHING RETURNING name"
    );
    /// A union of two index lookups (an `OR` with a subquery would scan the
    /// whole table).
    pub const LOCK_RESOURCES: &str = concat!(
        resource_columns!(),
        " WHERE name IN (SELECT value FROM json_each(?1)) UNION ",
        resource_columns!(),
        " WHERE name IN (SELECT resource FROM leases \
           WHERE lease_id IN (SELECT value FROM json_each(?2))) ORDER BY name"
    );
    /// One row even when no lease matches, to carry the clock.
    pub const LOAD_LEASES: &str = concat!(
        "SELECT clock.now, l.* FROM (SELECT ",
        now_ms!(),
        " AS now) AS clock LEFT JOIN ( SELECT ",
        lease_columns!(),
        " FROM leases WHERE state = 'active' AND resource IN (SELECT value FROM json_each(?1)) \
         UNION SELECT ",
        lease_columns!(),
        " FROM leases WHERE lease_id IN (SELECT value FROM json_each(?2)) UNION SELECT ",
        lease_columns!(),
        " FROM leases WHERE (resource, token) IN (SELECT value ->> 0, value ->> 1 \
           FROM json_each(?3)) ) AS l ON 1"
    );
    pub const LOAD_VALUES: &str = "SELECT resource, value, token, version, updated_at \
        FROM fenced_values WHERE resource IN (SELECT value FROM json_each(?1))";
    pub const DELETE_RESOURCES: &str =
        "DELETE FROM resources WHERE name IN (SELECT value FROM json_each(?1))";
    pub const FLUSH_RESOURCES: &str = "UPDATE resources SET last_token = u.value ->> 1, \
        accepted_token = u.value ->> 2, last_activity_at = u.value ->> 3 \
        FROM json_each(?1) AS u WHERE resources.name = u.value ->> 0";
    pub const FLUSH_UPDATED_LEASES: &str = "UPDATE leases SET state = u.value ->> 1, \
        ttl_ms = u.value ->> 2, expires_at = u.value ->> 3, ended_at = u.value ->> 4 \
        FROM json_each(?1) AS u WHERE leases.lease_id = u.value ->> 0";
    /// After the batch's events, like [`INSERT_LEASE`].
    pub const FLUSH_NEW_LEASES: &str = concat!(
        "INSERT INTO leases (",
        lease_columns!(),
        ", acquired_event_id) SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, \
           value ->> 4, value ->> 5, value ->> 6, value ->> 7, value ->> 8, value ->> 9, ",
        acquired_event_of!("value ->> 1", "value ->> 2"),
        " FROM json_each(?1) ORDER BY key"
    );
    pub const FLUSH_VALUES: &str = "INSERT INTO fenced_values \
        (resource, value, token, version, updated_at) \
        SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4 \
        FROM json_each(?1) WHERE true \
        ON CONFLICT (resource) DO UPDATE SET value = excluded.value, \
        token = excluded.token, version = excluded.version, updated_at = excluded.updated_at";
    /// Row ids are handed out in array order: the batch's events keep the
    /// order they happened in. Each detail travels as the JSON text it is
    /// stored as, inside a JSON string.
    pub const FLUSH_EVENTS: &str = "INSERT INTO events (at, kind, resource, token, holder, detail) \
        SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5 \
        FROM json_each(?1) ORDER BY key";
}

/// True on a file that holds Palisade's tables: the check made before a
/// connection other than sqlx's migrated pool (the in-process writer,
/// `palisade repack`) works on a file.
pub(super) const IS_PALISADE_SCHEMA: &str = "SELECT count(*) = 4 FROM sqlite_master \
    WHERE type = 'table' AND name IN ('resources', 'leases', 'fenced_values', 'events')";

/// The page size a new database file is created with.
pub const NEW_DATABASE_PAGE_SIZE: u32 = 1024;

/// Whether a `sqlite:` URL names an in-memory database (`sqlite::memory:`,
/// or `mode=memory`), which has no file a second connection could open.
/// sqlx gives such a database a made-up file name, so the name alone
/// cannot tell.
/// (A URL this misses still works: the in-process writer opens only the
/// migrated file, and group commit falls back to sqlx's connection.)
pub(super) fn is_in_memory(url: &str) -> bool {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let rest = url.strip_prefix("sqlite:").unwrap_or(url);
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    let database = decode(database);
    database == ":memory:"
        || database.starts_with("file::memory:")
        || params.split('&').any(|param| {
            let param = decode(&param.replace('+', " ")).to_ascii_lowercase();
            param == "mode=memory" || param == "vfs=memdb"
        })
}

#[derive(Clone)]
pub struct SqliteBackend {
    writer: SqlitePool,
    readers: SqlitePool,
    /// The database file (`None` in memory: only this process's sqlx
    /// connections can reach it).
    path: Option<PathBuf>,
}

impl SqliteBackend {
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidData(format!("bad SQLite URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true)
            // Statement journals (a multi-row statement that may abort
            // keeps one) in memory, not in temporary files: their writes
            // were a tenth of the server's CPU under load.
            .pragma("temp_store", "memory")
            // A new database gets 1 KiB pages instead of 4 KiB: a cycle
            // dirties ~15 pages spread over the tables and indexes, so its
            // WAL frames are a quarter of the bytes (SQLite cycles +23% in
            // alternating pairs, checkpointing after the same 40 MiB;
            // docs/performance.md). An existing database
            // keeps its page size (WAL mode cannot change it).
            .page_size(NEW_DATABASE_PAGE_SIZE);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
        let path = (!is_in_memory(url)).then(|| options.get_filename().to_owned());
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.read_only(true))
            .await?;
        Ok(Self {
            writer,
            readers,
            path,
        })
    }

    /// An in-process writer connection for group commit (see
    /// [`super::sqlite_writer`]); `None` for an in-memory database.
    pub(super) fn direct_writer(&self) -> Option<StoreResult<DirectWriter>> {
        self.path.as_deref().map(DirectWriter::open)
    }

    /// The read-only pool, for queries outside a transaction.
    pub(crate) fn readers(&self) -> &SqlitePool {
        &self.readers
    }
}

pub struct SqliteTx(Transaction<'static, Sqlite>);

impl Writes for SqliteBackend {
    type Tx = SqliteTx;

    async fn begin_write(&self) -> StoreResult<SqliteTx> {
        Ok(SqliteTx(self.writer.begin_with("BEGIN IMMEDIATE").await?))
    }

    async fn commit(tx: SqliteTx) -> StoreResult<()> {
        Ok(tx.0.commit().await?)
    }
}

impl Backend for SqliteBackend {
    async fn begin_read(&self) -> StoreResult<SqliteTx> {
        Ok(SqliteTx(self.readers.begin().await?))
    }

    async fn list_events(&self, filter: &EventFilter) -> StoreResult<Vec<Event>> {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT id, at, kind, resource, token, holder, detail FROM events WHERE id > ",
        );
        q.push_bind(filter.after);
        if let Some(resource) = &filter.resource {
            q.push(" AND resource = ").push_bind(resource.as_str());
        }
        if let Some(kind) = filter.kind {
            q.push(" AND kind = ").push_bind(kind.as_str());
        }
        q.push(" ORDER BY id LIMIT ").push_bind(filter.limit);
        let rows: Vec<EventRow<i64>> = q.build_query_as().fetch_all(&self.readers).await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    async fn due_resources(&self, limit: i64) -> StoreResult<Vec<ResourceName>> {
        let sql = format!(
            "SELECT resource FROM leases WHERE state = 'active' AND expires_at <= {NOW_MS} \
             ORDER BY expires_at LIMIT ?"
        );
        let names: Vec<String> = sqlx::query_scalar(&sql)
            .bind(limit)
            .fetch_all(&self.readers)
            .await?;
        names
            .into_iter()
            .map(|n| ResourceName::parse(n).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    async fn count_active_leases(&self) -> StoreResult<i64> {
        let sql =
            format!("SELECT count(*) FROM leases WHERE state = 'active' AND expires_at > {NOW_MS}");
        Ok(sqlx::query_scalar(&sql).fetch_one(&self.readers).await?)
    }

    async fn prune_events_batch(
        &self,
        cutoff: DateTime<Utc>,
        after: Option<EventCursor>,
        limit: i64,
    ) -> StoreResult<PruneBatch> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let mut q = QueryBuilder::<Sqlite>::new("SELECT id, at FROM events WHERE at < ");
        q.push_bind(unix_ms(cutoff));
        if let Some(c) = after {
            q.push(" AND (at, id) > (")
                .push_bind(unix_ms(c.at))
                .push(", ")
                .push_bind(c.id)
                .push(")");
        }
        q.push(" ORDER BY at, id LIMIT ").push_bind(limit);
        let batch: Vec<(i64, i64)> = q.build_query_as().fetch_all(&mut *tx).await?;
        let Some(&(last_id, last_at)) = batch.last() else {
            tx.commit().await?;
            return Ok(PruneBatch {
                scanned_up_to: None,
                scanned: 0,
                deleted: 0,
            });
        };
        // A resource's newest event stays whatever its age: the log keeps
        // the last thing that happened to every resource.
        let mut delete = QueryBuilder::<Sqlite>::new("DELETE FROM events WHERE id IN (");
        let mut ids = delete.separated(", ");
        for (id, _) in &batch {
            ids.push_bind(*id);
        }
        delete.push(
            ") AND id < (SELECT max(newest.id) FROM events AS newest \
             WHERE newest.resource = events.resource)",
        );
        let deleted = delete.build().execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(PruneBatch {
            scanned_up_to: Some(EventCursor {
                at: super::rows::DbTime::to_utc(last_at)?,
                id: last_id,
            }),
            scanned: batch.len(),
            deleted,
        })
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    async fn close(&self) {
        super::close_every_connection(&self.readers).await;
        super::close_every_connection(&self.writer).await;
    }
}

impl ResourceTx for SqliteTx {
    async fn now(&mut self) -> StoreResult<DateTime<Utc>> {
        let ms: i64 = sqlx::query_scalar(sql::NOW).fetch_one(&mut *self.0).await?;
        super::rows::DbTime::to_utc(ms)
    }

    async fn ensure_resource(&mut self, name: &ResourceName) -> StoreResult<()> {
        sqlx::query(sql::ENSURE_RESOURCE)
            .bind(name.as_str())
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn resource(
        &mut self,
        name: &ResourceName,
        _for_update: bool,
    ) -> StoreResult<Option<ResourceRow>> {
        // BEGIN IMMEDIATE already holds the database write lock.
        let row: Option<ResourceDbRow<i64>> = sqlx::query_as(sql::RESOURCE)
            .bind(name.as_str())
            .fetch_optional(&mut *self.0)
            .await?;
        row.map(ResourceDbRow::into_row).transpose()
    }

    async fn save_resource(&mut self, row: &ResourceRow) -> StoreResult<()> {
        sqlx::query(sql::SAVE_RESOURCE)
            .bind(row.last_token)
            .bind(row.accepted_token)
            .bind(unix_ms(row.last_activity_at))
            .bind(row.name.as_str())
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn active_lease(&mut self, name: &ResourceName) -> StoreResult<Option<Lease>> {
        let row: Option<LeaseRow<i64>> = sqlx::query_as(sql::ACTIVE_LEASE)
            .bind(name.as_str())
            .fetch_optional(&mut *self.0)
            .await?;
        into_lease(row)
    }

    async fn lease_by_id(&mut self, id: &LeaseId) -> StoreResult<Option<Lease>> {
        let row: Option<LeaseRow<i64>> = sqlx::query_as(sql::LEASE_BY_ID)
            .bind(id.as_str())
            .fetch_optional(&mut *self.0)
            .await?;
        into_lease(row)
    }

    async fn lease_by_token(
        &mut self,
        name: &ResourceName,
        token: Token,
    ) -> StoreResult<Option<Lease>> {
        let row: Option<LeaseRow<i64>> = sqlx::query_as(sql::LEASE_BY_TOKEN)
            .bind(name.as_str())
            .bind(token.get())
            .fetch_optional(&mut *self.0)
            .await?;
        into_lease(row)
    }

    async fn insert_lease(&mut self, l: &Lease) -> StoreResult<()> {
        sqlx::query(sql::INSERT_LEASE)
            .bind(l.lease_id.as_str())
            .bind(l.resource.as_str())
            .bind(l.token.get())
            .bind(l.holder.as_str())
            .bind(l.state.as_str())
            .bind(l.ttl_ms)
            .bind(unix_ms(l.acquired_at))
            .bind(unix_ms(l.expires_at))
            .bind(l.ended_at.map(unix_ms))
            .bind(l.request_id.as_ref().map(|r| r.as_str()))
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn update_lease(&mut self, l: &Lease) -> StoreResult<()> {
        sqlx::query(sql::UPDATE_LEASE)
            .bind(l.state.as_str())
            .bind(l.ttl_ms)
            .bind(unix_ms(l.expires_at))
            .bind(l.ended_at.map(unix_ms))
            .bind(l.lease_id.as_str())
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn upsert_value(
        &mut self,
        name: &ResourceName,
        json: &str,
        token: Token,
        now: DateTime<Utc>,
    ) -> StoreResult<i64> {
        let version: i64 = sqlx::query_scalar(sql::UPSERT_VALUE)
            .bind(name.as_str())
            .bind(json)
            .bind(token.get())
            .bind(unix_ms(now))
            .fetch_one(&mut *self.0)
            .await?;
        Ok(version)
    }

    async fn value(&mut self, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
        let row: Option<ValueRow<i64>> = sqlx::query_as(sql::VALUE)
            .bind(name.as_str())
            .fetch_optional(&mut *self.0)
            .await?;
        row.map(ValueRow::into_value).transpose()
    }

    async fn insert_event(&mut self, e: &NewEvent) -> StoreResult<()> {
        sqlx::query(sql::INSERT_EVENT)
            .bind(unix_ms(e.at))
            .bind(e.kind.as_str())
            .bind(e.resource.as_str())
            .bind(e.token.map(Token::get))
            .bind(e.holder.as_ref().map(|h| h.as_str()))
            .bind(e.detail.to_string())
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn announce_lease_ended(&mut self, _name: &ResourceName) -> StoreResult<()> {
        // One process owns an SQLite database; the service wakes its own
        // waiters after commit.
        Ok(())
    }

    async fn savepoint(&mut self) -> StoreResult<()> {
        sqlx::query(sql::SAVEPOINT).execute(&mut *self.0).await?;
        Ok(())
    }

    async fn release_savepoint(&mut self) -> StoreResult<()> {
        sqlx::query(sql::RELEASE_SAVEPOINT)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> StoreResult<()> {
        sqlx::query(sql::ROLLBACK_TO_SAVEPOINT)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }
}

/// Multi-row statements: every statement goes through sqlx's worker thread,
/// so a batch costs a few hand-offs rather than a few per request. Each
/// statement's rows arrive as one JSON array parameter (`json_each`), so its
/// text is the same whatever the batch's size and it is prepared once and
/// cached (preparing a statement per batch was 7% of the server's CPU).
/// Strings that must come back byte for byte (event details, fenced values)
/// travel as JSON strings, which `->>` returns unchanged.
impl BatchTx for SqliteTx {
    async fn lock_resources(
        &mut self,
        create: &[ResourceName],
        lock: &[ResourceName],
        lease_ids: &[LeaseId],
    ) -> StoreResult<(Vec<ResourceRow>, Vec<ResourceName>)> {
        // BEGIN IMMEDIATE already holds the database write lock.
        let mut created = Vec::new();
        if !create.is_empty() {
            let inserted: Vec<String> = sqlx::query_scalar(sql::CREATE_RESOURCES)
                .bind(names_param(create)?)
                .fetch_all(&mut *self.0)
                .await?;
            created = parse_names(inserted)?;
        }
        let rows: Vec<ResourceDbRow<i64>> = sqlx::query_as(sql::LOCK_RESOURCES)
            .bind(names_param(lock)?)
            .bind(ids_param(lease_ids)?)
            .fetch_all(&mut *self.0)
            .await?;
        let rows = rows
            .into_iter()
            .map(ResourceDbRow::into_row)
            .collect::<StoreResult<_>>()?;
        Ok((rows, created))
    }

    async fn load_leases(
        &mut self,
        resources: &[ResourceName],
        ids: &[LeaseId],
        tokens: &[(ResourceName, Token)],
    ) -> StoreResult<(DateTime<Utc>, Vec<Lease>)> {
        let rows: Vec<ClockedLeaseRow<i64>> = sqlx::query_as(sql::LOAD_LEASES)
            .bind(names_param(resources)?)
            .bind(ids_param(ids)?)
            .bind(tokens_param(tokens)?)
            .fetch_all(&mut *self.0)
            .await?;
        ClockedLeaseRow::split(rows)
    }

    async fn load_values(
        &mut self,
        names: &[ResourceName],
    ) -> StoreResult<Vec<(ResourceName, StoredValue)>> {
        let rows: Vec<NamedValueRow<i64>> = sqlx::query_as(sql::LOAD_VALUES)
            .bind(names_param(names)?)
            .fetch_all(&mut *self.0)
            .await?;
        rows.into_iter()
            .map(NamedValueRow::into_named_value)
            .collect()
    }

    async fn delete_resources(&mut self, names: &[ResourceName]) -> StoreResult<()> {
        sqlx::query(sql::DELETE_RESOURCES)
            .bind(names_param(names)?)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn flush(&mut self, changes: &Changes) -> StoreResult<()> {
        for step in flush_steps(changes)? {
            let done = sqlx::query(step.sql)
                .bind(step.rows.as_str())
                .execute(&mut *self.0)
                .await?;
            step.check(done.rows_affected())?;
        }
        // One process owns an SQLite database; the service wakes its own
        // waiters after commit, so `changes.ended` needs no announcement.
        Ok(())
    }
}

/// One statement of a batch's flush and its rows, as one JSON parameter.
pub(super) struct FlushStep {
    pub sql: &'static str,
    pub rows: String,
    /// Rows the statement must change, when that is known.
    expect: Option<u64>,
}

impl FlushStep {
    /// Fails when the statement changed fewer rows than it had to (a lease
    /// the batch updated in memory was gone from the table).
    pub fn check(&self, changed: u64) -> StoreResult<()> {
        match self.expect {
            Some(expected) => all_leases_updated(expected, changed),
            None => Ok(()),
        }
    }
}

/// Fails when fewer leases than the batch updated in memory were updated
/// in the table (a lease was gone).
pub(super) fn all_leases_updated(expected: u64, changed: u64) -> StoreResult<()> {
    if expected == changed {
        Ok(())
    } else {
        Err(StoreError::Conflict(format!(
            "updated {changed} of {expected} leases"
        )))
    }
}

/// The statements that write `changes`, in the order that matters: endings
/// before new leases (the one-active-lease index is checked row by row),
/// events before new leases (a lease row looks up its `acquired` event's
/// id), and unused resources deleted last.
pub(super) fn flush_steps(changes: &Changes) -> StoreResult<Vec<FlushStep>> {
    let mut steps = Vec::with_capacity(6);
    let mut step = |sql, rows, expect| {
        steps.push(FlushStep { sql, rows, expect });
    };
    if !changes.resources.is_empty() {
        let rows = json_rows(changes.resources.iter().map(|r| {
            (
                r.name.as_str(),
                r.last_token,
                r.accepted_token,
                unix_ms(r.last_activity_at),
            )
        }))?;
        step(sql::FLUSH_RESOURCES, rows, None);
    }
    if !changes.updated_leases.is_empty() {
        let rows = json_rows(changes.updated_leases.iter().map(|l| {
            (
                l.lease_id.as_str(),
                l.state.as_str(),
                l.ttl_ms,
                unix_ms(l.expires_at),
                l.ended_at.map(unix_ms),
            )
        }))?;
        let expect = changes.updated_leases.len() as u64;
        step(sql::FLUSH_UPDATED_LEASES, rows, Some(expect));
    }
    if !changes.events.is_empty() {
        let rows = json_rows(changes.events.iter().map(event_values))?;
        step(sql::FLUSH_EVENTS, rows, None);
    }
    if !changes.new_leases.is_empty() {
        let rows = json_rows(changes.new_leases.iter().map(new_lease_values))?;
        step(sql::FLUSH_NEW_LEASES, rows, None);
    }
    if !changes.values.is_empty() {
        let rows = json_rows(changes.values.iter().map(|(name, v)| {
            (
                name.as_str(),
                v.json.as_str(),
                v.token.get(),
                v.version,
                unix_ms(v.updated_at),
            )
        }))?;
        step(sql::FLUSH_VALUES, rows, None);
    }
    if !changes.unused.is_empty() {
        step(sql::DELETE_RESOURCES, names_param(&changes.unused)?, None);
    }
    Ok(steps)
}

/// A new lease's columns, in [`sql::INSERT_LEASE`]'s and
/// [`sql::FLUSH_NEW_LEASES`]' order.
pub(super) type NewLeaseValues<'a> = (
    &'a str,
    &'a str,
    i64,
    &'a str,
    &'a str,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<&'a str>,
);

pub(super) fn new_lease_values(l: &Lease) -> NewLeaseValues<'_> {
    (
        l.lease_id.as_str(),
        l.resource.as_str(),
        l.token.get(),
        l.holder.as_str(),
        l.state.as_str(),
        l.ttl_ms,
        unix_ms(l.acquired_at),
        unix_ms(l.expires_at),
        l.ended_at.map(unix_ms),
        l.request_id.as_ref().map(|r| r.as_str()),
    )
}

/// An event's columns, in [`sql::INSERT_EVENT`]'s and
/// [`sql::FLUSH_EVENTS`]' order (the detail as its JSON text).
pub(super) type EventValues<'a> = (i64, &'a str, &'a str, Option<i64>, Option<&'a str>, String);

pub(super) fn event_values(e: &NewEvent) -> EventValues<'_> {
    (
        unix_ms(e.at),
        e.kind.as_str(),
        e.resource.as_str(),
        e.token.map(Token::get),
        e.holder.as_ref().map(|h| h.as_str()),
        e.detail.to_string(),
    )
}

pub(super) fn names_param(names: &[ResourceName]) -> StoreResult<String> {
    json_rows(names.iter().map(ResourceName::as_str))
}

pub(super) fn ids_param(ids: &[LeaseId]) -> StoreResult<String> {
    json_rows(ids.iter().map(LeaseId::as_str))
}

pub(super) fn tokens_param(tokens: &[(ResourceName, Token)]) -> StoreResult<String> {
    json_rows(
        tokens
            .iter()
            .map(|(name, token)| (name.as_str(), token.get())),
    )
}

pub(super) fn parse_names(names: Vec<String>) -> StoreResult<Vec<ResourceName>> {
    names
        .into_iter()
        .map(|n| ResourceName::parse(n).map_err(|e| StoreError::Corrupt(e.to_string())))
        .collect()
}

/// One statement parameter for `json_each`: a JSON array of values (read
/// back as `value`) or of rows (tuples serialise as arrays, read back with
/// `value ->> i`).
fn json_rows<T: serde::Serialize>(rows: impl Iterator<Item = T>) -> StoreResult<String> {
    serde_json::to_string(&rows.collect::<Vec<T>>())
        .map_err(|e| StoreError::InvalidData(format!("batch parameters: {e}")))
}

#[cfg(test)]
mod tests {
    use super::is_in_memory;

    #[test]
    fn in_memory_urls_are_told_from_files() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://x.db?mode=memory&cache=shared",
            "sqlite:x.db?cache=shared&mode=memory",
            "sqlite:%3Amemory%3A",
            "sqlite:x.db?mode=%6Demory",
        ] {
            assert!(is_in_memory(url), "{url}");
        }
        for url in [
            "sqlite://palisade.db",
            "sqlite:///var/lib/palisade/memory.db",
            "sqlite://x.db?mode=rwc",
        ] {
            assert!(!is_in_memory(url), "{url}");
        }
    }
}

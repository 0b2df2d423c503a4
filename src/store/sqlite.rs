//! SQLite backend: the embedded default.
//!
//! One writer connection (SQLite has one writer anyway) whose transactions
//! start with `BEGIN IMMEDIATE`, so a write transaction holds the database
//! write lock from its first statement; a small pool of read-only
//! connections serves reads concurrently thanks to WAL. `synchronous=FULL`
//! makes every acknowledged commit durable.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, Sqlite, SqlitePool, Transaction};

use super::rows::{
    ClockedLeaseRow, EventRow, LeaseRow, NamedValueRow, ResourceDbRow, ValueRow, into_lease,
    unix_ms,
};
use super::staged::{BatchTx, Changes};
use super::types::{
    Event, EventCursor, EventFilter, NewEvent, PruneBatch, ResourceRow, StoredValue,
};
use super::{Backend, ResourceTx, StoreError, StoreResult};
use crate::domain::{Lease, LeaseId, ResourceName, Token};

const LEASE_COLUMNS: &str = "lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at, request_id";
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

#[derive(Clone)]
pub struct SqliteBackend {
    writer: SqlitePool,
    readers: SqlitePool,
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
            .pragma("temp_store", "memory");
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&writer)
            .await
            .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.read_only(true))
            .await?;
        Ok(Self { writer, readers })
    }

    /// The read-only pool, for queries outside a transaction.
    pub(crate) fn readers(&self) -> &SqlitePool {
        &self.readers
    }
}

pub struct SqliteTx(Transaction<'static, Sqlite>);

impl Backend for SqliteBackend {
    type Tx = SqliteTx;

    async fn begin_write(&self) -> StoreResult<SqliteTx> {
        Ok(SqliteTx(self.writer.begin_with("BEGIN IMMEDIATE").await?))
    }

    async fn begin_read(&self) -> StoreResult<SqliteTx> {
        Ok(SqliteTx(self.readers.begin().await?))
    }

    async fn commit(tx: SqliteTx) -> StoreResult<()> {
        Ok(tx.0.commit().await?)
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
        self.readers.close().await;
        self.writer.close().await;
    }
}

impl ResourceTx for SqliteTx {
    async fn now(&mut self) -> StoreResult<DateTime<Utc>> {
        let ms: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&mut *self.0)
            .await?;
        super::rows::DbTime::to_utc(ms)
    }

    async fn ensure_resource(&mut self, name: &ResourceName) -> StoreResult<()> {
        let sql = format!(
            "INSERT INTO resources (name, created_at, last_activity_at) VALUES (?, {NOW_MS}, {NOW_MS}) \
             ON CONFLICT (name) DO NOTHING"
        );
        sqlx::query(&sql)
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
        let row: Option<ResourceDbRow<i64>> = sqlx::query_as(
            "SELECT name, last_token, accepted_token, created_at, last_activity_at \
             FROM resources WHERE name = ?",
        )
        .bind(name.as_str())
        .fetch_optional(&mut *self.0)
        .await?;
        row.map(ResourceDbRow::into_row).transpose()
    }

    async fn save_resource(&mut self, row: &ResourceRow) -> StoreResult<()> {
        sqlx::query(
            "UPDATE resources SET last_token = ?, accepted_token = ?, last_activity_at = ? WHERE name = ?",
        )
        .bind(row.last_token)
        .bind(row.accepted_token)
        .bind(unix_ms(row.last_activity_at))
        .bind(row.name.as_str())
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn active_lease(&mut self, name: &ResourceName) -> StoreResult<Option<Lease>> {
        let sql =
            format!("SELECT {LEASE_COLUMNS} FROM leases WHERE resource = ? AND state = 'active'");
        let row: Option<LeaseRow<i64>> = sqlx::query_as(&sql)
            .bind(name.as_str())
            .fetch_optional(&mut *self.0)
            .await?;
        into_lease(row)
    }

    async fn lease_by_id(&mut self, id: &LeaseId) -> StoreResult<Option<Lease>> {
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE lease_id = ?");
        let row: Option<LeaseRow<i64>> = sqlx::query_as(&sql)
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
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE resource = ? AND token = ?");
        let row: Option<LeaseRow<i64>> = sqlx::query_as(&sql)
            .bind(name.as_str())
            .bind(token.get())
            .fetch_optional(&mut *self.0)
            .await?;
        into_lease(row)
    }

    async fn insert_lease(&mut self, l: &Lease) -> StoreResult<()> {
        let sql =
            format!("INSERT INTO leases ({LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
        sqlx::query(&sql)
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
        sqlx::query("UPDATE leases SET state = ?, ttl_ms = ?, expires_at = ?, ended_at = ? WHERE lease_id = ?")
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
        let version: i64 = sqlx::query_scalar(
            "INSERT INTO fenced_values (resource, value, token, version, updated_at) VALUES (?, ?, ?, 1, ?) \
             ON CONFLICT (resource) DO UPDATE SET value = excluded.value, token = excluded.token, \
             version = fenced_values.version + 1, updated_at = excluded.updated_at \
             RETURNING version",
        )
        .bind(name.as_str())
        .bind(json)
        .bind(token.get())
        .bind(unix_ms(now))
        .fetch_one(&mut *self.0)
        .await?;
        Ok(version)
    }

    async fn value(&mut self, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
        let row: Option<ValueRow<i64>> = sqlx::query_as(
            "SELECT value, token, version, updated_at FROM fenced_values WHERE resource = ?",
        )
        .bind(name.as_str())
        .fetch_optional(&mut *self.0)
        .await?;
        row.map(ValueRow::into_value).transpose()
    }

    async fn insert_event(&mut self, e: &NewEvent) -> StoreResult<()> {
        sqlx::query("INSERT INTO events (at, kind, resource, token, holder, detail) VALUES (?, ?, ?, ?, ?, ?)")
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
        sqlx::query("SAVEPOINT batch_request")
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn release_savepoint(&mut self) -> StoreResult<()> {
        sqlx::query("RELEASE SAVEPOINT batch_request")
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> StoreResult<()> {
        sqlx::query("ROLLBACK TO SAVEPOINT batch_request")
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
            // `WHERE true`: SQLite's grammar needs it before an upsert's
            // ON CONFLICT when the rows come from a SELECT.
            let inserted: Vec<String> = sqlx::query_scalar(&format!(
                "INSERT INTO resources (name, created_at, last_activity_at) \
                 SELECT value, {NOW_MS}, {NOW_MS} FROM json_each(?1) WHERE true \
                 ON CONFLICT (name) DO NOTHING RETURNING name"
            ))
            .bind(json_rows(create.iter().map(ResourceName::as_str))?)
            .fetch_all(&mut *self.0)
            .await?;
            for name in inserted {
                created.push(
                    ResourceName::parse(name).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                );
            }
        }
        // A union of two index lookups (an `OR` with a subquery would scan
        // the whole table).
        const COLUMNS: &str =
            "SELECT name, last_token, accepted_token, created_at, last_activity_at FROM resources";
        let rows: Vec<ResourceDbRow<i64>> = sqlx::query_as(&format!(
            "{COLUMNS} WHERE name IN (SELECT value FROM json_each(?1)) \
             UNION {COLUMNS} WHERE name IN (SELECT resource FROM leases \
               WHERE lease_id IN (SELECT value FROM json_each(?2))) \
             ORDER BY name"
        ))
        .bind(json_rows(lock.iter().map(ResourceName::as_str))?)
        .bind(json_rows(lease_ids.iter().map(LeaseId::as_str))?)
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
        // One row even when no lease matches, to carry the clock.
        let rows: Vec<ClockedLeaseRow<i64>> = sqlx::query_as(&format!(
            "SELECT clock.now, l.* FROM (SELECT {NOW_MS} AS now) AS clock LEFT JOIN ( \
               SELECT {LEASE_COLUMNS} FROM leases WHERE state = 'active' \
                 AND resource IN (SELECT value FROM json_each(?1)) \
               UNION SELECT {LEASE_COLUMNS} FROM leases \
                 WHERE lease_id IN (SELECT value FROM json_each(?2)) \
               UNION SELECT {LEASE_COLUMNS} FROM leases \
                 WHERE (resource, token) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?3)) \
             ) AS l ON 1"
        ))
        .bind(json_rows(resources.iter().map(ResourceName::as_str))?)
        .bind(json_rows(ids.iter().map(LeaseId::as_str))?)
        .bind(json_rows(
            tokens
                .iter()
                .map(|(name, token)| (name.as_str(), token.get())),
        )?)
        .fetch_all(&mut *self.0)
        .await?;
        ClockedLeaseRow::split(rows)
    }

    async fn load_values(
        &mut self,
        names: &[ResourceName],
    ) -> StoreResult<Vec<(ResourceName, StoredValue)>> {
        let rows: Vec<NamedValueRow<i64>> = sqlx::query_as(
            "SELECT resource, value, token, version, updated_at FROM fenced_values \
             WHERE resource IN (SELECT value FROM json_each(?1))",
        )
        .bind(json_rows(names.iter().map(ResourceName::as_str))?)
        .fetch_all(&mut *self.0)
        .await?;
        rows.into_iter()
            .map(NamedValueRow::into_named_value)
            .collect()
    }

    async fn delete_resources(&mut self, names: &[ResourceName]) -> StoreResult<()> {
        sqlx::query("DELETE FROM resources WHERE name IN (SELECT value FROM json_each(?1))")
            .bind(json_rows(names.iter().map(ResourceName::as_str))?)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn flush(&mut self, changes: &Changes) -> StoreResult<()> {
        if !changes.resources.is_empty() {
            sqlx::query(
                "UPDATE resources SET last_token = u.value ->> 1, accepted_token = u.value ->> 2, \
                 last_activity_at = u.value ->> 3 \
                 FROM json_each(?1) AS u WHERE resources.name = u.value ->> 0",
            )
            .bind(json_rows(changes.resources.iter().map(|r| {
                (
                    r.name.as_str(),
                    r.last_token,
                    r.accepted_token,
                    unix_ms(r.last_activity_at),
                )
            }))?)
            .execute(&mut *self.0)
            .await?;
        }
        // Endings before new leases: the one-active-lease index is checked
        // row by row.
        if !changes.updated_leases.is_empty() {
            let updated = sqlx::query(
                "UPDATE leases SET state = u.value ->> 1, ttl_ms = u.value ->> 2, \
                 expires_at = u.value ->> 3, ended_at = u.value ->> 4 \
                 FROM json_each(?1) AS u WHERE leases.lease_id = u.value ->> 0",
            )
            .bind(json_rows(changes.updated_leases.iter().map(|l| {
                (
                    l.lease_id.as_str(),
                    l.state.as_str(),
                    l.ttl_ms,
                    unix_ms(l.expires_at),
                    l.ended_at.map(unix_ms),
                )
            }))?)
            .execute(&mut *self.0)
            .await?
            .rows_affected();
            let expected = changes.updated_leases.len() as u64;
            if updated != expected {
                return Err(StoreError::Conflict(format!(
                    "updated {updated} of {expected} leases"
                )));
            }
        }
        if !changes.new_leases.is_empty() {
            sqlx::query(&format!(
                "INSERT INTO leases ({LEASE_COLUMNS}) \
                 SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
                   value ->> 5, value ->> 6, value ->> 7, value ->> 8, value ->> 9 \
                 FROM json_each(?1) ORDER BY key"
            ))
            .bind(json_rows(changes.new_leases.iter().map(|l| {
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
            }))?)
            .execute(&mut *self.0)
            .await?;
        }
        if !changes.values.is_empty() {
            sqlx::query(
                "INSERT INTO fenced_values (resource, value, token, version, updated_at) \
                 SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4 \
                 FROM json_each(?1) WHERE true \
                 ON CONFLICT (resource) DO UPDATE SET value = excluded.value, \
                 token = excluded.token, version = excluded.version, \
                 updated_at = excluded.updated_at",
            )
            .bind(json_rows(changes.values.iter().map(|(name, v)| {
                (
                    name.as_str(),
                    v.json.as_str(),
                    v.token.get(),
                    v.version,
                    unix_ms(v.updated_at),
                )
            }))?)
            .execute(&mut *self.0)
            .await?;
        }
        if !changes.events.is_empty() {
            // Row ids are handed out in array order: the batch's events keep
            // the order they happened in.
            // Each detail as the JSON text it is stored as, inside a JSON string.
            sqlx::query(
                "INSERT INTO events (at, kind, resource, token, holder, detail) \
                 SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
                   value ->> 5 \
                 FROM json_each(?1) ORDER BY key",
            )
            .bind(json_rows(changes.events.iter().map(|e| {
                (
                    unix_ms(e.at),
                    e.kind.as_str(),
                    e.resource.as_str(),
                    e.token.map(Token::get),
                    e.holder.as_ref().map(|h| h.as_str()),
                    e.detail.to_string(),
                )
            }))?)
            .execute(&mut *self.0)
            .await?;
        }
        if !changes.unused.is_empty() {
            self.delete_resources(&changes.unused).await?;
        }
        // One process owns an SQLite database; the service wakes its own
        // waiters after commit, so `changes.ended` needs no announcement.
        Ok(())
    }
}

/// One statement parameter for `json_each`: a JSON array of values (read
/// back as `value`) or of rows (tuples serialise as arrays, read back with
/// `value ->> i`).
fn json_rows<T: serde::Serialize>(rows: impl Iterator<Item = T>) -> StoreResult<String> {
    serde_json::to_string(&rows.collect::<Vec<T>>())
        .map_err(|e| StoreError::InvalidData(format!("batch parameters: {e}")))
}

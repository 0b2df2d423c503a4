//! SQLite's group-commit writer, in process.
//!
//! sqlx runs every SQLite statement on a worker thread of its own, handing
//! each statement and each row across threads. A one-request batch spent
//! about 2 ms in those hand-offs and the context switches they cost, against
//! about 0.35 ms for the same commit made in process (docs/performance.md).
//! So with group commit, SQLite's one writer is a rusqlite connection owned
//! by a thread of its own that runs the whole batcher loop (see
//! [`super::batch`]): locking, loading, flushing and committing a batch are
//! plain function calls there, and the only hand-offs left are a request
//! arriving and its answer leaving. It runs the same statements as the sqlx
//! transaction ([`super::sqlite::sql`]), but for a batch's flush: there it
//! binds each row to a one-row statement where sqlx's path sends a table's
//! rows as one JSON array (no round trip to save in process). Reads,
//! retention and writes with
//! group commit off stay on sqlx's connections; SQLite's write lock (with
//! the same busy timeout) keeps the two writers apart.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Params, Row};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::rows::{
    ClockedLeaseRow, DbTime, LeaseRow, ResourceDbRow, ValueRow, into_lease, unix_ms,
};
use super::sqlite::{
    IS_PALISADE_SCHEMA, all_leases_updated, event_values, ids_param, names_param, new_lease_values,
    parse_names, sql, tokens_param,
};
use super::staged::{BatchTx, Changes};
use super::types::{NewEvent, ResourceRow, StoredValue};
use super::{ResourceTx, StoreError, StoreResult, Writes, classify_database_error};
use crate::domain::{Lease, LeaseId, ResourceName, Token};

/// WAL bytes after which a commit checkpoints.
const CHECKPOINT_BYTES: u32 = 40 << 20;

/// `PRAGMA wal_autocheckpoint` counts pages: the same bytes whatever the
/// database's page size (1 KiB for new files, 4 KiB for older ones).
fn checkpoint_pages(page_size: u32) -> u32 {
    CHECKPOINT_BYTES / page_size.max(512)
}

/// The writer connection. Its transactions hold it, so one runs at a time.
#[derive(Clone)]
pub struct DirectWriter {
    conn: Arc<Mutex<Connection>>,
}

/// A connection to the existing database file at `path`: never creates
/// one, and takes `path` as a file name, not a URI.
pub(super) fn open_existing(path: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

impl DirectWriter {
    /// Opens a second connection to the (already migrated) database file
    /// at `path`, with the same durability settings as sqlx's.
    pub fn open(path: &Path) -> StoreResult<Self> {
        // A name that is not the migrated file sqlx opened (an in-memory
        // database's made-up name, say) fails here, and group commit then
        // writes through sqlx instead.
        let conn = open_existing(path)?;
        let migrated: bool = conn.query_row(IS_PALISADE_SCHEMA, [], |row| row.get(0))?;
        if !migrated {
            return Err(StoreError::Unavailable(format!(
                "{} is not the migrated database",
                path.display()
            )));
        }
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
             PRAGMA foreign_keys = ON; PRAGMA temp_store = memory;",
        )?;
        // Checkpoint every 40 MiB of WAL instead of SQLite's 1,000 pages: a
        // page rewritten by many batches is copied into the database file
        // once per checkpoint, not once per few batches (SQLite cycles
        // +20–30% measured; docs/performance.md). The WAL file grows to that
        // size.
        let page_size: u32 = conn.query_row("PRAGMA page_size", [], |row| row.get(0))?;
        let pages = checkpoint_pages(page_size);
        conn.execute_batch(&format!("PRAGMA wal_autocheckpoint = {pages};"))?;
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }
}

/// A write transaction on the writer connection; rolled back if dropped
/// before it commits. Its statements block the thread that runs them,
/// which is the writer's own.
pub struct DirectTx {
    conn: OwnedMutexGuard<Connection>,
}

impl Drop for DirectTx {
    fn drop(&mut self) {
        if !self.conn.is_autocommit() {
            // Nothing of it was acknowledged; a failure here leaves the
            // transaction to be rolled back when the connection closes.
            if let Err(err) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %err, "rolling back a batch failed");
            }
        }
    }
}

impl Writes for DirectWriter {
    type Tx = DirectTx;

    async fn begin_write(&self) -> StoreResult<DirectTx> {
        let conn = self.conn.clone().lock_owned().await;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        Ok(DirectTx { conn })
    }

    async fn commit(tx: DirectTx) -> StoreResult<()> {
        Ok(tx.conn.execute_batch("COMMIT")?)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> Self {
        use rusqlite::Error as E;
        match &err {
            E::SqliteFailure(failure, _) => {
                classify_database_error(&failure.extended_code.to_string(), err.to_string())
                    .unwrap_or_else(|| StoreError::Other(Box::new(err)))
            }
            E::FromSqlConversionFailure(..)
            | E::IntegralValueOutOfRange(..)
            | E::InvalidColumnType(..)
            | E::InvalidColumnIndex(_)
            | E::InvalidColumnName(_)
            | E::Utf8Error(_) => StoreError::Corrupt(err.to_string()),
            _ => StoreError::Other(Box::new(err)),
        }
    }
}

impl DirectTx {
    fn execute(&self, sql: &str, params: impl Params) -> StoreResult<usize> {
        Ok(self.conn.prepare_cached(sql)?.execute(params)?)
    }

    /// Writes a lease's changing columns; the rows it changed (0 if the
    /// lease is gone).
    fn update_lease_row(&self, l: &Lease) -> StoreResult<usize> {
        self.execute(
            sql::UPDATE_LEASE,
            (
                l.state.as_str(),
                l.ttl_ms,
                unix_ms(l.expires_at),
                l.ended_at.map(unix_ms),
                l.lease_id.as_str(),
            ),
        )
    }

    fn rows<T>(
        &self,
        sql: &str,
        params: impl Params,
        row: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> StoreResult<Vec<T>> {
        let mut statement = self.conn.prepare_cached(sql)?;
        let rows = statement.query_map(params, row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn optional<T>(
        &self,
        sql: &str,
        params: impl Params,
        row: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> StoreResult<Option<T>> {
        let mut statement = self.conn.prepare_cached(sql)?;
        Ok(statement.query_row(params, row).optional()?)
    }
}

/// A lease's columns from `at` on: lease_id, resource, token, holder, state,
/// ttl_ms, acquired_at, expires_at, ended_at, request_id.
fn lease_row(row: &Row<'_>, at: usize) -> rusqlite::Result<LeaseRow<i64>> {
    Ok(LeaseRow {
        lease_id: row.get(at)?,
        resource: row.get(at + 1)?,
        token: row.get(at + 2)?,
        holder: row.get(at + 3)?,
        state: row.get(at + 4)?,
        ttl_ms: row.get(at + 5)?,
        acquired_at: row.get(at + 6)?,
        expires_at: row.get(at + 7)?,
        ended_at: row.get(at + 8)?,
        request_id: row.get(at + 9)?,
    })
}

fn resource_row(row: &Row<'_>) -> rusqlite::Result<ResourceDbRow<i64>> {
    Ok(ResourceDbRow {
        name: row.get(0)?,
        last_token: row.get(1)?,
        accepted_token: row.get(2)?,
        created_at: row.get(3)?,
        last_activity_at: row.get(4)?,
    })
}

/// A fenced value's columns from `at` on: value, token, version, updated_at.
fn value_row(row: &Row<'_>, at: usize) -> rusqlite::Result<ValueRow<i64>> {
    Ok(ValueRow {
        value: row.get(at)?,
        token: row.get(at + 1)?,
        version: row.get(at + 2)?,
        updated_at: row.get(at + 3)?,
    })
}

impl ResourceTx for DirectTx {
    async fn now(&mut self) -> StoreResult<DateTime<Utc>> {
        let ms: i64 = self
            .conn
            .prepare_cached(sql::NOW)?
            .query_row([], |r| r.get(0))?;
        ms.to_utc()
    }

    async fn ensure_resource(&mut self, name: &ResourceName) -> StoreResult<()> {
        self.execute(sql::ENSURE_RESOURCE, [name.as_str()])?;
        Ok(())
    }

    async fn resource(
        &mut self,
        name: &ResourceName,
        _for_update: bool,
    ) -> StoreResult<Option<ResourceRow>> {
        // BEGIN IMMEDIATE already holds the database write lock.
        self.optional(sql::RESOURCE, [name.as_str()], resource_row)?
            .map(ResourceDbRow::into_row)
            .transpose()
    }

    async fn save_resource(&mut self, row: &ResourceRow) -> StoreResult<()> {
        self.execute(
            sql::SAVE_RESOURCE,
            (
                row.last_token,
                row.accepted_token,
                unix_ms(row.last_activity_at),
                row.name.as_str(),
            ),
        )?;
        Ok(())
    }

    async fn active_lease(&mut self, name: &ResourceName) -> StoreResult<Option<Lease>> {
        into_lease(self.optional(sql::ACTIVE_LEASE, [name.as_str()], |r| lease_row(r, 0))?)
    }

    async fn lease_by_id(&mut self, id: &LeaseId) -> StoreResult<Option<Lease>> {
        into_lease(self.optional(sql::LEASE_BY_ID, [id.as_str()], |r| lease_row(r, 0))?)
    }

    async fn lease_by_token(
        &mut self,
        name: &ResourceName,
        token: Token,
    ) -> StoreResult<Option<Lease>> {
        let params = (name.as_str(), token.get());
        into_lease(self.optional(sql::LEASE_BY_TOKEN, params, |r| lease_row(r, 0))?)
    }

    async fn insert_lease(&mut self, l: &Lease) -> StoreResult<()> {
        self.execute(sql::INSERT_LEASE, new_lease_values(l))?;
        Ok(())
    }

    async fn update_lease(&mut self, l: &Lease) -> StoreResult<()> {
        self.update_lease_row(l)?;
        Ok(())
    }

    async fn upsert_value(
        &mut self,
        name: &ResourceName,
        json: &str,
        token: Token,
        now: DateTime<Utc>,
    ) -> StoreResult<i64> {
        let params = (name.as_str(), json, token.get(), unix_ms(now));
        Ok(self
            .conn
            .prepare_cached(sql::UPSERT_VALUE)?
            .query_row(params, |r| r.get(0))?)
    }

    async fn value(&mut self, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
        self.optional(sql::VALUE, [name.as_str()], |r| value_row(r, 0))?
            .map(ValueRow::into_value)
            .transpose()
    }

    async fn insert_event(&mut self, e: &NewEvent) -> StoreResult<()> {
        self.execute(sql::INSERT_EVENT, event_values(e))?;
        Ok(())
    }

    async fn announce_lease_ended(&mut self, _name: &ResourceName) -> StoreResult<()> {
        // One process owns an SQLite database; the service wakes its own
        // waiters after commit.
        Ok(())
    }

    async fn savepoint(&mut self) -> StoreResult<()> {
        self.execute(sql::SAVEPOINT, [])?;
        Ok(())
    }

    async fn release_savepoint(&mut self) -> StoreResult<()> {
        self.execute(sql::RELEASE_SAVEPOINT, [])?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> StoreResult<()> {
        self.execute(sql::ROLLBACK_TO_SAVEPOINT, [])?;
        Ok(())
    }
}

impl BatchTx for DirectTx {
    async fn lock_resources(
        &mut self,
        create: &[ResourceName],
        lock: &[ResourceName],
        lease_ids: &[LeaseId],
    ) -> StoreResult<(Vec<ResourceRow>, Vec<ResourceName>)> {
        // BEGIN IMMEDIATE already holds the database write lock.
        let mut created = Vec::new();
        if !create.is_empty() {
            let inserted = self.rows(sql::CREATE_RESOURCES, [names_param(create)?], |r| {
                r.get::<_, String>(0)
            })?;
            created = parse_names(inserted)?;
        }
        let params = (names_param(lock)?, ids_param(lease_ids)?);
        let rows = self
            .rows(sql::LOCK_RESOURCES, params, resource_row)?
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
        let params = (
            names_param(resources)?,
            ids_param(ids)?,
            tokens_param(tokens)?,
        );
        // The clock, then (outer join) a lease or nulls.
        let rows = self.rows(sql::LOAD_LEASES, params, |r| {
            Ok(ClockedLeaseRow::<i64> {
                now: r.get(0)?,
                lease_id: r.get(1)?,
                resource: r.get(2)?,
                token: r.get(3)?,
                holder: r.get(4)?,
                state: r.get(5)?,
                ttl_ms: r.get(6)?,
                acquired_at: r.get(7)?,
                expires_at: r.get(8)?,
                ended_at: r.get(9)?,
                request_id: r.get(10)?,
            })
        })?;
        ClockedLeaseRow::split(rows)
    }

    async fn load_values(
        &mut self,
        names: &[ResourceName],
    ) -> StoreResult<Vec<(ResourceName, StoredValue)>> {
        let rows = self.rows(sql::LOAD_VALUES, [names_param(names)?], |r| {
            Ok((r.get::<_, String>(0)?, value_row(r, 1)?))
        })?;
        let (names, values): (Vec<String>, Vec<ValueRow<i64>>) = rows.into_iter().unzip();
        let values = values.into_iter().map(ValueRow::into_value);
        parse_names(names)?
            .into_iter()
            .zip(values)
            .map(|(name, value)| Ok((name, value?)))
            .collect()
    }

    async fn delete_resources(&mut self, names: &[ResourceName]) -> StoreResult<()> {
        self.execute(sql::DELETE_RESOURCES, [names_param(names)?])?;
        Ok(())
    }

    /// One cached statement per row, in the order `flush_steps` gives the
    /// sqlx path (endings and events before new leases, unused resources
    /// last). In process a statement costs no round trip, so binding each
    /// row skips encoding the batch as JSON for `json_each` to decode
    /// (SQLite cycles +5-10% on 7 December). The reads keep their multi-row statements:
    /// per-row lookups measured the same.
    async fn flush(&mut self, changes: &Changes) -> StoreResult<()> {
        for row in &changes.resources {
            self.save_resource(row).await?;
        }
        let mut updated = 0;
        for lease in &changes.updated_leases {
            updated += self.update_lease_row(lease)?;
        }
        all_leases_updated(changes.updated_leases.len() as u64, updated as u64)?;
        for event in &changes.events {
            self.insert_event(event).await?;
        }
        for lease in &changes.new_leases {
            self.insert_lease(lease).await?;
        }
        for (name, v) in &changes.values {
            self.execute(
                sql::WRITE_VALUE,
                (
                    name.as_str(),
                    v.json.as_str(),
                    v.token.get(),
                    v.version,
                    unix_ms(v.updated_at),
                ),
            )?;
        }
        if !changes.unused.is_empty() {
            self.execute(sql::DELETE_RESOURCES, [names_param(&changes.unused)?])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventKind, Holder, LeaseState};
    use crate::store::sqlite::{NEW_DATABASE_PAGE_SIZE, SqliteBackend};

    async fn page_size_and_checkpoint(path: &Path) -> (u32, u32) {
        let url = format!("sqlite://{}", path.display());
        let backend = SqliteBackend::connect(&url).await.expect("connect");
        let writer = backend.direct_writer().expect("a file").expect("open");
        let conn = writer.conn.lock().await;
        let pragma = |name: &str| {
            conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get(0))
                .expect("pragma")
        };
        (pragma("page_size"), pragma("wal_autocheckpoint"))
    }

    /// .cargo/config.toml's LIBSQLITE3_FLAGS reached the bundled SQLite
    /// (rusqlite and sqlx link the same one). HAVE_FDATASYNC, set with it,
    /// is not among SQLite's reported options.
    #[test]
    fn the_bundled_sqlite_is_built_with_the_projects_flags() {
        let conn = Connection::open_in_memory().expect("open");
        let mut options = conn.prepare("PRAGMA compile_options").expect("pragma");
        let options: Vec<String> = options
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    #[test]
    fn checkpoints_come_after_the_same_bytes_whatever_the_page_size() {
        assert_eq!(checkpoint_pages(1024), 40 * 1024);
        assert_eq!(checkpoint_pages(4096), 10 * 1024);
        assert_eq!(checkpoint_pages(65536), 640);
    }

    /// An in-memory database has no file for a second connection, so group
    /// commit runs on sqlx's writer (batch.rs, `start_sqlite`).
    #[tokio::test]
    async fn an_in_memory_database_has_no_direct_writer() {
        let backend = SqliteBackend::connect("sqlite::memory:")
            .await
            .expect("connect");
        assert!(backend.direct_writer().is_none());
    }

    #[test]
    fn the_writer_opens_only_the_migrated_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        // sqlx's name for an in-memory database, seen as a file name.
        let missing = dir.path().join("file:sqlx-in-memory-0");
        assert!(DirectWriter::open(&missing).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
        let other = dir.path().join("other.db");
        Connection::open(&other)
            .and_then(|c| c.execute_batch("CREATE TABLE t (x);"))
            .expect("another database");
        assert!(matches!(
            DirectWriter::open(&other),
            Err(StoreError::Unavailable(_))
        ));
    }

    #[tokio::test]
    async fn a_new_database_gets_small_pages() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (page_size, checkpoint) = page_size_and_checkpoint(&dir.path().join("new.db")).await;
        assert_eq!(page_size, NEW_DATABASE_PAGE_SIZE);
        assert_eq!(checkpoint, checkpoint_pages(NEW_DATABASE_PAGE_SIZE));
    }

    /// Two batches on one resource: an acquire, then its release with the
    /// next grant, a fenced write and an unused resource.
    fn two_batches() -> [Changes; 2] {
        let at = |ms: i64| DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("time");
        let name = |s: &str| ResourceName::parse(s).expect("name");
        let lease = |token: i64, state: LeaseState, ms: i64| Lease {
            lease_id: LeaseId::generate(),
            resource: name("r"),
            holder: Holder::parse(format!("holder-{token}")).expect("holder"),
            token: Token::from_stored(token),
            state,
            ttl_ms: 5_000,
            acquired_at: at(ms),
            expires_at: at(ms + 5_000),
            ended_at: None,
            request_id: None,
        };
        let resource = |last_token: i64, accepted_token: i64, ms: i64| ResourceRow {
            name: name("r"),
            last_token,
            accepted_token,
            created_at: at(0),
            last_activity_at: at(ms),
        };
        let event = |kind: EventKind, token: i64, ms: i64| NewEvent {
            at: at(ms),
            kind,
            resource: name("r"),
            token: Some(Token::from_stored(token)),
            holder: None,
            detail: serde_json::json!({ "n": token, "s": "\"quoted\" \u{e9}" }),
        };
        let first = lease(1, LeaseState::Active, 10);
        let mut ended = first.clone();
        ended.state = LeaseState::Released;
        ended.ended_at = Some(at(20));
        let value = StoredValue {
            json: r#"{"b": 1,  "a": [true, null]}"#.to_owned(),
            token: Token::from_stored(2),
            version: 1,
            updated_at: at(30),
        };
        [
            Changes {
                resources: vec![resource(1, 0, 10)],
                new_leases: vec![first],
                events: vec![event(EventKind::Acquired, 1, 10)],
                ..Changes::default()
            },
            Changes {
                resources: vec![resource(2, 2, 30)],
                updated_leases: vec![ended],
                new_leases: vec![lease(2, LeaseState::Active, 20)],
                values: vec![(name("r"), value)],
                events: vec![
                    event(EventKind::Released, 1, 20),
                    event(EventKind::Acquired, 2, 20),
                    event(EventKind::WriteAccepted, 2, 30),
                ],
                unused: vec![name("unused")],
                ..Changes::default()
            },
        ]
    }

    /// Every table's rows as text, but for the clock the database set
    /// (`created_at`).
    fn dump(path: &Path) -> Vec<String> {
        let conn = Connection::open(path).expect("open");
        [
            "SELECT name, last_token, accepted_token, last_activity_at FROM resources",
            "SELECT token, holder, state, ttl_ms, acquired_at, expires_at, ended_at, request_id \
             FROM leases",
            "SELECT resource, value, token, version, updated_at FROM fenced_values",
            "SELECT id, at, kind, resource, token, holder, detail FROM events",
        ]
        .into_iter()
        .flat_map(|query| {
            let mut statement = conn
                .prepare(&format!("{query} ORDER BY 1"))
                .expect("prepare");
            let columns = statement.column_count();
            statement
                .query_map([], |row| {
                    let values: Vec<String> = (0..columns)
                        .map(|i| format!("{:?}", row.get_ref(i).expect("column")))
                        .collect();
                    Ok(values.join(" | "))
                })
                .expect("query")
                .collect::<Result<Vec<_>, _>>()
                .expect("rows")
        })
        .collect()
    }

    async fn apply<W: Writes>(writer: &W, batches: &[Changes]) {
        for changes in batches {
            let mut tx = writer.begin_write().await.expect("begin");
            let names = [ResourceName::parse("r").expect("name")];
            let unused = changes.unused.clone();
            let create: Vec<ResourceName> = names.iter().cloned().chain(unused).collect();
            tx.lock_resources(&create, &names, &[]).await.expect("lock");
            tx.flush(changes).await.expect("flush");
            W::commit(tx).await.expect("commit");
        }
    }

    /// The direct writer binds rows one by one; sqlx's writer sends them
    /// through `json_each`. Both must leave the same rows, byte for byte.
    #[tokio::test]
    async fn both_sqlite_writers_flush_a_batch_to_the_same_rows() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (direct, pooled) = (dir.path().join("direct.db"), dir.path().join("pooled.db"));
        let batches = two_batches();

        let backend = SqliteBackend::connect(&format!("sqlite://{}", direct.display()))
            .await
            .expect("connect");
        apply(
            &backend.direct_writer().expect("a file").expect("open"),
            &batches,
        )
        .await;
        let backend = SqliteBackend::connect(&format!("sqlite://{}", pooled.display()))
            .await
            .expect("connect");
        apply(&backend, &batches).await;

        let rows = dump(&direct);
        assert_eq!(rows.len(), 1 + 2 + 1 + 4, "{rows:#?}");
        assert_eq!(rows, dump(&pooled));
    }

    #[tokio::test]
    async fn a_lease_gone_from_the_table_fails_the_direct_flush() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("gone.db").display());
        let backend = SqliteBackend::connect(&url).await.expect("connect");
        let writer = backend.direct_writer().expect("a file").expect("open");
        let [_, mut second] = two_batches();
        second.new_leases.clear();
        let mut tx = writer.begin_write().await.expect("begin");
        let names = [ResourceName::parse("r").expect("name")];
        tx.lock_resources(&names, &names, &[]).await.expect("lock");
        let err = tx.flush(&second).await.expect_err("no such lease");
        assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    }

    #[tokio::test]
    async fn an_existing_database_keeps_its_page_size() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("old.db");
        Connection::open(&path)
            .and_then(|c| c.execute_batch("PRAGMA page_size = 4096; PRAGMA journal_mode = WAL;"))
            .expect("an older database");
        assert_eq!(page_size_and_checkpoint(&path).await, (4096, 10 * 1024));
    }
}

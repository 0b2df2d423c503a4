//! PostgreSQL backend: for production and for several stateless instances
//! sharing one database.
//!
//! Every write locks its resource row with `SELECT … FOR UPDATE` and reads
//! `clock_timestamp()` after the lock (`now()` would be the transaction's
//! start, already in the past after a lock wait). Lease endings are announced
//! with `pg_notify`, delivered on commit, so waiters in every instance wake.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres, QueryBuilder, Transaction};

use super::rows::{
    ClockedLeaseRow, ClockedLoadRow, EventRow, LeaseRow, ResourceDbRow, ValueRow, into_lease,
};
use super::staged::{BatchTx, Changes, Loaded};
use super::types::{
    Event, EventCursor, EventFilter, NewEvent, PruneBatch, ResourceRow, StoredValue,
};
use super::{Backend, ResourceTx, StoreError, StoreResult, Writes};
use crate::domain::{Lease, LeaseId, ResourceName, Token};

/// The NOTIFY channel on which lease endings are announced. The payload is
/// the announcing instance's id, a colon, and the resource name, so an
/// instance can skip its own announcements (it wakes its own waiters
/// directly, after commit).
pub const LEASE_ENDED_CHANNEL: &str = "palisade_lease_ended";

const LEASE_COLUMNS: &str = "lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at, request_id";
const NOW: &str = "date_trunc('milliseconds', clock_timestamp())";
/// A batch's leases (binds $1 to $4): the active leases of the locked
/// resources, the leases named by id and those named by (resource, token).
fn batch_leases() -> String {
    format!(
        "SELECT {LEASE_COLUMNS} FROM leases WHERE resource = ANY($1) AND state = 'active' \
         UNION \
         SELECT {LEASE_COLUMNS} FROM leases WHERE lease_id = ANY($2) \
         UNION \
         SELECT {LEASE_COLUMNS} FROM leases WHERE (resource, token) IN \
           (SELECT r, t FROM unnest($3::text[], $4::bigint[]) AS p(r, t))"
    )
}

/// How long a reader of the global event stream waits at a gap in event ids
/// before deciding it was a rolled-back transaction and not one still
/// committing. Longer than any write transaction may run.
const EVENT_GAP_GRACE: &str = "15 seconds";

#[derive(Clone)]
pub struct PgBackend {
    pool: PgPool,
    /// This process's id in lease-ended announcements.
    instance: Arc<str>,
}

/// Length of an instance id: 16 hex digits.
const INSTANCE_ID_LEN: usize = 16;

impl PgBackend {
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidData(format!("bad PostgreSQL URL: {e}")))?
            .application_name("palisade")
            // Fail fast instead of queueing forever behind a stuck session.
            .options([
                ("statement_timeout", "10s"),
                ("lock_timeout", "5s"),
                ("idle_in_transaction_session_timeout", "30s"),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| StoreError::Unavailable(format!("migration failed: {e}")))?;
        let instance = hex::encode(rand::random::<[u8; INSTANCE_ID_LEN / 2]>()).into();
        Ok(Self { pool, instance })
    }

    /// A listener for [`LEASE_ENDED_CHANNEL`].
    pub async fn lease_ended_listener(&self) -> StoreResult<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(LEASE_ENDED_CHANNEL).await?;
        Ok(listener)
    }

    /// The resource a lease-ended announcement names, unless this instance
    /// sent it. A payload without an instance id (from an older version)
    /// is all resource name.
    pub fn announced_elsewhere<'a>(&self, payload: &'a str) -> Option<&'a str> {
        announced_elsewhere(&self.instance, payload)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

fn announced_elsewhere<'a>(own: &str, payload: &'a str) -> Option<&'a str> {
    match payload.split_at_checked(INSTANCE_ID_LEN) {
        Some((sender, rest)) if rest.starts_with(':') && is_instance_id(sender) => {
            (sender != own).then(|| &rest[1..])
        }
        _ => Some(payload),
    }
}

fn is_instance_id(s: &str) -> bool {
    s.len() == INSTANCE_ID_LEN && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A transaction, and the instance id its announcements carry.
pub struct PgTx(Transaction<'static, Postgres>, Arc<str>);

impl PgTx {
    fn announcement(&self, name: &ResourceName) -> String {
        format!("{}:{}", self.1, name.as_str())
    }
}

impl Writes for PgBackend {
    type Tx = PgTx;
    /// A transaction that has run only `BEGIN` and `SET LOCAL` has no
    /// transaction id and no snapshot: it holds no lock and no vacuum back.
    const BEGINS_AHEAD: bool = true;

    async fn begin_write(&self) -> StoreResult<PgTx> {
        // Every write statement finds its rows through a primary-key or
        // unique index. Generic plans skip planning on every execution, and
        // with sequential scans off they use those indexes whatever the
        // statistics say — a plan cached while the tables were still empty
        // would otherwise keep scanning them as they grow (measured: a fresh
        // database ran at 40% speed until autovacuum analysed it). Sent in
        // the same round trip as BEGIN, for this transaction only.
        let tx = self
            .pool
            .begin_with("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off")
            .await?;
        Ok(PgTx(tx, self.instance.clone()))
    }

    async fn commit(tx: PgTx) -> StoreResult<()> {
        Ok(tx.0.commit().await?)
    }
}

impl Backend for PgBackend {
    async fn begin_read(&self) -> StoreResult<PgTx> {
        Ok(PgTx(
            self.pool
                .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .await?,
            self.instance.clone(),
        ))
    }

    async fn list_events(&self, filter: &EventFilter) -> StoreResult<Vec<Event>> {
        let mut q = QueryBuilder::<Postgres>::new(
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
        let rows: Vec<EventRow<DateTime<Utc>>> = q.build_query_as().fetch_all(&self.pool).await?;
        let mut events = rows
            .into_iter()
            .map(EventRow::into_event)
            .collect::<StoreResult<Vec<_>>>()?;
        // One resource's events commit in id order (its row lock serialises
        // them), but across resources a smaller id may still be committing.
        if filter.resource.is_none() {
            if let Some(last) = events.last() {
                let horizon = self.committed_horizon(filter.after, last.id).await?;
                events.retain(|e| e.id <= horizon);
            }
        }
        Ok(events)
    }

    async fn due_resources(&self, limit: i64) -> StoreResult<Vec<ResourceName>> {
        let names: Vec<String> = sqlx::query_scalar(
            // statement_timestamp(), not the volatile clock_timestamp(): a
            // stable bound is an index range scan, where the volatile one
            // filters every active lease (17 ms with 100,000 of them).
            "SELECT resource FROM leases WHERE state = 'active' \
             AND expires_at <= statement_timestamp() ORDER BY expires_at LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        names
            .into_iter()
            .map(|n| ResourceName::parse(n).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    async fn count_active_leases(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM leases WHERE state = 'active' \
             AND expires_at > statement_timestamp()",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    async fn prune_events_batch(
        &self,
        cutoff: DateTime<Utc>,
        after: Option<EventCursor>,
        limit: i64,
    ) -> StoreResult<PruneBatch> {
        let mut tx = self.pool.begin().await?;
        let mut q = QueryBuilder::<Postgres>::new("SELECT id, at FROM events WHERE at < ");
        q.push_bind(cutoff);
        if let Some(c) = after {
            q.push(" AND (at, id) > (")
                .push_bind(c.at)
                .push(", ")
                .push_bind(c.id)
                .push(")");
        }
        q.push(" ORDER BY at, id LIMIT ").push_bind(limit);
        let batch: Vec<(i64, DateTime<Utc>)> = q.build_query_as().fetch_all(&mut *tx).await?;
        let Some(&(last_id, last_at)) = batch.last() else {
            tx.commit().await?;
            return Ok(PruneBatch {
                scanned_up_to: None,
                scanned: 0,
                deleted: 0,
            });
        };
        let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
        // A resource's newest event stays whatever its age: the log keeps
        // the last thing that happened to every resource.
        let deleted = sqlx::query(
            "DELETE FROM events AS e WHERE e.id = ANY($1) AND e.id < \
             (SELECT max(newest.id) FROM events AS newest WHERE newest.resource = e.resource)",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(PruneBatch {
            scanned_up_to: Some(EventCursor {
                at: last_at,
                id: last_id,
            }),
            scanned: batch.len(),
            deleted,
        })
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn close(&self) {
        super::close_every_connection(&self.pool).await;
    }
}

impl PgBackend {
    /// The highest id up to `upto` below which no event can still appear:
    /// the id just before the first gap in (after, upto] that is younger
    /// than [`EVENT_GAP_GRACE`].
    async fn committed_horizon(&self, after: i64, upto: i64) -> StoreResult<i64> {
        let first_fresh_gap: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT min(prev_id) + 1 FROM ( \
               SELECT id, recorded_at, lag(id) OVER (ORDER BY id) AS prev_id FROM ( \
                 SELECT $1::bigint AS id, NULL::timestamptz AS recorded_at \
                 UNION ALL \
                 (SELECT id, recorded_at FROM events WHERE id > $1 AND id <= $2 ORDER BY id LIMIT 100000) \
               ) AS w \
             ) AS g \
             WHERE id > prev_id + 1 AND recorded_at > clock_timestamp() - interval '{EVENT_GAP_GRACE}'"
        ))
        .bind(after)
        .bind(upto)
        .fetch_one(&self.pool)
        .await?;
        Ok(first_fresh_gap.map_or(upto, |missing| missing - 1))
    }
}

impl ResourceTx for PgTx {
    async fn now(&mut self) -> StoreResult<DateTime<Utc>> {
        Ok(sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&mut *self.0)
            .await?)
    }

    async fn ensure_resource(&mut self, name: &ResourceName) -> StoreResult<()> {
        sqlx::query(&format!(
            "INSERT INTO resources (name, created_at, last_activity_at) VALUES ($1, {NOW}, {NOW}) \
             ON CONFLICT (name) DO NOTHING"
        ))
        .bind(name.as_str())
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn resource(
        &mut self,
        name: &ResourceName,
        for_update: bool,
    ) -> StoreResult<Option<ResourceRow>> {
        let lock = if for_update { " FOR UPDATE" } else { "" };
        let row: Option<ResourceDbRow<DateTime<Utc>>> = sqlx::query_as(&format!(
            "SELECT name, last_token, accepted_token, created_at, last_activity_at \
             FROM resources WHERE name = $1{lock}"
        ))
        .bind(name.as_str())
        .fetch_optional(&mut *self.0)
        .await?;
        row.map(ResourceDbRow::into_row).transpose()
    }

    async fn save_resource(&mut self, row: &ResourceRow) -> StoreResult<()> {
        sqlx::query(
            "UPDATE resources SET last_token = $1, accepted_token = $2, last_activity_at = $3 WHERE name = $4",
        )
        .bind(row.last_token)
        .bind(row.accepted_token)
        .bind(row.last_activity_at)
        .bind(row.name.as_str())
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn active_lease(&mut self, name: &ResourceName) -> StoreResult<Option<Lease>> {
        let row: Option<LeaseRow<DateTime<Utc>>> = sqlx::query_as(&format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE resource = $1 AND state = 'active'"
        ))
        .bind(name.as_str())
        .fetch_optional(&mut *self.0)
        .await?;
        into_lease(row)
    }

    async fn lease_by_id(&mut self, id: &LeaseId) -> StoreResult<Option<Lease>> {
        let row: Option<LeaseRow<DateTime<Utc>>> = sqlx::query_as(&format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE lease_id = $1"
        ))
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
        let row: Option<LeaseRow<DateTime<Utc>>> = sqlx::query_as(&format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE resource = $1 AND token = $2"
        ))
        .bind(name.as_str())
        .bind(token.get())
        .fetch_optional(&mut *self.0)
        .await?;
        into_lease(row)
    }

    /// The `acquired` event is the last row this session inserted into
    /// `events` (`currval`, looked up by primary key, and checked): a
    /// search by resource would read the resource's whole history here.
    async fn insert_lease(&mut self, l: &Lease) -> StoreResult<()> {
        sqlx::query(&format!(
            "INSERT INTO leases ({LEASE_COLUMNS}, acquired_event_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
               (SELECT id FROM events WHERE id = (SELECT currval(pg_get_serial_sequence('events', 'id'))) \
                  AND resource = $2 AND token = $3 AND kind = 'acquired'))"
        ))
        .bind(l.lease_id.as_str())
        .bind(l.resource.as_str())
        .bind(l.token.get())
        .bind(l.holder.as_str())
        .bind(l.state.as_str())
        .bind(l.ttl_ms)
        .bind(l.acquired_at)
        .bind(l.expires_at)
        .bind(l.ended_at)
        .bind(l.request_id.as_ref().map(|r| r.as_str()))
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn update_lease(&mut self, l: &Lease) -> StoreResult<()> {
        sqlx::query("UPDATE leases SET state = $1, ttl_ms = $2, expires_at = $3, ended_at = $4 WHERE lease_id = $5")
            .bind(l.state.as_str())
            .bind(l.ttl_ms)
            .bind(l.expires_at)
            .bind(l.ended_at)
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
            "INSERT INTO fenced_values (resource, value, token, version, updated_at) \
             VALUES ($1, $2::json, $3, 1, $4) \
             ON CONFLICT (resource) DO UPDATE SET value = excluded.value, token = excluded.token, \
             version = fenced_values.version + 1, updated_at = excluded.updated_at \
             RETURNING version",
        )
        .bind(name.as_str())
        .bind(json)
        .bind(token.get())
        .bind(now)
        .fetch_one(&mut *self.0)
        .await?;
        Ok(version)
    }

    async fn value(&mut self, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
        let row: Option<ValueRow<DateTime<Utc>>> = sqlx::query_as(
            "SELECT value::text AS value, token, version, updated_at FROM fenced_values WHERE resource = $1",
        )
        .bind(name.as_str())
        .fetch_optional(&mut *self.0)
        .await?;
        row.map(ValueRow::into_value).transpose()
    }

    async fn insert_event(&mut self, e: &NewEvent) -> StoreResult<()> {
        sqlx::query("INSERT INTO events (at, kind, resource, token, holder, detail) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(e.at)
            .bind(e.kind.as_str())
            .bind(e.resource.as_str())
            .bind(e.token.map(Token::get))
            .bind(e.holder.as_ref().map(|h| h.as_str()))
            .bind(sqlx::types::Json(&e.detail))
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn announce_lease_ended(&mut self, name: &ResourceName) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LEASE_ENDED_CHANNEL)
            .bind(self.announcement(name))
            .execute(&mut *self.0)
            .await?;
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

/// A locked resource row, and whether this transaction inserted it (rather
/// than finding and locking it).
#[derive(sqlx::FromRow)]
struct CreatedResourceRow {
    #[sqlx(flatten)]
    row: ResourceDbRow<DateTime<Utc>>,
    inserted: bool,
}

/// A whole batch's writes in one statement (see `BatchTx::flush`). Event ids
/// are handed out in the order the rows are inserted, so a batch's events
/// keep the order they happened in. A new lease row keeps its `acquired`
/// event's id, taken from the rows `evt` returns (the statement's parts
/// share one snapshot, so the table would not show them yet).
/// Lease-ended notifications are delivered on commit.
///
/// A lease ending and a new lease on the same resource must be written in
/// that order: the one-active-lease index is checked row by row, and an
/// old active row counts until its update has been applied (then, updated
/// by this transaction, it no longer does). The order of a statement's
/// data-modifying CTEs is otherwise unspecified, so the new leases are
/// made to depend on the updates: their rows pass a condition on the count
/// of `upd`'s rows (always true), which the executor does compute, running
/// every update, before it produces the first row to insert. (This is how
/// PostgreSQL's executor evaluates such a condition, not an order SQL
/// promises. Without the condition `upd` also ran first, because it is
/// written first; the condition makes that independent of the order the
/// CTEs are written in. The tests of a handoff in one batch fail if the
/// insert runs first.)
const FLUSH: &str = "\
WITH res AS ( \
  UPDATE resources AS r SET last_token = u.last_token, accepted_token = u.accepted_token, \
    last_activity_at = u.at \
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::timestamptz[]) \
    AS u(name, last_token, accepted_token, at) \
  WHERE r.name = u.name RETURNING 1), \
upd AS ( \
  UPDATE leases AS l SET state = u.state, ttl_ms = u.ttl_ms, expires_at = u.expires_at, \
    ended_at = u.ended_at \
  FROM unnest($5::text[], $6::text[], $7::bigint[], $8::timestamptz[], $9::timestamptz[]) \
    AS u(lease_id, state, ttl_ms, expires_at, ended_at) \
  WHERE l.lease_id = u.lease_id RETURNING 1), \
evt AS ( \
  INSERT INTO events (at, kind, resource, token, holder, detail) \
  SELECT at, kind, resource, token, holder, detail::jsonb FROM unnest($25::timestamptz[], \
    $26::text[], $27::text[], $28::bigint[], $29::text[], $30::text[]) \
    WITH ORDINALITY AS e(at, kind, resource, token, holder, detail, n) \
  ORDER BY n RETURNING id, kind, resource, token), \
ins AS ( \
  INSERT INTO leases (lease_id, resource, token, holder, state, ttl_ms, acquired_at, \
    expires_at, ended_at, request_id, acquired_event_id) \
  SELECT u.*, a.id FROM unnest($10::text[], $11::text[], $12::bigint[], $13::text[], \
    $14::text[], $15::bigint[], $16::timestamptz[], $17::timestamptz[], $18::timestamptz[], \
    $19::text[]) AS u(lease_id, resource, token, holder, state, ttl_ms, acquired_at, \
      expires_at, ended_at, request_id) \
  LEFT JOIN evt AS a ON a.kind = 'acquired' AND a.resource = u.resource \
    AND a.token = u.token \
  WHERE (SELECT count(*) FROM upd) >= 0 \
  RETURNING 1), \
val AS ( \
  INSERT INTO fenced_values (resource, value, token, version, updated_at) \
  SELECT r, v::json, t, n, at FROM unnest($20::text[], $21::text[], $22::bigint[], \
    $23::bigint[], $24::timestamptz[]) AS u(r, v, t, n, at) \
  ON CONFLICT (resource) DO UPDATE SET value = excluded.value, token = excluded.token, \
    version = excluded.version, updated_at = excluded.updated_at \
  RETURNING 1), \
del AS (DELETE FROM resources WHERE name = ANY($31) RETURNING 1) \
SELECT (SELECT count(*) FROM upd) AS updated, \
  (SELECT count(pg_notify($32, n)) FROM unnest($33::text[]) AS n) AS notified";

fn names(list: &[ResourceName]) -> Vec<&str> {
    list.iter().map(ResourceName::as_str).collect()
}

/// Multi-row statements: each step of a batch is one round trip, whatever
/// the number of requests in it.
impl BatchTx for PgTx {
    async fn lock_resources(
        &mut self,
        create: &[ResourceName],
        lock: &[ResourceName],
        lease_ids: &[LeaseId],
    ) -> StoreResult<(Vec<ResourceRow>, Vec<ResourceName>)> {
        // Existing rows first, locked in the order the sort emits them:
        // every batch takes its locks in one global order. One array of
        // names, so the lookup is an index scan (an `OR` with a subquery
        // would scan the whole table). Then, in the same statement, the
        // acquires' resources that were not found (rare once a resource has
        // been used): created, or locked if a concurrent batch created one
        // first. Waiting there on a concurrent creator while holding locks
        // can, in a rare race, deadlock; PostgreSQL then aborts one
        // transaction and its batch runs again on the slow path.
        let ids: Vec<&str> = lease_ids.iter().map(LeaseId::as_str).collect();
        let rows: Vec<CreatedResourceRow> = sqlx::query_as(&format!(
            "WITH locked AS ( \
               SELECT name, last_token, accepted_token, created_at, last_activity_at \
               FROM resources WHERE name = ANY($1::text[] || \
                 ARRAY(SELECT resource FROM leases WHERE lease_id = ANY($2))) \
               ORDER BY name FOR UPDATE), \
             created AS ( \
               INSERT INTO resources (name, created_at, last_activity_at) \
               SELECT n, {NOW}, {NOW} FROM unnest($3::text[]) AS n \
               WHERE n NOT IN (SELECT name FROM locked) ORDER BY n \
               ON CONFLICT (name) DO UPDATE SET name = excluded.name \
               RETURNING name, last_token, accepted_token, created_at, last_activity_at, \
                 (xmax = 0) AS inserted) \
             SELECT *, false AS inserted FROM locked UNION ALL SELECT * FROM created"
        ))
        .bind(names(lock))
        .bind(&ids)
        .bind(names(create))
        .fetch_all(&mut *self.0)
        .await?;
        let mut locked = Vec::with_capacity(rows.len());
        let mut created = Vec::new();
        for CreatedResourceRow { row, inserted } in rows {
            let row = row.into_row()?;
            if inserted {
                created.push(row.name.clone());
            }
            locked.push(row);
        }
        Ok((locked, created))
    }

    async fn delete_resources(&mut self, resources: &[ResourceName]) -> StoreResult<()> {
        sqlx::query("DELETE FROM resources WHERE name = ANY($1)")
            .bind(names(resources))
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn load_leases(
        &mut self,
        resources: &[ResourceName],
        ids: &[LeaseId],
        tokens: &[(ResourceName, Token)],
    ) -> StoreResult<(DateTime<Utc>, Vec<Lease>)> {
        let ids: Vec<&str> = ids.iter().map(LeaseId::as_str).collect();
        let token_names: Vec<&str> = tokens.iter().map(|(n, _)| n.as_str()).collect();
        let token_values: Vec<i64> = tokens.iter().map(|(_, t)| t.get()).collect();
        // One row even when no lease matches, to carry the clock.
        let rows: Vec<ClockedLeaseRow<DateTime<Utc>>> = sqlx::query_as(&format!(
            "WITH clock AS MATERIALIZED (SELECT {NOW} AS now) \
             SELECT clock.now, l.* FROM clock LEFT JOIN ({}) AS l ON true",
            batch_leases()
        ))
        .bind(names(resources))
        .bind(&ids)
        .bind(&token_names)
        .bind(&token_values)
        .fetch_all(&mut *self.0)
        .await?;
        ClockedLeaseRow::split(rows)
    }

    /// The leases and the fenced values in one statement (one round trip
    /// less for every batch with a fenced write): both are plain reads
    /// after the lock, so one snapshot sees every commit the lock waited for.
    async fn load(
        &mut self,
        resources: &[ResourceName],
        ids: &[LeaseId],
        tokens: &[(ResourceName, Token)],
        values: &[ResourceName],
    ) -> StoreResult<Loaded> {
        if values.is_empty() {
            let (now, leases) = self.load_leases(resources, ids, tokens).await?;
            return Ok(Loaded {
                now,
                leases,
                values: Vec::new(),
            });
        }
        let ids: Vec<&str> = ids.iter().map(LeaseId::as_str).collect();
        let token_names: Vec<&str> = tokens.iter().map(|(n, _)| n.as_str()).collect();
        let token_values: Vec<i64> = tokens.iter().map(|(_, t)| t.get()).collect();
        // The leases as in `load_leases` (at least one row, for the clock),
        // then a row per existing value with the lease columns empty.
        let rows: Vec<ClockedLoadRow> = sqlx::query_as(&format!(
            "WITH clock AS MATERIALIZED (SELECT {NOW} AS now) \
             SELECT clock.now, l.*, NULL::text AS value_of, NULL::text AS value, \
               NULL::bigint AS value_token, NULL::bigint AS version, NULL::timestamptz AS updated_at \
             FROM clock LEFT JOIN ({leases}) AS l ON true \
             UNION ALL \
             SELECT clock.now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
               v.resource, v.value::text, v.token, v.version, v.updated_at \
             FROM clock JOIN fenced_values AS v ON v.resource = ANY($5)",
            leases = batch_leases()
        ))
        .bind(names(resources))
        .bind(&ids)
        .bind(&token_names)
        .bind(&token_values)
        .bind(names(values))
        .fetch_all(&mut *self.0)
        .await?;
        let mut lease_rows = Vec::with_capacity(rows.len());
        let mut values = Vec::new();
        for row in rows {
            match row.into_value_or_lease()? {
                Ok(value) => values.push(value.into_named_value()?),
                Err(lease) => lease_rows.push(lease),
            }
        }
        let (now, leases) = ClockedLeaseRow::split(lease_rows)?;
        Ok(Loaded {
            now,
            leases,
            values,
        })
    }

    async fn flush(&mut self, changes: &Changes) -> StoreResult<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let rs = &changes.resources;
        let ns = &changes.new_leases;
        let vs = &changes.values;
        let es = &changes.events;
        let ls = &changes.updated_leases;
        let (updated, _notified): (i64, i64) = sqlx::query_as(FLUSH)
            .bind(rs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>())
            .bind(rs.iter().map(|r| r.last_token).collect::<Vec<_>>())
            .bind(rs.iter().map(|r| r.accepted_token).collect::<Vec<_>>())
            .bind(rs.iter().map(|r| r.last_activity_at).collect::<Vec<_>>())
            .bind(ls.iter().map(|l| l.lease_id.as_str()).collect::<Vec<_>>())
            .bind(ls.iter().map(|l| l.state.as_str()).collect::<Vec<_>>())
            .bind(ls.iter().map(|l| l.ttl_ms).collect::<Vec<_>>())
            .bind(ls.iter().map(|l| l.expires_at).collect::<Vec<_>>())
            .bind(ls.iter().map(|l| l.ended_at).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.lease_id.as_str()).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.resource.as_str()).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.token.get()).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.holder.as_str()).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.state.as_str()).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.ttl_ms).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.acquired_at).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.expires_at).collect::<Vec<_>>())
            .bind(ns.iter().map(|l| l.ended_at).collect::<Vec<_>>())
            .bind(
                ns.iter()
                    .map(|l| l.request_id.as_ref().map(|r| r.as_str()))
                    .collect::<Vec<_>>(),
            )
            .bind(vs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>())
            .bind(vs.iter().map(|(_, v)| v.json.as_str()).collect::<Vec<_>>())
            .bind(vs.iter().map(|(_, v)| v.token.get()).collect::<Vec<_>>())
            .bind(vs.iter().map(|(_, v)| v.version).collect::<Vec<_>>())
            .bind(vs.iter().map(|(_, v)| v.updated_at).collect::<Vec<_>>())
            .bind(es.iter().map(|e| e.at).collect::<Vec<_>>())
            .bind(es.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>())
            .bind(es.iter().map(|e| e.resource.as_str()).collect::<Vec<_>>())
            .bind(
                es.iter()
                    .map(|e| e.token.map(Token::get))
                    .collect::<Vec<_>>(),
            )
            .bind(
                es.iter()
                    .map(|e| e.holder.as_ref().map(|h| h.as_str()))
                    .collect::<Vec<_>>(),
            )
            .bind(es.iter().map(|e| e.detail.to_string()).collect::<Vec<_>>())
            .bind(names(&changes.unused))
            .bind(LEASE_ENDED_CHANNEL)
            .bind(
                changes
                    .ended
                    .iter()
                    .map(|n| self.announcement(n))
                    .collect::<Vec<_>>(),
            )
            .fetch_one(&mut *self.0)
            .await?;
        let updated = u64::try_from(updated).unwrap_or(0);
        let expected = changes.updated_leases.len() as u64;
        if updated != expected {
            return Err(StoreError::Conflict(format!(
                "updated {updated} of {expected} leases"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::announced_elsewhere;

    #[test]
    fn own_announcements_are_skipped_and_others_name_their_resource() {
        let me = "00112233aabbccdd";
        assert_eq!(
            announced_elsewhere(me, "00112233aabbccdd:reports/daily"),
            None
        );
        assert_eq!(
            announced_elsewhere(me, "ffeeddcc99887766:reports/daily"),
            Some("reports/daily")
        );
        // A name may itself contain colons.
        assert_eq!(announced_elsewhere(me, "ffeeddcc99887766:a:b"), Some("a:b"));
        // From an older version: the whole payload is the resource.
        assert_eq!(announced_elsewhere(me, "invoices"), Some("invoices"));
        assert_eq!(
            announced_elsewhere(me, "not-an-instance!:x"),
            Some("not-an-instance!:x")
        );
    }
}

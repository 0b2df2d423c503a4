//! Read queries for the web UI: resource lists, lease timelines, event
//! pages and the overview's counts. Read-only and bounded: every query has a
//! limit and runs on an index, so pages stay fast with millions of events.
//!
//! Nothing here ever selects a `lease_id`: a lease is shown publicly as
//! (resource, token) only.

mod postgres;
mod sqlite;

use std::future::Future;

use chrono::{DateTime, Utc};

use super::rows::DbTime;
use super::{Event, Store, StoreError, StoreResult};
use crate::domain::{EventKind, LeaseState};

/// A lease as anyone may see it: no secret id.
#[derive(Debug, Clone, PartialEq)]
pub struct PublicLease {
    pub resource: String,
    pub token: i64,
    pub holder: String,
    pub state: LeaseState,
    pub ttl_ms: i64,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

impl PublicLease {
    /// The state by the given clock: an active lease past its deadline is
    /// expired even before the sweeper records it.
    pub fn state_at(&self, now: DateTime<Utc>) -> LeaseState {
        if self.state.is_active() && self.expires_at <= now {
            LeaseState::Expired
        } else {
            self.state
        }
    }

    /// When the lease ended as of `now`, if it has.
    pub fn ended_at_as_of(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.state_at(now) {
            LeaseState::Active => None,
            LeaseState::Expired if self.state.is_active() => Some(self.expires_at),
            _ => self.ended_at,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeldFilter {
    #[default]
    Any,
    Held,
    Free,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResourceOrder {
    /// Most recent activity first.
    #[default]
    Activity,
    /// Least recent activity first.
    ActivityAsc,
    Name,
}

#[derive(Debug, Clone, Default)]
pub struct ResourceQuery {
    pub prefix: Option<String>,
    pub held: HeldFilter,
    pub order: ResourceOrder,
    pub offset: i64,
    pub limit: i64,
}

#[derive(Debug, Clone)]
pub struct ResourceSummary {
    pub name: String,
    pub last_token: i64,
    pub accepted_token: i64,
    pub last_activity_at: DateTime<Utc>,
    /// The live lease (active and not past its deadline), if any.
    pub holder: Option<PublicLease>,
}

#[derive(Debug, Clone)]
pub struct ResourcePage {
    pub rows: Vec<ResourceSummary>,
    /// How many resources match the filter, over all pages.
    pub total: i64,
    pub now: DateTime<Utc>,
}

/// A page of the event log, newest first.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub resource: Option<String>,
    pub resource_prefix: Option<String>,
    /// Empty: every kind.
    pub kinds: Vec<EventKind>,
    pub holder: Option<String>,
    pub token: Option<i64>,
    /// Only events with an id below this (paging back).
    pub before: Option<i64>,
    pub limit: i64,
}

/// Counts per minute over the last hour for one kind, oldest minute first.
#[derive(Debug, Clone)]
pub struct KindSeries {
    pub kind: EventKind,
    pub per_minute: Vec<i64>,
}

#[derive(Debug, Clone)]
pub struct Contended {
    pub resource: String,
    pub acquisitions: i64,
    pub holders: i64,
    pub expiries: i64,
    pub rejections: i64,
}

#[derive(Debug, Clone)]
pub struct Overview {
    pub now: DateTime<Utc>,
    pub active_leases: i64,
    pub resources: i64,
    /// Acquisitions, expiries and stale-write rejections.
    pub series: Vec<KindSeries>,
    pub contended: Vec<Contended>,
    pub latest_rejections: Vec<Event>,
}

/// The kinds the overview charts, in display order.
pub const OVERVIEW_KINDS: [EventKind; 3] = [
    EventKind::Acquired,
    EventKind::Expired,
    EventKind::WriteRejected,
];

/// How many minutes the overview covers.
pub const OVERVIEW_MINUTES: i64 = 60;

/// How far apart in time two events can be recorded out of id order. A
/// resource's events are written under its lock, so their ids follow
/// their times; across resources, PostgreSQL hands out ids at insert
/// while `at` is the batch's clock read before it, so a long transaction
/// (or a clock stepped back) can put a later id on an earlier time. A
/// window's events are looked for between the last event recorded this
/// long before the window and the first one this long after it.
pub const WINDOW_ID_SLACK_MS: i64 = 10 * 60 * 1000;

/// The events kept in the `(resource, token, id)` index, exactly as its
/// `WHERE` (migration 0007) says, so that a query with this term can use
/// it. A lease's other events (renewals, accepted writes, its end) all
/// happen while it is the resource's newest lease and are written under
/// the resource's lock, so they lie between its own `acquired` event and
/// the next token's in id order (each lease row keeps its `acquired`
/// event's id): a lease's story is read there through `(resource, id)`,
/// plus its rejections, which can come at any time, through this index.
/// One index insert fewer for every other event.
pub const TOKEN_INDEXED_KINDS: &str = "kind = 'write_rejected'";

/// The UI's read queries, one implementation per engine.
pub trait UiReads: Send + Sync {
    fn db_now(&self) -> impl Future<Output = StoreResult<DateTime<Utc>>> + Send;
    fn list_resources(
        &self,
        q: &ResourceQuery,
    ) -> impl Future<Output = StoreResult<ResourcePage>> + Send;
    /// Leases of `resource` overlapping [from, to), latest first, at most
    /// `limit`.
    fn leases_in_window(
        &self,
        resource: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<PublicLease>>> + Send;
    fn lease_by_token(
        &self,
        resource: &str,
        token: i64,
    ) -> impl Future<Output = StoreResult<Option<PublicLease>>> + Send;
    /// Events of `resource` with `at` in [from, to), of the given kinds,
    /// oldest first, at most `limit`. Read through the `(resource, id)`
    /// index between id bounds found by time (see [`WINDOW_ID_SLACK_MS`]):
    /// a `(resource, at)` index would cost every event write one more
    /// B-tree page for this page alone.
    fn events_in_window(
        &self,
        resource: &str,
        kinds: &[EventKind],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<Event>>> + Send;
    /// Newest first. With both a resource and a token (a lease's story),
    /// read as [`TOKEN_INDEXED_KINDS`] says.
    fn query_events(&self, q: &EventQuery) -> impl Future<Output = StoreResult<Vec<Event>>> + Send;
    fn overview(&self, contended_limit: i64) -> impl Future<Output = StoreResult<Overview>> + Send;
}

/// Per-minute buckets from (kind, minute index, count) rows.
fn series_from_counts(rows: impl IntoIterator<Item = (String, i64, i64)>) -> Vec<KindSeries> {
    let mut series: Vec<KindSeries> = OVERVIEW_KINDS
        .iter()
        .map(|&kind| KindSeries {
            kind,
            per_minute: vec![0; OVERVIEW_MINUTES as usize],
        })
        .collect();
    for (kind, minute, count) in rows {
        let Some(s) = series.iter_mut().find(|s| s.kind.as_str() == kind) else {
            continue;
        };
        if let Some(slot) = usize::try_from(minute)
            .ok()
            .and_then(|m| s.per_minute.get_mut(m))
        {
            *slot += count;
        }
    }
    series
}

#[derive(sqlx::FromRow)]
struct PublicLeaseRow<T> {
    resource: String,
    token: i64,
    holder: String,
    state: String,
    ttl_ms: i64,
    acquired_at: T,
    expires_at: T,
    ended_at: Option<T>,
}

impl<T: DbTime> PublicLeaseRow<T> {
    fn into_lease(self) -> StoreResult<PublicLease> {
        Ok(PublicLease {
            resource: self.resource,
            token: self.token,
            holder: self.holder,
            state: self
                .state
                .parse()
                .map_err(|e: String| StoreError::Corrupt(e))?,
            ttl_ms: self.ttl_ms,
            acquired_at: self.acquired_at.to_utc()?,
            expires_at: self.expires_at.to_utc()?,
            ended_at: self.ended_at.map(DbTime::to_utc).transpose()?,
        })
    }
}

#[derive(sqlx::FromRow)]
struct ResourceSummaryRow<T> {
    name: String,
    last_token: i64,
    accepted_token: i64,
    last_activity_at: T,
    h_token: Option<i64>,
    h_holder: Option<String>,
    h_ttl_ms: Option<i64>,
    h_acquired_at: Option<T>,
    h_expires_at: Option<T>,
}

impl<T: DbTime> ResourceSummaryRow<T> {
    fn into_summary(self) -> StoreResult<ResourceSummary> {
        let holder = match (
            self.h_token,
            self.h_holder,
            self.h_ttl_ms,
            self.h_acquired_at,
            self.h_expires_at,
        ) {
            (Some(token), Some(holder), Some(ttl_ms), Some(acquired_at), Some(expires_at)) => {
                Some(PublicLease {
                    resource: self.name.clone(),
                    token,
                    holder,
                    state: LeaseState::Active,
                    ttl_ms,
                    acquired_at: acquired_at.to_utc()?,
                    expires_at: expires_at.to_utc()?,
                    ended_at: None,
                })
            }
            _ => None,
        };
        Ok(ResourceSummary {
            name: self.name,
            last_token: self.last_token,
            accepted_token: self.accepted_token,
            last_activity_at: self.last_activity_at.to_utc()?,
            holder,
        })
    }
}

/// Upper bound for paging: the UI never asks for more than this at once.
pub const MAX_PAGE: i64 = 500;

macro_rules! with_ui_backend {
    ($store:expr, $b:ident => $body:expr) => {
        match $store {
            Store::Sqlite($b) => $body,
            Store::Postgres($b) => $body,
        }
    };
}

impl Store {
    pub async fn db_now(&self) -> StoreResult<DateTime<Utc>> {
        with_ui_backend!(self, b => b.db_now().await)
    }

    pub async fn list_resources(&self, q: &ResourceQuery) -> StoreResult<ResourcePage> {
        with_ui_backend!(self, b => b.list_resources(q).await)
    }

    pub async fn leases_in_window(
        &self,
        resource: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<PublicLease>> {
        with_ui_backend!(self, b => b.leases_in_window(resource, from, to, limit).await)
    }

    pub async fn public_lease(
        &self,
        resource: &str,
        token: i64,
    ) -> StoreResult<Option<PublicLease>> {
        with_ui_backend!(self, b => b.lease_by_token(resource, token).await)
    }

    pub async fn events_in_window(
        &self,
        resource: &str,
        kinds: &[EventKind],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<Event>> {
        with_ui_backend!(self, b => b.events_in_window(resource, kinds, from, to, limit).await)
    }

    pub async fn query_events(&self, q: &EventQuery) -> StoreResult<Vec<Event>> {
        with_ui_backend!(self, b => b.query_events(q).await)
    }

    pub async fn overview(&self, contended_limit: i64) -> StoreResult<Overview> {
        with_ui_backend!(self, b => b.overview(contended_limit).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Holder, Lease, LeaseId, ResourceName, Token};
    use crate::store::{NewEvent, ResourceTx, Writes};
    use chrono::{Duration, TimeZone};

    /// Records `events` (resource, kind, at), in this order, in one
    /// transaction: ids follow the order given, not the times.
    async fn record<W: Writes>(writes: &W, events: &[(&str, EventKind, DateTime<Utc>)]) {
        let mut tx = writes.begin_write().await.expect("begin");
        for (i, (resource, kind, at)) in events.iter().enumerate() {
            let resource = ResourceName::parse(*resource).expect("name");
            tx.ensure_resource(&resource).await.expect("resource");
            let event = NewEvent {
                at: *at,
                kind: *kind,
                resource,
                token: Some(Token::from_stored(1)),
                holder: None,
                detail: serde_json::json!({ "n": i }),
            };
            tx.insert_event(&event).await.expect("event");
        }
        W::commit(tx).await.expect("commit");
    }

    /// A window holds exactly the resource's events with `at` in [from,
    /// to), of the kinds asked for, oldest first, up to the limit — also
    /// events recorded out of time order near its ends.
    async fn a_window_holds_exactly_its_events(store: Store) {
        let from = Utc
            .with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
            .single()
            .expect("time");
        let to = from + Duration::hours(1);
        let ms = Duration::milliseconds;
        let renewed = EventKind::Renewed;
        let accepted = EventKind::WriteAccepted;
        // Ids out of time order near both ends: only the slack finds 1
        // (recorded before 4) and 8 (recorded after 6 and 7).
        let events = [
            ("w/a", renewed, from - Duration::minutes(20)), // 0: before
            ("w/a", renewed, from),                         // 1: in
            ("w/b", renewed, from + ms(10)),                // 2: other resource
            ("w/a", EventKind::Released, from + ms(20)),    // 3: in, other kind
            ("w/a", renewed, from - ms(1)),                 // 4: before
            ("w/a", accepted, from + Duration::minutes(30)), // 5: in
            ("w/a", renewed, to),                           // 6: after (exclusive)
            ("w/b", renewed, to + Duration::minutes(5)),    // 7: other resource
            ("w/a", renewed, to - ms(1)),                   // 8: in
            ("w/a", renewed, to + Duration::minutes(20)),   // 9: after
        ];
        record_on(&store, &events).await;
        let detail = |e: &Event| e.detail["n"].as_i64().expect("n");
        let window = store
            .events_in_window("w/a", &[renewed, accepted], from, to, 10)
            .await
            .expect("window");
        assert_eq!(window.iter().map(detail).collect::<Vec<_>>(), [1, 5, 8]);
        let first_two = store
            .events_in_window("w/a", &[renewed, accepted], from, to, 2)
            .await
            .expect("window");
        assert_eq!(first_two.iter().map(detail).collect::<Vec<_>>(), [1, 5]);
        let any_kind = store
            .events_in_window("w/a", &[], from, to, 10)
            .await
            .expect("window");
        assert_eq!(
            any_kind.iter().map(detail).collect::<Vec<_>>(),
            [1, 3, 5, 8]
        );
        let empty = store
            .events_in_window(
                "w/a",
                &[],
                to + Duration::hours(1),
                to + Duration::hours(2),
                10,
            )
            .await
            .expect("window");
        assert!(empty.is_empty(), "{empty:?}");
        store.close().await;
    }

    async fn record_on(store: &Store, events: &[(&str, EventKind, DateTime<Utc>)]) {
        match store {
            Store::Sqlite(b) => match b.direct_writer() {
                Some(writer) => record(&writer.expect("writer"), events).await,
                None => record(b, events).await,
            },
            Store::Postgres(b) => record(b, events).await,
        }
    }

    /// Records `events` (resource, kind, token), in this order, in one
    /// transaction, all at the database's clock; an `acquired` event also
    /// records its (ended) lease.
    async fn record_tokens(store: &Store, events: &[(&str, EventKind, i64)]) {
        async fn on<W: Writes>(writes: &W, events: &[(&str, EventKind, i64)]) {
            let mut tx = writes.begin_write().await.expect("begin");
            let at = tx.now().await.expect("now");
            for (i, (resource, kind, token)) in events.iter().enumerate() {
                let resource = ResourceName::parse(*resource).expect("name");
                tx.ensure_resource(&resource).await.expect("resource");
                let event = NewEvent {
                    at,
                    kind: *kind,
                    resource: resource.clone(),
                    token: Some(Token::from_stored(*token)),
                    holder: None,
                    detail: serde_json::json!({ "n": i }),
                };
                tx.insert_event(&event).await.expect("event");
                if *kind == EventKind::Acquired {
                    let lease = Lease {
                        lease_id: LeaseId::generate(),
                        resource,
                        holder: Holder::parse("story").expect("holder"),
                        token: Token::from_stored(*token),
                        state: LeaseState::Released,
                        ttl_ms: 1_000,
                        acquired_at: at,
                        expires_at: at,
                        ended_at: Some(at),
                        request_id: None,
                    };
                    tx.insert_lease(&lease).await.expect("lease");
                }
            }
            W::commit(tx).await.expect("commit");
        }
        match store {
            Store::Sqlite(b) => match b.direct_writer() {
                Some(writer) => on(&writer.expect("writer"), events).await,
                None => on(b, events).await,
            },
            Store::Postgres(b) => on(b, events).await,
        }
    }

    /// A lease's story (a resource and a token) holds exactly that token's
    /// events, newest first: those between its `acquired` event and the
    /// next token's, and its rejections wherever they come, also a
    /// rejection of a token before it was issued, and a token never issued.
    async fn a_lease_story_holds_exactly_its_tokens_events(store: Store) {
        use EventKind::*;
        let events = [
            ("s/a", Acquired, 1),      // 0
            ("s/a", WriteRejected, 2), // 1: token 2 before it was issued
            ("s/a", Renewed, 1),       // 2
            ("s/a", WriteAccepted, 1), // 3
            ("s/a", Released, 1),      // 4
            ("s/a", Acquired, 2),      // 5
            ("s/a", Renewed, 2),       // 6
            ("s/a", WriteRejected, 1), // 7: the zombie, after its successor
            ("s/b", Acquired, 1),      // 8: another resource
            ("s/a", Released, 2),      // 9
            ("s/a", Acquired, 3),      // 10
            ("s/a", WriteRejected, 2), // 11
            ("s/a", WriteRejected, 9), // 12: never issued
        ];
        record_tokens(&store, &events).await;
        let story = |token: i64, kinds: Vec<EventKind>, before: Option<i64>, limit: i64| {
            let store = &store;
            async move {
                store
                    .query_events(&EventQuery {
                        resource: Some("s/a".into()),
                        token: Some(token),
                        kinds,
                        before,
                        limit,
                        ..EventQuery::default()
                    })
                    .await
                    .expect("story")
            }
        };
        let n = |events: &[Event]| -> Vec<i64> {
            events
                .iter()
                .map(|e| e.detail["n"].as_i64().expect("n"))
                .collect()
        };
        let first = story(1, vec![], None, 50).await;
        assert_eq!(n(&first), [7, 4, 3, 2, 0]);
        assert_eq!(n(&story(2, vec![], None, 50).await), [11, 9, 6, 5, 1]);
        assert_eq!(n(&story(3, vec![], None, 50).await), [10]);
        assert_eq!(n(&story(9, vec![], None, 50).await), [12]);
        assert_eq!(n(&story(4, vec![], None, 50).await), Vec::<i64>::new());
        assert_eq!(n(&story(1, vec![], None, 2).await), [7, 4]);
        assert_eq!(n(&story(1, vec![], Some(first[1].id), 50).await), [3, 2, 0]);
        assert_eq!(
            n(&story(2, vec![WriteRejected, Acquired], None, 50).await),
            [11, 5, 1]
        );
        assert_eq!(n(&story(1, vec![Renewed], None, 50).await), [2]);
        assert_eq!(crate::store::lease_links(&store).await, (4, vec![]));
        store.close().await;
    }

    /// Migrations 0001–0006 of `engine` (its directory under migrations/):
    /// the schema before lease rows kept their `acquired` event's id.
    async fn migrator_before_0007(engine: &str) -> (tempfile::TempDir, sqlx::migrate::Migrator) {
        let dir = tempfile::tempdir().expect("temp dir");
        let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(engine);
        for entry in std::fs::read_dir(&all).expect("migrations") {
            let path = entry.expect("entry").path();
            let name = path.file_name().expect("name").to_owned();
            if name.to_str().expect("utf-8") < "0007" {
                std::fs::copy(&path, dir.path().join(&name)).expect("copy");
            }
        }
        let migrator = sqlx::migrate::Migrator::new(dir.path())
            .await
            .expect("migrator");
        (dir, migrator)
    }

    /// Rows as a server before migration 0007 left them: two resources,
    /// three leases of `m/a` and their events, and a lease of `m/b` whose
    /// `acquired` event was pruned. `{now}` and `{later}` are the engine's
    /// clock now and a minute on.
    fn rows_before_0007(now: &str, later: &str) -> Vec<String> {
        let ids: Vec<LeaseId> = (0..4).map(|_| LeaseId::generate()).collect();
        let lease = |i: usize, resource: &str, token: i64, state: &str| {
            let (expires, ended) = if state == "active" {
                (later, "NULL")
            } else {
                (now, now)
            };
            format!(
                "INSERT INTO leases (lease_id, resource, token, holder, state, ttl_ms, \
                 acquired_at, expires_at, ended_at) VALUES ('{}', '{resource}', {token}, 'h', \
                 '{state}', 60000, {now}, {expires}, {ended})",
                ids[i].as_str()
            )
        };
        let mut rows = vec![format!(
            "INSERT INTO resources (name, last_token, accepted_token, created_at, \
             last_activity_at) VALUES ('m/a', 3, 0, {now}, {now}), ('m/b', 1, 0, {now}, {now})"
        )];
        rows.extend([
            lease(0, "m/a", 1, "released"),
            lease(1, "m/a", 2, "released"),
            lease(2, "m/a", 3, "active"),
            lease(3, "m/b", 1, "released"),
        ]);
        let events = [
            ("m/a", "acquired", 1),       // 0
            ("m/a", "write_rejected", 2), // 1: before it was issued
            ("m/a", "renewed", 1),        // 2
            ("m/a", "released", 1),       // 3
            ("m/a", "acquired", 2),       // 4
            ("m/a", "write_rejected", 1), // 5
            ("m/a", "released", 2),       // 6
            ("m/a", "acquired", 3),       // 7
            ("m/b", "released", 1),       // 8: its acquisition was pruned
        ];
        rows.extend(
            events
                .iter()
                .enumerate()
                .map(|(n, (resource, kind, token))| {
                    format!(
                        "INSERT INTO events (at, kind, resource, token, holder, detail) VALUES \
                 ({now}, '{kind}', '{resource}', {token}, 'h', '{{\"n\": {n}}}')"
                    )
                }),
        );
        rows
    }

    /// Migration 0007 links each existing lease row to its `acquired`
    /// event (none where it was pruned), moves the token index to the
    /// rejections alone, and every lease's story reads as before; leases
    /// granted afterwards are linked as they are written.
    async fn an_upgrade_links_existing_leases(url: &str) {
        let store = Store::connect(url).await.expect("upgrade");
        assert_eq!(
            crate::store::lease_links(&store).await,
            (4, vec![("m/b".to_owned(), 1)])
        );
        let story = |resource: &'static str, token: i64| {
            let store = &store;
            async move {
                let events = store
                    .query_events(&EventQuery {
                        resource: Some(resource.into()),
                        token: Some(token),
                        limit: 50,
                        ..EventQuery::default()
                    })
                    .await
                    .expect("story");
                events
                    .iter()
                    .map(|e| e.detail["n"].as_i64().unwrap_or(-1))
                    .collect::<Vec<i64>>()
            }
        };
        assert_eq!(story("m/a", 1).await, [5, 3, 2, 0]);
        assert_eq!(story("m/a", 2).await, [6, 4, 1]);
        assert_eq!(story("m/a", 3).await, [7]);
        assert_eq!(story("m/b", 1).await, [8]);
        let token_indexes = match &store {
            Store::Sqlite(b) => sqlx::query_scalar(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql LIKE '%(resource, token, id)%'",
            )
            .fetch_all(b.readers())
            .await,
            Store::Postgres(b) => sqlx::query_scalar(
                "SELECT indexdef FROM pg_indexes WHERE indexdef LIKE '%(resource, token, id)%'",
            )
            .fetch_all(b.pool())
            .await,
        };
        let token_indexes: Vec<String> = token_indexes.expect("indexes");
        assert_eq!(token_indexes.len(), 1, "{token_indexes:?}");
        assert!(
            token_indexes[0].contains("events_rejected_by_resource_token")
                && token_indexes[0].contains("kind = 'write_rejected'")
                && !token_indexes[0].contains("acquired"),
            "{token_indexes:?}"
        );
        let request = crate::store::AcquireRequest::for_tests("m/b", "after", 60_000);
        store.acquire(&request).await.expect("acquire");
        assert_eq!(
            crate::store::lease_links(&store).await,
            (5, vec![("m/b".to_owned(), 1)])
        );
        assert_eq!(story("m/b", 2).await, [-1], "the new lease's acquisition");
        store.close().await;
    }

    #[tokio::test]
    async fn an_upgrade_links_existing_leases_on_sqlite() {
        use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
        use std::str::FromStr;
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("old.db").display());
        let (_files, migrator) = migrator_before_0007("sqlite").await;
        let options = SqliteConnectOptions::from_str(&url)
            .expect("url")
            .create_if_missing(true);
        let pool = SqlitePool::connect_with(options).await.expect("open");
        migrator.run(&pool).await.expect("migrate to 0006");
        let now = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
        for row in rows_before_0007(now, &format!("({now} + 60000)")) {
            sqlx::query(&row).execute(&pool).await.expect(&row);
        }
        pool.close().await;
        an_upgrade_links_existing_leases(&url).await;
    }

    #[tokio::test]
    #[cfg_attr(
        palisade_no_test_postgres,
        ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
    )]
    async fn an_upgrade_links_existing_leases_on_postgres() {
        let Some((url, drop_db)) = crate::store::test_postgres_db("upgrade").await else {
            return;
        };
        let (_files, migrator) = migrator_before_0007("postgres").await;
        let pool = sqlx::PgPool::connect(&url).await.expect("open");
        migrator.run(&pool).await.expect("migrate to 0006");
        for row in rows_before_0007("now()", "now() + interval '1 minute'") {
            sqlx::query(&row).execute(&pool).await.expect(&row);
        }
        pool.close().await;
        an_upgrade_links_existing_leases(&url).await;
        drop_db().await;
    }

    /// The overview counts exactly the last hour's events of its kinds,
    /// also one recorded before older ones near the hour's start (out of
    /// time order by less than [`WINDOW_ID_SLACK_MS`]).
    async fn the_overview_counts_exactly_the_last_hour(store: Store) {
        let now = store.db_now().await.expect("now");
        let ago = |minutes: i64| now - Duration::minutes(minutes);
        let (acquired, expired) = (EventKind::Acquired, EventKind::Expired);
        let rejected = EventKind::WriteRejected;
        record_on(
            &store,
            &[
                ("o/b", acquired, ago(120)),          // long before
                ("o/a", acquired, ago(59)),           // in: only the slack finds it
                ("o/b", acquired, ago(65)),           // before the hour
                ("o/b", rejected, ago(61)),           // before the hour
                ("o/a", expired, ago(30)),            // in
                ("o/a", EventKind::Renewed, ago(20)), // not an overview kind
                ("o/a", rejected, ago(1)),            // in
            ],
        )
        .await;
        let overview = store.overview(10).await.expect("overview");
        let totals: Vec<(EventKind, i64)> = overview
            .series
            .iter()
            .map(|s| (s.kind, s.per_minute.iter().sum()))
            .collect();
        assert_eq!(totals, [(acquired, 1), (expired, 1), (rejected, 1)]);
        let contended: Vec<(&str, i64, i64, i64)> = overview
            .contended
            .iter()
            .map(|c| {
                (
                    c.resource.as_str(),
                    c.acquisitions,
                    c.expiries,
                    c.rejections,
                )
            })
            .collect();
        assert_eq!(contended, [("o/a", 1, 1, 1)]);
        store.close().await;
    }

    crate::store::on_both_backends! {
        "ui":
        a_window_holds_exactly_its_events => a_window_holds_exactly_its_events_on_sqlite,
            a_window_holds_exactly_its_events_on_postgres;
        the_overview_counts_exactly_the_last_hour => the_overview_counts_exactly_the_last_hour_on_sqlite,
            the_overview_counts_exactly_the_last_hour_on_postgres;
        a_lease_story_holds_exactly_its_tokens_events => a_lease_story_holds_exactly_its_tokens_events_on_sqlite,
            a_lease_story_holds_exactly_its_tokens_events_on_postgres;
    }

    #[test]
    fn series_fill_minutes_and_ignore_out_of_range() {
        let s = series_from_counts([
            ("acquired".to_owned(), 0, 2),
            ("acquired".to_owned(), 59, 3),
            ("acquired".to_owned(), 60, 9),
            ("write_rejected".to_owned(), 10, 1),
            ("renewed".to_owned(), 1, 7),
        ]);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].per_minute[0], 2);
        assert_eq!(s[0].per_minute[59], 3);
        assert_eq!(s[0].per_minute.iter().sum::<i64>(), 5);
        assert_eq!(s[2].per_minute[10], 1);
        assert_eq!(s[1].per_minute.iter().sum::<i64>(), 0);
    }
}

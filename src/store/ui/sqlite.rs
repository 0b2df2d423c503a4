//! The UI's read queries on SQLite (times are Unix milliseconds).

use chrono::{DateTime, Duration, Utc};
use sqlx::{QueryBuilder, Sqlite};

use super::{
    Contended, EventQuery, HeldFilter, OVERVIEW_KINDS, OVERVIEW_MINUTES, Overview, PublicLease,
    PublicLeaseRow, ResourceOrder, ResourcePage, ResourceQuery, ResourceSummaryRow,
    TOKEN_INDEXED_KINDS, UiReads, WINDOW_ID_SLACK_MS, series_from_counts,
};
use crate::domain::EventKind;
use crate::store::rows::{DbTime, EventRow, unix_ms};
use crate::store::sqlite::SqliteBackend;
use crate::store::{Event, StoreResult};

const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
const EVENT_COLUMNS: &str = "id, at, kind, resource, token, holder, detail";
const PUBLIC_LEASE_COLUMNS: &str =
    "resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at";

/// The smallest string above every string that starts with `prefix`, in
/// SQLite's binary (UTF-8 byte) order: lets a prefix filter use the index.
fn prefix_upper_bound(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}

fn push_resource_filter(q: &mut QueryBuilder<'_, Sqlite>, query: &ResourceQuery, now: i64) {
    q.push(
        " FROM resources r LEFT JOIN leases l ON l.resource = r.name AND l.state = 'active' \
         AND l.expires_at > ",
    )
    .push_bind(now);
    q.push(" WHERE 1 = 1");
    if let Some(prefix) = query.prefix.as_deref().filter(|p| !p.is_empty()) {
        q.push(" AND r.name >= ")
            .push_bind(prefix.to_owned())
            .push(" AND r.name < ")
            .push_bind(prefix_upper_bound(prefix));
    }
    match query.held {
        HeldFilter::Any => {}
        HeldFilter::Held => {
            q.push(" AND l.token IS NOT NULL");
        }
        HeldFilter::Free => {
            q.push(" AND l.token IS NULL");
        }
    }
}

fn push_kinds(q: &mut QueryBuilder<'_, Sqlite>, kinds: &[EventKind]) {
    if kinds.is_empty() {
        return;
    }
    q.push(" AND kind IN (");
    let mut list = q.separated(", ");
    for kind in kinds {
        list.push_bind(kind.as_str());
    }
    q.push(")");
}

/// ` AND id > ` the last event recorded [`WINDOW_ID_SLACK_MS`] before
/// `from_ms`: with `at >= from_ms`, reads a window's events through an
/// index ending in `id` (found by time through `(at, id)`).
fn push_ids_from(q: &mut QueryBuilder<'_, Sqlite>, from_ms: i64) {
    q.push(" AND id > coalesce((SELECT id FROM events INDEXED BY events_by_time WHERE at < ")
        .push_bind(from_ms.saturating_sub(WINDOW_ID_SLACK_MS))
        .push(" ORDER BY at DESC, id DESC LIMIT 1), 0)");
}

/// ` AND id < ` the first event recorded [`WINDOW_ID_SLACK_MS`] after
/// `to_ms`: the other end of [`push_ids_from`]'s window.
fn push_ids_until(q: &mut QueryBuilder<'_, Sqlite>, to_ms: i64) {
    q.push(" AND id < coalesce((SELECT id FROM events INDEXED BY events_by_time WHERE at >= ")
        .push_bind(to_ms.saturating_add(WINDOW_ID_SLACK_MS))
        .push(" ORDER BY at, id LIMIT 1), 9223372036854775807)");
}

/// The filters of `query` other than its resource.
fn push_event_filters(q: &mut QueryBuilder<'_, Sqlite>, query: &EventQuery) {
    if let Some(prefix) = query.resource_prefix.as_deref().filter(|p| !p.is_empty()) {
        q.push(" AND resource >= ")
            .push_bind(prefix.to_owned())
            .push(" AND resource < ")
            .push_bind(prefix_upper_bound(prefix));
    }
    push_kinds(q, &query.kinds);
    if let Some(holder) = &query.holder {
        q.push(" AND holder = ").push_bind(holder.clone());
    }
    if let Some(token) = query.token {
        q.push(" AND token = ").push_bind(token);
    }
    if let Some(before) = query.before {
        q.push(" AND id < ").push_bind(before);
    }
}

/// The events of `resource` with `token` that `query` asks for, as
/// [`TOKEN_INDEXED_KINDS`] says: those from the token's `acquired` event
/// (the id its lease row keeps; the oldest kept event if there is none)
/// up to the next linked token's, through `(resource, id)`, and outside that range
/// its rejections, through the partial `(resource, token, id)` index. To be
/// ordered and limited.
fn push_lease_story(
    q: &mut QueryBuilder<'_, Sqlite>,
    resource: &str,
    token: i64,
    query: &EventQuery,
) {
    let issued = |q: &mut QueryBuilder<'_, Sqlite>, op: &str| {
        q.push("(SELECT acquired_event_id FROM leases WHERE resource = ")
            .push_bind(resource.to_owned())
            .push(format!(" AND token {op} "))
            .push_bind(token)
            .push(" AND acquired_event_id IS NOT NULL ORDER BY token LIMIT 1)");
    };
    q.push("WITH span AS (SELECT coalesce(");
    issued(q, "=");
    q.push(", 0) AS lo, coalesce(");
    issued(q, ">");
    q.push(format!(
        ", 9223372036854775807) AS hi) \
         SELECT {EVENT_COLUMNS} FROM span, events INDEXED BY events_by_resource \
         WHERE resource = "
    ))
    .push_bind(resource.to_owned())
    .push(" AND id >= span.lo AND id < span.hi");
    push_event_filters(q, query);
    q.push(format!(
        " UNION ALL SELECT {EVENT_COLUMNS} FROM span, events \
         INDEXED BY events_rejected_by_resource_token WHERE resource = "
    ))
    .push_bind(resource.to_owned())
    .push(format!(
        " AND {TOKEN_INDEXED_KINDS} AND NOT (id >= span.lo AND id < span.hi)"
    ));
    push_event_filters(q, query);
}

impl UiReads for SqliteBackend {
    async fn db_now(&self) -> StoreResult<DateTime<Utc>> {
        let ms: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(self.readers())
            .await?;
        ms.to_utc()
    }

    async fn list_resources(&self, query: &ResourceQuery) -> StoreResult<ResourcePage> {
        let now = self.db_now().await?;
        let now_ms = unix_ms(now);
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT r.name, r.last_token, r.accepted_token, r.last_activity_at, \
             l.token AS h_token, l.holder AS h_holder, l.ttl_ms AS h_ttl_ms, \
             l.acquired_at AS h_acquired_at, l.expires_at AS h_expires_at",
        );
        push_resource_filter(&mut q, query, now_ms);
        q.push(match query.order {
            ResourceOrder::Activity => " ORDER BY r.last_activity_at DESC, r.name",
            ResourceOrder::ActivityAsc => " ORDER BY r.last_activity_at ASC, r.name",
            ResourceOrder::Name => " ORDER BY r.name",
        });
        q.push(" LIMIT ")
            .push_bind(query.limit.clamp(1, super::MAX_PAGE))
            .push(" OFFSET ")
            .push_bind(query.offset.max(0));
        let rows: Vec<ResourceSummaryRow<i64>> =
            q.build_query_as().fetch_all(self.readers()).await?;
        let mut count = QueryBuilder::<Sqlite>::new("SELECT count(*)");
        push_resource_filter(&mut count, query, now_ms);
        let total: i64 = count.build_query_scalar().fetch_one(self.readers()).await?;
        Ok(ResourcePage {
            rows: rows
                .into_iter()
                .map(ResourceSummaryRow::into_summary)
                .collect::<StoreResult<_>>()?,
            total,
            now,
        })
    }

    async fn leases_in_window(
        &self,
        resource: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<PublicLease>> {
        // Tokens grow with acquisition time, so the (resource, token) index
        // walks the leases newest first.
        let sql = format!(
            "SELECT {PUBLIC_LEASE_COLUMNS} FROM leases WHERE resource = ? AND acquired_at < ? \
             AND (ended_at IS NULL OR ended_at >= ?) ORDER BY token DESC LIMIT ?"
        );
        let rows: Vec<PublicLeaseRow<i64>> = sqlx::query_as(&sql)
            .bind(resource)
            .bind(unix_ms(to))
            .bind(unix_ms(from))
            .bind(limit)
            .fetch_all(self.readers())
            .await?;
        rows.into_iter().map(PublicLeaseRow::into_lease).collect()
    }

    async fn lease_by_token(&self, resource: &str, token: i64) -> StoreResult<Option<PublicLease>> {
        let sql =
            format!("SELECT {PUBLIC_LEASE_COLUMNS} FROM leases WHERE resource = ? AND token = ?");
        let row: Option<PublicLeaseRow<i64>> = sqlx::query_as(&sql)
            .bind(resource)
            .bind(token)
            .fetch_optional(self.readers())
            .await?;
        row.map(PublicLeaseRow::into_lease).transpose()
    }

    async fn events_in_window(
        &self,
        resource: &str,
        kinds: &[EventKind],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<Event>> {
        let (from_ms, to_ms) = (unix_ms(from), unix_ms(to));
        let mut q = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events INDEXED BY events_by_resource \
             WHERE resource = "
        ));
        q.push_bind(resource.to_owned());
        push_ids_from(&mut q, from_ms);
        push_ids_until(&mut q, to_ms);
        q.push(" AND at >= ")
            .push_bind(from_ms)
            .push(" AND at < ")
            .push_bind(to_ms);
        push_kinds(&mut q, kinds);
        // A resource's ids follow its events' times.
        q.push(" ORDER BY id LIMIT ").push_bind(limit);
        let rows: Vec<EventRow<i64>> = q.build_query_as().fetch_all(self.readers()).await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    async fn query_events(&self, query: &EventQuery) -> StoreResult<Vec<Event>> {
        let mut q = QueryBuilder::<Sqlite>::new("");
        if let (Some(resource), Some(token)) = (&query.resource, query.token) {
            push_lease_story(&mut q, resource, token, query);
        } else {
            q.push(format!("SELECT {EVENT_COLUMNS} FROM events WHERE 1 = 1"));
            if let Some(resource) = &query.resource {
                q.push(" AND resource = ").push_bind(resource.clone());
            }
            push_event_filters(&mut q, query);
        }
        q.push(" ORDER BY id DESC LIMIT ")
            .push_bind(query.limit.clamp(1, super::MAX_PAGE * 2));
        let rows: Vec<EventRow<i64>> = q.build_query_as().fetch_all(self.readers()).await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    async fn overview(&self, contended_limit: i64) -> StoreResult<Overview> {
        let now = self.db_now().await?;
        let now_ms = unix_ms(now);
        let from_ms = unix_ms(now - Duration::minutes(OVERVIEW_MINUTES));
        let active_leases: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM leases WHERE state = 'active' AND expires_at > ?",
        )
        .bind(now_ms)
        .fetch_one(self.readers())
        .await?;
        let resources: i64 = sqlx::query_scalar("SELECT count(*) FROM resources")
            .fetch_one(self.readers())
            .await?;
        // Both read the hour through the covering (kind, id, at, resource,
        // holder) index, from an id bound found by time; left to itself the
        // planner prefers a skip-scan of another index, several times slower.
        let mut q = QueryBuilder::<Sqlite>::new("SELECT kind, (at - ");
        q.push_bind(from_ms).push(
            ") / 60000 AS minute, count(*) FROM events INDEXED BY events_by_kind WHERE 1 = 1",
        );
        push_kinds(&mut q, &OVERVIEW_KINDS);
        push_ids_from(&mut q, from_ms);
        q.push(" AND at >= ")
            .push_bind(from_ms)
            .push(" AND at <= ")
            .push_bind(now_ms)
            .push(" GROUP BY kind, minute");
        let counts: Vec<(String, i64, i64)> = q.build_query_as().fetch_all(self.readers()).await?;
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT resource, \
               sum(kind = 'acquired') AS acquisitions, \
               count(DISTINCT CASE WHEN kind = 'acquired' THEN holder END) AS holders, \
               sum(kind = 'expired') AS expiries, \
               sum(kind = 'write_rejected') AS rejections \
             FROM events INDEXED BY events_by_kind \
             WHERE kind IN ('acquired', 'expired', 'write_rejected')",
        );
        push_ids_from(&mut q, from_ms);
        q.push(" AND at >= ")
            .push_bind(from_ms)
            .push(
                " GROUP BY resource \
                 ORDER BY holders DESC, acquisitions + rejections DESC, resource LIMIT ",
            )
            .push_bind(contended_limit);
        let contended: Vec<(String, i64, i64, i64, i64)> =
            q.build_query_as().fetch_all(self.readers()).await?;
        let latest_rejections = self
            .query_events(&EventQuery {
                kinds: vec![EventKind::WriteRejected],
                limit: 8,
                ..EventQuery::default()
            })
            .await?;
        Ok(Overview {
            now,
            active_leases,
            resources,
            series: series_from_counts(counts),
            contended: contended
                .into_iter()
                .map(
                    |(resource, acquisitions, holders, expiries, rejections)| Contended {
                        resource,
                        acquisitions,
                        holders,
                        expiries,
                        rejections,
                    },
                )
                .collect(),
            latest_rejections,
        })
    }
}

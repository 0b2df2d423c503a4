//! The UI's read queries on PostgreSQL (times are `timestamptz`).

use chrono::{DateTime, Duration, Utc};
use sqlx::{Postgres, QueryBuilder};

use super::{
    Contended, EventQuery, HeldFilter, OVERVIEW_KINDS, OVERVIEW_MINUTES, Overview, PublicLease,
    PublicLeaseRow, ResourceOrder, ResourcePage, ResourceQuery, ResourceSummaryRow,
    TOKEN_INDEXED_KINDS, UiReads, WINDOW_ID_SLACK_MS, series_from_counts,
};
use crate::domain::EventKind;
use crate::store::postgres::PgBackend;
use crate::store::rows::EventRow;
use crate::store::{Event, StoreResult};

const NOW: &str = "date_trunc('milliseconds', clock_timestamp())";
const EVENT_COLUMNS: &str = "id, at, kind, resource, token, holder, detail";
const PUBLIC_LEASE_COLUMNS: &str =
    "resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at";

fn push_resource_filter(
    q: &mut QueryBuilder<'_, Postgres>,
    query: &ResourceQuery,
    now: DateTime<Utc>,
) {
    q.push(
        " FROM resources r LEFT JOIN leases l ON l.resource = r.name AND l.state = 'active' \
         AND l.expires_at > ",
    )
    .push_bind(now);
    q.push(" WHERE 1 = 1");
    if let Some(prefix) = query.prefix.as_deref().filter(|p| !p.is_empty()) {
        q.push(" AND starts_with(r.name, ")
            .push_bind(prefix.to_owned())
            .push(")");
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

fn push_kinds(q: &mut QueryBuilder<'_, Postgres>, kinds: &[EventKind]) {
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
/// `from`: with `at >= from`, reads a window's events through an index
/// ending in `id` (found by time through `(at, id)`).
fn push_ids_from(q: &mut QueryBuilder<'_, Postgres>, from: DateTime<Utc>) {
    let slack = Duration::milliseconds(WINDOW_ID_SLACK_MS);
    q.push(" AND id > coalesce((SELECT id FROM events WHERE at < ")
        .push_bind(from.checked_sub_signed(slack).unwrap_or(from))
        .push(" ORDER BY at DESC, id DESC LIMIT 1), 0)");
}

/// ` AND id < ` the first event recorded [`WINDOW_ID_SLACK_MS`] after
/// `to`: the other end of [`push_ids_from`]'s window.
fn push_ids_until(q: &mut QueryBuilder<'_, Postgres>, to: DateTime<Utc>) {
    let slack = Duration::milliseconds(WINDOW_ID_SLACK_MS);
    q.push(" AND id < coalesce((SELECT id FROM events WHERE at >= ")
        .push_bind(to.checked_add_signed(slack).unwrap_or(to))
        .push(" ORDER BY at, id LIMIT 1), 9223372036854775807)");
}

/// Up to this many resources matching a prefix, the events page reads each
/// one's index; beyond it, matches are dense enough to scan the log by id.
const PREFIX_FANOUT: i64 = 200;

/// Kind, holder, token and paging filters of an events page.
fn push_event_filters(q: &mut QueryBuilder<'_, Postgres>, query: &EventQuery) {
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

fn push_prefix(q: &mut QueryBuilder<'_, Postgres>, query: &EventQuery) {
    if let Some(prefix) = query.resource_prefix.as_deref().filter(|p| !p.is_empty()) {
        q.push(" AND starts_with(resource, ")
            .push_bind(prefix.to_owned())
            .push(")");
    }
}

/// The events of `resource` with `token` that `query` asks for, as
/// [`TOKEN_INDEXED_KINDS`] says: those from the token's `acquired` event
/// (the id its lease row keeps; the oldest kept event if there is none)
/// up to the next linked token's, through `(resource, id)`, and outside that range
/// its rejections, through the partial `(resource, token, id)` index. To be
/// ordered and limited.
fn push_lease_story(
    q: &mut QueryBuilder<'_, Postgres>,
    resource: &str,
    token: i64,
    query: &EventQuery,
) {
    let issued = |q: &mut QueryBuilder<'_, Postgres>, op: &str| {
        q.push("(SELECT acquired_event_id FROM leases WHERE resource = ")
            .push_bind(resource.to_owned())
            .push(format!(" AND token {op} "))
            .push_bind(token)
            .push(" AND acquired_event_id IS NOT NULL ORDER BY token LIMIT 1)");
    };
    q.push("WITH span AS MATERIALIZED (SELECT coalesce(");
    issued(q, "=");
    q.push(", 0) AS lo, coalesce(");
    issued(q, ">");
    // The bounds as row comparisons, which only the (resource, id) index
    // can serve: on plain id bounds the planner, not knowing them, may
    // range-scan the primary key through every resource's events.
    q.push(format!(
        ", 9223372036854775807) AS hi) \
         SELECT {EVENT_COLUMNS} FROM span, events WHERE resource = "
    ))
    .push_bind(resource.to_owned())
    .push(" AND (resource, id) >= (")
    .push_bind(resource.to_owned())
    .push("::text, span.lo) AND (resource, id) < (")
    .push_bind(resource.to_owned())
    .push("::text, span.hi)");
    push_prefix(q, query);
    push_event_filters(q, query);
    q.push(format!(
        " UNION ALL SELECT {EVENT_COLUMNS} FROM span, events WHERE resource = "
    ))
    .push_bind(resource.to_owned())
    .push(format!(
        " AND {TOKEN_INDEXED_KINDS} AND NOT (id >= span.lo AND id < span.hi)"
    ));
    push_prefix(q, query);
    push_event_filters(q, query);
}

impl UiReads for PgBackend {
    async fn db_now(&self) -> StoreResult<DateTime<Utc>> {
        Ok(sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(self.pool())
            .await?)
    }

    async fn list_resources(&self, query: &ResourceQuery) -> StoreResult<ResourcePage> {
        let now = self.db_now().await?;
        let now_ms = now;
        let mut q = QueryBuilder::<Postgres>::new(
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
        let rows: Vec<ResourceSummaryRow<DateTime<Utc>>> =
            q.build_query_as().fetch_all(self.pool()).await?;
        let mut count = QueryBuilder::<Postgres>::new("SELECT count(*)");
        push_resource_filter(&mut count, query, now_ms);
        let total: i64 = count.build_query_scalar().fetch_one(self.pool()).await?;
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
            "SELECT {PUBLIC_LEASE_COLUMNS} FROM leases WHERE resource = $1 AND acquired_at < $2 \
             AND (ended_at IS NULL OR ended_at >= $3) ORDER BY token DESC LIMIT $4"
        );
        let rows: Vec<PublicLeaseRow<DateTime<Utc>>> = sqlx::query_as(&sql)
            .bind(resource)
            .bind(to)
            .bind(from)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.into_iter().map(PublicLeaseRow::into_lease).collect()
    }

    async fn lease_by_token(&self, resource: &str, token: i64) -> StoreResult<Option<PublicLease>> {
        let sql =
            format!("SELECT {PUBLIC_LEASE_COLUMNS} FROM leases WHERE resource = $1 AND token = $2");
        let row: Option<PublicLeaseRow<DateTime<Utc>>> = sqlx::query_as(&sql)
            .bind(resource)
            .bind(token)
            .fetch_optional(self.pool())
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
        let mut q = QueryBuilder::<Postgres>::new(format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE resource = "
        ));
        q.push_bind(resource.to_owned());
        push_ids_from(&mut q, from);
        push_ids_until(&mut q, to);
        q.push(" AND at >= ")
            .push_bind(from)
            .push(" AND at < ")
            .push_bind(to);
        push_kinds(&mut q, kinds);
        // A resource's ids follow its events' times.
        q.push(" ORDER BY id LIMIT ").push_bind(limit);
        let rows: Vec<EventRow<DateTime<Utc>>> = q.build_query_as().fetch_all(self.pool()).await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    async fn query_events(&self, query: &EventQuery) -> StoreResult<Vec<Event>> {
        let limit = query.limit.clamp(1, super::MAX_PAGE * 2);
        // A prefix that matches few resources: walk each one's (resource,
        // id) index backwards and merge, instead of scanning the whole log
        // by id for rare matches (PostgreSQL cannot range-scan a prefix
        // under every collation).
        if let (None, Some(prefix)) = (
            &query.resource,
            query.resource_prefix.as_deref().filter(|p| !p.is_empty()),
        ) {
            let names: Vec<String> = sqlx::query_scalar(
                "SELECT name FROM resources WHERE starts_with(name, $1) LIMIT $2",
            )
            .bind(prefix)
            .bind(PREFIX_FANOUT + 1)
            .fetch_all(self.pool())
            .await?;
            if names.len() as i64 <= PREFIX_FANOUT {
                let mut q = QueryBuilder::<Postgres>::new("SELECT e.* FROM unnest(");
                q.push_bind(names).push(format!(
                    ") AS n(name) CROSS JOIN LATERAL (SELECT {EVENT_COLUMNS} FROM events \
                     WHERE resource = n.name"
                ));
                push_event_filters(&mut q, query);
                q.push(" ORDER BY id DESC LIMIT ")
                    .push_bind(limit)
                    .push(") AS e ORDER BY e.id DESC LIMIT ")
                    .push_bind(limit);
                let rows: Vec<EventRow<DateTime<Utc>>> =
                    q.build_query_as().fetch_all(self.pool()).await?;
                return rows.into_iter().map(EventRow::into_event).collect();
            }
        }
        let mut q = QueryBuilder::<Postgres>::new("");
        if let (Some(resource), Some(token)) = (&query.resource, query.token) {
            push_lease_story(&mut q, resource, token, query);
        } else {
            q.push(format!("SELECT {EVENT_COLUMNS} FROM events WHERE true"));
            if let Some(resource) = &query.resource {
                q.push(" AND resource = ").push_bind(resource.clone());
            }
            push_prefix(&mut q, query);
            push_event_filters(&mut q, query);
        }
        q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
        let rows: Vec<EventRow<DateTime<Utc>>> = q.build_query_as().fetch_all(self.pool()).await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    async fn overview(&self, contended_limit: i64) -> StoreResult<Overview> {
        let now = self.db_now().await?;
        let now_ms = now;
        let from_ms = now - Duration::minutes(OVERVIEW_MINUTES);
        let active_leases: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM leases WHERE state = 'active' AND expires_at > $1",
        )
        .bind(now_ms)
        .fetch_one(self.pool())
        .await?;
        let resources: i64 = sqlx::query_scalar("SELECT count(*) FROM resources")
            .fetch_one(self.pool())
            .await?;
        // Both read the hour through the (kind, id) index, which carries
        // at, resource and holder, from an id bound found by time.
        let mut q = QueryBuilder::<Postgres>::new("SELECT kind, floor(extract(epoch FROM at - ");
        q.push_bind(from_ms)
            .push(") / 60)::bigint AS minute, count(*) FROM events WHERE true");
        push_kinds(&mut q, &OVERVIEW_KINDS);
        push_ids_from(&mut q, from_ms);
        q.push(" AND at >= ")
            .push_bind(from_ms)
            .push(" AND at <= ")
            .push_bind(now_ms)
            .push(" GROUP BY kind, minute");
        let counts: Vec<(String, i64, i64)> = q.build_query_as().fetch_all(self.pool()).await?;
        let mut q = QueryBuilder::<Postgres>::new(
            "SELECT resource, \
               count(*) FILTER (WHERE kind = 'acquired') AS acquisitions, \
               count(DISTINCT holder) FILTER (WHERE kind = 'acquired') AS holders, \
               count(*) FILTER (WHERE kind = 'expired') AS expiries, \
               count(*) FILTER (WHERE kind = 'write_rejected') AS rejections \
             FROM events WHERE kind IN ('acquired', 'expired', 'write_rejected')",
        );
        push_ids_from(&mut q, from_ms);
        q.push(" AND at >= ")
            .push_bind(from_ms)
            .push(
                " GROUP BY resource \
                 ORDER BY holders DESC, \
                   count(*) FILTER (WHERE kind IN ('acquired', 'write_rejected')) DESC, resource \
                 LIMIT ",
            )
            .push_bind(contended_limit);
        let contended: Vec<(String, i64, i64, i64, i64)> =
            q.build_query_as().fetch_all(self.pool()).await?;
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

//! Reads the final state of a run straight from the database, for the
//! checker (nothing goes through the server that is being checked).

use sqlx::Row;

use super::checker::{EventRecord, LeaseRecord, ValueRecord};

pub struct FinalState {
    pub events: Vec<EventRecord>,
    pub leases: Vec<LeaseRecord>,
    pub values: Vec<ValueRecord>,
}

// The same three reads on either backend; each query returns the same
// column shapes (times as Unix ms, JSON as text) so one mapping serves both.
const LEASES: &str = "SELECT lease_id, resource, token, holder, state FROM leases";

pub async fn postgres(url: &str) -> anyhow::Result<FinalState> {
    let pool = sqlx::PgPool::connect(url).await?;
    let state = FinalState {
        events: events(
            sqlx::query(
                "SELECT id, (extract(epoch FROM at) * 1000)::bigint AS at_ms, kind, resource, token, \
                 detail::text AS detail FROM events ORDER BY id",
            )
            .fetch_all(&pool)
            .await?,
        )?,
        leases: leases(sqlx::query(LEASES).fetch_all(&pool).await?)?,
        values: values(
            sqlx::query("SELECT resource, token, version, value::text AS value FROM fenced_values")
                .fetch_all(&pool)
                .await?,
        )?,
    };
    pool.close().await;
    Ok(state)
}

pub async fn sqlite(url: &str) -> anyhow::Result<FinalState> {
    let pool = sqlx::SqlitePool::connect(url).await?;
    let state = FinalState {
        events: events(
            sqlx::query(
                "SELECT id, at AS at_ms, kind, resource, token, detail FROM events ORDER BY id",
            )
            .fetch_all(&pool)
            .await?,
        )?,
        leases: leases(sqlx::query(LEASES).fetch_all(&pool).await?)?,
        values: values(
            sqlx::query("SELECT resource, token, version, value FROM fenced_values")
                .fetch_all(&pool)
                .await?,
        )?,
    };
    pool.close().await;
    Ok(state)
}

fn events<R: Row>(rows: Vec<R>) -> anyhow::Result<Vec<EventRecord>>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    rows.into_iter()
        .map(|r| {
            let detail: String = r.try_get("detail")?;
            Ok(EventRecord {
                id: r.try_get("id")?,
                at_ms: r.try_get("at_ms")?,
                kind: r.try_get("kind")?,
                resource: r.try_get("resource")?,
                token: r.try_get("token")?,
                detail: serde_json::from_str(&detail)?,
            })
        })
        .collect()
}

fn leases<R: Row>(rows: Vec<R>) -> anyhow::Result<Vec<LeaseRecord>>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    rows.into_iter()
        .map(|r| {
            Ok(LeaseRecord {
                lease_id: r.try_get("lease_id")?,
                resource: r.try_get("resource")?,
                token: r.try_get("token")?,
                holder: r.try_get("holder")?,
                state: r.try_get("state")?,
            })
        })
        .collect()
}

fn values<R: Row>(rows: Vec<R>) -> anyhow::Result<Vec<ValueRecord>>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    rows.into_iter()
        .map(|r| {
            let text: String = r.try_get("value")?;
            Ok(ValueRecord {
                resource: r.try_get("resource")?,
                token: r.try_get("token")?,
                version: r.try_get("version")?,
                value: serde_json::from_str(&text)?,
            })
        })
        .collect()
}

//! Row shapes shared by both backends, generic over how each stores time
//! (SQLite: Unix milliseconds; PostgreSQL: `timestamptz`).

use chrono::{DateTime, TimeZone, Utc};

use super::types::{Event, ResourceRow, StoredValue};
use super::{StoreError, StoreResult};
use crate::domain::{Holder, Lease, LeaseId, RequestId, ResourceName, Token};

/// A time as a backend stores it.
pub trait DbTime: Sized {
    fn to_utc(self) -> StoreResult<DateTime<Utc>>;
}

impl DbTime for i64 {
    fn to_utc(self) -> StoreResult<DateTime<Utc>> {
        Utc.timestamp_millis_opt(self)
            .single()
            .ok_or_else(|| StoreError::Corrupt(format!("timestamp {self} out of range")))
    }
}

impl DbTime for DateTime<Utc> {
    fn to_utc(self) -> StoreResult<DateTime<Utc>> {
        Ok(self)
    }
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {err}"))
}

#[derive(sqlx::FromRow)]
pub struct LeaseRow<T> {
    pub lease_id: String,
    pub resource: String,
    pub token: i64,
    pub holder: String,
    pub state: String,
    pub ttl_ms: i64,
    pub acquired_at: T,
    pub expires_at: T,
    pub ended_at: Option<T>,
    pub request_id: Option<String>,
}

impl<T: DbTime> LeaseRow<T> {
    pub fn into_lease(self) -> StoreResult<Lease> {
        Ok(Lease {
            lease_id: LeaseId::parse(&self.lease_id)
                .ok_or_else(|| corrupt("lease id", "malformed"))?,
            resource: ResourceName::parse(self.resource).map_err(|e| corrupt("resource", e))?,
            holder: Holder::parse(self.holder).map_err(|e| corrupt("holder", e))?,
            token: Token::from_stored(self.token),
            state: self.state.parse().map_err(|e| corrupt("lease state", e))?,
            ttl_ms: self.ttl_ms,
            acquired_at: self.acquired_at.to_utc()?,
            expires_at: self.expires_at.to_utc()?,
            ended_at: self.ended_at.map(DbTime::to_utc).transpose()?,
            request_id: self
                .request_id
                .map(RequestId::parse)
                .transpose()
                .map_err(|e| corrupt("request id", e))?,
        })
    }
}

pub fn into_lease<T: DbTime>(row: Option<LeaseRow<T>>) -> StoreResult<Option<Lease>> {
    row.map(LeaseRow::into_lease).transpose()
}

/// The database clock, and a lease when the outer join found one: how a
/// batch reads the clock and its leases in one query.
#[derive(sqlx::FromRow)]
pub struct ClockedLeaseRow<T> {
    pub now: T,
    pub lease_id: Option<String>,
    pub resource: Option<String>,
    pub token: Option<i64>,
    pub holder: Option<String>,
    pub state: Option<String>,
    pub ttl_ms: Option<i64>,
    pub acquired_at: Option<T>,
    pub expires_at: Option<T>,
    pub ended_at: Option<T>,
    pub request_id: Option<String>,
}

impl<T: DbTime + Copy> ClockedLeaseRow<T> {
    fn into_lease_row(self) -> Option<LeaseRow<T>> {
        Some(LeaseRow {
            lease_id: self.lease_id?,
            resource: self.resource?,
            token: self.token?,
            holder: self.holder?,
            state: self.state?,
            ttl_ms: self.ttl_ms?,
            acquired_at: self.acquired_at?,
            expires_at: self.expires_at?,
            ended_at: self.ended_at,
            request_id: self.request_id,
        })
    }

    /// The clock and the leases of a query that returns at least one row.
    pub fn split(rows: Vec<Self>) -> StoreResult<(DateTime<Utc>, Vec<Lease>)> {
        let now = rows
            .first()
            .map(|r| r.now)
            .ok_or_else(|| corrupt("clock query", "no row"))?
            .to_utc()?;
        let leases = rows
            .into_iter()
            .filter_map(Self::into_lease_row)
            .map(LeaseRow::into_lease)
            .collect::<StoreResult<_>>()?;
        Ok((now, leases))
    }
}

#[derive(sqlx::FromRow)]
pub struct ResourceDbRow<T> {
    pub name: String,
    pub last_token: i64,
    pub accepted_token: i64,
    pub created_at: T,
    pub last_activity_at: T,
}

impl<T: DbTime> ResourceDbRow<T> {
    pub fn into_row(self) -> StoreResult<ResourceRow> {
        Ok(ResourceRow {
            name: ResourceName::parse(self.name).map_err(|e| corrupt("resource", e))?,
            last_token: self.last_token,
            accepted_token: self.accepted_token,
            created_at: self.created_at.to_utc()?,
            last_activity_at: self.last_activity_at.to_utc()?,
        })
    }
}

#[derive(sqlx::FromRow)]
pub struct ValueRow<T> {
    pub value: String,
    pub token: i64,
    pub version: i64,
    pub updated_at: T,
}

impl<T: DbTime> ValueRow<T> {
    pub fn into_value(self) -> StoreResult<StoredValue> {
        Ok(StoredValue {
            json: self.value,
            token: Token::from_stored(self.token),
            version: self.version,
            updated_at: self.updated_at.to_utc()?,
        })
    }
}

/// A fenced value with the resource it belongs to (a batch's load).
#[derive(sqlx::FromRow)]
pub struct NamedValueRow<T> {
    pub resource: String,
    #[sqlx(flatten)]
    pub value: ValueRow<T>,
}

impl<T: DbTime> NamedValueRow<T> {
    pub fn into_named_value(self) -> StoreResult<(ResourceName, StoredValue)> {
        let name = ResourceName::parse(self.resource).map_err(|e| corrupt("resource name", e))?;
        Ok((name, self.value.into_value()?))
    }
}

/// A row of PostgreSQL's one-statement batch load: a lease (or only the
/// clock), or a fenced value with the lease columns empty.
#[derive(sqlx::FromRow)]
pub struct ClockedLoadRow {
    #[sqlx(flatten)]
    pub lease: ClockedLeaseRow<DateTime<Utc>>,
    pub value_of: Option<String>,
    pub value: Option<String>,
    pub value_token: Option<i64>,
    pub version: Option<i64>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// A [`ClockedLoadRow`] taken apart: `Ok` a value row, `Err` a lease row.
pub type ValueOrLease = Result<NamedValueRow<DateTime<Utc>>, ClockedLeaseRow<DateTime<Utc>>>;

impl ClockedLoadRow {
    /// The fenced value a value row carries, or else the lease part.
    pub fn into_value_or_lease(self) -> StoreResult<ValueOrLease> {
        let Some(resource) = self.value_of else {
            return Ok(Err(self.lease));
        };
        let missing = || corrupt("fenced value", "a column is empty");
        Ok(Ok(NamedValueRow {
            resource,
            value: ValueRow {
                value: self.value.ok_or_else(missing)?,
                token: self.value_token.ok_or_else(missing)?,
                version: self.version.ok_or_else(missing)?,
                updated_at: self.updated_at.ok_or_else(missing)?,
            },
        }))
    }
}

#[derive(sqlx::FromRow)]
pub struct EventRow<T> {
    pub id: i64,
    pub at: T,
    pub kind: String,
    pub resource: String,
    pub token: Option<i64>,
    pub holder: Option<String>,
    pub detail: sqlx::types::Json<serde_json::Value>,
}

impl<T: DbTime> EventRow<T> {
    pub fn into_event(self) -> StoreResult<Event> {
        Ok(Event {
            id: self.id,
            at: self.at.to_utc()?,
            kind: self.kind.parse().map_err(|e| corrupt("event kind", e))?,
            resource: self.resource,
            token: self.token,
            holder: self.holder,
            detail: self.detail.0,
        })
    }
}

/// Milliseconds since the Unix epoch, as SQLite stores times.
pub fn unix_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

//! JSON shapes of the v1 API responses.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::domain::Lease;
use crate::store::{Event, ResourceView};

/// RFC 3339, UTC, milliseconds: `2026-12-02T10:19:48.123Z`.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[derive(Serialize, ToSchema)]
/// A lease. Times are RFC 3339 UTC with milliseconds.
pub struct LeaseView {
    /// The holder's secret proof of ownership: only in answers to the
    /// acquirer and to `GET /v1/leases/{lease_id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    pub resource: String,
    pub holder: String,
    pub token: i64,
    /// `active`, `released`, `expired` or `force_released`.
    #[schema(value_type = String, example = "active")]
    pub state: &'static str,
    pub acquired_at: String,
    pub expires_at: String,
    pub ttl_ms: i64,
    pub ended_at: Option<String>,
}

impl LeaseView {
    /// The full lease, secret included: for the acquirer and id-holders.
    pub fn private(lease: &Lease) -> Self {
        Self {
            lease_id: Some(lease.lease_id.as_str().to_owned()),
            ..Self::public(lease)
        }
    }

    /// The lease as anyone may see it, identified by (resource, token).
    pub fn public(lease: &Lease) -> Self {
        Self {
            lease_id: None,
            resource: lease.resource.as_str().to_owned(),
            holder: lease.holder.as_str().to_owned(),
            token: lease.token.get(),
            state: lease.state.as_str(),
            acquired_at: timestamp(lease.acquired_at),
            expires_at: timestamp(lease.expires_at),
            ttl_ms: lease.ttl_ms,
            ended_at: lease.ended_at.map(timestamp),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct HolderView {
    pub holder: String,
    pub token: i64,
    pub acquired_at: String,
    pub expires_at: String,
}

impl HolderView {
    pub fn of(lease: &Lease) -> Self {
        Self {
            holder: lease.holder.as_str().to_owned(),
            token: lease.token.get(),
            acquired_at: timestamp(lease.acquired_at),
            expires_at: timestamp(lease.expires_at),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct ResourceBody {
    pub resource: String,
    pub last_token: i64,
    pub accepted_token: i64,
    pub holder: Option<HolderView>,
}

impl ResourceBody {
    pub fn of(view: &ResourceView) -> Self {
        Self {
            resource: view.row.name.as_str().to_owned(),
            last_token: view.row.last_token,
            accepted_token: view.row.accepted_token,
            holder: view.holder.as_ref().map(HolderView::of),
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct EventView<'a> {
    pub id: i64,
    pub at: String,
    /// `acquired`, `renewed`, `released`, `expired`, `force_released`,
    /// `write_accepted` or `write_rejected`.
    #[schema(value_type = String, example = "acquired")]
    pub kind: &'static str,
    #[schema(value_type = String)]
    pub resource: &'a str,
    pub token: Option<i64>,
    #[schema(value_type = Option<String>)]
    pub holder: Option<&'a str>,
    /// Kind-specific details (a rejection says which token fenced it out).
    #[schema(value_type = Object)]
    pub detail: &'a serde_json::Value,
}

impl<'a> EventView<'a> {
    pub fn of(e: &'a Event) -> Self {
        Self {
            id: e.id,
            at: timestamp(e.at),
            kind: e.kind.as_str(),
            resource: &e.resource,
            token: e.token,
            holder: e.holder.as_deref(),
            detail: &e.detail,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct EventsBody<'a> {
    pub events: Vec<EventView<'a>>,
    pub next_after: i64,
}

#[derive(Serialize, ToSchema)]
pub struct ValueBody<'a> {
    /// The stored JSON value, exactly as written: any JSON value.
    #[schema(value_type = Value)]
    pub value: &'a RawValue,
    pub token: i64,
    pub version: i64,
    pub updated_at: String,
}

/// A token the fence let through.
#[derive(Serialize, ToSchema)]
pub struct FenceAcceptedBody {
    pub token: i64,
    /// The highest token accepted so far (now at least `token`).
    pub accepted_token: i64,
}

/// A value the fenced store accepted.
#[derive(Serialize, ToSchema)]
pub struct WriteReceiptBody {
    pub resource: String,
    pub token: i64,
    /// Counts accepted writes to this resource's value.
    pub version: i64,
    pub updated_at: String,
}

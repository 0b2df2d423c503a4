//! Typed shapes of the v1 API as the client sees them: what it sends and
//! what it gets back. They mirror the server's JSON field for field.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::domain::{EventKind, LeaseState};

/// Reads a string field into a domain enum through its `FromStr`.
fn de_from_str<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: Display,
{
    let raw = String::deserialize(de)?;
    raw.parse().map_err(serde::de::Error::custom)
}

/// Writes a domain enum as its wire name.
fn ser_display<S: Serializer, T: Display>(value: &T, ser: S) -> Result<S::Ok, S::Error> {
    ser.collect_str(value)
}

/// A lease as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The holder's secret; present only in answers to the acquirer and to
    /// whoever already knows it. Never log it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    pub resource: String,
    pub holder: String,
    pub token: i64,
    #[serde(deserialize_with = "de_from_str", serialize_with = "ser_display")]
    pub state: LeaseState,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub ttl_ms: i64,
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
}

/// Who holds a resource, as reported in a `lock_held` error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBy {
    pub holder: String,
    pub token: i64,
    pub expires_at: DateTime<Utc>,
}

/// The live lease of a resource, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceHolder {
    pub holder: String,
    pub token: i64,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// `GET /v1/resources/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceInfo {
    pub resource: String,
    /// Highest token ever issued.
    pub last_token: i64,
    /// Highest token the fence ever accepted.
    pub accepted_token: i64,
    pub holder: Option<ResourceHolder>,
}

/// A token the fence let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceAccepted {
    pub token: i64,
    pub accepted_token: i64,
}

/// A value the fenced store accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReceipt {
    pub resource: String,
    pub token: i64,
    pub version: i64,
    pub updated_at: DateTime<Utc>,
}

/// A value read back from the fenced store, with the token that wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredValue<T> {
    pub value: T,
    pub token: i64,
    pub version: i64,
    pub updated_at: DateTime<Utc>,
}

/// The lease that fenced a stale token out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedBy {
    pub token: i64,
    pub holder: String,
}

/// One entry of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    #[serde(deserialize_with = "de_from_str", serialize_with = "ser_display")]
    pub kind: EventKind,
    pub resource: String,
    pub token: Option<i64>,
    pub holder: Option<String>,
    /// Kind-specific details, for example why a write was rejected.
    pub detail: serde_json::Value,
}

/// A page of the event log; pass `next_after` as the next filter's `after`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventPage {
    pub events: Vec<Event>,
    pub next_after: i64,
}

/// Which events to list. The default is the first 100 events of the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub resource: Option<String>,
    pub kind: Option<EventKind>,
    /// Only events with an id greater than this.
    pub after: Option<i64>,
    /// 1 to 1000; the server's default is 100.
    pub limit: Option<u32>,
}

impl EventFilter {
    /// The events of one resource.
    pub fn resource(name: impl Into<String>) -> Self {
        Self {
            resource: Some(name.into()),
            ..Self::default()
        }
    }

    pub(crate) fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        if let Some(resource) = &self.resource {
            query.push(("resource", resource.clone()));
        }
        if let Some(kind) = self.kind {
            query.push(("kind", kind.as_str().to_owned()));
        }
        if let Some(after) = self.after {
            query.push(("after", after.to_string()));
        }
        if let Some(limit) = self.limit {
            query.push(("limit", limit.to_string()));
        }
        query
    }
}

/// How to acquire a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Who is asking: shown to others in `lock_held` errors and the event log.
    pub holder: String,
    /// How long the lease lives without a renewal (100 ms at least).
    pub ttl: Duration,
    /// How long the server may wait for a held resource (at most 60 s).
    pub wait: Duration,
    /// The idempotency key. `None` makes the client pick a random one, used
    /// for every retry of this call, so a retry never takes a second lease.
    pub request_id: Option<String>,
}

impl AcquireOptions {
    pub fn new(holder: impl Into<String>, ttl: Duration) -> Self {
        Self {
            holder: holder.into(),
            ttl,
            wait: Duration::ZERO,
            request_id: None,
        }
    }

    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

/// A whole number of milliseconds, as the API wants it.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_info_reads_the_server_shape() {
        let json = r#"{"lease_id":"ab","resource":"r","holder":"w","token":3,"state":"force_released",
            "acquired_at":"2026-12-02T10:19:48.123Z","expires_at":"2026-12-02T10:19:58.123Z",
            "ttl_ms":10000,"ended_at":null}"#;
        let lease: LeaseInfo = serde_json::from_str(json).unwrap();
        assert_eq!(lease.state, LeaseState::ForceReleased);
        assert_eq!(lease.token, 3);
        let back = serde_json::to_value(&lease).unwrap();
        assert_eq!(back["state"], "force_released");
        assert!(
            serde_json::from_str::<LeaseInfo>(&json.replace("force_released", "gone")).is_err()
        );
    }

    #[test]
    fn event_filter_builds_only_the_set_parameters() {
        let filter = EventFilter {
            kind: Some(EventKind::WriteRejected),
            after: Some(7),
            ..EventFilter::resource("a/b")
        };
        assert_eq!(
            filter.query(),
            vec![
                ("resource", "a/b".to_owned()),
                ("kind", "write_rejected".to_owned()),
                ("after", "7".to_owned()),
            ]
        );
        assert!(EventFilter::default().query().is_empty());
    }
}

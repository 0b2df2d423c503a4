//! Values that cross the storage seam: requests, outcomes and rows.

use chrono::{DateTime, Utc};
use serde_json::Value as Json;

use crate::domain::{
    EventKind, Holder, Lease, LeaseId, LeaseState, RequestId, ResourceName, Token, Ttl,
};

/// A resource's durable counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRow {
    pub name: ResourceName,
    /// Highest token ever issued (0 before the first acquisition).
    pub last_token: i64,
    /// Highest token the fence ever accepted (0 before the first write).
    pub accepted_token: i64,
    pub created_at: DateTime<Utc>,
    pub last_activity_at: DateTime<Utc>,
}

impl ResourceRow {
    /// How finely `last_activity_at` follows activity. Coarser than every
    /// operation on purpose: a resource busy many times a second then has
    /// its row rewritten only when a counter changes, and on PostgreSQL that
    /// rewrite leaves the indexed activity column alone, so it is a HOT
    /// update (no new index entries, no dead index tuples to walk past).
    pub const ACTIVITY_RESOLUTION: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

    /// Records activity at `now`; returns whether the row changed (the
    /// last recorded activity is at least [`Self::ACTIVITY_RESOLUTION`] old).
    #[must_use]
    pub fn note_activity(&mut self, now: DateTime<Utc>) -> bool {
        if now - self.last_activity_at < Self::ACTIVITY_RESOLUTION {
            return false;
        }
        self.last_activity_at = now;
        true
    }
}

/// A resource as readers see it, with its live lease if any.
#[derive(Debug, Clone)]
pub struct ResourceView {
    pub row: ResourceRow,
    pub holder: Option<Lease>,
    pub now: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct AcquireRequest {
    pub resource: ResourceName,
    pub holder: Holder,
    pub ttl: Ttl,
    pub request_id: Option<RequestId>,
    /// Minted before the transaction so a granted lease needs no read-back.
    pub lease_id: LeaseId,
}

impl AcquireRequest {
    /// A request without a `request_id`, with a freshly minted lease id.
    pub fn new(resource: ResourceName, holder: Holder, ttl: Ttl) -> Self {
        Self {
            resource,
            holder,
            ttl,
            request_id: None,
            lease_id: LeaseId::generate(),
        }
    }

    /// [`Self::new`] from plain values that must be valid (tests).
    #[cfg(test)]
    pub(crate) fn for_tests(resource: &str, holder: &str, ttl_ms: i64) -> Self {
        Self::new(
            ResourceName::parse(resource).expect("resource name"),
            Holder::parse(holder).expect("holder"),
            Ttl::from_millis(ttl_ms, Ttl::DEFAULT_MAX).expect("ttl"),
        )
    }
}

/// A write's outcome, with the expiry it recorded on the way: every write
/// first settles its resource, recording the expiry of a lease it finds past
/// its deadline (`ops::settle`). Exactly one operation in the cluster records
/// each expiry, so counting `expired` wherever it is reported counts each
/// expiry once.
#[derive(Debug, Clone)]
pub struct Recorded<T> {
    pub outcome: T,
    pub expired: Option<Lease>,
}

#[derive(Debug, Clone)]
pub enum AcquireOutcome {
    Granted {
        lease: Lease,
        /// The previous lease, if this acquire found it past its deadline and
        /// recorded its expiry first.
        expired: Option<Lease>,
    },
    /// The same request_id already holds the live lease.
    Existing(Lease),
    Held {
        holder: Lease,
        now: DateTime<Utc>,
    },
}

#[derive(Debug, Clone)]
pub enum RenewOutcome {
    Renewed {
        lease: Lease,
        /// Time that was left on the lease when it was renewed.
        margin_ms: i64,
    },
    NotActive(Lease),
    NotFound,
}

#[derive(Debug, Clone)]
pub enum ReleaseOutcome {
    Released(Lease),
    AlreadyReleased(Lease),
    NotActive(Lease),
    NotFound,
}

#[derive(Debug, Clone)]
pub enum ForceReleaseOutcome {
    Released(Lease),
    NotHeld,
    ResourceNotFound,
}

/// Which door a fenced write came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteVia {
    /// `POST …/fence`, called by external storage.
    Fence,
    /// `PUT …/value`, the built-in store.
    Store,
}

impl WriteVia {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteVia::Fence => "fence",
            WriteVia::Store => "store",
        }
    }
}

/// A value to write into the built-in store (already validated JSON text).
#[derive(Debug, Clone)]
pub struct ValueWrite {
    pub json: String,
}

#[derive(Debug, Clone)]
pub enum FenceOutcome {
    Accepted {
        token: Token,
        accepted_token: i64,
        /// Set when a value was written.
        version: Option<i64>,
        at: DateTime<Utc>,
    },
    Rejected(FenceRejection),
}

/// Why a write was refused, with what forensics need.
#[derive(Debug, Clone)]
pub struct FenceRejection {
    /// `true`: the token was never issued; `false`: it is stale.
    pub unknown: bool,
    pub token: Token,
    pub accepted_token: i64,
    pub last_token: i64,
    /// State of the token's own lease, when it was issued.
    pub lease_state: Option<LeaseState>,
    /// The lease that fenced this one out, if any: (token, holder).
    pub fenced_by: Option<(Token, Holder)>,
    /// How long after its lease ended the write arrived.
    pub lateness_ms: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct StoredValue {
    pub json: String,
    pub token: Token,
    pub version: i64,
    pub updated_at: DateTime<Utc>,
}

/// An event about to be written.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub at: DateTime<Utc>,
    pub kind: EventKind,
    pub resource: ResourceName,
    pub token: Option<Token>,
    pub holder: Option<Holder>,
    pub detail: Json,
}

/// An event read back from the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: EventKind,
    pub resource: String,
    pub token: Option<i64>,
    pub holder: Option<String>,
    pub detail: Json,
}

#[derive(Debug, Clone)]
pub struct EventFilter {
    pub resource: Option<ResourceName>,
    pub kind: Option<EventKind>,
    /// Only events with an id greater than this.
    pub after: i64,
    pub limit: i64,
}

/// A position in the event log in retention order (oldest `at` first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventCursor {
    pub at: DateTime<Utc>,
    pub id: i64,
}

/// What one retention batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneBatch {
    /// The last event the batch looked at; `None` when nothing older than the
    /// cutoff is left after the cursor.
    pub scanned_up_to: Option<EventCursor>,
    pub scanned: usize,
    pub deleted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn activity_is_recorded_at_most_once_per_resolution() {
        let t0 = DateTime::parse_from_rfc3339("2026-12-03T10:00:00Z")
            .expect("time")
            .to_utc();
        let mut row = ResourceRow {
            name: ResourceName::parse("r").expect("name"),
            last_token: 0,
            accepted_token: 0,
            created_at: t0,
            last_activity_at: t0,
        };
        assert!(!row.note_activity(t0 + TimeDelta::milliseconds(999)));
        assert_eq!(row.last_activity_at, t0);
        // A clock read earlier than the recorded activity never moves it back.
        assert!(!row.note_activity(t0 - TimeDelta::seconds(5)));
        assert_eq!(row.last_activity_at, t0);
        let later = t0 + ResourceRow::ACTIVITY_RESOLUTION;
        assert!(row.note_activity(later));
        assert_eq!(row.last_activity_at, later);
    }
}

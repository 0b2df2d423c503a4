//! The lease rules as plain functions over already-loaded state.
//!
//! The storage layer locks a resource, loads its state, asks these functions
//! what to do, and applies the answer in the same transaction. Keeping the
//! decisions here means both database backends follow exactly one rulebook.

use chrono::{DateTime, Utc};

use super::lease::{Lease, LeaseState, Token};
use super::names::{Holder, RequestId, Ttl};

/// A lease that has just ended, with the state it ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEnding {
    pub lease: Lease,
}

/// If `active` has run out of time by `now`, returns it in state `expired`,
/// ended at its `expires_at`. Every operation on a resource calls this first,
/// so an expiry is always recorded before whatever happens next.
pub fn expire_if_due(active: &Lease, now: DateTime<Utc>) -> Option<LeaseEnding> {
    (active.state.is_active() && active.expires_at <= now).then(|| LeaseEnding {
        lease: Lease {
            state: LeaseState::Expired,
            ended_at: Some(active.expires_at),
            ..active.clone()
        },
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireDecision {
    /// The resource is free: issue a new lease with this token.
    Grant { token: Token },
    /// A retry of the request that created the live lease: hand it back.
    Existing,
    /// Someone else holds it.
    Held,
}

/// Decides an acquire. `active` is the resource's live lease after
/// [`expire_if_due`] ran; `last_issued` the highest token ever issued.
pub fn decide_acquire(
    active: Option<&Lease>,
    last_issued: i64,
    holder: &Holder,
    request_id: Option<&RequestId>,
) -> AcquireDecision {
    match active {
        None => AcquireDecision::Grant {
            token: Token::next_after(last_issued),
        },
        Some(lease)
            if request_id.is_some()
                && lease.request_id.as_ref() == request_id
                && &lease.holder == holder =>
        {
            AcquireDecision::Existing
        }
        Some(_) => AcquireDecision::Held,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewDecision {
    Renew {
        expires_at: DateTime<Utc>,
        ttl_ms: i64,
    },
    /// Renew never resurrects an ended lease.
    NotActive(LeaseState),
}

/// Decides a renewal of `lease` (already settled) at `now`, with a new TTL
/// or, when `ttl` is `None`, the lease's current one.
pub fn decide_renew(lease: &Lease, now: DateTime<Utc>, ttl: Option<Ttl>) -> RenewDecision {
    if !lease.state_at(now).is_active() {
        return RenewDecision::NotActive(lease.state_at(now));
    }
    let ttl_ms = ttl.map_or(lease.ttl_ms, Ttl::as_millis);
    RenewDecision::Renew {
        expires_at: now + chrono::Duration::milliseconds(ttl_ms),
        ttl_ms,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseDecision {
    Release,
    /// Releasing twice is fine: the answer is the same.
    AlreadyReleased,
    NotActive(LeaseState),
}

pub fn decide_release(lease: &Lease, now: DateTime<Utc>) -> ReleaseDecision {
    match lease.state_at(now) {
        LeaseState::Active => ReleaseDecision::Release,
        LeaseState::Released => ReleaseDecision::AlreadyReleased,
        other => ReleaseDecision::NotActive(other),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// A newer token has already been accepted.
    Superseded,
    /// The token's own lease has ended.
    LeaseEnded(LeaseState),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceDecision {
    /// Let the write through; the resource's accepted token becomes this.
    Accept {
        accepted_token: i64,
    },
    /// The token was never issued for this resource.
    Unknown,
    Stale(StaleReason),
}

/// Whether a write with `token` can be accepted at all, whatever its lease's
/// state: it must have been issued and must not be older than the newest
/// accepted token. `accepted_token` only rises, so once this is false for a
/// token it stays false.
pub fn may_accept(token: Token, last_issued: i64, accepted_token: i64) -> bool {
    token.get() <= last_issued && token.get() >= accepted_token
}

/// The fencing check. `lease_of_token` is the (settled) lease that `token`
/// was issued to, if the resource ever issued it.
pub fn decide_fence(
    token: Token,
    last_issued: i64,
    accepted_token: i64,
    lease_of_token: Option<&Lease>,
    now: DateTime<Utc>,
) -> FenceDecision {
    if token.get() > last_issued {
        return FenceDecision::Unknown;
    }
    if !may_accept(token, last_issued, accepted_token) {
        return FenceDecision::Stale(StaleReason::Superseded);
    }
    match lease_of_token.map(|l| l.state_at(now)) {
        Some(LeaseState::Active) => FenceDecision::Accept {
            accepted_token: accepted_token.max(token.get()),
        },
        Some(ended) => FenceDecision::Stale(StaleReason::LeaseEnded(ended)),
        // Issued but its lease row is gone: it cannot be live.
        None => FenceDecision::Stale(StaleReason::LeaseEnded(LeaseState::Expired)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{LeaseId, ResourceName};
    use chrono::TimeZone;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms)
            .single()
            .unwrap_or_default()
    }

    fn lease(token: i64, state: LeaseState, expires_ms: i64) -> Lease {
        Lease {
            lease_id: LeaseId::generate(),
            resource: ResourceName::parse("r").unwrap(),
            holder: Holder::parse("w1").unwrap(),
            token: Token::from_stored(token),
            state,
            ttl_ms: 1000,
            acquired_at: at(0),
            expires_at: at(expires_ms),
            ended_at: None,
            request_id: Some(RequestId::parse("req-1").unwrap()),
        }
    }

    #[test]
    fn a_due_lease_expires_at_its_deadline_not_at_now() {
        let l = lease(3, LeaseState::Active, 1000);
        assert_eq!(expire_if_due(&l, at(999)), None);
        let ended = expire_if_due(&l, at(5000)).unwrap().lease;
        assert_eq!(ended.state, LeaseState::Expired);
        assert_eq!(ended.ended_at, Some(at(1000)));
        // Exactly at the deadline the lease is over.
        assert!(expire_if_due(&l, at(1000)).is_some());
        // An ended lease never expires again.
        assert_eq!(expire_if_due(&ended, at(9000)), None);
    }

    #[test]
    fn acquire_grants_the_next_token_on_a_free_resource() {
        let h = Holder::parse("w2").unwrap();
        assert_eq!(
            decide_acquire(None, 0, &h, None),
            AcquireDecision::Grant {
                token: Token::from_stored(1)
            }
        );
        assert_eq!(
            decide_acquire(None, 41, &h, None),
            AcquireDecision::Grant {
                token: Token::from_stored(42)
            }
        );
    }

    #[test]
    fn acquire_on_a_held_resource_is_held_unless_it_is_the_same_request() {
        let live = lease(5, LeaseState::Active, 1000);
        let same_holder = Holder::parse("w1").unwrap();
        let other = Holder::parse("w2").unwrap();
        let req = RequestId::parse("req-1").unwrap();
        let other_req = RequestId::parse("req-2").unwrap();
        assert_eq!(
            decide_acquire(Some(&live), 5, &same_holder, Some(&req)),
            AcquireDecision::Existing
        );
        assert_eq!(
            decide_acquire(Some(&live), 5, &other, Some(&req)),
            AcquireDecision::Held
        );
        assert_eq!(
            decide_acquire(Some(&live), 5, &same_holder, Some(&other_req)),
            AcquireDecision::Held
        );
        assert_eq!(
            decide_acquire(Some(&live), 5, &same_holder, None),
            AcquireDecision::Held
        );
    }

    #[test]
    fn renew_extends_from_now_and_never_resurrects() {
        let live = lease(1, LeaseState::Active, 1000);
        assert_eq!(
            decide_renew(&live, at(400), None),
            RenewDecision::Renew {
                expires_at: at(1400),
                ttl_ms: 1000
            }
        );
        let ttl = Ttl::from_millis(5000, Ttl::DEFAULT_MAX).unwrap();
        assert_eq!(
            decide_renew(&live, at(400), Some(ttl)),
            RenewDecision::Renew {
                expires_at: at(5400),
                ttl_ms: 5000
            }
        );
        // Past its deadline, even if not yet swept.
        assert_eq!(
            decide_renew(&live, at(1000), None),
            RenewDecision::NotActive(LeaseState::Expired)
        );
        let released = lease(1, LeaseState::Released, 1000);
        assert_eq!(
            decide_renew(&released, at(10), None),
            RenewDecision::NotActive(LeaseState::Released)
        );
    }

    #[test]
    fn release_is_idempotent_but_not_for_other_endings() {
        assert_eq!(
            decide_release(&lease(1, LeaseState::Active, 1000), at(10)),
            ReleaseDecision::Release
        );
        assert_eq!(
            decide_release(&lease(1, LeaseState::Released, 1000), at(10)),
            ReleaseDecision::AlreadyReleased
        );
        assert_eq!(
            decide_release(&lease(1, LeaseState::Active, 1000), at(2000)),
            ReleaseDecision::NotActive(LeaseState::Expired)
        );
        assert_eq!(
            decide_release(&lease(1, LeaseState::ForceReleased, 1000), at(10)),
            ReleaseDecision::NotActive(LeaseState::ForceReleased)
        );
    }

    #[test]
    fn only_issued_tokens_not_older_than_the_accepted_one_may_be_accepted() {
        let t = Token::from_stored;
        assert!(may_accept(t(4), 4, 4));
        assert!(may_accept(t(3), 4, 2));
        assert!(!may_accept(t(5), 4, 0), "never issued");
        assert!(!may_accept(t(3), 4, 4), "superseded");
        // Whatever the lease's state, decide_fence never accepts what
        // may_accept rules out.
        let live = lease(3, LeaseState::Active, 1000);
        for (token, last, accepted) in [(3, 4, 4), (5, 4, 0), (1, 4, 2)] {
            let accepts = matches!(
                decide_fence(t(token), last, accepted, Some(&live), at(0)),
                FenceDecision::Accept { .. }
            );
            assert!(!accepts, "token {token}, last {last}, accepted {accepted}");
        }
    }

    #[test]
    fn fence_rules() {
        let t = Token::from_stored;
        let live = lease(4, LeaseState::Active, 1000);
        // Never issued.
        assert_eq!(
            decide_fence(t(5), 4, 0, None, at(0)),
            FenceDecision::Unknown
        );
        // Live token passes, repeatedly, and raises the accepted token.
        assert_eq!(
            decide_fence(t(4), 4, 2, Some(&live), at(0)),
            FenceDecision::Accept { accepted_token: 4 }
        );
        assert_eq!(
            decide_fence(t(4), 4, 4, Some(&live), at(0)),
            FenceDecision::Accept { accepted_token: 4 }
        );
        // Older than the accepted one.
        let old = lease(3, LeaseState::Released, 500);
        assert_eq!(
            decide_fence(t(3), 4, 4, Some(&old), at(0)),
            FenceDecision::Stale(StaleReason::Superseded)
        );
        // Not yet superseded, but its own lease ended (released or timed out).
        assert_eq!(
            decide_fence(t(3), 4, 2, Some(&old), at(0)),
            FenceDecision::Stale(StaleReason::LeaseEnded(LeaseState::Released))
        );
        assert_eq!(
            decide_fence(t(4), 4, 2, Some(&live), at(1000)),
            FenceDecision::Stale(StaleReason::LeaseEnded(LeaseState::Expired))
        );
    }
}

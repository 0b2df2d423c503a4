//! The lock operations, written once over any [`Backend`].
//!
//! Every write follows the same shape: begin, lock the resource row, read
//! the database clock, settle a due expiry, ask the domain rules, then write
//! the new state and its event in the same transaction and commit. The row
//! lock serialises everything that happens to one resource (the sweeper
//! included), which is what makes the event log a serial history.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::types::*;
use super::{Backend, ResourceTx, StoreError, StoreResult};
use crate::domain::{
    self, AcquireDecision, EventKind, FenceDecision, Lease, LeaseId, LeaseState, Reason,
    ReleaseDecision, RenewDecision, ResourceName, StaleReason, Token, Ttl,
};

fn millis_between(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds()
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn lease_event(
    kind: EventKind,
    lease: &Lease,
    at: DateTime<Utc>,
    detail: serde_json::Value,
) -> NewEvent {
    NewEvent {
        at,
        kind,
        resource: lease.resource.clone(),
        token: Some(lease.token),
        holder: Some(lease.holder.clone()),
        detail,
    }
}

/// The resource's live lease after recording the expiry of a due one.
struct Settled {
    live: Option<Lease>,
    expired: Option<Lease>,
}

async fn settle<T: ResourceTx>(
    tx: &mut T,
    name: &ResourceName,
    now: DateTime<Utc>,
) -> StoreResult<Settled> {
    let Some(active) = tx.active_lease(name).await? else {
        return Ok(Settled {
            live: None,
            expired: None,
        });
    };
    let Some(ending) = domain::expire_if_due(&active, now) else {
        return Ok(Settled {
            live: Some(active),
            expired: None,
        });
    };
    let expired = ending.lease;
    tx.update_lease(&expired).await?;
    let detail = json!({
        "expires_at": rfc3339(expired.expires_at),
        "held_ms": millis_between(expired.acquired_at, expired.expires_at),
        "noticed_late_ms": millis_between(expired.expires_at, now),
    });
    // The event's time is the instant the lease ended, not when it was noticed.
    tx.insert_event(&lease_event(
        EventKind::Expired,
        &expired,
        expired.expires_at,
        detail,
    ))
    .await?;
    tx.announce_lease_ended(name).await?;
    Ok(Settled {
        live: None,
        expired: Some(expired),
    })
}

/// Locks an existing resource row and reads the clock after the lock.
async fn lock_existing<T: ResourceTx>(
    tx: &mut T,
    name: &ResourceName,
) -> StoreResult<Option<(ResourceRow, DateTime<Utc>)>> {
    match tx.resource(name, true).await? {
        Some(row) => Ok(Some((row, tx.now().await?))),
        None => Ok(None),
    }
}

fn missing_resource(name: &ResourceName) -> StoreError {
    StoreError::Corrupt(format!("lease refers to missing resource {name:?}"))
}

fn nothing_recorded<T>(outcome: T) -> StoreResult<Recorded<T>> {
    Ok(Recorded {
        outcome,
        expired: None,
    })
}

pub async fn acquire_in<T: ResourceTx>(
    tx: &mut T,
    req: &AcquireRequest,
) -> StoreResult<Recorded<AcquireOutcome>> {
    tx.ensure_resource(&req.resource).await?;
    let (mut row, now) = lock_existing(tx, &req.resource)
        .await?
        .ok_or_else(|| missing_resource(&req.resource))?;
    let settled = settle(tx, &req.resource, now).await?;
    let decision = domain::decide_acquire(
        settled.live.as_ref(),
        row.last_token,
        &req.holder,
        req.request_id.as_ref(),
    );
    let outcome = match (decision, settled.live) {
        (AcquireDecision::Grant { token }, _) => {
            let lease = Lease {
                lease_id: req.lease_id.clone(),
                resource: req.resource.clone(),
                holder: req.holder.clone(),
                token,
                state: LeaseState::Active,
                ttl_ms: req.ttl.as_millis(),
                acquired_at: now,
                expires_at: now + req.ttl.as_chrono(),
                ended_at: None,
                request_id: req.request_id.clone(),
            };
            let detail = json!({
                "ttl_ms": lease.ttl_ms,
                "expires_at": rfc3339(lease.expires_at),
            });
            // The event first: the lease row keeps its id.
            tx.insert_event(&lease_event(EventKind::Acquired, &lease, now, detail))
                .await?;
            tx.insert_lease(&lease).await?;
            row.last_token = token.get();
            let _ = row.note_activity(now);
            tx.save_resource(&row).await?;
            AcquireOutcome::Granted {
                lease,
                expired: settled.expired.clone(),
            }
        }
        (AcquireDecision::Existing, Some(live)) => AcquireOutcome::Existing(live),
        (AcquireDecision::Held, Some(live)) => AcquireOutcome::Held { holder: live, now },
        // The rules only answer Existing/Held when there is a live lease.
        (AcquireDecision::Existing | AcquireDecision::Held, None) => {
            return Err(StoreError::Corrupt("held without a live lease".into()));
        }
    };
    Ok(Recorded {
        outcome,
        expired: settled.expired,
    })
}

/// A lease read under its resource's row lock, after settling the resource.
struct LockedLease {
    lease: Lease,
    row: ResourceRow,
    now: DateTime<Utc>,
    /// The expiry settling recorded (this lease's own, or none).
    expired: Option<Lease>,
}

/// Finds a lease by id, then locks its resource, settles it and reads the
/// lease again under the lock.
async fn lock_lease<T: ResourceTx>(tx: &mut T, id: &LeaseId) -> StoreResult<Option<LockedLease>> {
    let Some(found) = tx.lease_by_id(id).await? else {
        return Ok(None);
    };
    let (row, now) = lock_existing(tx, &found.resource)
        .await?
        .ok_or_else(|| missing_resource(&found.resource))?;
    let settled = settle(tx, &found.resource, now).await?;
    let lease = tx
        .lease_by_id(id)
        .await?
        .ok_or_else(|| StoreError::Corrupt("lease vanished under its row lock".into()))?;
    Ok(Some(LockedLease {
        lease,
        row,
        now,
        expired: settled.expired,
    }))
}

pub async fn renew_in<T: ResourceTx>(
    tx: &mut T,
    id: &LeaseId,
    ttl: Option<Ttl>,
) -> StoreResult<Recorded<RenewOutcome>> {
    let Some(LockedLease {
        lease,
        mut row,
        now,
        expired,
    }) = lock_lease(tx, id).await?
    else {
        return nothing_recorded(RenewOutcome::NotFound);
    };
    let outcome = match domain::decide_renew(&lease, now, ttl) {
        RenewDecision::Renew { expires_at, ttl_ms } => {
            let margin_ms = millis_between(now, lease.expires_at);
            let renewed = Lease {
                expires_at,
                ttl_ms,
                ..lease.clone()
            };
            tx.update_lease(&renewed).await?;
            if row.note_activity(now) {
                tx.save_resource(&row).await?;
            }
            let detail = json!({
                "ttl_ms": ttl_ms,
                "expires_at": rfc3339(expires_at),
                "previous_expires_at": rfc3339(lease.expires_at),
                "margin_ms": margin_ms,
            });
            tx.insert_event(&lease_event(EventKind::Renewed, &renewed, now, detail))
                .await?;
            RenewOutcome::Renewed {
                lease: renewed,
                margin_ms,
            }
        }
        RenewDecision::NotActive(_) => RenewOutcome::NotActive(lease),
    };
    Ok(Recorded { outcome, expired })
}

/// Ends a live lease as released or force-released, with its event.
async fn end_lease<T: ResourceTx>(
    tx: &mut T,
    lease: &Lease,
    row: &mut ResourceRow,
    state: LeaseState,
    now: DateTime<Utc>,
    extra: serde_json::Value,
) -> StoreResult<Lease> {
    let ended = Lease {
        state,
        ended_at: Some(now),
        ..lease.clone()
    };
    tx.update_lease(&ended).await?;
    if row.note_activity(now) {
        tx.save_resource(row).await?;
    }
    let mut detail = json!({ "held_ms": millis_between(ended.acquired_at, now) });
    if let (Some(d), serde_json::Value::Object(extra)) = (detail.as_object_mut(), extra) {
        d.extend(extra);
    }
    let kind = if state == LeaseState::ForceReleased {
        EventKind::ForceReleased
    } else {
        EventKind::Released
    };
    tx.insert_event(&lease_event(kind, &ended, now, detail))
        .await?;
    tx.announce_lease_ended(&ended.resource).await?;
    Ok(ended)
}

pub async fn release_in<T: ResourceTx>(
    tx: &mut T,
    id: &LeaseId,
) -> StoreResult<Recorded<ReleaseOutcome>> {
    let Some(LockedLease {
        lease,
        mut row,
        now,
        expired,
    }) = lock_lease(tx, id).await?
    else {
        return nothing_recorded(ReleaseOutcome::NotFound);
    };
    let outcome = match domain::decide_release(&lease, now) {
        ReleaseDecision::Release => {
            let ended =
                end_lease(tx, &lease, &mut row, LeaseState::Released, now, json!({})).await?;
            ReleaseOutcome::Released(ended)
        }
        ReleaseDecision::AlreadyReleased => ReleaseOutcome::AlreadyReleased(lease),
        ReleaseDecision::NotActive(_) => ReleaseOutcome::NotActive(lease),
    };
    Ok(Recorded { outcome, expired })
}

pub async fn force_release_in<T: ResourceTx>(
    tx: &mut T,
    name: &ResourceName,
    reason: &Reason,
    actor: &str,
) -> StoreResult<Recorded<ForceReleaseOutcome>> {
    let Some((mut row, now)) = lock_existing(tx, name).await? else {
        return nothing_recorded(ForceReleaseOutcome::ResourceNotFound);
    };
    let settled = settle(tx, name, now).await?;
    let outcome = match settled.live {
        Some(live) => {
            let extra = json!({ "reason": reason.as_str(), "by": actor });
            let ended =
                end_lease(tx, &live, &mut row, LeaseState::ForceReleased, now, extra).await?;
            ForceReleaseOutcome::Released(ended)
        }
        None => ForceReleaseOutcome::NotHeld,
    };
    Ok(Recorded {
        outcome,
        expired: settled.expired,
    })
}

/// The fencing check, and the value write when `write` is given, in one
/// transaction under the resource's row lock.
pub async fn fence_in<T: ResourceTx>(
    tx: &mut T,
    name: &ResourceName,
    token: Token,
    write: Option<&ValueWrite>,
) -> StoreResult<Recorded<FenceOutcome>> {
    let via = if write.is_some() {
        WriteVia::Store
    } else {
        WriteVia::Fence
    };
    let Some((mut row, now)) = lock_existing(tx, name).await? else {
        // Never used: nothing was ever issued, so the token is unknown.
        let now = tx.now().await?;
        let rejection = FenceRejection {
            unknown: true,
            token,
            accepted_token: 0,
            last_token: 0,
            lease_state: None,
            fenced_by: None,
            lateness_ms: None,
        };
        tx.insert_event(&rejection_event(name, &rejection, via, now))
            .await?;
        return Ok(Recorded {
            outcome: FenceOutcome::Rejected(rejection),
            expired: None,
        });
    };
    let settled = settle(tx, name, now).await?;
    let own_lease = if token.get() <= row.last_token {
        tx.lease_by_token(name, token).await?
    } else {
        None
    };
    let decision = domain::decide_fence(
        token,
        row.last_token,
        row.accepted_token,
        own_lease.as_ref(),
        now,
    );
    let outcome = match decision {
        FenceDecision::Accept { accepted_token } => {
            let raised = row.accepted_token != accepted_token;
            row.accepted_token = accepted_token;
            if row.note_activity(now) | raised {
                tx.save_resource(&row).await?;
            }
            let version = match write {
                Some(w) => Some(tx.upsert_value(name, &w.json, token, now).await?),
                None => None,
            };
            let mut detail = json!({ "via": via.as_str(), "accepted_token": accepted_token });
            if let (Some(d), Some(v)) = (detail.as_object_mut(), version) {
                d.insert("version".into(), v.into());
            }
            let event = NewEvent {
                at: now,
                kind: EventKind::WriteAccepted,
                resource: name.clone(),
                token: Some(token),
                holder: own_lease.as_ref().map(|l| l.holder.clone()),
                detail,
            };
            tx.insert_event(&event).await?;
            FenceOutcome::Accepted {
                token,
                accepted_token,
                version,
                at: now,
            }
        }
        FenceDecision::Unknown | FenceDecision::Stale(_) => {
            let fencer_token = if row.accepted_token > token.get() {
                Some(row.accepted_token)
            } else if row.last_token > token.get() {
                Some(row.last_token)
            } else {
                None
            };
            let fenced_by = match fencer_token {
                Some(t) => tx
                    .lease_by_token(name, Token::from_stored(t))
                    .await?
                    .map(|l| (l.token, l.holder)),
                None => None,
            };
            let lease_state = match decision {
                FenceDecision::Stale(StaleReason::LeaseEnded(state)) => Some(state),
                _ => own_lease.as_ref().map(|l| l.state_at(now)),
            };
            let rejection = FenceRejection {
                unknown: decision == FenceDecision::Unknown,
                token,
                accepted_token: row.accepted_token,
                last_token: row.last_token,
                lease_state,
                fenced_by,
                lateness_ms: own_lease
                    .as_ref()
                    .and_then(|l| l.ended_at_as_of(now))
                    .map(|ended| millis_between(ended, now)),
            };
            let mut event = rejection_event(name, &rejection, via, now);
            event.holder = own_lease.map(|l| l.holder);
            tx.insert_event(&event).await?;
            FenceOutcome::Rejected(rejection)
        }
    };
    Ok(Recorded {
        outcome,
        expired: settled.expired,
    })
}

fn rejection_event(
    name: &ResourceName,
    r: &FenceRejection,
    via: WriteVia,
    now: DateTime<Utc>,
) -> NewEvent {
    let detail = json!({
        "via": via.as_str(),
        "reason": if r.unknown { "unknown_token" } else { "stale_token" },
        "rejected_token": r.token.get(),
        "accepted_token": r.accepted_token,
        "last_token": r.last_token,
        "lease_state": r.lease_state.map(LeaseState::as_str),
        "fenced_by": r.fenced_by.as_ref().map(|(t, h)| json!({"token": t.get(), "holder": h.as_str()})),
        "lateness_ms": r.lateness_ms,
    });
    NewEvent {
        at: now,
        kind: EventKind::WriteRejected,
        resource: name.clone(),
        token: Some(r.token),
        holder: None,
        detail,
    }
}

/// Runs one `*_in` operation in a write transaction of its own.
macro_rules! in_own_transaction {
    ($b:expr, $op:ident($($arg:expr),*)) => {{
        let mut tx = $b.begin_write().await?;
        let recorded = $op(&mut tx, $($arg),*).await?;
        B::commit(tx).await?;
        Ok(recorded)
    }};
}

pub async fn acquire<B: Backend>(
    b: &B,
    req: &AcquireRequest,
) -> StoreResult<Recorded<AcquireOutcome>> {
    in_own_transaction!(b, acquire_in(req))
}

pub async fn renew<B: Backend>(
    b: &B,
    id: &LeaseId,
    ttl: Option<Ttl>,
) -> StoreResult<Recorded<RenewOutcome>> {
    in_own_transaction!(b, renew_in(id, ttl))
}

pub async fn release<B: Backend>(b: &B, id: &LeaseId) -> StoreResult<Recorded<ReleaseOutcome>> {
    in_own_transaction!(b, release_in(id))
}

pub async fn force_release<B: Backend>(
    b: &B,
    name: &ResourceName,
    reason: &Reason,
    actor: &str,
) -> StoreResult<Recorded<ForceReleaseOutcome>> {
    in_own_transaction!(b, force_release_in(name, reason, actor))
}

pub async fn fence<B: Backend>(
    b: &B,
    name: &ResourceName,
    token: Token,
    write: Option<&ValueWrite>,
) -> StoreResult<Recorded<FenceOutcome>> {
    in_own_transaction!(b, fence_in(name, token, write))
}

pub async fn expire_due_leases<B: Backend>(b: &B, limit: i64) -> StoreResult<Vec<Lease>> {
    let mut expired = Vec::new();
    for name in b.due_resources(limit).await? {
        match expire_one(b, &name).await {
            Ok(lease) => expired.extend(lease),
            // Expiries already committed must still be reported (they are
            // counted once, here); the rest wait for the next sweep.
            Err(err) if !expired.is_empty() => {
                tracing::warn!(error = %err, "expiry sweep stopped early");
                break;
            }
            Err(err) => return Err(err),
        }
    }
    Ok(expired)
}

async fn expire_one<B: Backend>(b: &B, name: &ResourceName) -> StoreResult<Option<Lease>> {
    in_own_transaction!(b, expire_in(name))
}

/// Records the expiry of `name`'s lease if it is past its deadline, and
/// returns that lease. Another instance (or an acquire) may have settled it
/// already; then there is nothing left to record.
pub async fn expire_in<T: ResourceTx>(
    tx: &mut T,
    name: &ResourceName,
) -> StoreResult<Option<Lease>> {
    let Some((_, now)) = lock_existing(tx, name).await? else {
        return Ok(None);
    };
    Ok(settle(tx, name, now).await?.expired)
}

pub async fn lease<B: Backend>(b: &B, id: &LeaseId) -> StoreResult<Option<(Lease, DateTime<Utc>)>> {
    let mut tx = b.begin_read().await?;
    let lease = tx.lease_by_id(id).await?;
    let now = tx.now().await?;
    B::commit(tx).await?;
    Ok(lease.map(|l| (l.as_of(now), now)))
}

pub async fn resource<B: Backend>(b: &B, name: &ResourceName) -> StoreResult<Option<ResourceView>> {
    let mut tx = b.begin_read().await?;
    let Some(row) = tx.resource(name, false).await? else {
        B::commit(tx).await?;
        return Ok(None);
    };
    let active = tx.active_lease(name).await?;
    let now = tx.now().await?;
    B::commit(tx).await?;
    let holder = active.filter(|l| l.state_at(now).is_active());
    Ok(Some(ResourceView { row, holder, now }))
}

pub async fn value<B: Backend>(b: &B, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
    let mut tx = b.begin_read().await?;
    let value = tx.value(name).await?;
    B::commit(tx).await?;
    Ok(value)
}

pub async fn db_now<B: Backend>(b: &B) -> StoreResult<DateTime<Utc>> {
    let mut tx = b.begin_read().await?;
    let now = tx.now().await?;
    B::commit(tx).await?;
    Ok(now)
}

//! The [`Lease`] guard: renews in the background, reports loss, releases.
//!
//! The renewer keeps a local deadline on the monotonic clock, measured from
//! when each successful renewal was *sent* (the server extended the lease
//! later than that, so the local deadline is never later than the server's).
//! If no renewal succeeds before it, the lease is reported lost even though
//! the server could not be asked: from then on the token may be fenced out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::types::{LeaseInfo, LeaseState};
use super::{Client, Error, Result};

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// The server says the lease has ended: it expired, an admin
    /// force-released it, or it was released through its id elsewhere.
    Ended(LeaseState),
    /// The server no longer knows the lease id.
    Unknown,
    /// No renewal succeeded before the lease's deadline, so it must be
    /// taken as expired.
    Unreachable { last_error: String },
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::Ended(state) => write!(f, "the lease ended ({state})"),
            LostReason::Unknown => f.write_str("the server does not know the lease"),
            LostReason::Unreachable { last_error } => write!(
                f,
                "no renewal succeeded before the lease's deadline (last error: {last_error})"
            ),
        }
    }
}

/// What the renewer last learnt, published on a `watch` channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The deadline of the last successful acquire or renewal (server clock).
    pub expires_at: DateTime<Utc>,
    /// Set once the lease is lost; it never becomes unset again.
    pub lost: Option<LostReason>,
}

impl LeaseStatus {
    pub fn is_lost(&self) -> bool {
        self.lost.is_some()
    }
}

/// A held lock. Renews itself every `renew_fraction × TTL` until
/// [`Lease::release`] or drop; watch [`Lease::lost`] (or [`Lease::watch`])
/// to learn that it was lost.
///
/// Dropping the guard without `release` stops the renewals and, when a
/// Tokio runtime is running, releases the lease in a spawned task (best
/// effort: if that fails the lease simply expires after its TTL).
pub struct Lease {
    client: Client,
    info: LeaseInfo,
    lease_id: String,
    status: watch::Receiver<LeaseStatus>,
    stop: CancellationToken,
    renewer: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for Lease {
    // The lease id is a secret: keep it out of debug output and logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.info.resource)
            .field("token", &self.info.token)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Starts the renewer for a freshly acquired lease. `deadline` is the
    /// local instant by which the lease must be assumed expired.
    pub(super) fn start(client: Client, info: LeaseInfo, deadline: Instant) -> Result<Lease> {
        let lease_id = info.lease_id.clone().ok_or_else(|| Error::Unexpected {
            status: 200,
            code: None,
            message: "the acquire answer has no lease_id".into(),
        })?;
        let ttl = Duration::from_millis(u64::try_from(info.ttl_ms).unwrap_or(100));
        let (tx, status) = watch::channel(LeaseStatus {
            expires_at: info.expires_at,
            lost: None,
        });
        let stop = CancellationToken::new();
        let renewer = tokio::spawn(renew_until_stopped(Renewer {
            client: client.clone(),
            lease_id: lease_id.clone(),
            ttl,
            deadline,
            status: tx,
            stop: stop.clone(),
        }));
        Ok(Lease {
            client,
            info,
            lease_id,
            status,
            stop,
            renewer: Some(renewer),
            released: false,
        })
    }

    /// The fencing token: send it with every write the lock protects.
    pub fn token(&self) -> i64 {
        self.info.token
    }

    pub fn resource(&self) -> &str {
        &self.info.resource
    }

    pub fn holder(&self) -> &str {
        &self.info.holder
    }

    /// The lease's deadline after the last successful renewal.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.status.borrow().expires_at
    }

    /// The lease as acquired.
    pub fn info(&self) -> &LeaseInfo {
        &self.info
    }

    /// The secret lease id (proof of ownership). Never log it.
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }

    pub fn status(&self) -> LeaseStatus {
        self.status.borrow().clone()
    }

    pub fn is_lost(&self) -> bool {
        self.status.borrow().is_lost()
    }

    /// A receiver that sees every renewal and the loss, if it comes.
    pub fn watch(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// Resolves when the lease is lost; never, while it is held.
    pub async fn lost(&self) -> LostReason {
        let mut status = self.status.clone();
        loop {
            if let Some(reason) = &status.borrow_and_update().lost {
                return reason.clone();
            }
            if status.changed().await.is_err() {
                // The renewer stopped without a loss: the lease is being
                // released, so it is never lost through this guard.
                return std::future::pending().await;
            }
        }
    }

    /// Stops renewing and releases the lease. A lease that was already lost
    /// answers [`Error::LeaseNotActive`] (or `NotFound`).
    pub async fn release(mut self) -> Result<LeaseInfo> {
        self.released = true;
        self.stop.cancel();
        if let Some(renewer) = self.renewer.take() {
            // Waiting means no renewal is in flight when the release lands.
            let _ = renewer.await;
        }
        self.client.release(&self.lease_id).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
        if self.released || self.is_lost() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let lease_id = std::mem::take(&mut self.lease_id);
            let renewer = self.renewer.take();
            runtime.spawn(async move {
                if let Some(renewer) = renewer {
                    let _ = renewer.await;
                }
                if let Err(err) = client.release(&lease_id).await {
                    tracing::warn!(error = %err, "releasing a dropped lease failed; it will expire");
                }
            });
        }
    }
}

struct Renewer {
    client: Client,
    lease_id: String,
    ttl: Duration,
    deadline: Instant,
    status: watch::Sender<LeaseStatus>,
    stop: CancellationToken,
}

impl Renewer {
    fn lose(&self, reason: LostReason) {
        tracing::warn!(%reason, "lease lost");
        self.status.send_modify(|s| s.lost = Some(reason));
    }
}

/// Renews every `renew_fraction × ttl`. After a failed renewal it retries
/// sooner (a quarter of the interval, at least 50 ms) until the deadline.
async fn renew_until_stopped(mut r: Renewer) {
    let every = r.ttl.mul_f64(r.client.renew_fraction());
    let retry_after = (every / 4).max(Duration::from_millis(50));
    // The task starts right after the grant: the first renewal is due one
    // interval from now.
    let mut next = Instant::now() + every;
    let mut last_error = String::from("none");
    loop {
        tokio::select! {
            () = r.stop.cancelled() => return,
            () = tokio::time::sleep_until(next.min(r.deadline)) => {}
        }
        let sent_at = Instant::now();
        let outcome = tokio::select! {
            () = r.stop.cancelled() => return,
            outcome = r.client.renew_once(&r.lease_id) => Some(outcome),
            () = tokio::time::sleep_until(r.deadline) => None,
        };
        match outcome {
            Some(Ok(info)) if info.state == LeaseState::Active => {
                r.deadline = sent_at + r.ttl;
                next = sent_at + every;
                r.status.send_modify(|s| s.expires_at = info.expires_at);
            }
            Some(Ok(info)) => return r.lose(LostReason::Ended(info.state)),
            Some(Err(Error::LeaseNotActive { lease, .. })) => {
                let state = lease.map_or(LeaseState::Expired, |l| l.state);
                return r.lose(LostReason::Ended(state));
            }
            Some(Err(Error::NotFound { .. })) => return r.lose(LostReason::Unknown),
            Some(Err(err)) => {
                tracing::warn!(error = %err, "lease renewal failed; retrying until its deadline");
                last_error = err.to_string();
                if Instant::now() >= r.deadline {
                    return r.lose(LostReason::Unreachable { last_error });
                }
                next = Instant::now() + retry_after;
            }
            None => return r.lose(LostReason::Unreachable { last_error }),
        }
    }
}

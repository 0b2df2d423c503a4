//! The pure domain core: validated value types and the lease rules.
//!
//! Nothing in here touches SQL, HTTP or a clock; every time is a parameter, so
//! the rules are plain functions with plain unit tests.

mod event;
mod lease;
mod names;
mod rules;
mod scope;

pub use event::{EventKind, ParseEventKindError};
pub use lease::{Lease, LeaseId, LeaseState, Token};
pub use names::{Holder, Reason, RequestId, ResourceName, Ttl, ValidationError, WaitTime};
pub use rules::{
    AcquireDecision, FenceDecision, LeaseEnding, ReleaseDecision, RenewDecision, StaleReason,
    decide_acquire, decide_fence, decide_release, decide_renew, expire_if_due, may_accept,
};
pub use scope::{ResourcePrefix, Scope};

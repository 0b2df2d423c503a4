//! Leases and fencing tokens.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use rand::RngCore;

use super::names::{Holder, RequestId, ResourceName, ValidationError};

/// A fencing token: a positive integer, strictly increasing per resource.
/// Only the server mints new ones (see [`Token::next`]); clients can only
/// present tokens they were given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(i64);

impl Token {
    /// Accepts a token a client presents. Zero and negatives were never issued.
    pub fn parse(value: i64) -> Result<Self, ValidationError> {
        if value >= 1 {
            Ok(Self(value))
        } else {
            Err(ValidationError::Token(format!(
                "token must be a positive integer (got {value})"
            )))
        }
    }

    /// Rebuilds a token read back from our own database.
    pub fn from_stored(value: i64) -> Self {
        Self(value)
    }

    /// The token the next acquisition gets, given the last one issued
    /// (0 when none was issued yet).
    pub fn next_after(last_issued: i64) -> Self {
        Self(last_issued.saturating_add(1).max(1))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The holder's secret proof of ownership, 32 hex digits: the issuing
/// instance's clock in milliseconds (48 bits), then 80 random bits.
///
/// The random bits are the secret. The time prefix only puts ids issued
/// close together next to each other in the leases primary key, so an
/// acquire appends to the index's last page instead of dirtying a random one
/// (SQLite cycles +12% in alternating pairs; docs/performance.md). Nothing
/// reads the time back: expiry runs on the database's clock, and an
/// instance whose clock is off only inserts a little away from the end.
/// It is returned only to the acquirer and never logged or put in events.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(String);

impl LeaseId {
    const HEX_LEN: usize = 32;

    pub fn generate() -> Self {
        let now_ms = u64::try_from(Utc::now().timestamp_millis()).unwrap_or(0);
        let mut secret = [0u8; 10];
        rand::rng().fill_bytes(&mut secret);
        Self::from_parts(now_ms, secret)
    }

    /// The low 48 bits of `ms` (big-endian, so ids sort by time until the
    /// year 10889), then `secret`.
    fn from_parts(ms: u64, secret: [u8; 10]) -> Self {
        let mut bytes = [0u8; 16];
        bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        bytes[6..].copy_from_slice(&secret);
        Self(hex::encode(bytes))
    }

    /// Accepts only the exact shape we generate, so a hostile path never
    /// reaches the database as a lookup key.
    pub fn parse(value: &str) -> Option<Self> {
        let well_formed = value.len() == Self::HEX_LEN
            && value
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        well_formed.then(|| Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Never print the secret, even in debug output.
impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseId(..)")
    }
}

/// Where a lease is in its life. `Active` is the only live state; the other
/// three are terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    Active,
    Released,
    Expired,
    ForceReleased,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::ForceReleased => "force_released",
        }
    }

    pub fn is_active(self) -> bool {
        self == Self::Active
    }
}

impl FromStr for LeaseState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(Self::Active),
            "released" => Ok(Self::Released),
            "expired" => Ok(Self::Expired),
            "force_released" => Ok(Self::ForceReleased),
            other => Err(format!("unknown lease state {other:?}")),
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One acquisition of a resource, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lease_id: LeaseId,
    pub resource: ResourceName,
    pub holder: Holder,
    pub token: Token,
    pub state: LeaseState,
    pub ttl_ms: i64,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// When the lease stopped being active; for an expiry that is `expires_at`.
    pub ended_at: Option<DateTime<Utc>>,
    pub request_id: Option<RequestId>,
}

impl Lease {
    /// The state as of `now`: an active lease whose time has run out is
    /// expired even if nobody has recorded that yet.
    pub fn state_at(&self, now: DateTime<Utc>) -> LeaseState {
        if self.state.is_active() && self.expires_at <= now {
            LeaseState::Expired
        } else {
            self.state
        }
    }

    /// When the lease ended as of `now`, if it has.
    pub fn ended_at_as_of(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.state_at(now) {
            LeaseState::Active => None,
            LeaseState::Expired if self.state.is_active() => Some(self.expires_at),
            _ => self.ended_at,
        }
    }

    /// This lease as `now` sees it: state and end time brought up to date.
    pub fn as_of(&self, now: DateTime<Utc>) -> Lease {
        Lease {
            state: self.state_at(now),
            ended_at: self.ended_at_as_of(now),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_start_at_one_and_only_grow() {
        assert_eq!(Token::next_after(0).get(), 1);
        assert_eq!(Token::next_after(41).get(), 42);
        assert!(Token::next_after(7) > Token::from_stored(7));
        assert!(Token::parse(0).is_err());
        assert!(Token::parse(-3).is_err());
        assert_eq!(Token::parse(9).map(Token::get), Ok(9));
    }

    #[test]
    fn lease_ids_sort_by_time_and_end_in_the_secret() {
        let early = LeaseId::from_parts(1_764_000_000_000, [0xff; 10]);
        let later = LeaseId::from_parts(1_764_000_000_001, [0; 10]);
        assert!(early.as_str() < later.as_str());
        assert_eq!(early.as_str(), "019ab697e800ffffffffffffffffffff");
        assert_eq!(LeaseId::parse(later.as_str()).as_ref(), Some(&later));
        // Issued together, two ids share the time and differ in the secret.
        let (a, b) = (LeaseId::generate(), LeaseId::generate());
        assert_ne!(&a.as_str()[12..], &b.as_str()[12..]);
        let now_ms = Utc::now().timestamp_millis();
        let issued = i64::from_str_radix(&a.as_str()[..12], 16).unwrap();
        assert!(issued <= now_ms && now_ms - issued < 60_000);
    }

    #[test]
    fn lease_ids_are_random_hex_and_parse_strictly() {
        let a = LeaseId::generate();
        let b = LeaseId::generate();
        assert_ne!(a, b);
        assert_eq!(LeaseId::parse(a.as_str()).as_ref(), Some(&a));
        assert!(LeaseId::parse("").is_none());
        assert!(LeaseId::parse(&a.as_str().to_uppercase()).is_none());
        assert!(LeaseId::parse(&format!("{}0", a.as_str())).is_none());
        assert!(LeaseId::parse("../../etc/passwd").is_none());
        assert_eq!(format!("{a:?}"), "LeaseId(..)");
    }

    #[test]
    fn lease_states_round_trip() {
        for s in [
            LeaseState::Active,
            LeaseState::Released,
            LeaseState::Expired,
            LeaseState::ForceReleased,
        ] {
            assert_eq!(s.as_str().parse::<LeaseState>(), Ok(s));
        }
        assert!("zombie".parse::<LeaseState>().is_err());
    }
}

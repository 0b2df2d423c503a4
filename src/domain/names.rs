//! Validated newtypes for everything a client sends us. Once constructed they
//! cannot hold an invalid value, so the rest of the code never re-checks them.

use std::fmt;
use std::time::Duration;

/// Why a client-supplied value was refused. Each variant maps to one stable
/// API error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{0}")]
    Resource(String),
    #[error("{0}")]
    Holder(String),
    #[error("{0}")]
    RequestId(String),
    #[error("{0}")]
    Ttl(String),
    #[error("{0}")]
    Wait(String),
    #[error("{0}")]
    Token(String),
    #[error("{0}")]
    Reason(String),
}

/// Checks the rules shared by every free-text identifier: a byte length range
/// and no control characters (they break logs, headers and terminals).
fn check_text(value: &str, what: &str, max_bytes: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if value.len() > max_bytes {
        return Err(format!(
            "{what} must be at most {max_bytes} bytes of UTF-8 (got {})",
            value.len()
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{what} must not contain control characters (found U+{:04X})",
            u32::from(c)
        ));
    }
    Ok(())
}

macro_rules! text_newtype {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $variant:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub const MAX_BYTES: usize = $max;

            pub fn parse(value: impl Into<String>) -> Result<Self, ValidationError> {
                let value = value.into();
                check_text(&value, $what, Self::MAX_BYTES).map_err(ValidationError::$variant)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

text_newtype!(
    /// A lockable resource: 1–255 bytes of UTF-8 without control characters.
    ResourceName,
    "resource name",
    255,
    Resource
);
text_newtype!(
    /// Who holds a lease (a worker name, host:pid, …): 1–255 bytes.
    Holder,
    "holder",
    255,
    Holder
);
text_newtype!(
    /// A client's idempotency key for acquire: 1–128 bytes.
    RequestId,
    "request_id",
    128,
    RequestId
);
text_newtype!(
    /// Why an admin force-released a lock: 1–1024 bytes.
    Reason,
    "reason",
    1024,
    Reason
);

/// A lease time-to-live, bounded below by [`Ttl::MIN`] and above by a
/// configurable maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ttl(Duration);

impl Ttl {
    pub const MIN: Duration = Duration::from_millis(100);
    pub const DEFAULT_MAX: Duration = Duration::from_secs(24 * 60 * 60);

    pub fn from_millis(ms: i64, max: Duration) -> Result<Self, ValidationError> {
        let min_ms = Self::MIN.as_millis();
        let max_ms = max.as_millis();
        match u64::try_from(ms) {
            Ok(ms) if u128::from(ms) >= min_ms && u128::from(ms) <= max_ms => {
                Ok(Self(Duration::from_millis(ms)))
            }
            _ => Err(ValidationError::Ttl(format!(
                "ttl_ms must be between {min_ms} and {max_ms} (got {ms})"
            ))),
        }
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }

    pub fn as_millis(self) -> i64 {
        // At most the configured maximum, which is far below i64::MAX ms.
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX)
    }

    pub fn as_chrono(self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.as_millis())
    }
}

/// How long an acquire may wait for a held resource: 0–60 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitTime(Duration);

impl WaitTime {
    pub const MAX: Duration = Duration::from_secs(60);

    pub fn from_millis(ms: i64) -> Result<Self, ValidationError> {
        match u64::try_from(ms) {
            Ok(ms) if u128::from(ms) <= Self::MAX.as_millis() => {
                Ok(Self(Duration::from_millis(ms)))
            }
            _ => Err(ValidationError::Wait(format!(
                "wait_ms must be between 0 and {} (got {ms})",
                Self::MAX.as_millis()
            ))),
        }
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_accept_unicode_and_slashes() {
        assert!(ResourceName::parse("reports/daily").is_ok());
        assert!(ResourceName::parse("склад-42 📦").is_ok());
        assert!(ResourceName::parse("x".repeat(255)).is_ok());
    }

    #[test]
    fn resource_names_reject_empty_long_and_control_chars() {
        assert!(ResourceName::parse("").is_err());
        assert!(ResourceName::parse("x".repeat(256)).is_err());
        // 128 two-byte characters = 256 bytes: the limit is in bytes.
        assert!(ResourceName::parse("é".repeat(128)).is_err());
        for bad in ["a\0b", "a\nb", "a\r\nb", "tab\t", "del\u{7f}", "c1\u{85}"] {
            assert!(ResourceName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn request_ids_are_capped_at_128_bytes() {
        assert!(RequestId::parse("r".repeat(128)).is_ok());
        assert!(RequestId::parse("r".repeat(129)).is_err());
    }

    #[test]
    fn ttl_bounds() {
        let max = Duration::from_secs(60);
        assert!(Ttl::from_millis(99, max).is_err());
        assert_eq!(Ttl::from_millis(100, max).map(Ttl::as_millis), Ok(100));
        assert!(Ttl::from_millis(60_000, max).is_ok());
        assert!(Ttl::from_millis(60_001, max).is_err());
        assert!(Ttl::from_millis(-5, max).is_err());
        assert!(Ttl::from_millis(i64::MIN, max).is_err());
    }

    #[test]
    fn wait_bounds() {
        assert!(WaitTime::from_millis(0).is_ok());
        assert!(WaitTime::from_millis(60_000).is_ok());
        assert!(WaitTime::from_millis(60_001).is_err());
        assert!(WaitTime::from_millis(-1).is_err());
    }
}

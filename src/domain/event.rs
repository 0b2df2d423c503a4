//! The kinds of events in the log.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    Acquired,
    Renewed,
    Released,
    Expired,
    ForceReleased,
    WriteAccepted,
    WriteRejected,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        Self::Acquired,
        Self::Renewed,
        Self::Released,
        Self::Expired,
        Self::ForceReleased,
        Self::WriteAccepted,
        Self::WriteRejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Renewed => "renewed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::ForceReleased => "force_released",
            Self::WriteAccepted => "write_accepted",
            Self::WriteRejected => "write_rejected",
        }
    }

    /// Does this event end a lease?
    pub fn ends_lease(self) -> bool {
        matches!(self, Self::Released | Self::Expired | Self::ForceReleased)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown event kind {0:?}; expected one of acquired, renewed, released, expired, force_released, write_accepted, write_rejected"
)]
pub struct ParseEventKindError(pub String);

impl FromStr for EventKind {
    type Err = ParseEventKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| ParseEventKindError(s.to_owned()))
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_unknown_is_refused() {
        for k in EventKind::ALL {
            assert_eq!(k.as_str().parse::<EventKind>(), Ok(k));
        }
        assert!("Acquired".parse::<EventKind>().is_err());
        assert!("".parse::<EventKind>().is_err());
    }

    #[test]
    fn only_terminal_kinds_end_a_lease() {
        let enders: Vec<_> = EventKind::ALL
            .into_iter()
            .filter(|k| k.ends_lease())
            .collect();
        assert_eq!(
            enders,
            [
                EventKind::Released,
                EventKind::Expired,
                EventKind::ForceReleased
            ]
        );
    }
}

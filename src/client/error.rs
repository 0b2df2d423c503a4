//! The client's error type: one variant per family of server error codes,
//! plus the failures that happen before an answer arrives.

use reqwest::StatusCode;
use serde::Deserialize;

use super::types::{FencedBy, HeldBy, LeaseInfo, LeaseState};
use crate::http::error::ErrorCode;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `lock_held`: another lease holds the resource.
    #[error("held by {} (token {}) until {}", holder.holder, holder.token, holder.expires_at)]
    Held { holder: HeldBy, message: String },

    /// `stale_token`: the token's lease has ended or a newer token was
    /// accepted. Whatever the write was, it must not happen.
    #[error("stale token {token} (accepted token is {accepted_token}): {message}")]
    StaleToken {
        token: i64,
        accepted_token: i64,
        /// The state of the token's own lease, when the server knows it.
        lease_state: Option<LeaseState>,
        fenced_by: Option<FencedBy>,
        message: String,
    },

    /// `unknown_token`: the token was never issued for this resource.
    #[error("unknown token {token}: {message}")]
    UnknownToken {
        token: i64,
        last_token: Option<i64>,
        message: String,
    },

    /// `lease_not_active`: the lease expired or was force-released (or, for
    /// a renewal, released).
    #[error("lease is no longer active: {message}")]
    LeaseNotActive {
        lease: Option<Box<LeaseInfo>>,
        message: String,
    },

    /// `lock_not_held`: a force-release found no live lease.
    #[error("not held: {message}")]
    NotHeld { message: String },

    /// `lease_not_found`, `resource_not_found`, `value_not_found`, and
    /// `not_found` for a path the server does not know.
    #[error("{code}: {message}")]
    NotFound { code: ErrorCode, message: String },

    /// Every `invalid_*` code and the other answers to a malformed request
    /// (`unsupported_media_type`, `payload_too_large`, `value_too_large`,
    /// `method_not_allowed`).
    #[error("{code}: {message}")]
    InvalidInput { code: ErrorCode, message: String },

    /// `unauthorized`: an admin call without the right bearer token, or a
    /// call to a server with API keys without a valid key.
    #[error("unauthorized: {message}")]
    Unauthorized { message: String },

    /// `forbidden`: the API key does not cover this resource.
    #[error("forbidden: {message}")]
    Forbidden { message: String },

    /// `unavailable`, `shutting_down`, `overloaded`, `rate_limited`,
    /// `request_timeout` and `conflict`: the server could not do it now; the same request may
    /// succeed shortly.
    #[error("{code}: {message}")]
    Unavailable { code: ErrorCode, message: String },

    /// No answer: the server is unreachable, the connection broke, or the
    /// request timed out. The request may or may not have taken effect.
    #[error("transport error: {0}")]
    Transport(#[source] reqwest::Error),

    /// `internal`, or an answer that is not the API's error shape.
    #[error("unexpected answer (HTTP {status}): {message}")]
    Unexpected {
        status: u16,
        code: Option<String>,
        message: String,
    },
}

impl Error {
    /// The server's error code, when the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Held { .. } => Some(ErrorCode::LockHeld),
            Error::StaleToken { .. } => Some(ErrorCode::StaleToken),
            Error::UnknownToken { .. } => Some(ErrorCode::UnknownToken),
            Error::LeaseNotActive { .. } => Some(ErrorCode::LeaseNotActive),
            Error::NotHeld { .. } => Some(ErrorCode::LockNotHeld),
            Error::Unauthorized { .. } => Some(ErrorCode::Unauthorized),
            Error::Forbidden { .. } => Some(ErrorCode::Forbidden),
            Error::NotFound { code, .. }
            | Error::InvalidInput { code, .. }
            | Error::Unavailable { code, .. } => Some(*code),
            Error::Unexpected { code, .. } => code.as_deref().and_then(|c| c.parse().ok()),
            Error::Transport(_) => None,
        }
    }

    /// Worth retrying as is: nothing answered, or the server said "later".
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Transport(_) | Error::Unavailable { .. })
    }

    /// Builds the error for a non-2xx answer from its status and body.
    pub(crate) fn from_response(status: StatusCode, body: &str) -> Error {
        #[derive(Deserialize)]
        struct Envelope {
            error: serde_json::Map<String, serde_json::Value>,
        }
        let Ok(Envelope { error }) = serde_json::from_str::<Envelope>(body) else {
            return Error::Unexpected {
                status: status.as_u16(),
                code: None,
                message: body.chars().take(500).collect(),
            };
        };
        let text = |key: &str| error.get(key).and_then(|v| v.as_str()).map(str::to_owned);
        let int = |key: &str| error.get(key).and_then(serde_json::Value::as_i64);
        let field = |key: &str| error.get(key).cloned().unwrap_or_default();
        let message = text("message").unwrap_or_default();
        let raw_code = text("code");
        let Some(code) = raw_code
            .as_deref()
            .and_then(|c| c.parse::<ErrorCode>().ok())
        else {
            return Error::Unexpected {
                status: status.as_u16(),
                code: raw_code,
                message,
            };
        };
        // Exhaustive on purpose: a new server code does not compile until
        // it is given its family here.
        match code {
            ErrorCode::LockHeld => match serde_json::from_value(field("holder")) {
                Ok(holder) => Error::Held { holder, message },
                Err(_) => unexpected(status, code, message),
            },
            ErrorCode::StaleToken => Error::StaleToken {
                token: int("token").unwrap_or_default(),
                accepted_token: int("accepted_token").unwrap_or_default(),
                lease_state: text("lease_state").and_then(|s| s.parse().ok()),
                fenced_by: serde_json::from_value(field("fenced_by")).ok(),
                message,
            },
            ErrorCode::UnknownToken => Error::UnknownToken {
                token: int("token").unwrap_or_default(),
                last_token: int("last_token"),
                message,
            },
            ErrorCode::LeaseNotActive => Error::LeaseNotActive {
                lease: serde_json::from_value(field("lease")).ok().map(Box::new),
                message,
            },
            ErrorCode::LockNotHeld => Error::NotHeld { message },
            ErrorCode::LeaseNotFound
            | ErrorCode::ResourceNotFound
            | ErrorCode::ValueNotFound
            | ErrorCode::NotFound => Error::NotFound { code, message },
            ErrorCode::InvalidResource
            | ErrorCode::InvalidHolder
            | ErrorCode::InvalidRequestId
            | ErrorCode::InvalidTtl
            | ErrorCode::InvalidWait
            | ErrorCode::InvalidToken
            | ErrorCode::InvalidReason
            | ErrorCode::InvalidKind
            | ErrorCode::InvalidQuery
            | ErrorCode::InvalidJson
            | ErrorCode::InvalidField
            | ErrorCode::InvalidBody
            | ErrorCode::InvalidValue
            | ErrorCode::UnsupportedMediaType
            | ErrorCode::PayloadTooLarge
            | ErrorCode::ValueTooLarge
            | ErrorCode::MethodNotAllowed => Error::InvalidInput { code, message },
            ErrorCode::Unauthorized => Error::Unauthorized { message },
            ErrorCode::Forbidden => Error::Forbidden { message },
            ErrorCode::Unavailable
            | ErrorCode::RequestTimeout
            | ErrorCode::ShuttingDown
            | ErrorCode::Conflict
            | ErrorCode::RateLimited
            | ErrorCode::Overloaded => Error::Unavailable { code, message },
            ErrorCode::Internal => unexpected(status, code, message),
        }
    }
}

#[cfg(test)]
impl Error {
    /// A minimal error of the given code, as the server would send it.
    pub(crate) fn from_code(code: ErrorCode) -> Error {
        let body = serde_json::json!({"error": {
            "code": code.as_str(),
            "message": "m",
            "holder": {"holder": "a", "token": 4, "expires_at": "2026-12-02T10:00:00.000Z"},
        }});
        Error::from_response(code.status(), &body.to_string())
    }
}

fn unexpected(status: StatusCode, code: ErrorCode, message: String) -> Error {
    Error::Unexpected {
        status: status.as_u16(),
        code: Some(code.as_str().to_owned()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_code_maps_to_a_variant_that_reports_it_back() {
        for &code in ErrorCode::ALL {
            let body = match code {
                ErrorCode::LockHeld => format!(
                    r#"{{"error":{{"code":"{code}","message":"m","holder":{{"holder":"a","token":4,"expires_at":"2026-12-02T10:00:00.000Z"}}}}}}"#
                ),
                _ => format!(r#"{{"error":{{"code":"{code}","message":"m"}}}}"#),
            };
            let err = Error::from_response(code.status(), &body);
            assert_eq!(err.code(), Some(code), "{code} became {err:?}");
        }
    }

    #[test]
    fn stale_token_carries_the_forensics() {
        let body = r#"{"error":{"code":"stale_token","message":"m","token":3,"accepted_token":5,
            "lease_state":"expired","fenced_by":{"token":5,"holder":"b"}}}"#;
        match Error::from_response(StatusCode::CONFLICT, body) {
            Error::StaleToken {
                token,
                accepted_token,
                lease_state,
                fenced_by,
                ..
            } => {
                assert_eq!((token, accepted_token), (3, 5));
                assert_eq!(lease_state, Some(LeaseState::Expired));
                assert_eq!(fenced_by.map(|f| f.holder), Some("b".to_owned()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_foreign_body_is_unexpected() {
        let err = Error::from_response(StatusCode::BAD_GATEWAY, "<html>bad gateway</html>");
        assert!(matches!(err, Error::Unexpected { status: 502, .. }));
        assert!(!err.is_retryable());
        let err = Error::from_response(
            StatusCode::IM_A_TEAPOT,
            r#"{"error":{"code":"teapot","message":"short and stout"}}"#,
        );
        assert!(matches!(err, Error::Unexpected { code: Some(ref c), .. } if c == "teapot"));
    }
}

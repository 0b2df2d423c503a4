//! The one error type every HTTP handler returns, with a stable `code`.
//!
//! The body is always `{"error": {"code", "message", ...extra}}`. Internal
//! details are logged, never sent to the client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::domain::ValidationError;
use crate::service::ServiceError;
use crate::store::StoreError;

/// Declares every error code the API can return, once: the enum, its wire
/// name, its HTTP status and the sentence the OpenAPI document shows.
macro_rules! error_codes {
    ($($variant:ident = $code:literal, $status:ident, $doc:literal;)*) => {
        /// A stable, machine-readable error code (`error.code` in a response).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $(#[doc = $doc] $variant,)*
        }

        impl ErrorCode {
            /// Every code, in documentation order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The HTTP status that always accompanies this code.
            pub fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }

            pub fn description(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $doc,)*
                }
            }
        }
    };
}

error_codes! {
    InvalidResource = "invalid_resource", BAD_REQUEST, "The resource name is empty, longer than 255 bytes, has control characters or is not one percent-encoded path segment.";
    InvalidHolder = "invalid_holder", BAD_REQUEST, "The holder is empty, longer than 255 bytes or has control characters.";
    InvalidRequestId = "invalid_request_id", BAD_REQUEST, "The request_id is empty, longer than 128 bytes or has control characters.";
    InvalidTtl = "invalid_ttl", BAD_REQUEST, "ttl_ms is below 100 or above the server's maximum TTL.";
    InvalidWait = "invalid_wait", BAD_REQUEST, "wait_ms is negative or above 60000.";
    InvalidToken = "invalid_token", BAD_REQUEST, "The token is not a positive integer.";
    InvalidReason = "invalid_reason", BAD_REQUEST, "The reason is empty, longer than 1024 bytes or has control characters.";
    InvalidKind = "invalid_kind", BAD_REQUEST, "The event kind filter names no event kind.";
    InvalidQuery = "invalid_query", BAD_REQUEST, "A query parameter is unknown, not a number or out of range.";
    InvalidJson = "invalid_json", BAD_REQUEST, "The body is not well-formed JSON.";
    InvalidField = "invalid_field", BAD_REQUEST, "A field is missing, unknown or of the wrong type.";
    InvalidBody = "invalid_body", BAD_REQUEST, "The request body could not be read.";
    InvalidValue = "invalid_value", BAD_REQUEST, "The value cannot be stored (for example a number out of range).";
    UnsupportedMediaType = "unsupported_media_type", UNSUPPORTED_MEDIA_TYPE, "The body is not sent with Content-Type: application/json.";
    PayloadTooLarge = "payload_too_large", PAYLOAD_TOO_LARGE, "The request body is larger than the server accepts.";
    ValueTooLarge = "value_too_large", PAYLOAD_TOO_LARGE, "The value is more than 1 MiB of JSON.";
    Unauthorized = "unauthorized", UNAUTHORIZED, "An admin route was called without the right Authorization: Bearer token, or, when the server has API keys, a lock API route without a valid key.";
    Forbidden = "forbidden", FORBIDDEN, "The API key is valid but its resource prefixes do not cover this resource (or this lease's resource); nothing was changed.";
    NotFound = "not_found", NOT_FOUND, "No route has this path.";
    MethodNotAllowed = "method_not_allowed", METHOD_NOT_ALLOWED, "The route does not accept this method.";
    RequestTimeout = "request_timeout", REQUEST_TIMEOUT, "The request body did not arrive within the server's body timeout; the connection is closed.";
    LeaseNotFound = "lease_not_found", NOT_FOUND, "No lease has this id.";
    ResourceNotFound = "resource_not_found", NOT_FOUND, "The resource has never been used.";
    ValueNotFound = "value_not_found", NOT_FOUND, "No value has been written for this resource.";
    LockHeld = "lock_held", CONFLICT, "Another lease holds the resource (after waiting wait_ms); `holder` tells who and until when.";
    LockNotHeld = "lock_not_held", CONFLICT, "Force-release found no live lease on the resource.";
    UnknownToken = "unknown_token", CONFLICT, "The token was never issued for this resource.";
    StaleToken = "stale_token", CONFLICT, "The token's lease has ended or a newer token was accepted; the write was refused.";
    LeaseNotActive = "lease_not_active", GONE, "The lease has expired or was force-released (or released, for renew); `lease` shows its state.";
    Conflict = "conflict", CONFLICT, "A concurrent update won; retry the request.";
    RateLimited = "rate_limited", TOO_MANY_REQUESTS, "Too many requests from this client; retry after the Retry-After seconds.";
    Overloaded = "overloaded", SERVICE_UNAVAILABLE, "Too many acquires are already waiting on this instance; retry shortly.";
    Unavailable = "unavailable", SERVICE_UNAVAILABLE, "The database is unavailable; retry shortly.";
    ShuttingDown = "shutting_down", SERVICE_UNAVAILABLE, "The server is shutting down; retry on another instance.";
    Internal = "internal", INTERNAL_SERVER_ERROR, "An unexpected server error; the details are in the server log.";
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ErrorCode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        Self::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .ok_or(())
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub extra: Map<String, Value>,
}

impl ApiError {
    /// An error with `code`; its status comes from the code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// Adds a field next to `code` and `message`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    pub fn internal() -> Self {
        Self::new(
            ErrorCode::Internal,
            "internal error; the details are in the server log",
        )
    }
}

impl From<ValidationError> for ApiError {
    fn from(err: ValidationError) -> Self {
        let code = match &err {
            ValidationError::Resource(_) => ErrorCode::InvalidResource,
            ValidationError::Holder(_) => ErrorCode::InvalidHolder,
            ValidationError::RequestId(_) => ErrorCode::InvalidRequestId,
            ValidationError::Ttl(_) => ErrorCode::InvalidTtl,
            ValidationError::Wait(_) => ErrorCode::InvalidWait,
            ValidationError::Token(_) => ErrorCode::InvalidToken,
            ValidationError::Reason(_) => ErrorCode::InvalidReason,
        };
        Self::new(code, err.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "database unavailable");
                Self::new(
                    ErrorCode::Unavailable,
                    "the database is unavailable; retry shortly",
                )
            }
            StoreError::Conflict(detail) => {
                tracing::warn!(%detail, "concurrent update conflict");
                Self::new(
                    ErrorCode::Conflict,
                    "a concurrent update won; retry the request",
                )
            }
            StoreError::InvalidData(detail) => Self::new(ErrorCode::InvalidValue, detail),
            other => {
                tracing::error!(error = %other, "storage error");
                Self::internal()
            }
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(err: ServiceError) -> Self {
        match err {
            ServiceError::Store(e) => e.into(),
            ServiceError::ShuttingDown => Self::new(
                ErrorCode::ShuttingDown,
                "the server is shutting down; retry on another instance",
            ),
            ServiceError::Overloaded => Self::new(
                ErrorCode::Overloaded,
                "too many acquires are already waiting on this instance; retry shortly",
            ),
        }
    }
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// For people; may change between versions. Match on `code`.
    pub message: String,
    /// Code-specific fields, for example `holder` with `lock_held`, `token`
    /// and `accepted_token` with `stale_token`, `lease` with
    /// `lease_not_active`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(self.as_str())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                extra: self.extra,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of a body that is arriving too slowly is not worth
            // reading: end the connection.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

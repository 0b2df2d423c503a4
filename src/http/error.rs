//! The one error type every HTTP handler returns, with a stable `code`.
//!
//! The body is always `{"error": {"code", "message", ...extra}}`. Internal
//! details are logged, never sent to the client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::domain::ValidationError;
use crate::service::ServiceError;
use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub extra: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// Adds a field next to `code` and `message`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the details are in the server log",
        )
    }
}

impl From<ValidationError> for ApiError {
    fn from(err: ValidationError) -> Self {
        let code = match &err {
            ValidationError::Resource(_) => "invalid_resource",
            ValidationError::Holder(_) => "invalid_holder",
            ValidationError::RequestId(_) => "invalid_request_id",
            ValidationError::Ttl(_) => "invalid_ttl",
            ValidationError::Wait(_) => "invalid_wait",
            ValidationError::Token(_) => "invalid_token",
            ValidationError::Reason(_) => "invalid_reason",
        };
        Self::bad_request(code, err.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "database unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the database is unavailable; retry shortly",
                )
            }
            StoreError::Conflict(detail) => {
                tracing::warn!(%detail, "concurrent update conflict");
                Self::conflict("conflict", "a concurrent update won; retry the request")
            }
            StoreError::InvalidData(detail) => Self::bad_request("invalid_value", detail),
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
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down; retry on another instance",
            ),
            ServiceError::Overloaded => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "too many acquires are already waiting on this instance; retry shortly",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), self.code.into());
        error.insert("message".into(), self.message.into());
        error.extend(self.extra);
        let mut response = (self.status, Json(json!({ "error": error }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

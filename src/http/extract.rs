//! Extractors that turn every malformed request into a clear JSON 4xx.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorCode};
use crate::domain::{LeaseId, ResourceName};

/// A JSON body: `application/json` (or `+json`) content type, parsed with
/// errors that say what is wrong.
pub struct ApiJson<T>(pub T);

/// A JSON body that may be absent (an empty body means `None`).
pub struct OptionalJson<T>(pub Option<T>);

fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mime = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<(bool, Bytes), ApiError> {
    let json_type = is_json_content_type(req.headers());
    let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
        if body_timed_out(&rejection) {
            ApiError::new(
                ErrorCode::RequestTimeout,
                "the request body did not arrive in time; send it at once",
            )
        } else if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                "request body is larger than the server accepts",
            )
        } else {
            ApiError::new(
                ErrorCode::InvalidBody,
                format!("cannot read request body: {rejection}"),
            )
        }
    })?;
    Ok((json_type, bytes))
}

/// Whether reading the body failed because the server's body deadline
/// (see `crate::http::server`) passed.
fn body_timed_out(rejection: &axum::extract::rejection::BytesRejection) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(err) = source {
        if err.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = err.source();
    }
    false
}

fn unsupported_media_type() -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedMediaType,
        "send the body as JSON with Content-Type: application/json",
    )
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|err| match err.classify() {
        serde_json::error::Category::Data => {
            ApiError::new(ErrorCode::InvalidField, err.to_string())
        }
        _ => ApiError::new(ErrorCode::InvalidJson, format!("malformed JSON: {err}")),
    })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (json_type, bytes) = read_body(req, state).await?;
        if !json_type {
            return Err(unsupported_media_type());
        }
        parse_json(&bytes).map(ApiJson)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (json_type, bytes) = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        if !json_type {
            return Err(unsupported_media_type());
        }
        parse_json(&bytes).map(|v| OptionalJson(Some(v)))
    }
}

/// The `{name}` path segment as a validated resource name.
pub struct ResourcePath(pub ResourceName);

impl<S: Send + Sync> FromRequestParts<S> for ResourcePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| {
                    ApiError::new(
                        ErrorCode::InvalidResource,
                        format!(
                            "resource name must be one percent-encoded UTF-8 path segment: {e}"
                        ),
                    )
                })?;
        Ok(ResourcePath(ResourceName::parse(raw)?))
    }
}

/// The `{lease_id}` path segment. An id that cannot exist is simply not found.
pub struct LeasePath(pub LeaseId);

impl<S: Send + Sync> FromRequestParts<S> for LeasePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| p.0)
            .unwrap_or_default();
        LeaseId::parse(&raw)
            .map(LeasePath)
            .ok_or_else(|| ApiError::new(ErrorCode::LeaseNotFound, "no lease with this id"))
    }
}

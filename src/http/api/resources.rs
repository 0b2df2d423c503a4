//! Resource state, the fence check and the built-in fenced value store.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::views::{FenceAcceptedBody, ResourceBody, ValueBody, WriteReceiptBody, timestamp};
use crate::domain::{ResourceName, Token};
use crate::http::AppState;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::extract::{ApiJson, ResourcePath};
use crate::http::keys::ClientAccess;
use crate::http::openapi::ErrorBody;
use crate::service::MAX_VALUE_BYTES;
use crate::store::{FenceOutcome, FenceRejection, ValueWrite};

/// A resource's token counters and live holder.
#[utoipa::path(
    get,
    path = "/v1/resources/{name}",
    operation_id = "show_resource",
    tag = "resources",
    params(("name" = String, Path, description = "Resource name, one percent-encoded path segment (`reports%2Fdaily`): 1–255 bytes of UTF-8, no control characters", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
    responses(
        (status = 200, description = "The resource; `holder` is null when free", body = ResourceBody),
        (status = 400, description = "`invalid_resource`", body = ErrorBody),
        (status = 404, description = "`resource_not_found`: never used", body = ErrorBody),
    )
)]
pub async fn show(
    State(state): State<AppState>,
    access: ClientAccess,
    ResourcePath(name): ResourcePath,
) -> Result<Json<ResourceBody>, ApiError> {
    access.check(&name)?;
    let view = state
        .service
        .resource(&name)
        .await?
        .ok_or_else(|| resource_not_found(&name))?;
    Ok(Json(ResourceBody::of(&view)))
}

fn resource_not_found(name: &ResourceName) -> ApiError {
    ApiError::new(
        ErrorCode::ResourceNotFound,
        format!("resource {:?} has never been used", name.as_str()),
    )
}

/// The 409 for a refused write, shared by the fence and the value store.
fn rejection(r: &FenceRejection) -> ApiError {
    if r.unknown {
        return ApiError::new(
            ErrorCode::UnknownToken,
            format!("token {} was never issued for this resource", r.token),
        )
        .with("token", r.token.get())
        .with("last_token", r.last_token);
    }
    ApiError::new(
        ErrorCode::StaleToken,
        format!(
            "token {} is stale: its lease has ended or a newer token was accepted",
            r.token
        ),
    )
    .with("token", r.token.get())
    .with("accepted_token", r.accepted_token)
    .with("lease_state", r.lease_state.map(|s| s.as_str()))
    .with(
        "fenced_by",
        r.fenced_by
            .as_ref()
            .map(|(t, h)| json!({"token": t.get(), "holder": h.as_str()})),
    )
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FenceBody {
    /// The fencing token the writer holds.
    #[schema(minimum = 1)]
    token: i64,
}

/// The check external storage calls before it writes: may this token write now?
#[utoipa::path(
    post,
    path = "/v1/resources/{name}/fence",
    tag = "resources",
    params(("name" = String, Path, description = "Resource name, one percent-encoded path segment (`reports%2Fdaily`): 1–255 bytes of UTF-8, no control characters", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
    request_body = FenceBody,
    responses(
        (status = 200, description = "Accepted; the accepted token becomes max(accepted, token)", body = FenceAcceptedBody),
        (status = 400, description = "`invalid_resource`, `invalid_token`, `invalid_json`, `invalid_field`", body = ErrorBody),
        (status = 409, description = "`stale_token` (its lease ended or a newer token was accepted; with `token`, `accepted_token`, `lease_state`, `fenced_by`) or `unknown_token` (never issued; with `last_token`)", body = ErrorBody),
    )
)]
pub async fn fence(
    State(state): State<AppState>,
    access: ClientAccess,
    ResourcePath(name): ResourcePath,
    ApiJson(body): ApiJson<FenceBody>,
) -> Result<Json<FenceAcceptedBody>, ApiError> {
    let token = Token::parse(body.token)?;
    access.check(&name)?;
    match state.service.fence(&name, token).await? {
        FenceOutcome::Accepted {
            token,
            accepted_token,
            ..
        } => Ok(Json(FenceAcceptedBody {
            token: token.get(),
            accepted_token,
        })),
        FenceOutcome::Rejected(r) => Err(rejection(&r)),
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteValueBody {
    /// The fencing token of the writer's lease.
    #[schema(minimum = 1)]
    token: i64,
    /// Any JSON value (object, array, string, number, boolean or null), at
    /// most 1 MiB.
    #[schema(value_type = Value)]
    value: Box<RawValue>,
}

/// Checks a value before it goes near the database, so both backends accept
/// exactly the same values.
fn validate_value(raw: &RawValue) -> Result<ValueWrite, ApiError> {
    let text = raw.get();
    if text.len() > MAX_VALUE_BYTES {
        return Err(ApiError::new(
            ErrorCode::ValueTooLarge,
            format!(
                "value is {} bytes of JSON; the limit is {MAX_VALUE_BYTES}",
                text.len()
            ),
        ));
    }
    // Full parse: rejects what a raw scan lets through (lone surrogates,
    // numbers out of range).
    serde_json::from_str::<serde_json::Value>(text).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidValue,
            format!("value is not storable JSON: {e}"),
        )
    })?;
    Ok(ValueWrite {
        json: text.to_owned(),
    })
}

/// The built-in fenced store: the fence check and the write in one transaction.
#[utoipa::path(
    put,
    path = "/v1/resources/{name}/value",
    tag = "resources",
    params(("name" = String, Path, description = "Resource name, one percent-encoded path segment (`reports%2Fdaily`): 1–255 bytes of UTF-8, no control characters", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
    request_body = WriteValueBody,
    responses(
        (status = 200, description = "Written", body = WriteReceiptBody,
            links(("read_value" = (operation_id = "read_value", parameters(("name" = "$request.path.name")))))
        ),
        (status = 400, description = "`invalid_resource`, `invalid_token`, `invalid_value`, `invalid_json`, `invalid_field`", body = ErrorBody),
        (status = 409, description = "`stale_token` or `unknown_token`, as for the fence; nothing was written", body = ErrorBody),
        (status = 413, description = "`value_too_large` (over 1 MiB of JSON) or `payload_too_large`", body = ErrorBody),
    )
)]
pub async fn write_value(
    State(state): State<AppState>,
    access: ClientAccess,
    ResourcePath(name): ResourcePath,
    ApiJson(body): ApiJson<WriteValueBody>,
) -> Result<Json<WriteReceiptBody>, ApiError> {
    let token = Token::parse(body.token)?;
    let value = validate_value(&body.value)?;
    access.check(&name)?;
    match state.service.write_value(&name, token, value).await? {
        FenceOutcome::Accepted {
            token, version, at, ..
        } => Ok(Json(WriteReceiptBody {
            resource: name.as_str().to_owned(),
            token: token.get(),
            // Always set when a value was written.
            version: version.unwrap_or_default(),
            updated_at: timestamp(at),
        })),
        FenceOutcome::Rejected(r) => Err(rejection(&r)),
    }
}

/// Read the built-in store's value and the token that wrote it.
#[utoipa::path(
    get,
    path = "/v1/resources/{name}/value",
    tag = "resources",
    params(("name" = String, Path, description = "Resource name, one percent-encoded path segment (`reports%2Fdaily`): 1–255 bytes of UTF-8, no control characters", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
    responses(
        (status = 200, description = "The value", body = ValueBody),
        (status = 400, description = "`invalid_resource`", body = ErrorBody),
        (status = 404, description = "`value_not_found`", body = ErrorBody),
    )
)]
pub async fn read_value(
    State(state): State<AppState>,
    access: ClientAccess,
    ResourcePath(name): ResourcePath,
) -> Result<Response, ApiError> {
    access.check(&name)?;
    let stored = state.service.value(&name).await?.ok_or_else(|| {
        ApiError::new(
            ErrorCode::ValueNotFound,
            "no value has been written for this resource",
        )
    })?;
    let raw = RawValue::from_string(stored.json).map_err(|e| {
        tracing::error!(error = %e, "stored value is not valid JSON");
        ApiError::new(ErrorCode::Internal, "stored value is corrupt")
    })?;
    let body = ValueBody {
        value: &raw,
        token: stored.token.get(),
        version: stored.version,
        updated_at: timestamp(stored.updated_at),
    };
    // Serialised straight from the stored text: numbers keep every digit.
    Ok(Json(body).into_response())
}

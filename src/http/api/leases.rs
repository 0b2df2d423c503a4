//! Acquire, renew, release and look up leases.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::views::{LeaseView, timestamp};
use crate::domain::{Holder, LeaseId, RequestId, Ttl, WaitTime};
use crate::http::AppState;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::extract::{ApiJson, LeasePath, OptionalJson, ResourcePath};
use crate::http::keys::ClientAccess;
use crate::http::openapi::ErrorBody;
use crate::store::{AcquireOutcome, AcquireRequest, ReleaseOutcome, RenewOutcome};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// Who is asking: 1–255 bytes, no control characters.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    holder: String,
    /// Lease time-to-live: 100 ms up to the server's maximum (default 24 h).
    #[schema(minimum = 100)]
    ttl_ms: i64,
    /// How long to wait for a held resource, 0–60000 ms.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 60000)]
    wait_ms: i64,
    /// Idempotency key (1–128 bytes, no control characters): a retry with
    /// the same id while the lease is active returns the same lease.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    request_id: Option<String>,
}

/// Acquire a lock and get a fencing token.
//
// Extractor failures arrive as values (not early rejections) so a refused
// request is counted as an `invalid` acquire.
#[utoipa::path(
    post,
    path = "/v1/resources/{name}/acquire",
    tag = "leases",
    params(("name" = String, Path, description = "Resource name, one percent-encoded path segment (`reports%2Fdaily`): 1–255 bytes of UTF-8, no control characters", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
    request_body = AcquireBody,
    responses(
        (status = 200, description = "Granted (or the same lease again, for a retried request_id); the token is greater than every token issued for this resource before", body = LeaseView,
            // What a client does next with a lease: the links let API
            // fuzzers (schemathesis' stateful phase) chain real calls.
            links(
                ("renew" = (operation_id = "renew", parameters(("lease_id" = "$response.body#/lease_id")))),
                ("release" = (operation_id = "release", parameters(("lease_id" = "$response.body#/lease_id")))),
                ("show_lease" = (operation_id = "show_lease", parameters(("lease_id" = "$response.body#/lease_id")))),
                ("show_resource" = (operation_id = "show_resource", parameters(("name" = "$request.path.name")))),
                ("fence" = (operation_id = "fence", parameters(("name" = "$request.path.name")), request_body = json!({"token": "$response.body#/token"}))),
                ("write_value" = (operation_id = "write_value", parameters(("name" = "$request.path.name")), request_body = json!({"token": "$response.body#/token"}))),
                ("force_release" = (operation_id = "force_release", parameters(("name" = "$request.path.name")))),
            )
        ),
        (status = 400, description = "`invalid_resource`, `invalid_holder`, `invalid_ttl`, `invalid_wait`, `invalid_request_id`, `invalid_json`, `invalid_field`", body = ErrorBody),
        (status = 409, description = "`lock_held`: still held after waiting `wait_ms`; `holder` has the holder, token and expires_at", body = ErrorBody),
        (status = 503, description = "`overloaded`: too many acquires already wait on this instance (only when `wait_ms` > 0); retry", body = ErrorBody),
    )
)]
pub async fn acquire(
    State(state): State<AppState>,
    access: ClientAccess,
    path: Result<ResourcePath, ApiError>,
    body: Result<ApiJson<AcquireBody>, ApiError>,
) -> Result<Response, ApiError> {
    let (request, wait) = acquire_request(&state, path, body).inspect_err(|_| {
        state.service.metrics().acquire_invalid();
    })?;
    access.check(&request.resource)?;
    let acquired = state.service.acquire(request, wait).await?;
    match acquired.outcome {
        AcquireOutcome::Granted { lease, .. } | AcquireOutcome::Existing(lease) => {
            Ok(Json(LeaseView::private(&lease)).into_response())
        }
        AcquireOutcome::Held { holder, .. } => Err(ApiError::new(
            ErrorCode::LockHeld,
            format!("{} is held by another holder", holder.resource),
        )
        .with(
            "holder",
            serde_json::json!({
                "holder": holder.holder.as_str(),
                "token": holder.token.get(),
                "expires_at": timestamp(holder.expires_at),
            }),
        )),
    }
}

fn acquire_request(
    state: &AppState,
    path: Result<ResourcePath, ApiError>,
    body: Result<ApiJson<AcquireBody>, ApiError>,
) -> Result<(AcquireRequest, WaitTime), ApiError> {
    let ResourcePath(resource) = path?;
    let ApiJson(body) = body?;
    let request = AcquireRequest {
        resource,
        holder: Holder::parse(body.holder)?,
        ttl: Ttl::from_millis(body.ttl_ms, state.service.limits().max_ttl)?,
        request_id: body.request_id.map(RequestId::parse).transpose()?,
        lease_id: LeaseId::generate(),
    };
    Ok((request, WaitTime::from_millis(body.wait_ms)?))
}

fn lease_not_found() -> ApiError {
    ApiError::new(ErrorCode::LeaseNotFound, "no lease with this id")
}

fn lease_not_active(lease: &crate::domain::Lease) -> ApiError {
    ApiError::new(
        ErrorCode::LeaseNotActive,
        format!("the lease has ended ({})", lease.state),
    )
    .with(
        "lease",
        serde_json::to_value(LeaseView::private(lease)).unwrap_or_default(),
    )
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// New time-to-live from now; absent (or an empty body) keeps the TTL.
    #[schema(minimum = 100)]
    ttl_ms: Option<i64>,
}

/// Extend a lease: `expires_at` becomes now + TTL.
#[utoipa::path(
    post,
    path = "/v1/leases/{lease_id}/renew",
    tag = "leases",
    params(("lease_id" = String, Path, description = "The lease id returned by acquire (a secret)")),
    request_body(content = Option<RenewBody>, description = "Optional; an empty body keeps the TTL"),
    responses(
        (status = 200, description = "Renewed", body = LeaseView),
        (status = 400, description = "`invalid_ttl`, `invalid_json`, `invalid_field`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
        (status = 410, description = "`lease_not_active`: the lease has ended (a passed deadline counts, swept or not); `lease` shows its state", body = ErrorBody),
    )
)]
pub async fn renew(
    State(state): State<AppState>,
    access: ClientAccess,
    LeasePath(id): LeasePath,
    OptionalJson(body): OptionalJson<RenewBody>,
) -> Result<Json<LeaseView>, ApiError> {
    let ttl = body
        .and_then(|b| b.ttl_ms)
        .map(|ms| Ttl::from_millis(ms, state.service.limits().max_ttl))
        .transpose()?;
    access.check_lease(&state.service, &id).await?;
    match state.service.renew(&id, ttl).await? {
        RenewOutcome::Renewed { lease, .. } => Ok(Json(LeaseView::private(&lease))),
        RenewOutcome::NotActive(lease) => Err(lease_not_active(&lease)),
        RenewOutcome::NotFound => Err(lease_not_found()),
    }
}

/// Release a lease. Releasing a released lease again is fine.
#[utoipa::path(
    post,
    path = "/v1/leases/{lease_id}/release",
    tag = "leases",
    params(("lease_id" = String, Path, description = "The lease id returned by acquire (a secret)")),
    responses(
        (status = 200, description = "Released (state `released`)", body = LeaseView),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
        (status = 410, description = "`lease_not_active`: it expired or was force-released first", body = ErrorBody),
    )
)]
pub async fn release(
    State(state): State<AppState>,
    access: ClientAccess,
    LeasePath(id): LeasePath,
) -> Result<Json<LeaseView>, ApiError> {
    access.check_lease(&state.service, &id).await?;
    match state.service.release(&id).await? {
        ReleaseOutcome::Released(lease) | ReleaseOutcome::AlreadyReleased(lease) => {
            Ok(Json(LeaseView::private(&lease)))
        }
        ReleaseOutcome::NotActive(lease) => Err(lease_not_active(&lease)),
        ReleaseOutcome::NotFound => Err(lease_not_found()),
    }
}

/// Look a lease up by its id; the state is current by the database clock.
#[utoipa::path(
    get,
    path = "/v1/leases/{lease_id}",
    operation_id = "show_lease",
    tag = "leases",
    params(("lease_id" = String, Path, description = "The lease id returned by acquire (a secret)")),
    responses(
        (status = 200, description = "The lease", body = LeaseView),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
    )
)]
pub async fn show(
    State(state): State<AppState>,
    access: ClientAccess,
    LeasePath(id): LeasePath,
) -> Result<Json<LeaseView>, ApiError> {
    let lease = state
        .service
        .lease(&id)
        .await?
        .ok_or_else(lease_not_found)?;
    access.check(&lease.resource)?;
    Ok(Json(LeaseView::private(&lease)))
}

//! Acquire, renew, release and look up leases.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::views::{LeaseView, timestamp};
use crate::domain::{Holder, LeaseId, RequestId, Ttl, WaitTime};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, LeasePath, OptionalJson, ResourcePath};
use crate::store::{AcquireOutcome, AcquireRequest, ReleaseOutcome, RenewOutcome};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    holder: String,
    ttl_ms: i64,
    #[serde(default)]
    wait_ms: i64,
    #[serde(default)]
    request_id: Option<String>,
}

/// Extractor failures arrive as values (not early rejections) so a refused
/// request is counted as an `invalid` acquire.
pub async fn acquire(
    State(state): State<AppState>,
    path: Result<ResourcePath, ApiError>,
    body: Result<ApiJson<AcquireBody>, ApiError>,
) -> Result<Response, ApiError> {
    let (request, wait) = acquire_request(&state, path, body).inspect_err(|_| {
        state.service.metrics().acquire_invalid();
    })?;
    let acquired = state.service.acquire(request, wait).await?;
    match acquired.outcome {
        AcquireOutcome::Granted { lease, .. } | AcquireOutcome::Existing(lease) => {
            Ok(Json(LeaseView::private(&lease)).into_response())
        }
        AcquireOutcome::Held { holder, .. } => Err(ApiError::conflict(
            "lock_held",
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
    ApiError::not_found("lease_not_found", "no lease with this id")
}

fn lease_not_active(lease: &crate::domain::Lease) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "lease_not_active",
        format!("the lease has ended ({})", lease.state),
    )
    .with(
        "lease",
        serde_json::to_value(LeaseView::private(lease)).unwrap_or_default(),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    ttl_ms: Option<i64>,
}

pub async fn renew(
    State(state): State<AppState>,
    LeasePath(id): LeasePath,
    OptionalJson(body): OptionalJson<RenewBody>,
) -> Result<Json<LeaseView>, ApiError> {
    let ttl = body
        .and_then(|b| b.ttl_ms)
        .map(|ms| Ttl::from_millis(ms, state.service.limits().max_ttl))
        .transpose()?;
    match state.service.renew(&id, ttl).await? {
        RenewOutcome::Renewed { lease, .. } => Ok(Json(LeaseView::private(&lease))),
        RenewOutcome::NotActive(lease) => Err(lease_not_active(&lease)),
        RenewOutcome::NotFound => Err(lease_not_found()),
    }
}

pub async fn release(
    State(state): State<AppState>,
    LeasePath(id): LeasePath,
) -> Result<Json<LeaseView>, ApiError> {
    match state.service.release(&id).await? {
        ReleaseOutcome::Released(lease) | ReleaseOutcome::AlreadyReleased(lease) => {
            Ok(Json(LeaseView::private(&lease)))
        }
        ReleaseOutcome::NotActive(lease) => Err(lease_not_active(&lease)),
        ReleaseOutcome::NotFound => Err(lease_not_found()),
    }
}

pub async fn show(
    State(state): State<AppState>,
    LeasePath(id): LeasePath,
) -> Result<Json<LeaseView>, ApiError> {
    let lease = state
        .service
        .lease(&id)
        .await?
        .ok_or_else(lease_not_found)?;
    Ok(Json(LeaseView::private(&lease)))
}

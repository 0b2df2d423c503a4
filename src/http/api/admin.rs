//! Admin routes, behind the admin bearer token.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use super::views::LeaseView;
use crate::domain::Reason;
use crate::http::AppState;
use crate::http::auth::AdminBearer;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::extract::{ApiJson, ResourcePath};
use crate::store::ForceReleaseOutcome;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForceReleaseBody {
    reason: String,
}

/// Ends the resource's live lease as `force_released`. The holder's renewals
/// get 410 and its writes `stale_token` from this instant.
pub async fn force_release(
    State(state): State<AppState>,
    _admin: AdminBearer,
    ResourcePath(name): ResourcePath,
    ApiJson(body): ApiJson<ForceReleaseBody>,
) -> Result<Json<LeaseView>, ApiError> {
    let reason = Reason::parse(body.reason)?;
    match state
        .service
        .force_release(&name, &reason, "admin (api)")
        .await?
    {
        ForceReleaseOutcome::Released(lease) => Ok(Json(LeaseView::public(&lease))),
        ForceReleaseOutcome::NotHeld => Err(ApiError::new(
            ErrorCode::LockNotHeld,
            "the resource has no live lease to release",
        )),
        ForceReleaseOutcome::ResourceNotFound => Err(ApiError::new(
            ErrorCode::ResourceNotFound,
            "the resource has never been used",
        )),
    }
}

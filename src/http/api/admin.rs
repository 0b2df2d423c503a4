//! Admin routes, behind the admin bearer token.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;

use super::views::LeaseView;
use crate::domain::Reason;
use crate::http::AppState;
use crate::http::auth::AdminBearer;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::extract::{ApiJson, ResourcePath};
use crate::http::openapi::ErrorBody;
use crate::store::ForceReleaseOutcome;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceReleaseBody {
    /// Why (1–1024 bytes, no control characters); recorded in the event log.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    reason: String,
}

/// Ends the resource's live lease as `force_released`. The holder's renewals
/// get 410 and its writes `stale_token` from this instant.
#[utoipa::path(
    post,
    path = "/v1/admin/resources/{name}/force-release",
    tag = "admin",
    params(("name" = String, Path, description = "Resource name, one percent-encoded path segment (`reports%2Fdaily`): 1–255 bytes of UTF-8, no control characters", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")),
    request_body = ForceReleaseBody,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The lease that was ended (state `force_released`, without its id)", body = LeaseView),
        (status = 400, description = "`invalid_resource`, `invalid_reason`, `invalid_json`, `invalid_field`", body = ErrorBody),
        (status = 401, description = "`unauthorized`: missing or wrong `Authorization: Bearer <admin token>`", body = ErrorBody),
        (status = 404, description = "`resource_not_found`", body = ErrorBody),
        (status = 409, description = "`lock_not_held`: no live lease", body = ErrorBody),
    )
)]
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

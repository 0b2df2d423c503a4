//! The event log: `GET /v1/events`.

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;

use super::views::{EventView, EventsBody};
use crate::domain::{EventKind, ResourceName};
use crate::http::AppState;
use crate::http::error::{ApiError, ErrorCode};
use crate::http::keys::ClientAccess;
use crate::http::openapi::ErrorBody;
use crate::store::EventFilter;

pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 1000;

/// Raw query parameters; every one is validated by hand so each mistake
/// gets its own message. Empty values mean "not set".
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events of this resource (a resource name: at most 255 bytes,
    /// no control characters).
    #[param(max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")]
    resource: Option<String>,
    /// Only events of this kind: acquired, renewed, released, expired,
    /// force_released, write_accepted, write_rejected.
    #[param(
        pattern = "^(acquired|renewed|released|expired|force_released|write_accepted|write_rejected)?$"
    )]
    kind: Option<String>,
    /// Only events with an id greater than this (default 0).
    #[param(value_type = Option<i64>, minimum = 0)]
    after: Option<String>,
    /// 1–1000, default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.is_empty())
}

impl EventsQuery {
    pub fn into_filter(self) -> Result<EventFilter, ApiError> {
        let resource = non_empty(self.resource)
            .map(ResourceName::parse)
            .transpose()?;
        let kind = non_empty(self.kind)
            .map(|k| k.parse::<EventKind>())
            .transpose()
            .map_err(|e| ApiError::new(ErrorCode::InvalidKind, e.to_string()))?;
        let after = match non_empty(self.after) {
            None => 0,
            Some(raw) => raw.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("after must be a non-negative integer event id (got {raw:?})"),
                )
            })?,
        };
        let limit = match non_empty(self.limit) {
            None => DEFAULT_LIMIT,
            Some(raw) => raw
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidQuery,
                        format!("limit must be an integer from 1 to {MAX_LIMIT} (got {raw:?})"),
                    )
                })?,
        };
        Ok(EventFilter {
            resource,
            kind,
            after,
            limit,
        })
    }
}

/// The event log, in ascending id order; page with `after=next_after`.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of events", body = EventsBody),
        (status = 400, description = "`invalid_query`, `invalid_kind`, `invalid_resource`", body = ErrorBody),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    access: ClientAccess,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let filter = query.into_filter()?;
    access.check_events(filter.resource.as_ref())?;
    let events = state.service.events(&filter).await?;
    let next_after = events.last().map_or(filter.after, |e| e.id);
    let body = EventsBody {
        events: events.iter().map(EventView::of).collect(),
        next_after,
    };
    Ok(Json(body).into_response())
}

//! The event log: `GET /v1/events`.

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::views::{EventView, EventsBody};
use crate::domain::{EventKind, ResourceName};
use crate::http::AppState;
use crate::http::error::{ApiError, ErrorCode};
use crate::store::EventFilter;

pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 1000;

/// Raw query parameters; every one is validated by hand so each mistake
/// gets its own message. Empty values mean "not set".
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    resource: Option<String>,
    kind: Option<String>,
    after: Option<String>,
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

pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let filter = query.into_filter()?;
    let events = state.service.events(&filter).await?;
    let next_after = events.last().map_or(filter.after, |e| e.id);
    let body = EventsBody {
        events: events.iter().map(EventView::of).collect(),
        next_after,
    };
    Ok(Json(body).into_response())
}

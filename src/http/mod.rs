//! HTTP: one router for the JSON API (`api`) and the health checks, with
//! the middleware applied in one place.

pub mod api;
pub mod auth;
pub mod error;
pub mod extract;
mod health;
mod metrics;

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;

use crate::service::{LockService, MAX_VALUE_BYTES};
use auth::AdminToken;
use error::ApiError;

/// The largest request body: a maximal value plus room for its envelope.
pub const MAX_BODY_BYTES: usize = MAX_VALUE_BYTES + 64 * 1024;

/// Everything a handler can reach; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub service: LockService,
    pub admin_token: AdminToken,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(api::routes())
        .merge(health::routes())
        .merge(metrics::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Layers wrap what is above them, so the last one added runs first:
        // the body limit is enforced by the extractors, a panic becomes a
        // JSON 500, and the access log and the request metrics see the final
        // status of everything.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; the details are in the server log",
            )
            .into_response()
        }))
        .layer(middleware::from_fn_with_state(state.clone(), log_request))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track_request,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}

/// One log line per request. It names the route template, never the raw
/// path: paths can carry lease ids, which are secrets.
async fn log_request(State(_): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "<unmatched>".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(req).await;
    let status = response.status().as_u16();
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    if response.status().is_server_error() {
        tracing::warn!(%method, %route, status, latency_ms, "request");
    } else {
        tracing::info!(%method, %route, status, latency_ms, "request");
    }
    response
}

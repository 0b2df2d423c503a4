//! HTTP: one router for the JSON API (`api`), the web UI (`ui`) and the
//! health checks, with
//! the middleware applied in one place.

pub mod api;
pub mod auth;
pub mod error;
pub mod extract;
mod health;
pub mod keys;
pub mod limits;
mod metrics;
pub mod openapi;
pub mod server;
pub mod ui;

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;

use crate::service::{LockService, MAX_VALUE_BYTES};
use auth::AdminToken;
use error::{ApiError, ErrorCode};

/// The largest request body: a maximal value plus room for its envelope.
pub const MAX_BODY_BYTES: usize = MAX_VALUE_BYTES + 64 * 1024;

/// Everything a handler can reach; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Behind an `Arc`: the state is cloned for every request, and the
    /// service holds many handles (store, metrics, waiters).
    pub service: std::sync::Arc<LockService>,
    pub admin_token: AdminToken,
    /// Who may read the web UI.
    pub ui_access: ui::UiAccess,
    /// Per-client rate limit; `None` when disabled.
    pub rate_limiter: Option<std::sync::Arc<limits::RateLimiter>>,
    /// Client API keys for the lock API; `None`: the API is open.
    pub api_keys: Option<std::sync::Arc<keys::ApiKeys>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        // The API, the health checks, the metrics and the OpenAPI document.
        .merge(openapi::documented_routes().split_for_parts().0)
        .merge(ui::routes(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Layers wrap what is above them, so the last one added runs first:
        // the body limit is enforced by the extractors, a panic becomes a
        // JSON 500, the rate limit answers before any work is done, every
        // response gets the security headers, and the access log and the
        // request metrics see the final status of everything.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(
                ErrorCode::Internal,
                "internal error; the details are in the server log",
            )
            .into_response()
        }))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limits::rate_limit,
        ))
        .layer(middleware::from_fn(security_headers))
        .layer(middleware::from_fn_with_state(state.clone(), log_request))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track_request,
        ))
        .with_state(state)
}

/// Headers every response carries unless a handler set its own: no
/// sniffing, no framing (clickjacking on the admin form), no inline script,
/// no referrer leaking resource names to other sites.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    ] {
        headers
            .entry(name)
            .or_insert(HeaderValue::from_static(value));
    }
    response
}

/// Scripts only from our own origin (no inline script, no eval); styles may
/// be inline (server-rendered SVG uses style attributes); never framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
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

//! `GET /metrics` (Prometheus text format) and the middleware that times
//! every request by its matched route template.

use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::AppState;
use super::error::ApiError;

/// The `route` label of requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "<unmatched>";

pub fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(exposition))
}

async fn exposition(State(state): State<AppState>) -> Result<Response, ApiError> {
    let text = state.service.metrics().render().map_err(|err| {
        tracing::error!(error = %err, "cannot encode metrics");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "cannot encode metrics",
        )
    })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Observes `palisade_http_request_duration_seconds`. The route label is the
/// matched template (`/v1/leases/{lease_id}`), never the raw path: paths
/// carry lease ids, which are secrets, and would make cardinality unbounded.
pub async fn track_request(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED_ROUTE.to_owned(), |p| p.as_str().to_owned());
    let response = next.run(req).await;
    state.service.metrics().http_request(
        &route,
        method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Standard methods by name; anything else a client invents is `other`, so
/// it cannot grow the label set.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

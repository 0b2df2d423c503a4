//! Liveness and readiness probes.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Value, json};

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// The process is up and serving.
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The database is reachable: send traffic here.
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    if state.service.ready().await {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({ "status": "unavailable", "error": {"code": "unavailable", "message": "the database is unreachable"} }),
            ),
        )
    }
}

//! Liveness and readiness probes.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;

pub fn documented_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// The process is up and serving.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Object))
)]
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The database is reachable: send traffic here.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "meta",
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = Object),
        (status = 503, description = "`unavailable`: the database is unreachable", body = Object),
    )
)]
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

//! The JSON API, v1. Handlers are thin: extract and validate, call the
//! service, map the outcome to a status and body.

mod admin;
mod events;
mod leases;
mod resources;
pub mod views;

use axum::Router;
use axum::routing::{get, post};

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/resources/{name}", get(resources::show))
        .route("/v1/resources/{name}/acquire", post(leases::acquire))
        .route("/v1/resources/{name}/fence", post(resources::fence))
        .route(
            "/v1/resources/{name}/value",
            get(resources::read_value).put(resources::write_value),
        )
        .route("/v1/leases/{lease_id}", get(leases::show))
        .route("/v1/leases/{lease_id}/renew", post(leases::renew))
        .route("/v1/leases/{lease_id}/release", post(leases::release))
        .route("/v1/events", get(events::list))
        .route(
            "/v1/admin/resources/{name}/force-release",
            post(admin::force_release),
        )
}

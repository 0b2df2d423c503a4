//! The JSON API, v1. Handlers are thin: extract and validate, call the
//! service, map the outcome to a status and body. Each is registered with
//! `routes!`, which also puts its `#[utoipa::path]` into the OpenAPI
//! document, so a route cannot exist undocumented.

mod admin;
mod events;
mod leases;
mod resources;
pub mod views;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;

pub fn documented_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(resources::show))
        .routes(routes!(leases::acquire))
        .routes(routes!(resources::fence))
        .routes(routes!(resources::read_value, resources::write_value))
        .routes(routes!(leases::show))
        .routes(routes!(leases::renew))
        .routes(routes!(leases::release))
        .routes(routes!(events::list))
        .routes(routes!(admin::force_release))
}

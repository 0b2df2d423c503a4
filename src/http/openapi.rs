//! The OpenAPI 3.1 document of the HTTP API, generated from the handlers'
//! `#[utoipa::path]` annotations and the response types, so it cannot drift
//! from the router: the documented routes *are* the router's routes.
//! Served at `GET /v1/openapi.json`.

use axum::Json;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use super::error::ErrorBody;
use super::error::{ErrorCode, ErrorDetail};
use super::{AppState, api, health, metrics};

/// Codes any operation can answer besides its own: a body the server will
/// not read, a route or method that does not exist, and server trouble.
pub const GENERIC_CODES: &[ErrorCode] = &[
    ErrorCode::PayloadTooLarge,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::InvalidBody,
    ErrorCode::NotFound,
    ErrorCode::MethodNotAllowed,
    ErrorCode::RequestTimeout,
    ErrorCode::Conflict,
    ErrorCode::RateLimited,
    ErrorCode::Unavailable,
    ErrorCode::ShuttingDown,
    ErrorCode::Internal,
];

impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        let mut table = String::from(
            "A stable error code. Every code the API returns, with its HTTP status:\n\n\
             | code | status | meaning |\n|---|---|---|\n",
        );
        for code in ErrorCode::ALL {
            table.push_str(&format!(
                "| `{}` | {} | {} |\n",
                code.as_str(),
                code.status().as_u16(),
                code.description()
            ));
        }
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
            .description(Some(table))
            .into()
    }
}

impl ToSchema for ErrorCode {}

struct AdminTokenScheme;

impl Modify for AdminTokenScheme {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The server's admin token (PALISADE_ADMIN_TOKEN, or the one it logged at start)",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A client API key from the server's --api-keys-file (or the admin token, \
                         which covers every resource). Needed only when the server has keys.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Tags of the operations that need an API key when the server has keys.
const KEYED_TAGS: &[&str] = &["leases", "resources", "events"];

fn is_keyed(operation: &Operation) -> bool {
    operation
        .tags
        .iter()
        .flatten()
        .any(|t| KEYED_TAGS.contains(&t.as_str()))
}

/// A response with the JSON error body.
fn error_response(description: impl Into<String>) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

/// The key requirement and its two refusals, on every keyed operation: no
/// requirement (keys off) or the `api_key` bearer (keys on).
fn add_api_key_security(operation: &mut Operation) {
    operation.security = Some(vec![
        SecurityRequirement::default(),
        SecurityRequirement::new("api_key", Vec::<String>::new()),
    ]);
    for (status, description) in [
        (
            "401",
            "`unauthorized`: the server has API keys and none, or an unknown one, was sent",
        ),
        (
            "403",
            "`forbidden`: the API key's prefixes do not cover the resource; nothing changed",
        ),
    ] {
        let response = error_response(description);
        operation
            .responses
            .responses
            .insert(status.into(), response.into());
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Palisade",
        description = "A lock service with fencing tokens, a fenced value store and an event log. \
            Every error is `{\"error\": {\"code\", \"message\", ...}}`; the `ErrorCode` schema lists every code."
    ),
    tags(
        (name = "leases", description = "Acquire, renew, release and look up leases"),
        (name = "resources", description = "Resource state, the fence check and the fenced value store"),
        (name = "events", description = "The event log"),
        (name = "admin", description = "Admin actions (bearer admin token)"),
        (name = "meta", description = "Health checks and this document"),
    ),
    components(schemas(ErrorBody, ErrorDetail, ErrorCode)),
    modifiers(&AdminTokenScheme)
)]
struct ApiDoc;

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json"))
)]
async fn openapi_json() -> Json<Document> {
    Json(document())
}

/// Every documented route: the API, the health checks, the metrics and
/// this document.
pub fn documented_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(api::documented_routes())
        .merge(health::documented_routes())
        .merge(metrics::documented_routes())
        .routes(routes!(openapi_json))
}

/// The OpenAPI document, with the generic error responses on every
/// operation.
pub fn document() -> Document {
    let (_, mut doc) = documented_routes().split_for_parts();
    let generic = error_response(format!(
        "Errors any request can get: {}",
        GENERIC_CODES
            .iter()
            .map(|c| format!("`{}` ({})", c.as_str(), c.status().as_u16()))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for item in doc.paths.paths.values_mut() {
        for operation in operations(item) {
            if is_keyed(operation) {
                add_api_key_security(operation);
            }
            operation
                .responses
                .responses
                .insert("default".into(), generic.clone().into());
        }
    }
    doc
}

/// The operations of a path item, whatever their method.
pub fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

//! The operator's web UI: server-rendered askama pages made live with htmx
//! polling. Handlers are thin (parse the query, call the service, fill one
//! template struct); the timeline's geometry lives in `timeline`.
//!
//! htmx requests (`HX-Request: true`) get only the live part of a page, and
//! a poll with nothing new gets `204 No Content`, which htmx leaves alone.

mod admin;
mod assets;
mod events;
mod format;
mod lease;
mod overview;
mod resources;
pub mod session;
mod timeline;

use askama::Template;
use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use super::AppState;
use super::error::ApiError;
use crate::domain::{ResourceName, ValidationError};
use crate::service::ServiceError;
use crate::store::StoreError;
pub use session::{UiAccess, Viewer};

pub fn routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/", get(overview::page))
        .route("/ui", get(overview::page))
        .route("/ui/resources", get(resources::page))
        .route("/ui/resources/{name}", get(timeline::page))
        .route("/ui/resources/{name}/leases/{token}", get(lease::page))
        .route(
            "/ui/resources/{name}/force-release",
            post(admin::force_release),
        )
        .route("/ui/events", get(events::page))
        .route(
            "/ui/sign-in",
            get(session::sign_in_form).post(session::sign_in),
        )
        .route("/ui/sign-out", post(session::sign_out))
        .route("/static/{file}", get(assets::serve))
        .route_layer(middleware::from_fn_with_state(state, session::ui_gate))
}

/// Is this an htmx request (wanting only the live part of the page)?
pub fn is_htmx(headers: &HeaderMap) -> bool {
    headers
        .get("hx-request")
        .is_some_and(|v| v.as_bytes() == b"true")
}

/// Renders a template as an HTML response with the UI's security headers.
pub fn render(template: &impl Template) -> Response {
    match template.render() {
        Ok(body) => with_security_headers(Html(body).into_response()),
        Err(err) => {
            tracing::error!(error = %err, "template rendering failed");
            UiError::internal().into_response()
        }
    }
}

/// Nothing new for a live poll: htmx keeps what it shows.
pub fn no_change() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    // Everything is served from this origin; no inline script or style, so
    // an injected tag would not run even if escaping ever failed.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An error shown as an HTML page (or fragment) instead of JSON.
#[derive(Debug)]
pub struct UiError {
    pub status: StatusCode,
    pub message: String,
}

impl UiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error; the details are in the server log",
        )
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    viewer: Viewer,
    status: u16,
    reason: &'a str,
    message: &'a str,
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let page = ErrorPage {
            viewer: Viewer::anonymous(),
            status: self.status.as_u16(),
            reason: self.status.canonical_reason().unwrap_or("Error"),
            message: &self.message,
        };
        let mut response = render(&page);
        *response.status_mut() = self.status;
        response
    }
}

impl From<ApiError> for UiError {
    fn from(err: ApiError) -> Self {
        Self::new(err.status(), err.message)
    }
}

impl From<ServiceError> for UiError {
    fn from(err: ServiceError) -> Self {
        ApiError::from(err).into()
    }
}

impl From<StoreError> for UiError {
    fn from(err: StoreError) -> Self {
        ApiError::from(err).into()
    }
}

impl From<ValidationError> for UiError {
    fn from(err: ValidationError) -> Self {
        Self::bad_request(err.to_string())
    }
}

/// A resource name from a path segment (already percent-decoded by axum).
pub fn resource_name(raw: String) -> Result<ResourceName, UiError> {
    Ok(ResourceName::parse(raw)?)
}

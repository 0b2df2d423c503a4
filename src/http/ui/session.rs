//! Who is looking at the UI: read access, the admin sign-in cookie and CSRF
//! protection for every form that changes state.
//!
//! Cookies carry no server-side session: a session cookie is an expiry and
//! an HMAC of it keyed by the admin (or UI) token, so every instance sharing
//! the token accepts it and changing the token signs everyone out. A form's
//! CSRF token is an HMAC of a random per-browser cookie; a forged form from
//! another site can neither read that cookie nor compute the token.

use std::net::SocketAddr;

use askama::Template;
use axum::extract::{Form, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::Deserialize;
use sha2::Sha256;

use super::{UiError, render};
use crate::http::AppState;
use crate::http::auth::AdminToken;

const SESSION_COOKIE: &str = "palisade_session";
const CSRF_COOKIE: &str = "palisade_csrf";
/// How long a sign-in lasts.
const SESSION_SECONDS: i64 = 12 * 3600;

/// Who may read the UI.
#[derive(Clone, Debug)]
pub struct UiAccess {
    /// `PALISADE_UI_TOKEN`: a read-only sign-in, when set.
    pub read_token: Option<AdminToken>,
    /// Reads need no sign-in (loopback address and no UI token).
    pub open_reads: bool,
}

impl UiAccess {
    /// Open on a loopback address unless a UI token is configured; else
    /// readers sign in with the UI token or the admin token.
    pub fn for_listener(addr: Option<SocketAddr>, read_token: Option<String>) -> Self {
        let read_token = read_token.filter(|t| !t.is_empty()).map(AdminToken::new);
        let loopback = addr.is_some_and(|a| a.ip().is_loopback());
        Self {
            open_reads: loopback && read_token.is_none(),
            read_token,
        }
    }
}

/// The request's viewer, put in the request extensions by [`ui_gate`].
#[derive(Clone, Debug, Default)]
pub struct Viewer {
    pub admin: bool,
    pub reader: bool,
    /// The token every form of this page carries.
    pub csrf: String,
    pub open_reads: bool,
}

impl Viewer {
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Show the sign-out button?
    pub fn signed_in(&self) -> bool {
        self.admin || self.reader
    }
}

type HmacSha256 = Hmac<Sha256>;

fn sign(key: &AdminToken, message: &str) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let Ok(mut mac) = HmacSha256::new_from_slice(key.expose().as_bytes()) else {
        return String::new();
    };
    mac.update(message.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Admin,
    Reader,
}

impl Role {
    fn tag(self) -> &'static str {
        match self {
            Role::Admin => "a",
            Role::Reader => "r",
        }
    }
}

fn session_value(key: &AdminToken, role: Role, expires: i64) -> String {
    let tag = role.tag();
    format!(
        "{tag}.{expires}.{}",
        sign(key, &format!("session|{tag}|{expires}"))
    )
}

fn session_role(value: &str, state: &AppState, now: i64) -> Option<Role> {
    let mut parts = value.splitn(3, '.');
    let (tag, expires, _) = (parts.next()?, parts.next()?, parts.next()?);
    let expires: i64 = expires.parse().ok()?;
    if expires < now {
        return None;
    }
    let role = match tag {
        "a" => Role::Admin,
        "r" => Role::Reader,
        _ => return None,
    };
    let key = match role {
        Role::Admin => &state.admin_token,
        Role::Reader => state.ui_access.read_token.as_ref()?,
    };
    constant_time_eq(value, &session_value(key, role, expires)).then_some(role)
}

fn set_cookie(name: &str, value: &str, max_age: i64) -> HeaderValue {
    // Secure: browsers still store it for http://localhost and 127.0.0.1,
    // which count as secure origins; anywhere else the UI belongs behind TLS.
    let text =
        format!("{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; Secure; SameSite=Strict");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn random_hex() -> String {
    let mut bytes = [0u8; 18];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Requests from a page of another origin carry its `Origin`; refuse them
/// before looking at anything else.
fn cross_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    origin == "null" || origin_host != host
}

/// The UI's gate: works out the viewer, keeps a CSRF cookie in the browser,
/// sends readers without access to the sign-in page, and refuses
/// state-changing requests without a valid CSRF token.
pub async fn ui_gate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let now = unix_now();
    let headers = req.headers();
    let role = cookie(headers, SESSION_COOKIE).and_then(|v| session_role(v, &state, now));
    let existing_csrf = cookie(headers, CSRF_COOKIE)
        .filter(|v| v.len() == 36 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned);
    let new_csrf = existing_csrf.is_none().then(random_hex);
    let csrf_cookie = existing_csrf
        .clone()
        .or(new_csrf.clone())
        .unwrap_or_default();
    let viewer = Viewer {
        admin: role == Some(Role::Admin),
        reader: role.is_some(),
        csrf: sign(&state.admin_token, &format!("csrf|{csrf_cookie}")),
        open_reads: state.ui_access.open_reads,
    };
    let path = req.uri().path();
    let public = path == "/ui/sign-in" || path.starts_with("/static/");
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if cross_origin(req.headers()) {
            return UiError::new(StatusCode::FORBIDDEN, "cross-origin form refused")
                .into_response();
        }
        // The CSRF token itself is checked by the handler, which reads the
        // form; a browser without the cookie cannot have a valid token.
        if existing_csrf.is_none() {
            return UiError::new(
                StatusCode::FORBIDDEN,
                "this form has expired; reload the page and try again",
            )
            .into_response();
        }
    }
    if !public && !viewer.reader && !state.ui_access.open_reads {
        let target = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let mut response = if super::is_htmx(req.headers()) {
            StatusCode::UNAUTHORIZED.into_response()
        } else {
            Redirect::to(&format!("/ui/sign-in?next={}", super::format::enc(&target)))
                .into_response()
        };
        if let Some(fresh) = &new_csrf {
            response.headers_mut().append(
                header::SET_COOKIE,
                set_cookie(CSRF_COOKIE, fresh, 86_400 * 30),
            );
        }
        return response;
    }
    req.extensions_mut().insert(viewer);
    let mut response = next.run(req).await;
    if let Some(fresh) = &new_csrf {
        response.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(CSRF_COOKIE, fresh, 86_400 * 30),
        );
    }
    response
}

/// Checks a form's CSRF token against the viewer's.
pub fn check_csrf(viewer: &Viewer, presented: &str) -> Result<(), UiError> {
    if !viewer.csrf.is_empty() && constant_time_eq(&viewer.csrf, presented) {
        Ok(())
    } else {
        Err(UiError::new(
            StatusCode::FORBIDDEN,
            "the form's security token is missing or wrong; reload the page and try again",
        ))
    }
}

/// Only same-site paths: never an open redirect.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') => n.to_owned(),
        _ => "/".to_owned(),
    }
}

#[derive(Template)]
#[template(path = "sign_in.html")]
struct SignInPage {
    viewer: Viewer,
    next: String,
    error: Option<String>,
    read_token: bool,
}

#[derive(Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

pub async fn sign_in_form(
    State(state): State<AppState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Query(q): Query<NextQuery>,
) -> Response {
    render(&SignInPage {
        viewer,
        next: safe_next(q.next.as_deref()),
        error: None,
        read_token: state.ui_access.read_token.is_some(),
    })
}

#[derive(Deserialize)]
pub struct SignInForm {
    token: String,
    csrf: String,
    next: Option<String>,
}

pub async fn sign_in(
    State(state): State<AppState>,
    axum::Extension(viewer): axum::Extension<Viewer>,
    Form(form): Form<SignInForm>,
) -> Result<Response, UiError> {
    check_csrf(&viewer, &form.csrf)?;
    let presented = form.token.trim();
    let role = if state.admin_token.matches(presented) {
        Some(Role::Admin)
    } else if state
        .ui_access
        .read_token
        .as_ref()
        .is_some_and(|t| t.matches(presented))
    {
        Some(Role::Reader)
    } else {
        None
    };
    let next = safe_next(form.next.as_deref());
    let Some(role) = role else {
        tracing::warn!("UI sign-in with a wrong token");
        let mut response = render(&SignInPage {
            viewer,
            next,
            error: Some("That token is not valid.".to_owned()),
            read_token: state.ui_access.read_token.is_some(),
        });
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(response);
    };
    let key = match role {
        Role::Admin => &state.admin_token,
        Role::Reader => state
            .ui_access
            .read_token
            .as_ref()
            .unwrap_or(&state.admin_token),
    };
    let value = session_value(key, role, unix_now() + SESSION_SECONDS);
    let mut response = Redirect::to(&next).into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, &value, SESSION_SECONDS),
    );
    Ok(response)
}

#[derive(Deserialize)]
pub struct CsrfOnly {
    csrf: String,
}

pub async fn sign_out(
    axum::Extension(viewer): axum::Extension<Viewer>,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, UiError> {
    check_csrf(&viewer, &form.csrf)?;
    let mut response = Redirect::to("/").into_response();
    response
        .headers_mut()
        .append(header::SET_COOKIE, set_cookie(SESSION_COOKIE, "", 0));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("x_palisade_session=1; palisade_session=a.2.ff"),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("a.2.ff"));
        assert_eq!(cookie(&h, CSRF_COOKIE), None);
    }

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(
            safe_next(Some("/ui/events?kind=expired")),
            "/ui/events?kind=expired"
        );
        assert_eq!(safe_next(Some("//evil.example")), "/");
        assert_eq!(safe_next(Some("https://evil.example")), "/");
        assert_eq!(safe_next(None), "/");
    }

    #[test]
    fn origin_must_match_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7070"));
        assert!(!cross_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7070"),
        );
        assert!(!cross_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(cross_origin(&h));
    }
}

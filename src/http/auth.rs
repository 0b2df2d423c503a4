//! The admin token and the bearer-token check for admin API routes.
//! (Client API keys for the lock API are in `keys`.)

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use rand::RngCore;

use super::error::ApiError;

/// The secret that unlocks admin actions. Compared in constant time.
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl AdminToken {
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        Self(token.into())
    }

    /// A fresh random token, for when none is configured.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 24];
        rand::rng().fill_bytes(&mut bytes);
        Self::new(hex::encode(bytes))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time in the content of the tokens (the length may leak,
    /// which a random token of fixed length does not mind).
    pub fn matches(&self, candidate: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), candidate.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// The credential in `Authorization: Bearer <credential>`, if any. The
/// scheme name is case-insensitive (RFC 9110); surrounding spaces are ignored.
pub fn presented_bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credential) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credential.trim())
}

/// Proof that the request carried `Authorization: Bearer <admin token>`.
pub struct AdminBearer;

impl<S> FromRequestParts<S> for AdminBearer
where
    S: Send + Sync,
    AdminToken: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let token = AdminToken::from_ref(state);
        match presented_bearer(&parts.headers) {
            Some(candidate) if token.matches(candidate) => Ok(AdminBearer),
            Some(_) => Err(ApiError::unauthorized("the admin token is not valid")),
            None => Err(ApiError::unauthorized(
                "admin routes need Authorization: Bearer <admin token>",
            )),
        }
    }
}

impl FromRef<super::AppState> for AdminToken {
    fn from_ref(state: &super::AppState) -> Self {
        state.admin_token.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_token() {
        let t = AdminToken::new("s3cret-token");
        assert!(t.matches("s3cret-token"));
        assert!(!t.matches("s3cret-tokeN"));
        assert!(!t.matches("s3cret-toke"));
        assert!(!t.matches(""));
        assert_eq!(format!("{t:?}"), "AdminToken(..)");
        assert_ne!(
            AdminToken::generate().expose(),
            AdminToken::generate().expose()
        );
    }

    #[test]
    fn bearer_credentials_are_found_in_the_authorization_header() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert_eq!(presented_bearer(&with("Bearer abc")), Some("abc"));
        assert_eq!(presented_bearer(&with("bearer  abc ")), Some("abc"));
        assert_eq!(presented_bearer(&with("Basic abc")), None);
        assert_eq!(presented_bearer(&with("Bearer")), None);
        assert_eq!(presented_bearer(&HeaderMap::new()), None);
    }
}

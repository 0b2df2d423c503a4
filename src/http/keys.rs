//! Optional client API keys, each scoped to resource-name prefixes, so one
//! team's workers cannot acquire, renew, release, fence or write another
//! team's resources. Off unless `--api-keys-file` is given; the file format
//! and the threat model are in docs/security.md.

use std::path::Path;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::AppState;
use super::auth::presented_bearer;
use super::error::{ApiError, ErrorCode};
use crate::domain::{LeaseId, ResourceName, ResourcePrefix, Scope};
use crate::service::LockService;

/// Limits on the key file's contents.
const MAX_NAME_BYTES: usize = 64;
const MIN_SECRET_BYTES: usize = 16;
const MAX_SECRET_BYTES: usize = 256;

/// One configured key. The secret itself is not kept: only its SHA-256,
/// which is what a presented key is compared against.
pub struct ApiKey {
    name: Arc<str>,
    digest: [u8; 32],
    scope: Scope,
}

impl ApiKey {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Every configured key; never empty.
#[derive(Debug)]
pub struct ApiKeys(Vec<Arc<ApiKey>>);

/// Why a key file was refused. The message names the key (by name or
/// position) and the problem, never a secret.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KeyFileError(String);

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Equal digests, in time independent of where they differ.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl ApiKeys {
    /// Reads and checks a key file.
    pub fn load(path: &Path) -> Result<ApiKeys, KeyFileError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            KeyFileError(format!(
                "cannot read the API key file {}: {e}",
                path.display()
            ))
        })?;
        Self::parse(&text).map_err(|KeyFileError(msg)| {
            KeyFileError(format!("API key file {}: {msg}", path.display()))
        })
    }

    /// Parses the key file's JSON:
    /// `{"keys": [{"name": "…", "secret": "…", "prefixes": ["team-a/"]}]}`.
    ///
    /// Checked field by field rather than through serde so that no error
    /// message can ever quote a secret.
    pub fn parse(text: &str) -> Result<ApiKeys, KeyFileError> {
        let root: Value = serde_json::from_str(text).map_err(|e| {
            KeyFileError(format!(
                "not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let root = root
            .as_object()
            .ok_or_else(|| KeyFileError("must be a JSON object with a \"keys\" array".into()))?;
        only_fields(root, &["keys"], "the top level")?;
        let entries = root
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| KeyFileError("\"keys\" must be an array of keys".into()))?;
        if entries.is_empty() {
            return Err(KeyFileError(
                "\"keys\" is empty; remove --api-keys-file to run without keys".into(),
            ));
        }
        let mut keys: Vec<Arc<ApiKey>> = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let key = parse_key(entry, index + 1)?;
            if keys.iter().any(|k| k.name == key.name) {
                return Err(KeyFileError(format!(
                    "key {:?}: the name is used twice",
                    key.name
                )));
            }
            if keys.iter().any(|k| digests_equal(&k.digest, &key.digest)) {
                return Err(KeyFileError(format!(
                    "key {:?}: the same secret as another key",
                    key.name
                )));
            }
            keys.push(Arc::new(key));
        }
        Ok(ApiKeys(keys))
    }

    /// The key whose secret is `presented`. Every key is compared, each in
    /// constant time over SHA-256 digests, so timing says nothing about how
    /// much of a guess was right.
    pub fn authenticate(&self, presented: &str) -> Option<&Arc<ApiKey>> {
        let presented = digest(presented);
        let mut found = None;
        for key in &self.0 {
            if digests_equal(&key.digest, &presented) {
                found = Some(key);
            }
        }
        found
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|k| k.name())
    }
}

fn only_fields(
    object: &Map<String, Value>,
    allowed: &[&str],
    what: &str,
) -> Result<(), KeyFileError> {
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(unknown) => Err(KeyFileError(format!(
            "{what}: unknown field {unknown:?} (expected {})",
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

fn parse_key(entry: &Value, position: usize) -> Result<ApiKey, KeyFileError> {
    let at = format!("key #{position}");
    let object = entry
        .as_object()
        .ok_or_else(|| KeyFileError(format!("{at}: must be an object")))?;
    only_fields(object, &["name", "secret", "prefixes"], &at)?;
    let text = |field: &str| -> Result<&str, KeyFileError> {
        object
            .get(field)
            .and_then(Value::as_str)
            .ok_or_else(|| KeyFileError(format!("{at}: \"{field}\" must be a string")))
    };

    let name = text("name")?;
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(KeyFileError(format!(
            "{at}: the name must be 1–{MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    let at = format!("key {name:?}");

    let secret = text("secret")?;
    if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&secret.len())
        || !secret.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(KeyFileError(format!(
            "{at}: the secret must be {MIN_SECRET_BYTES}–{MAX_SECRET_BYTES} printable ASCII \
             characters without spaces (for example 32 random hex digits)"
        )));
    }

    let prefixes = object
        .get("prefixes")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            KeyFileError(format!(
                "{at}: \"prefixes\" must be an array of resource-name prefixes"
            ))
        })?
        .iter()
        .map(|p| {
            let p = p
                .as_str()
                .ok_or_else(|| KeyFileError(format!("{at}: every prefix must be a string")))?;
            ResourcePrefix::parse(p).map_err(|e| KeyFileError(format!("{at}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let scope = Scope::new(prefixes).map_err(|e| KeyFileError(format!("{at}: {e}")))?;

    Ok(ApiKey {
        name: name.into(),
        digest: digest(secret),
        scope,
    })
}

/// Who is calling the lock API, as far as scoping goes.
pub enum ClientAccess {
    /// No keys are configured: the API is open, as without this feature.
    Open,
    /// The admin token: every resource.
    Admin,
    /// A configured key, limited to its prefixes.
    Key(Arc<ApiKey>),
}

impl FromRequestParts<AppState> for ClientAccess {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(keys) = state.api_keys.as_deref() else {
            return Ok(ClientAccess::Open);
        };
        let Some(presented) = presented_bearer(&parts.headers) else {
            return Err(ApiError::unauthorized(
                "this server requires an API key: send Authorization: Bearer <key>",
            ));
        };
        // Both checks always run, so timing does not tell which kind of
        // secret a guess resembled.
        let key = keys.authenticate(presented);
        let admin = state.admin_token.matches(presented);
        match (key, admin) {
            (Some(key), _) => Ok(ClientAccess::Key(key.clone())),
            (None, true) => Ok(ClientAccess::Admin),
            (None, false) => Err(ApiError::unauthorized("the API key is not valid")),
        }
    }
}

impl ClientAccess {
    /// May this caller act on `resource`? 403 `forbidden` if not.
    pub fn check(&self, resource: &ResourceName) -> Result<(), ApiError> {
        match self {
            ClientAccess::Open | ClientAccess::Admin => Ok(()),
            ClientAccess::Key(key) if key.scope.covers(resource) => Ok(()),
            ClientAccess::Key(key) => {
                tracing::info!(
                    key = key.name(),
                    resource = resource.as_str(),
                    "refused: the resource is outside the API key's prefixes"
                );
                Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "the API key {:?} does not cover the resource {:?}",
                        key.name(),
                        resource.as_str()
                    ),
                ))
            }
        }
    }

    /// The check for a lease-id route: the lease's resource must be
    /// covered. A lease never changes resource, so checking before the
    /// write is as good as checking inside it. Costs a read only when keys
    /// are configured.
    pub async fn check_lease(&self, service: &LockService, id: &LeaseId) -> Result<(), ApiError> {
        if matches!(self, ClientAccess::Open | ClientAccess::Admin) {
            return Ok(());
        }
        let lease = service
            .lease(id)
            .await?
            .ok_or_else(|| ApiError::new(ErrorCode::LeaseNotFound, "no lease with this id"))?;
        self.check(&lease.resource)
    }

    /// The event log: a scoped key must name a covered resource, unless one
    /// of its prefixes covers everything.
    pub fn check_events(&self, resource: Option<&ResourceName>) -> Result<(), ApiError> {
        match (self, resource) {
            (ClientAccess::Key(key), None) if !key.scope.covers_everything() => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "the API key {:?} may list only the events of resources it covers: \
                         add resource=<name>",
                    key.name()
                ),
            )),
            (_, Some(resource)) => self.check(resource),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"keys": [
        {"name": "reports", "secret": "reports-secret-0123456789", "prefixes": ["reports/"]},
        {"name": "ops", "secret": "ops-secret-0123456789abc", "prefixes": ["", "x/"]}
    ]}"#;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).unwrap()
    }

    #[test]
    fn a_good_file_parses_and_keys_authenticate() {
        let keys = ApiKeys::parse(GOOD).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.names().collect::<Vec<_>>(), ["reports", "ops"]);
        let reports = keys.authenticate("reports-secret-0123456789").unwrap();
        assert_eq!(reports.name(), "reports");
        assert!(reports.scope().covers(&name("reports/daily")));
        assert!(!reports.scope().covers(&name("billing/run")));
        let ops = keys.authenticate("ops-secret-0123456789abc").unwrap();
        assert!(ops.scope().covers_everything());
        assert!(keys.authenticate("reports-secret-012345678").is_none());
        assert!(keys.authenticate("reports-secret-0123456789 ").is_none());
        assert!(keys.authenticate("").is_none());
    }

    #[test]
    fn debug_output_never_shows_a_secret() {
        let keys = ApiKeys::parse(GOOD).unwrap();
        let shown = format!("{keys:?}");
        assert!(shown.contains("reports"));
        assert!(!shown.contains("secret-0123"), "{shown}");
    }

    #[test]
    fn bad_files_get_clear_errors_without_secrets() {
        let cases: &[(&str, &str)] = &[
            ("not json", "not valid JSON (line 1, column 2)"),
            ("[]", "must be a JSON object"),
            (r#"{"key": []}"#, "unknown field \"key\""),
            (r#"{"keys": {}}"#, "\"keys\" must be an array"),
            (r#"{"keys": []}"#, "\"keys\" is empty"),
            (r#"{"keys": [7]}"#, "key #1: must be an object"),
            (
                r#"{"keys": [{"name": "a", "secret": "sssssssssssssssss", "prefixes": ["a/"], "prefix": "b/"}]}"#,
                "key #1: unknown field \"prefix\"",
            ),
            (
                r#"{"keys": [{"secret": "sssssssssssssssss", "prefixes": ["a/"]}]}"#,
                "key #1: \"name\" must be a string",
            ),
            (
                r#"{"keys": [{"name": "", "secret": "sssssssssssssssss", "prefixes": ["a/"]}]}"#,
                "key #1: the name must be 1–64 bytes",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "short-secret", "prefixes": ["a/"]}]}"#,
                "key \"a\": the secret must be 16–256 printable ASCII",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "has a space in it!!", "prefixes": ["a/"]}]}"#,
                "key \"a\": the secret must be",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": 12345678901234567890, "prefixes": ["a/"]}]}"#,
                "key #1: \"secret\" must be a string",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "sssssssssssssssss", "prefixes": []}]}"#,
                "key \"a\": a key needs at least one prefix",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "sssssssssssssssss", "prefixes": "a/"}]}"#,
                "key \"a\": \"prefixes\" must be an array",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "sssssssssssssssss", "prefixes": ["a/\n"]}]}"#,
                "key \"a\": a prefix must not contain control characters",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "sssssssssssssssss", "prefixes": ["a/"]},
                             {"name": "a", "secret": "ttttttttttttttttt", "prefixes": ["b/"]}]}"#,
                "key \"a\": the name is used twice",
            ),
            (
                r#"{"keys": [{"name": "a", "secret": "sssssssssssssssss", "prefixes": ["a/"]},
                             {"name": "b", "secret": "sssssssssssssssss", "prefixes": ["b/"]}]}"#,
                "key \"b\": the same secret as another key",
            ),
        ];
        for (text, expected) in cases {
            let err = ApiKeys::parse(text).unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{text}\n  gave {err:?}\n  wanted {expected:?}"
            );
            assert!(
                !err.contains("ssssssss") && !err.contains("1234567890"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let err = ApiKeys::load(Path::new("/nonexistent/palisade-keys.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/palisade-keys.json"), "{err}");
    }

    #[test]
    fn access_checks() {
        let keys = ApiKeys::parse(GOOD).unwrap();
        let reports = ClientAccess::Key(
            keys.authenticate("reports-secret-0123456789")
                .unwrap()
                .clone(),
        );
        let ops = ClientAccess::Key(
            keys.authenticate("ops-secret-0123456789abc")
                .unwrap()
                .clone(),
        );
        assert!(reports.check(&name("reports/a")).is_ok());
        let refused = reports.check(&name("billing/a")).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden);
        assert!(
            refused.message.contains("\"reports\""),
            "{}",
            refused.message
        );
        assert_eq!(
            reports.check_events(None).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert!(reports.check_events(Some(&name("reports/a"))).is_ok());
        assert!(reports.check_events(Some(&name("billing/a"))).is_err());
        assert!(ops.check_events(None).is_ok());
        for open in [ClientAccess::Open, ClientAccess::Admin] {
            assert!(open.check(&name("billing/a")).is_ok());
            assert!(open.check_events(None).is_ok());
        }
    }
}

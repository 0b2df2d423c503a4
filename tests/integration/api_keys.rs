//! Client API keys scoped to resource prefixes: without a key the lock API
//! answers 401, outside its prefixes a key gets 403 and nothing changes,
//! inside them everything works; one team cannot release another's lease.

use palisade::app::{App, Config};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Backend, Harness, TestDb, TestServer, enc};

pub const REPORTS_KEY: &str = "reports-key-0123456789abcdef";
pub const BILLING_KEY: &str = "billing-key-0123456789abcdef";
pub const OPS_KEY: &str = "ops-key-0123456789abcdef0123";

/// A key file with three teams: `reports` (prefix `reports/`), `billing`
/// (`billing/` and `shared/`) and `ops` (every resource).
pub fn key_file() -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let keys = json!({"keys": [
        {"name": "reports", "secret": REPORTS_KEY, "prefixes": ["reports/"]},
        {"name": "billing", "secret": BILLING_KEY, "prefixes": ["billing/", "shared/"]},
        {"name": "ops", "secret": OPS_KEY, "prefixes": [""]},
    ]});
    std::fs::write(file.path(), keys.to_string()).unwrap();
    file
}

/// A server on a fresh database with [`key_file`]'s keys.
pub async fn start_with_keys(backend: &Backend) -> (Harness, tempfile::NamedTempFile) {
    let keys = key_file();
    let db = TestDb::create(backend).await;
    let server = TestServer::start_with(Config {
        api_keys_file: Some(keys.path().to_owned()),
        ..Config::for_tests(&db.url)
    })
    .await;
    (Harness { server, db }, keys)
}

/// One request with an optional bearer credential.
async fn call(
    s: &TestServer,
    key: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = s.client.request(method, s.url(path));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    s.send(req).await
}

async fn acquire_as(s: &TestServer, key: &str, resource: &str, holder: &str) -> Value {
    let (status, body) = call(
        s,
        Some(key),
        Method::POST,
        &format!("/v1/resources/{}/acquire", enc(resource)),
        Some(json!({"holder": holder, "ttl_ms": 60_000})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// The lease as its owner (the billing team) reads it now.
async fn billing_lease(s: &TestServer, lease: &Value) -> (StatusCode, Value) {
    call(
        s,
        Some(BILLING_KEY),
        Method::GET,
        &lease_path(lease, ""),
        None,
    )
    .await
}

fn lease_path(lease: &Value, action: &str) -> String {
    let id = lease["lease_id"].as_str().unwrap();
    if action.is_empty() {
        format!("/v1/leases/{id}")
    } else {
        format!("/v1/leases/{id}/{action}")
    }
}

/// Every event, read with the all-resources key.
async fn events(s: &TestServer, resource: &str) -> Vec<Value> {
    let (status, body) = call(
        s,
        Some(OPS_KEY),
        Method::GET,
        &format!("/v1/events?limit=1000&resource={}", enc(resource)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["events"].as_array().unwrap().clone()
}

/// Every operation the OpenAPI document tags as keyed, with its path
/// filled in: a route added later without the key check fails this test.
async fn keyed_operations(s: &TestServer, lease: &Value) -> Vec<(Method, String)> {
    let (status, doc) = s.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let tags = operation["tags"].as_array().cloned().unwrap_or_default();
            if !tags
                .iter()
                .any(|t| ["leases", "resources", "events"].contains(&t.as_str().unwrap()))
            {
                continue;
            }
            let filled = path
                .replace("{name}", &enc("billing/run"))
                .replace("{lease_id}", lease["lease_id"].as_str().unwrap());
            operations.push((method.to_uppercase().parse().unwrap(), filled));
        }
    }
    assert_eq!(operations.len(), 9, "{operations:?}");
    operations
}

async fn without_a_valid_key_every_lock_route_is_401_and_nothing_changes(backend: Backend) {
    let (h, _keys) = start_with_keys(&backend).await;
    let s = &h.server;
    let lease = acquire_as(s, BILLING_KEY, "billing/run", "billing-worker").await;
    let token = lease["token"].as_i64().unwrap();
    let (status, _) = call(
        s,
        Some(BILLING_KEY),
        Method::PUT,
        "/v1/resources/billing%2Frun/value",
        Some(json!({"token": token, "value": "v1"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let before = events(s, "billing/run").await;

    for (method, path) in keyed_operations(s, &lease).await {
        for key in [None, Some("not-a-configured-key-at-all"), Some("")] {
            let body = matches!(method, Method::POST | Method::PUT)
                .then(|| json!({"holder": "x", "ttl_ms": 1000, "token": token + 5, "value": 1}));
            let mut req = s.client.request(method.clone(), s.url(&path));
            if let Some(key) = key {
                req = req.header("authorization", format!("Bearer {key}"));
            }
            if let Some(body) = body {
                req = req.json(&body);
            }
            let res = req.send().await.unwrap();
            assert_eq!(
                res.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} {key:?}"
            );
            assert_eq!(res.headers()["www-authenticate"], "Bearer");
            let body: Value = res.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        }
    }
    // A browser-style Basic credential is not a key either.
    let res = s
        .client
        .get(s.url("/v1/resources/billing%2Frun"))
        .basic_auth("billing", Some(BILLING_KEY))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // Nothing changed: still held by the same lease, value and events as before.
    let (status, now) = billing_lease(s, &lease).await;
    assert_eq!(
        (status, now["state"].as_str()),
        (StatusCode::OK, Some("active"))
    );
    assert_eq!(now["expires_at"], lease["expires_at"], "not renewed");
    let (_, value) = call(
        s,
        Some(BILLING_KEY),
        Method::GET,
        "/v1/resources/billing%2Frun/value",
        None,
    )
    .await;
    assert_eq!(
        (value["value"].clone(), value["version"].clone()),
        (json!("v1"), json!(1))
    );
    let (_, resource) = call(
        s,
        Some(BILLING_KEY),
        Method::GET,
        "/v1/resources/billing%2Frun",
        None,
    )
    .await;
    assert_eq!(resource["last_token"], token, "no new token was minted");
    assert_eq!(events(s, "billing/run").await, before);

    // Health, metrics and the document stay open.
    for path in ["/healthz", "/readyz", "/v1/openapi.json"] {
        assert_eq!(s.get(path).await.0, StatusCode::OK, "{path}");
    }
    let metrics = s.client.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    h.finish().await;
}

async fn a_key_works_within_its_prefixes(backend: Backend) {
    let (h, _keys) = start_with_keys(&backend).await;
    let s = &h.server;
    let key = Some(REPORTS_KEY);
    let lease = acquire_as(s, REPORTS_KEY, "reports/daily", "reporter").await;
    let token = lease["token"].as_i64().unwrap();

    let (status, body) = call(
        s,
        key,
        Method::POST,
        &lease_path(&lease, "renew"),
        Some(json!({"ttl_ms": 30_000})),
    )
    .await;
    assert_eq!(
        (status, body["ttl_ms"].clone()),
        (StatusCode::OK, json!(30_000)),
        "{body}"
    );
    let (status, body) = call(s, key, Method::GET, &lease_path(&lease, ""), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(
        s,
        key,
        Method::POST,
        "/v1/resources/reports%2Fdaily/fence",
        Some(json!({"token": token})),
    )
    .await;
    assert_eq!(
        (status, body["accepted_token"].clone()),
        (StatusCode::OK, json!(token)),
        "{body}"
    );
    let (status, body) = call(
        s,
        key,
        Method::PUT,
        "/v1/resources/reports%2Fdaily/value",
        Some(json!({"token": token, "value": {"rows": 3}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(
        s,
        key,
        Method::GET,
        "/v1/resources/reports%2Fdaily/value",
        None,
    )
    .await;
    assert_eq!(
        (status, body["value"].clone()),
        (StatusCode::OK, json!({"rows": 3}))
    );
    let (status, body) = call(s, key, Method::GET, "/v1/resources/reports%2Fdaily", None).await;
    assert_eq!(
        (status, body["holder"]["holder"].clone()),
        (StatusCode::OK, json!("reporter"))
    );
    let (status, body) = call(
        s,
        key,
        Method::GET,
        "/v1/events?resource=reports%2Fdaily",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["events"].as_array().unwrap().len() >= 4, "{body}");
    let (status, body) = call(s, key, Method::POST, &lease_path(&lease, "release"), None).await;
    assert_eq!(
        (status, body["state"].clone()),
        (StatusCode::OK, json!("released")),
        "{body}"
    );

    // A key with two prefixes may use both; the "" prefix covers everything,
    // and so does the admin token, including the whole event log.
    acquire_as(s, BILLING_KEY, "shared/cache", "billing").await;
    acquire_as(s, OPS_KEY, "anything/at-all", "ops").await;
    acquire_as(s, &s.admin_token, "reports/weekly", "admin").await;
    for key in [OPS_KEY, s.admin_token.as_str()] {
        let (status, body) = call(s, Some(key), Method::GET, "/v1/events", None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    h.finish().await;
}

async fn a_key_outside_its_prefixes_gets_403_and_nothing_changes(backend: Backend) {
    let (h, _keys) = start_with_keys(&backend).await;
    let s = &h.server;
    let lease = acquire_as(s, BILLING_KEY, "billing/run", "billing-worker").await;
    let token = lease["token"].as_i64().unwrap();
    let (status, _) = call(
        s,
        Some(BILLING_KEY),
        Method::PUT,
        "/v1/resources/billing%2Frun/value",
        Some(json!({"token": token, "value": "v1"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let before = events(s, "billing/run").await;

    let attempts: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            "/v1/resources/billing%2Frun/acquire".into(),
            Some(json!({"holder": "thief", "ttl_ms": 1000})),
        ),
        (
            Method::POST,
            "/v1/resources/billing%2Frun/fence".into(),
            Some(json!({"token": token + 1})),
        ),
        (
            Method::PUT,
            "/v1/resources/billing%2Frun/value".into(),
            Some(json!({"token": token, "value": "stolen"})),
        ),
        (
            Method::GET,
            "/v1/resources/billing%2Frun/value".into(),
            None,
        ),
        (Method::GET, "/v1/resources/billing%2Frun".into(), None),
        (Method::GET, "/v1/events".into(), None),
        (
            Method::GET,
            "/v1/events?resource=billing%2Frun".into(),
            None,
        ),
        // Not covered either: "reports/" is not a prefix of "reports".
        (
            Method::POST,
            "/v1/resources/reports/acquire".into(),
            Some(json!({"holder": "r", "ttl_ms": 1000})),
        ),
    ];
    for (method, path, body) in attempts {
        let (status, answer) = call(s, Some(REPORTS_KEY), method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("reports"),
            "{answer}"
        );
    }

    // Bad input is still a 400 first: the prefix check needs a valid name.
    let (status, answer) = call(
        s,
        Some(REPORTS_KEY),
        Method::POST,
        "/v1/resources/billing%2Frun/fence",
        Some(json!({"token": -1})),
    )
    .await;
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (StatusCode::BAD_REQUEST, json!("invalid_token"))
    );

    // Nothing changed.
    let (_, now) = billing_lease(s, &lease).await;
    assert_eq!(now["state"], "active");
    let (_, resource) = call(
        s,
        Some(BILLING_KEY),
        Method::GET,
        "/v1/resources/billing%2Frun",
        None,
    )
    .await;
    assert_eq!(
        (
            resource["last_token"].clone(),
            resource["accepted_token"].clone()
        ),
        (json!(token), json!(token)),
        "no token minted or accepted: {resource}"
    );
    let (_, value) = call(
        s,
        Some(BILLING_KEY),
        Method::GET,
        "/v1/resources/billing%2Frun/value",
        None,
    )
    .await;
    assert_eq!(
        (value["value"].clone(), value["version"].clone()),
        (json!("v1"), json!(1))
    );
    assert_eq!(events(s, "billing/run").await, before, "no event recorded");
    let (status, _) = call(s, Some(OPS_KEY), Method::GET, "/v1/resources/reports", None).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the refused acquire created nothing"
    );
    h.finish().await;
}

async fn one_team_cannot_renew_or_release_another_teams_lease_by_id(backend: Backend) {
    let (h, _keys) = start_with_keys(&backend).await;
    let s = &h.server;
    let lease = acquire_as(s, BILLING_KEY, "billing/run", "billing-worker").await;
    let before = events(s, "billing/run").await;
    // Even knowing the secret lease id, the reports team cannot touch it.
    for (method, action) in [
        (Method::POST, "release"),
        (Method::POST, "renew"),
        (Method::GET, ""),
    ] {
        let (status, body) = call(
            s,
            Some(REPORTS_KEY),
            method,
            &lease_path(&lease, action),
            None,
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (StatusCode::FORBIDDEN, json!("forbidden")),
            "{action}: {body}"
        );
    }
    // An unknown id is just not found, whichever key asks.
    let (status, body) = call(
        s,
        Some(REPORTS_KEY),
        Method::POST,
        "/v1/leases/0123456789abcdef0123456789abcdef/release",
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("lease_not_found"))
    );

    let (_, now) = billing_lease(s, &lease).await;
    assert_eq!(now["state"], "active");
    assert_eq!(now["expires_at"], lease["expires_at"], "not renewed");
    assert_eq!(events(s, "billing/run").await, before);
    // Its own team can.
    let (status, body) = call(
        s,
        Some(BILLING_KEY),
        Method::POST,
        &lease_path(&lease, "release"),
        None,
    )
    .await;
    assert_eq!(
        (status, body["state"].clone()),
        (StatusCode::OK, json!("released"))
    );
    h.finish().await;
}

crate::on_both_backends!(
    without_a_valid_key_every_lock_route_is_401_and_nothing_changes,
    a_key_works_within_its_prefixes,
    a_key_outside_its_prefixes_gets_403_and_nothing_changes,
    one_team_cannot_renew_or_release_another_teams_lease_by_id,
);

/// Admin routes take only the admin token, never a client key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_key_is_not_an_admin_token() {
    let (h, _keys) = start_with_keys(&Backend::Sqlite).await;
    let s = &h.server;
    acquire_as(s, REPORTS_KEY, "reports/stuck", "w").await;
    for key in [REPORTS_KEY, OPS_KEY] {
        let (status, body) = call(
            s,
            Some(key),
            Method::POST,
            "/v1/admin/resources/reports%2Fstuck/force-release",
            Some(json!({"reason": "try"})),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (StatusCode::UNAUTHORIZED, json!("unauthorized"))
        );
    }
    let (_, resource) = call(
        s,
        Some(REPORTS_KEY),
        Method::GET,
        "/v1/resources/reports%2Fstuck",
        None,
    )
    .await;
    assert_eq!(resource["holder"]["holder"], "w");
    let (status, _) = call(
        s,
        Some(&s.admin_token),
        Method::POST,
        "/v1/admin/resources/reports%2Fstuck/force-release",
        Some(json!({"reason": "admin"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    h.finish().await;
}

/// Without a key file nothing changes: the lock API stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_api_is_open_and_ignores_credentials() {
    let h = Harness::start(&Backend::Sqlite).await;
    let s = &h.server;
    let lease = s.acquire("billing/run", "w", 60_000).await;
    let (status, _) = call(
        s,
        Some("anything-at-all-here"),
        Method::POST,
        &lease_path(&lease, "renew"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(s, None, Method::GET, "/v1/events", None).await;
    assert_eq!(status, StatusCode::OK);
    h.finish().await;
}

/// A bad key file stops the server from starting, with a message that
/// names the problem and never a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_file_is_a_clear_startup_error() {
    let db = TestDb::create(&Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("missing.json", None, "cannot read the API key file"),
        (
            "broken.json",
            Some("{\"keys\": [".to_owned()),
            "not valid JSON",
        ),
        (
            "short.json",
            Some(
                json!({"keys": [{"name": "a", "secret": "too-short", "prefixes": ["a/"]}]})
                    .to_string(),
            ),
            "key \"a\": the secret must be 16",
        ),
        (
            "admin.json",
            Some(
                json!({"keys": [{"name": "a", "secret": "test-admin-token", "prefixes": ["a/"]}]})
                    .to_string(),
            ),
            "has the admin token as its secret",
        ),
    ];
    for (file, content, expected) in cases {
        let path = dir.path().join(file);
        if let Some(content) = content {
            std::fs::write(&path, content).unwrap();
        }
        let config = Config {
            api_keys_file: Some(path.clone()),
            ..Config::for_tests(&db.url)
        };
        let err = match App::build(config).await {
            Ok(_) => panic!("{file}: the server started"),
            Err(err) => format!("{err:#}"),
        };
        assert!(err.contains(expected), "{file}: {err}");
        assert!(
            err.contains(&path.display().to_string()),
            "{file} names its path: {err}"
        );
        assert!(
            !err.contains("too-short") && !err.contains("test-admin-token"),
            "{err}"
        );
    }
    let database = db.url.trim_start_matches("sqlite://");
    assert!(
        !std::path::Path::new(database).exists(),
        "the database was not touched"
    );
    db.drop_db().await;
}

/// The OpenAPI document says which routes take a key: the keyed ones allow
/// no credential (keys off) or the `api_key` bearer, and list 401 and 403;
/// the admin route keeps the admin token only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_the_api_key() {
    let h = Harness::start(&Backend::Sqlite).await;
    let (status, doc) = h.server.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let scheme = &doc["components"]["securitySchemes"]["api_key"];
    assert_eq!(
        (scheme["type"].as_str(), scheme["scheme"].as_str()),
        (Some("http"), Some("bearer"))
    );
    let mut keyed = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let security = op["security"].as_array().cloned().unwrap_or_default();
            let takes_key = security.iter().any(|s| s.get("api_key").is_some());
            let tagged = op["tags"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| ["leases", "resources", "events"].contains(&t.as_str().unwrap()));
            assert_eq!(takes_key, tagged, "{method} {path}");
            if tagged {
                keyed += 1;
                assert!(security.contains(&json!({})), "{method} {path}: optional");
                for status in ["401", "403"] {
                    let text = op["responses"][status]["description"].as_str().unwrap();
                    assert!(text.contains("`unauthorized`") || text.contains("`forbidden`"));
                }
            }
        }
    }
    assert_eq!(keyed, 9);
    let admin = &doc["paths"]["/v1/admin/resources/{name}/force-release"]["post"];
    assert_eq!(admin["security"], json!([{"admin_token": []}]));
    h.finish().await;
}

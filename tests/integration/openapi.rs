//! The OpenAPI document against the router it describes.

use std::collections::BTreeSet;

use palisade::http::error::ErrorCode;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Backend, Harness};

/// The routes of the v1 contract (issue 2) plus the probes and the document.
const CONTRACT: &[(&str, &str)] = &[
    ("post", "/v1/resources/{name}/acquire"),
    ("post", "/v1/leases/{lease_id}/renew"),
    ("post", "/v1/leases/{lease_id}/release"),
    ("get", "/v1/leases/{lease_id}"),
    ("get", "/v1/resources/{name}"),
    ("post", "/v1/resources/{name}/fence"),
    ("put", "/v1/resources/{name}/value"),
    ("get", "/v1/resources/{name}/value"),
    ("get", "/v1/events"),
    ("post", "/v1/admin/resources/{name}/force-release"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/v1/openapi.json"),
    ("get", "/metrics"),
];

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch"];

async fn fetch_document(h: &Harness) -> Value {
    let (status, doc) = h.server.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    doc
}

/// (method, path template) of every documented operation.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            if item.get(*method).is_some() {
                ops.insert((method.to_string(), path.clone()));
            }
        }
    }
    ops
}

fn concrete(path: &str) -> String {
    path.replace("{name}", "probe")
        .replace("{lease_id}", &"0".repeat(32))
}

/// Every response description of an operation, for a status and `default`.
fn documented_codes(doc: &Value, method: &str, path: &str, status: u16) -> String {
    let responses = &doc["paths"][path][method]["responses"];
    format!(
        "{} {}",
        responses[status.to_string()]["description"]
            .as_str()
            .unwrap_or(""),
        responses["default"]["description"].as_str().unwrap_or("")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_openapi_3_1_and_lists_the_whole_contract() {
    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "Palisade");
    let ops = operations(&doc);
    for (method, path) in CONTRACT {
        assert!(
            ops.contains(&(method.to_string(), path.to_string())),
            "{method} {path} is not documented"
        );
    }
    assert_eq!(
        ops.len(),
        CONTRACT.len(),
        "undocumented-in-contract routes: {ops:?}"
    );
    for schema in [
        "LeaseView",
        "ResourceBody",
        "EventsBody",
        "AcquireBody",
        "ErrorBody",
    ] {
        assert!(
            doc["components"]["schemas"].get(schema).is_some(),
            "{schema} missing"
        );
    }
    assert!(
        doc["components"]["securitySchemes"]
            .get("admin_token")
            .is_some()
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_routed_and_no_other_method_is() {
    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    let ops = operations(&doc);
    let paths: BTreeSet<&String> = ops.iter().map(|(_, p)| p).collect();
    for path in paths {
        for method in METHODS {
            let url = h.server.url(&concrete(path));
            let req = h.server.client.request(
                Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                url,
            );
            let req = if matches!(*method, "post" | "put" | "patch") {
                req.json(&json!({}))
            } else {
                req
            };
            // Not through `send`: /metrics answers in text, not JSON.
            let res = req.send().await.unwrap();
            let status = res.status();
            let body: Value = serde_json::from_str(&res.text().await.unwrap()).unwrap_or_default();
            let code = body["error"]["code"].as_str().unwrap_or("");
            if ops.contains(&(method.to_string(), path.to_string())) {
                assert!(
                    code != "not_found" && code != "method_not_allowed",
                    "{method} {path} is documented but not routed: {status} {body}"
                );
            } else {
                assert_eq!(
                    (status, code),
                    (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
                    "{method} {path} is routed but not documented"
                );
            }
        }
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_is_listed() {
    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    let all: BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    let schema = &doc["components"]["schemas"]["ErrorCode"];
    let listed: BTreeSet<&str> = schema["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(listed, all, "the ErrorCode schema is the code list");

    // Every code is documented on some operation, and every code-like word
    // in a response description is a real code (no typos, no stale codes).
    let fields = [
        "accepted_token",
        "last_token",
        "lease_state",
        "fenced_by",
        "expires_at",
        "wait_ms",
    ];
    let mut mentioned = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for (status, response) in op["responses"].as_object().unwrap() {
                let is_error =
                    status == "default" || status.starts_with('4') || status.starts_with('5');
                let text = response["description"].as_str().unwrap_or("");
                // Odd pieces of a split on backticks are the quoted words.
                for word in text.split('`').skip(1).step_by(2) {
                    let code_like = word.contains('_')
                        && word.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                    if all.contains(word) {
                        mentioned.insert(word.to_owned());
                    } else if is_error && code_like {
                        assert!(
                            fields.contains(&word),
                            "{word:?} is not an error code: {text}"
                        );
                    }
                }
            }
        }
    }
    let missing: Vec<_> = all.iter().filter(|c| !mentioned.contains(**c)).collect();
    assert!(
        missing.is_empty(),
        "codes no operation documents: {missing:?}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_codes_the_server_returns_are_the_documented_ones() {
    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    let s = &h.server;
    let lease = s.acquire("doc", "a", 30_000).await;
    let lease_id = lease["lease_id"].as_str().unwrap().to_owned();
    let acquire = "/v1/resources/{name}/acquire";
    let value = "/v1/resources/{name}/value";
    let fence = "/v1/resources/{name}/fence";
    let renew = "/v1/leases/{lease_id}/renew";
    let cases: Vec<(&str, &str, (StatusCode, Value))> = vec![
        (
            "post",
            acquire,
            s.post(
                "/v1/resources/doc/acquire",
                json!({"holder": "b", "ttl_ms": 1000}),
            )
            .await,
        ),
        (
            "post",
            acquire,
            s.post(
                "/v1/resources/doc/acquire",
                json!({"holder": "b", "ttl_ms": 1}),
            )
            .await,
        ),
        (
            "post",
            acquire,
            s.post(
                "/v1/resources/doc/acquire",
                json!({"holder": "", "ttl_ms": 1000}),
            )
            .await,
        ),
        (
            "post",
            acquire,
            s.post("/v1/resources/doc/acquire", json!({"holder": "b"}))
                .await,
        ),
        (
            "post",
            acquire,
            s.post(
                "/v1/resources/doc/acquire",
                json!({"holder": "b", "ttl_ms": 1000, "wait_ms": -1}),
            )
            .await,
        ),
        ("post", fence, s.fence("doc", 9).await),
        ("post", fence, s.fence("doc", 0).await),
        ("put", value, s.write_value("doc", 9, json!(1)).await),
        (
            "put",
            value,
            s.put("/v1/resources/doc/value", json!({"token": 1})).await,
        ),
        ("get", value, s.get("/v1/resources/doc/value").await),
        (
            "get",
            "/v1/resources/{name}",
            s.get("/v1/resources/never").await,
        ),
        ("get", "/v1/events", s.get("/v1/events?kind=nope").await),
        ("get", "/v1/events", s.get("/v1/events?limit=0").await),
        (
            "post",
            renew,
            s.post(&format!("/v1/leases/{}/renew", "0".repeat(32)), json!({}))
                .await,
        ),
        (
            "post",
            "/v1/admin/resources/{name}/force-release",
            s.post(
                "/v1/admin/resources/doc/force-release",
                json!({"reason": "r"}),
            )
            .await,
        ),
    ];
    for (method, path, (status, body)) in cases {
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("{body}"));
        let documented = documented_codes(&doc, method, path, status.as_u16());
        assert!(
            documented.contains(&format!("`{code}`")),
            "{method} {path} answered {status} `{code}`, which its documentation does not list: {documented}"
        );
    }
    // The renew of a released lease: 410, documented.
    s.release(&lease).await;
    let (status, body) = s
        .post(&format!("/v1/leases/{lease_id}/renew"), json!({}))
        .await;
    let code = body["error"]["code"].as_str().unwrap();
    assert!(documented_codes(&doc, "post", renew, status.as_u16()).contains(&format!("`{code}`")));
    h.finish().await;
}

/// docs/api.md covers every documented route and every error code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_guide_covers_every_route_and_code() {
    let guide = include_str!("../../docs/api.md");
    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    for (method, path) in operations(&doc) {
        assert!(
            guide.contains(&path),
            "docs/api.md does not mention {method} {path}"
        );
    }
    for code in ErrorCode::ALL {
        assert!(
            guide.contains(&format!("`{}`", code.as_str())),
            "docs/api.md does not list the error code {}",
            code.as_str()
        );
    }
    assert!(guide.matches("curl ").count() >= operations(&doc).len());
    h.finish().await;
}

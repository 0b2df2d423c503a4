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

/// Operation ids name operations (links and generated clients use them), so
/// they are unique; every link names a real operation and its parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_ids_are_unique_and_every_link_resolves() {
    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    let mut params_by_id = std::collections::BTreeMap::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for method in METHODS {
            let Some(op) = item.get(*method) else {
                continue;
            };
            let id = op["operationId"].as_str().unwrap().to_owned();
            let params: BTreeSet<String> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| p["name"].as_str().unwrap().to_owned())
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                params_by_id.insert(id.clone(), params).is_none(),
                "operationId {id} is used twice"
            );
        }
    }
    let mut links = 0;
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for response in op["responses"].as_object().unwrap().values() {
                let Some(map) = response.get("links").and_then(Value::as_object) else {
                    continue;
                };
                for (name, link) in map {
                    links += 1;
                    let target = link["operationId"].as_str().unwrap();
                    let params = params_by_id
                        .get(target)
                        .unwrap_or_else(|| panic!("link {name} names no operation: {target}"));
                    for param in link["parameters"].as_object().unwrap().keys() {
                        assert!(
                            params.contains(param),
                            "link {name}: {target} has no parameter {param}"
                        );
                    }
                }
            }
        }
    }
    assert!(links >= 8, "the acquire and write links are documented");
    h.finish().await;
}

/// The bounds the document states are the server's own: the domain's
/// limits, and the server accepts the boundary value and refuses the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_bounds_are_the_servers_bounds() {
    use palisade::domain::{EventKind, Holder, Reason, RequestId, ResourceName, Ttl, WaitTime};

    let h = Harness::start(&Backend::Sqlite).await;
    let doc = fetch_document(&h).await;
    let schemas = &doc["components"]["schemas"];
    let no_control = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";
    let acquire_op = &doc["paths"]["/v1/resources/{name}/acquire"]["post"];
    let name = &acquire_op["parameters"][0]["schema"];
    let acquire = &schemas["AcquireBody"]["properties"];
    let text_fields = [
        (name, ResourceName::MAX_BYTES, 1),
        (&acquire["holder"], Holder::MAX_BYTES, 1),
        (&acquire["request_id"], RequestId::MAX_BYTES, 1),
        (
            &schemas["ForceReleaseBody"]["properties"]["reason"],
            Reason::MAX_BYTES,
            1,
        ),
    ];
    for (schema, max, min) in text_fields {
        assert_eq!(schema["maxLength"], max, "{schema}");
        assert_eq!(schema["minLength"], min, "{schema}");
        assert_eq!(schema["pattern"], no_control, "{schema}");
    }
    let min_ttl = i64::try_from(Ttl::MIN.as_millis()).unwrap();
    let max_wait = i64::try_from(WaitTime::MAX.as_millis()).unwrap();
    assert_eq!(acquire["ttl_ms"]["minimum"], min_ttl);
    assert_eq!(
        schemas["RenewBody"]["properties"]["ttl_ms"]["minimum"],
        min_ttl
    );
    assert_eq!(acquire["wait_ms"]["minimum"], 0);
    assert_eq!(acquire["wait_ms"]["maximum"], max_wait);
    assert_eq!(schemas["FenceBody"]["properties"]["token"]["minimum"], 1);
    assert_eq!(
        schemas["WriteValueBody"]["properties"]["token"]["minimum"],
        1
    );
    // Any JSON value, not only objects: a number is stored and read back.
    for schema in [
        &schemas["WriteValueBody"]["properties"]["value"],
        &schemas["ValueBody"]["properties"]["value"],
    ] {
        assert!(schema.get("type").is_none(), "value is any JSON: {schema}");
    }

    let events: Vec<Value> = doc["paths"]["/v1/events"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .clone();
    let param = |n: &str| {
        events
            .iter()
            .find(|p| p["name"] == n)
            .unwrap_or_else(|| panic!("{n}"))["schema"]
            .clone()
    };
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        param("kind")["pattern"],
        format!("^({})?$", kinds.join("|"))
    );
    assert_eq!(param("resource")["maxLength"], ResourceName::MAX_BYTES);
    assert_eq!(param("after")["minimum"], 0);
    assert_eq!(param("limit")["minimum"], 1);
    assert_eq!(param("limit")["maximum"], 1000);

    // The server agrees at each boundary.
    let s = &h.server;
    let code = |r: &(StatusCode, Value)| r.1["error"]["code"].as_str().unwrap_or("").to_owned();
    let ok = s
        .post(
            "/v1/resources/bounds/acquire",
            json!({"holder": "h".repeat(Holder::MAX_BYTES), "ttl_ms": min_ttl, "wait_ms": max_wait,
                   "request_id": "r".repeat(RequestId::MAX_BYTES)}),
        )
        .await;
    assert_eq!(ok.0, StatusCode::OK, "{}", ok.1);
    for (body, expected) in [
        (json!({"holder": "h", "ttl_ms": min_ttl - 1}), "invalid_ttl"),
        (
            json!({"holder": "h", "ttl_ms": min_ttl, "wait_ms": max_wait + 1}),
            "invalid_wait",
        ),
        (
            json!({"holder": "h", "ttl_ms": min_ttl, "wait_ms": -1}),
            "invalid_wait",
        ),
        (
            json!({"holder": "h".repeat(Holder::MAX_BYTES + 1), "ttl_ms": min_ttl}),
            "invalid_holder",
        ),
        (
            json!({"holder": "a\u{85}b", "ttl_ms": min_ttl}),
            "invalid_holder",
        ),
    ] {
        let r = s.post("/v1/resources/bounds2/acquire", body).await;
        assert_eq!(code(&r), expected, "{}", r.1);
    }
    assert_eq!(code(&s.fence("bounds", 0).await), "invalid_token");
    assert_eq!(s.get("/v1/events?limit=1000").await.0, StatusCode::OK);
    assert_eq!(code(&s.get("/v1/events?limit=1001").await), "invalid_query");
    assert_eq!(code(&s.get("/v1/events?after=-1").await), "invalid_query");
    assert_eq!(s.get("/v1/events?after=0&kind=").await.0, StatusCode::OK);
    h.finish().await;
}

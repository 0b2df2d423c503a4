//! A hostile client's inputs: each gets a clear JSON 4xx and leaves every
//! lease, value and event exactly as it was.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Backend, Harness, TestServer};

struct Case {
    what: &'static str,
    method: Method,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    auth: Option<&'static str>,
    status: u16,
    /// Expected `error.code`; `None` accepts any code (the status decides).
    code: Option<&'static str>,
}

const JSON: Option<&str> = Some("application/json");

fn case(
    what: &'static str,
    method: Method,
    path: impl Into<String>,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        what,
        method,
        path: path.into(),
        content_type: JSON,
        body: body.into(),
        auth: None,
        status,
        code: Some(code),
    }
}

fn acquire(what: &'static str, body: Value, code: &'static str) -> Case {
    case(
        what,
        Method::POST,
        "/v1/resources/victim/acquire",
        body.to_string(),
        400,
        code,
    )
}

fn cases(lease_id: &str) -> Vec<Case> {
    let acq = "/v1/resources/victim/acquire";
    let fence = "/v1/resources/victim/fence";
    let value = "/v1/resources/victim/value";
    let renew = format!("/v1/leases/{lease_id}/renew");
    let big_name = "n".repeat(256);
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let mut v = vec![
        case(
            "truncated JSON",
            Method::POST,
            acq,
            r#"{"holder":"#,
            400,
            "invalid_json",
        ),
        case("empty body", Method::POST, acq, "", 400, "invalid_json"),
        case(
            "not JSON at all",
            Method::POST,
            acq,
            "holder=x&ttl_ms=1000",
            400,
            "invalid_json",
        ),
        case(
            "invalid UTF-8 in JSON",
            Method::POST,
            acq,
            b"{\"holder\":\"\xff\xfe\",\"ttl_ms\":1000}".to_vec(),
            400,
            "invalid_json",
        ),
        case(
            "byte order mark",
            Method::POST,
            acq,
            "\u{feff}{\"holder\":\"x\",\"ttl_ms\":1000}",
            400,
            "invalid_json",
        ),
        case(
            "trailing garbage",
            Method::POST,
            acq,
            r#"{"holder":"x","ttl_ms":1000} xx"#,
            400,
            "invalid_json",
        ),
        case(
            "deeply nested field",
            Method::POST,
            acq,
            format!(r#"{{"holder":"x","ttl_ms":1000,"request_id":{deep}}}"#),
            400,
            "invalid_field",
        ),
        Case {
            code: None,
            ..case(
                "deeply nested value",
                Method::PUT,
                value,
                format!(r#"{{"token":1,"value":{deep}}}"#),
                400,
                "",
            )
        },
        Case {
            content_type: None,
            ..case(
                "no content type",
                Method::POST,
                acq,
                r#"{"holder":"x","ttl_ms":1000}"#,
                415,
                "unsupported_media_type",
            )
        },
        Case {
            content_type: Some("text/plain"),
            ..case(
                "text/plain",
                Method::POST,
                acq,
                r#"{"holder":"x","ttl_ms":1000}"#,
                415,
                "unsupported_media_type",
            )
        },
        Case {
            content_type: Some("application/x-www-form-urlencoded"),
            ..case(
                "form post (cross-site)",
                Method::POST,
                acq,
                "holder=x&ttl_ms=1000",
                415,
                "unsupported_media_type",
            )
        },
        case(
            "body over the limit",
            Method::POST,
            acq,
            vec![b' '; 3 * 1024 * 1024],
            413,
            "payload_too_large",
        ),
        acquire("missing holder", json!({"ttl_ms": 1000}), "invalid_field"),
        acquire("missing ttl", json!({"holder": "x"}), "invalid_field"),
        acquire(
            "holder is a number",
            json!({"holder": 7, "ttl_ms": 1000}),
            "invalid_field",
        ),
        acquire(
            "holder is null",
            json!({"holder": null, "ttl_ms": 1000}),
            "invalid_field",
        ),
        acquire(
            "ttl is a string",
            json!({"holder": "x", "ttl_ms": "1000"}),
            "invalid_field",
        ),
        acquire(
            "ttl is fractional",
            json!({"holder": "x", "ttl_ms": 1000.5}),
            "invalid_field",
        ),
        case(
            "ttl is 2^63",
            Method::POST,
            acq,
            r#"{"holder":"x","ttl_ms":9223372036854775808}"#,
            400,
            "invalid_field",
        ),
        case(
            "ttl is 1e400",
            Method::POST,
            acq,
            r#"{"holder":"x","ttl_ms":1e400}"#,
            400,
            "invalid_json",
        ),
        acquire(
            "ttl below 100 ms",
            json!({"holder": "x", "ttl_ms": 99}),
            "invalid_ttl",
        ),
        acquire(
            "ttl zero",
            json!({"holder": "x", "ttl_ms": 0}),
            "invalid_ttl",
        ),
        acquire(
            "ttl negative",
            json!({"holder": "x", "ttl_ms": -1000}),
            "invalid_ttl",
        ),
        acquire(
            "ttl over the maximum",
            json!({"holder": "x", "ttl_ms": 86_400_001}),
            "invalid_ttl",
        ),
        acquire(
            "ttl i64::MIN",
            json!({"holder": "x", "ttl_ms": i64::MIN}),
            "invalid_ttl",
        ),
        acquire(
            "wait over 60 s",
            json!({"holder": "x", "ttl_ms": 1000, "wait_ms": 60_001}),
            "invalid_wait",
        ),
        acquire(
            "negative wait",
            json!({"holder": "x", "ttl_ms": 1000, "wait_ms": -1}),
            "invalid_wait",
        ),
        acquire(
            "empty holder",
            json!({"holder": "", "ttl_ms": 1000}),
            "invalid_holder",
        ),
        acquire(
            "holder of 256 bytes",
            json!({"holder": "h".repeat(256), "ttl_ms": 1000}),
            "invalid_holder",
        ),
        acquire(
            "holder with a newline",
            json!({"holder": "a\nb", "ttl_ms": 1000}),
            "invalid_holder",
        ),
        acquire(
            "holder with CRLF (log injection)",
            json!({"holder": "a\r\nINFO forged", "ttl_ms": 1000}),
            "invalid_holder",
        ),
        acquire(
            "holder with NUL",
            json!({"holder": "a\u{0}b", "ttl_ms": 1000}),
            "invalid_holder",
        ),
        acquire(
            "holder with an ANSI escape",
            json!({"holder": "\u{1b}[31mred", "ttl_ms": 1000}),
            "invalid_holder",
        ),
        acquire(
            "request id of 129 bytes",
            json!({"holder": "x", "ttl_ms": 1000, "request_id": "r".repeat(129)}),
            "invalid_request_id",
        ),
        acquire(
            "empty request id",
            json!({"holder": "x", "ttl_ms": 1000, "request_id": ""}),
            "invalid_request_id",
        ),
        acquire(
            "unknown field",
            json!({"holder": "x", "ttl_ms": 1000, "ttl": 5}),
            "invalid_field",
        ),
        acquire(
            "array instead of object",
            json!([{"holder": "x", "ttl_ms": 1000}]),
            "invalid_field",
        ),
        case(
            "duplicate field",
            Method::POST,
            acq,
            r#"{"holder":"x","holder":"y","ttl_ms":1000}"#,
            400,
            "invalid_field",
        ),
        case(
            "name of 256 bytes",
            Method::POST,
            format!("/v1/resources/{big_name}/acquire"),
            json!({"holder": "x", "ttl_ms": 1000}).to_string(),
            400,
            "invalid_resource",
        ),
        case(
            "name with NUL",
            Method::POST,
            "/v1/resources/vic%00tim/acquire",
            json!({"holder": "x", "ttl_ms": 1000}).to_string(),
            400,
            "invalid_resource",
        ),
        case(
            "name with CRLF",
            Method::POST,
            "/v1/resources/vic%0D%0Atim/acquire",
            json!({"holder": "x", "ttl_ms": 1000}).to_string(),
            400,
            "invalid_resource",
        ),
        case(
            "name not UTF-8",
            Method::POST,
            "/v1/resources/%FF%FE/acquire",
            json!({"holder": "x", "ttl_ms": 1000}).to_string(),
            400,
            "invalid_resource",
        ),
        case(
            "empty name",
            Method::POST,
            "/v1/resources//acquire",
            json!({"holder": "x", "ttl_ms": 1000}).to_string(),
            400,
            "invalid_resource",
        ),
        case(
            "fence token zero",
            Method::POST,
            fence,
            json!({"token": 0}).to_string(),
            400,
            "invalid_token",
        ),
        case(
            "fence token negative",
            Method::POST,
            fence,
            json!({"token": -1}).to_string(),
            400,
            "invalid_token",
        ),
        case(
            "fence token 2^63",
            Method::POST,
            fence,
            r#"{"token":9223372036854775808}"#,
            400,
            "invalid_field",
        ),
        case(
            "fence token as string",
            Method::POST,
            fence,
            json!({"token": "1"}).to_string(),
            400,
            "invalid_field",
        ),
        case(
            "fence without token",
            Method::POST,
            fence,
            "{}",
            400,
            "invalid_field",
        ),
        case(
            "value without value",
            Method::PUT,
            value,
            json!({"token": 1}).to_string(),
            400,
            "invalid_field",
        ),
        case(
            "value without token",
            Method::PUT,
            value,
            json!({"value": 1}).to_string(),
            400,
            "invalid_field",
        ),
        case(
            "value over 1 MiB",
            Method::PUT,
            value,
            json!({"token": 1, "value": "v".repeat(1024 * 1024)}).to_string(),
            413,
            "value_too_large",
        ),
        case(
            "value with a lone surrogate",
            Method::PUT,
            value,
            r#"{"token":1,"value":"\ud800"}"#,
            400,
            "invalid_value",
        ),
        case(
            "value with a huge exponent",
            Method::PUT,
            value,
            r#"{"token":1,"value":1e400}"#,
            400,
            "invalid_value",
        ),
        case(
            "renew with ttl 0",
            Method::POST,
            renew.clone(),
            json!({"ttl_ms": 0}).to_string(),
            400,
            "invalid_ttl",
        ),
        case(
            "renew with malformed body",
            Method::POST,
            renew.clone(),
            "{",
            400,
            "invalid_json",
        ),
        case(
            "renew with unknown field",
            Method::POST,
            renew.clone(),
            json!({"ttl": 1000}).to_string(),
            400,
            "invalid_field",
        ),
        case(
            "someone else's (guessed) lease id",
            Method::POST,
            "/v1/leases/0123456789abcdef0123456789abcdef/release",
            "",
            404,
            "lease_not_found",
        ),
        case(
            "path traversal as lease id",
            Method::POST,
            "/v1/leases/..%2F..%2Fetc%2Fpasswd/release",
            "",
            404,
            "lease_not_found",
        ),
        case(
            "upper-case lease id",
            Method::GET,
            format!("/v1/leases/{}", lease_id.to_uppercase()),
            "",
            404,
            "lease_not_found",
        ),
        case(
            "unknown event kind",
            Method::GET,
            "/v1/events?kind=exploded",
            "",
            400,
            "invalid_kind",
        ),
        case(
            "event limit zero",
            Method::GET,
            "/v1/events?limit=0",
            "",
            400,
            "invalid_query",
        ),
        case(
            "event limit over 1000",
            Method::GET,
            "/v1/events?limit=1001",
            "",
            400,
            "invalid_query",
        ),
        case(
            "event limit not a number",
            Method::GET,
            "/v1/events?limit=ten",
            "",
            400,
            "invalid_query",
        ),
        case(
            "negative cursor",
            Method::GET,
            "/v1/events?after=-1",
            "",
            400,
            "invalid_query",
        ),
        case(
            "cursor 2^63",
            Method::GET,
            "/v1/events?after=9223372036854775808",
            "",
            400,
            "invalid_query",
        ),
        case(
            "unknown query parameter",
            Method::GET,
            "/v1/events?holder=x&sql=1",
            "",
            400,
            "invalid_query",
        ),
        case(
            "event filter name with newline",
            Method::GET,
            "/v1/events?resource=a%0Ab",
            "",
            400,
            "invalid_resource",
        ),
        case(
            "force-release without a token",
            Method::POST,
            "/v1/admin/resources/victim/force-release",
            json!({"reason": "x"}).to_string(),
            401,
            "unauthorized",
        ),
        Case {
            auth: Some("Bearer not-the-token"),
            ..case(
                "force-release with a wrong token",
                Method::POST,
                "/v1/admin/resources/victim/force-release",
                json!({"reason": "x"}).to_string(),
                401,
                "unauthorized",
            )
        },
        Case {
            auth: Some("Basic dGVzdC1hZG1pbi10b2tlbg=="),
            ..case(
                "force-release with basic auth",
                Method::POST,
                "/v1/admin/resources/victim/force-release",
                json!({"reason": "x"}).to_string(),
                401,
                "unauthorized",
            )
        },
        Case {
            auth: Some("Bearer test-admin-token"),
            ..case(
                "force-release with an empty reason",
                Method::POST,
                "/v1/admin/resources/victim/force-release",
                json!({"reason": ""}).to_string(),
                400,
                "invalid_reason",
            )
        },
        Case {
            auth: Some("Bearer test-admin-token"),
            ..case(
                "force-release reason with control chars",
                Method::POST,
                "/v1/admin/resources/victim/force-release",
                json!({"reason": "a\u{7}b"}).to_string(),
                400,
                "invalid_reason",
            )
        },
        case(
            "wrong method",
            Method::DELETE,
            "/v1/resources/victim",
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "unknown route",
            Method::GET,
            "/v2/resources/victim",
            "",
            404,
            "not_found",
        ),
    ];
    for c in &mut v {
        if c.method == Method::GET || c.path.ends_with("/release") && c.body.is_empty() {
            c.content_type = None;
        }
    }
    v
}

async fn send(s: &TestServer, c: &Case) -> (StatusCode, String) {
    // One connection per case: after refusing an oversized body the server
    // closes the connection without reading it, and a pooled connection
    // reused for the next case would fail with IncompleteMessage.
    let mut req = s
        .client
        .request(c.method.clone(), s.url(&c.path))
        .header("connection", "close")
        .body(c.body.clone());
    if let Some(ct) = c.content_type {
        req = req.header("content-type", ct);
    }
    if let Some(auth) = c.auth {
        req = req.header("authorization", auth);
    }
    let res = req.send().await.expect("request sent");
    (res.status(), res.text().await.unwrap_or_default())
}

/// Everything a client could observe about the victim resource.
async fn snapshot(s: &TestServer, lease_id: &str) -> Value {
    let (_, resource) = s.get("/v1/resources/victim").await;
    let (_, value) = s.get("/v1/resources/victim/value").await;
    let (_, lease) = s.get(&format!("/v1/leases/{lease_id}")).await;
    let events = s.all_events(None).await;
    json!({"resource": resource, "value": value, "lease": lease, "events": events})
}

async fn hostile_inputs_get_clear_4xx_and_change_nothing(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("victim", "owner", 3_600_000).await;
    let lease_id = lease["lease_id"].as_str().unwrap().to_owned();
    let (status, _) = s.write_value("victim", 1, json!({"balance": 100})).await;
    assert_eq!(status, StatusCode::OK);
    let before = snapshot(s, &lease_id).await;

    let cases = cases(&lease_id);
    assert!(cases.len() >= 50, "{} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let (status, text) = send(s, c).await;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let code = body["error"]["code"].as_str();
        let message = body["error"]["message"].as_str().unwrap_or("");
        let ok = status.as_u16() == c.status
            && code.is_some()
            && !message.is_empty()
            && c.code.is_none_or(|want| code == Some(want));
        if !ok {
            failures.push(format!(
                "{}: got {status} {text:.200}, want {} {:?}",
                c.what, c.status, c.code
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let after = snapshot(s, &lease_id).await;
    assert_eq!(before, after, "a rejected request changed state");
    // Same name, different Unicode normalisation: two distinct resources
    // (names are compared byte for byte, never normalised).
    let nfc = s.acquire("caf\u{e9}", "x", 1000).await;
    let nfd = s.acquire("cafe\u{301}", "x", 1000).await;
    assert_eq!(
        (nfc["token"].as_i64(), nfd["token"].as_i64()),
        (Some(1), Some(1))
    );
    // A charset parameter is fine.
    let (status, _) = s
        .send(
            s.client
                .post(s.url("/v1/resources/charset/acquire"))
                .header("content-type", "application/json; charset=utf-8")
                .body(r#"{"holder":"x","ttl_ms":1000}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    h.finish().await;
}

crate::on_both_backends!(hostile_inputs_get_clear_4xx_and_change_nothing);

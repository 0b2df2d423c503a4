//! Hostile clients at the connection level: slow clients (slowloris) are
//! cut off by the server's timeouts without holding anyone else up, and a
//! cross-site request to an admin route, cookies and all, is refused.

use std::time::Duration;

use palisade::app::Config;
use palisade::http::server::ClientTimeouts;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::support::{Backend, Harness, TestDb, TestServer};
use crate::ui::{Browser, csrf_of};

/// How a slow client misbehaves.
#[derive(Clone, Copy, Debug)]
enum Slowness {
    /// Connects and sends nothing.
    Silent,
    /// Sends a request head one byte at a time and never finishes it.
    TricklingHead,
    /// Sends a whole head, then the body one byte at a time.
    TricklingBody,
}

/// What the server did to a slow client: the bytes it answered with before
/// the connection ended.
async fn slow_client(addr: String, slowness: Slowness) -> String {
    let stream = TcpStream::connect(&addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let body = r#"{"holder": "slowloris", "ttl_ms": 60000}"#;
    let (head, trickle) = match slowness {
        Slowness::Silent => (String::new(), String::new()),
        Slowness::TricklingHead => (
            "POST /v1/resources/slow/acquire HTTP/1.1\r\nHost: palisade\r\n".to_owned(),
            "X-Padding: ".to_owned() + &"a".repeat(10_000),
        ),
        Slowness::TricklingBody => (
            format!(
                "POST /v1/resources/slow/acquire HTTP/1.1\r\nHost: palisade\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            ),
            // All but the last byte: the body is never complete.
            body[..body.len() - 1].to_owned(),
        ),
    };
    let writer = tokio::spawn(async move {
        write.write_all(head.as_bytes()).await?;
        for byte in trickle.bytes() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            write.write_all(&[byte]).await?;
        }
        // Out of bytes: stay connected and silent.
        std::future::pending::<std::io::Result<()>>().await
    });
    // The server must end the connection; the outer timeout only keeps a
    // broken server from hanging the suite.
    let mut answer = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(60), read.read_to_end(&mut answer)).await;
    writer.abort();
    assert!(
        ended.is_ok(),
        "{slowness:?}: the server never closed the connection"
    );
    // A reset after the answer is fine: the server gave up on us.
    String::from_utf8_lossy(&answer).into_owned()
}

async fn slow_clients_are_cut_off_and_do_not_block_others(backend: Backend) {
    let db = TestDb::create(&backend).await;
    let s = TestServer::start_with(Config {
        client_timeouts: ClientTimeouts {
            header: Duration::from_secs(1),
            body: Duration::from_secs(1),
        },
        ..Config::for_tests(&db.url)
    })
    .await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut slow = JoinSet::new();
    for i in 0..60 {
        let slowness = [
            Slowness::Silent,
            Slowness::TricklingHead,
            Slowness::TricklingBody,
        ][i % 3];
        let addr = addr.clone();
        slow.spawn(async move { (slowness, slow_client(addr, slowness).await) });
    }

    // Meanwhile everyone else is served as usual.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 0..5 {
        let lease = s.acquire("busy", &format!("worker-{round}"), 60_000).await;
        let (status, body) = s.renew(&lease, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = s.fence("busy", lease["token"].as_i64().unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = s.release(&lease).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(s.get("/healthz").await.0, StatusCode::OK);
    }

    while let Some(result) = slow.join_next().await {
        let (slowness, answer) = result.unwrap();
        match slowness {
            // Cut off without an answer: the request never started.
            Slowness::Silent | Slowness::TricklingHead => {
                assert!(answer.is_empty(), "{slowness:?} got {answer:?}")
            }
            Slowness::TricklingBody => {
                assert!(
                    answer.starts_with("HTTP/1.1 408"),
                    "{slowness:?} got {answer:?}"
                );
                assert!(answer.contains("\"request_timeout\""), "{answer}");
                assert!(answer.to_ascii_lowercase().contains("connection: close"));
            }
        }
    }
    // None of the slow requests did anything.
    let (status, _) = s.get("/v1/resources/slow").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(s.all_events(Some("slow")).await.is_empty());
    // And the server still serves, and stops cleanly.
    s.acquire("after", "w", 1000).await;
    s.stop().await;
    db.drop_db().await;
}

crate::on_both_backends!(slow_clients_are_cut_off_and_do_not_block_others);

/// A web page the operator visits can make the browser send the operator's
/// UI cookies to an admin API route, but not the bearer token: the route
/// answers a JSON 401 and the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_to_admin_routes_are_refused() {
    let h = Harness::start(&Backend::Sqlite).await;
    let s = &h.server;
    s.acquire("stuck/job", "cron-7", 60_000).await;
    let before = s.all_events(Some("stuck/job")).await;

    // The operator is signed in to the UI: the browser holds a real admin
    // session cookie and a CSRF cookie.
    let mut browser = Browser::new(s);
    let signed = browser.sign_in(&s.admin_token).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
    let cookies = browser.cookie_header();
    assert!(cookies.contains("palisade_session="), "{cookies}");
    let csrf = csrf_of(&browser.get("/ui/resources/stuck%2Fjob").await.body);

    let url = s.url("/v1/admin/resources/stuck%2Fjob/force-release");
    let cross_site = |req: reqwest::RequestBuilder| {
        req.header("origin", "https://evil.example")
            .header("referer", "https://evil.example/page")
            .header("sec-fetch-site", "cross-site")
            .header("cookie", cookies.clone())
    };
    let attempts = [
        // What a cross-site form can send without a preflight.
        (
            "form post with the CSRF token",
            cross_site(browser.client.post(&url))
                .form(&[("reason", "evil"), ("csrf", csrf.as_str())]),
        ),
        (
            "text/plain JSON",
            cross_site(browser.client.post(&url))
                .header("content-type", "text/plain")
                .body(r#"{"reason": "evil"}"#),
        ),
        // What fetch() could send if a preflight ever allowed it.
        (
            "application/json",
            cross_site(browser.client.post(&url)).json(&json!({"reason": "evil"})),
        ),
        (
            "the session cookie as a bearer",
            cross_site(browser.client.post(&url))
                .bearer_auth(
                    cookies
                        .split("palisade_session=")
                        .nth(1)
                        .unwrap()
                        .split(';')
                        .next()
                        .unwrap(),
                )
                .json(&json!({"reason": "evil"})),
        ),
    ];
    for (what, req) in attempts {
        let res = req.send().await.unwrap();
        let status = res.status();
        assert!(
            res.headers().get("access-control-allow-origin").is_none(),
            "{what}: no CORS grant"
        );
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{what}: {body}");
    }

    // A CORS preflight gets no grant, so a browser never sends the real
    // request with an Authorization header from another site.
    let preflight = browser
        .client
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(
        preflight.status().is_client_error(),
        "{}",
        preflight.status()
    );
    assert!(
        preflight
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    assert!(
        preflight
            .headers()
            .get("access-control-allow-methods")
            .is_none()
    );
    let body: serde_json::Value = preflight.json().await.unwrap();
    assert!(body["error"]["code"].is_string(), "{body}");

    // Nothing changed.
    let (_, resource) = s.get("/v1/resources/stuck%2Fjob").await;
    assert_eq!(resource["holder"]["holder"], "cron-7");
    assert_eq!(s.all_events(Some("stuck/job")).await, before);
    h.finish().await;
}

//! Overload protection: per-client rate limits and a cap on waiters.

use std::time::Duration;

use palisade::app::Config;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestDb, TestServer};

async fn server(backend: &Backend, tweak: impl FnOnce(&mut Config)) -> (TestServer, TestDb) {
    let db = TestDb::create(backend).await;
    let mut config = Config::for_tests(&db.url);
    tweak(&mut config);
    (TestServer::start_with(config).await, db)
}

async fn a_flooding_client_gets_429_quickly_and_recovers(backend: Backend) {
    let (s, db) = server(&backend, |c| {
        c.rate_limit_per_sec = 5;
        c.rate_limit_burst = 5;
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(s.get("/v1/resources/r").await.0);
    }
    assert!(
        statuses[..5].iter().all(|s| *s == StatusCode::NOT_FOUND),
        "{statuses:?}"
    );
    assert!(
        statuses[5..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let res = s.client.get(s.url("/v1/resources/r")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    // Probes are never limited.
    assert_eq!(s.get("/healthz").await.0, StatusCode::OK);
    // The bucket refills.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(s.get("/v1/resources/r").await.0, StatusCode::NOT_FOUND);
    s.stop().await;
    db.drop_db().await;
}

async fn waiters_beyond_the_cap_get_503_and_nothing_changes(backend: Backend) {
    let (s, db) = server(&backend, |c| c.max_waiters = 1).await;
    let holder = s.acquire("hot", "holder", 60_000).await;
    let first = {
        let client = s.client.clone();
        let url = s.url("/v1/resources/hot/acquire");
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({"holder": "w1", "ttl_ms": 1000, "wait_ms": 20_000}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = s
        .post(
            "/v1/resources/hot/acquire",
            json!({"holder": "w2", "ttl_ms": 1000, "wait_ms": 20_000}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "overloaded");
    // Not waiting costs nothing and still works.
    let (status, _) = s
        .post(
            "/v1/resources/hot/acquire",
            json!({"holder": "w3", "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    s.release(&holder).await;
    assert_eq!(
        first.await.unwrap(),
        StatusCode::OK,
        "the admitted waiter is served"
    );
    let acquired = s
        .all_events(Some("hot"))
        .await
        .into_iter()
        .filter(|e| e["kind"] == "acquired")
        .count();
    assert_eq!(acquired, 2);
    s.stop().await;
    db.drop_db().await;
}

crate::on_both_backends!(
    a_flooding_client_gets_429_quickly_and_recovers,
    waiters_beyond_the_cap_get_503_and_nothing_changes
);

//! Acquire, renew, release, waiting and expiry over the real HTTP API.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, Harness};

async fn tokens_start_at_one_and_strictly_increase(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let mut last = 0;
    for i in 0..5 {
        let lease = s.acquire("reports/daily", &format!("w{i}"), 10_000).await;
        let token = lease["token"].as_i64().unwrap();
        assert_eq!(
            token,
            last + 1,
            "tokens start at 1 and go up by one here: {lease}"
        );
        assert_eq!(lease["state"], "active");
        assert_eq!(lease["resource"], "reports/daily");
        assert_eq!(lease["ttl_ms"], 10_000);
        assert_eq!(lease["lease_id"].as_str().unwrap().len(), 32);
        last = token;
        let (status, released) = s.release(&lease).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(released["state"], "released");
    }
    let (status, res) = s.get("/v1/resources/reports%2Fdaily").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(res["resource"], "reports/daily");
    assert_eq!(res["last_token"], 5);
    assert_eq!(res["holder"], serde_json::Value::Null);
    // Tokens are per resource.
    assert_eq!(s.acquire("invoices", "w", 1000).await["token"], 1);
    h.finish().await;
}

async fn a_held_resource_answers_409_with_the_holder(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("inv", "alice", 30_000).await;
    let (status, body) = s
        .post(
            "/v1/resources/inv/acquire",
            json!({"holder": "bob", "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "lock_held");
    assert_eq!(body["error"]["holder"]["holder"], "alice");
    assert_eq!(body["error"]["holder"]["token"], lease["token"]);
    assert_eq!(body["error"]["holder"]["expires_at"], lease["expires_at"]);
    assert!(
        !body
            .to_string()
            .contains(lease["lease_id"].as_str().unwrap())
    );
    let (_, res) = s.get("/v1/resources/inv").await;
    assert_eq!(res["holder"]["holder"], "alice");
    assert_eq!(res["holder"]["token"], lease["token"]);
    assert!(res["holder"].get("lease_id").is_none());
    h.finish().await;
}

async fn a_retry_with_the_same_request_id_gets_the_same_lease(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let body = json!({"holder": "w1", "ttl_ms": 30_000, "request_id": "job-42"});
    let (s1, first) = s.post("/v1/resources/r/acquire", body.clone()).await;
    let (s2, second) = s.post("/v1/resources/r/acquire", body.clone()).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(first["lease_id"], second["lease_id"]);
    assert_eq!(first["token"], second["token"]);
    // A different request id, or another holder with the same id, is held.
    let (s3, _) = s
        .post(
            "/v1/resources/r/acquire",
            json!({"holder": "w1", "ttl_ms": 1000, "request_id": "job-43"}),
        )
        .await;
    let (s4, _) = s
        .post(
            "/v1/resources/r/acquire",
            json!({"holder": "w2", "ttl_ms": 1000, "request_id": "job-42"}),
        )
        .await;
    assert_eq!((s3, s4), (StatusCode::CONFLICT, StatusCode::CONFLICT));
    // Only one lease was ever issued.
    let acquired = s
        .all_events(Some("r"))
        .await
        .into_iter()
        .filter(|e| e["kind"] == "acquired")
        .count();
    assert_eq!(acquired, 1);
    // Once that lease is released the same request id acquires anew.
    s.release(&first).await;
    let (s5, third) = s.post("/v1/resources/r/acquire", body).await;
    assert_eq!(s5, StatusCode::OK);
    assert_eq!(third["token"], 2);
    h.finish().await;
}

async fn a_waiter_is_woken_by_release(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let holder = s.acquire("hot", "first", 60_000).await;
    let waiter = {
        let client = s.client.clone();
        let url = s.url("/v1/resources/hot/acquire");
        tokio::spawn(async move {
            let started = Instant::now();
            let res = client
                .post(url)
                .json(&json!({"holder": "second", "ttl_ms": 5000, "wait_ms": 30_000}))
                .send()
                .await
                .unwrap();
            (
                res.status(),
                res.json::<serde_json::Value>().await.unwrap(),
                started.elapsed(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    s.release(&holder).await;
    let (status, lease, waited) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{lease}");
    assert_eq!(lease["holder"], "second");
    assert_eq!(lease["token"], 2);
    // Granted by the release, long before the wait would have run out.
    assert!(waited < Duration::from_secs(20), "waited {waited:?}");
    h.finish().await;
}

async fn a_waiter_is_woken_by_expiry_and_a_short_wait_times_out(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    s.acquire("hot", "zombie", 600).await;
    let (status, body) = s
        .post(
            "/v1/resources/hot/acquire",
            json!({"holder": "impatient", "ttl_ms": 1000, "wait_ms": 100}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "lock_held");
    let (status, lease) = s
        .post(
            "/v1/resources/hot/acquire",
            json!({"holder": "patient", "ttl_ms": 1000, "wait_ms": 20_000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{lease}");
    assert_eq!(lease["token"], 2);
    // The expiry is in the log before the takeover.
    let kinds: Vec<_> = s
        .all_events(Some("hot"))
        .await
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert_eq!(kinds, ["acquired", "expired", "acquired"]);
    h.finish().await;
}

async fn renew_extends_and_never_resurrects(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("r", "w", 400).await;
    // Empty body: keep the TTL.
    let res = s
        .client
        .post(s.url(&format!(
            "/v1/leases/{}/renew",
            lease["lease_id"].as_str().unwrap()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let renewed: serde_json::Value = res.json().await.unwrap();
    assert_eq!(renewed["ttl_ms"], 400);
    assert!(renewed["expires_at"].as_str() >= lease["expires_at"].as_str());
    let (status, renewed) = s.renew(&lease, json!({"ttl_ms": 60_000})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(renewed["ttl_ms"], 60_000);
    assert_eq!(renewed["lease_id"], lease["lease_id"]);
    // Back to a short TTL, then let it lapse.
    let (status, _) = s.renew(&lease, json!({"ttl_ms": 100})).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (status, body) = s.renew(&lease, json!({})).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(body["error"]["code"], "lease_not_active");
    assert_eq!(body["error"]["lease"]["state"], "expired");
    let (status, body) = s.renew(&lease, json!({"ttl_ms": 10})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_ttl");
    let (status, body) = s
        .post(
            "/v1/leases/00000000000000000000000000000000/renew",
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "lease_not_found");
    // The renewals are in the log with the margin that was left.
    let renewals: Vec<_> = s
        .all_events(Some("r"))
        .await
        .into_iter()
        .filter(|e| e["kind"] == "renewed")
        .collect();
    assert_eq!(renewals.len(), 3);
    assert!(
        renewals
            .iter()
            .all(|e| e["detail"]["margin_ms"].as_i64().unwrap() >= 0)
    );
    h.finish().await;
}

async fn renew_refuses_a_lease_past_its_deadline_before_the_sweeper_sees_it(backend: Backend) {
    let db = crate::support::TestDb::create(&backend).await;
    let mut config = palisade::app::Config::for_tests(&db.url);
    config.sweep_interval = Duration::from_secs(60);
    let s = crate::support::TestServer::start_with(config).await;
    let lease = s.acquire("r", "w", 150).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // No sweep has run: the expiry is decided by the database clock.
    let (status, shown) = s
        .get(&format!(
            "/v1/leases/{}",
            lease["lease_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["state"], "expired");
    assert_eq!(shown["ended_at"], lease["expires_at"]);
    let (_, res) = s.get("/v1/resources/r").await;
    assert_eq!(res["holder"], serde_json::Value::Null);
    let (status, body) = s.renew(&lease, json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(body["error"]["lease"]["state"], "expired");
    let (status, _) = s.release(&lease).await;
    assert_eq!(status, StatusCode::GONE);
    // The renew attempt recorded the expiry, exactly once.
    let expired = s
        .all_events(Some("r"))
        .await
        .into_iter()
        .filter(|e| e["kind"] == "expired")
        .count();
    assert_eq!(expired, 1);
    s.stop().await;
    db.drop_db().await;
}

async fn release_is_idempotent_and_ended_leases_are_gone(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("r", "w", 10_000).await;
    let (s1, a) = s.release(&lease).await;
    let (s2, b) = s.release(&lease).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(a["state"], "released");
    assert_eq!(a, b);
    let (status, body) = s.renew(&lease, json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(body["error"]["lease"]["state"], "released");
    let releases = s
        .all_events(Some("r"))
        .await
        .into_iter()
        .filter(|e| e["kind"] == "released")
        .count();
    assert_eq!(releases, 1, "a second release records nothing");
    let short = s.acquire("r", "w", 100).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (status, body) = s.release(&short).await;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(body["error"]["code"], "lease_not_active");
    let (status, body) = s
        .post(
            "/v1/leases/0123456789abcdef0123456789abcdef/release",
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "lease_not_found");
    let (status, _) = s.get("/v1/leases/not-a-lease").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    h.finish().await;
}

async fn the_sweeper_records_each_expiry_promptly_and_once(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    for i in 0..5 {
        s.acquire(&format!("batch-{i}"), "w", 100).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = s.get("/v1/events?kind=expired").await;
        let n = body["events"].as_array().unwrap().len();
        if n == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "sweeper recorded {n}/5 expiries");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, body) = s.get("/v1/events?kind=expired").await;
    assert_eq!(
        body["events"].as_array().unwrap().len(),
        5,
        "no expiry recorded twice"
    );
    for e in body["events"].as_array().unwrap() {
        // The event is dated at the deadline, not when the sweeper noticed.
        assert_eq!(e["at"], e["detail"]["expires_at"]);
    }
    h.finish().await;
}

async fn force_release_needs_the_admin_token_and_fences_the_holder(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("stuck", "zombie", 60_000).await;
    let path = "/v1/admin/resources/stuck/force-release";
    let (status, body) = s.post(path, json!({"reason": "stuck"})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, _) = s
        .send(
            s.client
                .post(s.url(path))
                .bearer_auth("wrong")
                .json(&json!({"reason": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = s
        .send(
            s.client
                .post(s.url(path))
                .bearer_auth(&s.admin_token)
                .json(&json!({"reason": "worker wedged"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "force_released");
    assert_eq!(body["token"], lease["token"]);
    assert!(body.get("lease_id").is_none());
    // The holder is fenced out from this instant.
    let (status, _) = s.renew(&lease, json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    let (status, body) = s.fence("stuck", 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    let (status, _) = s.release(&lease).await;
    assert_eq!(status, StatusCode::GONE);
    // Tokens keep growing after a force-release.
    assert_eq!(s.acquire("stuck", "next", 1000).await["token"], 2);
    let events = s.all_events(Some("stuck")).await;
    let forced: Vec<_> = events
        .iter()
        .filter(|e| e["kind"] == "force_released")
        .collect();
    assert_eq!(forced.len(), 1);
    assert_eq!(forced[0]["detail"]["reason"], "worker wedged");
    assert_eq!(forced[0]["detail"]["by"], "admin (api)");
    // Nothing to release, or never used.
    let (status, body) = s
        .send(
            s.client
                .post(s.url("/v1/admin/resources/never/force-release"))
                .bearer_auth(&s.admin_token)
                .json(&json!({"reason": "x"})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("resource_not_found"))
    );
    h.finish().await;
}

crate::on_both_backends!(
    tokens_start_at_one_and_strictly_increase,
    a_held_resource_answers_409_with_the_holder,
    a_retry_with_the_same_request_id_gets_the_same_lease,
    a_waiter_is_woken_by_release,
    a_waiter_is_woken_by_expiry_and_a_short_wait_times_out,
    renew_extends_and_never_resurrects,
    renew_refuses_a_lease_past_its_deadline_before_the_sweeper_sees_it,
    release_is_idempotent_and_ended_leases_are_gone,
    the_sweeper_records_each_expiry_promptly_and_once,
    force_release_needs_the_admin_token_and_fences_the_holder,
);

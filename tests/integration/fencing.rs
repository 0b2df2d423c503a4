//! The fence check and the built-in fenced value store.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Backend, Harness};

async fn the_fence_accepts_live_tokens_and_rejects_stale_and_unknown_ones(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    // Never used: nothing was issued.
    let (status, body) = s.fence("ledger", 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "unknown_token");

    let first = s.acquire("ledger", "w1", 30_000).await;
    for _ in 0..3 {
        let (status, body) = s.fence("ledger", 1).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "a live token passes, repeatedly: {body}"
        );
        assert_eq!(body, json!({"token": 1, "accepted_token": 1}));
    }
    let (status, body) = s.fence("ledger", 2).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "unknown_token");
    assert_eq!(body["error"]["token"], 2);

    s.release(&first).await;
    // Its lease ended: stale even though nothing newer was accepted yet.
    let (status, body) = s.fence("ledger", 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    assert_eq!(body["error"]["token"], 1);
    assert_eq!(body["error"]["accepted_token"], 1);

    let second = s.acquire("ledger", "w2", 30_000).await;
    assert_eq!(second["token"], 2);
    let (status, body) = s.fence("ledger", 2).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["accepted_token"], 2);
    let (status, body) = s.fence("ledger", 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    assert_eq!(body["error"]["accepted_token"], 2);
    assert_eq!(
        body["error"]["fenced_by"],
        json!({"token": 2, "holder": "w2"})
    );

    let (_, res) = s.get("/v1/resources/ledger").await;
    assert_eq!(res["accepted_token"], 2);
    assert_eq!(res["last_token"], 2);

    // The log has the forensics of the rejection.
    let rejected: Vec<Value> = s
        .all_events(Some("ledger"))
        .await
        .into_iter()
        .filter(|e| e["kind"] == "write_rejected")
        .collect();
    assert_eq!(rejected.len(), 4);
    let last = rejected.last().unwrap();
    assert_eq!(last["token"], 1);
    assert_eq!(last["holder"], "w1", "the zombie holder is named");
    let d = &last["detail"];
    assert_eq!(d["reason"], "stale_token");
    assert_eq!(d["rejected_token"], 1);
    assert_eq!(d["accepted_token"], 2);
    assert_eq!(d["fenced_by"], json!({"token": 2, "holder": "w2"}));
    assert_eq!(d["lease_state"], "released");
    assert!(d["lateness_ms"].as_i64().unwrap() >= 0);
    assert_eq!(d["via"], "fence");
    h.finish().await;
}

async fn a_token_whose_lease_timed_out_is_stale(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    s.acquire("r", "slow", 150).await;
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    let (status, body) = s.fence("r", 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    assert_eq!(body["error"]["lease_state"], "expired");
    let (status, body) = s.write_value("r", 1, json!("late")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    let (status, _) = s.get("/v1/resources/r/value").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a rejected write changes nothing"
    );
    h.finish().await;
}

async fn the_value_store_writes_only_with_a_live_token(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let (status, body) = s.get("/v1/resources/report/value").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "value_not_found");

    let a = s.acquire("report", "a", 30_000).await;
    // Values come back exactly as written: big integers, unicode, escapes.
    let value = json!({"total": 12345.5, "rows": [1, 2, 3], "note": "naïve ☃ \u{0000} \"q\"", "nested": {"ok": true}});
    let (status, body) = s.write_value("report", 1, value.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["resource"], "report");
    assert_eq!(body["token"], 1);
    assert_eq!(body["version"], 1);
    assert!(body["updated_at"].as_str().unwrap().ends_with('Z'));
    let (status, body) = s.write_value("report", 1, value.clone()).await;
    assert_eq!(
        (status, body["version"].as_i64()),
        (StatusCode::OK, Some(2))
    );

    let raw = s
        .client
        .get(s.url("/v1/resources/report/value"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let read: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(read["value"], value);
    assert_eq!(read["token"], 1);
    assert_eq!(read["version"], 2);

    // Integers beyond f64 keep every digit.
    let big = r#"{"token": 1, "value": {"id": 123456789012345678901234567890}}"#;
    let (status, _) = s
        .send(
            s.client
                .put(s.url("/v1/resources/report/value"))
                .header("content-type", "application/json")
                .body(big),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let raw = s
        .client
        .get(s.url("/v1/resources/report/value"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(raw.contains("123456789012345678901234567890"), "{raw}");

    // A zombie's write changes nothing.
    s.release(&a).await;
    let b = s.acquire("report", "b", 30_000).await;
    let (status, _) = s.write_value("report", 2, json!({"by": "b"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = s.write_value("report", 1, json!({"by": "zombie"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    assert_eq!(body["error"]["accepted_token"], 2);
    let (_, read) = s.get("/v1/resources/report/value").await;
    assert_eq!(read["value"], json!({"by": "b"}));
    assert_eq!(read["version"], 4);
    assert_eq!(read["token"], 2);
    let (status, body) = s.write_value("report", 3, json!(1)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("unknown_token"))
    );
    s.release(&b).await;
    h.finish().await;
}

async fn events_filter_page_and_never_show_lease_ids(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let mut ids = Vec::new();
    for r in ["a", "b", "c"] {
        let lease = s.acquire(r, "w", 30_000).await;
        s.fence(r, 1).await;
        s.renew(&lease, json!({})).await;
        s.release(&lease).await;
        ids.push(lease["lease_id"].as_str().unwrap().to_owned());
    }
    let all = s.all_events(None).await;
    assert_eq!(all.len(), 12);
    let event_ids: Vec<i64> = all.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(event_ids.windows(2).all(|w| w[0] < w[1]), "ascending ids");
    let text = serde_json::to_string(&all).unwrap();
    for id in &ids {
        assert!(!text.contains(id.as_str()), "lease id leaked into events");
    }
    for e in &all {
        for key in ["id", "at", "kind", "resource", "token", "holder", "detail"] {
            assert!(e.get(key).is_some(), "event lacks {key}: {e}");
        }
        assert!(e["detail"].is_object());
    }
    let (_, body) = s.get("/v1/events?resource=b").await;
    let kinds: Vec<_> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert_eq!(kinds, ["acquired", "write_accepted", "renewed", "released"]);
    let (_, body) = s.get("/v1/events?kind=released").await;
    assert_eq!(body["events"].as_array().unwrap().len(), 3);
    let (_, body) = s.get("/v1/events?kind=renewed&resource=c").await;
    assert_eq!(body["events"].as_array().unwrap().len(), 1);
    // Paging with next_after.
    let (_, page1) = s.get("/v1/events?limit=5").await;
    assert_eq!(page1["events"].as_array().unwrap().len(), 5);
    let next = page1["next_after"].as_i64().unwrap();
    assert_eq!(next, event_ids[4]);
    let (_, page2) = s.get(&format!("/v1/events?limit=5&after={next}")).await;
    assert_eq!(page2["events"][0]["id"].as_i64().unwrap(), event_ids[5]);
    // Past the end: empty, and the cursor stays put.
    let last = *event_ids.last().unwrap();
    let (_, end) = s.get(&format!("/v1/events?after={last}")).await;
    assert_eq!(end, json!({"events": [], "next_after": last}));
    // Empty parameters mean "not set".
    let (status, body) = s.get("/v1/events?resource=&kind=&after=&limit=").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["events"].as_array().unwrap().len(), 12);
    h.finish().await;
}

crate::on_both_backends!(
    the_fence_accepts_live_tokens_and_rejects_stale_and_unknown_ones,
    a_token_whose_lease_timed_out_is_stale,
    the_value_store_writes_only_with_a_live_token,
    events_filter_page_and_never_show_lease_ids,
);

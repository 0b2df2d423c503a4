//! Event retention: old events are pruned in batches by the background
//! task, recent ones and each resource's newest event are kept, and state
//! (resources, leases, values) is never touched.

use std::time::{Duration, Instant};

use palisade::app::Config;
use palisade::retention::RetentionConfig;
use reqwest::StatusCode;
use serde_json::json;

use crate::metrics::Scrape;
use crate::support::{Backend, TestDb, TestServer};

/// Inserts `count` events for `resource`, two hours old by the database
/// clock, straight into the test database.
/// `count` `acquired` events of `resource`, `hours` old (one millisecond
/// apart, oldest first), with tokens 1, 2, … in that order.
async fn insert_backdated_events(
    db: &TestDb,
    backend: &Backend,
    resource: &str,
    count: usize,
    hours: i64,
) {
    use sqlx::Connection;
    for i in 0..count {
        match backend {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                sqlx::query(
                    "INSERT INTO events (at, kind, resource, token, holder, detail) VALUES \
                     (CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? + ?, 'acquired', ?, ?, 'h', '{}')",
                )
                .bind(hours * 3_600_000)
                .bind(i as i64)
                .bind(resource)
                .bind(i as i64 + 1)
                .execute(&mut conn)
                .await
                .unwrap();
                conn.close().await.unwrap();
            }
            Backend::Postgres(_) => {
                let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
                sqlx::query(
                    "INSERT INTO events (at, kind, resource, token, holder, detail) VALUES \
                     (now() - make_interval(hours => $1) + make_interval(secs => $2), 'acquired', $3, $4, 'h', '{}')",
                )
                .bind(hours as i32)
                .bind(i as f64 / 1000.0)
                .bind(resource)
                .bind(i as i64 + 1)
                .execute(&mut conn)
                .await
                .unwrap();
                conn.close().await.unwrap();
            }
        }
    }
}

async fn events_of(s: &TestServer, resource: &str) -> Vec<serde_json::Value> {
    s.all_events(Some(resource)).await
}

async fn old_events_are_pruned_in_batches_keeping_each_resources_last(backend: Backend) {
    let db = TestDb::create(&backend).await;
    let mut config = Config::for_tests(&db.url);
    config.event_retention = Some(RetentionConfig {
        max_age: Duration::from_secs(3600),
        interval: Duration::from_millis(100),
        batch: 3,
        pause: Duration::from_millis(1),
    });
    let s = TestServer::start_with(config).await;
    // Live state with recent events.
    let lease = s.acquire("live", "alice", 60_000).await;
    let (status, _) = s.write_value("live", 1, json!({"n": 1})).await;
    assert_eq!(status, StatusCode::OK);

    // "forgotten": only old events; the newest of them must stay.
    insert_backdated_events(&db, &backend, "forgotten", 7, 2).await;
    // "busy": old events, then a recent one; all the old ones go.
    insert_backdated_events(&db, &backend, "busy", 5, 2).await;
    let busy = s.acquire("busy", "bob", 60_000).await;

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let forgotten = events_of(&s, "forgotten").await;
        let busy_events = events_of(&s, "busy").await;
        if forgotten.len() == 1 && busy_events.len() == 1 {
            // The kept event is the newest one: the last inserted (token 7).
            let at = forgotten[0]["at"].as_str().unwrap().to_owned();
            assert!(at.as_str() < chrono_now_minus_hours(1).as_str(), "{at}");
            assert_eq!(forgotten[0]["token"], 7, "{forgotten:?}");
            assert_eq!(busy_events[0]["kind"], "acquired");
            assert_eq!(busy_events[0]["token"], busy["token"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not pruned: forgotten={forgotten:?} busy={busy_events:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = Scrape::of(&s).await;
    assert_eq!(m.value("palisade_events_pruned_total", &[]), 11.0);

    // Recent events and all state are untouched.
    let live = events_of(&s, "live").await;
    let kinds: Vec<_> = live.iter().map(|e| e["kind"].clone()).collect();
    assert_eq!(kinds, vec![json!("acquired"), json!("write_accepted")]);
    let (status, res) = s.get("/v1/resources/live").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(res["holder"]["token"], lease["token"]);
    let (status, value) = s.get("/v1/resources/live/value").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(value["value"], json!({"n": 1}));
    s.stop().await;
    db.drop_db().await;
}

fn chrono_now_minus_hours(hours: i64) -> String {
    (chrono::Utc::now() - chrono::Duration::hours(hours))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn retention_off_keeps_everything(backend: Backend) {
    let db = TestDb::create(&backend).await;
    let mut config = Config::for_tests(&db.url);
    config.event_retention = None;
    // Events older than the default retention (30 days) are there before
    // the server starts, so the pass a retention task makes at start would
    // prune all but the newest if `None` were not honoured.
    TestServer::start_with(config.clone()).await.stop().await;
    insert_backdated_events(&db, &backend, "ancient", 4, 40 * 24).await;
    let s = TestServer::start_with(config).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(events_of(&s, "ancient").await.len(), 4);
    s.stop().await;
    db.drop_db().await;
}

crate::on_both_backends!(
    old_events_are_pruned_in_batches_keeping_each_resources_last,
    retention_off_keeps_everything,
);

//! `serve --demo`: simulated workers make the UI come alive within seconds,
//! including stale writes and a stuck lock, and stop on shutdown.

use std::time::{Duration, Instant};

use palisade::app::Config;

use crate::support::{Backend, TestDb, TestServer};

async fn demo_workers_produce_stale_writes_and_a_stuck_lock(backend: Backend) {
    let db = TestDb::create(&backend).await;
    let config = Config {
        demo: true,
        ..Config::for_tests(&db.url)
    };
    let s = TestServer::start_with(config).await;
    let started = Instant::now();
    let mut seen_rejection = false;
    while started.elapsed() < Duration::from_secs(60) && !seen_rejection {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, body) = s.get("/v1/events?kind=write_rejected&limit=1").await;
        seen_rejection = !body["events"].as_array().unwrap().is_empty();
    }
    assert!(seen_rejection, "a stalled demo worker's write was rejected");
    let (_, stuck) = s.get("/v1/resources/legacy%2Fnightly-export").await;
    assert_eq!(stuck["holder"]["holder"], "cron-host-7 (crashed)");
    let events = s.all_events(None).await;
    assert!(events.iter().any(|e| e["kind"] == "write_accepted"));
    assert!(events.iter().any(|e| e["kind"] == "renewed"));
    // Shutdown is not held up by the workers.
    let stopping = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .expect("the demo stops with the server");
    assert!(stopping.elapsed() < Duration::from_secs(10));
    db.drop_db().await;
}

crate::on_both_backends!(demo_workers_produce_stale_writes_and_a_stuck_lock);

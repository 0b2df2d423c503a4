//! Group commit over HTTP: a crowd of waiters is served in full with
//! batching on. (The racing-client history checks with group commit live in
//! `concurrency`; a request failing inside a batch is tested beside the
//! batcher in `src/store/batch.rs`, where the batch is built by hand.)

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::json;

use crate::history;
use crate::on_both_backends;
use crate::support::{Backend, Harness, TestDb, TestServer};

async fn stop(server: Arc<TestServer>, db: TestDb) {
    let Ok(server) = Arc::try_unwrap(server) else {
        panic!("a task still holds the server");
    };
    server.stop().await;
    db.drop_db().await;
}

async fn a_crowd_of_waiters_is_served_in_full_with_group_commit(backend: Backend) {
    const WAITERS: usize = 30;
    let Harness { server, db } = Harness::start_with_group_commit(&backend).await;
    let s = Arc::new(server);
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let (status, lease) = s
                    .post(
                        "/v1/resources/crowd/acquire",
                        json!({"holder": format!("w{i}"), "ttl_ms": 20_000, "wait_ms": 60_000}),
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "waiter {i}: {lease}");
                let token = lease["token"].as_i64().unwrap();
                let (status, _) = s.write_value("crowd", token, json!(i)).await;
                assert_eq!(status, StatusCode::OK);
                let (status, _) = s.release(&lease).await;
                assert_eq!(status, StatusCode::OK);
                token
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.push(task.await.unwrap());
    }
    tokens.sort_unstable();
    assert_eq!(tokens, (1..=WAITERS as i64).collect::<Vec<_>>());
    let (problems, tally) = history::check(&s.all_events(Some("crowd")).await);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(tally.count("released"), WAITERS);
    stop(s, db).await;
}

on_both_backends!(a_crowd_of_waiters_is_served_in_full_with_group_commit);

//! Group commit over HTTP: a crowd of waiters is served in full with
//! batching on, and a kill -9 mid-batch loses no acknowledged write. (The racing-client history checks with group commit live in
//! `concurrency`; a request failing inside a batch is tested beside the
//! batcher in `src/store/batch.rs`, where the batch is built by hand.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::history;
use crate::on_both_backends;
use crate::restart;
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
    let Harness { server, db } = Harness::start(&backend).await;
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

/// kill -9 while batches are in flight: every write that was answered 200
/// is there after a restart (answers are sent only after the batch commits).
async fn acknowledged_writes_survive_a_crash_mid_batch(backend: Backend) {
    const CLIENTS: usize = 16;
    let db = TestDb::create(&backend).await;
    let p = restart::spawn_server_with(&db.url, &[]).await;
    let client = reqwest::Client::new();
    let mut tokens = Vec::new();
    for r in 0..CLIENTS {
        let lease: Value = client
            .post(format!("{}/v1/resources/crash-{r}/acquire", p.base))
            .json(&json!({"holder": "w", "ttl_ms": 600_000}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        tokens.push(lease["token"].as_i64().unwrap());
    }
    // Acknowledged writes so far, over all writers: the kill waits for
    // traffic to be flowing rather than for a fixed time (a loaded CI
    // machine may take longer to answer the first batches).
    let answered = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = tokens
        .iter()
        .copied()
        .enumerate()
        .map(|(r, token)| {
            let (client, base) = (client.clone(), p.base.clone());
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut acknowledged = 0;
                for n in 0.. {
                    let sent = client
                        .put(format!("{base}/v1/resources/crash-{r}/value"))
                        .json(&json!({"token": token, "value": {"n": n}}))
                        .send()
                        .await;
                    // After the kill every request fails: stop there.
                    let Ok(res) = sent else { break };
                    if res.status() != StatusCode::OK {
                        break;
                    }
                    let Ok(body) = res.json::<Value>().await else {
                        break;
                    };
                    acknowledged = body["version"].as_i64().unwrap();
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                acknowledged
            })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Relaxed) < 10 * CLIENTS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes are not being answered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Into the middle of the following batches.
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.kill_9();
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.push(writer.await.unwrap());
    }
    assert!(acknowledged.iter().sum::<i64>() > 0, "no write got through");

    let p = restart::spawn_server_with(&db.url, &[]).await;
    for (r, (&acked, &token)) in acknowledged.iter().zip(&tokens).enumerate() {
        let value: Value = client
            .get(format!("{}/v1/resources/crash-{r}/value", p.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let stored = value["version"].as_i64().unwrap_or(0);
        assert!(
            stored >= acked,
            "crash-{r}: acknowledged {acked}, stored {stored}"
        );
        let res: Value = client
            .get(format!("{}/v1/resources/crash-{r}", p.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            res["holder"]["token"], token,
            "the acknowledged lease survived"
        );
    }
    p.kill_9();
    db.drop_db().await;
}

on_both_backends!(
    a_crowd_of_waiters_is_served_in_full_with_group_commit,
    acknowledged_writes_survive_a_crash_mid_batch,
);

/// The harness batches writes exactly as `palisade serve` does by default,
/// so the suite tests what runs in production (it once did not: group
/// commit became the default while the harness kept it off).
#[test]
fn the_test_harness_batches_like_palisade_serve() {
    use clap::Parser;
    use palisade::cli::{Cli, Command};
    let Command::Serve(args) = Cli::parse_from(["palisade", "serve"]).command else {
        panic!("not the serve command");
    };
    let serve = args.into_config().group_commit;
    assert!(serve.is_some(), "serve batches by default");
    assert_eq!(
        palisade::app::Config::for_tests("sqlite://x.db").group_commit,
        serve
    );
}

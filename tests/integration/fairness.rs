//! Fair handoff of a contended resource: waiters are served in arrival
//! order, none starves, and a crowd of waiters is served in full, each
//! with a token of its own (checked against the event log's history).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::history;
use crate::on_both_backends;
use crate::support::{Backend, Harness, TestDb, TestServer};

/// Stops a shared server once every task has let go of it.
async fn stop(server: Arc<TestServer>) {
    let Ok(server) = Arc::try_unwrap(server) else {
        panic!("a task still holds the server");
    };
    server.stop().await;
}

async fn finish(server: Arc<TestServer>, db: TestDb) {
    stop(server).await;
    db.drop_db().await;
}

/// Acquire that waits up to `wait_ms`; returns the status and body.
async fn acquire_waiting(
    s: &TestServer,
    resource: &str,
    holder: &str,
    wait_ms: i64,
) -> (StatusCode, Value) {
    s.post(
        &format!("/v1/resources/{resource}/acquire"),
        json!({"holder": holder, "ttl_ms": 20_000, "wait_ms": wait_ms}),
    )
    .await
}

async fn waiters_are_served_in_arrival_order_on(h: Harness) {
    const WAITERS: usize = 10;
    let Harness { server, db } = h;
    let s = Arc::new(server);
    let first = s.acquire("fifo", "holder", 60_000).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (s, order) = (s.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let (status, lease) = acquire_waiting(&s, "fifo", &format!("w{i}"), 30_000).await;
            assert_eq!(status, StatusCode::OK, "waiter {i}: {lease}");
            order.lock().unwrap().push(i);
            let (status, _) = s.release(&lease).await;
            assert_eq!(status, StatusCode::OK);
        }));
        // Far longer than a request takes to join the queue, so arrival
        // order is the spawn order.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = s.release(&first).await;
    assert_eq!(status, StatusCode::OK);
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "served out of order"
    );
    finish(s, db).await;
}

async fn no_waiter_starves_on_a_hot_resource_on(h: Harness) {
    const CLIENTS: usize = 8;
    let Harness { server, db } = h;
    let s = Arc::new(server);
    let stop_at = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let (mut turns, mut longest_wait) = (0_u32, Duration::ZERO);
            while Instant::now() < stop_at {
                let asked = Instant::now();
                let (status, lease) = acquire_waiting(&s, "hot", &format!("c{i}"), 30_000).await;
                assert_eq!(status, StatusCode::OK, "client {i}: {lease}");
                longest_wait = longest_wait.max(asked.elapsed());
                turns += 1;
                let (status, _) = s
                    .write_value("hot", lease["token"].as_i64().unwrap(), json!(i))
                    .await;
                assert_eq!(status, StatusCode::OK);
                let (status, _) = s.release(&lease).await;
                assert_eq!(status, StatusCode::OK);
            }
            (turns, longest_wait)
        }));
    }
    let mut turns = Vec::new();
    for task in tasks {
        let (n, longest_wait) = task.await.unwrap();
        // A generous bound: a fair queue of 8 never makes anyone wait for
        // more than a few rounds, while a racing stampede can starve one.
        assert!(longest_wait < Duration::from_secs(20), "{longest_wait:?}");
        turns.push(n);
    }
    let (fewest, most) = (*turns.iter().min().unwrap(), *turns.iter().max().unwrap());
    assert!(fewest >= 1, "a client was never served: {turns:?}");
    // Round-robin turns: every client gets within a turn or two of the others.
    assert!(most - fewest <= 2, "unfair shares: {turns:?}");
    let (problems, _) = history::check(&s.all_events(Some("hot")).await);
    assert!(problems.is_empty(), "{problems:#?}");
    finish(s, db).await;
}

async fn a_crowd_of_waiters_is_served_in_full_on(h: Harness) {
    const WAITERS: usize = 40;
    let Harness { server, db } = h;
    let s = Arc::new(server);
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let (status, lease) = acquire_waiting(&s, "crowd", &format!("w{i}"), 60_000).await;
                assert_eq!(status, StatusCode::OK, "waiter {i}: {lease}");
                let token = lease["token"].as_i64().unwrap();
                let (status, body) = s.write_value("crowd", token, json!(i)).await;
                assert_eq!(status, StatusCode::OK, "{body}");
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
    let expected: Vec<i64> = (1..=WAITERS as i64).collect();
    assert_eq!(tokens, expected, "every waiter got its own token");
    let (status, value) = s.get("/v1/resources/crowd/value").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(value["version"], WAITERS as i64);
    let (problems, tally) = history::check(&s.all_events(Some("crowd")).await);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(tally.count("acquired"), WAITERS);
    assert_eq!(tally.count("released"), WAITERS);
    finish(s, db).await;
}

// Each case twice: with group commit (the default, where a release grants
// the next waiter in its own batch) and with one transaction per request
// (where the woken waiter retries its acquire).
async fn waiters_are_served_in_arrival_order(backend: Backend) {
    waiters_are_served_in_arrival_order_on(Harness::start(&backend).await).await;
}

async fn waiters_are_served_in_arrival_order_without_group_commit(backend: Backend) {
    waiters_are_served_in_arrival_order_on(Harness::start_without_group_commit(&backend).await)
        .await;
}

async fn no_waiter_starves_on_a_hot_resource(backend: Backend) {
    no_waiter_starves_on_a_hot_resource_on(Harness::start(&backend).await).await;
}

async fn no_waiter_starves_on_a_hot_resource_without_group_commit(backend: Backend) {
    no_waiter_starves_on_a_hot_resource_on(Harness::start_without_group_commit(&backend).await)
        .await;
}

async fn a_crowd_of_waiters_is_served_in_full(backend: Backend) {
    a_crowd_of_waiters_is_served_in_full_on(Harness::start(&backend).await).await;
}

async fn a_crowd_of_waiters_is_served_in_full_without_group_commit(backend: Backend) {
    a_crowd_of_waiters_is_served_in_full_on(Harness::start_without_group_commit(&backend).await)
        .await;
}

on_both_backends!(
    waiters_are_served_in_arrival_order,
    no_waiter_starves_on_a_hot_resource,
    a_crowd_of_waiters_is_served_in_full,
    waiters_are_served_in_arrival_order_without_group_commit,
    no_waiter_starves_on_a_hot_resource_without_group_commit,
    a_crowd_of_waiters_is_served_in_full_without_group_commit,
);

/// A queue on one instance is handed the resource by releases made through
/// another (LISTEN/NOTIFY wakes the head), not by TTLs running out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn a_queue_on_one_instance_is_served_by_releases_on_another() {
    const WAITERS: usize = 5;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let a = Arc::new(TestServer::start(&db.url).await);
    let b = Arc::new(TestServer::start(&db.url).await);
    let first = a.acquire("shared", "on-a", 60_000).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (a, b) = (a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            // Queued on B, holding for 60 s unless released through A.
            let (status, lease) = b
                .post(
                    "/v1/resources/shared/acquire",
                    json!({"holder": format!("on-b-{i}"), "ttl_ms": 60_000, "wait_ms": 30_000}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "waiter {i}: {lease}");
            let (status, _) = a.release(&lease).await;
            assert_eq!(status, StatusCode::OK);
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.release(&first).await;
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waiters were served by deadlines, not releases: {:?}",
        started.elapsed()
    );
    let (problems, tally) = history::check(&a.all_events(Some("shared")).await);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(tally.count("acquired"), WAITERS + 1);
    stop(a).await;
    finish(b, db).await;
}

//! Many clients racing over real HTTP on a real database; afterwards the
//! event log must replay as a safe serial history.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::history;
use crate::metrics::completed_sweeps;
use crate::support::{Backend, Harness, TestDb, TestServer};
use palisade::app::Config;

const CLIENTS: usize = 32;
const RESOURCES: usize = 4;
const TTL_MS: i64 = 250;

#[derive(Default)]
struct Counts {
    granted: AtomicUsize,
    held: AtomicUsize,
    accepted: AtomicUsize,
    rejected: AtomicUsize,
    zombies: AtomicUsize,
}

/// One worker: acquire (waiting), sometimes pause past the TTL like a
/// stalled process, write with the token, release.
async fn worker(
    servers: Arc<Vec<String>>,
    client: reqwest::Client,
    id: usize,
    until: Instant,
    counts: Arc<Counts>,
) {
    let mut seq = 0;
    while Instant::now() < until {
        let (resource, base, pause) = {
            let mut rng = rand::rng();
            let resource = format!("res-{}", rng.random_range(0..RESOURCES));
            let base = servers[rng.random_range(0..servers.len())].clone();
            let pause = rng.random_bool(0.2);
            (resource, base, pause)
        };
        let res = client
            .post(format!("{base}/v1/resources/{resource}/acquire"))
            .json(&json!({"holder": format!("worker-{id}"), "ttl_ms": TTL_MS, "wait_ms": 1000}))
            .send()
            .await
            .expect("acquire sent");
        if res.status() == StatusCode::CONFLICT {
            counts.held.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        assert_eq!(res.status(), StatusCode::OK);
        counts.granted.fetch_add(1, Ordering::Relaxed);
        let lease: Value = res.json().await.expect("lease");
        if pause {
            // A GC pause: the lease expires and someone else takes over.
            counts.zombies.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(TTL_MS as u64 + 150)).await;
        }
        seq += 1;
        let res = client
            .put(format!("{base}/v1/resources/{resource}/value"))
            .json(&json!({"token": lease["token"], "value": {"worker": id, "seq": seq}}))
            .send()
            .await
            .expect("write sent");
        match res.status() {
            StatusCode::OK => counts.accepted.fetch_add(1, Ordering::Relaxed),
            StatusCode::CONFLICT => counts.rejected.fetch_add(1, Ordering::Relaxed),
            other => panic!("unexpected write status {other}"),
        };
        let res = client
            .post(format!(
                "{base}/v1/leases/{}/release",
                lease["lease_id"].as_str().unwrap_or("")
            ))
            .send()
            .await
            .expect("release sent");
        assert!(
            matches!(res.status(), StatusCode::OK | StatusCode::GONE),
            "{}",
            res.status()
        );
    }
}

async fn race(servers: &[&TestServer], duration: Duration) -> Arc<Counts> {
    let bases = Arc::new(servers.iter().map(|s| s.base.clone()).collect::<Vec<_>>());
    let counts = Arc::new(Counts::default());
    let until = Instant::now() + duration;
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|id| {
            tokio::spawn(worker(
                bases.clone(),
                client.clone(),
                id,
                until,
                counts.clone(),
            ))
        })
        .collect();
    for t in tasks {
        t.await.expect("worker finished");
    }
    counts
}

/// Checks the whole log, the final state, and that the run exercised the
/// dangerous paths (expiries and rejected zombie writes).
async fn verify(s: &TestServer, counts: &Counts) {
    // Let the sweepers record the last expiries.
    tokio::time::sleep(Duration::from_millis(TTL_MS as u64 + 600)).await;
    let events = s.all_events(None).await;
    let (violations, tally) = history::check(&events);
    assert!(
        violations.is_empty(),
        "{} violations, first: {:#?}",
        violations.len(),
        &violations[..violations.len().min(10)]
    );
    let granted = counts.granted.load(Ordering::Relaxed);
    assert_eq!(
        tally.count("acquired"),
        granted,
        "every grant recorded exactly once"
    );
    assert_eq!(
        tally.count("write_accepted"),
        counts.accepted.load(Ordering::Relaxed)
    );
    assert_eq!(
        tally.count("write_rejected"),
        counts.rejected.load(Ordering::Relaxed)
    );
    let endings = tally.count("released") + tally.count("expired") + tally.count("force_released");
    assert_eq!(endings, granted, "every lease ended exactly once");
    // A loaded 2-core machine still manages far more than this in 4 s.
    assert!(
        granted > 20,
        "too little traffic to mean anything: {granted}"
    );
    assert!(tally.count("expired") > 0, "no lease expired");
    assert!(
        counts.rejected.load(Ordering::Relaxed) > 0,
        "no zombie write was rejected"
    );
    // The store's final state agrees with the log: no lost updates.
    for r in 0..RESOURCES {
        let name = format!("res-{r}");
        let accepted: Vec<&Value> = events
            .iter()
            .filter(|e| e["resource"] == name.as_str() && e["kind"] == "write_accepted")
            .collect();
        let (status, value) = s.get(&format!("/v1/resources/{name}/value")).await;
        if accepted.is_empty() {
            assert_eq!(status, StatusCode::NOT_FOUND);
            continue;
        }
        assert_eq!(
            value["version"].as_u64(),
            Some(accepted.len() as u64),
            "{name}: lost update"
        );
        assert_eq!(value["token"], accepted.last().unwrap()["token"]);
        let (_, res) = s.get(&format!("/v1/resources/{name}")).await;
        assert_eq!(res["accepted_token"], value["token"]);
    }
}

async fn racing_clients_leave_a_safe_serial_history(backend: Backend) {
    racing_history(Harness::start(&backend).await, Duration::from_secs(4)).await;
}

/// The same race with one transaction per request (group commit off).
async fn racing_clients_leave_a_safe_serial_history_without_group_commit(backend: Backend) {
    racing_history(
        Harness::start_without_group_commit(&backend).await,
        Duration::from_secs(4),
    )
    .await;
}

async fn racing_history(h: Harness, duration: Duration) {
    let counts = race(&[&h.server], duration).await;
    verify(&h.server, &counts).await;
    h.finish().await;
}

async fn concurrent_writers_lose_no_update(backend: Backend) {
    writers_lose_no_update(Harness::start(&backend).await).await;
}

async fn concurrent_writers_lose_no_update_without_group_commit(backend: Backend) {
    writers_lose_no_update(Harness::start_without_group_commit(&backend).await).await;
}

async fn writers_lose_no_update(h: Harness) {
    let s = &h.server;
    let old = s.acquire("counter", "old", 30_000).await;
    s.release(&old).await;
    s.acquire("counter", "live", 30_000).await;
    let writers: Vec<_> = (0..32)
        .map(|i| {
            let client = s.client.clone();
            let url = s.url("/v1/resources/counter/value");
            tokio::spawn(async move {
                let mut codes = Vec::new();
                for n in 0..10 {
                    // Every fourth writer is a zombie holding token 1.
                    let token = if i % 4 == 0 { 1 } else { 2 };
                    let res = client
                        .put(&url)
                        .json(&json!({"token": token, "value": {"writer": i, "n": n}}))
                        .send()
                        .await
                        .unwrap();
                    codes.push((token, res.status()));
                }
                codes
            })
        })
        .collect();
    let mut accepted = 0;
    for w in writers {
        for (token, status) in w.await.unwrap() {
            match token {
                1 => assert_eq!(status, StatusCode::CONFLICT, "a stale token got through"),
                _ => {
                    assert_eq!(status, StatusCode::OK);
                    accepted += 1;
                }
            }
        }
    }
    assert_eq!(accepted, 240);
    let (_, value) = s.get("/v1/resources/counter/value").await;
    assert_eq!(value["version"], 240, "every accepted write is one version");
    assert_eq!(value["token"], 2);
    h.finish().await;
}

crate::on_both_backends!(
    racing_clients_leave_a_safe_serial_history,
    concurrent_writers_lose_no_update,
    racing_clients_leave_a_safe_serial_history_without_group_commit,
    concurrent_writers_lose_no_update_without_group_commit,
);

/// Two instances on one PostgreSQL, one transaction per request: clients
/// spread over both, both sweep. (With group commit: the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn two_instances_on_one_postgres_stay_safe() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let one_by_one = || Config {
        group_commit: None,
        ..Config::for_tests(&db.url)
    };
    let a = TestServer::start_with(one_by_one()).await;
    let b = TestServer::start_with(one_by_one()).await;
    let counts = race(&[&a, &b], Duration::from_secs(4)).await;
    verify(&a, &counts).await;
    for s in [&a, &b] {
        assert!(completed_sweeps(s).await > 0.0, "an instance never swept");
    }
    a.stop().await;
    b.stop().await;
    db.drop_db().await;
}

/// Two instances batching writes on one PostgreSQL: their batch writers
/// lock rows in one order, so batches never deadlock, and the history stays
/// serial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn two_instances_with_group_commit_stay_safe() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let a = TestServer::start_with(Config::for_tests(&db.url)).await;
    let b = TestServer::start_with(Config::for_tests(&db.url)).await;
    let counts = race(&[&a, &b], Duration::from_secs(8)).await;
    verify(&a, &counts).await;
    for s in [&a, &b] {
        assert!(completed_sweeps(s).await > 0.0, "an instance never swept");
    }
    a.stop().await;
    b.stop().await;
    db.drop_db().await;
}

/// A waiter on one instance is woken by a release on the other (through
/// LISTEN/NOTIFY), not by the holder's TTL running out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn a_release_on_one_instance_wakes_a_waiter_on_another() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let a = TestServer::start(&db.url).await;
    let b = TestServer::start(&db.url).await;
    let lease = a.acquire("shared", "on-a", 60_000).await;
    let waiter = {
        let client = b.client.clone();
        let url = b.url("/v1/resources/shared/acquire");
        tokio::spawn(async move {
            let started = Instant::now();
            let res = client
                .post(url)
                .json(&json!({"holder": "on-b", "ttl_ms": 1000, "wait_ms": 30_000}))
                .send()
                .await
                .unwrap();
            (res.status(), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    a.release(&lease).await;
    let (status, waited) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        waited < Duration::from_secs(15),
        "woken by the TTL or the deadline, not the release: {waited:?}"
    );
    a.stop().await;
    b.stop().await;
    db.drop_db().await;
}

/// Different instances never issue the same token, even when they race to
/// create the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn instances_racing_on_a_new_resource_issue_distinct_tokens() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let a = TestServer::start(&db.url).await;
    let b = TestServer::start(&db.url).await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let s = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let client = a.client.clone();
        tasks.push(tokio::spawn(async move {
            let res = client
                .post(format!("{s}/v1/resources/fresh-{}/acquire", i % 5))
                .json(&json!({"holder": format!("h{i}"), "ttl_ms": 100, "wait_ms": 10_000}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            let lease: Value = res.json().await.unwrap();
            (i % 5, lease["token"].as_i64().unwrap())
        }));
    }
    let mut tokens: Vec<(usize, i64)> = Vec::new();
    for t in tasks {
        tokens.push(t.await.unwrap());
    }
    for r in 0..5 {
        let mut mine: Vec<i64> = tokens
            .iter()
            .filter(|(res, _)| *res == r)
            .map(|(_, t)| *t)
            .collect();
        mine.sort();
        assert_eq!(
            mine,
            (1..=8).collect::<Vec<_>>(),
            "resource {r}: tokens {mine:?}"
        );
    }
    a.stop().await;
    b.stop().await;
    db.drop_db().await;
}

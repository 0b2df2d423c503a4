//! The Rust client (`palisade::client`) against the real server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use palisade::client::{
    AcquireOptions, Client, Error, EventFilter, EventKind, LeaseState, LostReason,
};
use palisade::http::error::ErrorCode;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::support::{Backend, Harness};

fn client(h: &Harness) -> Client {
    Client::new(&h.server.base).unwrap()
}

fn admin(h: &Harness) -> Client {
    Client::builder(&h.server.base)
        .bearer_token(&h.server.admin_token)
        .build()
        .unwrap()
}

fn opts(holder: &str, ttl_ms: u64) -> AcquireOptions {
    AcquireOptions::new(holder, Duration::from_millis(ttl_ms))
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Report {
    day: String,
    total_cents: i64,
}

async fn acquire_write_read_release(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    assert!(c.resource("reports/daily").await.unwrap().is_none());
    assert!(
        c.read_value::<Report>("reports/daily")
            .await
            .unwrap()
            .is_none()
    );

    let lease = c
        .acquire("reports/daily", opts("worker-1", 30_000))
        .await
        .unwrap();
    assert_eq!(lease.token(), 1);
    assert_eq!(lease.resource(), "reports/daily");
    assert_eq!(lease.holder(), "worker-1");
    assert_eq!(lease.lease_id().len(), 32);
    assert!(lease.expires_at() > chrono::Utc::now());
    assert!(!format!("{lease:?}").contains(lease.lease_id()));

    let report = Report {
        day: "2026-12-01".into(),
        total_cents: 1_234_567,
    };
    let receipt = c
        .write_value("reports/daily", lease.token(), &report)
        .await
        .unwrap();
    assert_eq!((receipt.token, receipt.version), (1, 1));
    let stored = c
        .read_value::<Report>("reports/daily")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.value, report);
    assert_eq!(stored.token, 1);

    let fenced = c.fence("reports/daily", lease.token()).await.unwrap();
    assert_eq!((fenced.token, fenced.accepted_token), (1, 1));

    let info = c.resource("reports/daily").await.unwrap().unwrap();
    assert_eq!(info.last_token, 1);
    assert_eq!(info.holder.as_ref().map(|h| h.token), Some(1));

    let released = lease.release().await.unwrap();
    assert_eq!(released.state, LeaseState::Released);
    let info = c.resource("reports/daily").await.unwrap().unwrap();
    assert!(info.holder.is_none());

    let page = c
        .events(&EventFilter::resource("reports/daily"))
        .await
        .unwrap();
    let kinds: Vec<EventKind> = page.events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::Acquired,
            EventKind::WriteAccepted,
            EventKind::WriteAccepted,
            EventKind::Released
        ]
    );
    assert_eq!(page.next_after, page.events.last().unwrap().id);
    let later = c
        .events(&EventFilter {
            after: Some(page.next_after),
            ..EventFilter::default()
        })
        .await
        .unwrap();
    assert!(later.events.is_empty());
    h.finish().await;
}

async fn a_held_lock_is_a_typed_error_with_the_holder(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    let lease = c.acquire("inv", opts("alice", 30_000)).await.unwrap();
    let started = Instant::now();
    let err = c
        .acquire("inv", opts("bob", 1000).wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(250));
    match &err {
        Error::Held { holder, .. } => {
            assert_eq!(holder.holder, "alice");
            assert_eq!(holder.token, lease.token());
            assert_eq!(holder.expires_at, lease.expires_at());
        }
        other => panic!("expected Held, got {other:?}"),
    }
    assert_eq!(err.code(), Some(ErrorCode::LockHeld));
    assert!(!err.is_retryable());

    // A waiting acquire gets the lock as soon as it is released.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.acquire("inv", opts("bob", 5000).wait(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease.release().await.unwrap();
    let bobs = waiter.await.unwrap().unwrap();
    assert_eq!(bobs.token(), 2);
    assert_eq!(bobs.holder(), "bob");
    bobs.release().await.unwrap();
    h.finish().await;
}

async fn auto_renewal_keeps_a_short_lease_alive(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    // Short, but with room for a loaded CI machine: renewals every 333 ms.
    let lease = c.acquire("short", opts("w", 1000)).await.unwrap();
    let first_deadline = lease.expires_at();
    // Four TTLs: without renewals the lease would have expired long ago.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert!(!lease.is_lost(), "{:?}", lease.status());
    assert!(lease.expires_at() > first_deadline);
    let info = c.resource("short").await.unwrap().unwrap();
    assert_eq!(info.holder.map(|h| h.token), Some(lease.token()));
    // Nobody else got in, and the token still writes.
    let err = c.acquire("short", opts("other", 1000)).await.unwrap_err();
    assert!(matches!(err, Error::Held { .. }), "{err:?}");
    c.write_value("short", lease.token(), &"still mine")
        .await
        .unwrap();
    let renewals = c
        .events(&EventFilter {
            kind: Some(EventKind::Renewed),
            ..EventFilter::resource("short")
        })
        .await
        .unwrap()
        .events
        .len();
    assert!(renewals >= 4, "only {renewals} renewals in 4 TTLs");
    lease.release().await.unwrap();
    h.finish().await;
}

async fn a_force_release_is_reported_as_lost(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    let lease = c.acquire("nightly", opts("w", 600)).await.unwrap();
    let mut watch = lease.watch();
    assert!(!watch.borrow().is_lost());

    let err = c.force_release("nightly", "no token").await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let ended = admin(&h)
        .force_release("nightly", "stuck job")
        .await
        .unwrap();
    assert_eq!(ended.state, LeaseState::ForceReleased);
    assert_eq!(ended.lease_id, None, "the admin answer leaks no secret");

    let reason = tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("loss noticed within about one renewal interval");
    assert_eq!(reason, LostReason::Ended(LeaseState::ForceReleased));
    watch.changed().await.ok();
    assert!(watch.borrow().is_lost());

    // The stale holder's writes are refused, with the forensics.
    let err = c
        .write_value("nightly", lease.token(), &"late")
        .await
        .unwrap_err();
    match err {
        Error::StaleToken {
            token, lease_state, ..
        } => {
            assert_eq!(token, lease.token());
            assert_eq!(lease_state, Some(LeaseState::ForceReleased));
        }
        other => panic!("expected StaleToken, got {other:?}"),
    }
    let err = admin(&h)
        .force_release("nightly", "again")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    let err = lease.release().await.unwrap_err();
    assert!(matches!(err, Error::LeaseNotActive { .. }), "{err:?}");
    h.finish().await;
}

async fn an_unreachable_server_means_lost_by_the_deadline(backend: Backend) {
    let Harness { server, db } = Harness::start(&backend).await;
    let c = Client::builder(&server.base)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lease = c.acquire("orphan", opts("w", 800)).await.unwrap();
    server.stop().await;
    let started = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("lost by the lease's deadline, not later");
    assert!(
        matches!(reason, LostReason::Unreachable { .. }),
        "{reason:?}"
    );
    assert!(
        started.elapsed() <= Duration::from_millis(1200),
        "{:?}",
        started.elapsed()
    );
    drop(lease);
    db.drop_db().await;
}

async fn stale_and_unknown_tokens_are_typed(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    // No guard: nothing renews this one, so it expires.
    let first = c.acquire_lease("ledger", opts("slow", 200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let second = c.acquire("ledger", opts("fast", 30_000)).await.unwrap();
    assert_eq!(second.token(), first.token + 1);
    c.write_value("ledger", second.token(), &1).await.unwrap();

    match c.write_value("ledger", first.token, &0).await.unwrap_err() {
        Error::StaleToken {
            token,
            accepted_token,
            fenced_by,
            ..
        } => {
            assert_eq!((token, accepted_token), (first.token, second.token()));
            assert_eq!(fenced_by.map(|f| f.holder), Some("fast".to_owned()));
        }
        other => panic!("expected StaleToken, got {other:?}"),
    }
    match c.fence("ledger", 99).await.unwrap_err() {
        Error::UnknownToken {
            token, last_token, ..
        } => assert_eq!((token, last_token), (99, Some(second.token()))),
        other => panic!("expected UnknownToken, got {other:?}"),
    }
    let renew = c
        .renew(first.lease_id.as_deref().unwrap(), None)
        .await
        .unwrap_err();
    match renew {
        Error::LeaseNotActive { lease, .. } => {
            assert_eq!(lease.map(|l| l.state), Some(LeaseState::Expired));
        }
        other => panic!("expected LeaseNotActive, got {other:?}"),
    }
    let stored = c.read_value::<i64>("ledger").await.unwrap().unwrap();
    assert_eq!((stored.value, stored.token), (1, second.token()));
    second.release().await.unwrap();
    h.finish().await;
}

async fn bad_input_and_unknown_ids_are_typed(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    let err = c.acquire("r", opts("w", 10)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                code: ErrorCode::InvalidTtl,
                ..
            }
        ),
        "{err:?}"
    );
    let err = c.acquire("", opts("w", 1000)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    let err = c.acquire("r", opts("", 1000)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidHolder));
    let err = c.fence("r", 0).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidToken));
    let err = c.renew(&"0".repeat(32), None).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotFound {
                code: ErrorCode::LeaseNotFound,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(c.lease(&"0".repeat(32)).await.unwrap().is_none());

    let unreachable = Client::builder("http://127.0.0.1:9")
        .retries(1)
        .retry_backoff(Duration::from_millis(10))
        .build()
        .unwrap();
    let err = unreachable.resource("r").await.unwrap_err();
    assert!(matches!(err, Error::Transport(_)), "{err:?}");
    assert!(err.is_retryable());
    h.finish().await;
}

async fn dropping_the_guard_releases_the_lease(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    let lease = c.acquire("dropped", opts("w", 30_000)).await.unwrap();
    let id = lease.lease_id().to_owned();
    drop(lease);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = c.lease(&id).await.unwrap().unwrap();
        if info.state == LeaseState::Released {
            break;
        }
        assert!(Instant::now() < deadline, "still {:?}", info.state);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.finish().await;
}

/// A TCP proxy that forwards the first connection's request to the server
/// but never returns the answer (the client times out after the server has
/// acted), then forwards later connections normally.
async fn proxy_losing_the_first_answer(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    tokio::spawn(async move {
        let mut first = true;
        // Bounded: the test needs two connections, a few more is slack.
        for _ in 0..8 {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let lose_answer = std::mem::replace(&mut first, false);
            tokio::spawn(async move {
                if lose_answer {
                    let (mut from_client, _) = inbound.split();
                    let _ = tokio::io::copy(&mut from_client, &mut outbound).await;
                    let _ = outbound.shutdown().await;
                } else {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, connections)
}

async fn a_retried_acquire_reuses_its_request_id(backend: Backend) {
    let h = Harness::start(&backend).await;
    let upstream: SocketAddr = h.server.base.trim_start_matches("http://").parse().unwrap();
    let (proxy, connections) = proxy_losing_the_first_answer(upstream).await;
    let flaky = Client::builder(format!("http://{proxy}"))
        .timeout(Duration::from_millis(700))
        .retries(2)
        .retry_backoff(Duration::from_millis(20))
        .build()
        .unwrap();
    // No request id given: the client makes one and keeps it for the retry.
    let lease = flaky
        .acquire_lease("once", opts("w", 30_000))
        .await
        .unwrap();
    assert_eq!(lease.token, 1);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "the first attempt timed out and was retried once"
    );
    let c = client(&h);
    let info = c.resource("once").await.unwrap().unwrap();
    assert_eq!(info.last_token, 1, "the retry must not take a second lease");
    let acquired = c
        .events(&EventFilter {
            kind: Some(EventKind::Acquired),
            ..EventFilter::resource("once")
        })
        .await
        .unwrap()
        .events;
    assert_eq!(acquired.len(), 1);
    assert_eq!(
        info.holder.map(|h| h.token),
        Some(1),
        "the first attempt's lease is the one held"
    );
    h.finish().await;
}

crate::on_both_backends!(
    acquire_write_read_release,
    a_held_lock_is_a_typed_error_with_the_holder,
    auto_renewal_keeps_a_short_lease_alive,
    a_force_release_is_reported_as_lost,
    an_unreachable_server_means_lost_by_the_deadline,
    stale_and_unknown_tokens_are_typed,
    bad_input_and_unknown_ids_are_typed,
    dropping_the_guard_releases_the_lease,
    a_retried_acquire_reuses_its_request_id,
);

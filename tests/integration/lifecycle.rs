//! Health probes, database loss and graceful shutdown.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::metrics::eventually;
use crate::support::{Backend, Harness, TestDb, TestServer};

async fn health_and_readiness_answer(backend: Backend) {
    let h = Harness::start(&backend).await;
    let (status, body) = h.server.get("/healthz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, body) = h.server.get("/readyz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );
    h.finish().await;
}

crate::on_both_backends!(health_and_readiness_answer);

/// When the database goes away, requests fail fast with 503 `unavailable`
/// (never a false success or a false "held") and /readyz says not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn a_lost_database_is_a_503_not_a_500() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let s = TestServer::start(&db.url).await;
    s.acquire("r", "w", 60_000).await;
    let name = db
        .url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let Backend::Postgres(admin) = &backend else {
        unreachable!()
    };
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin)
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await
        .unwrap();

    let started = Instant::now();
    let (status, body) = s
        .post(
            "/v1/resources/r/acquire",
            json!({"holder": "x", "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
    let (status, body) = s.fence("r", 1).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, _) = s.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = s.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "the process itself is alive");
    // The sweeper keeps trying, and every failed run is counted.
    eventually(&s, "a failed sweep counted", |m| {
        m.value("palisade_expiry_sweeps_total", &[("outcome", "failed")]) > 0.0
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "failing took {:?}",
        started.elapsed()
    );
    s.stop().await;
}

/// A TCP proxy in front of PostgreSQL that can go down (every open
/// connection cut, new ones closed at once, as when the database restarts or
/// the network fails) and come back up.
async fn database_proxy(upstream: String) -> (String, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (up, _) = tokio::sync::watch::channel(true);
    let switch = up.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let mut state = up.subscribe();
            if !*state.borrow_and_update() {
                continue;
            }
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = state.wait_for(|up| !*up) => {}
                }
            });
        }
    });
    (addr, switch)
}

/// The database goes away and comes back: while it is gone requests get 503
/// `unavailable` and /readyz says not ready; once it is back the same
/// process, never restarted, is ready again and the lease taken before the
/// outage can be renewed, written with and released. The outage is staged
/// in a proxy of the test's own, so the shared server is never disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn service_resumes_by_itself_when_the_database_returns() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    // postgres://user@HOST:PORT/name?… → the same through the proxy.
    let (scheme_user, rest) = db.url.split_once('@').unwrap();
    let (host_port, path) = rest.split_once('/').unwrap();
    let (proxy, database_up) = database_proxy(host_port.to_owned()).await;
    let s = TestServer::start(&format!("{scheme_user}@{proxy}/{path}")).await;
    let lease = s.acquire("r", "before-outage", 60_000).await;
    let token = lease["token"].as_i64().unwrap();

    database_up.send_replace(false);
    // Down: every database-backed answer is a 503, nothing is granted.
    let (status, body) = s
        .post(
            "/v1/resources/other/acquire",
            json!({"holder": "during-outage", "ttl_ms": 60_000}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
    let (status, body) = s.renew(&lease, json!({})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = s.fence("r", token).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = s.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(s.get("/healthz").await.0, StatusCode::OK);

    // Back up.
    database_up.send_replace(true);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = s.get("/readyz").await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never came back: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The lease from before the outage lives on and works.
    let (status, body) = s.renew(&lease, json!({"ttl_ms": 30_000})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = s.write_value("r", token, json!("after the outage")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = s.release(&lease).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("released")),
        "{body}"
    );
    // New work too; nothing was granted during the outage.
    let next = s.acquire("r", "after-outage", 60_000).await;
    assert_eq!(next["token"], token + 1);
    let (status, body) = s.fence("r", token + 1).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = s.get("/v1/resources/other").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    s.stop().await;
    db.drop_db().await;
}

/// SIGTERM: in-flight requests finish (a waiting acquire is answered at
/// once), then the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_gracefully() {
    let db = TestDb::create(&Backend::Sqlite).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            &db.url,
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.get(format!("{base}/readyz")).send().await.is_err() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = client
        .post(format!("{base}/v1/resources/r/acquire"))
        .json(&json!({"holder": "a", "ttl_ms": 60_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let waiter = tokio::spawn({
        let client = client.clone();
        let url = format!("{base}/v1/resources/r/acquire");
        async move {
            let res = client
                .post(url)
                .json(&json!({"holder": "b", "ttl_ms": 1000, "wait_ms": 60_000}))
                .send()
                .await
                .unwrap();
            (res.status(), res.json::<serde_json::Value>().await.unwrap())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "shutting_down");
    let exit = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "exit status {exit:?}");
    assert!(
        client.get(format!("{base}/healthz")).send().await.is_err(),
        "no longer accepting"
    );
}

/// Every response, API or error, carries the security headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_carry_security_headers() {
    let h = Harness::start(&Backend::Sqlite).await;
    for path in ["/healthz", "/v1/resources/none", "/no/such/route"] {
        let res = h
            .server
            .client
            .get(h.server.url(path))
            .send()
            .await
            .unwrap();
        let headers = res.headers();
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["x-frame-options"], "DENY");
        assert_eq!(headers["referrer-policy"], "no-referrer");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("script-src 'self' 'unsafe-inline'"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"));
    }
    h.finish().await;
}

/// `sqlite::memory:` runs the whole service in process: group commit falls
/// back to sqlx's one writer connection, and no file is created.
#[tokio::test]
async fn an_in_memory_database_serves_every_write() {
    let dir = std::env::current_dir().expect("cwd");
    let before: Vec<_> = std::fs::read_dir(&dir).expect("ls").collect();
    let server = TestServer::start("sqlite::memory:").await;
    let lease = server.acquire("reports", "worker-1", 60_000).await;
    let token = lease["token"].as_i64().expect("token");
    let (status, body) = server
        .write_value("reports", token, json!({"ok": true}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(server.release(&lease).await.0, StatusCode::OK);
    let next = server.acquire("reports", "worker-2", 60_000).await;
    assert_eq!(next["token"], token + 1, "{next}");
    let (status, body) = server.get("/v1/resources/reports/value").await;
    assert_eq!(
        (status, &body["value"]),
        (StatusCode::OK, &json!({"ok": true})),
        "{body}"
    );
    server.stop().await;
    let after: Vec<_> = std::fs::read_dir(&dir).expect("ls").collect();
    assert_eq!(
        before.len(),
        after.len(),
        "a file appeared in {}",
        dir.display()
    );
}

/// A graceful stop closes every connection the server had, the group
/// commit writer's own included: the file can be taken exclusively at
/// once (as a backup or `palisade repack` right after a stop needs).
#[tokio::test]
async fn a_stopped_server_leaves_its_sqlite_file_free() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("palisade.db");
    let server = TestServer::start(&format!("sqlite://{}", path.display())).await;
    let lease = server.acquire("reports", "worker-1", 60_000).await;
    assert_eq!(server.release(&lease).await.0, StatusCode::OK);
    server.stop().await;

    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.busy_timeout(Duration::ZERO).expect("no waiting");
    conn.execute_batch("PRAGMA locking_mode = EXCLUSIVE")
        .expect("exclusive locking");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = DELETE", [], |row| row.get(0))
        .expect("nobody else has the file open");
    assert_eq!(mode, "delete");
}

//! Durability across a `kill -9` of the real binary, and migration parity.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestDb};

pub struct Process {
    child: Child,
    pub base: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

async fn spawn_server(db_url: &str) -> Process {
    spawn_server_with(db_url, &[]).await
}

/// The real binary on a free port, with extra `serve` options.
pub async fn spawn_server_with(db_url: &str, extra_args: &[&str]) -> Process {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            db_url,
        ])
        .args(extra_args)
        .env("PALISADE_ADMIN_TOKEN", "restart-admin")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn palisade");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = reqwest::Client::new();
    loop {
        if let Ok(res) = client.get(format!("{base}/readyz")).send().await {
            if res.status() == StatusCode::OK {
                break;
            }
        }
        assert!(Instant::now() < deadline, "server did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Process { child, base }
}

impl Process {
    pub fn kill_9(mut self) {
        // Child::kill sends SIGKILL on Unix: no shutdown code runs.
        self.child.kill().expect("kill -9");
        let _ = self.child.wait();
    }
}

async fn tokens_and_writes_survive_kill_9(backend: Backend) {
    let db = TestDb::create(&backend).await;
    let client = reqwest::Client::new();
    let post = |base: &str, path: &str, body: serde_json::Value| {
        client.post(format!("{base}{path}")).json(&body).send()
    };

    let p = spawn_server(&db.url).await;
    let mut last_token = 0;
    for _ in 0..3 {
        let lease: serde_json::Value = post(
            &p.base,
            "/v1/resources/nightly/acquire",
            json!({"holder": "w", "ttl_ms": 60_000}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        last_token = lease["token"].as_i64().unwrap();
        let res = client
            .put(format!("{}/v1/resources/nightly/value", p.base))
            .json(&json!({"token": last_token, "value": {"run": last_token}}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let id = lease["lease_id"].as_str().unwrap();
        if last_token < 3 {
            post(&p.base, &format!("/v1/leases/{id}/release"), json!({}))
                .await
                .unwrap();
        }
    }
    p.kill_9();

    let p = spawn_server(&db.url).await;
    let res: serde_json::Value = client
        .get(format!("{}/v1/resources/nightly", p.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["last_token"], last_token, "{res}");
    assert_eq!(
        res["holder"]["token"], last_token,
        "the acknowledged live lease survived"
    );
    let value: serde_json::Value = client
        .get(format!("{}/v1/resources/nightly/value", p.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        value["value"],
        json!({"run": last_token}),
        "the acknowledged write survived"
    );
    let res = post(
        &p.base,
        "/v1/resources/nightly/acquire",
        json!({"holder": "other", "ttl_ms": 1000}),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let res = client
        .post(format!(
            "{}/v1/admin/resources/nightly/force-release",
            p.base
        ))
        .bearer_auth("restart-admin")
        .json(&json!({"reason": "restart test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    p.kill_9();

    let p = spawn_server(&db.url).await;
    let lease: serde_json::Value = post(
        &p.base,
        "/v1/resources/nightly/acquire",
        json!({"holder": "w", "ttl_ms": 1000}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        lease["token"].as_i64(),
        Some(last_token + 1),
        "never reused after crashes and a force-release"
    );
    p.kill_9();
    db.drop_db().await;
}

/// Both backends must have the same migration versions, so one schema
/// version means one thing.
#[test]
fn migration_versions_match_across_backends() {
    let versions = |dir: &str| {
        let mut v: Vec<String> =
            std::fs::read_dir(format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR")))
                .expect("migrations dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sql"))
                .map(|n| n.split('_').next().unwrap_or_default().to_owned())
                .collect();
        v.sort();
        v
    };
    let sqlite = versions("sqlite");
    assert!(!sqlite.is_empty());
    assert_eq!(sqlite, versions("postgres"));
}

async fn migrate_subcommand_creates_the_schema(backend: Backend) {
    let db = TestDb::create(&backend).await;
    for _ in 0..2 {
        // Twice: migrating an up-to-date database is a no-op.
        let status = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(["migrate", "--database-url", &db.url])
            .env("RUST_LOG", "warn")
            .status()
            .expect("run palisade migrate");
        assert!(status.success());
    }
    let tables: Vec<String> = match &backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                .fetch_all(&pool)
                .await
                .unwrap()
        }
        Backend::Postgres(_) => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            let t = sqlx::query_scalar(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            pool.close().await;
            t
        }
    };
    for table in ["events", "fenced_values", "leases", "resources"] {
        assert!(
            tables.iter().any(|t| t == table),
            "{table} missing from {tables:?}"
        );
    }
    db.drop_db().await;
}

crate::on_both_backends!(
    tokens_and_writes_survive_kill_9,
    migrate_subcommand_creates_the_schema
);

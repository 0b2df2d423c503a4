//! Test support: a real server on a random port over a fresh database of
//! either backend, and small helpers for JSON requests.

use std::time::Duration;

use palisade::app::{App, Config};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Which database a test runs on.
#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    Postgres(String),
}

impl Backend {
    /// PostgreSQL from `PALISADE_TEST_POSTGRES_URL`. Without it the
    /// PostgreSQL half of the suite is skipped locally (loudly), and fails
    /// in CI, where a missing database must never pass as green.
    pub fn postgres() -> Option<Backend> {
        match std::env::var("PALISADE_TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => Some(Backend::Postgres(url)),
            _ if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") => {
                panic!("PALISADE_TEST_POSTGRES_URL is not set in CI: the PostgreSQL suite must run")
            }
            _ => {
                eprintln!("SKIPPED: PostgreSQL test (set PALISADE_TEST_POSTGRES_URL to run it)");
                None
            }
        }
    }
}

/// A database of its own for one test; dropped by [`TestDb::drop_db`].
pub struct TestDb {
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Dir(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, name: String },
}

impl TestDb {
    pub async fn create(backend: &Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("palisade.db").display());
                TestDb {
                    url,
                    cleanup: Cleanup::Dir(dir),
                }
            }
            Backend::Postgres(admin_url) => {
                let name = format!("palisade_t_{}", hex_id());
                let mut conn = admin_conn(admin_url).await;
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                let (base, _) = admin_url.rsplit_once('/').expect("postgres URL has a path");
                let query = admin_url
                    .split_once('?')
                    .map(|(_, q)| format!("?{q}"))
                    .unwrap_or_default();
                TestDb {
                    url: format!("{base}/{name}{query}"),
                    cleanup: Cleanup::Postgres {
                        admin_url: admin_url.clone(),
                        name,
                    },
                }
            }
        }
    }

    pub async fn drop_db(self) {
        if let Cleanup::Postgres { admin_url, name } = &self.cleanup {
            let mut conn = admin_conn(admin_url).await;
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut conn)
                .await;
        }
    }
}

async fn admin_conn(url: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    sqlx::PgConnection::connect(url)
        .await
        .expect("connect to PostgreSQL")
}

pub fn hex_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 8];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// A running server.
pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    pub admin_token: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(db_url: &str) -> TestServer {
        Self::start_with(Config::for_tests(db_url)).await
    }

    pub async fn start_with(config: Config) -> TestServer {
        let app = App::build(config).await.expect("build app");
        let addr = app.local_addr().expect("bound address");
        let admin_token = app.admin_token().to_owned();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            app.run_until(async move {
                let _ = stopped.await;
            })
            .await
            .expect("server ran");
        });
        TestServer {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(70))
                .build()
                .expect("http client"),
            admin_token,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Graceful shutdown; waits for the server to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let res = req.send().await.expect("request sent");
        let status = res.status();
        let text = res.text().await.expect("body read");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .unwrap_or_else(|_| panic!("non-JSON body ({status}): {text}"))
        };
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.get(self.url(path))).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.client.post(self.url(path)).json(&body))
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.client.put(self.url(path)).json(&body)).await
    }

    /// Acquire that must succeed; returns the lease.
    pub async fn acquire(&self, resource: &str, holder: &str, ttl_ms: i64) -> Value {
        let (status, body) = self
            .post(
                &format!("/v1/resources/{}/acquire", enc(resource)),
                json!({"holder": holder, "ttl_ms": ttl_ms}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "acquire {resource}: {body}");
        body
    }

    pub async fn release(&self, lease: &Value) -> (StatusCode, Value) {
        self.post(
            &format!(
                "/v1/leases/{}/release",
                lease["lease_id"].as_str().unwrap_or("")
            ),
            json!({}),
        )
        .await
    }

    pub async fn renew(&self, lease: &Value, body: Value) -> (StatusCode, Value) {
        self.post(
            &format!(
                "/v1/leases/{}/renew",
                lease["lease_id"].as_str().unwrap_or("")
            ),
            body,
        )
        .await
    }

    pub async fn fence(&self, resource: &str, token: i64) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/resources/{}/fence", enc(resource)),
            json!({"token": token}),
        )
        .await
    }

    pub async fn write_value(
        &self,
        resource: &str,
        token: i64,
        value: Value,
    ) -> (StatusCode, Value) {
        self.put(
            &format!("/v1/resources/{}/value", enc(resource)),
            json!({"token": token, "value": value}),
        )
        .await
    }

    /// Every event (optionally of one resource), following `next_after`.
    pub async fn all_events(&self, resource: Option<&str>) -> Vec<Value> {
        let mut after = 0;
        let mut all = Vec::new();
        loop {
            let mut path = format!("/v1/events?limit=1000&after={after}");
            if let Some(r) = resource {
                path.push_str(&format!("&resource={}", enc(r)));
            }
            let (status, body) = self.get(&path).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let events = body["events"].as_array().cloned().unwrap_or_default();
            if events.is_empty() {
                return all;
            }
            after = body["next_after"].as_i64().expect("next_after");
            all.extend(events);
        }
    }
}

/// Percent-encodes one path segment.
pub fn enc(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A server on a fresh database of `backend`; stop it with [`Harness::finish`].
pub struct Harness {
    pub server: TestServer,
    pub db: TestDb,
}

impl Harness {
    pub async fn start(backend: &Backend) -> Harness {
        let db = TestDb::create(backend).await;
        let server = TestServer::start(&db.url).await;
        Harness { server, db }
    }

    /// A server with group commit off: one transaction per request.
    pub async fn start_without_group_commit(backend: &Backend) -> Harness {
        let db = TestDb::create(backend).await;
        let server = TestServer::start_with(Config {
            group_commit: None,
            ..Config::for_tests(&db.url)
        })
        .await;
        Harness { server, db }
    }

    pub async fn finish(self) {
        self.server.stop().await;
        self.db.drop_db().await;
    }
}

/// Runs each named case (an `async fn(Backend)` in the parent module) once
/// on SQLite and once on PostgreSQL.
#[macro_export]
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::support::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(palisade_no_test_postgres, ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it")]
                async fn $case() {
                    if let Some(backend) = $crate::support::Backend::postgres() {
                        super::$case(backend).await;
                    }
                }
            )*
        }
    };
}

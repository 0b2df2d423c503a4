//! End to end: a real Prometheus server (Debian's `prometheus` package) on a
//! random loopback port scrapes a real Palisade every second and evaluates
//! the shipped rules; stale writes driven through the API must turn the
//! stale-write alert pending or firing in Prometheus's own alerts API.
//!
//! Without the binary the test is skipped locally (loudly) and fails in CI.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::{TestDb, TestServer};

/// The whole test must finish within this, whatever Prometheus does.
const BUDGET: Duration = Duration::from_secs(90);

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

fn find_prometheus() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file())
}

/// Kills and reaps the Prometheus process however the test ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_loopback_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

fn write_config(dir: &Path, palisade_addr: &str) -> PathBuf {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/palisade-rules.yml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: palisade\n    static_configs:\n      - targets: ['{palisade_addr}']\n",
        rules = rules.display(),
    );
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config).expect("write prometheus.yml");
    path
}

/// GETs a Prometheus API path and returns its `data`.
async fn api(client: &reqwest::Client, base: &str, path: &str) -> Option<Value> {
    let res = client.get(format!("{base}{path}")).send().await.ok()?;
    if res.status() != StatusCode::OK {
        return None;
    }
    let body: Value = res.json().await.ok()?;
    (body["status"] == "success").then(|| body["data"].clone())
}

/// Polls `probe` every 250 ms until it yields a value or the deadline passes.
async fn poll<T, F, Fut>(
    what: &str,
    deadline: Instant,
    guard: &mut ChildGuard,
    log: &Path,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if let Ok(Some(status)) = guard.0.try_wait() {
            panic!(
                "prometheus exited ({status}) while waiting for {what}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; prometheus log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_the_stale_write_alert() {
    let Some(binary) = find_prometheus() else {
        assert!(
            !in_ci(),
            "the prometheus binary is missing in CI (.ci/steps/prometheus.sh installs it)"
        );
        eprintln!("SKIPPED: end-to-end Prometheus test (install Debian's prometheus package)");
        return;
    };
    let deadline = Instant::now() + BUDGET;
    let db = TestDb::create(&crate::support::Backend::Sqlite).await;
    let server = TestServer::start(&db.url).await;
    let palisade_addr = server.base.trim_start_matches("http://").to_owned();

    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), &palisade_addr);
    let log = dir.path().join("prometheus.log");
    let port = free_loopback_port();
    let child = Command::new(&binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start prometheus");
    let mut guard = ChildGuard(child);
    let prom = format!("http://127.0.0.1:{port}");
    let prom = prom.as_str();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let client = &client;

    // Rules loaded and the target scraped at least once before any stale
    // write, so the counter's 0 is on record and increase() sees the jump.
    poll(
        "the rules to load",
        deadline,
        &mut guard,
        &log,
        move || async move {
            let data = api(client, prom, "/api/v1/rules").await?;
            let groups = data["groups"].as_array()?;
            groups
                .iter()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .any(|r| r["name"] == "PalisadeStaleWriteSpike")
                .then_some(())
        },
    )
    .await;
    poll(
        "a first scrape with stale writes at 0",
        deadline,
        &mut guard,
        &log,
        move || async move {
            let data = api(
                client,
                prom,
                "/api/v1/query?query=palisade_stale_writes_total",
            )
            .await?;
            let result = data["result"].as_array()?;
            (result.len() == 1 && result[0]["value"][1] == "0").then_some(())
        },
    )
    .await;

    // A zombie: holder a loses the lock to b, then keeps writing with token 1.
    let first = server.acquire("e2e/report", "a", 30_000).await;
    let (status, _) = server.release(&first).await;
    assert_eq!(status, StatusCode::OK);
    let second = server.acquire("e2e/report", "b", 30_000).await;
    let (status, _) = server
        .fence("e2e/report", second["token"].as_i64().unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    const STALE: usize = 12;
    for i in 0..STALE {
        let (status, body) = if i % 2 == 0 {
            server.fence("e2e/report", 1).await
        } else {
            server
                .write_value("e2e/report", 1, serde_json::json!({"i": i}))
                .await
        };
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(body["error"]["code"], "stale_token");
    }

    let alert = poll(
        "the stale-write alert",
        deadline,
        &mut guard,
        &log,
        move || async move {
            let data = api(client, prom, "/api/v1/alerts").await?;
            data["alerts"]
                .as_array()?
                .iter()
                .find(|a| {
                    a["labels"]["alertname"] == "PalisadeStaleWriteSpike"
                        && (a["state"] == "pending" || a["state"] == "firing")
                })
                .cloned()
        },
    )
    .await;
    assert_eq!(alert["labels"]["severity"], "critical");
    assert_eq!(alert["labels"]["job"], "palisade");
    let description = alert["annotations"]["description"].as_str().unwrap_or("");
    assert!(
        description.contains("/ui/events?kind=write_rejected"),
        "{description}"
    );
    // Prometheus scraped exactly the stale writes we drove.
    let data = api(
        client,
        prom,
        "/api/v1/query?query=palisade_stale_writes_total",
    )
    .await
    .expect("query");
    assert_eq!(data["result"][0]["value"][1], STALE.to_string());

    drop(guard);
    server.stop().await;
    db.drop_db().await;
}

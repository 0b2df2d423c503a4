//! `palisade repack` (SQLite only): a stopped database is rewritten with
//! another page size and keeps every row; a database in use is refused and
//! left as it was.

use std::path::Path;
use std::process::{Command, Output};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::TestServer;

fn repack(url: &str, page_size: u32) -> Output {
    Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["repack", "--database-url", url, "--page-size"])
        .arg(page_size.to_string())
        .env("RUST_LOG", "warn")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run palisade repack")
}

/// The file's page size and journal mode.
fn file_layout(path: &Path) -> (u32, String) {
    let conn = rusqlite::Connection::open(path).expect("open");
    let size = conn
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .expect("page size");
    let mode = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("journal mode");
    (size, mode)
}

/// What the API says about the resources: their events and values.
async fn everything(server: &TestServer, resources: &[&str]) -> (Vec<Value>, Vec<Value>) {
    let events = server.all_events(None).await;
    let mut values = Vec::new();
    for r in resources {
        let (status, body) = server.get(&format!("/v1/resources/{r}/value")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        values.push(body);
    }
    (events, values)
}

#[tokio::test]
async fn repack_rewrites_a_stopped_database_and_keeps_every_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("palisade.db");
    let url = format!("sqlite://{}", path.display());
    let resources = ["invoices", "reports", "stock"];

    let server = TestServer::start(&url).await;
    for (i, r) in resources.iter().enumerate() {
        let lease = server.acquire(r, "worker-1", 60_000).await;
        let token = lease["token"].as_i64().expect("token");
        let (status, body) = server.write_value(r, token, json!({"n": i})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if i == 0 {
            assert_eq!(server.release(&lease).await.0, StatusCode::OK);
        }
    }
    let before = everything(&server, &resources).await;
    assert!(before.0.len() >= 7, "{:?}", before.0);
    server.stop().await;
    assert_eq!(file_layout(&path).0, 1024, "new databases get 1 KiB pages");

    let out = repack(&url, 4096);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("1024-byte pages -> 4096-byte pages"),
        "{stdout}"
    );
    assert_eq!(file_layout(&path), (4096, "wal".to_owned()));

    // Every row is back, and tokens go on from where they were.
    let server = TestServer::start(&url).await;
    assert_eq!(everything(&server, &resources).await, before);
    let next = server.acquire("invoices", "worker-2", 60_000).await;
    assert_eq!(next["token"], 2, "{next}");
    server.stop().await;

    // Back to 1 KiB pages, then once more: the second run changes nothing.
    assert!(repack(&url, 1024).status.success());
    assert_eq!(file_layout(&path), (1024, "wal".to_owned()));
    let again = repack(&url, 1024);
    assert!(again.status.success(), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already has 1024-byte pages"),
        "{again:?}"
    );
}

#[tokio::test]
async fn repack_refuses_a_database_in_use_and_leaves_it_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("palisade.db");
    let url = format!("sqlite://{}", path.display());
    let server = TestServer::start(&url).await;
    let lease = server.acquire("reports", "worker-1", 60_000).await;

    let out = repack(&url, 4096);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use"), "{stderr}");
    assert_eq!(file_layout(&path), (1024, "wal".to_owned()));

    // The server never noticed.
    assert_eq!(server.release(&lease).await.0, StatusCode::OK);
    let next = server.acquire("reports", "worker-2", 60_000).await;
    assert_eq!(next["token"], 2, "{next}");
    server.stop().await;
}

#[test]
fn repack_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = format!("sqlite://{}", dir.path().join("missing.db").display());
    for (url, page_size, says) in [
        (missing.as_str(), 1024, "no database file"),
        ("sqlite://ignored.db", 1000, "not one SQLite supports"),
        ("postgres://postgres@127.0.0.1/test", 1024, "PostgreSQL"),
    ] {
        let out = repack(url, page_size);
        assert!(!out.status.success(), "{url}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{url}: {stderr}");
    }
    assert!(!dir.path().join("missing.db").exists());
}

//! Times every web UI page over a large database: 10,000 resources, 250,000
//! leases and 1,000,000 events spread over the last 24 hours (a quarter of
//! the resources held right now, one lease in seven expired with a stale
//! write rejected after it).
//!
//!     cargo run --release --example ui_bench                       # SQLite
//!     cargo run --release --example ui_bench -- postgres://…/bench # PostgreSQL (an empty database)
//!
//! Prints a Markdown table of the median and worst of 15 requests per page
//! (after one warm-up). The figures are recorded in docs/ui.md; nothing
//! asserts speed.

use std::time::{Duration, Instant};

use chrono::Utc;
use palisade::app::{App, Config};
use sqlx::Connection;

const RESOURCES: i64 = 10_000;
const LEASES_PER_RESOURCE: i64 = 25;
const RUNS: usize = 15;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let arg = std::env::args().nth(1);
    let dir = tempfile::tempdir()?;
    let url = arg.unwrap_or_else(|| format!("sqlite://{}", dir.path().join("bench.db").display()));
    let mut config = Config::for_tests(&url);
    // The sweeper would expire the seeded leases while we measure.
    config.sweep_interval = Duration::from_secs(3600);
    let app = App::build(config).await?;
    let started = Instant::now();
    seed(&url).await?;
    eprintln!("seeded in {:.1} s", started.elapsed().as_secs_f64());
    let base = format!("http://{}", app.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let pages: &[(&str, &str, bool)] = &[
        ("Overview", "/", false),
        (
            "Overview, live poll (nothing new)",
            "/?cursor=1000000",
            true,
        ),
        ("Resources", "/ui/resources", false),
        ("Resources, held only", "/ui/resources?state=held", false),
        (
            "Resources, prefix filter",
            "/ui/resources?prefix=res%2F0424",
            false,
        ),
        (
            "Resources, page 150 by name",
            "/ui/resources?sort=name&page=150",
            false,
        ),
        (
            "Timeline, 5 min",
            "/ui/resources/res%2F04242?window=5m",
            false,
        ),
        (
            "Timeline, 1 h",
            "/ui/resources/res%2F04242?window=1h",
            false,
        ),
        (
            "Timeline, 24 h",
            "/ui/resources/res%2F04242?window=24h",
            false,
        ),
        (
            "Timeline, live poll (htmx)",
            "/ui/resources/res%2F04242?window=1h",
            true,
        ),
        ("Lease", "/ui/resources/res%2F04242/leases/7", false),
        ("Events", "/ui/events", false),
        ("Events, stale writes only", "/ui/events?kind=stale", false),
        ("Events, by holder", "/ui/events?holder=worker-7", false),
        (
            "Events, resource prefix",
            "/ui/events?prefix=res%2F0424",
            false,
        ),
        ("Events, paged back", "/ui/events?before=500000", false),
    ];
    println!("| Page | Path | median | worst |");
    println!("| --- | --- | ---: | ---: |");
    for (label, path, htmx) in pages {
        let mut times = Vec::with_capacity(RUNS);
        for run in 0..=RUNS {
            let mut req = client.get(format!("{base}{path}"));
            if *htmx {
                req = req.header("HX-Request", "true");
            }
            let t = Instant::now();
            let res = req.send().await?;
            let status = res.status();
            res.bytes().await?;
            anyhow::ensure!(status.is_success(), "{path}: {status}");
            if run > 0 {
                times.push(t.elapsed());
            }
        }
        times.sort();
        println!(
            "| {label} | `{path}` | {:.1} ms | {:.1} ms |",
            times[RUNS / 2].as_secs_f64() * 1000.0,
            times[RUNS - 1].as_secs_f64() * 1000.0
        );
    }
    let _ = stop.send(());
    server.await??;
    Ok(())
}

/// Bulk-loads the data set with one generated INSERT per table.
async fn seed(url: &str) -> anyhow::Result<()> {
    let now_ms = Utc::now().timestamp_millis();
    let day_ms: i64 = 86_400_000;
    let slot_ms = day_ms / LEASES_PER_RESOURCE;
    let leases = RESOURCES * LEASES_PER_RESOURCE;
    if url.starts_with("postgres") {
        let mut db = sqlx::PgConnection::connect(url).await?;
        let now = format!("to_timestamp({now_ms} / 1000.0)");
        for sql in [
            format!(
                "INSERT INTO resources (name, last_token, accepted_token, created_at, last_activity_at) \
                 SELECT 'res/' || lpad(r::text, 5, '0'), {LEASES_PER_RESOURCE}, {LEASES_PER_RESOURCE}, \
                 {now} - interval '1 day', {now} - (r % 3600) * interval '1 second' \
                 FROM generate_series(0, {RESOURCES} - 1) AS r"
            ),
            format!(
                "INSERT INTO leases (lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at) \
                 SELECT lpad(to_hex(i), 32, '0'), 'res/' || lpad((i % {RESOURCES})::text, 5, '0'), \
                   i / {RESOURCES} + 1, 'worker-' || (i % 13), \
                   CASE WHEN i / {RESOURCES} = {LEASES_PER_RESOURCE} - 1 AND i % 4 = 0 THEN 'active' \
                        WHEN i % 7 = 0 THEN 'expired' ELSE 'released' END, \
                   30000, a, a + interval '30 seconds' + CASE WHEN i / {RESOURCES} = {LEASES_PER_RESOURCE} - 1 AND i % 4 = 0 THEN interval '1 day' ELSE interval '0' END, \
                   CASE WHEN i / {RESOURCES} = {LEASES_PER_RESOURCE} - 1 AND i % 4 = 0 THEN NULL ELSE a + interval '30 seconds' END \
                 FROM generate_series(0, {leases} - 1) AS i, \
                 LATERAL (SELECT {now} - interval '1 day' + (i / {RESOURCES}) * {slot_ms} * interval '1 millisecond' + (i % {RESOURCES}) * interval '5 milliseconds' AS a) t"
            ),
                            "INSERT INTO events (at, kind, resource, token, holder, detail) \
                 SELECT e.at, e.kind, l.resource, l.token, l.holder, e.detail FROM leases l, LATERAL (VALUES \
                   (l.acquired_at, 'acquired', '{\"ttl_ms\":30000}'::jsonb), \
                   (l.acquired_at + interval '10 seconds', 'renewed', '{\"ttl_ms\":30000,\"margin_ms\":20000}'::jsonb), \
                   (l.acquired_at + interval '12 seconds', CASE WHEN l.state = 'expired' THEN 'write_rejected' ELSE 'write_accepted' END, \
                     CASE WHEN l.state = 'expired' THEN jsonb_build_object('via','store','reason','stale_token','rejected_token',l.token,'accepted_token',l.token+1,'fenced_by',jsonb_build_object('token',l.token+1,'holder','worker-1'),'lateness_ms',1200) \
                     ELSE '{\"via\":\"store\",\"version\":1}'::jsonb END), \
                   (l.acquired_at + interval '30 seconds', CASE l.state WHEN 'expired' THEN 'expired' WHEN 'active' THEN 'renewed' ELSE 'released' END, '{\"held_ms\":30000}'::jsonb) \
                 ) AS e(at, kind, detail) ORDER BY e.at"
                .to_owned(),
            // What autovacuum would have done by now (index-only scans).
            "VACUUM ANALYZE".to_owned(),
        ] {
            sqlx::query(&sql).execute(&mut db).await?;
        }
    } else {
        let mut db = sqlx::SqliteConnection::connect(url).await?;
        for sql in [
            format!(
                "WITH RECURSIVE s(r) AS (SELECT 0 UNION ALL SELECT r + 1 FROM s WHERE r < {RESOURCES} - 1) \
                 INSERT INTO resources (name, last_token, accepted_token, created_at, last_activity_at) \
                 SELECT printf('res/%05d', r), {LEASES_PER_RESOURCE}, {LEASES_PER_RESOURCE}, {now_ms} - {day_ms}, {now_ms} - (r % 3600) * 1000 FROM s"
            ),
            format!(
                "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {leases} - 1), \
                 t AS (SELECT i, {now_ms} - {day_ms} + (i / {RESOURCES}) * {slot_ms} + (i % {RESOURCES}) * 5 AS a, \
                   (i / {RESOURCES} = {LEASES_PER_RESOURCE} - 1 AND i % 4 = 0) AS live FROM s) \
                 INSERT INTO leases (lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at) \
                 SELECT printf('%032x', i), printf('res/%05d', i % {RESOURCES}), i / {RESOURCES} + 1, 'worker-' || (i % 13), \
                   CASE WHEN live THEN 'active' WHEN i % 7 = 0 THEN 'expired' ELSE 'released' END, \
                   30000, a, a + 30000 + CASE WHEN live THEN {day_ms} ELSE 0 END, CASE WHEN live THEN NULL ELSE a + 30000 END FROM t"
            ),
            "WITH k(n) AS (VALUES (0), (1), (2), (3)) \
             INSERT INTO events (at, kind, resource, token, holder, detail) \
             SELECT l.acquired_at + CASE n WHEN 0 THEN 0 WHEN 1 THEN 10000 WHEN 2 THEN 12000 ELSE 30000 END, \
               CASE n WHEN 0 THEN 'acquired' WHEN 1 THEN 'renewed' \
                 WHEN 2 THEN CASE WHEN l.state = 'expired' THEN 'write_rejected' ELSE 'write_accepted' END \
                 ELSE CASE l.state WHEN 'expired' THEN 'expired' WHEN 'active' THEN 'renewed' ELSE 'released' END END, \
               l.resource, l.token, l.holder, \
               CASE n WHEN 0 THEN '{\"ttl_ms\":30000}' WHEN 1 THEN '{\"ttl_ms\":30000,\"margin_ms\":20000}' \
                 WHEN 2 THEN CASE WHEN l.state = 'expired' THEN json_object('via','store','reason','stale_token','rejected_token',l.token,'accepted_token',l.token+1,'fenced_by',json_object('token',l.token+1,'holder','worker-1'),'lateness_ms',1200) ELSE '{\"via\":\"store\",\"version\":1}' END \
                 ELSE '{\"held_ms\":30000}' END \
             FROM leases l, k ORDER BY 1"
                .to_owned(),
            "ANALYZE".to_owned(),
        ] {
            sqlx::query(&sql).execute(&mut db).await?;
        }
    }
    Ok(())
}

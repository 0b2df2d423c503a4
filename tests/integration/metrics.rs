//! `GET /metrics`: every lock outcome is counted where it happens, each
//! expiry exactly once (whichever operation records it), the cluster-wide
//! gauges come from the database, and no label carries a secret.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use palisade::app::Config;
use palisade::metrics::{MetricsConfig, ResourceGroupConfig};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Backend, TestDb, TestServer};

/// One sample of the text exposition: name, labels, value.
#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the text format (enough of it for our own output: no escaped
/// quotes or commas inside label values).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("sample has a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect("closing brace");
                    let labels = inner
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').expect("label pair");
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), BTreeMap::new()),
            };
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect("numeric value"),
            };
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
}

impl Scrape {
    pub async fn of(s: &TestServer) -> Scrape {
        let res = s
            .client
            .get(s.url("/metrics"))
            .send()
            .await
            .expect("scrape");
        assert_eq!(res.status(), StatusCode::OK);
        let content_type = res.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        let text = res.text().await.unwrap();
        let samples = parse_exposition(&text);
        Scrape { text, samples }
    }

    /// The value of the series `name` with exactly `labels`; 0 when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map_or(0.0, |s| s.value)
    }
}

/// How many expiry sweeps `s` has completed: proof that its sweeper runs.
pub async fn completed_sweeps(s: &TestServer) -> f64 {
    Scrape::of(s)
        .await
        .value("palisade_expiry_sweeps_total", &[("outcome", "completed")])
}

async fn start(backend: &Backend, config: impl FnOnce(&mut Config)) -> (TestServer, TestDb) {
    let db = TestDb::create(backend).await;
    let mut cfg = Config::for_tests(&db.url);
    config(&mut cfg);
    (TestServer::start_with(cfg).await, db)
}

/// Polls the scrape until `check` holds (the gauges refresh in the
/// background), for at most 10 s.
pub async fn eventually(s: &TestServer, what: &str, check: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = Scrape::of(s).await;
        if check(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", scrape.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn lock_outcomes_are_counted(backend: Backend) {
    let (s, db) = start(&backend, |_| {}).await;
    let first = s.acquire("jobs/a", "alice", 30_000).await;
    // held
    let (status, _) = s
        .post(
            "/v1/resources/jobs%2Fa/acquire",
            json!({"holder": "bob", "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // invalid: a bad TTL, malformed JSON, a bad resource name
    let (status, _) = s
        .post(
            "/v1/resources/jobs%2Fa/acquire",
            json!({"holder": "bob", "ttl_ms": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let res = s
        .client
        .post(s.url("/v1/resources/x/acquire"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let (status, _) = s
        .post(
            "/v1/resources/bad%01name/acquire",
            json!({"holder": "bob", "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // renewed, then released; a renewal after release is not_active
    let (status, _) = s.renew(&first, json!({"ttl_ms": 30_000})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = s.fence("jobs/a", 1).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = s.release(&first).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = s.release(&first).await;
    assert_eq!(status, StatusCode::OK, "idempotent release is not counted");
    let (status, _) = s.renew(&first, json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    // stale via both doors, unknown, accepted via the store
    let second = s.acquire("jobs/a", "bob", 30_000).await;
    let (status, _) = s.write_value("jobs/a", 2, json!({"v": 1})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = s.fence("jobs/a", 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = s.write_value("jobs/a", 1, json!({"v": 0})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = s.fence("jobs/a", 99).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // force-release
    let (status, _) = s
        .send(
            s.client
                .post(s.url("/v1/admin/resources/jobs%2Fa/force-release"))
                .bearer_auth(&s.admin_token)
                .json(&json!({"reason": "test"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let m = Scrape::of(&s).await;
    let acquires = "palisade_acquire_requests_total";
    assert_eq!(m.value(acquires, &[("outcome", "granted")]), 2.0);
    assert_eq!(m.value(acquires, &[("outcome", "held")]), 1.0);
    assert_eq!(m.value(acquires, &[("outcome", "invalid")]), 3.0);
    let renewals = "palisade_lease_renewals_total";
    assert_eq!(m.value(renewals, &[("outcome", "renewed")]), 1.0);
    assert_eq!(m.value(renewals, &[("outcome", "not_active")]), 1.0);
    assert_eq!(m.value("palisade_lease_releases_total", &[]), 1.0);
    assert_eq!(m.value("palisade_lease_force_releases_total", &[]), 1.0);
    assert_eq!(m.value("palisade_lease_expirations_total", &[]), 0.0);
    let writes = "palisade_fenced_writes_total";
    let w = |outcome, via| m.value(writes, &[("outcome", outcome), ("via", via)]);
    assert_eq!(w("accepted", "fence"), 1.0);
    assert_eq!(w("accepted", "store"), 1.0);
    assert_eq!(w("stale", "fence"), 1.0);
    assert_eq!(w("stale", "store"), 1.0);
    assert_eq!(w("unknown", "fence"), 1.0);
    assert_eq!(w("unknown", "store"), 0.0);
    assert_eq!(m.value("palisade_stale_writes_total", &[]), 2.0);
    // Two stale writes of a released lease: both late, both observed.
    assert_eq!(
        m.value("palisade_stale_write_lateness_seconds_count", &[]),
        2.0
    );
    assert_eq!(m.value("palisade_renewal_margin_seconds_count", &[]), 1.0);
    let margin = m.value("palisade_renewal_margin_seconds_sum", &[]);
    assert!(
        (25.0..=30.0).contains(&margin),
        "renewed with ~30 s left: {margin}"
    );
    // Released and force-released leases were held.
    assert_eq!(
        m.value("palisade_lease_hold_duration_seconds_count", &[]),
        2.0
    );
    assert_eq!(m.value("palisade_acquire_wait_seconds_count", &[]), 2.0);
    assert_eq!(
        m.value(
            "palisade_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );

    // Request latency by route template; the lease id is nowhere.
    let renew_route = "palisade_http_request_duration_seconds_count";
    let by_route = |route, method, class| {
        m.value(
            renew_route,
            &[
                ("method", method),
                ("route", route),
                ("status_class", class),
            ],
        )
    };
    assert_eq!(by_route("/v1/leases/{lease_id}/renew", "POST", "2xx"), 1.0);
    assert_eq!(by_route("/v1/leases/{lease_id}/renew", "POST", "4xx"), 1.0);
    assert_eq!(
        by_route("/v1/resources/{name}/acquire", "POST", "4xx"),
        4.0,
        "held + 3 invalid"
    );
    for lease in [&first, &second] {
        let id = lease["lease_id"].as_str().unwrap();
        assert!(!m.text.contains(id), "a lease id leaked into /metrics");
    }
    assert!(!m.text.contains("alice") && !m.text.contains("jobs/a"));
    s.stop().await;
    db.drop_db().await;
}

async fn unmatched_paths_and_odd_methods_have_bounded_labels(backend: Backend) {
    let (s, db) = start(&backend, |_| {}).await;
    for i in 0..3 {
        let (status, _) = s.get(&format!("/no/such/{i}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let res = s
        .client
        .request(
            reqwest::Method::from_bytes(b"BREW").unwrap(),
            s.url("/healthz"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    let m = Scrape::of(&s).await;
    let count = |route, method, class| {
        m.value(
            "palisade_http_request_duration_seconds_count",
            &[
                ("method", method),
                ("route", route),
                ("status_class", class),
            ],
        )
    };
    assert_eq!(count("<unmatched>", "GET", "4xx"), 3.0);
    assert_eq!(count("/healthz", "other", "4xx"), 1.0);
    assert!(!m.text.contains("/no/such") && !m.text.contains("BREW"));
    s.stop().await;
    db.drop_db().await;
}

/// With the sweeper effectively off, each kind of operation that finds a
/// lease past its deadline records (and counts) the expiry itself.
async fn every_operation_counts_the_expiry_it_records(backend: Backend) {
    let (s, db) = start(&backend, |c| c.sweep_interval = Duration::from_secs(3600)).await;
    // The sweeper's first tick is at start; let it pass before leases exist.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let leases: Vec<_> = acquire_short_leases(&s, &["r1", "r2", "r3", "r4", "r5"]).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let expected = |n: f64| move |m: &Scrape| m.value("palisade_lease_expirations_total", &[]) == n;

    let (status, _) = s.fence("r1", 1).await;
    assert_eq!(status, StatusCode::CONFLICT, "fence on an expired lease");
    assert!(expected(1.0)(&Scrape::of(&s).await));
    let (status, _) = s.renew(&leases[1], json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    assert!(expected(2.0)(&Scrape::of(&s).await));
    let (status, _) = s.release(&leases[2]).await;
    assert_eq!(status, StatusCode::GONE);
    assert!(expected(3.0)(&Scrape::of(&s).await));
    let (status, _) = s
        .send(
            s.client
                .post(s.url("/v1/admin/resources/r4/force-release"))
                .bearer_auth(&s.admin_token)
                .json(&json!({"reason": "test"})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "nothing live to force-release"
    );
    assert!(expected(4.0)(&Scrape::of(&s).await));
    s.acquire("r5", "next", 30_000).await;
    let m = Scrape::of(&s).await;
    assert!(expected(5.0)(&m), "{}", m.text);
    // Noticing an expiry again records nothing new.
    let (status, _) = s.renew(&leases[1], json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    let m = Scrape::of(&s).await;
    assert!(expected(5.0)(&m));
    // Each expired lease was held for its whole 150 ms TTL.
    assert_eq!(
        m.value("palisade_lease_hold_duration_seconds_count", &[]),
        5.0
    );
    let held = m.value("palisade_lease_hold_duration_seconds_sum", &[]);
    assert!((held - 0.75).abs() < 0.01, "5 × 150 ms, got {held}");
    let events = s.all_events(None).await;
    let recorded = events.iter().filter(|e| e["kind"] == "expired").count();
    assert_eq!(recorded, 5);
    s.stop().await;
    db.drop_db().await;
}

/// A 150 ms lease on each resource.
async fn acquire_short_leases(s: &TestServer, names: &[&str]) -> Vec<serde_json::Value> {
    let mut leases = Vec::new();
    for name in names {
        leases.push(s.acquire(name, "h", 150).await);
    }
    leases
}

async fn the_sweeper_counts_expiries(backend: Backend) {
    let (s, db) = start(&backend, |_| {}).await;
    for i in 0..3 {
        s.acquire(&format!("sweep/{i}"), "h", 100).await;
    }
    let m = eventually(&s, "three expiries swept", |m| {
        m.value("palisade_lease_expirations_total", &[]) == 3.0
    })
    .await;
    let completed = m.value("palisade_expiry_sweeps_total", &[("outcome", "completed")]);
    assert!(completed >= 1.0, "{}", m.text);
    assert_eq!(
        m.value("palisade_expiry_sweeps_total", &[("outcome", "failed")]),
        0.0
    );
    // Every completed sweep is timed (scraped once, so the two agree).
    assert_eq!(
        m.value("palisade_expiry_sweep_duration_seconds_count", &[]),
        completed
    );
    s.stop().await;
    db.drop_db().await;
}

async fn active_leases_and_database_up_come_from_the_database(backend: Backend) {
    let (s, db) = start(&backend, |_| {}).await;
    eventually(&s, "database up", |m| {
        m.value("palisade_database_up", &[]) == 1.0
    })
    .await;
    let a = s.acquire("g/1", "h", 30_000).await;
    s.acquire("g/2", "h", 30_000).await;
    eventually(&s, "two active leases", |m| {
        m.value("palisade_active_leases", &[]) == 2.0
    })
    .await;
    s.release(&a).await;
    eventually(&s, "one active lease", |m| {
        m.value("palisade_active_leases", &[]) == 1.0
    })
    .await;
    s.stop().await;
    db.drop_db().await;
}

async fn resource_groups_label_stale_writes_and_expiries(backend: Backend) {
    let (s, db) = start(&backend, |c| {
        c.metrics = MetricsConfig {
            resource_groups: Some(ResourceGroupConfig {
                separator: "/".into(),
                max_groups: 2,
            }),
        }
    })
    .await;
    for name in ["billing/a", "reports/b", "search/c", "billing/d"] {
        let old = s.acquire(name, "h", 100).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        s.acquire(name, "h2", 30_000).await;
        let (status, _) = s.fence(name, old["token"].as_i64().unwrap()).await;
        assert_eq!(status, StatusCode::CONFLICT);
    }
    let m = Scrape::of(&s).await;
    let stale = |g| m.value("palisade_stale_writes_total", &[("resource_group", g)]);
    assert_eq!(stale("billing"), 2.0);
    assert_eq!(stale("reports"), 1.0);
    assert_eq!(stale("other"), 1.0, "the third group is over the cap");
    let expired = |g| m.value("palisade_lease_expirations_total", &[("resource_group", g)]);
    assert_eq!(
        expired("billing") + expired("reports") + expired("other"),
        4.0
    );
    assert!(!m.text.contains("search"));
    // The unlabelled series does not exist in this mode.
    assert!(!m.text.contains("palisade_stale_writes_total 0"));
    s.stop().await;
    db.drop_db().await;
}

crate::on_both_backends!(
    lock_outcomes_are_counted,
    unmatched_paths_and_odd_methods_have_bounded_labels,
    every_operation_counts_the_expiry_it_records,
    the_sweeper_counts_expiries,
    active_leases_and_database_up_come_from_the_database,
    resource_groups_label_stale_writes_and_expiries,
);

/// Two instances sweeping one PostgreSQL: each expiry is counted by exactly
/// one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    palisade_no_test_postgres,
    ignore = "PostgreSQL: set PALISADE_TEST_POSTGRES_URL to run it"
)]
async fn two_instances_count_each_expiry_once() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let db = TestDb::create(&backend).await;
    let fast = |url: &str| {
        let mut c = Config::for_tests(url);
        c.sweep_interval = Duration::from_millis(20);
        c
    };
    let a = TestServer::start_with(fast(&db.url)).await;
    let b = TestServer::start_with(fast(&db.url)).await;
    const LEASES: usize = 30;
    for i in 0..LEASES {
        let server = if i % 2 == 0 { &a } else { &b };
        server.acquire(&format!("x/{i}"), "h", 100).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let total = Scrape::of(&a)
            .await
            .value("palisade_lease_expirations_total", &[])
            + Scrape::of(&b)
                .await
                .value("palisade_lease_expirations_total", &[]);
        if total == LEASES as f64 {
            break;
        }
        assert!(
            total < LEASES as f64,
            "an expiry was counted twice: {total}"
        );
        assert!(Instant::now() < deadline, "only {total} expiries counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let expired = a
        .all_events(None)
        .await
        .iter()
        .filter(|e| e["kind"] == "expired")
        .count();
    assert_eq!(expired, LEASES);
    // Nothing more arrives later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let total = Scrape::of(&a)
        .await
        .value("palisade_lease_expirations_total", &[])
        + Scrape::of(&b)
            .await
            .value("palisade_lease_expirations_total", &[]);
    assert_eq!(total, LEASES as f64);
    for s in [&a, &b] {
        assert!(completed_sweeps(s).await > 0.0, "an instance never swept");
    }
    a.stop().await;
    b.stop().await;
    db.drop_db().await;
}

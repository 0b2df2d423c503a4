//! Prometheus metrics: one owned [`Registry`] per server (no globals, so
//! parallel tests never share counters), the typed recording methods the
//! service and the HTTP layer call, and the text exposition for `/metrics`.
//!
//! Names, labels and buckets are a contract documented in `docs/metrics.md`.
//! No label ever carries a resource name, holder or lease id; the optional
//! `resource_group` label is bounded by [`ResourceGroups`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio_util::sync::CancellationToken;

use crate::domain::{Lease, ResourceName};
use crate::store::{FenceOutcome, WriteVia};

/// Request latency: from a fast fence check (~1 ms) to an acquire that waited
/// the maximum 60 s.
const HTTP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// How long leases are held: from a 100 ms minimum TTL to hours-long batch jobs.
const HOLD_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
    3600.0, 14400.0,
];
/// Time left at renewal: the low end (under a second) is where holders are
/// about to lose their leases, so it is finely divided.
const MARGIN_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
];
/// How late a stale write arrived after its lease ended.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Acquire waits are capped at 60 s by the API.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// The optional `resource_group` label on the stale-write and expiry
/// counters: a resource's group is its name up to the first `separator`
/// (the whole name when there is none). Only the first `max_groups` groups
/// this instance sees get their own label value; the rest count as `other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceGroupConfig {
    pub separator: String,
    pub max_groups: usize,
}

/// The label value for overflow groups.
pub const OTHER_GROUP: &str = "other";

struct ResourceGroups {
    config: ResourceGroupConfig,
    seen: Mutex<HashSet<String>>,
}

impl ResourceGroups {
    fn group_of(&self, name: &ResourceName) -> String {
        let name = name.as_str();
        let prefix = if self.config.separator.is_empty() {
            name
        } else {
            name.split_once(self.config.separator.as_str())
                .map_or(name, |(prefix, _)| prefix)
        };
        // A poisoned lock only means another thread panicked mid-insert;
        // the set is still a valid set.
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(prefix) {
            return prefix.to_owned();
        }
        if seen.len() < self.config.max_groups {
            seen.insert(prefix.to_owned());
            return prefix.to_owned();
        }
        OTHER_GROUP.to_owned()
    }
}

/// Metric settings from the server configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `None`: no `resource_group` label (the default).
    pub resource_groups: Option<ResourceGroupConfig>,
}

/// Every metric of one server. Cheap to clone (one shared inner value).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    groups: Option<ResourceGroups>,
    acquire_requests: IntCounterVec,
    renewals: IntCounterVec,
    releases: IntCounter,
    expirations: IntCounterVec,
    force_releases: IntCounter,
    fenced_writes: IntCounterVec,
    stale_writes: IntCounterVec,
    events_pruned: IntCounter,
    expiry_sweeps: IntCounterVec,
    expiry_sweep_duration: Histogram,
    active_leases: IntGauge,
    database_up: IntGauge,
    http_request_duration: HistogramVec,
    lease_hold_duration: Histogram,
    renewal_margin: Histogram,
    stale_write_lateness: Histogram,
    acquire_wait: Histogram,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: T,
) -> prometheus::Result<T> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> prometheus::Result<Histogram> {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, Histogram::with_opts(opts)?)
}

impl Metrics {
    pub fn new(config: &MetricsConfig) -> prometheus::Result<Self> {
        let r = Registry::new();
        let group_labels: &[&str] = if config.resource_groups.is_some() {
            &["resource_group"]
        } else {
            &[]
        };
        let acquire_requests = counter_vec(
            &r,
            "palisade_acquire_requests_total",
            "Acquire requests by outcome: granted (a lease was returned), held (refused or timed out waiting), invalid (rejected as malformed).",
            &["outcome"],
        )?;
        let renewals = counter_vec(
            &r,
            "palisade_lease_renewals_total",
            "Lease renewals by outcome: renewed, or not_active (the lease had already ended).",
            &["outcome"],
        )?;
        let releases = register(
            &r,
            IntCounter::new(
                "palisade_lease_releases_total",
                "Leases released by their holder.",
            )?,
        )?;
        let expirations = counter_vec(
            &r,
            "palisade_lease_expirations_total",
            "Lease expiries recorded by this instance (each expiry is recorded by exactly one instance).",
            group_labels,
        )?;
        let force_releases = register(
            &r,
            IntCounter::new(
                "palisade_lease_force_releases_total",
                "Leases force-released by an admin.",
            )?,
        )?;
        let fenced_writes = counter_vec(
            &r,
            "palisade_fenced_writes_total",
            "Fenced writes by outcome (accepted, stale, unknown) and door (fence: POST .../fence, store: PUT .../value).",
            &["outcome", "via"],
        )?;
        let stale_writes = counter_vec(
            &r,
            "palisade_stale_writes_total",
            "Writes rejected with a stale token through either door: the number to alert on.",
            group_labels,
        )?;
        let events_pruned = register(
            &r,
            IntCounter::new(
                "palisade_events_pruned_total",
                "Events deleted by this instance's event retention.",
            )?,
        )?;
        let expiry_sweeps = counter_vec(
            &r,
            "palisade_expiry_sweeps_total",
            "Runs of this instance's expiry sweeper by outcome: completed, or failed (it retries at the next interval).",
            &["outcome"],
        )?;
        let expiry_sweep_duration = histogram(
            &r,
            "palisade_expiry_sweep_duration_seconds",
            "How long each completed expiry sweep took, recording what was due included.",
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )?;
        let active_leases = register(
            &r,
            IntGauge::new(
                "palisade_active_leases",
                "Leases active right now, cluster-wide, as last read from the database; use max() across instances.",
            )?,
        )?;
        let database_up = register(
            &r,
            IntGauge::new(
                "palisade_database_up",
                "1 if this instance's last database check succeeded, else 0.",
            )?,
        )?;
        let build_info = register(
            &r,
            IntGaugeVec::new(
                Opts::new(
                    "palisade_build_info",
                    "Always 1; the version is in the label.",
                ),
                &["version"],
            )?,
        )?;
        let http_request_duration = register(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "palisade_http_request_duration_seconds",
                    "HTTP request latency by matched route template, method and status class.",
                )
                .buckets(HTTP_BUCKETS.to_vec()),
                &["route", "method", "status_class"],
            )?,
        )?;
        let lease_hold_duration = histogram(
            &r,
            "palisade_lease_hold_duration_seconds",
            "How long leases were held, from acquire to release, force-release or expiry.",
            HOLD_BUCKETS,
        )?;
        let renewal_margin = histogram(
            &r,
            "palisade_renewal_margin_seconds",
            "Time that was left on a lease when it was renewed; a falling margin warns that holders are about to lose leases.",
            MARGIN_BUCKETS,
        )?;
        let stale_write_lateness = histogram(
            &r,
            "palisade_stale_write_lateness_seconds",
            "How long after its lease ended a stale write arrived.",
            LATENESS_BUCKETS,
        )?;
        let acquire_wait = histogram(
            &r,
            "palisade_acquire_wait_seconds",
            "Time a granted acquire spent before it was granted, waiting included.",
            WAIT_BUCKETS,
        )?;

        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Every fixed label combination exists from the start, so rate() sees
        // the first increment instead of a series appearing at 1.
        for outcome in ["granted", "held", "invalid"] {
            acquire_requests.with_label_values(&[outcome]);
        }
        for outcome in ["renewed", "not_active"] {
            renewals.with_label_values(&[outcome]);
        }
        for outcome in ["completed", "failed"] {
            expiry_sweeps.with_label_values(&[outcome]);
        }
        for outcome in ["accepted", "stale", "unknown"] {
            for via in [WriteVia::Fence, WriteVia::Store] {
                fenced_writes.with_label_values(&[outcome, via.as_str()]);
            }
        }
        if config.resource_groups.is_none() {
            expirations.with_label_values(&[] as &[&str]);
            stale_writes.with_label_values(&[] as &[&str]);
        }

        Ok(Self {
            inner: Arc::new(Inner {
                registry: r,
                groups: config.resource_groups.clone().map(|config| ResourceGroups {
                    config,
                    seen: Mutex::new(HashSet::new()),
                }),
                acquire_requests,
                renewals,
                releases,
                expirations,
                force_releases,
                fenced_writes,
                stale_writes,
                events_pruned,
                expiry_sweeps,
                expiry_sweep_duration,
                active_leases,
                database_up,
                http_request_duration,
                lease_hold_duration,
                renewal_margin,
                stale_write_lateness,
                acquire_wait,
            }),
        })
    }

    /// The label values for a per-resource counter: none, or the group.
    fn group_labels(&self, resource: &ResourceName) -> Vec<String> {
        self.inner
            .groups
            .as_ref()
            .map(|groups| groups.group_of(resource))
            .into_iter()
            .collect()
    }

    /// The text exposition format, for `GET /metrics`.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.inner.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }

    pub fn acquire_granted(&self, waited: Duration) {
        let m = &self.inner;
        m.acquire_requests.with_label_values(&["granted"]).inc();
        m.acquire_wait.observe(waited.as_secs_f64());
    }

    /// A request-id retry that got its live lease back: granted, no wait.
    pub fn acquire_reissued(&self) {
        self.inner
            .acquire_requests
            .with_label_values(&["granted"])
            .inc();
    }

    pub fn acquire_held(&self) {
        self.inner
            .acquire_requests
            .with_label_values(&["held"])
            .inc();
    }

    pub fn acquire_invalid(&self) {
        self.inner
            .acquire_requests
            .with_label_values(&["invalid"])
            .inc();
    }

    pub fn renewed(&self, margin_ms: i64) {
        let m = &self.inner;
        m.renewals.with_label_values(&["renewed"]).inc();
        m.renewal_margin.observe(millis_to_secs(margin_ms));
    }

    pub fn renewal_refused(&self) {
        self.inner.renewals.with_label_values(&["not_active"]).inc();
    }

    pub fn released(&self, lease: &Lease) {
        self.inner.releases.inc();
        self.observe_hold(lease, lease.ended_at);
    }

    pub fn force_released(&self, lease: &Lease) {
        self.inner.force_releases.inc();
        self.observe_hold(lease, lease.ended_at);
    }

    /// An expiry this instance recorded (never one another instance did).
    pub fn expired(&self, lease: &Lease) {
        let labels = self.group_labels(&lease.resource);
        self.inner.expirations.with_label_values(&labels).inc();
        // An expired lease was held until its deadline.
        self.observe_hold(lease, Some(lease.expires_at));
    }

    fn observe_hold(&self, lease: &Lease, ended_at: Option<DateTime<Utc>>) {
        if let Some(ended_at) = ended_at {
            let held_ms = (ended_at - lease.acquired_at).num_milliseconds();
            self.inner
                .lease_hold_duration
                .observe(millis_to_secs(held_ms));
        }
    }

    pub fn fenced(&self, resource: &ResourceName, via: WriteVia, outcome: &FenceOutcome) {
        let m = &self.inner;
        let label = match outcome {
            FenceOutcome::Accepted { .. } => "accepted",
            FenceOutcome::Rejected(r) if r.unknown => "unknown",
            FenceOutcome::Rejected(r) => {
                m.stale_writes
                    .with_label_values(&self.group_labels(resource))
                    .inc();
                if let Some(lateness_ms) = r.lateness_ms {
                    m.stale_write_lateness.observe(millis_to_secs(lateness_ms));
                }
                "stale"
            }
        };
        m.fenced_writes
            .with_label_values(&[label, via.as_str()])
            .inc();
    }

    pub fn events_pruned(&self, count: u64) {
        self.inner.events_pruned.inc_by(count);
    }

    /// One run of the expiry sweeper: `Some(elapsed)` if it completed,
    /// `None` if it failed.
    pub fn expiry_sweep(&self, completed: Option<Duration>) {
        let m = &self.inner;
        match completed {
            Some(elapsed) => {
                m.expiry_sweeps.with_label_values(&["completed"]).inc();
                m.expiry_sweep_duration.observe(elapsed.as_secs_f64());
            }
            None => m.expiry_sweeps.with_label_values(&["failed"]).inc(),
        }
    }

    pub fn set_active_leases(&self, count: i64) {
        self.inner.active_leases.set(count);
    }

    pub fn set_database_up(&self, up: bool) {
        self.inner.database_up.set(i64::from(up));
    }

    /// One finished HTTP request. `route` must be a route template (or a
    /// fixed placeholder), never a raw path: paths carry lease ids.
    pub fn http_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        let status_class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.inner
            .http_request_duration
            .with_label_values(&[route, method, status_class])
            .observe(elapsed.as_secs_f64());
    }
}

fn millis_to_secs(ms: i64) -> f64 {
    // Clock steps can make a difference slightly negative; a histogram of
    // durations has no negative bucket.
    ms.max(0) as f64 / 1000.0
}

/// Keeps the database-backed gauges (`palisade_active_leases`,
/// `palisade_database_up`) fresh every `interval`, so a scrape never costs a
/// query. Stops on `shutdown`.
pub async fn run_gauge_refresher(
    service: crate::service::LockService,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let metrics = service.metrics().clone();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let counted = tokio::time::timeout(
            Duration::from_secs(2),
            service.store().count_active_leases(),
        )
        .await;
        match counted {
            Ok(Ok(count)) => {
                metrics.set_active_leases(count);
                metrics.set_database_up(true);
            }
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "cannot count active leases");
                metrics.set_database_up(false);
            }
            Err(_) => metrics.set_database_up(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s.to_owned()).unwrap()
    }

    #[test]
    fn groups_are_prefixes_capped_with_the_rest_as_other() {
        let groups = ResourceGroups {
            config: ResourceGroupConfig {
                separator: "/".into(),
                max_groups: 2,
            },
            seen: Mutex::new(HashSet::new()),
        };
        assert_eq!(groups.group_of(&name("billing/invoice-1")), "billing");
        assert_eq!(groups.group_of(&name("reports/daily")), "reports");
        assert_eq!(groups.group_of(&name("billing/invoice-2")), "billing");
        assert_eq!(groups.group_of(&name("search/index")), OTHER_GROUP);
        assert_eq!(groups.group_of(&name("reports/weekly")), "reports");
    }

    #[test]
    fn a_name_without_the_separator_is_its_own_group() {
        let groups = ResourceGroups {
            config: ResourceGroupConfig {
                separator: "::".into(),
                max_groups: 10,
            },
            seen: Mutex::new(HashSet::new()),
        };
        assert_eq!(groups.group_of(&name("cleanup")), "cleanup");
        assert_eq!(groups.group_of(&name("a::b::c")), "a");
    }

    #[test]
    fn every_contract_metric_is_exposed_from_the_start() {
        let metrics = Metrics::new(&MetricsConfig::default()).unwrap();
        let text = metrics.render().unwrap();
        for name in [
            "palisade_acquire_requests_total{outcome=\"invalid\"} 0",
            "palisade_lease_renewals_total{outcome=\"not_active\"} 0",
            "palisade_lease_releases_total 0",
            "palisade_lease_expirations_total 0",
            "palisade_lease_force_releases_total 0",
            "palisade_fenced_writes_total{outcome=\"stale\",via=\"store\"} 0",
            "palisade_stale_writes_total 0",
            "palisade_active_leases 0",
            "palisade_build_info{version=",
            "palisade_lease_hold_duration_seconds_count 0",
            "palisade_renewal_margin_seconds_bucket{le=\"0.001\"} 0",
            "palisade_stale_write_lateness_seconds_count 0",
            "palisade_acquire_wait_seconds_bucket{le=\"60\"} 0",
            "palisade_expiry_sweeps_total{outcome=\"failed\"} 0",
            "palisade_expiry_sweep_duration_seconds_count 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn registries_are_independent() {
        let a = Metrics::new(&MetricsConfig::default()).unwrap();
        let b = Metrics::new(&MetricsConfig::default()).unwrap();
        a.acquire_held();
        assert!(
            a.render()
                .unwrap()
                .contains("palisade_acquire_requests_total{outcome=\"held\"} 1")
        );
        assert!(
            b.render()
                .unwrap()
                .contains("palisade_acquire_requests_total{outcome=\"held\"} 0")
        );
    }
}

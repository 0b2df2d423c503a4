//! `palisade bench`: drives a running server over HTTP with N concurrent
//! keep-alive clients through one scenario and reports throughput, latency
//! percentiles, errors, fairness (hot resource) and the server's memory.
//!
//! It measures; it never asserts speed. `bench/compare.sh` runs it next to
//! the reference baselines and prints the ratios.

mod api;
mod rss;
mod stats;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::json;
use tokio::time::Instant;

use api::{Acquire, Api, CallError, Lease, Write};
pub use stats::{Latency, jain_index};

/// Leases the scenarios hold for a whole run: long enough never to expire.
const LONG_TTL_MS: u64 = 60_000;
/// The shortest TTL the server accepts: `acquire` leases lapse on their own.
const SHORT_TTL_MS: u64 = 100;
/// Error messages kept for the report.
const KEPT_ERRORS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Acquire + release, one resource per client.
    Cycle,
    /// Acquire only, round-robin over `--resources` resources (100 ms TTL).
    Acquire,
    /// Every client on one resource with `wait_ms`: acquire, fenced write, release.
    Hot,
    /// Renew a held lease.
    Renew,
    /// Fenced store writes with a live token.
    Write,
    /// Store writes with a superseded token (each must be refused).
    Stale,
    /// Writes, renewals and acquire+release cycles, 2:1:1.
    Mixed,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Cycle => "cycle",
            Scenario::Acquire => "acquire",
            Scenario::Hot => "hot",
            Scenario::Renew => "renew",
            Scenario::Write => "write",
            Scenario::Stale => "stale",
            Scenario::Mixed => "mixed",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Base URL of the server, e.g. `http://127.0.0.1:7070`.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    pub server: String,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Concurrent keep-alive clients.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub clients: u64,
    /// How long to run: `500ms`, `10s`, `2m`.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Resources the `acquire` scenario cycles over.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub resources: u64,
    /// How long a `hot` client waits for the resource per attempt.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub wait_ms: u64,
    /// The server's process id, for its memory; found from the port if the
    /// server is local and this is unset.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Parses `250ms`, `10s`, `2m` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?}: use ms, s or m")),
    };
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        return Err(format!("{text:?} must be more than zero and at most a day"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The `palisade bench` command: run and print the report.
pub async fn main(args: BenchArgs) -> anyhow::Result<()> {
    let report = run(&args).await?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    Ok(())
}

/// Server memory over the run.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub pid: u32,
    pub peak_bytes: u64,
    pub end_bytes: u64,
}

/// How the clients shared one hot resource.
#[derive(Debug, Clone, Copy)]
pub struct Fairness {
    /// The longest any client waited for the resource.
    pub max_wait: Duration,
    /// Jain's index over per-client handoffs (1.0 = perfectly even).
    pub jain: f64,
    pub min_client_ops: u64,
    pub max_client_ops: u64,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: Scenario,
    pub clients: u64,
    pub elapsed: Duration,
    /// Completed operations (a cycle or a hot handoff counts once).
    pub ops: u64,
    /// Operations refused as the protocol says (a held lock in `acquire`).
    pub refused: u64,
    pub errors: u64,
    pub latency: Latency,
    pub fairness: Option<Fairness>,
    pub memory: Option<Memory>,
    pub first_errors: Vec<String>,
}

impl Report {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        json!({
            "scenario": self.scenario.name(),
            "clients": self.clients,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "ops": self.ops,
            "ops_per_sec": self.ops_per_sec(),
            "refused": self.refused,
            "errors": self.errors,
            "p50_ms": ms(self.latency.p50),
            "p99_ms": ms(self.latency.p99),
            "p999_ms": ms(self.latency.p999),
            "max_ms": ms(self.latency.max),
            "max_wait_ms": self.fairness.map(|f| ms(f.max_wait)),
            "jain_fairness": self.fairness.map(|f| f.jain),
            "min_client_ops": self.fairness.map(|f| f.min_client_ops),
            "max_client_ops": self.fairness.map(|f| f.max_client_ops),
            "server_pid": self.memory.map(|m| m.pid),
            "rss_peak_bytes": self.memory.map(|m| m.peak_bytes),
            "rss_end_bytes": self.memory.map(|m| m.end_bytes),
            "first_errors": self.first_errors,
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        writeln!(
            f,
            "scenario {}  clients {}  elapsed {:.1} s",
            self.scenario.name(),
            self.clients,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "ops {}  ops/s {:.0}  refused {}  errors {}",
            self.ops,
            self.ops_per_sec(),
            self.refused,
            self.errors
        )?;
        writeln!(
            f,
            "latency ms  p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            ms(self.latency.p50),
            ms(self.latency.p99),
            ms(self.latency.p999),
            ms(self.latency.max)
        )?;
        if let Some(fair) = &self.fairness {
            writeln!(
                f,
                "hot  max wait {:.1} ms  fairness (Jain) {:.3}  handoffs per client {}..{}",
                ms(fair.max_wait),
                fair.jain,
                fair.min_client_ops,
                fair.max_client_ops
            )?;
        }
        match &self.memory {
            Some(m) => writeln!(
                f,
                "server rss  {:.1} MiB at end, {:.1} MiB peak (pid {})",
                m.end_bytes as f64 / 1_048_576.0,
                m.peak_bytes as f64 / 1_048_576.0,
                m.pid
            )?,
            None => writeln!(f, "server rss  unknown (not a local server)")?,
        }
        for err in &self.first_errors {
            writeln!(f, "error  {err}")?;
        }
        Ok(())
    }
}

/// What one client saw.
#[derive(Default)]
struct ClientStats {
    samples: Vec<Duration>,
    ops: u64,
    refused: u64,
    errors: u64,
    max_wait: Duration,
    first_errors: Vec<String>,
}

impl ClientStats {
    fn error(&mut self, err: &CallError) {
        self.errors += 1;
        if self.first_errors.len() < KEPT_ERRORS {
            self.first_errors.push(err.to_string());
        }
    }
}

/// How one operation ended, when it did not fail.
enum Done {
    Ok,
    Refused,
}

/// One client: its resource, its lease and what the scenario needs.
struct Worker {
    api: Api,
    scenario: Scenario,
    resource: String,
    holder: String,
    lease: Option<Lease>,
    /// A superseded token of `resource` (`stale`).
    stale_token: i64,
    /// Round-robin position shared by `acquire` clients.
    shared_cursor: Arc<AtomicU64>,
    prefix: String,
    resources: u64,
    wait_ms: u64,
    count: u64,
    /// How long the last `hot` acquire waited.
    last_wait: Duration,
}

impl Worker {
    async fn setup(&mut self) -> Result<(), CallError> {
        match self.scenario {
            Scenario::Renew | Scenario::Write | Scenario::Mixed => {
                self.lease = Some(self.acquire_own().await?);
            }
            Scenario::Stale => {
                let old = self.acquire_own().await?;
                self.api.release(&old).await?;
                let live = self.acquire_own().await?;
                // Accepting the live token makes the old one stale twice over.
                self.expect_accepted(live.token).await?;
                self.stale_token = old.token;
                self.lease = Some(live);
            }
            Scenario::Cycle | Scenario::Acquire | Scenario::Hot => {}
        }
        Ok(())
    }

    async fn op(&mut self) -> Result<Done, CallError> {
        self.count += 1;
        match self.scenario {
            Scenario::Cycle => self.cycle().await,
            Scenario::Acquire => {
                let k = self.shared_cursor.fetch_add(1, Ordering::Relaxed) % self.resources;
                let resource = format!("{}-{k}", self.prefix);
                match self
                    .api
                    .acquire(&resource, &self.holder, SHORT_TTL_MS, 0)
                    .await?
                {
                    Acquire::Granted(_) => Ok(Done::Ok),
                    Acquire::Held => Ok(Done::Refused),
                }
            }
            Scenario::Hot => self.handoff().await,
            Scenario::Renew => {
                let lease = self.own_lease().await?;
                self.api.renew(&lease, LONG_TTL_MS).await?;
                Ok(Done::Ok)
            }
            Scenario::Write => {
                let lease = self.own_lease().await?;
                self.expect_accepted(lease.token).await?;
                Ok(Done::Ok)
            }
            Scenario::Stale => match self
                .api
                .write(&self.resource, self.stale_token, self.count)
                .await?
            {
                Write::Stale => Ok(Done::Ok),
                Write::Accepted => Err(CallError::Shape {
                    what: "stale write",
                    body: format!("token {} was accepted", self.stale_token),
                }),
            },
            Scenario::Mixed => match self.count % 4 {
                0 => {
                    if let Some(lease) = self.lease.take() {
                        self.api.release(&lease).await?;
                    }
                    self.lease = Some(self.acquire_own().await?);
                    Ok(Done::Ok)
                }
                1 => {
                    let lease = self.own_lease().await?;
                    self.api.renew(&lease, LONG_TTL_MS).await?;
                    Ok(Done::Ok)
                }
                _ => {
                    let lease = self.own_lease().await?;
                    self.expect_accepted(lease.token).await?;
                    Ok(Done::Ok)
                }
            },
        }
    }

    async fn cycle(&mut self) -> Result<Done, CallError> {
        let lease = self.acquire_own().await?;
        self.api.release(&lease).await?;
        Ok(Done::Ok)
    }

    /// One turn on the hot resource: wait for it, write under its token,
    /// hand it on.
    async fn handoff(&mut self) -> Result<Done, CallError> {
        let asked = Instant::now();
        let granted = self
            .api
            .acquire(&self.resource, &self.holder, LONG_TTL_MS, self.wait_ms)
            .await?;
        self.last_wait = asked.elapsed();
        let Acquire::Granted(lease) = granted else {
            return Ok(Done::Refused);
        };
        let written = self.expect_accepted(lease.token).await;
        // Release even after a failed write, or every other client stalls.
        let released = self.api.release(&lease).await;
        written?;
        released?;
        Ok(Done::Ok)
    }

    async fn acquire_own(&self) -> Result<Lease, CallError> {
        match self
            .api
            .acquire(&self.resource, &self.holder, LONG_TTL_MS, 0)
            .await?
        {
            Acquire::Granted(lease) => Ok(lease),
            Acquire::Held => Err(CallError::Shape {
                what: "acquire",
                body: format!("{} is held by someone else", self.resource),
            }),
        }
    }

    /// The client's lease, re-acquired if an earlier failure lost it.
    async fn own_lease(&mut self) -> Result<Lease, CallError> {
        if let Some(lease) = &self.lease {
            return Ok(lease.clone());
        }
        let lease = self.acquire_own().await?;
        self.lease = Some(lease.clone());
        Ok(lease)
    }

    async fn expect_accepted(&self, token: i64) -> Result<(), CallError> {
        match self.api.write(&self.resource, token, self.count).await? {
            Write::Accepted => Ok(()),
            Write::Stale => Err(CallError::Shape {
                what: "write",
                body: format!("live token {token} was refused as stale"),
            }),
        }
    }

    async fn run_until(mut self, deadline: Instant) -> (Self, ClientStats) {
        let mut stats = ClientStats::default();
        while Instant::now() < deadline {
            let started = Instant::now();
            let result = self.op().await;
            let took = started.elapsed();
            match result {
                Ok(done) => {
                    stats.samples.push(took);
                    match done {
                        Done::Ok => stats.ops += 1,
                        Done::Refused => stats.refused += 1,
                    }
                }
                Err(err) => {
                    stats.error(&err);
                    // Start over from a clean state; a lease may be lost.
                    self.lease = None;
                    // Do not spin on a server that refuses connections.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            if self.scenario == Scenario::Hot {
                stats.max_wait = stats.max_wait.max(self.last_wait);
            }
        }
        (self, stats)
    }

    async fn teardown(&mut self) {
        if let Some(lease) = self.lease.take() {
            // Best effort: an unreleased lease simply expires.
            let _ = self.api.release(&lease).await;
        }
    }
}

/// Runs one scenario and measures it.
pub async fn run(args: &BenchArgs) -> anyhow::Result<Report> {
    let url = reqwest::Url::parse(&args.server)?;
    let clients = usize::try_from(args.clients)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .tcp_nodelay(true)
        // Longer than the longest wait the server allows.
        .timeout(Duration::from_secs(90))
        .build()?;
    let api = Api::new(http, url.as_str());
    let prefix = format!("bench-{}-{}", args.scenario.name(), run_id());
    let cursor = Arc::new(AtomicU64::new(0));
    let mut workers: Vec<Worker> = (0..clients)
        .map(|i| Worker {
            api: api.clone(),
            scenario: args.scenario,
            resource: match args.scenario {
                Scenario::Hot => format!("{prefix}-hot"),
                _ => format!("{prefix}-c{i}"),
            },
            holder: format!("bench-client-{i}"),
            lease: None,
            stale_token: 0,
            shared_cursor: cursor.clone(),
            prefix: prefix.clone(),
            resources: args.resources,
            wait_ms: args.wait_ms,
            count: 0,
            last_wait: Duration::ZERO,
        })
        .collect();
    for result in futures::future::join_all(workers.iter_mut().map(Worker::setup)).await {
        result.map_err(|e| anyhow::anyhow!("setting up the {} scenario: {e}", prefix))?;
    }

    let pid = args.server_pid.or_else(|| local_server_pid(&url));
    let started = Instant::now();
    let deadline = started + args.duration;
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(w.run_until(deadline)))
        .collect();
    let sampler = pid.map(|pid| tokio::spawn(sample_peak_rss(pid, deadline)));
    let mut all = ClientStats::default();
    let mut per_client = Vec::with_capacity(clients);
    let mut finished = Vec::with_capacity(clients);
    for task in tasks {
        let (worker, stats) = task.await?;
        finished.push(worker);
        per_client.push(stats.ops);
        all.samples.extend(stats.samples);
        all.ops += stats.ops;
        all.refused += stats.refused;
        all.errors += stats.errors;
        all.max_wait = all.max_wait.max(stats.max_wait);
        let room = KEPT_ERRORS.saturating_sub(all.first_errors.len());
        all.first_errors
            .extend(stats.first_errors.into_iter().take(room));
    }
    let elapsed = started.elapsed();
    let memory = match (pid, sampler) {
        (Some(pid), Some(sampler)) => {
            let peak = sampler.await.unwrap_or(0);
            rss::resident_bytes(pid).map(|end| Memory {
                pid,
                peak_bytes: peak.max(end),
                end_bytes: end,
            })
        }
        _ => None,
    };
    futures::future::join_all(finished.iter_mut().map(Worker::teardown)).await;

    let fairness = (args.scenario == Scenario::Hot).then(|| Fairness {
        max_wait: all.max_wait,
        jain: jain_index(&per_client),
        min_client_ops: per_client.iter().copied().min().unwrap_or(0),
        max_client_ops: per_client.iter().copied().max().unwrap_or(0),
    });
    Ok(Report {
        scenario: args.scenario,
        clients: args.clients,
        elapsed,
        ops: all.ops,
        refused: all.refused,
        errors: all.errors,
        latency: Latency::of(&mut all.samples),
        fairness,
        memory,
        first_errors: all.first_errors,
    })
}

/// A short random tag so runs against one server never share resources.
fn run_id() -> String {
    hex::encode(rand::random::<[u8; 4]>())
}

/// The server's pid if it listens on this machine.
fn local_server_pid(url: &reqwest::Url) -> Option<u32> {
    let host = url
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let local = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !local {
        return None;
    }
    rss::find_listener(url.port_or_known_default()?)
}

/// The highest resident memory seen, sampled until `until`.
async fn sample_peak_rss(pid: u32, until: Instant) -> u64 {
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss::resident_bytes(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "0s", "fast", "10h", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}

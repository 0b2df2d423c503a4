//! The torture test: real processes, injected faults, a recorded history
//! and an independent checker (see docs/reliability.md).
//!
//! `palisade torture` creates its own database (a private PostgreSQL
//! cluster, or an SQLite file), starts Palisade instances and worker
//! processes, injects faults for a fixed time, then stops everything and
//! checks the history and the database. It exits non-zero on any violation.

pub mod checker;
mod cluster;
mod collect;
mod history;
mod proxy;
pub mod worker;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use cluster::{Instance, PgCluster, free_port, signal};
use proxy::Proxy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// Several instances on a private PostgreSQL cluster behind a faulty proxy.
    Postgres,
    /// One instance on an SQLite file.
    Sqlite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Fault {
    /// `kill -9` a Palisade instance (its supervisor restarts it).
    KillInstance,
    /// SIGSTOP an instance for longer than the TTL, then SIGCONT.
    StopInstance,
    /// SIGSTOP a worker for longer than the TTL, then SIGCONT.
    StopWorker,
    /// Crash PostgreSQL (immediate shutdown) and restart it.
    KillDb,
    /// `pg_terminate_backend` every Palisade connection.
    TerminateBackends,
    /// Stall all traffic between the instances and the database.
    ProxyStall,
    /// Cut every connection between the instances and the database.
    ProxyCut,
    /// An admin force-releases a random resource.
    ForceRelease,
}

#[derive(Debug, Clone, clap::Args)]
pub struct TortureArgs {
    #[arg(long, value_enum, default_value = "postgres")]
    pub profile: Profile,
    /// How long workers run, in seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Palisade instances (PostgreSQL profile; SQLite always runs one).
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    #[arg(long, default_value_t = 4)]
    pub resources: usize,
    #[arg(long, default_value_t = 400)]
    pub ttl_ms: u64,
    /// Faults to inject (default: every fault the profile supports).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Fault>,
    /// Seconds between faults.
    #[arg(long, default_value_t = 2.0)]
    pub fault_interval_secs: f64,
    /// Run PostgreSQL with synchronous_commit=off: known to be unsafe with
    /// database crashes, for checking that the checker notices.
    #[arg(long)]
    pub unsafe_async_commit: bool,
    /// Keep the temporary directory (logs, histories, database) afterwards.
    #[arg(long)]
    pub keep: bool,
}

impl Fault {
    fn supported(self, profile: Profile) -> bool {
        profile == Profile::Postgres
            || matches!(
                self,
                Fault::KillInstance | Fault::StopInstance | Fault::StopWorker | Fault::ForceRelease
            )
    }
}

/// Runs the torture test; `Ok(true)` when the checker found nothing wrong.
pub async fn run(args: TortureArgs) -> anyhow::Result<bool> {
    let dir = tempfile::Builder::new()
        .prefix("palisade-torture-")
        .tempdir()?;
    // Readable by the postgres user when we run as root.
    let _ = std::process::Command::new("chmod")
        .arg("755")
        .arg(dir.path())
        .status();
    let base = dir.path().to_path_buf();
    println!(
        "torture: profile {:?}, {} s, working in {}",
        args.profile,
        args.duration_secs,
        base.display()
    );
    let outcome = run_in(&args, &base).await;
    if args.keep {
        let kept = dir.keep();
        println!("torture: kept {}", kept.display());
    }
    outcome
}

async fn run_in(args: &TortureArgs, base: &Path) -> anyhow::Result<bool> {
    let stop = CancellationToken::new();
    let _stop_on_exit = stop.clone().drop_guard();
    let faults: Vec<Fault> = if args.faults.is_empty() {
        <Fault as clap::ValueEnum>::value_variants().to_vec()
    } else {
        args.faults.clone()
    }
    .into_iter()
    .filter(|f| f.supported(args.profile))
    .collect();

    // The database, and the URL the instances use (through the proxy).
    let (cluster, proxy, instance_url, direct_url) = match args.profile {
        Profile::Postgres => {
            let pg_dir = base.join("pg");
            std::fs::create_dir_all(&pg_dir)?;
            let cluster = PgCluster::create(&pg_dir, free_port()?)?;
            cluster.start()?;
            let admin = cluster.url(cluster.port, "postgres");
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await?;
            sqlx::query("CREATE DATABASE palisade")
                .execute(&mut conn)
                .await?;
            let upstream = format!("127.0.0.1:{}", cluster.port).parse()?;
            let proxy = Proxy::start(upstream, stop.clone()).await?;
            let mut url = cluster.url(proxy.addr.port(), "palisade");
            if args.unsafe_async_commit {
                url.push_str("?options=-c%20synchronous_commit%3Doff");
            }
            let direct = cluster.url(cluster.port, "palisade");
            (Some(Arc::new(cluster)), Some(proxy), url, direct)
        }
        Profile::Sqlite => {
            let url = format!("sqlite://{}", base.join("palisade.db").display());
            (None, None, url.clone(), url)
        }
    };

    let instance_count = if args.profile == Profile::Sqlite {
        1
    } else {
        args.instances.max(1)
    };
    let mut instances = Vec::new();
    let mut supervisors = Vec::new();
    let instances_stop = CancellationToken::new();
    for i in 0..instance_count {
        let (instance, task) = Instance::spawn_supervised(
            format!("palisade-{i}"),
            free_port()?,
            instance_url.clone(),
            base.join(format!("palisade-{i}.log")),
            instances_stop.clone(),
        );
        instances.push(instance);
        supervisors.push(task);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()?;
    for instance in &instances {
        instance
            .wait_ready(&client, Duration::from_secs(60))
            .await?;
    }

    // Workers: separate processes, so they can be paused like real ones.
    let history_dir = base.join("history");
    std::fs::create_dir_all(&history_dir)?;
    let servers = instances
        .iter()
        .map(|i| i.base.clone())
        .collect::<Vec<_>>()
        .join(",");
    let exe = std::env::current_exe()?;
    let mut workers = Vec::new();
    for w in 0..args.workers {
        let child = tokio::process::Command::new(&exe)
            .args([
                "torture-worker",
                "--servers",
                &servers,
                "--name",
                &format!("worker-{w}"),
            ])
            .args([
                "--resources",
                &args.resources.to_string(),
                "--ttl-ms",
                &args.ttl_ms.to_string(),
            ])
            .args(["--duration-ms", &(args.duration_secs * 1000).to_string()])
            .arg("--history")
            .arg(history_dir.join(format!("worker-{w}.jsonl")))
            .kill_on_drop(true)
            .spawn()
            .context("spawn worker")?;
        workers.push(child);
    }
    let worker_pids: Vec<u32> = workers.iter().filter_map(|c| c.id()).collect();

    // Faults until the workers' time is up.
    let injected: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(args.duration_secs);
    let env = FaultEnv {
        instances: instances.clone(),
        worker_pids: worker_pids.clone(),
        cluster: cluster.clone(),
        proxy: proxy.clone(),
        direct_url: direct_url.clone(),
        client: client.clone(),
        resources: args.resources,
        ttl: Duration::from_millis(args.ttl_ms),
    };
    while Instant::now() < deadline && !faults.is_empty() {
        let pause =
            Duration::from_secs_f64(args.fault_interval_secs * rand::rng().random_range(0.5..1.5));
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        if Instant::now() >= deadline {
            break;
        }
        let fault = faults[rand::rng().random_range(0..faults.len())];
        match env.inject(fault).await {
            Ok(()) => {
                *injected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(format!("{fault:?}"))
                    .or_default() += 1
            }
            Err(err) => println!("torture: fault {fault:?} could not be injected: {err:#}"),
        }
    }

    // Wind down: let everything run again and the workers finish.
    env.heal();
    for mut w in workers {
        if tokio::time::timeout(Duration::from_secs(60), w.wait())
            .await
            .is_err()
        {
            let _ = w.kill().await;
        }
    }
    for instance in &instances {
        let _ = instance.wait_ready(&client, Duration::from_secs(60)).await;
    }
    // Let the sweepers record the last expiries, then stop the instances.
    tokio::time::sleep(Duration::from_millis(args.ttl_ms + 1000)).await;
    instances_stop.cancel();
    for s in supervisors {
        let _ = s.await;
    }

    let state = match args.profile {
        Profile::Postgres => collect::postgres(&direct_url).await?,
        Profile::Sqlite => collect::sqlite(&direct_url).await?,
    };
    let entries = history::read_all(&history_dir)?;
    let acked: Vec<checker::Acked> = entries.iter().filter_map(history::Entry::acked).collect();
    let mut report = checker::Report::default();
    checker::check_events(&state.events, &mut report);
    checker::check_leases(&state.events, &state.leases, &mut report);
    checker::check_acknowledged(
        &acked,
        &state.events,
        &state.leases,
        &state.values,
        &mut report,
    );

    // The summary.
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    for e in &entries {
        if e.phase != history::Phase::Invoke {
            *ops.entry(format!("{} {:?}", e.op, e.phase).to_lowercase())
                .or_default() += 1;
        }
    }
    let injected = injected.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!("torture: operations {ops:?}");
    println!("torture: faults injected {injected:?}");
    println!("torture: events {:?}", report.events_by_kind);
    for v in report.violations.iter().take(20) {
        println!("torture: VIOLATION {v}");
    }
    let granted = ops.get("acquire ok").copied().unwrap_or(0);
    let writes = ops.get("write ok").copied().unwrap_or(0);
    println!("torture: violations = {}", report.violations.len());
    if granted < 10 || writes < 5 {
        println!(
            "torture: too little work got done ({granted} grants, {writes} writes) to mean anything"
        );
        return Ok(false);
    }
    drop(cluster);
    Ok(report.violations.is_empty())
}

/// What the fault injector can reach.
struct FaultEnv {
    instances: Vec<Instance>,
    worker_pids: Vec<u32>,
    cluster: Option<Arc<PgCluster>>,
    proxy: Option<Proxy>,
    direct_url: String,
    client: reqwest::Client,
    resources: usize,
    ttl: Duration,
}

impl FaultEnv {
    async fn inject(&self, fault: Fault) -> anyhow::Result<()> {
        let pick = |n: usize| rand::rng().random_range(0..n.max(1));
        let instance = &self.instances[pick(self.instances.len())];
        match fault {
            Fault::KillInstance => {
                if let Some(pid) = instance.pid() {
                    signal(pid, "KILL");
                }
            }
            Fault::StopInstance => {
                if let Some(pid) = instance.pid() {
                    signal(pid, "STOP");
                    tokio::time::sleep(self.ttl * 2).await;
                    signal(pid, "CONT");
                }
            }
            Fault::StopWorker => {
                if let Some(pid) = self.worker_pids.get(pick(self.worker_pids.len())) {
                    signal(*pid, "STOP");
                    tokio::time::sleep(self.ttl * 2).await;
                    signal(*pid, "CONT");
                }
            }
            Fault::KillDb => {
                if let Some(cluster) = &self.cluster {
                    cluster.crash()?;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    cluster.start()?;
                }
            }
            Fault::TerminateBackends => {
                let mut conn =
                    <sqlx::PgConnection as sqlx::Connection>::connect(&self.direct_url).await?;
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE application_name = 'palisade' AND pid <> pg_backend_pid()",
                )
                .execute(&mut conn)
                .await?;
            }
            Fault::ProxyStall => {
                if let Some(proxy) = &self.proxy {
                    proxy.stall(Duration::from_secs(2)).await;
                }
            }
            Fault::ProxyCut => {
                if let Some(proxy) = &self.proxy {
                    proxy.cut();
                }
            }
            Fault::ForceRelease => {
                let resource = format!("torture-{}", pick(self.resources));
                let _ = self
                    .client
                    .post(format!(
                        "{}/v1/admin/resources/{resource}/force-release",
                        instance.base
                    ))
                    .bearer_auth("torture")
                    .json(&serde_json::json!({"reason": "torture: random force-release"}))
                    .send()
                    .await;
            }
        }
        Ok(())
    }

    /// Resumes anything paused and makes sure the database is up.
    fn heal(&self) {
        for pid in self
            .instances
            .iter()
            .filter_map(Instance::pid)
            .chain(self.worker_pids.iter().copied())
        {
            signal(pid, "CONT");
        }
        if let Some(cluster) = &self.cluster {
            let _ = cluster.start();
        }
    }
}

//! Building and running the server: connect, migrate, bind, serve until a
//! shutdown signal, then stop background tasks and close the pool.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::http::auth::AdminToken;
use crate::http::keys::ApiKeys;
use crate::http::limits::RateLimiter;
use crate::http::server::{self, ClientTimeouts};
use crate::http::ui::UiAccess;
use crate::http::{self, AppState};
use crate::metrics::{self, Metrics, MetricsConfig};
use crate::retention::{self, RetentionConfig};
use crate::service::{self, Limits, LockService};
use crate::store::{GroupCommitConfig, Store};

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: String,
    pub database_url: String,
    pub admin_token: Option<String>,
    pub max_ttl: Duration,
    pub sweep_interval: Duration,
    /// `PALISADE_UI_TOKEN`: protects reading the web UI.
    pub ui_token: Option<String>,
    /// Run simulated workers against this server (`serve --demo`).
    pub demo: bool,
    /// Requests per second per client IP (0: no limit), and the burst.
    pub rate_limit_per_sec: u32,
    pub rate_limit_burst: u32,
    /// Acquires that may wait at once in this instance.
    pub max_waiters: usize,
    pub metrics: MetricsConfig,
    /// How often the database-backed gauges are refreshed.
    pub metrics_refresh: Duration,
    /// `None` keeps events forever.
    pub event_retention: Option<RetentionConfig>,
    /// Batch concurrent writes into shared transactions (on by default;
    /// `None` runs one transaction per request).
    pub group_commit: Option<GroupCommitConfig>,
    /// Client API keys scoped to resource prefixes; `None` leaves the lock
    /// API open.
    pub api_keys_file: Option<PathBuf>,
    /// How long a client may take to send its request head and body.
    pub client_timeouts: ClientTimeouts,
}

impl Config {
    /// Defaults for a database URL, listening on a random loopback port.
    pub fn for_tests(database_url: impl Into<String>) -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            database_url: database_url.into(),
            admin_token: Some("test-admin-token".into()),
            max_ttl: crate::domain::Ttl::DEFAULT_MAX,
            sweep_interval: Duration::from_millis(100),
            ui_token: None,
            demo: false,
            rate_limit_per_sec: 0,
            rate_limit_burst: 0,
            max_waiters: 10_000,
            metrics: MetricsConfig::default(),
            metrics_refresh: Duration::from_millis(100),
            event_retention: Some(RetentionConfig::with_max_age(Duration::from_secs(
                u64::from(RetentionConfig::DEFAULT_DAYS) * 86_400,
            ))),
            // As `palisade serve` runs by default: tests that need one
            // transaction per request say so (`group_commit: None`).
            group_commit: Some(GroupCommitConfig::DEFAULT),
            api_keys_file: None,
            client_timeouts: ClientTimeouts::default(),
        }
    }
}

/// How long shutdown waits for the batch writers to end.
const WRITERS_STOP_WAIT: Duration = Duration::from_secs(5);

pub struct App {
    listener: TcpListener,
    state: AppState,
    store: Store,
    sweep_interval: Duration,
    metrics_refresh: Duration,
    event_retention: Option<RetentionConfig>,
    stop: CancellationToken,
    demo: bool,
    client_timeouts: ClientTimeouts,
}

impl App {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let admin_token = match config.admin_token.filter(|t| !t.is_empty()) {
            Some(token) => AdminToken::new(token),
            None => {
                let token = AdminToken::generate();
                // Printed once, like a notebook server's token, so a fresh
                // install can use admin features without configuration.
                tracing::warn!(
                    admin_token = token.expose(),
                    "no admin token configured (PALISADE_ADMIN_TOKEN); generated one for this run"
                );
                token
            }
        };
        // Before the database is touched: a bad key file changes nothing.
        let api_keys = match &config.api_keys_file {
            Some(path) => Some(Arc::new(load_api_keys(path, &admin_token)?)),
            None => None,
        };
        let store = Store::connect(&config.database_url)
            .await
            .with_context(|| {
                format!("cannot open the {} database", scheme(&config.database_url))
            })?;
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let ui_access = UiAccess::for_listener(listener.local_addr().ok(), config.ui_token);
        let stop = CancellationToken::new();
        let limits = Limits {
            max_ttl: config.max_ttl,
            max_waiters: config.max_waiters,
        };
        let metrics =
            Metrics::new(&config.metrics).context("cannot register the Prometheus metrics")?;
        let mut service = LockService::new(store.clone(), limits, stop.clone(), metrics);
        if let Some(group_commit) = config.group_commit {
            service = service.with_group_commit(group_commit);
        }
        Ok(Self {
            listener,
            state: AppState {
                service: service.into(),
                admin_token,
                ui_access,
                rate_limiter: RateLimiter::new(config.rate_limit_per_sec, config.rate_limit_burst)
                    .map(Arc::new),
                api_keys,
            },
            store,
            sweep_interval: config.sweep_interval,
            metrics_refresh: config.metrics_refresh,
            event_retention: config.event_retention,
            stop,
            demo: config.demo,
            client_timeouts: config.client_timeouts,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn admin_token(&self) -> &str {
        self.state.admin_token.expose()
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight
    /// requests finish (waiting acquires end at once), stops the background
    /// tasks and closes the database pool.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Self {
            listener,
            state,
            store,
            sweep_interval,
            metrics_refresh,
            event_retention,
            stop,
            demo,
            client_timeouts,
        } = self;
        let mut tasks = JoinSet::new();
        tasks.spawn(service::run_expiry_sweeper(
            LockService::clone(&state.service),
            sweep_interval,
            stop.clone(),
        ));
        tasks.spawn(service::run_lease_ended_listener(
            LockService::clone(&state.service),
            stop.clone(),
        ));
        tasks.spawn(metrics::run_gauge_refresher(
            LockService::clone(&state.service),
            metrics_refresh,
            stop.clone(),
        ));
        if let Some(retention) = event_retention {
            tasks.spawn(retention::run_event_retention(
                store.clone(),
                state.service.metrics().clone(),
                retention,
                stop.clone(),
            ));
        }
        if demo {
            tasks.spawn(crate::demo::run(
                LockService::clone(&state.service),
                stop.clone(),
            ));
        }

        let writers_stopped = state.service.writers_stopped();
        tracing::info!(addr = %listener.local_addr()?, backend = store.backend_name(), "palisade listening");
        let stop_on_signal = stop.clone();
        server::serve(listener, http::router(state), client_timeouts, async move {
            shutdown.await;
            tracing::info!("shutting down: finishing in-flight requests");
            stop_on_signal.cancel();
        })
        .await;
        stop.cancel();
        while tasks.join_next().await.is_some() {}
        // Every handle on the service is gone now, so the batch writers end;
        // wait for them to close their connections, so that "stopped" means
        // the database is left to itself (a backup or `palisade repack`
        // right after finds it free).
        if let Some(writers) = writers_stopped
            && tokio::time::timeout(WRITERS_STOP_WAIT, writers.wait())
                .await
                .is_err()
        {
            tracing::warn!("group commit writers were still running at shutdown");
        }
        store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Loads the key file; any problem stops the start with a clear message.
fn load_api_keys(path: &std::path::Path, admin_token: &AdminToken) -> anyhow::Result<ApiKeys> {
    let keys = ApiKeys::load(path)?;
    if keys.authenticate(admin_token.expose()).is_some() {
        anyhow::bail!(
            "API key file {}: a key has the admin token as its secret; give it its own",
            path.display()
        );
    }
    warn_if_readable_by_others(path);
    tracing::info!(
        keys = keys.len(),
        names = %keys.names().collect::<Vec<_>>().join(","),
        "API keys loaded: the lock API needs Authorization: Bearer <key>"
    );
    Ok(keys)
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let shared = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0);
    if shared {
        tracing::warn!(
            path = %path.display(),
            "the API key file is readable by other users; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_: &std::path::Path) {}

fn scheme(url: &str) -> &str {
    url.split(':').next().unwrap_or("database")
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

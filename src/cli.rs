//! Command-line interface of the `palisade` binary.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::app::Config;
use crate::http::server::ClientTimeouts;
use crate::metrics::{MetricsConfig, ResourceGroupConfig};
use crate::retention::RetentionConfig;
use crate::store::GroupCommitConfig;

#[derive(Debug, Parser)]
#[command(
    name = "palisade",
    version,
    about = "A lock service with fencing tokens",
    after_help = "Client commands exit with 0 ok, 1 other failure, 2 usage or invalid input, 3 held, \
                  4 stale or unknown token, 5 not found, 6 lease not active, 7 server unavailable, \
                  8 unauthorized or forbidden; `run` exits with its command's status (see docs/cli.md)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Rewrite a SQLite database file with another page size (stop the server first).
    Repack(RepackArgs),
    /// Run the torture test: real processes, injected faults, a checked history.
    Torture(crate::torture::TortureArgs),
    /// One worker process of the torture test (started by `torture`).
    #[command(hide = true)]
    TortureWorker(crate::torture::worker::WorkerArgs),
    #[cfg(feature = "client")]
    #[command(flatten)]
    Client(crate::commands::ClientCommand),
    /// Drive a running server with concurrent clients and report its speed.
    Bench(crate::bench::BenchArgs),
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// `sqlite://PATH` (created if missing) or `postgres://…`.
    #[arg(
        long,
        env = "PALISADE_DATABASE_URL",
        default_value = "sqlite://palisade.db"
    )]
    pub database_url: String,
}

#[derive(Debug, Args)]
pub struct RepackArgs {
    /// `sqlite://PATH` of an existing Palisade database (never created).
    #[arg(
        long,
        env = "PALISADE_DATABASE_URL",
        default_value = "sqlite://palisade.db"
    )]
    pub database_url: String,
    /// Page size in bytes, a power of two from 512 to 65536 (new databases get 1024).
    #[arg(long, default_value_t = crate::store::sqlite::NEW_DATABASE_PAGE_SIZE)]
    pub page_size: u32,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "PALISADE_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: String,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Token for admin actions; a random one is generated and logged if unset.
    #[arg(long, env = "PALISADE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Longest TTL a lease may ask for, in milliseconds.
    #[arg(long, env = "PALISADE_MAX_TTL_MS", default_value_t = 86_400_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub max_ttl_ms: u64,
    /// How often the expiry sweeper looks for leases past their deadline.
    #[arg(long, env = "PALISADE_SWEEP_INTERVAL_MS", default_value_t = 250, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub sweep_interval_ms: u64,
    /// Token that protects reading the web UI. Without it the UI is open on
    /// a loopback address and needs a sign-in (admin token) elsewhere.
    #[arg(long, env = "PALISADE_UI_TOKEN", hide_env_values = true)]
    pub ui_token: Option<String>,
    /// Also run simulated workers so the UI has something to show.
    #[arg(long)]
    pub demo: bool,
    /// Requests per second allowed per client IP address; 0 turns the limit off.
    #[arg(long, env = "PALISADE_RATE_LIMIT_PER_SEC", default_value_t = 0)]
    pub rate_limit_per_sec: u32,
    /// Requests a client may send at once before the per-second rate applies.
    #[arg(long, env = "PALISADE_RATE_LIMIT_BURST", default_value_t = 0)]
    pub rate_limit_burst: u32,
    /// Acquires that may wait for a held resource at once in this instance;
    /// beyond that, waiting acquires get 503 `overloaded`.
    #[arg(long, env = "PALISADE_MAX_WAITERS", default_value_t = 10_000)]
    pub max_waiters: usize,
    /// How often the database-backed gauges (active leases, database up)
    /// are refreshed; a scrape itself never queries the database.
    #[arg(long, env = "PALISADE_METRICS_REFRESH_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub metrics_refresh_ms: u64,
    /// Add a `resource_group` label (the resource name up to the separator)
    /// to the stale-write and expiry counters.
    #[arg(long, env = "PALISADE_METRICS_RESOURCE_GROUPS")]
    pub metrics_resource_groups: bool,
    /// Where a resource name's group prefix ends.
    #[arg(
        long,
        env = "PALISADE_METRICS_RESOURCE_GROUP_SEPARATOR",
        default_value = "/"
    )]
    pub metrics_resource_group_separator: String,
    /// Distinct resource groups labelled per instance; later ones count as `other`.
    #[arg(long, env = "PALISADE_METRICS_MAX_RESOURCE_GROUPS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub metrics_max_resource_groups: u64,
    /// Events older than this many days are pruned; 0 keeps them forever.
    #[arg(long, env = "PALISADE_EVENT_RETENTION_DAYS", default_value_t = RetentionConfig::DEFAULT_DAYS)]
    pub event_retention_days: u32,
    /// Batch concurrent writes into shared transactions (group commit; on
    /// by default). Each request is still answered only after its batch
    /// commits. `--group-commit=false` runs one transaction per request.
    #[arg(long, env = "PALISADE_GROUP_COMMIT", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub group_commit: bool,
    /// Batch transactions in flight on PostgreSQL: one is formed and run
    /// while the others commit (SQLite always uses one).
    #[arg(long, env = "PALISADE_GROUP_COMMIT_WRITERS", default_value_t = GroupCommitConfig::DEFAULT.writers as u64, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub group_commit_writers: u64,
    /// Most requests in one batch.
    #[arg(long, env = "PALISADE_GROUP_COMMIT_MAX_BATCH", default_value_t = GroupCommitConfig::DEFAULT.max_batch as u64, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub group_commit_max_batch: u64,
    /// JSON file of client API keys, each limited to resource-name
    /// prefixes. With it, every lock, fence, value and event route needs
    /// `Authorization: Bearer <key>` (see docs/security.md).
    #[arg(long, env = "PALISADE_API_KEYS_FILE")]
    pub api_keys_file: Option<std::path::PathBuf>,
    /// How long a client may take to send a request's head; also how long
    /// an idle keep-alive connection stays open (keep it above a load
    /// balancer's idle timeout).
    #[arg(long, env = "PALISADE_REQUEST_HEADER_TIMEOUT_MS", default_value_t = 75_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub request_header_timeout_ms: u64,
    /// How long a client may take to send a request's body once the head
    /// has arrived; slower bodies get 408 `request_timeout`.
    #[arg(long, env = "PALISADE_REQUEST_BODY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub request_body_timeout_ms: u64,
}

impl ServeArgs {
    pub fn into_config(self) -> Config {
        Config {
            listen: self.listen,
            database_url: self.database.database_url,
            admin_token: self.admin_token,
            max_ttl: Duration::from_millis(self.max_ttl_ms),
            sweep_interval: Duration::from_millis(self.sweep_interval_ms),
            ui_token: self.ui_token,
            demo: self.demo,
            rate_limit_per_sec: self.rate_limit_per_sec,
            rate_limit_burst: self.rate_limit_burst,
            max_waiters: self.max_waiters,
            metrics: MetricsConfig {
                resource_groups: self.metrics_resource_groups.then(|| ResourceGroupConfig {
                    separator: self.metrics_resource_group_separator,
                    max_groups: usize::try_from(self.metrics_max_resource_groups)
                        .unwrap_or(usize::MAX),
                }),
            },
            metrics_refresh: Duration::from_millis(self.metrics_refresh_ms),
            event_retention: (self.event_retention_days > 0).then(|| {
                RetentionConfig::with_max_age(Duration::from_secs(
                    u64::from(self.event_retention_days) * 86_400,
                ))
            }),
            group_commit: self.group_commit.then(|| GroupCommitConfig {
                writers: usize::try_from(self.group_commit_writers).unwrap_or(1),
                max_batch: usize::try_from(self.group_commit_max_batch).unwrap_or(1),
            }),
            api_keys_file: self.api_keys_file,
            client_timeouts: ClientTimeouts {
                header: Duration::from_millis(self.request_header_timeout_ms),
                body: Duration::from_millis(self.request_body_timeout_ms),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Config {
        let cli = Cli::try_parse_from(["palisade", "serve"].iter().chain(args)).unwrap();
        match cli.command {
            Command::Serve(args) => args.into_config(),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn metrics_and_retention_defaults() {
        let config = serve(&[]);
        assert_eq!(config.metrics.resource_groups, None);
        assert_eq!(config.metrics_refresh, Duration::from_secs(2));
        let retention = config.event_retention.unwrap();
        assert_eq!(retention.max_age, Duration::from_secs(30 * 86_400));
        assert_eq!(config.api_keys_file, None, "keys are off by default");
        assert_eq!(config.client_timeouts, ClientTimeouts::default());
    }

    #[test]
    fn key_file_and_client_timeout_flags() {
        let config = serve(&[
            "--api-keys-file",
            "/etc/palisade/keys.json",
            "--request-header-timeout-ms",
            "2000",
            "--request-body-timeout-ms",
            "5000",
        ]);
        assert_eq!(
            config.api_keys_file.as_deref(),
            Some(std::path::Path::new("/etc/palisade/keys.json"))
        );
        assert_eq!(
            config.client_timeouts,
            ClientTimeouts {
                header: Duration::from_secs(2),
                body: Duration::from_secs(5),
            }
        );
    }

    #[test]
    fn resource_groups_and_retention_flags() {
        let config = serve(&[
            "--metrics-resource-groups",
            "--metrics-resource-group-separator",
            "::",
            "--metrics-max-resource-groups",
            "7",
            "--event-retention-days",
            "0",
        ]);
        assert_eq!(
            config.metrics.resource_groups,
            Some(ResourceGroupConfig {
                separator: "::".into(),
                max_groups: 7,
            })
        );
        assert_eq!(config.event_retention, None, "0 keeps events forever");
        let zero_groups =
            Cli::try_parse_from(["palisade", "serve", "--metrics-max-resource-groups", "0"]);
        assert!(zero_groups.is_err(), "at least one group");
    }
}

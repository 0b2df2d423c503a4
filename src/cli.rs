//! Command-line interface of the `palisade` binary.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::app::Config;
use crate::metrics::{MetricsConfig, ResourceGroupConfig};
use crate::retention::RetentionConfig;
use crate::store::GroupCommitConfig;

#[derive(Debug, Parser)]
#[command(
    name = "palisade",
    version,
    about = "A lock service with fencing tokens"
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
    /// Experimental: batch concurrent writes into shared transactions
    /// (group commit). Each request is still answered only after its
    /// batch commits.
    #[arg(long, env = "PALISADE_GROUP_COMMIT")]
    pub group_commit: bool,
    /// Concurrent batch transactions on PostgreSQL (SQLite always uses one).
    #[arg(long, env = "PALISADE_GROUP_COMMIT_WRITERS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub group_commit_writers: u64,
    /// Most requests in one batch.
    #[arg(long, env = "PALISADE_GROUP_COMMIT_MAX_BATCH", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub group_commit_max_batch: u64,
}

impl ServeArgs {
    pub fn into_config(self) -> Config {
        Config {
            listen: self.listen,
            database_url: self.database.database_url,
            admin_token: self.admin_token,
            max_ttl: Duration::from_millis(self.max_ttl_ms),
            sweep_interval: Duration::from_millis(self.sweep_interval_ms),
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
        }
    }
}

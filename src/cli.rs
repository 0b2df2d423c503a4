//! Command-line interface of the `palisade` binary.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::app::Config;

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
    /// Run the torture test: real processes, injected faults, a checked history.
    Torture(crate::torture::TortureArgs),
    /// One worker process of the torture test (started by `torture`).
    #[command(hide = true)]
    TortureWorker(crate::torture::worker::WorkerArgs),
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
        }
    }
}

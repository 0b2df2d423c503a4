//! `palisade lock acquire|renew|release|status`: one-shot lock commands for
//! scripts that manage the lease id themselves. Nothing renews a lease taken
//! with `lock acquire`; `palisade run` does that for you.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::{Connection, ExitCode, default_holder, fail};
use crate::client::AcquireOptions;

#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Take a lock; prints the token and the lease id (a secret: keep it).
    Acquire(AcquireArgs),
    /// Extend a lease.
    Renew(RenewArgs),
    /// Release a lease.
    Release(LeaseArgs),
    /// Show who holds a resource and its token counters.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The resource to lock, for example `reports/daily`.
    pub resource: String,
    /// Lease time-to-live (`30s`, `500ms`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long to wait for a held lock before giving up (at most 60s).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Who is asking (default: host:pid).
    #[arg(long)]
    pub holder: Option<String>,
    /// Idempotency key: the same key while the lease lives returns the same lease.
    #[arg(long)]
    pub request_id: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// The lease id printed by `lock acquire` (or set PALISADE_LEASE_ID, which
    /// keeps it out of the process list).
    #[arg(env = "PALISADE_LEASE_ID", hide_env_values = true)]
    pub lease_id: String,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// New time-to-live from now (default: the lease's own TTL).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub resource: String,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn execute(command: LockCommand) -> i32 {
    match command {
        LockCommand::Acquire(args) => acquire(args).await,
        LockCommand::Renew(args) => renew(args).await,
        LockCommand::Release(args) => release(args).await,
        LockCommand::Status(args) => status(args).await,
    }
}

async fn acquire(args: AcquireArgs) -> i32 {
    let client = match args.connection.client(None) {
        Ok(client) => client,
        Err(err) => return fail(&err),
    };
    let options = AcquireOptions {
        holder: args.holder.unwrap_or_else(default_holder),
        ttl: args.ttl,
        wait: args.wait,
        request_id: args.request_id,
    };
    match client.acquire_lease(&args.resource, options).await {
        Ok(lease) => {
            args.connection.output().lease("acquired", &lease);
            ExitCode::Ok.code()
        }
        Err(err) => fail(&err),
    }
}

async fn renew(args: RenewArgs) -> i32 {
    let connection = &args.lease.connection;
    let result = match connection.client(None) {
        Ok(client) => client.renew(&args.lease.lease_id, args.ttl).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(lease) => {
            connection.output().lease("renewed", &lease);
            ExitCode::Ok.code()
        }
        Err(err) => fail(&err),
    }
}

async fn release(args: LeaseArgs) -> i32 {
    let result = match args.connection.client(None) {
        Ok(client) => client.release(&args.lease_id).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(lease) => {
            args.connection.output().lease("released", &lease);
            ExitCode::Ok.code()
        }
        Err(err) => fail(&err),
    }
}

async fn status(args: StatusArgs) -> i32 {
    let result = match args.connection.client(None) {
        Ok(client) => client.resource(&args.resource).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(Some(info)) => {
            args.connection.output().resource(&info);
            ExitCode::Ok.code()
        }
        Ok(None) => {
            eprintln!("palisade: resource {:?} has never been used", args.resource);
            ExitCode::NotFound.code()
        }
        Err(err) => fail(&err),
    }
}

//! `palisade run`: run a command while holding a lock.
//!
//! Acquire, start the command with `PALISADE_RESOURCE`, `PALISADE_TOKEN` and
//! `PALISADE_SERVER` in its environment, renew while it runs, and release
//! when it exits. The lease id stays with `palisade run`: the command gets
//! only what it needs to fence its writes, so it can neither release nor
//! renew the lease behind the supervisor's back.
//!
//! The command runs in its own process group, so a shell pipeline is
//! signalled as a whole; SIGINT, SIGTERM and SIGHUP sent to `palisade run`
//! are passed on to that group.

use std::io::ErrorKind;
use std::process::ExitStatus;
use std::time::Duration;

use clap::{Args, ValueEnum};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use super::{Connection, ExitCode, default_holder, fail};
use crate::client::AcquireOptions;

/// What to do with the command when the lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLost {
    /// SIGTERM the command, then SIGKILL it after --grace.
    Term,
    /// Print a warning and let the command finish (its fenced writes will
    /// be refused).
    Warn,
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// The resource to lock.
    #[arg(long)]
    pub resource: String,
    /// Lease time-to-live; renewed every third of it while the command runs.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long to wait for a held lock before giving up (at most 60s).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Who is asking (default: host:pid).
    #[arg(long)]
    pub holder: Option<String>,
    /// What to do when the lease is lost while the command runs.
    #[arg(long, value_enum, default_value_t = OnLost::Term)]
    pub on_lost: OnLost,
    /// With --on-lost term: how long after SIGTERM to send SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    #[command(flatten)]
    pub connection: Connection,
    /// The command and its arguments (after `--`).
    #[arg(required = true, num_args = 1.., value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Shells' conventions for a command that cannot run.
const CANNOT_EXECUTE: i32 = 126;
const COMMAND_NOT_FOUND: i32 = 127;

pub async fn execute(args: RunArgs) -> i32 {
    let client = match args.connection.client(None) {
        Ok(client) => client,
        Err(err) => return fail(&err),
    };
    let options = AcquireOptions {
        holder: args.holder.clone().unwrap_or_else(default_holder),
        ttl: args.ttl,
        wait: args.wait,
        request_id: None,
    };
    // Installed before acquiring: a signal that arrives once the lease is
    // held but before the command is running is queued, then passed on to
    // the command, instead of killing `palisade run` with its lock held
    // (and, with the command already started, leaving it running).
    let (mut interrupt, mut terminate, mut hangup) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(i), Ok(t), Ok(h)) => (i, t, h),
        _ => {
            eprintln!("palisade: cannot install signal handlers; not running the command");
            return ExitCode::Failure.code();
        }
    };
    // A signal while waiting for the lock ends the wait, as it would
    // without handlers (a lease granted meanwhile is left to expire).
    let acquired = tokio::select! {
        acquired = client.acquire(&args.resource, options) => acquired,
        _ = interrupt.recv() => return 128 + Signal::SIGINT as i32,
        _ = terminate.recv() => return 128 + Signal::SIGTERM as i32,
        _ = hangup.recv() => return 128 + Signal::SIGHUP as i32,
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(err) => return fail(&err),
    };
    let (program, program_args) = match args.command.split_first() {
        Some(split) => split,
        None => return ExitCode::Usage.code(),
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(program_args)
        .env("PALISADE_RESOURCE", lease.resource())
        .env("PALISADE_TOKEN", lease.token().to_string())
        .env("PALISADE_SERVER", client.base_url())
        // A lease id in our own environment must not leak to the command.
        .env_remove("PALISADE_LEASE_ID")
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("palisade: cannot run {program:?}: {err}");
            if let Err(err) = lease.release().await {
                eprintln!("palisade: releasing the lease failed: {err}");
            }
            return if err.kind() == ErrorKind::NotFound {
                COMMAND_NOT_FOUND
            } else {
                CANNOT_EXECUTE
            };
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let signal_group = |sig: Signal| {
        if let Some(group) = group {
            // The group may already be gone; nothing to do then.
            let _ = killpg(group, sig);
        }
    };

    let mut loss_seen = false;
    let mut kill_at: Option<Instant> = None;
    let status: std::io::Result<ExitStatus> = loop {
        tokio::select! {
            status = child.wait() => break status,
            reason = lease.lost(), if !loss_seen => {
                loss_seen = true;
                eprintln!("palisade: lost the lease on {:?}: {reason}", lease.resource());
                match args.on_lost {
                    OnLost::Term => {
                        eprintln!("palisade: sending SIGTERM to the command (SIGKILL in {})",
                            humantime::format_duration(args.grace));
                        signal_group(Signal::SIGTERM);
                        kill_at = Some(Instant::now() + args.grace);
                    }
                    OnLost::Warn => eprintln!(
                        "palisade: the command keeps running; writes with token {} will be refused",
                        lease.token()
                    ),
                }
            }
            () = sleep_until(kill_at), if kill_at.is_some() => {
                eprintln!("palisade: the command outlived its grace period; sending SIGKILL");
                signal_group(Signal::SIGKILL);
                kill_at = None;
            }
            _ = interrupt.recv() => signal_group(Signal::SIGINT),
            _ = terminate.recv() => signal_group(Signal::SIGTERM),
            _ = hangup.recv() => signal_group(Signal::SIGHUP),
        }
    };

    if lease.is_lost() {
        drop(lease);
    } else if let Err(err) = lease.release().await {
        eprintln!("palisade: releasing the lease failed (it will expire): {err}");
    }
    match status {
        Ok(status) => exit_code_of(status),
        Err(err) => {
            eprintln!("palisade: lost track of the command: {err}");
            ExitCode::Failure.code()
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The command's exit code, or 128 + the signal that killed it (as shells do).
fn exit_code_of(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => ExitCode::Failure.code(),
    }
}

//! The `palisade` subcommands that talk to a running server through
//! [`crate::client`]: `lock`, `fence`, `value`, `events`, `admin` and `run`.
//!
//! Each returns a process exit code; the codes are documented on
//! [`ExitCode`] and in `docs/cli.md`.

mod data;
mod lock;
mod output;
mod run;

use std::time::Duration;

use clap::{Args, Subcommand};

use crate::client::{Client, Error};
use output::Output;

pub use data::{AdminCommand, EventsArgs, FenceArgs, ValueCommand};
pub use lock::LockCommand;
pub use run::{OnLost, RunArgs};

/// Exit codes of the client subcommands. `run` exits with its command's
/// status instead, once the command has started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    Ok = 0,
    /// Anything else: a server error, an unreadable answer, a local I/O error.
    Failure = 1,
    /// Bad command line (clap's own code) or input the server refused as invalid.
    Usage = 2,
    /// `lock_held`: somebody else holds the lock.
    Held = 3,
    /// `stale_token` or `unknown_token`: the token may not write.
    Stale = 4,
    /// No such lease, resource or value.
    NotFound = 5,
    /// `lease_not_active` or `lock_not_held`: the lease has ended.
    NotActive = 6,
    /// The server is unreachable, timed out or unavailable.
    Unavailable = 7,
    /// `unauthorized` or `forbidden`: a missing or wrong admin token or API
    /// key, or an API key that does not cover the resource.
    Unauthorized = 8,
}

impl ExitCode {
    pub fn of(err: &Error) -> ExitCode {
        match err {
            Error::Held { .. } => ExitCode::Held,
            Error::StaleToken { .. } | Error::UnknownToken { .. } => ExitCode::Stale,
            Error::NotFound { .. } => ExitCode::NotFound,
            Error::LeaseNotActive { .. } | Error::NotHeld { .. } => ExitCode::NotActive,
            Error::InvalidInput { .. } => ExitCode::Usage,
            Error::Unavailable { .. } | Error::Transport(_) => ExitCode::Unavailable,
            Error::Unauthorized { .. } | Error::Forbidden { .. } => ExitCode::Unauthorized,
            _ => ExitCode::Failure,
        }
    }

    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Where the server is and how to print; shared by every client subcommand.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the Palisade server.
    #[arg(long, env = "PALISADE_SERVER", default_value = "http://127.0.0.1:7070")]
    pub server: String,
    /// Print JSON (one document, or one per line when following) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Timeout of one request (an acquire's --wait is added to it).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Client API key, for a server started with --api-keys-file.
    #[arg(long, env = "PALISADE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl Connection {
    fn client(&self, bearer: Option<&str>) -> Result<Client, Error> {
        let builder = Client::builder(&self.server)
            .timeout(self.timeout)
            .user_agent(format!("palisade-cli/{}", env!("CARGO_PKG_VERSION")));
        let builder = match &self.api_key {
            Some(key) => builder.api_key(key),
            None => builder,
        };
        match bearer {
            Some(token) => builder.bearer_token(token),
            None => builder,
        }
        .build()
    }

    fn output(&self) -> Output {
        Output { json: self.json }
    }
}

/// The client subcommands, flattened into the binary's command list.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Take, renew, release or inspect a lock.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Ask the fence whether a token may write now (exit 4 if not).
    Fence(FenceArgs),
    /// Read or write the built-in fenced value store.
    #[command(subcommand)]
    Value(ValueCommand),
    /// List (or follow) the event log.
    Events(EventsArgs),
    /// Admin actions (need the admin token).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Run a command while holding a lock, renewing it until the command exits.
    Run(RunArgs),
}

/// Runs a client subcommand and returns the process exit code.
pub async fn execute(command: ClientCommand) -> i32 {
    match command {
        ClientCommand::Lock(cmd) => lock::execute(cmd).await,
        ClientCommand::Fence(args) => data::fence(args).await,
        ClientCommand::Value(cmd) => data::value(cmd).await,
        ClientCommand::Events(args) => data::events(args).await,
        ClientCommand::Admin(cmd) => data::admin(cmd).await,
        ClientCommand::Run(args) => run::execute(args).await,
    }
}

/// Prints an error to stderr and picks its exit code.
fn fail(err: &Error) -> i32 {
    eprintln!("palisade: {err}");
    ExitCode::of(err).code()
}

/// `host:pid`, a holder name that says where a lock is held.
fn default_holder() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::error::ErrorCode;

    #[test]
    fn exit_codes_follow_the_error_family() {
        let held = Error::from_code(ErrorCode::LockHeld);
        assert_eq!(ExitCode::of(&held), ExitCode::Held);
        assert_eq!(ExitCode::Held.code(), 3);
        assert_eq!(
            ExitCode::of(&Error::from_code(ErrorCode::StaleToken)).code(),
            4
        );
        assert_eq!(
            ExitCode::of(&Error::from_code(ErrorCode::UnknownToken)).code(),
            4
        );
        assert_eq!(
            ExitCode::of(&Error::from_code(ErrorCode::InvalidTtl)).code(),
            2
        );
        assert_eq!(
            ExitCode::of(&Error::from_code(ErrorCode::ShuttingDown)).code(),
            7
        );
        assert_eq!(
            ExitCode::of(&Error::from_code(ErrorCode::Internal)).code(),
            1
        );
        assert_eq!(
            ExitCode::of(&Error::from_code(ErrorCode::Forbidden)).code(),
            8
        );
    }
}

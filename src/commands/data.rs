//! `palisade fence`, `value get|put`, `events [--follow]` and
//! `admin force-release`.

use std::io::Read;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{Connection, ExitCode, fail};
use crate::client::{EventFilter, EventKind};

#[derive(Debug, Args)]
pub struct FenceArgs {
    pub resource: String,
    /// The fencing token to check (for example $PALISADE_TOKEN).
    pub token: i64,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Subcommand)]
pub enum ValueCommand {
    /// Print the stored value (the JSON value alone with --json).
    Get(ValueGetArgs),
    /// Write a JSON value, fenced by a token.
    Put(ValuePutArgs),
}

#[derive(Debug, Args)]
pub struct ValueGetArgs {
    pub resource: String,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Args)]
pub struct ValuePutArgs {
    pub resource: String,
    /// The JSON value, or `-` to read it from standard input.
    pub value: String,
    /// The fencing token of the lease this write belongs to.
    #[arg(long, env = "PALISADE_TOKEN")]
    pub token: i64,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events of this resource.
    #[arg(long)]
    pub resource: Option<String>,
    /// Only events of this kind (acquired, renewed, released, expired,
    /// force_released, write_accepted, write_rejected).
    #[arg(long)]
    pub kind: Option<EventKind>,
    /// Only events after this id.
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// Events per request (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Keep printing new events as they are recorded, until interrupted.
    #[arg(long)]
    pub follow: bool,
    /// How often --follow asks for new events.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// End a resource's live lease now. Its holder's renewals and writes
    /// are refused from then on.
    ForceRelease(ForceReleaseArgs),
}

#[derive(Debug, Args)]
pub struct ForceReleaseArgs {
    pub resource: String,
    /// Why (recorded in the event log).
    #[arg(long)]
    pub reason: String,
    /// The server's admin token.
    #[arg(long, env = "PALISADE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: String,
    #[command(flatten)]
    pub connection: Connection,
}

pub async fn fence(args: FenceArgs) -> i32 {
    let result = match args.connection.client(None) {
        Ok(client) => client.fence(&args.resource, args.token).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(accepted) => {
            if args.connection.json {
                args.connection.output().json(&accepted);
            } else {
                println!(
                    "token {} may write to {} (accepted token {})",
                    accepted.token, args.resource, accepted.accepted_token
                );
            }
            ExitCode::Ok.code()
        }
        Err(err) => fail(&err),
    }
}

pub async fn value(command: ValueCommand) -> i32 {
    match command {
        ValueCommand::Get(args) => value_get(args).await,
        ValueCommand::Put(args) => value_put(args).await,
    }
}

async fn value_get(args: ValueGetArgs) -> i32 {
    let result = match args.connection.client(None) {
        Ok(client) => client.read_value::<serde_json::Value>(&args.resource).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(Some(stored)) => {
            if args.connection.json {
                args.connection.output().json(&stored);
            } else {
                println!("{}", stored.value);
                eprintln!(
                    "(version {}, written with token {} at {})",
                    stored.version, stored.token, stored.updated_at
                );
            }
            ExitCode::Ok.code()
        }
        Ok(None) => {
            eprintln!("palisade: no value has been written to {:?}", args.resource);
            ExitCode::NotFound.code()
        }
        Err(err) => fail(&err),
    }
}

async fn value_put(args: ValuePutArgs) -> i32 {
    let text = if args.value == "-" {
        let mut text = String::new();
        if let Err(err) = std::io::stdin().read_to_string(&mut text) {
            eprintln!("palisade: cannot read the value from standard input: {err}");
            return ExitCode::Failure.code();
        }
        text
    } else {
        args.value.clone()
    };
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(err) => {
            eprintln!("palisade: the value is not JSON ({err}); quote strings: '\"text\"'");
            return ExitCode::Usage.code();
        }
    };
    let result = match args.connection.client(None) {
        Ok(client) => client.write_value(&args.resource, args.token, &value).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(receipt) => {
            if args.connection.json {
                args.connection.output().json(&receipt);
            } else {
                println!(
                    "wrote {} version {} with token {}",
                    receipt.resource, receipt.version, receipt.token
                );
            }
            ExitCode::Ok.code()
        }
        Err(err) => fail(&err),
    }
}

pub async fn events(args: EventsArgs) -> i32 {
    let client = match args.connection.client(None) {
        Ok(client) => client,
        Err(err) => return fail(&err),
    };
    let output = args.connection.output();
    let mut filter = EventFilter {
        resource: args.resource.clone(),
        kind: args.kind,
        after: Some(args.after),
        limit: Some(args.limit),
    };
    if !args.follow {
        return match client.events(&filter).await {
            Ok(page) if args.connection.json => {
                output.json(&page);
                ExitCode::Ok.code()
            }
            Ok(page) => {
                page.events.iter().for_each(|e| output.event(e));
                ExitCode::Ok.code()
            }
            Err(err) => fail(&err),
        };
    }
    // Following: one event per line (JSON lines with --json) until Ctrl-C.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        match client.events(&filter).await {
            Ok(page) => {
                page.events.iter().for_each(|e| output.event(e));
                filter.after = Some(page.next_after);
                if page.events.len() == args.limit as usize {
                    continue; // more are waiting: no pause
                }
            }
            // The client already retried; keep following through an outage.
            Err(err) if err.is_retryable() => eprintln!("palisade: {err}; still following"),
            Err(err) => return fail(&err),
        }
        tokio::select! {
            _ = &mut interrupted => return ExitCode::Ok.code(),
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}

pub async fn admin(command: AdminCommand) -> i32 {
    let AdminCommand::ForceRelease(args) = command;
    let result = match args.connection.client(Some(&args.admin_token)) {
        Ok(client) => client.force_release(&args.resource, &args.reason).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(lease) => {
            args.connection.output().lease("force-released", &lease);
            ExitCode::Ok.code()
        }
        Err(err) => fail(&err),
    }
}

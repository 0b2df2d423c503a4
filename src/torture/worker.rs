//! A torture worker process: loops acquire → maybe renew → work (often
//! pausing past the TTL) → fenced write with a unique payload → release,
//! logging every operation to its history file.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::history::{Entry, HistoryWriter, Phase};

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Comma-separated base URLs of the Palisade instances.
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    #[arg(long)]
    pub name: String,
    #[arg(long, default_value_t = 4)]
    pub resources: usize,
    #[arg(long, default_value_t = 400)]
    pub ttl_ms: u64,
    #[arg(long)]
    pub duration_ms: u64,
    #[arg(long)]
    pub history: PathBuf,
}

enum Reply {
    Ok(Value),
    /// A definite refusal: the operation did not happen.
    Refused(String),
    /// Timeout, lost connection or a 5xx: it may have happened.
    Unknown(String),
}

async fn call(req: reqwest::RequestBuilder) -> Reply {
    match req.send().await {
        Ok(res) => {
            let status = res.status();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
            if status.is_success() {
                Reply::Ok(body)
            } else if status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT {
                Reply::Refused(code)
            } else {
                Reply::Unknown(format!("{status} {code}"))
            }
        }
        Err(err) => Reply::Unknown(err.to_string()),
    }
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let mut history = HistoryWriter::create(&args.history)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()?;
    let deadline = Instant::now() + Duration::from_millis(args.duration_ms);
    let holder = args.name.clone();
    let mut seq = 0u64;
    while Instant::now() < deadline {
        let (resource, server, renew, stall, work_ms) = {
            let mut rng = rand::rng();
            (
                format!("torture-{}", rng.random_range(0..args.resources.max(1))),
                args.servers[rng.random_range(0..args.servers.len().max(1))].clone(),
                rng.random_bool(0.5),
                rng.random_bool(0.2),
                rng.random_range(0..args.ttl_ms / 3 + 1),
            )
        };
        let mut log = |mut e: Entry, fill: &dyn Fn(&mut Entry)| {
            fill(&mut e);
            let _ = history.log(&e);
        };
        let new = |op: &str, phase| Entry::new(&holder, op, phase, &resource);

        log(new("acquire", Phase::Invoke), &|_| {});
        let request_id = format!("{holder}-{seq}");
        let reply = call(client.post(format!("{server}/v1/resources/{resource}/acquire")).json(&json!({
            "holder": holder, "ttl_ms": args.ttl_ms, "wait_ms": 1000, "request_id": request_id,
        })))
        .await;
        let lease = match reply {
            Reply::Ok(lease) => {
                log(new("acquire", Phase::Ok), &|e| {
                    e.token = lease["token"].as_i64();
                    e.lease_id = lease["lease_id"].as_str().map(str::to_owned);
                    e.holder = lease["holder"].as_str().map(str::to_owned);
                });
                lease
            }
            Reply::Refused(code) => {
                log(new("acquire", Phase::Fail), &|e| {
                    e.error = Some(code.clone())
                });
                continue;
            }
            Reply::Unknown(err) => {
                log(new("acquire", Phase::Unknown), &|e| {
                    e.error = Some(err.clone())
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = lease["token"].as_i64();
        let lease_id = lease["lease_id"].as_str().unwrap_or_default().to_owned();

        if renew {
            log(new("renew", Phase::Invoke), &|e| e.token = token);
            match call(
                client
                    .post(format!("{server}/v1/leases/{lease_id}/renew"))
                    .json(&json!({})),
            )
            .await
            {
                Reply::Ok(l) => log(new("renew", Phase::Ok), &|e| {
                    e.token = token;
                    e.expires_at = l["expires_at"].as_str().map(str::to_owned);
                }),
                Reply::Refused(code) => {
                    log(new("renew", Phase::Fail), &|e| e.error = Some(code.clone()))
                }
                Reply::Unknown(err) => log(new("renew", Phase::Unknown), &|e| {
                    e.error = Some(err.clone())
                }),
            }
        }

        // Work; sometimes stall past the TTL like a paused process.
        let pause = if stall { args.ttl_ms * 3 / 2 } else { work_ms };
        tokio::time::sleep(Duration::from_millis(pause)).await;

        seq += 1;
        let payload = json!({"worker": holder, "seq": seq, "token": token});
        log(new("write", Phase::Invoke), &|e| {
            e.token = token;
            e.payload = Some(payload.clone());
        });
        match call(
            client
                .put(format!("{server}/v1/resources/{resource}/value"))
                .json(&json!({"token": token, "value": payload})),
        )
        .await
        {
            Reply::Ok(w) => log(new("write", Phase::Ok), &|e| {
                e.token = token;
                e.version = w["version"].as_i64();
                e.payload = Some(payload.clone());
            }),
            Reply::Refused(code) => log(new("write", Phase::Fail), &|e| {
                e.token = token;
                e.error = Some(code.clone());
            }),
            Reply::Unknown(err) => log(new("write", Phase::Unknown), &|e| {
                e.error = Some(err.clone())
            }),
        }

        log(new("release", Phase::Invoke), &|e| e.token = token);
        match call(client.post(format!("{server}/v1/leases/{lease_id}/release"))).await {
            Reply::Ok(_) => log(new("release", Phase::Ok), &|e| {
                e.token = token;
                e.lease_id = Some(lease_id.clone());
            }),
            Reply::Refused(code) => log(new("release", Phase::Fail), &|e| {
                e.error = Some(code.clone())
            }),
            Reply::Unknown(err) => log(new("release", Phase::Unknown), &|e| {
                e.error = Some(err.clone())
            }),
        }
    }
    Ok(())
}

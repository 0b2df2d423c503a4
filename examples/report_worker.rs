//! The daily-sales-report worker from the fencing-token story, done right.
//!
//! Several copies of this worker run on different machines; exactly one may
//! write the day's report at a time. A lock alone is not enough: a worker can
//! stall (a GC pause, a frozen VM, a swapped-out process) past its lease, wake
//! up and write over the report of the worker that took over. So the worker
//! writes *with its fencing token*, and the store refuses a stale one.
//!
//! Start a server (`cargo run -- serve`), then:
//!
//! ```text
//! cargo run --example report_worker                       # a normal run
//! cargo run --example report_worker -- --pause 3s         # a worker that stalls mid-job
//! cargo run --example report_worker -- --server http://127.0.0.1:7070 --holder w2
//! ```
//!
//! With `--pause` longer than the 2 s TTL the lease expires during the stall
//! and the late write is refused with `stale_token`. Run a second worker in
//! the meantime and it takes over with the next token.

use std::time::Duration;

use palisade::client::{AcquireOptions, Client, Error, Lease};
use serde::Serialize;

const RESOURCE: &str = "reports/daily-sales";
/// Short on purpose, so a stall is easy to provoke; the lease is renewed
/// every third of it while the worker runs normally.
const TTL: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize)]
struct DailySales {
    day: String,
    orders: u32,
    total_cents: u64,
    computed_by: String,
}

struct Options {
    server: String,
    holder: String,
    pause: Option<Duration>,
}

fn options() -> anyhow::Result<Options> {
    let mut options = Options {
        server: std::env::var("PALISADE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7070".into()),
        holder: format!("report-worker-{}", std::process::id()),
        pause: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--server" => options.server = value()?,
            "--holder" => options.holder = value()?,
            "--pause" => options.pause = Some(humantime::parse_duration(&value()?)?),
            other => anyhow::bail!("unknown argument {other:?} (try --server, --holder, --pause)"),
        }
    }
    Ok(options)
}

/// The expensive part: here, adding up a day of made-up orders slowly.
async fn compute_report(holder: &str) -> DailySales {
    let mut total_cents = 0;
    let orders = 50;
    for order in 0..orders {
        total_cents += 1_000 + u64::from(order) * 37;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    DailySales {
        day: chrono::Utc::now().date_naive().to_string(),
        orders,
        total_cents,
        computed_by: holder.to_owned(),
    }
}

// A current-thread runtime: when the worker blocks its only thread (the
// `--pause` below), the lease renewer cannot run either, just as in a real
// stop-the-world pause.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let options = options()?;
    let client = Client::new(&options.server)?;

    // Wait up to 30 s if another worker is on it.
    let lease = match client
        .acquire(
            RESOURCE,
            AcquireOptions::new(&options.holder, TTL).wait(Duration::from_secs(30)),
        )
        .await
    {
        Ok(lease) => lease,
        Err(Error::Held { holder, .. }) => {
            println!(
                "{} still holds {RESOURCE} (token {}); not running twice",
                holder.holder, holder.token
            );
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    println!(
        "{}: acquired {RESOURCE} with token {}",
        options.holder,
        lease.token()
    );

    // Stop early if the lease is lost while computing: the work would be
    // refused anyway.
    let report = tokio::select! {
        report = compute_report(&options.holder) => report,
        reason = lease.lost() => {
            println!("lost the lease while computing ({reason}); giving up");
            return Ok(());
        }
    };

    if let Some(pause) = options.pause {
        println!(
            "stalling for {} (think: a long GC pause)",
            humantime::format_duration(pause)
        );
        // Deliberately blocking: freezes the renewer too.
        std::thread::sleep(pause);
    }

    write_report(&client, lease, &report).await
}

/// The write carries the token, so the store, not the worker's belief about
/// its lease, decides. After a stall the worker cannot know it lost the
/// lease; the server can.
async fn write_report(client: &Client, lease: Lease, report: &DailySales) -> anyhow::Result<()> {
    match client.write_value(RESOURCE, lease.token(), report).await {
        Ok(receipt) => {
            println!(
                "report written with token {} (version {})",
                receipt.token, receipt.version
            );
            lease.release().await?;
            Ok(())
        }
        Err(Error::StaleToken {
            token,
            accepted_token,
            lease_state,
            ..
        }) => {
            // Not retried: the lease is gone and someone else may own the
            // report now. Acquire again if the report still needs writing.
            println!(
                "write refused: token {token} is stale (lease {}, accepted token {accepted_token}); \
                 the report was not overwritten",
                lease_state.map_or_else(|| "ended".to_owned(), |s| s.to_string())
            );
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}

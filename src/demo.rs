//! `palisade serve --demo`: simulated workers inside the server process so a
//! newcomer sees living timelines within seconds. Workers take short leases,
//! renew, write through the fenced store, and now and then stall past their
//! TTL so their late write is rejected as stale; one lock is left stuck for
//! an admin to force-release. Everything stops on shutdown.

use std::time::Duration;

use rand::Rng;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::domain::{Holder, ResourceName, Ttl, WaitTime};
use crate::service::LockService;
use crate::store::{AcquireOutcome, AcquireRequest, FenceOutcome, ValueWrite};

/// Resources the workers compete for.
const RESOURCES: [&str; 4] = [
    "billing/invoice-run",
    "reports/daily",
    "search/reindex",
    "payments/ledger",
];
/// The lock nobody releases: a crashed cron host that needs an admin.
const STUCK_RESOURCE: &str = "legacy/nightly-export";
const WORKERS: usize = 6;

/// Runs the demo workers until `stop` is cancelled.
pub async fn run(service: LockService, stop: CancellationToken) {
    tracing::info!(
        workers = WORKERS,
        "demo: starting simulated workers (open the UI to watch them)"
    );
    let mut tasks = JoinSet::new();
    tasks.spawn(hold_stuck_lock(service.clone(), stop.clone()));
    for n in 0..WORKERS {
        tasks.spawn(worker(service.clone(), n, stop.clone()));
    }
    while tasks.join_next().await.is_some() {}
    tracing::info!("demo: workers stopped");
}

/// Sleeps, or returns `false` at once when the demo must stop.
async fn pause(stop: &CancellationToken, ms: u64) -> bool {
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(ms)) => true,
        () = stop.cancelled() => false,
    }
}

fn name(text: &str) -> Option<ResourceName> {
    ResourceName::parse(text).ok()
}

async fn hold_stuck_lock(service: LockService, stop: CancellationToken) {
    let (Some(resource), Ok(holder), Ok(ttl), Ok(no_wait)) = (
        name(STUCK_RESOURCE),
        Holder::parse("cron-host-7 (crashed)"),
        Ttl::from_millis(3_600_000, service.limits().max_ttl),
        WaitTime::from_millis(0),
    ) else {
        return;
    };
    let request = AcquireRequest::new(resource, holder, ttl);
    match service.acquire(request, no_wait).await {
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "demo: cannot take the stuck lock"),
    }
    stop.cancelled().await;
}

async fn worker(service: LockService, n: usize, stop: CancellationToken) {
    let Ok(holder) = Holder::parse(format!("worker-{}", n + 1)) else {
        return;
    };
    // Stagger the start so the first seconds already look busy, not bursty.
    if !pause(&stop, 150 * n as u64).await {
        return;
    }
    let mut round: u64 = 0;
    while !stop.is_cancelled() {
        round += 1;
        let (pick, ttl_ms, stall, writes, think) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..RESOURCES.len()),
                rng.random_range(1_500..4_000_i64),
                rng.random_bool(0.18),
                rng.random_range(1..5_u32),
                rng.random_range(200..1_200_u64),
            )
        };
        let Some(resource) = name(RESOURCES[pick]) else {
            return;
        };
        if let Err(err) = one_round(
            &service, &stop, &resource, &holder, ttl_ms, stall, writes, round,
        )
        .await
        {
            tracing::debug!(error = %err, "demo: worker round failed");
        }
        if !pause(&stop, think).await {
            return;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn one_round(
    service: &LockService,
    stop: &CancellationToken,
    resource: &ResourceName,
    holder: &Holder,
    ttl_ms: i64,
    stall: bool,
    writes: u32,
    round: u64,
) -> anyhow::Result<()> {
    let ttl = Ttl::from_millis(ttl_ms, service.limits().max_ttl)?;
    let request = AcquireRequest::new(resource.clone(), holder.clone(), ttl);
    let lease_id = request.lease_id.clone();
    let acquired = service
        .acquire(request, WaitTime::from_millis(2_000)?)
        .await?;
    let lease = match acquired.outcome {
        AcquireOutcome::Granted { lease, .. } | AcquireOutcome::Existing(lease) => lease,
        AcquireOutcome::Held { .. } => return Ok(()),
    };
    let write = |i: u32| ValueWrite {
        json: format!(
            "{{\"by\":{},\"round\":{round},\"step\":{i}}}",
            serde_json::Value::from(holder.as_str())
        ),
    };
    for i in 0..writes {
        if !pause(stop, (ttl_ms as u64) / 3).await {
            return Ok(());
        }
        if stall && i + 1 == writes {
            // A GC pause / network partition: the lease runs out while this
            // worker is frozen, someone else takes over, and the late write
            // must bounce off the fence.
            if !pause(stop, ttl_ms as u64 + 1_500).await {
                return Ok(());
            }
            if let FenceOutcome::Rejected(_) =
                service.write_value(resource, lease.token, write(i)).await?
            {
                tracing::debug!(resource = %resource.as_str(), "demo: stale write rejected");
            }
            return Ok(());
        }
        service.write_value(resource, lease.token, write(i)).await?;
        service.renew(&lease_id, None).await?;
    }
    service.release(&lease_id).await?;
    Ok(())
}

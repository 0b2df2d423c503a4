//! The benchmark tool against a real server: every scenario completes
//! operations without errors (a check of the tool, never of speed).

use std::time::Duration;

use palisade::bench::{BenchArgs, Scenario, run};

use crate::on_both_backends;
use crate::support::{Backend, Harness};

fn args(server: &str, scenario: Scenario) -> BenchArgs {
    BenchArgs {
        server: server.to_owned(),
        scenario,
        clients: 4,
        duration: Duration::from_millis(700),
        resources: 50,
        wait_ms: 10_000,
        server_pid: None,
        json: false,
    }
}

async fn every_scenario_runs_cleanly(backend: Backend) {
    let h = Harness::start(&backend).await;
    for scenario in [
        Scenario::Cycle,
        Scenario::Acquire,
        Scenario::Hot,
        Scenario::Renew,
        Scenario::Write,
        Scenario::Stale,
        Scenario::Mixed,
    ] {
        let report = run(&args(&h.server.base, scenario))
            .await
            .expect("bench ran");
        assert!(report.ops > 0, "{scenario:?}: no operations\n{report}");
        assert_eq!(report.errors, 0, "{scenario:?}: errors\n{report}");
        assert!(report.latency.p50 > Duration::ZERO, "{report}");
        assert!(report.latency.p50 <= report.latency.p99, "{report}");
        assert!(report.latency.p99 <= report.latency.max, "{report}");
        // The server runs in this process, which the tool finds by its port.
        let memory = report.memory.expect("local server memory");
        assert_eq!(memory.pid, std::process::id());
        assert!(memory.end_bytes > 0);
        if scenario == Scenario::Hot {
            let fair = report.fairness.expect("hot reports fairness");
            assert!(fair.max_wait > Duration::ZERO);
            assert!(fair.jain > 0.0 && fair.jain <= 1.0, "{report}");
            assert_eq!(report.refused, 0, "a hot waiter timed out\n{report}");
        } else {
            assert!(report.fairness.is_none());
        }
        if scenario != Scenario::Acquire {
            assert_eq!(report.refused, 0, "{scenario:?}\n{report}");
        }
    }
    h.finish().await;
}

#[tokio::test]
async fn an_unreachable_server_is_an_error_not_a_report() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let result = run(&args(&format!("http://127.0.0.1:{port}"), Scenario::Write)).await;
    assert!(result.is_err(), "setup against a closed port must fail");
}

on_both_backends!(every_scenario_runs_cleanly);

//! The `palisade` binary's client commands, run as a user would run them,
//! against a real server.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use palisade::client::{Client, EventFilter, EventKind, LeaseState};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{Backend, Harness};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// The binary with a clean environment pointing at the test server.
fn command(h: &Harness, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("PALISADE_ADMIN_TOKEN")
        .env_remove("PALISADE_API_KEY")
        .env_remove("PALISADE_LEASE_ID")
        .env_remove("PALISADE_TOKEN")
        .env("PALISADE_SERVER", &h.server.base)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command finished within 60 s")
        .expect("the binary ran");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn palisade(h: &Harness, args: &[&str]) -> Run {
    output(command(h, args)).await
}

fn client(h: &Harness) -> Client {
    Client::new(&h.server.base).unwrap()
}

fn admin(h: &Harness) -> Client {
    Client::builder(&h.server.base)
        .bearer_token(&h.server.admin_token)
        .build()
        .unwrap()
}

/// Waits until someone holds `resource`; returns the holder's token.
async fn held_token(h: &Harness, resource: &str) -> i64 {
    let c = client(h);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(holder) = c.resource(resource).await.unwrap().and_then(|r| r.holder) {
            return holder.token;
        }
        assert!(Instant::now() < deadline, "{resource} was never acquired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `resource` as another holder, so `palisade run` finds it held.
async fn hold_as_other(c: &Client, resource: &str, ttl: Duration) -> palisade::client::Lease {
    c.acquire(
        resource,
        palisade::client::AcquireOptions::new("other", ttl),
    )
    .await
    .unwrap()
}

/// A file a command creates if it runs: its directory (kept alive by the
/// caller), its path, and the shell command that creates it.
fn run_marker() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    (dir, marker, touch)
}

async fn lock_commands_print_json_and_exit_with_documented_codes(backend: Backend) {
    let h = Harness::start(&backend).await;
    let acquired = palisade(
        &h,
        &[
            "lock", "acquire", "jobs/a", "--ttl", "30s", "--holder", "cli", "--json",
        ],
    )
    .await;
    assert_eq!(acquired.code, 0, "{}", acquired.stderr);
    let lease = acquired.json();
    assert_eq!(
        (lease["token"].clone(), lease["holder"].clone()),
        (json!(1), json!("cli"))
    );
    let lease_id = lease["lease_id"].as_str().unwrap().to_owned();

    let held = palisade(&h, &["lock", "acquire", "jobs/a", "--ttl", "1s"]).await;
    assert_eq!(held.code, 3, "held: {}", held.stderr);
    assert!(held.stderr.contains("held by cli"), "{}", held.stderr);

    let status = palisade(&h, &["lock", "status", "jobs/a", "--json"]).await;
    assert_eq!(status.code, 0);
    assert_eq!(status.json()["holder"]["holder"], "cli");
    assert!(!status.stdout.contains(&lease_id));
    let human = palisade(&h, &["lock", "status", "jobs/a"]).await;
    assert!(
        human.stdout.contains("held by cli with token 1"),
        "{}",
        human.stdout
    );

    // The lease id can come from the environment, out of the process list.
    let mut renew = command(&h, &["lock", "renew", "--ttl", "20s", "--json"]);
    renew.env("PALISADE_LEASE_ID", &lease_id);
    let renewed = output(renew).await;
    assert_eq!(renewed.code, 0, "{}", renewed.stderr);
    assert_eq!(renewed.json()["ttl_ms"], 20_000);

    let fence = palisade(&h, &["fence", "jobs/a", "1"]).await;
    assert_eq!(fence.code, 0, "{}", fence.stderr);
    let put = palisade(
        &h,
        &["value", "put", "jobs/a", "--token", "1", r#"{"rows": 3}"#],
    )
    .await;
    assert_eq!(put.code, 0, "{}", put.stderr);
    let get = palisade(&h, &["value", "get", "jobs/a", "--json"]).await;
    assert_eq!(get.json()["value"], json!({"rows": 3}));
    assert_eq!(get.json()["token"], 1);
    let not_json = palisade(&h, &["value", "put", "jobs/a", "--token", "1", "plain"]).await;
    assert_eq!(not_json.code, 2);

    let released = palisade(&h, &["lock", "release", &lease_id]).await;
    assert_eq!(released.code, 0, "{}", released.stderr);
    let again = palisade(&h, &["lock", "release", &lease_id]).await;
    assert_eq!(again.code, 0, "release is idempotent");
    let late = palisade(&h, &["lock", "renew", &lease_id]).await;
    assert_eq!(late.code, 6, "renewing a released lease: {}", late.stderr);

    // A new holder fences the old token out.
    assert_eq!(
        palisade(&h, &["lock", "acquire", "jobs/a", "--ttl", "30s"])
            .await
            .code,
        0
    );
    let stale = palisade(&h, &["fence", "jobs/a", "1"]).await;
    assert_eq!(stale.code, 4, "{}", stale.stderr);
    let stale_put = palisade(&h, &["value", "put", "jobs/a", "--token", "1", "0"]).await;
    assert_eq!(stale_put.code, 4, "{}", stale_put.stderr);
    assert_eq!(palisade(&h, &["fence", "jobs/a", "77"]).await.code, 4);

    assert_eq!(palisade(&h, &["lock", "status", "never"]).await.code, 5);
    assert_eq!(palisade(&h, &["value", "get", "never"]).await.code, 5);
    assert_eq!(
        palisade(&h, &["lock", "renew", &"0".repeat(32)]).await.code,
        5
    );
    assert_eq!(
        palisade(&h, &["lock", "acquire", "x", "--ttl", "10ms"])
            .await
            .code,
        2
    );
    assert_eq!(
        palisade(&h, &["lock", "acquire", "x", "--ttl", "ten"])
            .await
            .code,
        2
    );
    assert_eq!(palisade(&h, &["lock", "frobnicate"]).await.code, 2);

    let denied = palisade(
        &h,
        &[
            "admin",
            "force-release",
            "jobs/a",
            "--reason",
            "r",
            "--admin-token",
            "wrong",
        ],
    )
    .await;
    assert_eq!(denied.code, 8, "{}", denied.stderr);
    let mut force = command(
        &h,
        &[
            "admin",
            "force-release",
            "jobs/a",
            "--reason",
            "stuck",
            "--json",
        ],
    );
    force.env("PALISADE_ADMIN_TOKEN", &h.server.admin_token);
    let forced = output(force).await;
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert_eq!(forced.json()["state"], "force_released");
    let mut force = command(
        &h,
        &["admin", "force-release", "jobs/a", "--reason", "again"],
    );
    force.env("PALISADE_ADMIN_TOKEN", &h.server.admin_token);
    assert_eq!(output(force).await.code, 6, "nothing left to release");

    let events = palisade(&h, &["events", "--resource", "jobs/a", "--json"]).await;
    assert_eq!(events.code, 0);
    let kinds: Vec<String> = events.json()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("acquired"));
    assert!(kinds.contains(&"write_rejected".to_owned()));
    assert_eq!(kinds.last().map(String::as_str), Some("force_released"));
    let text = palisade(&h, &["events", "--kind", "renewed"]).await;
    assert_eq!(text.stdout.lines().count(), 1, "{}", text.stdout);
    assert!(text.stdout.contains("renewed jobs/a token=1 holder=cli"));
    assert_eq!(palisade(&h, &["events", "--kind", "nope"]).await.code, 2);

    let mut unreachable = command(&h, &["lock", "status", "jobs/a", "--timeout", "2s"]);
    unreachable.env("PALISADE_SERVER", "http://127.0.0.1:9");
    assert_eq!(output(unreachable).await.code, 7);
    h.finish().await;
}

async fn run_exports_the_token_and_propagates_the_exit_status(backend: Backend) {
    let h = Harness::start(&backend).await;
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    // The cron-job use case: the command writes with the token it was given.
    let script = format!(
        r#"echo "$PALISADE_RESOURCE|$PALISADE_TOKEN|$PALISADE_SERVER|${{PALISADE_LEASE_ID:-no lease id}}" > {env}
"$PALISADE_BIN" value put "$PALISADE_RESOURCE" --token "$PALISADE_TOKEN" '{{"report": "done"}}' || exit 99
exit 7"#,
        env = env_file.display()
    );
    let mut cmd = command(
        &h,
        &[
            "run",
            "--resource",
            "reports/nightly",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    cmd.env("PALISADE_BIN", BIN)
        .env("PALISADE_LEASE_ID", "must-not-reach-the-command");
    let run = output(cmd).await;
    assert_eq!(run.code, 7, "the command's status: {}", run.stderr);
    let seen = std::fs::read_to_string(&env_file).unwrap();
    assert_eq!(
        seen.trim(),
        format!("reports/nightly|1|{}|no lease id", h.server.base)
    );
    let c = client(&h);
    let stored = c
        .read_value::<Value>("reports/nightly")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.value, stored.token), (json!({"report": "done"}), 1));
    let info = c.resource("reports/nightly").await.unwrap().unwrap();
    assert!(info.holder.is_none(), "released when the command exited");
    let released = c
        .events(&EventFilter {
            kind: Some(EventKind::Released),
            ..EventFilter::resource("reports/nightly")
        })
        .await
        .unwrap();
    assert_eq!(released.events.len(), 1);

    // A second run gets the next token; success is 0.
    let ok = palisade(
        &h,
        &[
            "run",
            "--resource",
            "reports/nightly",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            "test \"$PALISADE_TOKEN\" = 2",
        ],
    )
    .await;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    // A command killed by a signal exits 128 + the signal, as in a shell.
    let killed = palisade(
        &h,
        &[
            "run",
            "--resource",
            "r",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            "kill -9 $$",
        ],
    )
    .await;
    assert_eq!(killed.code, 137);
    let missing = palisade(
        &h,
        &[
            "run",
            "--resource",
            "r",
            "--ttl",
            "5s",
            "--",
            "/nonexistent/command",
        ],
    )
    .await;
    assert_eq!(missing.code, 127, "{}", missing.stderr);
    assert!(c.resource("r").await.unwrap().unwrap().holder.is_none());
    h.finish().await;
}

async fn run_on_a_held_lock_exits_3_without_running(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    let lease = hold_as_other(&c, "busy", Duration::from_secs(30)).await;
    let (_dir, marker, touch) = run_marker();
    let started = Instant::now();
    let run = palisade(
        &h,
        &[
            "run",
            "--resource",
            "busy",
            "--ttl",
            "5s",
            "--wait",
            "300ms",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    )
    .await;
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited");
    assert!(!Path::new(&marker).exists(), "the command must not run");
    lease.release().await.unwrap();
    h.finish().await;
}

async fn run_terminates_the_command_when_the_lease_is_lost(backend: Backend) {
    let h = Harness::start(&backend).await;
    let child = command(
        &h,
        &[
            "run",
            "--resource",
            "lost",
            "--ttl",
            "600ms",
            "--grace",
            "5s",
            "--",
            "sleep",
            "30",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    held_token(&h, "lost").await;
    let started = Instant::now();
    admin(&h)
        .force_release("lost", "test: take it away")
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("run ended")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "SIGTERM ended the command: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(stderr.contains("lost the lease"), "{stderr}");
    h.finish().await;
}

async fn run_passes_sigterm_on_and_still_releases(backend: Backend) {
    let h = Harness::start(&backend).await;
    let child = command(
        &h,
        &[
            "run",
            "--resource",
            "stopped",
            "--ttl",
            "30s",
            "--",
            "sleep",
            "30",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    held_token(&h, "stopped").await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("run ended")
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info = client(&h).resource("stopped").await.unwrap().unwrap();
    assert!(info.holder.is_none(), "released, not left to expire");
    h.finish().await;
}

async fn run_stopped_while_waiting_exits_128_plus_the_signal_without_running(backend: Backend) {
    let h = Harness::start(&backend).await;
    let c = client(&h);
    let lease = hold_as_other(&c, "queued", Duration::from_secs(60)).await;
    let (_dir, marker, touch) = run_marker();
    let child = command(
        &h,
        &[
            "run",
            "--resource",
            "queued",
            "--ttl",
            "30s",
            "--wait",
            "60s",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    // Nothing outside shows that `run` is waiting yet; give it time to start
    // its (60 s) wait. The handlers are installed before it asks for the lock.
    tokio::time::sleep(Duration::from_millis(700)).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the wait ended on the signal, not after 60 s")
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + 2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "the command never ran");
    // The lock is still the other holder's, and nothing was left behind
    // for `run`: releasing it leaves the resource free.
    let info = c.resource("queued").await.unwrap().unwrap();
    assert_eq!(info.holder.map(|l| l.token), Some(lease.token()));
    lease.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let info = c.resource("queued").await.unwrap().unwrap();
    assert!(info.holder.is_none(), "no lease granted to the stopped run");
    h.finish().await;
}

async fn run_kills_a_command_that_ignores_sigterm_after_the_grace(backend: Backend) {
    let h = Harness::start(&backend).await;
    let child = command(
        &h,
        &[
            "run",
            "--resource",
            "stubborn",
            "--ttl",
            "600ms",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            "trap '' TERM; sleep 30",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    held_token(&h, "stubborn").await;
    admin(&h).force_release("stubborn", "test").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("run ended")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "SIGKILL after the grace: {stderr}"
    );
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    h.finish().await;
}

async fn run_with_on_lost_warn_lets_the_command_finish(backend: Backend) {
    let h = Harness::start(&backend).await;
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    // The command finishes after the loss; its fenced write is refused.
    let script = format!(
        r#"while [ ! -e {go} ]; do sleep 0.05; done
"$PALISADE_BIN" fence "$PALISADE_RESOURCE" "$PALISADE_TOKEN"; echo $? > {done}"#,
        go = dir.path().join("go").display(),
        done = done.display()
    );
    let mut cmd = command(
        &h,
        &[
            "run",
            "--resource",
            "warned",
            "--ttl",
            "600ms",
            "--on-lost",
            "warn",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    cmd.env("PALISADE_BIN", BIN).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    held_token(&h, "warned").await;
    admin(&h).force_release("warned", "test").await.unwrap();
    // Let the supervisor notice the loss before the command goes on.
    tokio::time::sleep(Duration::from_millis(800)).await;
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("run ended")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("keeps running"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&done).unwrap().trim(),
        "4",
        "stale token"
    );
    let lease = client(&h).resource("warned").await.unwrap().unwrap();
    assert!(lease.holder.is_none());
    h.finish().await;
}

async fn events_follow_prints_new_events_as_json_lines(backend: Backend) {
    let h = Harness::start(&backend).await;
    let mut child = command(
        &h,
        &[
            "events",
            "--follow",
            "--json",
            "--interval",
            "100ms",
            "--resource",
            "followed",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let c = client(&h);
    let lease = c
        .acquire(
            "followed",
            palisade::client::AcquireOptions::new("f", Duration::from_secs(30)),
        )
        .await
        .unwrap();
    h.server
        .write_value("followed", lease.token(), json!("x"))
        .await;
    let released = lease.release().await.unwrap();
    assert_eq!(released.state, LeaseState::Released);
    let mut kinds = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while kinds.len() < 3 {
        let line = tokio::time::timeout_at(deadline.into(), lines.next_line())
            .await
            .expect("events arrive while following")
            .unwrap()
            .expect("a line");
        let event: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(event["resource"], "followed");
        kinds.push(event["kind"].as_str().unwrap().to_owned());
    }
    assert_eq!(kinds, ["acquired", "write_accepted", "released"]);
    child.start_kill().unwrap();
    let _ = child.wait().await;
    h.finish().await;
}

/// `--api-key` / `PALISADE_API_KEY` reach the server; a key outside its
/// prefixes exits 8, like a missing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_option_is_sent_and_forbidden_exits_8() {
    use crate::api_keys::{BILLING_KEY, REPORTS_KEY, start_with_keys};
    let (h, _keys) = start_with_keys(&Backend::Sqlite).await;
    let missing = palisade(&h, &["lock", "acquire", "reports/a", "--ttl", "30s"]).await;
    assert_eq!(missing.code, 8, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("unauthorized"),
        "{}",
        missing.stderr
    );

    let acquired = palisade(
        &h,
        &[
            "lock",
            "acquire",
            "reports/a",
            "--ttl",
            "30s",
            "--json",
            "--api-key",
            REPORTS_KEY,
        ],
    )
    .await;
    assert_eq!(acquired.code, 0, "{}", acquired.stderr);
    assert!(!acquired.stderr.contains(REPORTS_KEY));
    let token = acquired.json()["token"].as_i64().unwrap().to_string();

    let mut put = command(&h, &["value", "put", "reports/a", "--token", &token, "7"]);
    put.env("PALISADE_API_KEY", REPORTS_KEY);
    let put = output(put).await;
    assert_eq!(put.code, 0, "{}", put.stderr);

    let mut foreign = command(&h, &["value", "put", "reports/a", "--token", &token, "8"]);
    foreign.env("PALISADE_API_KEY", BILLING_KEY);
    let foreign = output(foreign).await;
    assert_eq!(foreign.code, 8, "{}", foreign.stderr);
    assert!(foreign.stderr.contains("forbidden"), "{}", foreign.stderr);
    assert!(!foreign.stderr.contains(BILLING_KEY));

    // The Rust client: the key goes on lock calls, the admin token on admin calls.
    let c = Client::builder(&h.server.base)
        .api_key(REPORTS_KEY)
        .bearer_token(&h.server.admin_token)
        .build()
        .unwrap();
    assert!(
        !format!("{c:?}").contains(REPORTS_KEY),
        "Debug hides the key"
    );
    let value = c.read_value::<i64>("reports/a").await.unwrap().unwrap();
    assert_eq!(value.value, 7);
    let refused = c.read_value::<i64>("billing/x").await.unwrap_err();
    assert!(
        matches!(refused, palisade::client::Error::Forbidden { .. }),
        "{refused:?}"
    );
    c.force_release("reports/a", "admin call with the admin token")
        .await
        .unwrap();
    h.finish().await;
}

crate::on_both_backends!(
    lock_commands_print_json_and_exit_with_documented_codes,
    run_exports_the_token_and_propagates_the_exit_status,
    run_on_a_held_lock_exits_3_without_running,
    run_terminates_the_command_when_the_lease_is_lost,
    run_passes_sigterm_on_and_still_releases,
    run_stopped_while_waiting_exits_128_plus_the_signal_without_running,
    run_kills_a_command_that_ignores_sigterm_after_the_grace,
    run_with_on_lost_warn_lets_the_command_finish,
    events_follow_prints_new_events_as_json_lines,
);

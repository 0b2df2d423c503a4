//! The UI in a real headless Chromium, driven over the Chrome DevTools
//! protocol: load the overview, watch a live update arrive, open a
//! timeline, sign in and force-release a stuck lock through the form.
//!
//! Needs Debian's `chromium` (`.ci/steps/chromium.sh` installs it). Without
//! it the test is skipped locally (loudly) and fails in CI.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

use crate::support::{Backend, Harness, enc};

fn chromium_path() -> Option<String> {
    if let Ok(path) = std::env::var("PALISADE_CHROMIUM") {
        return Some(path);
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(str::to_owned)
}

/// One page of a browser, over a flattened CDP session.
struct Cdp {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    _browser: Child,
    _profile: tempfile::TempDir,
}

impl Cdp {
    async fn launch(binary: &str) -> Cdp {
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromium");
        let stderr = browser.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let ws_url = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    return url.trim().to_owned();
                }
            }
            panic!("chromium exited without a DevTools address")
        })
        .await
        .expect("chromium printed its DevTools address in time");
        // Keep draining stderr so chromium never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (ws, _) = connect_async(ws_url.as_str())
            .await
            .expect("connect to CDP");
        let mut cdp = Cdp {
            ws,
            session: String::new(),
            next_id: 0,
            _browser: browser,
            _profile: profile,
        };
        let target = cdp
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = cdp
            .call(
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        cdp.session = attached["sessionId"].as_str().unwrap().to_owned();
        cdp.call("Page.enable", json!({})).await;
        cdp.call("Runtime.enable", json!({})).await;
        cdp
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let Some(frame) = self.ws.next().await else {
                    panic!("CDP connection closed");
                };
                if let Message::Text(text) = frame.unwrap() {
                    let value: Value = serde_json::from_str(text.as_str()).unwrap();
                    if value["id"] == json!(id) {
                        return value;
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("CDP {method} answered in time"));
        assert!(reply.get("error").is_none(), "{method}: {reply}");
        reply["result"].clone()
    }

    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Polls `expression` until it is true, or fails after `limit`.
    async fn wait_for(&mut self, expression: &str, limit: Duration) {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.eval(expression).await == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let html = self
            .eval("document.body ? document.body.innerText : ''")
            .await;
        panic!("timed out waiting for {expression}; page text: {html}");
    }

    /// Saves a PNG of the page when `PALISADE_SCREENSHOT_DIR` is set (how
    /// docs/screenshots/force-release.png was made).
    async fn screenshot(&mut self, name: &str) {
        use base64::Engine;
        let Ok(dir) = std::env::var("PALISADE_SCREENSHOT_DIR") else {
            return;
        };
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(std::path::Path::new(&dir).join(name), png).unwrap();
    }

    async fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
        self.wait_for(
            &format!(
                "location.href === {} && document.readyState === 'complete' && !!window.htmx",
                json!(url)
            ),
            Duration::from_secs(15),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_overview_live_update_timeline_and_force_release() {
    let Some(binary) = chromium_path() else {
        if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
            panic!("chromium is not installed in CI: the browser test must run");
        }
        eprintln!("SKIPPED: browser test (install Debian's chromium to run it)");
        return;
    };
    let h = Harness::start(&Backend::Sqlite).await;
    let s = &h.server;
    let stuck = s
        .acquire("browser/stuck job", "stuck-worker", 600_000)
        .await;
    let mut page = Cdp::launch(&binary).await;

    // Overview, then a live update without reload.
    page.open(&s.url("/")).await;
    page.wait_for(
        "document.querySelector('#active-leases').textContent.trim() === '1'",
        Duration::from_secs(5),
    )
    .await;
    page.eval("window.__marker = 'same page'").await;
    s.acquire("browser/second", "helper", 600_000).await;
    page.wait_for(
        "document.querySelector('#active-leases').textContent.trim() === '2'",
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(
        page.eval("window.__marker").await,
        json!("same page"),
        "updated in place, not reloaded"
    );

    // The timeline draws the stuck lease.
    let timeline = s.url(&format!("/ui/resources/{}", enc("browser/stuck job")));
    page.open(&timeline).await;
    page.wait_for(
        "[...document.querySelectorAll('svg.timeline a.bar title')].some(t => t.textContent.includes('stuck-worker'))",
        Duration::from_secs(5),
    )
    .await;

    // Sign in through the form, then force-release through the form.
    page.open(&format!(
        "{}?next={}",
        s.url("/ui/sign-in"),
        enc(&format!("/ui/resources/{}", enc("browser/stuck job")))
    ))
    .await;
    page.eval(&format!(
        "document.querySelector('input[name=token]').value = {}; \
         document.querySelector('form.stack button[type=submit]').click(); true",
        json!(s.admin_token)
    ))
    .await;
    page.wait_for(
        &format!(
            "location.href === {} && document.readyState === 'complete' && !!document.querySelector('.badge-admin')",
            json!(timeline)
        ),
        Duration::from_secs(10),
    )
    .await;
    page.eval(
        "document.querySelector('details.danger-zone summary').click(); \
         document.querySelector('textarea[name=reason]').value = 'worker host is gone (browser test)'; \
         document.querySelector('input[name=confirm]').click(); true",
    )
    .await;
    page.screenshot("force-release.png").await;
    page.eval(
        "document.querySelector('details.danger-zone form button[type=submit]').click(); true",
    )
    .await;
    page.wait_for(
        "location.search.includes('notice=force_released') && document.readyState === 'complete'",
        Duration::from_secs(10),
    )
    .await;
    page.wait_for(
        "document.body.innerText.includes('force-released') && document.body.innerText.includes('browser test')",
        Duration::from_secs(5),
    )
    .await;

    let (status, res) = s
        .get(&format!("/v1/resources/{}", enc("browser/stuck job")))
        .await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(res["holder"], Value::Null, "the lock was released");
    let (status, _) = s.renew(&stuck, json!({})).await;
    assert_eq!(status, reqwest::StatusCode::GONE);
    let events = s.all_events(Some("browser/stuck job")).await;
    let forced = events
        .iter()
        .find(|e| e["kind"] == "force_released")
        .expect("recorded");
    assert_eq!(forced["detail"]["by"], "admin (web ui)");
    assert_eq!(
        forced["detail"]["reason"],
        "worker host is gone (browser test)"
    );
    drop(page);
    h.finish().await;
}

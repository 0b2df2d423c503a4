//! The web UI over real HTTP on both backends: every page and htmx partial,
//! escaping of hostile names, stale-write forensics, live polls, admin
//! sign-in, CSRF and force-release, and read protection.

use std::time::Duration;

use palisade::app::Config;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::json;

use crate::support::{Backend, Harness, TestDb, TestServer, enc};

const SCRIPT_NAME: &str = "<script>alert(1)</script>";
const ATTR_NAME: &str = "\"><svg onload=alert(1)>";

/// A browser-like client: no redirects followed, cookies kept by hand.
/// (Also used by `hostile_clients` for cross-site requests.)
pub(crate) struct Browser {
    pub(crate) client: reqwest::Client,
    base: String,
    cookies: Vec<(String, String)>,
}

pub(crate) struct Page {
    pub(crate) status: StatusCode,
    headers: HeaderMap,
    pub(crate) body: String,
}

impl Browser {
    pub(crate) fn new(server: &TestServer) -> Browser {
        Browser {
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            base: server.base.clone(),
            cookies: Vec::new(),
        }
    }

    pub(crate) fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn send(&mut self, req: reqwest::RequestBuilder) -> Page {
        let req = if self.cookies.is_empty() {
            req
        } else {
            req.header("cookie", self.cookie_header())
        };
        let res = req.send().await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        for set in headers.get_all("set-cookie") {
            let text = set.to_str().unwrap();
            assert!(text.contains("HttpOnly"), "{text}");
            assert!(text.contains("Secure"), "{text}");
            assert!(text.contains("SameSite=Strict"), "{text}");
            let (pair, _) = text.split_once(';').unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            self.cookies.retain(|(name, _)| name != k);
            if !v.is_empty() {
                self.cookies.push((k.to_owned(), v.to_owned()));
            }
        }
        let body = res.text().await.unwrap();
        Page {
            status,
            headers,
            body,
        }
    }

    pub(crate) async fn get(&mut self, path: &str) -> Page {
        let req = self.client.get(format!("{}{path}", self.base));
        self.send(req).await
    }

    async fn htmx(&mut self, path: &str) -> Page {
        let req = self
            .client
            .get(format!("{}{path}", self.base))
            .header("HX-Request", "true");
        self.send(req).await
    }

    async fn post_form(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        let req = self.client.post(format!("{}{path}", self.base)).form(form);
        self.send(req).await
    }

    /// The CSRF token of the forms on `path`.
    async fn csrf(&mut self, path: &str) -> String {
        let page = self.get(path).await;
        csrf_of(&page.body)
    }

    pub(crate) async fn sign_in(&mut self, token: &str) -> Page {
        let csrf = self.csrf("/ui/sign-in").await;
        self.post_form(
            "/ui/sign-in",
            &[("token", token), ("csrf", &csrf), ("next", "/ui/resources")],
        )
        .await
    }
}

pub(crate) fn csrf_of(html: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).expect("page has a CSRF field") + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}

fn assert_html(page: &Page, status: StatusCode) {
    assert_eq!(page.status, status, "{}", page.body);
    let ct = page.headers["content-type"].to_str().unwrap();
    assert!(ct.starts_with("text/html"), "{ct}");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
}

/// Nothing hostile comes back raw; lease ids never appear.
fn assert_escaped(body: &str, secrets: &[&str]) {
    assert!(!body.contains("<script>alert"), "raw script tag in page");
    assert!(!body.contains("<svg onload"), "raw svg tag in page");
    assert!(
        !body.contains("\"><svg onload"),
        "attribute break-out in page"
    );
    for secret in secrets {
        assert!(!body.contains(secret), "a lease id appears in a page");
    }
}

async fn pages_render_and_escape_hostile_names(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let mut lease_ids = Vec::new();
    for name in [SCRIPT_NAME, ATTR_NAME] {
        let old = s.acquire(name, ATTR_NAME, 200).await;
        lease_ids.push(old["lease_id"].as_str().unwrap().to_owned());
        tokio::time::sleep(Duration::from_millis(350)).await;
        let new = s.acquire(name, SCRIPT_NAME, 30_000).await;
        lease_ids.push(new["lease_id"].as_str().unwrap().to_owned());
        let (status, _) = s.write_value(name, 2, json!({"v": 1})).await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = s.write_value(name, 1, json!({"v": 0})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        let (status, _) = s.renew(&new, json!({})).await;
        assert_eq!(status, StatusCode::OK);
    }
    let secrets: Vec<&str> = lease_ids.iter().map(String::as_str).collect();
    let mut b = Browser::new(s);
    for name in [SCRIPT_NAME, ATTR_NAME] {
        let n = enc(name);
        let escaped_script = "&#60;script&#62;alert(1)&#60;/script&#62;";
        let pages = [
            "/".to_owned(),
            "/ui/resources".to_owned(),
            format!("/ui/resources?prefix={n}&state=held&sort=name"),
            format!("/ui/resources/{n}"),
            format!("/ui/resources/{n}?window=1h"),
            format!("/ui/resources/{n}?window=24h"),
            format!("/ui/resources/{n}/leases/1"),
            format!("/ui/resources/{n}/leases/2"),
            "/ui/events".to_owned(),
            format!("/ui/events?prefix={n}&holder={}", enc(SCRIPT_NAME)),
            "/ui/events?kind=stale".to_owned(),
            format!("/ui/sign-in?next=/ui/resources/{n}"),
        ];
        for path in &pages {
            let page = b.get(path).await;
            assert_html(&page, StatusCode::OK);
            assert!(page.body.contains("<!doctype html>"), "{path}");
            assert_escaped(&page.body, &secrets);
            if path.contains("/ui/resources/") || path.contains("prefix=") {
                assert!(
                    page.body.contains(escaped_script)
                        || page.body.contains("&#34;&#62;&#60;svg onload"),
                    "{path}: the hostile text is shown, escaped"
                );
            }
        }
        let timeline = b.get(&format!("/ui/resources/{n}")).await.body;
        assert!(timeline.contains("class=\"timeline\""));
        assert!(timeline.contains("s-active"), "the live lease is drawn");
        assert!(timeline.contains("s-expired"), "the expired lease is drawn");
        assert!(
            timeline.contains("k-write_rejected"),
            "the stale write is marked"
        );
        assert!(timeline.contains("k-write_accepted"));
        assert!(timeline.contains("k-renewed"));
        // htmx partials: the live part only, escaped the same way.
        for path in [
            format!("/ui/resources/{n}"),
            "/ui/resources".to_owned(),
            "/ui/events".to_owned(),
            "/".to_owned(),
        ] {
            let partial = b.htmx(&path).await;
            assert_html(&partial, StatusCode::OK);
            assert!(
                !partial.body.contains("<!doctype html>"),
                "{path}: a fragment"
            );
            assert!(partial.body.contains("hx-get="), "{path}: keeps polling");
            assert_escaped(&partial.body, &secrets);
        }
    }
    h.finish().await;
}

async fn stale_write_forensics_link_the_zombie_to_its_successor(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let zombie = s.acquire("orders/export", "alice", 200).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    let _successor = s.acquire("orders/export", "bob", 30_000).await;
    assert_eq!(
        s.write_value("orders/export", 2, json!(1)).await.0,
        StatusCode::OK
    );
    let (status, _) = s.write_value("orders/export", 1, json!(0)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let mut b = Browser::new(s);

    let lease = b.get("/ui/resources/orders%2Fexport/leases/1").await;
    assert_html(&lease, StatusCode::OK);
    assert!(lease.body.contains("alice"));
    assert!(lease.body.contains("expired"));
    assert!(lease.body.contains("Rejected as stale"));
    assert!(
        lease.body.contains("fenced out by")
            && lease
                .body
                .contains("/ui/resources/orders%2Fexport/leases/2"),
        "the zombie's page links to the lease that fenced it out"
    );
    assert!(!lease.body.contains(zombie["lease_id"].as_str().unwrap()));

    let successor = b.get("/ui/resources/orders%2Fexport/leases/2").await;
    assert!(successor.body.contains("bob"));
    assert!(successor.body.contains("Still active"));

    let timeline = b.get("/ui/resources/orders%2Fexport").await.body;
    assert!(
        timeline.contains("fence-link"),
        "rejection linked to its fencer"
    );
    assert!(timeline.contains("Lease #1 held by alice"));

    let overview = b.get("/").await.body;
    assert!(overview.contains("orders/export"));
    assert!(overview.contains("Latest stale writes rejected"));
    assert!(overview.contains("fenced out by"));

    let stale = b.get("/ui/events?kind=stale").await.body;
    assert!(stale.contains("stale write rejected"));
    assert!(
        !stale.contains("pill k-acquired"),
        "only stale writes listed"
    );

    let by_holder = b.get("/ui/events?holder=bob").await.body;
    assert!(by_holder.contains("bob") && !by_holder.contains(">alice<"));

    let held = b.get("/ui/resources?state=held").await.body;
    assert!(held.contains("orders/export"));
    let free = b.get("/ui/resources?state=free").await.body;
    assert!(!free.contains("orders/export"));
    let other = b.get("/ui/resources?prefix=nothing-like-it").await.body;
    assert!(!other.contains("orders/export") && other.contains("No resource matches"));
    h.finish().await;
}

async fn live_polls_answer_204_until_something_changes(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("live/one", "alice", 30_000).await;
    let mut b = Browser::new(s);
    let page = b.get("/ui/events").await.body;
    let marker = "cursor=";
    let start = page.find(marker).expect("the table polls") + marker.len();
    let cursor: i64 = page[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let poll = format!("/ui/events?cursor={cursor}");
    assert_eq!(b.htmx(&poll).await.status, StatusCode::NO_CONTENT);
    s.release(&lease).await;
    let fresh = b.htmx(&poll).await;
    assert_html(&fresh, StatusCode::OK);
    assert!(fresh.body.contains(">released<"));

    let overview = b.htmx(&format!("/?cursor={}", cursor + 1)).await;
    assert_eq!(overview.status, StatusCode::NO_CONTENT);
    let overview = b.htmx("/?cursor=0").await;
    assert_eq!(overview.status, StatusCode::OK);

    // A fixed window redraws only on new events; a window that follows now
    // redraws every time.
    let fixed = "/ui/resources/live%2Fone?window=custom&from=2020-01-01T00:00&to=2020-01-02T00:00";
    assert_eq!(
        b.htmx(&format!("{fixed}&cursor={}", cursor + 1))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        b.htmx(&format!("{fixed}&cursor=0")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        b.htmx(&format!(
            "/ui/resources/live%2Fone?window=5m&cursor={}",
            cursor + 1
        ))
        .await
        .status,
        StatusCode::OK
    );
    h.finish().await;
}

async fn force_release_needs_admin_sign_in_and_csrf(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    let lease = s.acquire("stuck/job", "cron-7", 600_000).await;
    let path = "/ui/resources/stuck%2Fjob/force-release";
    let mut b = Browser::new(s);

    // Anonymous: the page offers a sign-in, the POST is refused.
    let page = b.get("/ui/resources/stuck%2Fjob").await;
    assert!(page.body.contains("Sign in as admin"));
    let csrf = csrf_of(&b.get("/ui/sign-in").await.body);
    let refused = b
        .post_form(
            path,
            &[("csrf", &csrf), ("reason", "r"), ("confirm", "yes")],
        )
        .await;
    assert_html(&refused, StatusCode::UNAUTHORIZED);

    // A wrong token does not sign in.
    let wrong = b.sign_in("not-the-token").await;
    assert_html(&wrong, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("not valid"));

    let signed = b.sign_in(&s.admin_token).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    assert_eq!(signed.headers["location"], "/ui/resources");
    assert!(b.cookies.iter().any(|(k, _)| k == "palisade_session"));
    let page = b.get("/ui/resources/stuck%2Fjob").await;
    assert!(page.body.contains("Force-release the lock"));
    assert!(page.body.contains(">Admin<"));
    let csrf = csrf_of(&page.body);

    // CSRF: missing, wrong, or from another origin.
    let missing = b
        .post_form(path, &[("reason", "r"), ("confirm", "yes")])
        .await;
    assert!(missing.status.is_client_error());
    let forged = b
        .post_form(
            path,
            &[("csrf", "0000"), ("reason", "r"), ("confirm", "yes")],
        )
        .await;
    assert_html(&forged, StatusCode::FORBIDDEN);
    let req = b
        .client
        .post(format!("{}{path}", b.base))
        .header("origin", HeaderValue::from_static("http://evil.example"))
        .form(&[("csrf", csrf.as_str()), ("reason", "r"), ("confirm", "yes")]);
    assert_eq!(b.send(req).await.status, StatusCode::FORBIDDEN);
    // A forged cookie-less browser (the usual cross-site POST) is refused too.
    let mut stranger = Browser::new(s);
    let stranger_post = stranger
        .post_form(
            path,
            &[("csrf", &csrf), ("reason", "r"), ("confirm", "yes")],
        )
        .await;
    assert_eq!(stranger_post.status, StatusCode::FORBIDDEN);
    // The confirmation box is required.
    let unconfirmed = b.post_form(path, &[("csrf", &csrf), ("reason", "r")]).await;
    assert_html(&unconfirmed, StatusCode::BAD_REQUEST);
    // Still held after all that.
    let (_, res) = s.get("/v1/resources/stuck%2Fjob").await;
    assert_eq!(res["holder"]["holder"], "cron-7");

    let reason = "host is dead <b>really</b>";
    let done = b
        .post_form(
            path,
            &[("csrf", &csrf), ("reason", reason), ("confirm", "yes")],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.headers["location"],
        "/ui/resources/stuck%2Fjob?notice=force_released"
    );
    let after = b
        .get("/ui/resources/stuck%2Fjob?notice=force_released")
        .await;
    assert!(after.body.contains("was force-released"));
    assert!(
        after.body.contains("&#60;b&#62;really&#60;/b&#62;"),
        "reason escaped"
    );
    assert!(!after.body.contains("<b>really"));

    let (status, _) = s.renew(&lease, json!({})).await;
    assert_eq!(status, StatusCode::GONE);
    let (status, body) = s.write_value("stuck/job", 1, json!(1)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "stale_token");
    let events = s.all_events(Some("stuck/job")).await;
    let forced = events
        .iter()
        .find(|e| e["kind"] == "force_released")
        .expect("force-release recorded");
    assert_eq!(forced["detail"]["reason"], reason);
    assert_eq!(forced["detail"]["by"], "admin (web ui)");

    // Releasing again: nothing held any more.
    let again = b
        .post_form(
            path,
            &[("csrf", &csrf), ("reason", "again"), ("confirm", "yes")],
        )
        .await;
    assert_eq!(
        again.headers["location"],
        "/ui/resources/stuck%2Fjob?notice=not_held"
    );

    // Sign out ends the admin session.
    let out = b.post_form("/ui/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(!b.cookies.iter().any(|(k, _)| k == "palisade_session"));
    let page = b.get("/ui/resources/stuck%2Fjob").await;
    assert!(!page.body.contains(">Admin<"));
    h.finish().await;
}

async fn a_ui_token_protects_reading(backend: Backend) {
    let db = TestDb::create(&backend).await;
    let config = Config {
        ui_token: Some("viewer-token".into()),
        ..Config::for_tests(&db.url)
    };
    let s = TestServer::start_with(config).await;
    s.acquire("guarded", "alice", 60_000).await;
    let mut b = Browser::new(&s);
    for path in ["/", "/ui/resources", "/ui/events", "/ui/resources/guarded"] {
        let page = b.get(path).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{path}");
        assert!(
            page.headers["location"]
                .to_str()
                .unwrap()
                .starts_with("/ui/sign-in?next=")
        );
    }
    assert_eq!(b.htmx("/ui/events").await.status, StatusCode::UNAUTHORIZED);
    // Static files and the sign-in page stay reachable; the JSON API is
    // not affected.
    assert_eq!(b.get("/static/htmx.min.js").await.status, StatusCode::OK);
    assert_eq!(b.get("/ui/sign-in").await.status, StatusCode::OK);
    assert_eq!(s.get("/v1/resources/guarded").await.0, StatusCode::OK);

    let signed = b.sign_in("viewer-token").await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    let page = b.get("/ui/resources/guarded").await;
    assert_html(&page, StatusCode::OK);
    assert!(page.body.contains(">Viewer<"));
    // A reader cannot force-release.
    let csrf = csrf_of(&page.body);
    let refused = b
        .post_form(
            "/ui/resources/guarded/force-release",
            &[("csrf", &csrf), ("reason", "r"), ("confirm", "yes")],
        )
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    s.stop().await;
    db.drop_db().await;
}

async fn bad_ui_input_gets_a_clear_4xx_page(backend: Backend) {
    let h = Harness::start(&backend).await;
    let s = &h.server;
    s.acquire("known", "alice", 60_000).await;
    let mut b = Browser::new(s);
    for (path, status) in [
        ("/ui/resources?state=bogus", StatusCode::BAD_REQUEST),
        ("/ui/resources?sort=size", StatusCode::BAD_REQUEST),
        ("/ui/resources?page=0", StatusCode::BAD_REQUEST),
        ("/ui/resources?page=x", StatusCode::BAD_REQUEST),
        ("/ui/resources/never-used", StatusCode::NOT_FOUND),
        ("/ui/resources/known?window=7d", StatusCode::BAD_REQUEST),
        ("/ui/resources/known?end=soon", StatusCode::BAD_REQUEST),
        (
            "/ui/resources/known?window=custom&from=x&to=y",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/ui/resources/known?window=custom&from=2026-01-02T00:00&to=2026-01-01T00:00",
            StatusCode::BAD_REQUEST,
        ),
        ("/ui/resources/known?before=x", StatusCode::BAD_REQUEST),
        ("/ui/resources/known/leases/abc", StatusCode::BAD_REQUEST),
        ("/ui/resources/known/leases/0", StatusCode::BAD_REQUEST),
        ("/ui/resources/known/leases/99", StatusCode::NOT_FOUND),
        ("/ui/events?kind=nope", StatusCode::BAD_REQUEST),
        ("/ui/events?before=-", StatusCode::BAD_REQUEST),
        ("/ui/resources/%01bad", StatusCode::BAD_REQUEST),
        ("/static/nope.js", StatusCode::NOT_FOUND),
    ] {
        let page = b.get(path).await;
        assert_html(&page, status);
        assert!(page.body.contains("Something is not right"), "{path}");
    }
    let long = "x".repeat(300);
    assert_eq!(
        b.get(&format!("/ui/resources?prefix={long}")).await.status,
        StatusCode::BAD_REQUEST
    );
    let css = b.get("/static/app.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(
        css.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    h.finish().await;
}

crate::on_both_backends!(
    pages_render_and_escape_hostile_names,
    stale_write_forensics_link_the_zombie_to_its_successor,
    live_polls_answer_204_until_something_changes,
    force_release_needs_admin_sign_in_and_csrf,
    a_ui_token_protects_reading,
    bad_ui_input_gets_a_clear_4xx_page,
);

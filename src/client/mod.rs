//! A Rust client for the Palisade v1 API.
//!
//! [`Client::acquire`] returns a [`Lease`] guard that renews itself in the
//! background, tells you when the lease is lost, and releases on drop. The
//! token it carries is what every write to protected storage must present:
//! [`Client::write_value`] for the built-in store, [`Client::fence`] before a
//! write anywhere else.
//!
//! ```no_run
//! # async fn demo() -> Result<(), palisade::client::Error> {
//! use std::time::Duration;
//! use palisade::client::{AcquireOptions, Client};
//!
//! let client = Client::new("http://127.0.0.1:7070")?;
//! let lease = client
//!     .acquire("reports/daily", AcquireOptions::new("worker-1", Duration::from_secs(30)))
//!     .await?;
//! client.write_value("reports/daily", lease.token(), &42).await?;
//! lease.release().await?;
//! # Ok(()) }
//! ```

mod error;
mod lease;
mod types;

use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use rand::RngCore;
use reqwest::{Method, RequestBuilder};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

pub use error::Error;
pub use lease::{Lease, LeaseStatus, LostReason};
pub use types::{
    AcquireOptions, Event, EventFilter, EventKind, EventPage, FenceAccepted, FencedBy, HeldBy,
    LeaseInfo, LeaseState, ResourceHolder, ResourceInfo, StoredValue, WriteReceipt,
};

use types::millis;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds a [`Client`]. Defaults: 10 s request timeout (plus the acquire's
/// `wait`), 5 s connect timeout, 3 retries of retryable failures, renewal
/// after a third of the TTL.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    timeout: Duration,
    connect_timeout: Duration,
    bearer_token: Option<Secret>,
    api_key: Option<Secret>,
    user_agent: String,
    retries: u32,
    retry_backoff: Duration,
    renew_fraction: f64,
}

impl ClientBuilder {
    /// Timeout of one request; an acquire that may wait gets its `wait` on top.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sent as `Authorization: Bearer …` (the admin token for admin calls).
    /// Without an [`api_key`](Self::api_key) it is sent on every call.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(Secret(token.into()));
        self
    }

    /// A client API key, for servers started with `--api-keys-file`: sent
    /// as `Authorization: Bearer …` on every call except admin calls, which
    /// send the [`bearer_token`](Self::bearer_token).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(Secret(key.into()));
        self
    }

    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// How often a request that failed with a retryable error is tried again
    /// (0: never). Only idempotent calls are retried: reads, renewals,
    /// releases, fence checks, and acquires (which carry a request id).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The first pause between retries; it doubles each time.
    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.retry_backoff = backoff;
        self
    }

    /// When a [`Lease`] renews, as a fraction of its TTL (0.1 to 0.9).
    pub fn renew_fraction(mut self, fraction: f64) -> Self {
        self.renew_fraction = fraction.clamp(0.1, 0.9);
        self
    }

    pub fn build(self) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            // Below the server's default idle keep-alive limit (75 s), so
            // the client drops an idle connection before the server does
            // and never sends a request into one that is closing.
            .pool_idle_timeout(Duration::from_secs(50))
            .user_agent(self.user_agent.clone())
            .build()
            .map_err(Error::Transport)?;
        Ok(Client {
            http,
            base_url: self.base_url.trim_end_matches('/').to_owned(),
            bearer_token: self.bearer_token,
            api_key: self.api_key,
            timeout: self.timeout,
            retries: self.retries,
            retry_backoff: self.retry_backoff,
            renew_fraction: self.renew_fraction,
        })
    }
}

/// A handle to one Palisade server; cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    bearer_token: Option<Secret>,
    api_key: Option<Secret>,
    timeout: Duration,
    retries: u32,
    retry_backoff: Duration,
    renew_fraction: f64,
}

/// A credential; `Debug` (so a logged client or builder) never shows it.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A path segment, percent-encoded so `reports/daily` stays one segment.
fn segment(raw: &str) -> String {
    utf8_percent_encode(raw, NON_ALPHANUMERIC).to_string()
}

/// A random idempotency key for an acquire that was given none.
fn random_request_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    format!("client-{}", hex::encode(bytes))
}

impl Client {
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            bearer_token: None,
            api_key: None,
            user_agent: format!("palisade-client/{}", env!("CARGO_PKG_VERSION")),
            retries: 3,
            retry_backoff: Duration::from_millis(200),
            renew_fraction: 1.0 / 3.0,
        }
    }

    /// A client with the default options.
    pub fn new(base_url: impl Into<String>) -> Result<Client> {
        Self::builder(base_url).build()
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let req = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        let credential = if path.starts_with("/v1/admin/") {
            self.bearer_token.as_ref()
        } else {
            self.api_key.as_ref().or(self.bearer_token.as_ref())
        };
        match credential {
            Some(Secret(token)) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Sends once and decodes a 2xx JSON body, or maps the error body.
    async fn send_once<T: DeserializeOwned>(&self, req: RequestBuilder) -> Result<T> {
        let res = req.send().await.map_err(Error::Transport)?;
        let status = res.status();
        let text = res.text().await.map_err(Error::Transport)?;
        if !status.is_success() {
            return Err(Error::from_response(status, &text));
        }
        serde_json::from_str(&text).map_err(|e| Error::Unexpected {
            status: status.as_u16(),
            code: None,
            message: format!("cannot decode the answer: {e}"),
        })
    }

    /// Sends, retrying retryable failures with exponential backoff. Only for
    /// requests whose repetition is harmless.
    async fn send<T: DeserializeOwned>(&self, build: impl Fn() -> RequestBuilder) -> Result<T> {
        let mut backoff = self.retry_backoff;
        let mut attempt = 0;
        loop {
            match self.send_once(build()).await {
                Err(err) if err.is_retryable() && attempt < self.retries => {
                    attempt += 1;
                    tracing::debug!(error = %err, attempt, "retrying a Palisade request");
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                }
                result => return result,
            }
        }
    }

    /// Takes a lock and returns a guard that renews it until released,
    /// dropped or lost. See [`Lease`].
    pub async fn acquire(&self, resource: &str, options: AcquireOptions) -> Result<Lease> {
        let ttl = options.ttl;
        let waited = !options.wait.is_zero();
        let started = tokio::time::Instant::now();
        let info = self.acquire_lease(resource, options).await?;
        // The local deadline must not be later than the server's. Without
        // waiting the grant came after `started`; after a wait it came at
        // most one round trip ago, which a tenth of the TTL covers.
        let deadline = if waited {
            tokio::time::Instant::now() + ttl.mul_f64(0.9)
        } else {
            started + ttl
        };
        Lease::start(self.clone(), info, deadline)
    }

    /// Takes a lock without a guard: nothing renews or releases it. For
    /// tools that manage the lease id themselves (the CLI does).
    pub async fn acquire_lease(
        &self,
        resource: &str,
        options: AcquireOptions,
    ) -> Result<LeaseInfo> {
        // Fixed before the first attempt: a retry after a timeout carries the
        // same id, so if the first attempt was granted the server answers
        // with that same lease instead of a second one or a 409.
        let request_id = options.request_id.unwrap_or_else(random_request_id);
        let body = json!({
            "holder": options.holder,
            "ttl_ms": millis(options.ttl),
            "wait_ms": millis(options.wait),
            "request_id": request_id,
        });
        let path = format!("/v1/resources/{}/acquire", segment(resource));
        let timeout = self.timeout + options.wait;
        self.send(|| {
            self.request(Method::POST, &path)
                .timeout(timeout)
                .json(&body)
        })
        .await
    }

    /// Extends a lease by `ttl` from now (`None`: its own TTL).
    pub async fn renew(&self, lease_id: &str, ttl: Option<Duration>) -> Result<LeaseInfo> {
        let path = format!("/v1/leases/{}/renew", segment(lease_id));
        let body = ttl.map(|ttl| json!({ "ttl_ms": millis(ttl) }));
        self.send(|| {
            let req = self.request(Method::POST, &path);
            match &body {
                Some(body) => req.json(body),
                None => req,
            }
        })
        .await
    }

    /// One renewal attempt, for the [`Lease`] renewer (which retries
    /// against the lease's deadline itself).
    pub(crate) async fn renew_once(&self, lease_id: &str) -> Result<LeaseInfo> {
        let path = format!("/v1/leases/{}/renew", segment(lease_id));
        self.send_once(self.request(Method::POST, &path)).await
    }

    /// Releases a lease by id. Releasing twice is fine.
    pub async fn release(&self, lease_id: &str) -> Result<LeaseInfo> {
        let path = format!("/v1/leases/{}/release", segment(lease_id));
        self.send(|| self.request(Method::POST, &path)).await
    }

    /// A lease by id, its state current by the server's clock.
    pub async fn lease(&self, lease_id: &str) -> Result<Option<LeaseInfo>> {
        let path = format!("/v1/leases/{}", segment(lease_id));
        not_found_as_none(self.send(|| self.request(Method::GET, &path)).await)
    }

    /// A resource's counters and live holder; `None` if never used.
    pub async fn resource(&self, name: &str) -> Result<Option<ResourceInfo>> {
        let path = format!("/v1/resources/{}", segment(name));
        not_found_as_none(self.send(|| self.request(Method::GET, &path)).await)
    }

    /// Asks the fence whether `token` may write to `resource` now; on
    /// success the server's accepted token becomes at least `token`. Call it
    /// before a write to storage that cannot check tokens itself.
    pub async fn fence(&self, resource: &str, token: i64) -> Result<FenceAccepted> {
        let path = format!("/v1/resources/{}/fence", segment(resource));
        let body = json!({ "token": token });
        self.send(|| self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Writes to the built-in fenced store: checked and written atomically.
    pub async fn write_value<T: Serialize + ?Sized>(
        &self,
        resource: &str,
        token: i64,
        value: &T,
    ) -> Result<WriteReceipt> {
        let path = format!("/v1/resources/{}/value", segment(resource));
        let body = json!({ "token": token, "value": value });
        // Never retried: if the first attempt landed and the lease ended in
        // between, a retry would report a stale token for a write that
        // happened. The caller decides, knowing its own data.
        self.send_once(self.request(Method::PUT, &path).json(&body))
            .await
    }

    /// Reads the built-in store; `None` if nothing was written yet.
    pub async fn read_value<T: DeserializeOwned>(
        &self,
        resource: &str,
    ) -> Result<Option<StoredValue<T>>> {
        let path = format!("/v1/resources/{}/value", segment(resource));
        not_found_as_none(self.send(|| self.request(Method::GET, &path)).await)
    }

    /// One page of the event log.
    pub async fn events(&self, filter: &EventFilter) -> Result<EventPage> {
        let query = filter.query();
        self.send(|| self.request(Method::GET, "/v1/events").query(&query))
            .await
    }

    /// Ends a resource's live lease (admin; needs the admin bearer token).
    pub async fn force_release(&self, resource: &str, reason: &str) -> Result<LeaseInfo> {
        let path = format!("/v1/admin/resources/{}/force-release", segment(resource));
        let body = json!({ "reason": reason });
        // Not retried: a retry after a lost answer would say `lock_not_held`.
        self.send_once(self.request(Method::POST, &path).json(&body))
            .await
    }

    pub(crate) fn renew_fraction(&self) -> f64 {
        self.renew_fraction
    }
}

fn not_found_as_none<T>(result: Result<T>) -> Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(Error::NotFound { code, .. }) if code != crate::http::error::ErrorCode::NotFound => {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

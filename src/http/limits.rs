//! Per-client rate limiting: a token bucket per client IP address, so one
//! runaway client gets 429s quickly instead of starving everyone else.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// Above this many tracked clients, idle (full) buckets are dropped, so a
/// flood from many addresses cannot grow memory without bound.
const MAX_TRACKED_CLIENTS: usize = 100_000;

pub struct RateLimiter {
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// `per_sec` requests per second sustained, `burst` at once; `None`
    /// when `per_sec` is 0 (no limit).
    pub fn new(per_sec: u32, burst: u32) -> Option<Self> {
        (per_sec > 0).then(|| Self {
            per_sec: f64::from(per_sec),
            burst: f64::from(burst.max(per_sec)),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// Takes one request's token, or says how long until one is available.
    pub fn check(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_TRACKED_CLIENTS {
            let (per_sec, burst) = (self.per_sec, self.burst);
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.updated).as_secs_f64() * per_sec < burst
            });
        }
        let bucket = buckets.entry(client).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let refilled =
            bucket.tokens + now.duration_since(bucket.updated).as_secs_f64() * self.per_sec;
        bucket.tokens = refilled.min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.per_sec,
            ))
        }
    }
}

/// Health probes and metrics scrapes are never limited.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

pub async fn rate_limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (Some(limiter), Some(ConnectInfo(peer))) = (
        state.rate_limiter.as_deref(),
        req.extensions().get::<ConnectInfo<SocketAddr>>().copied(),
    ) else {
        return next.run(req).await;
    };
    if exempt(req.uri().path()) {
        return next.run(req).await;
    }
    match limiter.check(peer.ip(), Instant::now()) {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            let mut response = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many requests from this client; slow down",
            )
            .into_response();
            let secs = wait.as_secs_f64().ceil().max(1.0).to_string();
            if let Ok(value) = HeaderValue::from_str(&secs) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let limiter = RateLimiter::new(10, 20).unwrap();
        let ip: IpAddr = [10, 0, 0, 1].into();
        let t0 = Instant::now();
        for _ in 0..20 {
            assert!(limiter.check(ip, t0).is_ok());
        }
        let wait = limiter.check(ip, t0).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // 100 ms later one more request is allowed, and only one.
        let t1 = t0 + Duration::from_millis(100);
        assert!(limiter.check(ip, t1).is_ok());
        assert!(limiter.check(ip, t1).is_err());
        // Another client has its own bucket.
        assert!(limiter.check([10, 0, 0, 2].into(), t1).is_ok());
    }

    #[test]
    fn zero_means_no_limit() {
        assert!(RateLimiter::new(0, 100).is_none());
    }
}

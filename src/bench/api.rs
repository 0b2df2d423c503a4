//! The few v1 API calls the benchmark makes, with replies sorted into what
//! the scenario expected, an expected refusal, or an error.

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

/// A granted lease: what later calls need of it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub lease_id: String,
    pub token: i64,
}

/// A call that did not go as the scenario expected.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        what: &'static str,
        status: StatusCode,
        body: String,
    },
    #[error("{what}: {source}")]
    Transport {
        what: &'static str,
        source: reqwest::Error,
    },
    #[error("{what}: unexpected reply {body}")]
    Shape { what: &'static str, body: String },
}

/// An acquire's answer.
pub enum Acquire {
    Granted(Lease),
    /// 409 `lock_held`: someone else holds it (after any wait).
    Held,
}

/// A fenced write's answer.
pub enum Write {
    Accepted,
    /// 409 `stale_token`.
    Stale,
}

#[derive(Clone)]
pub struct Api {
    client: Client,
    base: String,
}

impl Api {
    pub fn new(client: Client, base: &str) -> Self {
        Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    pub async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<Acquire, CallError> {
        const WHAT: &str = "acquire";
        let url = format!("{}/v1/resources/{resource}/acquire", self.base);
        let body = json!({"holder": holder, "ttl_ms": ttl_ms, "wait_ms": wait_ms});
        let (status, reply) = self.call(WHAT, self.client.post(url).json(&body)).await?;
        match status {
            StatusCode::OK => Ok(Acquire::Granted(lease_of(WHAT, &reply)?)),
            StatusCode::CONFLICT if error_code(&reply) == Some("lock_held") => Ok(Acquire::Held),
            _ => Err(status_error(WHAT, status, &reply)),
        }
    }

    pub async fn release(&self, lease: &Lease) -> Result<(), CallError> {
        const WHAT: &str = "release";
        let url = format!("{}/v1/leases/{}/release", self.base, lease.lease_id);
        let (status, reply) = self.call(WHAT, self.client.post(url)).await?;
        match status {
            StatusCode::OK => Ok(()),
            _ => Err(status_error(WHAT, status, &reply)),
        }
    }

    pub async fn renew(&self, lease: &Lease, ttl_ms: u64) -> Result<(), CallError> {
        const WHAT: &str = "renew";
        let url = format!("{}/v1/leases/{}/renew", self.base, lease.lease_id);
        let body = json!({"ttl_ms": ttl_ms});
        let (status, reply) = self.call(WHAT, self.client.post(url).json(&body)).await?;
        match status {
            StatusCode::OK => Ok(()),
            _ => Err(status_error(WHAT, status, &reply)),
        }
    }

    /// A write to the built-in fenced store.
    pub async fn write(&self, resource: &str, token: i64, value: u64) -> Result<Write, CallError> {
        const WHAT: &str = "write";
        let url = format!("{}/v1/resources/{resource}/value", self.base);
        let body = json!({"token": token, "value": {"n": value}});
        let (status, reply) = self.call(WHAT, self.client.put(url).json(&body)).await?;
        match status {
            StatusCode::OK => Ok(Write::Accepted),
            StatusCode::CONFLICT if error_code(&reply) == Some("stale_token") => Ok(Write::Stale),
            _ => Err(status_error(WHAT, status, &reply)),
        }
    }

    async fn call(
        &self,
        what: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, Value), CallError> {
        let transport = |source| CallError::Transport { what, source };
        let res = req.send().await.map_err(transport)?;
        let status = res.status();
        let text = res.text().await.map_err(transport)?;
        let reply = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, reply))
    }
}

fn lease_of(what: &'static str, reply: &Value) -> Result<Lease, CallError> {
    match (reply["lease_id"].as_str(), reply["token"].as_i64()) {
        (Some(id), Some(token)) => Ok(Lease {
            lease_id: id.to_owned(),
            token,
        }),
        _ => Err(CallError::Shape {
            what,
            body: reply.to_string(),
        }),
    }
}

fn error_code(reply: &Value) -> Option<&str> {
    reply["error"]["code"].as_str()
}

fn status_error(what: &'static str, status: StatusCode, reply: &Value) -> CallError {
    CallError::Status {
        what,
        status,
        body: reply.to_string(),
    }
}

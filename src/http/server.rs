//! The accept loop: serves the router over HTTP/1.1 with the slow-client
//! (slowloris) limits `axum::serve` does not set. A client gets a deadline
//! for its request head and another for its body; past either the
//! connection is closed, so a trickling client holds one task and one socket
//! for a bounded time and never delays anyone else.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_http::timeout::DeadlineBody;

/// How long a client may take to send a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// From when the server starts waiting for a request until its head
    /// has arrived. The wait starts when the previous response is sent, so
    /// this is also how long an idle keep-alive connection stays open: keep
    /// it above the idle timeout of any load balancer in front (60 s on
    /// common ones), or the balancer may reuse a connection just as it
    /// closes.
    pub header: Duration,
    /// From the end of the head until the end of the body; past it, reading
    /// the body fails with 408 `request_timeout` and the connection closes.
    pub body: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            header: Duration::from_secs(75),
            body: Duration::from_secs(30),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and waits for open connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: ClientTimeouts,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    on_accept_error(&err).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small responses go out at once instead of waiting for the
        // client's ACK of the previous segment (Nagle's algorithm).
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, %peer, "cannot set TCP_NODELAY");
        }
        let router = router.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let mut req = req.map(|body| with_deadline(body, timeouts.body));
            // What `into_make_service_with_connect_info` would insert: the
            // rate limiter keys on it.
            req.extensions_mut().insert(ConnectInfo(peer));
            let router = router.clone();
            // The router's error type is `Infallible`: every failure is a response.
            router.oneshot(req)
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                // Timeouts, resets and clients that hang up mid-request.
                tracing::debug!(error = %err, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A body that must arrive within `deadline`; bodiless requests (most GETs)
/// skip the timer.
fn with_deadline(body: Incoming, deadline: Duration) -> Body {
    if body.is_end_stream() {
        Body::new(body)
    } else {
        Body::new(DeadlineBody::new(deadline, body))
    }
}

/// A failed accept: a client that left before we got to it is nothing; a
/// full file table is worth a log line and a pause, rather than a busy loop.
async fn on_accept_error(err: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::error!(error = %err, "cannot accept connections; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

//! A TCP proxy between the Palisade instances and the database that can
//! stall traffic (packets stop flowing, connections stay open) or cut every
//! connection, to simulate a flaky network.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    stalled: watch::Sender<bool>,
    /// Bumped to cut every open connection.
    cuts: watch::Sender<u64>,
}

impl Proxy {
    /// Listens on a random loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr, stop: CancellationToken) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = Proxy {
            addr: listener.local_addr()?,
            stalled: watch::channel(false).0,
            cuts: watch::channel(0).0,
        };
        let accept = proxy.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        if let Ok((inbound, _)) = accepted {
                            tokio::spawn(accept.clone().forward(inbound, upstream, stop.clone()));
                        }
                    }
                    () = stop.cancelled() => return,
                }
            }
        });
        Ok(proxy)
    }

    /// Stops all traffic for `duration`, keeping connections open.
    pub async fn stall(&self, duration: Duration) {
        self.stalled.send_replace(true);
        tokio::time::sleep(duration).await;
        self.stalled.send_replace(false);
    }

    /// Drops every open connection.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    async fn forward(self, inbound: TcpStream, upstream: SocketAddr, stop: CancellationToken) {
        let Ok(outbound) = TcpStream::connect(upstream).await else {
            return;
        };
        let (ri, wi) = inbound.into_split();
        let (ro, wo) = outbound.into_split();
        let mut cuts = self.cuts.subscribe();
        cuts.mark_unchanged();
        tokio::select! {
            () = pump(ri, wo, self.stalled.subscribe()) => {}
            () = pump(ro, wi, self.stalled.subscribe()) => {}
            _ = cuts.changed() => {}
            () = stop.cancelled() => {}
        }
    }
}

/// Copies bytes one way, holding them back while the proxy is stalled.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while *stalled.borrow_and_update() {
            if stalled.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

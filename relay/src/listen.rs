//! Accepting connections: every listen address, a cap on open connections
//! per peer address, and HTTP/1 served by hyper with a deadline on every
//! request head (and upgrades, for WebSocket).
//!
//! Why not `axum::serve`: it sets no timer, so hyper's header read timeout
//! never fires, and it has no per-peer limit. Measured from outside, none
//! of 500 half-sent requests and none of 100 silent TCP connections had
//! been closed after 40 s. Here a connection must complete each request
//! head (the first, and the next on a kept-alive connection, so also the
//! wait before a WebSocket upgrade) within `limits.header_read_timeout_ms`,
//! and one address holds at most `limits.max_connections_per_ip` open
//! connections, WebSockets included.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// Open connections per peer address, bounded.
pub struct PeerCap {
    max: u32,
    exempt: Vec<IpAddr>,
    /// Addresses with at least one open connection (so at most the number
    /// of open connections).
    open: Mutex<HashMap<IpAddr, u32>>,
}

/// One open connection's place under its address's cap; released on drop.
struct PeerSlot {
    cap: Option<(Arc<PeerCap>, IpAddr)>,
}

impl PeerCap {
    pub fn new(max: u32, exempt: &[IpAddr]) -> Arc<Self> {
        assert!(max > 0, "validated at load");
        Arc::new(Self {
            max,
            exempt: exempt.iter().map(IpAddr::to_canonical).collect(),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u32>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection from `ip`, or `None` when `ip` holds its
    /// maximum already. (An IPv4 client of a dual-stack listener arrives
    /// as `::ffff:a.b.c.d`: counted, and exempted, as `a.b.c.d`.)
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        if self.exempt.contains(&ip) {
            return Some(PeerSlot { cap: None });
        }
        let mut open = self.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            cap: Some((self.clone(), ip)),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some((cap, ip)) = self.cap.take() {
            let mut open = cap.lock();
            if let Some(n) = open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&ip);
                }
            }
        }
    }
}

/// A connection's socket and its slot: hyper hands this very socket to a
/// WebSocket upgrade, so the slot is held until the WebSocket ends too.
/// Dropping it closes the socket gracefully ([`linger`]).
struct Tracked {
    tcp: Option<TcpStream>,
    slot: Option<PeerSlot>,
}

impl Tracked {
    fn tcp(&mut self) -> &mut TcpStream {
        self.tcp.as_mut().expect("the socket is taken only on drop")
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let (Some(tcp), Ok(rt)) = (self.tcp.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(linger(tcp, self.slot.take()));
        }
    }
}

/// How long a closed connection's input is still read (and dropped).
const LINGER: Duration = Duration::from_secs(2);
/// Input read (and dropped) after close, at most.
const LINGER_BYTES: usize = 4 << 20;

/// Closes a socket the way RFC 6455 and HTTP servers must: send FIN, then
/// read and drop what the peer still sends until it closes too (bounded in
/// time and bytes), and only then release the socket. Closing it with
/// unread input makes the kernel send RST, and a RST destroys what the
/// peer has not read yet: a client that sent a frame over the hard size
/// limit sometimes saw the connection drop (1006) instead of reading the
/// 1009 close frame sent just before. The address's slot is held until
/// the end, so lingering sockets count against its cap.
async fn linger(mut tcp: TcpStream, slot: Option<PeerSlot>) {
    let _ = tokio::time::timeout(LINGER, async {
        let _ = tcp.shutdown().await;
        let mut sink = [0u8; 8192];
        let mut read = 0usize;
        while read < LINGER_BYTES {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
    drop(slot);
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().tcp()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().tcp()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().tcp()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().tcp()).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().tcp()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.as_ref().is_some_and(TcpStream::is_write_vectored)
    }
}

/// How connections are served.
#[derive(Clone)]
pub struct Serving {
    pub app: Router,
    pub cap: Arc<PeerCap>,
    pub header_read_timeout: Duration,
    pub shutdown: CancellationToken,
}

/// Serves every listener until `shutdown`, then lets the open HTTP
/// connections finish their requests (WebSocket connections are the
/// caller's: they are tracked where they are started).
pub async fn serve(listeners: Vec<TcpListener>, serving: Serving) {
    let conns = TaskTracker::new();
    let loops: Vec<_> = listeners
        .into_iter()
        .map(|l| tokio::spawn(accept_loop(l, serving.clone(), conns.clone())))
        .collect();
    for l in loops {
        let _ = l.await;
    }
    conns.close();
    conns.wait().await;
}

async fn accept_loop(listener: TcpListener, serving: Serving, conns: TaskTracker) {
    loop {
        let accepted = tokio::select! {
            _ = serving.shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, most likely: wait for some to
                // close instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Nostr traffic is many small frames (EVENT ... EOSE, OK): with
        // Nagle's algorithm each small frame after another waits for the
        // peer's delayed ACK (up to 40 ms), which dominated query and OK
        // latency.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        match serving.cap.take(peer.ip()) {
            Some(slot) => {
                conns.spawn(serve_connection(
                    Tracked {
                        tcp: Some(tcp),
                        slot: Some(slot),
                    },
                    peer,
                    serving.clone(),
                ));
            }
            None => {
                tracing::debug!(%peer, "connection refused: too many from this address");
                conns.spawn(refuse(tcp));
            }
        }
    }
}

async fn serve_connection(io: Tracked, peer: SocketAddr, serving: Serving) {
    let app = serving.app.map_request(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req.map(axum::body::Body::new)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(serving.header_read_timeout);
    let conn = builder
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        }
        _ = serving.shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Answers a connection over its address's cap with 429 and a JSON body,
/// then closes it as [`linger`] does (so that the answer is read).
async fn refuse(mut tcp: TcpStream) {
    const BODY: &str = r#"{"error":"too_many_connections","message":"too many open connections from this address; close some and retry"}"#;
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    if tokio::time::timeout(LINGER, tcp.write_all(answer.as_bytes()))
        .await
        .is_ok()
    {
        linger(tcp, None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::PeerCap;
    use std::net::IpAddr;

    #[test]
    fn cap_per_address_released_on_drop_and_exempt_addresses() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let cap = PeerCap::new(2, &[loopback]);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = cap.take(a).unwrap();
        let _s2 = cap.take(a).unwrap();
        assert!(cap.take(a).is_none());
        assert!(cap.take(b).is_some());
        drop(s1);
        assert!(cap.take(a).is_some());
        // Exempt, also when it arrives IPv4-mapped on a dual-stack socket.
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..10).map(|_| cap.take(mapped).unwrap()).collect();
        assert_eq!(held.len(), 10);
        assert!(cap.lock().get(&loopback).is_none());
    }
}

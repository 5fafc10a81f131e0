//! Accepted connections, counted against `--max-connections`, and what each stream learns about
//! its connection: the peer, when it was accepted (for `--max-connection-age`), and whether it is
//! one over the limit.
//!
//! A connection over the limit is not dropped at once: it is served for [`OVER_LIMIT_LIFE`], in
//! which every stream on it is refused with a status naming the limit (so the peer's log says
//! why), and then closed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TlsConnectInfo};

/// How long a connection over `--max-connections` is kept to answer its streams' refusals.
pub const OVER_LIMIT_LIFE: Duration = Duration::from_secs(2);

/// What a stream knows about its connection (tonic puts it in every request's extensions).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// When the connection was accepted.
    pub accepted: Instant,
    /// `Some(limit)` if this connection is over `--max-connections`.
    pub over_limit: Option<usize>,
}

impl ConnInfo {
    /// The connection of `req` (plain or TLS), if it came through [`Conn`].
    pub fn of<B>(req: &http::Request<B>) -> Option<&ConnInfo> {
        let ext = req.extensions();
        ext.get::<ConnInfo>()
            .or_else(|| ext.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
    }

    /// The peer, for logs.
    pub fn peer(info: Option<&ConnInfo>) -> String {
        info.and_then(|i| i.remote)
            .map_or_else(|| "unknown".to_string(), |a| a.to_string())
    }
}

/// Counts open connections against a limit.
#[derive(Clone, Debug)]
pub struct ConnLimiter {
    open: Arc<AtomicUsize>,
    limit: usize,
}

impl ConnLimiter {
    /// A limiter over the shared counter `open`.
    pub fn new(open: Arc<AtomicUsize>, limit: usize) -> Self {
        Self { open, limit }
    }

    /// Wraps an accepted connection: counted if within the limit, else marked over it and
    /// closed after [`OVER_LIMIT_LIFE`].
    pub fn accept(&self, io: TcpStream) -> Conn {
        let remote = io.peer_addr().ok();
        let accepted = Instant::now();
        let within = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        Conn {
            io,
            info: ConnInfo {
                remote,
                accepted,
                over_limit: (!within).then_some(self.limit),
            },
            slot: within.then(|| Slot(self.open.clone())),
            close_at: (!within).then(|| Box::pin(tokio::time::sleep(OVER_LIMIT_LIFE))),
        }
    }
}

/// A connection's place in the count, given back when it closes.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An accepted TCP connection as the server sees it.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    info: ConnInfo,
    slot: Option<Slot>,
    /// For a connection over the limit: when it reads as closed.
    close_at: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    /// Whether this connection counts within the limit.
    pub fn counted(&self) -> bool {
        self.slot.is_some()
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(close) = self.close_at.as_mut() {
            if close.as_mut().poll(cx).is_ready() {
                // End of stream: the HTTP/2 connection closes.
                return Poll::Ready(Ok(()));
            }
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_over_the_limit_are_marked_and_the_count_is_given_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let open = Arc::new(AtomicUsize::new(0));
        let limiter = ConnLimiter::new(open.clone(), 1);
        let mut accepted = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..2 {
            clients.push(TcpStream::connect(addr).await.expect("connect"));
            let (io, _) = listener.accept().await.expect("accept");
            accepted.push(limiter.accept(io));
        }
        assert!(accepted[0].counted() && accepted[0].connect_info().over_limit.is_none());
        assert!(!accepted[1].counted());
        assert_eq!(accepted[1].connect_info().over_limit, Some(1));
        assert!(accepted[1].connect_info().remote.is_some());
        assert_eq!(open.load(Ordering::SeqCst), 1);
        drop(accepted);
        assert_eq!(
            open.load(Ordering::SeqCst),
            0,
            "closed connections give their slot back"
        );
    }
}

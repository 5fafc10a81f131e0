//! Accepted connections, counted against `--max-connections` and `--max-connections-per-peer`,
//! closed when they hold no stream for `--idle-connection-timeout`, and what each stream
//! learns about its connection: the peer, when it was accepted (for `--max-connection-age`),
//! and whether it is one over a limit.
//!
//! A connection over a limit is served for at most [`OVER_LIMIT_LIFE`], in which every stream
//! on it is refused with a status naming the limit (so the peer's log says why), and then
//! closed; at most [`OVER_LIMIT_HELD`] are held so at once, and the rest are closed as soon as
//! they are accepted (a flood of connections costs a descriptor each for a moment, no more).
//!
//! A connection's streams are counted by [`StreamsLayer`] (every gRPC stream: MCP, health,
//! reflection), so the idle timer runs only while none is open: `--idle-connection-timeout`
//! from the accept for a connection that never opened one, [`IDLE_AFTER_STREAMS`] from the end
//! of its last one otherwise. The close is an end of input under HTTP/2 (or TLS), which ends
//! the connection; there is no stream to carry a status, so it is counted and logged here.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TlsConnectInfo};

use crate::goaway::{FrameTrack, GOAWAY};
use crate::limits::{Refused, ServerLimits};
use crate::metrics::ServerMetrics;

/// How long a connection over a limit is kept to answer its streams' refusals.
pub const OVER_LIMIT_LIFE: Duration = Duration::from_secs(1);

/// How many connections over a limit are held at once; more are closed when accepted.
pub const OVER_LIMIT_HELD: usize = 8;

/// How long a connection told to go away (below) may finish before it is closed regardless.
pub const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// A connection whose streams all ended is closed after this long without one (or
/// `--idle-connection-timeout`, if longer). Longer than for a connection that never opened a
/// stream: a client keeps its connection between calls (a sink retrying with backoff, a
/// prober, a loaded peer between waves of streams), and closing it under a stream it is just
/// opening fails that stream; but it must end some time, or a peer could hold its slot by
/// opening one stream.
pub const IDLE_AFTER_STREAMS: Duration = Duration::from_secs(60);

/// What a stream knows about its connection (tonic puts it in every request's extensions).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// When the connection was accepted.
    pub accepted: Instant,
    /// `Some(refusal)` if this connection is over `--max-connections` or
    /// `--max-connections-per-peer`.
    pub over_limit: Option<Refused>,
    /// Its open streams, for the idle timer.
    activity: Arc<Activity>,
    /// Its large requests waiting for the budget now (`request_body`).
    pub large_waiting: Arc<AtomicUsize>,
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

/// Connections open now by peer address, and how many are held over a limit: shared by every
/// shard's port (in [`ServerLimits::peers`]).
#[derive(Debug, Default)]
pub struct Peers {
    by_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Streams open now by peer address (`--max-streams-per-peer`).
    streams_by_ip: Mutex<HashMap<IpAddr, usize>>,
    over_limit: AtomicUsize,
}

/// A stream's place in its peer's share of the stream slots, given back on drop.
#[derive(Debug)]
pub struct PeerStream {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Drop for PeerStream {
    fn drop(&mut self) {
        let mut by_ip = self
            .peers
            .streams_by_ip
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&self.ip);
            }
        }
    }
}

impl Peers {
    /// Takes a place for `ip` unless it has `max` already.
    fn take(&self, ip: IpAddr, max: usize) -> bool {
        let mut by_ip = self.by_ip.lock().unwrap_or_else(PoisonError::into_inner);
        let n = by_ip.entry(ip).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn give_back(&self, ip: IpAddr) {
        let mut by_ip = self.by_ip.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&ip);
            }
        }
    }

    /// A place for one more stream of `ip` unless it has `max` open already.
    pub fn take_stream(peers: &Arc<Peers>, ip: IpAddr, max: usize) -> Option<PeerStream> {
        let mut by_ip = peers
            .streams_by_ip
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = by_ip.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerStream {
            peers: Arc::clone(peers),
            ip,
        })
    }

    /// Peer addresses with a connection open (tests).
    pub fn addresses(&self) -> usize {
        self.by_ip
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A connection's open streams, and since when it has none.
#[derive(Debug)]
struct Activity {
    /// Open streams, when the count last became 0 (or the connection was accepted), and
    /// whether it ever opened one.
    state: Mutex<(usize, Instant, bool)>,
    /// The connection's reader, woken when its last stream ends (the idle timer starts).
    reader: AtomicWaker,
}

impl Activity {
    fn new(at: Instant) -> Self {
        Self {
            state: Mutex::new((0, at, false)),
            reader: AtomicWaker::new(),
        }
    }

    fn open(self: &Arc<Self>) -> StreamGuard {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += 1;
        state.2 = true;
        StreamGuard(self.clone())
    }

    /// When the connection became idle, if it is, and whether it had a stream before.
    fn idle_since(&self) -> Option<(Instant, bool)> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (state.0 == 0).then_some((state.1, state.2))
    }
}

/// One open stream of a connection.
#[derive(Debug)]
struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 -= 1;
        if state.0 == 0 {
            state.1 = Instant::now();
            drop(state);
            self.0.reader.wake();
        }
    }
}

/// Admits accepted connections against the limits.
#[derive(Clone, Debug)]
pub struct ConnLimiter {
    limits: Arc<ServerLimits>,
    metrics: ServerMetrics,
    /// HTTP/2 runs right on the connection (no TLS): a close can be a GOAWAY.
    plain: bool,
}

impl ConnLimiter {
    /// A limiter over `limits`' shared counters.
    pub fn new(limits: Arc<ServerLimits>, metrics: ServerMetrics) -> Self {
        Self {
            limits,
            metrics,
            plain: true,
        }
    }

    /// For connections that carry TLS: closed by their end of input, not a GOAWAY.
    pub fn under_tls(mut self, tls: bool) -> Self {
        self.plain = !tls;
        self
    }

    /// Takes a place within `--max-connections-per-peer` and `--max-connections`.
    fn admit(&self, ip: Option<IpAddr>) -> Result<Slot, Refused> {
        let l = &self.limits;
        if let Some(ip) = ip {
            if !l.peers.take(ip, l.bounds.max_per_peer) {
                return Err(Refused::ConnectionsPerPeer {
                    limit: l.bounds.max_per_peer,
                });
            }
        }
        let within = l
            .connections
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < l.max_connections).then_some(n + 1)
            })
            .is_ok();
        if !within {
            if let Some(ip) = ip {
                l.peers.give_back(ip);
            }
            return Err(Refused::Connections {
                limit: l.max_connections,
            });
        }
        Ok(Slot::new(self, Place::Within(ip)))
    }

    /// Wraps an accepted connection: counted if within the limits; else held to answer its
    /// streams for [`OVER_LIMIT_LIFE`] if fewer than [`OVER_LIMIT_HELD`] are, or `None`: the
    /// caller drops (closes) it.
    pub fn accept(&self, io: TcpStream) -> Option<Conn> {
        let remote = io.peer_addr().ok();
        let accepted = Instant::now();
        let (slot, over_limit, close_at) = match self.admit(remote.map(|a| a.ip())) {
            Ok(slot) => (slot, None, None),
            Err(refused) => {
                let peer = remote.map_or_else(|| "unknown".to_string(), |a| a.to_string());
                self.limits
                    .refused_connection(&self.metrics, &refused, &peer);
                let held = self.limits.peers.over_limit.fetch_update(
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                    |n| (n < OVER_LIMIT_HELD).then_some(n + 1),
                );
                held.ok()?;
                (
                    Slot::new(self, Place::OverLimit),
                    Some(refused),
                    Some(accepted + OVER_LIMIT_LIFE),
                )
            }
        };
        Some(Conn {
            io,
            info: ConnInfo {
                remote,
                accepted,
                over_limit,
                activity: Arc::new(Activity::new(accepted)),
                large_waiting: Arc::default(),
            },
            slot,
            close_at,
            idle_timeout: self.limits.bounds.idle_timeout,
            timer: Box::pin(tokio::time::sleep_until(accepted)),
            closing: Closing::Open,
            frames: self.plain.then(FrameTrack::default),
            aged: self.limits.max_connection_age.map(|age| {
                let at = accepted + age + self.limits.connection_age_grace + AGE_CLOSE_AFTER;
                Box::pin(tokio::time::sleep_until(at))
            }),
        })
    }
}

/// Where a connection is counted.
#[derive(Debug)]
enum Place {
    /// Within the limits (from this address, if known).
    Within(Option<IpAddr>),
    /// Held over a limit.
    OverLimit,
}

/// A connection's place in the counts, given back when it closes.
#[derive(Debug)]
struct Slot {
    limiter: ConnLimiter,
    place: Place,
}

impl Slot {
    fn new(limiter: &ConnLimiter, place: Place) -> Self {
        limiter.gauge(&place).inc();
        Self {
            limiter: limiter.clone(),
            place,
        }
    }
}

impl ConnLimiter {
    fn gauge(&self, place: &Place) -> prometheus::IntGauge {
        let state = match place {
            Place::Within(_) => "served",
            Place::OverLimit => "over_limit",
        };
        self.metrics.connections.with_label_values(&[state])
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limiter.gauge(&self.place).dec();
        let l = &self.limiter.limits;
        match self.place {
            Place::Within(ip) => {
                l.connections.fetch_sub(1, Ordering::SeqCst);
                if let Some(ip) = ip {
                    l.peers.give_back(ip);
                }
            }
            Place::OverLimit => {
                l.peers.over_limit.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// At `--max-connection-age` a connection is told to go away and its streams end after
/// `--max-connection-age-grace`; one still open this much later has a peer that stopped reading
/// (hyper's graceful close waits for it to take what is queued, and the peer still answers
/// pings). It is closed then, as gRPC's own servers close at the age and its grace: otherwise
/// it keeps its place under `--max-connections` and what it was sent, for as long as the peer
/// likes.
pub const AGE_CLOSE_AFTER: Duration = Duration::from_secs(5);

/// An accepted TCP connection as the server sees it.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    info: ConnInfo,
    slot: Slot,
    /// For a connection over a limit: when it reads as closed.
    close_at: Option<Instant>,
    /// `--idle-connection-timeout`.
    idle_timeout: Option<Duration>,
    /// Fires at `close_at`, or when the idle timeout runs out; then at the end of the
    /// [`GOAWAY_GRACE`].
    timer: Pin<Box<Sleep>>,
    closing: Closing,
    /// Where the peer's HTTP/2 frames start (`None` under TLS).
    frames: Option<FrameTrack>,
    /// With `--max-connection-age`: fires [`AGE_CLOSE_AFTER`] after the age and its grace, when
    /// the connection reads as ended and writes fail, whatever its peer does.
    aged: Option<Pin<Box<Sleep>>>,
}

/// How far a connection is from being closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    Open,
    /// A GOAWAY was read in: the server closes it, or its end of input does at the timer.
    GoingAway,
    /// Reads as ended.
    Closed,
}

impl Conn {
    /// Whether this connection counts within the limits.
    pub fn counted(&self) -> bool {
        matches!(self.slot.place, Place::Within(_))
    }

    /// When this connection is to be closed, as things stand.
    fn due(&self) -> Option<Instant> {
        self.close_at.or_else(|| {
            let idle = self.idle_timeout?;
            let (since, used) = self.info.activity.idle_since()?;
            Some(
                since
                    + if used {
                        idle.max(IDLE_AFTER_STREAMS)
                    } else {
                        idle
                    },
            )
        })
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl Conn {
    /// Whether the age, its grace and [`AGE_CLOSE_AFTER`] are over (registering `cx` to be
    /// woken when they are).
    fn aged(&mut self, cx: &mut Context<'_>) -> bool {
        self.aged
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
    }

    /// What a write gets once [`Conn::aged`].
    fn aged_error() -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the connection outlived --max-connection-age and its grace: its peer stopped reading",
        )
    }

    /// The idle close is due: a GOAWAY read in if the peer is between HTTP/2 frames, else the
    /// end of input (which ends the HTTP/2 connection, or the TLS handshake). (A connection
    /// over a limit answered its streams already: it just ends.)
    fn close(&mut self, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Some(timeout) = self.idle_timeout {
            // There is no stream to carry a status: counted and logged here.
            let peer = ConnInfo::peer(Some(&self.info));
            let limiter = &self.slot.limiter;
            limiter.limits.refused_connection(
                &limiter.metrics,
                &Refused::IdleConnection { timeout },
                &peer,
            );
        }
        let between = self.frames.as_ref().is_some_and(FrameTrack::between_frames);
        if between && buf.remaining() >= GOAWAY.len() {
            buf.put_slice(&GOAWAY);
            self.closing = Closing::GoingAway;
            let at = Instant::now() + GOAWAY_GRACE;
            self.timer.as_mut().reset(at);
        } else {
            self.closing = Closing::Closed;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.aged(cx) {
            self.closing = Closing::Closed;
        }
        if self.closing == Closing::Closed {
            return Poll::Ready(Ok(()));
        }
        // A connection over a limit, or told to go away, ends on time whatever its peer sends.
        if self.close_at.is_some() || self.closing == Closing::GoingAway {
            if let Some(at) = self.close_at.filter(|_| self.closing == Closing::Open) {
                if self.timer.deadline() != at {
                    self.timer.as_mut().reset(at);
                }
            }
            if self.timer.as_mut().poll(cx).is_ready() {
                self.closing = Closing::Closed;
                return Poll::Ready(Ok(()));
            }
        }
        // Registered before the count is read: a stream ending after it wakes this reader.
        self.info.activity.reader.register(cx.waker());
        // What the peer sent is read before the idle deadline is looked at: on a loaded machine
        // this task may run after the deadline with a stream the peer opened in time waiting in
        // the socket.
        let before = buf.filled().len();
        let this = &mut *self;
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Some(frames) = this.frames.as_mut() {
            frames.scan(&buf.filled()[before..]);
        }
        if read.is_ready() {
            return read;
        }
        if self.closing == Closing::Open && self.close_at.is_none() {
            if let Some(due) = self.due() {
                if self.timer.deadline() != due {
                    self.timer.as_mut().reset(due);
                }
                if self.timer.as_mut().poll(cx).is_ready() {
                    return self.close(buf);
                }
            }
        }
        Poll::Pending
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.aged(cx) {
            return Poll::Ready(Err(Self::aged_error()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.aged(cx) {
            return Poll::Ready(Err(Self::aged_error()));
        }
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
        if self.aged(cx) {
            return Poll::Ready(Err(Self::aged_error()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Counts every stream (request) of a connection while its response is open, for the idle
/// timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamsLayer;

impl<S> tower_layer::Layer<S> for StreamsLayer {
    type Service = CountStreams<S>;

    fn layer(&self, inner: S) -> CountStreams<S> {
        CountStreams(inner)
    }
}

/// See [`StreamsLayer`].
#[derive(Clone, Debug)]
pub struct CountStreams<S>(S);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower_service::Service<http::Request<B>> for CountStreams<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let guard = ConnInfo::of(&req).map(|c| c.activity.open());
        let fut = self.0.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| {
                tonic::body::Body::new(Guarded {
                    inner: tonic::body::Body::new(body),
                    _guard: guard,
                })
            }))
        })
    }
}

/// A response body that counts as an open stream until it is dropped.
struct Guarded {
    inner: tonic::body::Body,
    _guard: Option<StreamGuard>,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goaway::PREFACE;
    use crate::limits::{ConnectionBounds, StreamLimits};

    fn limiter(max: usize, per_peer: usize, idle: Option<Duration>) -> ConnLimiter {
        let metrics = mcp_core::metrics::Metrics::new("test").expect("metrics");
        let limits = ServerLimits::new(
            StreamLimits::default(),
            max,
            10,
            10,
            1 << 20,
            None,
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .with_connection_bounds(ConnectionBounds {
            idle_timeout: idle,
            max_per_peer: per_peer,
            ..ConnectionBounds::default()
        });
        ConnLimiter::new(
            Arc::new(limits),
            ServerMetrics::new(&metrics).expect("server metrics"),
        )
    }

    async fn connect(listener: &tokio::net::TcpListener, from: [u8; 4]) -> (TcpStream, TcpStream) {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::from((from, 0))).expect("bind");
        let client = socket
            .connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (io, _) = listener.accept().await.expect("accept");
        (client, io)
    }

    fn gauge(l: &ConnLimiter, state: &str) -> i64 {
        l.metrics.connections.with_label_values(&[state]).get()
    }

    #[tokio::test]
    async fn connections_over_the_limits_are_marked_few_are_held_and_counts_come_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let l = limiter(2, 1, None);
        let mut clients = Vec::new();
        let mut conns = Vec::new();
        // One from 127.0.0.1, one from 127.0.0.2: both within.
        for from in [[127, 0, 0, 1], [127, 0, 0, 2]] {
            let (c, io) = connect(&listener, from).await;
            clients.push(c);
            conns.push(l.accept(io).expect("held"));
        }
        assert!(conns.iter().all(Conn::counted));
        assert_eq!(l.limits.peers.addresses(), 2);
        // A second from 127.0.0.1: over the per-peer limit.
        let (c, io) = connect(&listener, [127, 0, 0, 1]).await;
        clients.push(c);
        let per_peer = l.accept(io).expect("held over the limit");
        assert!(!per_peer.counted());
        assert_eq!(
            per_peer.connect_info().over_limit,
            Some(Refused::ConnectionsPerPeer { limit: 1 })
        );
        // From 127.0.0.3: over --max-connections. Then more: held up to OVER_LIMIT_HELD.
        let mut over = vec![per_peer];
        let mut dropped = 0;
        for _ in 0..OVER_LIMIT_HELD + 5 {
            let (c, io) = connect(&listener, [127, 0, 0, 3]).await;
            clients.push(c);
            match l.accept(io) {
                Some(conn) => {
                    assert_eq!(
                        conn.connect_info().over_limit,
                        Some(Refused::Connections { limit: 2 })
                    );
                    over.push(conn);
                }
                None => dropped += 1,
            }
        }
        assert_eq!(over.len(), OVER_LIMIT_HELD);
        assert_eq!(dropped, 6);
        assert_eq!((gauge(&l, "served"), gauge(&l, "over_limit")), (2, 8));
        let refused = |label: &str| {
            l.metrics
                .refused_connections
                .with_label_values(&[label])
                .get()
        };
        assert_eq!(refused("connections_per_peer"), 1);
        assert_eq!(refused("connections"), 13);
        drop(over);
        drop(conns);
        assert_eq!(l.limits.connections.load(Ordering::SeqCst), 0);
        assert_eq!(l.limits.peers.addresses(), 0, "given back");
        assert_eq!((gauge(&l, "served"), gauge(&l, "over_limit")), (0, 0));
    }

    /// Reads `conn` until it reads as closed.
    async fn closed(conn: &mut Conn) {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        loop {
            if conn.read(&mut buf).await.expect("read") == 0 {
                return;
            }
        }
    }

    #[tokio::test]
    async fn a_connection_is_closed_when_idle_and_only_then() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let idle = Duration::from_millis(200);
        let l = limiter(4, 4, Some(idle));
        let (_client, io) = connect(&listener, [127, 0, 0, 1]).await;
        let mut conn = l.accept(io).expect("within");
        // A stream is open: the connection is not idle however long it waits.
        let stream = conn.info.activity.open();
        let reading = tokio::time::timeout(idle * 3, closed(&mut conn)).await;
        assert!(reading.is_err(), "closed with a stream open");
        // The stream ends: the connection is closed only after the longer IDLE_AFTER_STREAMS.
        drop(stream);
        assert_eq!(
            conn.due(),
            conn.info.activity.idle_since().map(|(at, used)| {
                assert!(used);
                at + IDLE_AFTER_STREAMS
            })
        );
        // One that never opened a stream is closed after the timeout.
        let (_client, io) = connect(&listener, [127, 0, 0, 1]).await;
        let mut conn = l.accept(io).expect("within");
        let accepted = Instant::now();
        closed(&mut conn).await;
        assert!(accepted.elapsed() >= idle);
        assert_eq!(
            l.metrics
                .refused_connections
                .with_label_values(&["idle_connection_timeout"])
                .get(),
            1
        );
    }

    #[tokio::test]
    async fn an_idle_http2_peer_between_frames_is_told_to_go_away() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let l = limiter(4, 4, Some(Duration::from_millis(100)));
        let (mut client, io) = connect(&listener, [127, 0, 0, 1]).await;
        let mut conn = l.accept(io).expect("within");
        // The preface and an empty SETTINGS frame, in pieces that split both.
        let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        sent.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        for piece in sent.chunks(5) {
            client.write_all(piece).await.expect("write");
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < sent.len() + GOAWAY.len() {
            let n = conn.read(&mut buf).await.expect("read");
            assert!(n > 0, "ended instead: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(&got[..sent.len()], &sent[..]);
        assert_eq!(&got[sent.len()..], &GOAWAY[..], "a GOAWAY read in");
        // Had the server not closed it, the end of input follows the grace.
        closed(&mut conn).await;

        // Half-way through a frame: just the end of input.
        let (mut client, io) = connect(&listener, [127, 0, 0, 1]).await;
        let mut conn = l.accept(io).expect("within");
        client.write_all(&sent[..PREFACE + 4]).await.expect("write");
        let mut got = Vec::new();
        loop {
            let n = conn.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, sent[..PREFACE + 4].to_vec());
    }
}

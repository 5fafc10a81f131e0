//! The gRPC side: every MCP flavour on one port, plus health and reflection.
//!
//! Each stream runs `drive` on its own task: requests and snapshot changes go into the stream's
//! [`engine::Engine`], responses come out through a one-slot channel into the stream's
//! `response_body::ResponseBody`. Resource bytes are shared with the cache: nothing is
//! re-encoded per sink, and no sink holds a copy of a response (see `frames`).
//!
//! What a peer can make the server hold is bounded ([`limits`]): connections ([`conn`]), streams,
//! requests in flight (`request_body`) and each stream's subscription state ([`engine`]).
//!
//! Public: [`serve`] and its [`StreamContext`], the settings ([`limits`], [`tls`]), the
//! [`metrics`], and [`engine`] and [`conn`] for the runtime's benches and tests; the wire layout
//! (`protocol`, `frames`, `request_body`, `response_body`, `grpc`, `goaway`) is private.
//!
//! Depends on `mcp-core` (the snapshots it serves, the metrics registry) and `proto`; must never
//! depend on the runtime (flags, admin, the writer task), the Kubernetes output or a registry.
//! Its settings come in as plain values ([`limits::ServerLimits`], [`tls::TlsSettings`]).

pub mod conn;
pub mod engine;
mod frames;
#[doc(hidden)]
pub mod fuzzing;
mod goaway;
mod grpc;
mod handover;
pub mod limits;
pub mod metrics;
mod protocol;
mod request_body;
mod response_body;
pub mod sync_status;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Status, Streaming};

use crate::metrics::ServerMetrics;
use conn::ConnLimiter;
use engine::{Ack, Engine};
use handover::{hand_over, until, Handed, Unacked};
use limits::{NamesCharge, ServerLimits};
use mcp_core::cache::Snapshot;
use protocol::Protocol;
use response_body::Sent;

/// The receive windows the server offers: what a peer may send ahead of what a stream has read.
/// HTTP/2's own default for a stream (64 KiB) and four of them per connection, instead of
/// hyper's 1 MiB each: a stream whose sink stopped reading responses also stops reading
/// requests, and every connection of a flood would otherwise hold a megabyte.
const STREAM_WINDOW: u32 = 64 << 10;
const CONNECTION_WINDOW: u32 = 256 << 10;

/// How long a stream that ends with an error status waits to hand the status over (its sink
/// may have stopped reading) before it just ends.
const FAREWELL: Duration = Duration::from_secs(5);

/// What every stream needs.
#[derive(Clone, Debug)]
pub struct StreamContext {
    /// The served set; `None` until the first registry sync.
    pub snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    /// Metrics.
    pub metrics: ServerMetrics,
    /// Cancelled on shutdown: every stream ends cleanly.
    pub shutdown: CancellationToken,
    /// Largest response a sink accepts (`--max-message-size`); a larger one ends the stream
    /// with RESOURCE_EXHAUSTED instead of being sent.
    pub max_message_size: Option<usize>,
    /// `--shards`: the shard this port serves (its `mcp_adapter_shard_*` label); `None` for
    /// an unsharded source.
    pub shard: Option<String>,
    /// Limits and their counters, shared by every shard's port.
    pub limits: Arc<ServerLimits>,
    /// Every stream's sync status (`/debug/syncz`), shared by every shard's port.
    pub sync: Arc<sync_status::SyncBoard>,
}

/// Errors starting the gRPC server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The transport failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reflection could not be built.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Serves every protocol on `listener` until `ctx.shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: StreamContext,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    tls: Option<Arc<tls::Tls>>,
) -> Result<(), ServerError> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let allow = tls.as_ref().map(|t| t.client_sans().clone());
    let limits = ctx.limits.clone();
    // Every protocol's sink count exists from the start: "no sink has connected" is a 0 that an
    // alert can see, not a missing series (an adapter with `--output kube` serves none at all).
    for protocol in [
        protocol::Xds::PROTOCOL,
        protocol::Delta::PROTOCOL,
        protocol::Legacy::PROTOCOL,
        protocol::MeshSotw::PROTOCOL,
        protocol::MeshIncremental::PROTOCOL,
    ] {
        ctx.metrics.sinks.with_label_values(&[protocol]);
    }
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(limits.max_streams_per_connection)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    if let Some(age) = limits.max_connection_age {
        // GOAWAY at `age`: the peer opens no new stream on this connection. Its streams end
        // `connection_age_grace` later (in `drive`), and it reconnects, maybe to another replica.
        builder = builder.max_connection_age(age);
    }
    let shutdown = ctx.shutdown.clone();
    let limiter = ConnLimiter::new(limits.clone(), ctx.metrics.clone()).under_tls(tls.is_some());
    // TCP_NODELAY: a push is one write; Nagle would hold its tail for ~40 ms waiting for an
    // ACK. (tonic's own nodelay setting does not apply to a listener passed in.) A connection
    // over a limit that is not held to answer its streams is dropped (closed) here.
    let conns = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .filter_map(move |io| {
            std::future::ready(match io {
                Ok(io) => limiter.accept(io).map(Ok),
                Err(e) => Some(Err(e)),
            })
        });
    let router = builder
        .layer(conn::StreamsLayer)
        .layer(tonic::service::InterceptorLayer::new(tls::authorize(
            allow.unwrap_or_default(),
        )))
        .add_service(grpc::Service::<grpc::Ads>::new(ctx.clone()))
        .add_service(grpc::Service::<grpc::ResourceSource>::new(ctx.clone()))
        .add_service(grpc::Service::<grpc::MeshConfig>::new(ctx))
        .add_service(health)
        .add_service(reflection);
    match tls {
        // TLS is done by the adapter's own acceptor (certificates reloaded on change).
        Some(tls) => {
            let incoming = tls::incoming(conns, tls, shutdown.clone());
            router
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                .await?;
        }
        None => {
            router
                .serve_with_incoming_shutdown(conns, shutdown.cancelled_owned())
                .await?;
        }
    }
    Ok(())
}

struct SinkGauge(prometheus::IntGauge);

impl Drop for SinkGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn type_class(served: bool) -> &'static str {
    if served {
        "serviceentry"
    } else {
        "other"
    }
}

/// Hands a final status to the stream's body, unless the sink stopped reading (then the stream
/// just ends after [`FAREWELL`]) or the adapter shuts down.
async fn farewell(tx: &mpsc::Sender<Sent>, status: Status, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tx.send(Err(status)) => {}
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(FAREWELL) => {}
    }
}

/// What one request did to a stream.
struct Applied {
    /// Its type URL (or collection), for metrics and logs.
    type_key: String,
    ack: Ack,
    out: Option<engine::Outgoing>,
}

/// One decoded request through the stream's engine, within its limits: `drive` runs every
/// message through this, and so do the fuzz targets ([`fuzzing`]), so what they exercise is
/// what a sink reaches. Nothing is applied when the request is refused.
fn apply_request<P: Protocol>(
    engine: &mut Engine,
    names: &mut NamesCharge,
    msg: P::Req,
    snapshot: Option<&Arc<Snapshot>>,
) -> Result<Applied, limits::Refused> {
    let req = P::request(msg);
    engine.check(&req)?;
    let type_key = req.type_key.clone();
    let (ack, out) = engine.on_request(req, snapshot);
    names.set(engine.names_held())?;
    Ok(Applied { type_key, ack, out })
}

/// Runs one stream until the sink leaves, the stream breaks, a limit ends it, or shutdown.
///
/// `accepted` is when its connection was accepted (`--max-connection-age` counts from it);
/// `_slot` is its place under `--max-streams` and `--max-streams-per-peer`, given back when it
/// ends.
async fn drive<P: Protocol>(
    mut requests: Streaming<P::Req>,
    (tx, emptier): (mpsc::Sender<Sent>, response_body::Emptier),
    ctx: StreamContext,
    peer: String,
    accepted: Option<Instant>,
    _slot: limits::StreamSlot,
    mut receiving: request_body::Receiving,
) {
    let metrics = ctx.metrics;
    let limits = ctx.limits;
    let gauge = metrics.sinks.with_label_values(&[P::PROTOCOL]);
    gauge.inc();
    let _gauge = SinkGauge(gauge);
    let shard_push_bytes = ctx.shard.as_ref().map(|s| {
        let gauge = metrics.shard_sinks.with_label_values(&[s]);
        gauge.inc();
        (
            SinkGauge(gauge),
            metrics.shard_push_bytes.with_label_values(&[s]),
        )
    });
    let mut snapshots = ctx.snapshots;
    let mut engine = Engine::with_limits(P::INCREMENTAL, P::served, limits.stream);
    let mut names = NamesCharge::new(limits.names.clone());
    let mut node: Option<String> = None;
    let board = ctx.sync.join(P::PROTOCOL, &peer, ctx.shard.as_deref());
    // After GOAWAY (`--max-connection-age`) and the grace, the stream ends so that the sink
    // reconnects on a new connection.
    let age_end = until(
        accepted
            .zip(limits.max_connection_age)
            .map(|(at, age)| at + age + limits.connection_age_grace),
    );
    tokio::pin!(age_end);
    // This stream counts in `mcp_adapter_unacked_responses` while its oldest unacknowledged
    // response is older than `--unacked-threshold`; the timer fires when it would become so.
    let mut unacked = Unacked::new(
        metrics.unacked.with_label_values(&[P::PROTOCOL]),
        limits.unacked_threshold,
    );
    tracing::info!(protocol = P::PROTOCOL, %peer, "Sink connected.");
    loop {
        let outgoing = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            () = &mut age_end => {
                tracing::info!(protocol = P::PROTOCOL, %peer, "Ending a stream of a connection older than --max-connection-age; the sink reconnects.");
                let status = Status::unavailable(format!(
                    "this connection is older than the adapter's --max-connection-age ({:?}): reconnect (a new connection may reach another replica)",
                    limits.max_connection_age.unwrap_or_default()
                ));
                farewell(&tx, status.clone(), &ctx.shutdown).await;
                // Handed to the body is not written: if the sink stopped reading, it never is.
                emptier.empty_after(FAREWELL, status);
                return;
            }
            () = until(unacked.due()) => Vec::new(),
            msg = requests.message() => match msg {
                Ok(Some(msg)) => {
                    if node.is_none() {
                        if let Some(id) = P::node(&msg) {
                            tracing::info!(protocol = P::PROTOCOL, %peer, node = %id, "Sink identified.");
                            board.identify(&id);
                            node = Some(id);
                        }
                    }
                    // `borrow`, not `borrow_and_update`: only the `changed()` arm may mark a
                    // snapshot as seen, or a change published while this request is handled
                    // would never reach the types this request does not name.
                    let snapshot = snapshots.borrow().clone();
                    let Applied { type_key, ack, out } =
                        match apply_request::<P>(&mut engine, &mut names, msg, snapshot.as_ref()) {
                            Ok(applied) => applied,
                            Err(refused) => {
                                limits.refused(&metrics, &refused, P::PROTOCOL, &peer);
                                farewell(&tx, refused.status(), &ctx.shutdown).await;
                                return;
                            }
                        };
                    let served = P::served(&type_key);
                    if let Some(took) = engine.take_ack_latency() {
                        metrics.ack_latency.with_label_values(&[P::PROTOCOL]).observe(took.as_secs_f64());
                    }
                    match &ack {
                        Ack::Ack => metrics.acks.with_label_values(&[P::PROTOCOL, type_class(served)]).inc(),
                        Ack::Nack(reason) => {
                            metrics.nacks.with_label_values(&[P::PROTOCOL, type_class(served)]).inc();
                            limits.nacked(P::PROTOCOL, &peer, &type_key, reason);
                        }
                        Ack::Subscribe => tracing::debug!(protocol = P::PROTOCOL, %peer, type_url = %type_key, "Subscribed."),
                        Ack::Stale => tracing::debug!(protocol = P::PROTOCOL, %peer, type_url = %type_key, "Ignored a stale nonce."),
                    }
                    out.into_iter().collect::<Vec<_>>()
                }
                Ok(None) => break,
                Err(status) => {
                    // A request over a limit (request_body.rs, or tonic's own): tell the sink.
                    if matches!(status.code(), tonic::Code::ResourceExhausted | tonic::Code::OutOfRange) {
                        tracing::debug!(protocol = P::PROTOCOL, %peer, %status, "Ending a stream over a request limit.");
                        farewell(&tx, status, &ctx.shutdown).await;
                        return;
                    }
                    tracing::debug!(protocol = P::PROTOCOL, %peer, %status, "Sink stream broke.");
                    break;
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                let out = match snapshots.borrow_and_update().clone() {
                    Some(s) => engine.on_snapshot(&s),
                    None => Vec::new(),
                };
                // Sending replaces declared versions with shared sets: this only gives back.
                let _ = names.set(engine.names_held());
                out
            }
        };
        for out in outgoing {
            let served = out.served;
            let resp = P::response(out);
            if let Some(limit) = ctx.max_message_size.filter(|l| resp.len() > *l) {
                metrics.oversized.with_label_values(&[P::PROTOCOL]).inc();
                tracing::error!(protocol = P::PROTOCOL, %peer, bytes = resp.len(), limit, "A response is larger than --max-message-size; ending the stream instead of sending it (shard the source or raise the sink's receive limit).");
                let status = Status::resource_exhausted(format!(
                    "the response is {} bytes, over this source's --max-message-size of {limit} bytes",
                    resp.len()
                ));
                farewell(&tx, status, &ctx.shutdown).await;
                return;
            }
            metrics
                .pushes
                .with_label_values(&[P::PROTOCOL, type_class(served)])
                .inc();
            metrics
                .push_bytes
                .with_label_values(&[P::PROTOCOL])
                .inc_by(resp.len() as u64);
            if let Some((_, bytes)) = &shard_push_bytes {
                bytes.inc_by(resp.len() as u64);
            }
            // A sink that stopped reading blocks this send; shutdown, the connection's age and
            // the unacked timer must not wait on it.
            let oldest = engine.oldest_unacked();
            match hand_over(
                &tx,
                resp,
                &ctx.shutdown,
                age_end.as_mut(),
                &mut unacked,
                oldest,
                &mut receiving,
            )
            .await
            {
                Handed::Late(refused) => {
                    // A large request's deadline passed while the sink did not read: the
                    // stream ends now (its share of the budget goes back with its body), not
                    // when the sink reads again.
                    limits.refused(&metrics, &refused, P::PROTOCOL, &peer);
                    emptier.empty(refused.status());
                    return;
                }
                Handed::Taken => {}
                Handed::Gone => {
                    tracing::info!(protocol = P::PROTOCOL, %peer, "Sink disconnected.");
                    return;
                }
                Handed::Shutdown => {
                    tracing::info!(protocol = P::PROTOCOL, %peer, "Shutting down with a response unsent (the sink stopped reading).");
                    return;
                }
                Handed::Aged => {
                    tracing::info!(protocol = P::PROTOCOL, %peer, "Ending a stream of a connection older than --max-connection-age whose sink stopped reading.");
                    emptier.empty(Status::unavailable("this connection is older than the adapter's --max-connection-age and the sink stopped reading"));
                    return;
                }
            }
        }
        // Lagging or not, and when it would start to.
        unacked.update(engine.oldest_unacked());
        board.update(engine.sync_status());
    }
    tracing::info!(protocol = P::PROTOCOL, %peer, "Sink disconnected.");
}

//! The gRPC side: every MCP flavour on one port, plus health and reflection.
//!
//! Each stream runs [`drive`] on its own task: requests and snapshot changes go into the
//! stream's [`engine::Engine`], responses come out through a one-slot channel into the stream's
//! [`response_body::ResponseBody`]. Resource bytes are shared with the cache: nothing is re-encoded per
//! sink, and no sink holds a copy of a response (see [`frames`]).

pub mod engine;
pub mod frames;
mod grpc;
pub mod protocol;
mod response_body;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Status, Streaming};

use crate::cache::Snapshot;
use crate::metrics::Metrics;
use engine::{Ack, Engine};
use protocol::Protocol;
use response_body::Sent;

/// Largest request accepted (requests are small; this only bounds abuse).
const MAX_REQUEST: usize = 16 << 20;

/// What every stream needs.
#[derive(Clone, Debug)]
pub struct StreamContext {
    /// The served set; `None` until the first registry sync.
    pub snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    /// Metrics.
    pub metrics: Metrics,
    /// Cancelled on shutdown: every stream ends cleanly.
    pub shutdown: CancellationToken,
    /// Largest response a sink accepts (`--max-message-size`); a larger one ends the stream
    /// with RESOURCE_EXHAUSTED instead of being sent.
    pub max_message_size: Option<usize>,
    /// `--shards`: the shard this port serves (its `mcp_adapter_shard_*` label); `None` for
    /// an unsharded source.
    pub shard: Option<String>,
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
    let shutdown = ctx.shutdown.clone();
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .layer(tonic::service::InterceptorLayer::new(tls::authorize(
            allow.unwrap_or_default(),
        )))
        .add_service(grpc::Service::<grpc::Ads>::new(ctx.clone()))
        .add_service(grpc::Service::<grpc::ResourceSource>::new(ctx.clone()))
        .add_service(grpc::Service::<grpc::MeshConfig>::new(ctx))
        .add_service(health)
        .add_service(reflection);
    // TCP_NODELAY: a push is one write; Nagle would hold its tail for ~40 ms waiting for an
    // ACK. (tonic's own nodelay setting does not apply to a listener passed in.)
    let conns = TcpIncoming::from(listener).with_nodelay(Some(true));
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

/// Runs one stream until the sink leaves, the stream breaks, or shutdown.
async fn drive<P: Protocol>(
    mut requests: Streaming<P::Req>,
    tx: mpsc::Sender<Sent>,
    ctx: StreamContext,
    peer: String,
) {
    let metrics = ctx.metrics;
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
    let mut engine = Engine::new(P::INCREMENTAL, P::served);
    let mut node: Option<String> = None;
    tracing::info!(protocol = P::PROTOCOL, %peer, "Sink connected.");
    loop {
        let outgoing = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            msg = requests.message() => match msg {
                Ok(Some(msg)) => {
                    if node.is_none() {
                        if let Some(id) = P::node(&msg) {
                            tracing::info!(protocol = P::PROTOCOL, %peer, node = %id, "Sink identified.");
                            node = Some(id);
                        }
                    }
                    let req = P::request(msg);
                    let type_key = req.type_key.clone();
                    let served = P::served(&type_key);
                    // `borrow`, not `borrow_and_update`: only the `changed()` arm may mark a
                    // snapshot as seen, or a change published while this request is handled
                    // would never reach the types this request does not name.
                    let snapshot = snapshots.borrow().clone();
                    let (ack, out) = engine.on_request(req, snapshot.as_ref());
                    match &ack {
                        Ack::Ack => metrics.acks.with_label_values(&[P::PROTOCOL, type_class(served)]).inc(),
                        Ack::Nack(reason) => {
                            metrics.nacks.with_label_values(&[P::PROTOCOL, type_class(served)]).inc();
                            tracing::warn!(protocol = P::PROTOCOL, %peer, type_url = %type_key, %reason, "Sink rejected a response.");
                        }
                        Ack::Subscribe => tracing::debug!(protocol = P::PROTOCOL, %peer, type_url = %type_key, "Subscribed."),
                        Ack::Stale => tracing::debug!(protocol = P::PROTOCOL, %peer, type_url = %type_key, "Ignored a stale nonce."),
                    }
                    out.into_iter().collect::<Vec<_>>()
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(protocol = P::PROTOCOL, %peer, %status, "Sink stream broke.");
                    break;
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                match snapshots.borrow_and_update().clone() {
                    Some(s) => engine.on_snapshot(&s),
                    None => Vec::new(),
                }
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
                tokio::select! {
                    _ = tx.send(Err(status)) => {}
                    _ = ctx.shutdown.cancelled() => {}
                }
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
            // A sink that stopped reading blocks this send; shutdown must not wait on it.
            tokio::select! {
                sent = tx.send(Ok(resp)) => if sent.is_err() {
                    tracing::info!(protocol = P::PROTOCOL, %peer, "Sink disconnected.");
                    return;
                },
                _ = ctx.shutdown.cancelled() => {
                    tracing::info!(protocol = P::PROTOCOL, %peer, "Shutting down with a response unsent (the sink stopped reading).");
                    return;
                }
            }
        }
    }
    tracing::info!(protocol = P::PROTOCOL, %peer, "Sink disconnected.");
}

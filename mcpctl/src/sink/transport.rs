//! The wire side of a sink: the gRPC stream of each protocol (MCP-over-xDS state of the world
//! and delta on `AggregatedDiscoveryService`, legacy MCP on `ResourceSource`), TLS and endpoint
//! setup, connecting with retry and backoff, and the requests sent on the stream (subscription,
//! ACK, NACK).
//!
//! It never looks inside the resources: [`Stream::recv`] hands a response back still encoded,
//! and the sink decides (with [`super::state`]) whether to [`Stream::ack`] or [`Stream::nack`]
//! it. So each protocol's request rules stand in one place, and the state can be tested without
//! a server.

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::clip::error_chain;
use proto::istio::mcp::v1alpha1::resource_source_client::ResourceSourceClient;
use proto::istio::mcp::v1alpha1::{RequestResources, Resources, SinkNode};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Streaming;

use super::{DecodeError, Protocol, SinkError, SinkOptions};

/// xDS node id sent on the first request: the `type~ip~id~domain` shape Istio parses for
/// proxies, so servers that log or validate node ids accept it.
pub const NODE_ID: &str = "mcpctl~127.0.0.1~mcpctl.default~default.svc.cluster.local";
/// `SinkNode.id` for legacy MCP.
pub const SINK_NODE_ID: &str = "mcpctl";
/// The legacy MCP collection of ServiceEntries.
pub const MCP_COLLECTION: &str = "istio/networking/v1alpha3/serviceentries";

/// `google.rpc.Code.INVALID_ARGUMENT`, the code Istio puts in NACKs.
const INVALID_ARGUMENT: i32 = 3;
/// Responses can hold a whole registry; gRPC's 4 MiB default would cut large ones off.
const MAX_MESSAGE: usize = 1 << 30;
/// Upper bound of the pause between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One response's resources, still encoded, in its protocol's message.
pub(super) enum Payload {
    /// `xds://`: the whole state.
    Sotw(DiscoveryResponse),
    /// `delta://`: upserts and removals.
    Delta(DeltaDiscoveryResponse),
    /// `mcp://`: the whole state or, when the server marks it so, a patch.
    Mcp(Resources),
}

/// What identifies one response: reported in the sink's [`Update`](super::Update) and repeated
/// in its ACK or NACK. Taken before the resources are decoded, since decoding a legacy MCP
/// response consumes it.
#[derive(Debug)]
pub(super) struct Receipt {
    /// `version_info` (xds) or `system_version_info` (delta, mcp).
    pub(super) version_info: String,
    /// The response nonce.
    pub(super) nonce: String,
    /// Whether the response was incremental (always for delta, never for xds).
    pub(super) incremental: bool,
    /// mcp only: the collection the response names, if any.
    collection: String,
}

impl Payload {
    fn receipt(&self) -> Receipt {
        let (version_info, nonce, incremental, collection) = match self {
            Payload::Sotw(r) => (&r.version_info, &r.nonce, false, ""),
            Payload::Delta(r) => (&r.system_version_info, &r.nonce, true, ""),
            Payload::Mcp(r) => (
                &r.system_version_info,
                &r.nonce,
                r.incremental,
                r.collection.as_str(),
            ),
        };
        Receipt {
            version_info: version_info.clone(),
            nonce: nonce.clone(),
            incremental,
            collection: collection.to_string(),
        }
    }
}

/// The open stream, per protocol, with what is needed to ACK on it. Requests go through an
/// unbounded channel so answering never awaits, which keeps [`Stream::recv`] the only await of
/// a sink step.
pub(super) enum Stream {
    Xds {
        type_url: &'static str,
        tx: UnboundedSender<DiscoveryRequest>,
        rx: Streaming<DiscoveryResponse>,
        /// Version of the last ACKed response, repeated in NACKs as xDS requires.
        accepted_version: String,
    },
    Delta {
        type_url: &'static str,
        tx: UnboundedSender<DeltaDiscoveryRequest>,
        rx: Streaming<DeltaDiscoveryResponse>,
    },
    Mcp {
        incremental: bool,
        tx: UnboundedSender<RequestResources>,
        rx: Streaming<Resources>,
    },
}

/// Outcome of one connection attempt.
enum Attempt {
    /// Worth retrying (server not up yet, connection refused or reset).
    Retry(String),
    /// Retrying cannot help (e.g. the server does not implement the service).
    Fatal(SinkError),
}

impl Stream {
    /// Connects to `authority` and subscribes, retrying with backoff until
    /// `opts.connect_timeout`, so tests can start the server and the sink at the same time.
    pub(super) async fn connect(
        opts: &SinkOptions,
        protocol: Protocol,
        authority: &str,
    ) -> Result<Stream, SinkError> {
        let endpoint = endpoint(opts, authority).await?;
        let deadline = tokio::time::Instant::now() + opts.connect_timeout;
        let mut backoff = Duration::from_millis(50);
        let mut last_error: Option<String> = None;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(remaining, open(&endpoint, protocol, opts)).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(Attempt::Fatal(e))) => return Err(e),
                Ok(Err(Attempt::Retry(why))) => last_error = Some(why),
                // Keep the reason of an earlier attempt: "connection refused" says more.
                Err(_) => {
                    last_error.get_or_insert_with(|| "timed out".to_string());
                }
            }
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            if remaining.is_zero() {
                return Err(SinkError::Unreachable {
                    server: opts.server.clone(),
                    timeout: opts.connect_timeout,
                    last_error: last_error.unwrap_or_else(|| "timed out".to_string()),
                });
            }
            tokio::time::sleep(backoff.min(remaining)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Waits for the next response. Cancel-safe.
    pub(super) async fn recv(&mut self, server: &str) -> Result<(Receipt, Payload), SinkError> {
        let payload = match self {
            Stream::Xds { rx, .. } => Payload::Sotw(recv(rx, server).await?),
            Stream::Delta { rx, .. } => Payload::Delta(recv(rx, server).await?),
            Stream::Mcp { rx, .. } => Payload::Mcp(recv(rx, server).await?),
        };
        Ok((payload.receipt(), payload))
    }

    /// ACKs the response of `receipt`: its resources were applied.
    pub(super) fn ack(&mut self, server: &str, receipt: &Receipt) -> Result<(), SinkError> {
        self.answer(server, receipt, None)
    }

    /// NACKs the response of `receipt` with why its resources were rejected, as Istio does.
    pub(super) fn nack(
        &mut self,
        server: &str,
        receipt: &Receipt,
        rejected: &DecodeError,
    ) -> Result<(), SinkError> {
        self.answer(server, receipt, Some(rejected))
    }

    /// Sends the ACK (`rejected` is `None`) or NACK of the response of `receipt`.
    fn answer(
        &mut self,
        server: &str,
        receipt: &Receipt,
        rejected: Option<&DecodeError>,
    ) -> Result<(), SinkError> {
        let message = rejected.map(DecodeError::to_string);
        match self {
            Stream::Xds {
                type_url,
                tx,
                accepted_version,
                ..
            } => {
                let version_info = match rejected {
                    None => receipt.version_info.clone(),
                    Some(_) => accepted_version.clone(),
                };
                send(
                    tx,
                    server,
                    DiscoveryRequest {
                        type_url: type_url.to_string(),
                        version_info,
                        response_nonce: receipt.nonce.clone(),
                        error_detail: message.map(xds_status),
                        ..Default::default()
                    },
                )?;
                if rejected.is_none() {
                    accepted_version.clone_from(&receipt.version_info);
                }
                Ok(())
            }
            Stream::Delta { type_url, tx, .. } => send(
                tx,
                server,
                DeltaDiscoveryRequest {
                    type_url: type_url.to_string(),
                    response_nonce: receipt.nonce.clone(),
                    error_detail: message.map(xds_status),
                    ..Default::default()
                },
            ),
            // Istio's sink repeats its incremental preference in every ACK.
            Stream::Mcp {
                incremental, tx, ..
            } => send(
                tx,
                server,
                RequestResources {
                    sink_node: Some(sink_node()),
                    // The response's collection, or ours when it names none.
                    collection: if receipt.collection.is_empty() {
                        MCP_COLLECTION.to_string()
                    } else {
                        receipt.collection.clone()
                    },
                    response_nonce: receipt.nonce.clone(),
                    incremental: *incremental,
                    error_detail: message.map(|message| proto::google::rpc::Status {
                        code: INVALID_ARGUMENT,
                        message,
                        details: Vec::new(),
                    }),
                    ..Default::default()
                },
            ),
        }
    }
}

/// The detail of an xDS NACK (legacy MCP has its own generated `google.rpc.Status`).
fn xds_status(message: String) -> envoy_types::pb::google::rpc::Status {
    envoy_types::pb::google::rpc::Status {
        code: INVALID_ARGUMENT,
        message,
        details: Vec::new(),
    }
}

fn node() -> Node {
    Node {
        id: NODE_ID.to_string(),
        ..Default::default()
    }
}

fn sink_node() -> SinkNode {
    SinkNode {
        id: SINK_NODE_ID.to_string(),
        ..Default::default()
    }
}

async fn recv<T>(rx: &mut Streaming<T>, server: &str) -> Result<T, SinkError> {
    match rx.message().await {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(SinkError::Closed {
            server: server.to_string(),
        }),
        Err(status) => Err(stream_error(server, &status)),
    }
}

fn send<T>(tx: &UnboundedSender<T>, server: &str, msg: T) -> Result<(), SinkError> {
    // The receiving half lives inside tonic's request body; it is gone once the call is over.
    tx.send(msg).map_err(|_| SinkError::Closed {
        server: server.to_string(),
    })
}

fn stream_error(server: &str, status: &tonic::Status) -> SinkError {
    SinkError::Stream {
        server: server.to_string(),
        code: status.code(),
        message: status.message().to_string(),
    }
}

async fn read_tls_file(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, SinkError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| SinkError::TlsFile {
            what,
            path: path.clone(),
            source,
        })
}

async fn endpoint(opts: &SinkOptions, authority: &str) -> Result<Endpoint, SinkError> {
    // tonic only does TLS for https URIs.
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{authority}"))
        .map_err(|e| SinkError::InvalidServer {
            server: opts.server.clone(),
            reason: error_chain(&e),
        })?
        .connect_timeout(opts.connect_timeout)
        .tcp_nodelay(true);
    if let Some(tls) = &opts.tls {
        let ca = read_tls_file("CA bundle", &tls.ca).await?;
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(name) = &tls.server_name {
            cfg = cfg.domain_name(name.clone());
        }
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                let cert = read_tls_file("client certificate", cert).await?;
                let key = read_tls_file("client key", key).await?;
                cfg = cfg.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            _ => {
                return Err(SinkError::InvalidOptions(
                    "a TLS client certificate needs both cert and key".to_string(),
                ))
            }
        }
        endpoint = endpoint
            .tls_config(cfg)
            .map_err(|e| SinkError::Tls(error_chain(&e)))?;
    }
    Ok(endpoint)
}

/// The first request on an `AggregatedDiscoveryService` stream, SotW or delta (two generated
/// types with the same subscription fields): subscribes [`node`] to `$type_url`.
macro_rules! ads_subscription {
    ($request:ident, $type_url:expr) => {
        $request {
            type_url: $type_url.to_string(),
            node: Some(node()),
            ..Default::default()
        }
    };
}

/// One attempt: connect, open the stream, send the subscription.
async fn open(
    endpoint: &Endpoint,
    protocol: Protocol,
    opts: &SinkOptions,
) -> Result<Stream, Attempt> {
    let channel: Channel = endpoint
        .connect()
        .await
        .map_err(|e| Attempt::Retry(error_chain(&e)))?;
    let status = |s: tonic::Status| {
        // Unavailable covers a server that accepted the connection but is not serving yet;
        // Cancelled, a connection that ended before the stream was answered (this sink cancels
        // nothing while it connects): a server that hangs up at once, as an adapter over
        // `--max-connections` or a port forward to a backend that is starting does.
        if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Cancelled) {
            Attempt::Retry(format!("{:?}: {}", s.code(), s.message()))
        } else {
            Attempt::Fatal(stream_error(&opts.server, &s))
        }
    };
    let type_url = opts.api_version.type_url();
    let stream = match protocol {
        Protocol::Xds => {
            let first = ads_subscription!(DiscoveryRequest, type_url);
            subscribe(first, |s| async move {
                ads(channel).stream_aggregated_resources(s).await
            })
            .await
            .map(|(tx, rx)| Stream::Xds {
                type_url,
                tx,
                rx,
                accepted_version: String::new(),
            })
        }
        Protocol::Delta => {
            let first = ads_subscription!(DeltaDiscoveryRequest, type_url);
            subscribe(first, |s| async move {
                ads(channel).delta_aggregated_resources(s).await
            })
            .await
            .map(|(tx, rx)| Stream::Delta { type_url, tx, rx })
        }
        Protocol::Mcp => {
            let mut client =
                ResourceSourceClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
            let first = RequestResources {
                sink_node: Some(sink_node()),
                collection: MCP_COLLECTION.to_string(),
                incremental: opts.incremental,
                ..Default::default()
            };
            subscribe(first, |s| async move {
                client.establish_resource_stream(s).await
            })
            .await
            .map(|(tx, rx)| Stream::Mcp {
                incremental: opts.incremental,
                tx,
                rx,
            })
        }
    };
    stream.map_err(status)
}

/// A client of `AggregatedDiscoveryService`, which serves both SotW and delta xDS.
fn ads(channel: Channel) -> AggregatedDiscoveryServiceClient<Channel> {
    AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE)
}

/// Opens a bidirectional stream with `rpc`, its first request already queued.
async fn subscribe<Req, Resp, Fut>(
    first: Req,
    rpc: impl FnOnce(UnboundedReceiverStream<Req>) -> Fut,
) -> Result<(UnboundedSender<Req>, tonic::Streaming<Resp>), tonic::Status>
where
    Fut: std::future::Future<
        Output = Result<tonic::Response<tonic::Streaming<Resp>>, tonic::Status>,
    >,
{
    let (tx, rx) = unbounded_channel();
    // Cannot fail: the receiver is alive until `rpc` takes it.
    let _ = tx.send(first);
    let stream = rpc(UnboundedReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, stream))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::sink::{Sink, SinkError, SinkOptions};
    use std::time::Duration;

    #[tokio::test]
    async fn unreachable_server_fails_within_timeout() {
        // Bind then drop to get a port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut opts = SinkOptions::new(format!("xds://127.0.0.1:{port}"));
        opts.connect_timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let err = Sink::connect(opts).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(matches!(err, SinkError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}

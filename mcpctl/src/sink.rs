//! The MCP sink: one subscription to ServiceEntries over one of three protocols.
//!
//! [`Sink::connect`] opens the stream and sends the subscription; [`Sink::next`] waits for one
//! response, applies it to the held state (see [`state`]) and ACKs it, so a test can step
//! through exactly what a server sends. A response holding a resource that cannot be decoded is
//! NACKed (as Istio does) and reported as [`SinkError::Decode`]; the state is left as it was and
//! the stream stays usable.

pub mod state;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::telemetry::error_chain;
use proto::istio::mcp::v1alpha1::resource_source_client::ResourceSourceClient;
use proto::istio::mcp::v1alpha1::{RequestResources, Resources, SinkNode};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Streaming;

pub use state::{Applied, Change, DecodeError, Received};

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

/// Which protocol the server speaks, chosen by the `--server` URL scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `xds://`: MCP-over-xDS, state of the world (Istio 1.8+ `configSources`).
    Xds,
    /// `delta://`: MCP-over-xDS, delta (incremental) ADS.
    Delta,
    /// `mcp://`: legacy `istio.mcp.v1alpha1.ResourceSource` (Istio 1.1-1.7).
    Mcp,
}

/// Which xDS type URL to subscribe to. Istio up to 1.23 asks for v1alpha3, 1.24+ for v1; a
/// server should answer both with the same resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiVersion {
    /// `networking.istio.io/v1/ServiceEntry`.
    #[default]
    V1,
    /// `networking.istio.io/v1alpha3/ServiceEntry`.
    V1alpha3,
}

impl ApiVersion {
    /// The xDS `type_url` to subscribe to.
    pub fn type_url(self) -> &'static str {
        match self {
            ApiVersion::V1 => "networking.istio.io/v1/ServiceEntry",
            ApiVersion::V1alpha3 => "networking.istio.io/v1alpha3/ServiceEntry",
        }
    }
}

/// TLS settings. Present means TLS is on and the server certificate is verified against `ca`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM CA bundle that must have signed the server certificate.
    pub ca: PathBuf,
    /// Name to verify the server certificate against, when it differs from the host in
    /// `server` (e.g. connecting by IP to a certificate issued for a DNS name).
    pub server_name: Option<String>,
    /// PEM client certificate, for servers that require mutual TLS (needs `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

/// What to connect to and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkOptions {
    /// `xds://HOST:PORT`, `delta://HOST:PORT` or `mcp://HOST:PORT` (no scheme means `xds://`).
    pub server: String,
    /// Type URL generation to subscribe to (xds and delta only).
    pub api_version: ApiVersion,
    /// Ask a legacy MCP server for incremental responses (mcp only).
    pub incremental: bool,
    /// TLS, off when `None`.
    pub tls: Option<TlsOptions>,
    /// How long [`Sink::connect`] keeps retrying until the stream is open.
    pub connect_timeout: Duration,
}

impl SinkOptions {
    /// Options for `server` with defaults: v1, not incremental, plaintext, 10 s to connect.
    pub fn new(server: impl Into<String>) -> Self {
        SinkOptions {
            server: server.into(),
            api_version: ApiVersion::V1,
            incremental: false,
            tls: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// One applied response.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// When the response was received.
    pub at: SystemTime,
    /// `version_info` (xds) or `system_version_info` (delta, mcp).
    pub version_info: String,
    /// The response nonce (which was ACKed).
    pub nonce: String,
    /// The full state after applying the response, keyed by `namespace/name`.
    pub state: BTreeMap<String, Received>,
    /// See [`Applied::upserted`].
    pub upserted: Vec<String>,
    /// See [`Applied::removed`].
    pub removed: Vec<String>,
    /// Whether the response was incremental (always for delta, never for xds).
    pub incremental: bool,
}

/// Why the sink failed. Messages name the server or resource concerned.
#[derive(thiserror::Error, Debug)]
pub enum SinkError {
    /// `server` is not `SCHEME://HOST:PORT` with a known scheme.
    #[error("invalid server {server:?}: {reason}")]
    InvalidServer {
        /// As given.
        server: String,
        /// What is wrong.
        reason: String,
    },
    /// Options that contradict each other.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A TLS file could not be read.
    #[error("cannot read {what} {path}: {source}", path = path.display())]
    TlsFile {
        /// Which file (`CA bundle`, `client certificate`, ...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TLS settings were rejected.
    #[error("invalid TLS configuration: {0}")]
    Tls(String),
    /// No stream could be opened before the connect timeout.
    #[error("server {server} unreachable within {timeout:?}: {last_error}")]
    Unreachable {
        /// As given.
        server: String,
        /// [`SinkOptions::connect_timeout`].
        timeout: Duration,
        /// Why the last attempt failed.
        last_error: String,
    },
    /// The server rejected or broke the stream.
    #[error("stream from {server} failed: {code:?}: {message}")]
    Stream {
        /// As given.
        server: String,
        /// gRPC status code.
        code: tonic::Code,
        /// gRPC status message.
        message: String,
    },
    /// The server ended the stream.
    #[error("server {server} closed the stream")]
    Closed {
        /// As given.
        server: String,
    },
    /// A response held a resource that could not be decoded; it was NACKed.
    #[error("response from {server} rejected: {source}")]
    Decode {
        /// As given.
        server: String,
        /// Which resource and why.
        source: DecodeError,
    },
}

/// Splits `server` into the protocol and `HOST:PORT`.
pub fn parse_server(server: &str) -> Result<(Protocol, String), SinkError> {
    let invalid = |reason: &str| SinkError::InvalidServer {
        server: server.to_string(),
        reason: reason.to_string(),
    };
    let (protocol, rest) = match server.split_once("://") {
        Some(("xds", rest)) => (Protocol::Xds, rest),
        Some(("delta", rest)) => (Protocol::Delta, rest),
        Some(("mcp", rest)) => (Protocol::Mcp, rest),
        Some(_) => return Err(invalid("scheme must be xds://, delta:// or mcp://")),
        None => (Protocol::Xds, server),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains('/') {
        return Err(invalid("expected SCHEME://HOST:PORT"));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !has_port {
        return Err(invalid("expected HOST:PORT with a numeric port"));
    }
    Ok((protocol, authority.to_string()))
}

/// The open stream, per protocol, with what is needed to ACK on it.
enum Stream {
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

/// A connected MCP sink. Requests go through an unbounded channel so ACKing never awaits, which
/// makes [`Sink::next`] cancel-safe (and so [`Sink::next_within`] never loses a response).
pub struct Sink {
    server: String,
    protocol: Protocol,
    stream: Stream,
    state: BTreeMap<String, Received>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("server", &self.server)
            .field("protocol", &self.protocol)
            .field("resources", &self.state.len())
            .finish()
    }
}

impl Sink {
    /// Connects and subscribes, retrying with backoff until `opts.connect_timeout` so tests can
    /// start the server and the sink at the same time.
    pub async fn connect(opts: SinkOptions) -> Result<Sink, SinkError> {
        let (protocol, authority) = parse_server(&opts.server)?;
        if opts.incremental && protocol != Protocol::Mcp {
            return Err(SinkError::InvalidOptions(format!(
                "incremental applies only to mcp:// servers, not {}",
                opts.server
            )));
        }
        let endpoint = endpoint(&opts, &authority).await?;
        let deadline = tokio::time::Instant::now() + opts.connect_timeout;
        let mut backoff = Duration::from_millis(50);
        let mut last_error: Option<String> = None;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(remaining, open(&endpoint, protocol, &opts)).await {
                Ok(Ok(stream)) => {
                    return Ok(Sink {
                        server: opts.server,
                        protocol,
                        stream,
                        state: BTreeMap::new(),
                    })
                }
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
                    server: opts.server,
                    timeout: opts.connect_timeout,
                    last_error: last_error.unwrap_or_else(|| "timed out".to_string()),
                });
            }
            tokio::time::sleep(backoff.min(remaining)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The server as given in the options.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The protocol in use.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The state after the last applied response.
    pub fn state(&self) -> &BTreeMap<String, Received> {
        &self.state
    }

    /// Waits for the next response, applies it and ACKs it. Cancel-safe.
    pub async fn next(&mut self) -> Result<Update, SinkError> {
        let Sink {
            server,
            stream,
            state,
            ..
        } = self;
        match stream {
            Stream::Xds {
                type_url,
                tx,
                rx,
                accepted_version,
            } => {
                let resp = recv(rx, server).await?;
                let at = SystemTime::now();
                match state::change_from_sotw(&resp) {
                    Ok(change) => {
                        send(
                            tx,
                            server,
                            DiscoveryRequest {
                                type_url: type_url.to_string(),
                                version_info: resp.version_info.clone(),
                                response_nonce: resp.nonce.clone(),
                                ..Default::default()
                            },
                        )?;
                        accepted_version.clone_from(&resp.version_info);
                        let applied = state::apply(state, change);
                        Ok(update(
                            at,
                            resp.version_info,
                            resp.nonce,
                            state,
                            applied,
                            false,
                        ))
                    }
                    Err(e) => {
                        send(
                            tx,
                            server,
                            DiscoveryRequest {
                                type_url: type_url.to_string(),
                                version_info: accepted_version.clone(),
                                response_nonce: resp.nonce,
                                error_detail: Some(nack_status(&e)),
                                ..Default::default()
                            },
                        )?;
                        Err(decode_error(server, e))
                    }
                }
            }
            Stream::Delta { type_url, tx, rx } => {
                let resp = recv(rx, server).await?;
                let at = SystemTime::now();
                match state::change_from_delta(&resp) {
                    Ok(change) => {
                        send(
                            tx,
                            server,
                            DeltaDiscoveryRequest {
                                type_url: type_url.to_string(),
                                response_nonce: resp.nonce.clone(),
                                ..Default::default()
                            },
                        )?;
                        let applied = state::apply(state, change);
                        Ok(update(
                            at,
                            resp.system_version_info,
                            resp.nonce,
                            state,
                            applied,
                            true,
                        ))
                    }
                    Err(e) => {
                        send(
                            tx,
                            server,
                            DeltaDiscoveryRequest {
                                type_url: type_url.to_string(),
                                response_nonce: resp.nonce,
                                error_detail: Some(nack_status(&e)),
                                ..Default::default()
                            },
                        )?;
                        Err(decode_error(server, e))
                    }
                }
            }
            Stream::Mcp {
                incremental,
                tx,
                rx,
            } => {
                let resp = recv(rx, server).await?;
                let at = SystemTime::now();
                let collection = if resp.collection.is_empty() {
                    MCP_COLLECTION.to_string()
                } else {
                    resp.collection.clone()
                };
                let nonce = resp.nonce.clone();
                let version = resp.system_version_info.clone();
                let is_incremental = resp.incremental;
                // Istio's sink repeats its incremental preference in every ACK.
                let mut ack = RequestResources {
                    sink_node: Some(sink_node()),
                    collection,
                    response_nonce: nonce.clone(),
                    incremental: *incremental,
                    ..Default::default()
                };
                match state::change_from_mcp(resp) {
                    Ok(change) => {
                        send(tx, server, ack)?;
                        let applied = state::apply(state, change);
                        Ok(update(at, version, nonce, state, applied, is_incremental))
                    }
                    Err(e) => {
                        ack.error_detail = Some(proto::google::rpc::Status {
                            code: INVALID_ARGUMENT,
                            message: e.to_string(),
                            details: Vec::new(),
                        });
                        send(tx, server, ack)?;
                        Err(decode_error(server, e))
                    }
                }
            }
        }
    }

    /// Like [`Sink::next`], but gives up after `d` and returns `None` (the stream stays usable).
    pub async fn next_within(&mut self, d: Duration) -> Result<Option<Update>, SinkError> {
        match tokio::time::timeout(d, self.next()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

fn update(
    at: SystemTime,
    version_info: String,
    nonce: String,
    state: &BTreeMap<String, Received>,
    applied: Applied,
    incremental: bool,
) -> Update {
    Update {
        at,
        version_info,
        nonce,
        state: state.clone(),
        upserted: applied.upserted,
        removed: applied.removed,
        incremental,
    }
}

fn decode_error(server: &str, source: DecodeError) -> SinkError {
    SinkError::Decode {
        server: server.to_string(),
        source,
    }
}

fn nack_status(e: &DecodeError) -> envoy_types::pb::google::rpc::Status {
    envoy_types::pb::google::rpc::Status {
        code: INVALID_ARGUMENT,
        message: e.to_string(),
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

async fn read_file(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, SinkError> {
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
        let ca = read_file("CA bundle", &tls.ca).await?;
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(name) = &tls.server_name {
            cfg = cfg.domain_name(name.clone());
        }
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                let cert = read_file("client certificate", cert).await?;
                let key = read_file("client key", key).await?;
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
        // Unavailable covers a server that accepted the connection but is not serving yet.
        if s.code() == tonic::Code::Unavailable {
            Attempt::Retry(format!("{:?}: {}", s.code(), s.message()))
        } else {
            Attempt::Fatal(stream_error(&opts.server, &s))
        }
    };
    match protocol {
        Protocol::Xds => {
            let type_url = opts.api_version.type_url();
            let mut client = AggregatedDiscoveryServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE);
            let first = DiscoveryRequest {
                type_url: type_url.to_string(),
                node: Some(node()),
                ..Default::default()
            };
            let (tx, rx) = subscribe(first, |s| async move {
                client.stream_aggregated_resources(s).await
            })
            .await
            .map_err(status)?;
            Ok(Stream::Xds {
                type_url,
                tx,
                rx,
                accepted_version: String::new(),
            })
        }
        Protocol::Delta => {
            let type_url = opts.api_version.type_url();
            let mut client = AggregatedDiscoveryServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE);
            let first = DeltaDiscoveryRequest {
                type_url: type_url.to_string(),
                node: Some(node()),
                ..Default::default()
            };
            let (tx, rx) = subscribe(first, |s| async move {
                client.delta_aggregated_resources(s).await
            })
            .await
            .map_err(status)?;
            Ok(Stream::Delta { type_url, tx, rx })
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
            let (tx, rx) = subscribe(first, |s| async move {
                client.establish_resource_stream(s).await
            })
            .await
            .map_err(status)?;
            Ok(Stream::Mcp {
                incremental: opts.incremental,
                tx,
                rx,
            })
        }
    }
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
    use super::*;

    #[test]
    fn parses_servers() {
        assert_eq!(
            parse_server("xds://127.0.0.1:15010").unwrap(),
            (Protocol::Xds, "127.0.0.1:15010".to_string())
        );
        assert_eq!(
            parse_server("delta://localhost:1/").unwrap(),
            (Protocol::Delta, "localhost:1".to_string())
        );
        assert_eq!(
            parse_server("mcp://[::1]:9901").unwrap(),
            (Protocol::Mcp, "[::1]:9901".to_string())
        );
        assert_eq!(parse_server("h:2").unwrap().0, Protocol::Xds);
        for bad in [
            "http://h:1",
            "xds://",
            "xds://h",
            "xds://h:port",
            "xds://h:1/x",
        ] {
            let err = parse_server(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

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

    #[tokio::test]
    async fn incremental_only_for_mcp() {
        let mut opts = SinkOptions::new("xds://127.0.0.1:1");
        opts.incremental = true;
        let err = Sink::connect(opts).await.unwrap_err();
        assert!(matches!(err, SinkError::InvalidOptions(_)), "{err}");
    }
}

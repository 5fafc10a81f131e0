//! What any gRPC peer may make the server hold, and how a peer over a limit is told.
//!
//! Every sink is a peer on the network, and nothing it sends should grow the adapter's memory
//! without bound: a type URL is kept per stream, a stream per connection, a connection per
//! peer. Each limit here is a flag (`cli::ServerArgs`); a stream or request over one ends with
//! RESOURCE_EXHAUSTED and a message naming the flag, is counted in
//! `mcp_adapter_refused_streams_total{limit}` and is logged (at most once per limit every
//! [`LOG_EVERY`], so a flood cannot fill the log). The defaults are far above what Istio asks
//! for: istiod opens one stream per config source and asks for 16 types on it, Pilot's legacy
//! MCP one collection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::ServerMetrics;

/// Default `--max-connections`.
pub const MAX_CONNECTIONS: usize = 1024;
/// Default `--max-streams`.
pub const MAX_STREAMS: usize = 1024;
/// Default `--max-streams-per-connection`: HTTP/2's recommended minimum (RFC 9113 §6.5.2).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;
/// Default `--max-types-per-stream`: four times what istiod asks for.
pub const MAX_TYPES_PER_STREAM: usize = 64;
/// Default `--max-type-url-length`: longer than any Kubernetes group/version/kind can be.
pub const MAX_TYPE_URL_LENGTH: usize = 512;
/// Default `--max-resource-names`: over twice the largest set one source is measured serving
/// (100k services, BENCHMARKS.md).
pub const MAX_RESOURCE_NAMES: usize = 262_144;
/// Default `--max-request-size`.
pub const MAX_REQUEST_SIZE: usize = 16 << 20;
/// Default `--max-connection-age` (istiod's own server recycles Envoys' connections as often).
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(30 * 60);
/// Default `--max-connection-age-grace`.
pub const MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(10);
/// Default `--unacked-threshold`.
pub const UNACKED_THRESHOLD: Duration = Duration::from_secs(30);

// #33 connection bounds
/// Default `--idle-connection-timeout`: istiod opens its stream as soon as it has connected, so
/// a connection with no stream for this long is a scanner, a leak or a peer holding a slot.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `--max-connections-per-peer`: a quarter of the default `--max-connections`, so one
/// address never takes the whole adapter, while hundreds of istiod replicas behind one NAT
/// address (one connection each per config source) still fit.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;
/// Default `--max-streams-per-peer`: a quarter of the default `--max-streams`, as for
/// connections: one address (a sink holding idle streams on many connections) never takes every
/// stream, while a NAT address with hundreds of istiod replicas (one stream each per config
/// source) still fits.
pub const MAX_STREAMS_PER_PEER: usize = 256;
/// Default `--request-receive-timeout`: a 16 MiB request (the default `--max-request-size`)
/// arrives in time at 0.55 MiB/s, what one 64 KiB HTTP/2 stream window delivers over a
/// round trip of 115 ms.
pub const REQUEST_RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the server allows a connection, and a large request on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionBounds {
    /// `--idle-connection-timeout`: a connection that opened no stream this long after it was
    /// accepted is closed (one whose streams ended, after `conn::IDLE_AFTER_STREAMS` or this);
    /// `None`: never.
    pub idle_timeout: Option<Duration>,
    /// `--max-connections-per-peer`: connections open at once from one IP address.
    pub max_per_peer: usize,
    /// `--max-streams-per-peer`: streams open at once from one IP address, over all its
    /// connections.
    pub max_streams_per_peer: usize,
    /// `--request-receive-timeout`: a request over `request_body::FREE` must arrive whole
    /// within this long of taking its share of the large-request budget.
    pub request_receive_timeout: Duration,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        Self {
            idle_timeout: Some(IDLE_CONNECTION_TIMEOUT),
            max_per_peer: MAX_CONNECTIONS_PER_PEER,
            max_streams_per_peer: MAX_STREAMS_PER_PEER,
            request_receive_timeout: REQUEST_RECEIVE_TIMEOUT,
        }
    }
}

impl ServerLimits {
    /// These limits with `bounds` for connections.
    pub fn with_connection_bounds(mut self, bounds: ConnectionBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Counts a connection refused or closed by a limit and logs it (throttled per limit, with
    /// the stream refusals of the same limit).
    pub fn refused_connection(&self, metrics: &ServerMetrics, refused: &Refused, peer: &str) {
        metrics
            .refused_connections
            .with_label_values(&[refused.label()])
            .inc();
        if let Some(more) = self.log.due(refused.label()) {
            tracing::warn!(%peer, limit = refused.label(), refused_since_last_log = more, reason = %refused, "Closed a connection over a limit.");
        }
    }
}

/// A refusal is logged at most this often per limit (every one is counted).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

// #33 stream bounds: what a sink's strings may cost. Real ones are small (a resource name is
// `namespace/name`, at most 63 + 1 + 253 bytes; istiod's and Envoy's node ids are 100-300
// bytes), so the defaults are several times those and only a hostile or broken peer meets them.
/// Default `--max-resource-name-length`: three times the longest `namespace/name`.
pub const MAX_RESOURCE_NAME_LENGTH: usize = 1024;
/// Default `--max-node-id-length`.
pub const MAX_NODE_ID_LENGTH: usize = 2048;
/// Default `--max-stream-bytes`: `--max-resource-names` names of 64 bytes, and as much as
/// `--max-request-size` lets one request declare.
pub const MAX_STREAM_BYTES: usize = 16 << 20;
/// Most bytes of a peer's string (node id, NACK detail, type URL) that a log line quotes.
pub const LOGGED_TEXT_MAX: usize = 256;

/// What one stream may hold (checked by [`super::engine::Engine::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Distinct type URLs (or collections) one stream may ask for.
    pub max_types: usize,
    /// Longest type URL, in bytes.
    pub max_type_url_len: usize,
    /// Resource names one served type may name on a stream (subscribed, or declared held in
    /// `initial_resource_versions`).
    pub max_names: usize,
    // #33 stream bounds
    /// Longest resource name (or declared version) a request may carry, in bytes.
    pub max_name_len: usize,
    /// Longest node id a request may carry, in bytes.
    pub max_node_id_len: usize,
    /// Bytes of the sink's strings one stream may hold: type URLs of served types, names
    /// subscribed, names and versions declared held.
    pub max_bytes: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_types: MAX_TYPES_PER_STREAM,
            max_type_url_len: MAX_TYPE_URL_LENGTH,
            max_names: MAX_RESOURCE_NAMES,
            max_name_len: MAX_RESOURCE_NAME_LENGTH,
            max_node_id_len: MAX_NODE_ID_LENGTH,
            max_bytes: MAX_STREAM_BYTES,
        }
    }
}

/// Why a peer was refused; the message names the flag that sets the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Too many connections open.
    #[error("this adapter serves at most {limit} connections at once (--max-connections); try again later or another replica")]
    Connections {
        /// The limit.
        limit: usize,
    },
    /// Too many streams open.
    #[error("this adapter serves at most {limit} streams at once (--max-streams); try again later or another replica")]
    Streams {
        /// The limit.
        limit: usize,
    },
    /// Too many streams open from one address.
    #[error("this adapter serves at most {limit} streams at once to one address (--max-streams-per-peer); try again later or another replica")]
    StreamsPerPeer {
        /// The limit.
        limit: usize,
    },
    /// A type URL over the length limit.
    #[error("a type URL of {len} bytes is longer than this adapter's --max-type-url-length of {limit} bytes")]
    TypeUrlLength {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// One type too many on a stream.
    #[error("a stream may ask for at most {limit} distinct types (--max-types-per-stream); this request asks for one more")]
    TypesPerStream {
        /// The limit.
        limit: usize,
    },
    /// Too many resource names for one type.
    #[error("{count} resource names for {type_url} on one stream, over this adapter's --max-resource-names of {limit}")]
    ResourceNames {
        /// The type (at most `--max-type-url-length` bytes: that is checked first).
        type_url: String,
        /// Names the stream would hold.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// Too many resource names held by all streams together.
    #[error("the adapter's streams together hold {limit} resource names, all they may (4 × --max-resource-names); try again later or another replica")]
    ResourceNamesTotal {
        /// The limit.
        limit: usize,
    },
    /// A request over the size limit.
    #[error("a request of {len} bytes is larger than this adapter's --max-request-size of {limit} bytes")]
    RequestSize {
        /// Its declared length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    // #33 stream bounds
    /// A resource name (or declared version) over the length limit.
    #[error("a resource name of {len} bytes is longer than this adapter's --max-resource-name-length of {limit} bytes")]
    ResourceNameLength {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A node id over the length limit.
    #[error("a node id of {len} bytes is longer than this adapter's --max-node-id-length of {limit} bytes")]
    NodeIdLength {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A stream's names and type URLs over the byte budget.
    #[error("this stream would hold {bytes} bytes of type URLs, resource names and versions, over this adapter's --max-stream-bytes of {limit}")]
    StreamBytes {
        /// What it would hold.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    // #33 connection bounds
    /// Too many connections open from one address.
    #[error("this adapter serves at most {limit} connections from one address at once (--max-connections-per-peer); try again later or another replica")]
    ConnectionsPerPeer {
        /// The limit.
        limit: usize,
    },
    /// A connection with no open stream for too long (closed; there is no stream to tell).
    #[error("a connection had no open stream for {timeout:?} (--idle-connection-timeout)")]
    IdleConnection {
        /// The limit.
        timeout: Duration,
    },
    /// A large request that did not arrive in time.
    #[error("a request of {len} bytes did not arrive within this adapter's --request-receive-timeout of {timeout:?}")]
    RequestReceiveTimeout {
        /// Its declared length.
        len: usize,
        /// The limit.
        timeout: Duration,
    },
    /// A large request on a connection that already has as many waiting for the budget as
    /// may wait on one.
    #[error("{waiting} large requests on this connection already wait for the adapter's large-request budget (4 × --max-request-size); try again later")]
    LargeRequestsWaiting {
        /// How many wait.
        waiting: usize,
    },
}

impl Refused {
    /// The `limit` label of `mcp_adapter_refused_streams_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Refused::Connections { .. } => "connections",
            Refused::Streams { .. } => "streams",
            Refused::TypeUrlLength { .. } => "type_url_length",
            Refused::TypesPerStream { .. } => "types_per_stream",
            Refused::ResourceNames { .. } | Refused::ResourceNamesTotal { .. } => "resource_names",
            Refused::RequestSize { .. } => "request_size",
            Refused::ResourceNameLength { .. } => "resource_name_length",
            Refused::NodeIdLength { .. } => "node_id_length",
            Refused::StreamBytes { .. } => "stream_bytes",
            // #33 connection bounds
            Refused::ConnectionsPerPeer { .. } => "connections_per_peer",
            Refused::StreamsPerPeer { .. } => "streams_per_peer",
            Refused::IdleConnection { .. } => "idle_connection_timeout",
            Refused::RequestReceiveTimeout { .. } => "request_receive_timeout",
            Refused::LargeRequestsWaiting { .. } => "large_requests_waiting",
        }
    }

    /// The gRPC status a refused stream ends with.
    pub fn status(&self) -> tonic::Status {
        tonic::Status::resource_exhausted(self.to_string())
    }
}

/// A stream's place: one of `--max-streams`, and one of its address's `--max-streams-per-peer`;
/// both given back when it is dropped (the stream ends).
#[derive(Debug)]
pub struct StreamSlot {
    pub(crate) _global: OwnedSemaphorePermit,
    pub(crate) _peer: Option<crate::conn::PeerStream>,
}

/// Limits and the shared counters they are checked against: one per process, shared by every
/// shard's port (memory is the process's).
#[derive(Debug)]
pub struct ServerLimits {
    /// Per-stream limits.
    pub stream: StreamLimits,
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--max-streams`.
    pub max_streams: usize,
    /// `--max-streams-per-connection` (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_streams_per_connection: u32,
    /// `--max-request-size`.
    pub max_request_size: usize,
    /// `--max-connection-age`: connections are told to go away (HTTP/2 GOAWAY) after this long,
    /// and their streams end [`ServerLimits::connection_age_grace`] later.
    pub max_connection_age: Option<Duration>,
    /// `--max-connection-age-grace`.
    pub connection_age_grace: Duration,
    /// `--unacked-threshold`: a stream whose oldest unacknowledged response is older than this
    /// counts in `mcp_adapter_unacked_responses`.
    pub unacked_threshold: Duration,
    /// Stream slots (`--max-streams`).
    pub streams: Arc<Semaphore>,
    /// Connections open now.
    pub connections: Arc<AtomicUsize>,
    /// Bytes (in KiB) that requests larger than `request_body::FREE` (16 KiB) may hold at once
    /// while they are received: 4 × `--max-request-size`.
    pub large_requests: Arc<Semaphore>,
    /// Resource names all streams hold together: 4 × `--max-resource-names`.
    pub names: Arc<NamesBudget>,
    // #33 connection bounds
    /// Idle connections, connections per peer, large requests' receive deadline.
    pub bounds: ConnectionBounds,
    /// Connections open now, by peer address, and those held over a limit.
    pub peers: Arc<crate::conn::Peers>,
    log: RefusalLog,
}

impl ServerLimits {
    /// Limits with fresh counters.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stream: StreamLimits,
        max_connections: usize,
        max_streams: usize,
        max_streams_per_connection: u32,
        max_request_size: usize,
        max_connection_age: Option<Duration>,
        connection_age_grace: Duration,
        unacked_threshold: Duration,
    ) -> Self {
        Self {
            stream,
            max_connections,
            max_streams,
            max_streams_per_connection,
            max_request_size,
            max_connection_age,
            connection_age_grace,
            unacked_threshold,
            streams: Arc::new(Semaphore::new(max_streams)),
            connections: Arc::default(),
            large_requests: Arc::new(Semaphore::new(
                (4 * max_request_size.div_ceil(1024)).min(Semaphore::MAX_PERMITS),
            )),
            names: Arc::new(NamesBudget {
                used: AtomicUsize::new(0),
                limit: stream.max_names.saturating_mul(4),
            }),
            bounds: ConnectionBounds::default(),
            peers: Arc::default(),
            log: RefusalLog::default(),
        }
    }

    /// Counts a refusal and logs it (throttled per limit).
    pub fn refused(&self, metrics: &ServerMetrics, refused: &Refused, protocol: &str, peer: &str) {
        metrics
            .refused_streams
            .with_label_values(&[refused.label()])
            .inc();
        if let Some(more) = self.log.due(refused.label()) {
            tracing::warn!(protocol, %peer, limit = refused.label(), refused_since_last_log = more, reason = %refused, "Refused a sink over a limit.");
        }
    }
}

/// The flags' defaults.
impl Default for ServerLimits {
    fn default() -> Self {
        Self::new(
            StreamLimits::default(),
            MAX_CONNECTIONS,
            MAX_STREAMS,
            MAX_STREAMS_PER_CONNECTION,
            MAX_REQUEST_SIZE,
            Some(MAX_CONNECTION_AGE),
            MAX_CONNECTION_AGE_GRACE,
            UNACKED_THRESHOLD,
        )
    }
}

// #33 stream bounds
impl ServerLimits {
    /// Logs a sink's NACK, at most once every [`LOG_EVERY`] for all streams (a sink can NACK in
    /// a loop; `mcp_adapter_nacks_total` counts every one), its peer-supplied texts clipped.
    pub fn nacked(&self, protocol: &str, peer: &str, type_url: &str, reason: &str) {
        if let Some(more) = self.log.due("nack") {
            let type_url = mcp_core::clip::clip(type_url, LOGGED_TEXT_MAX);
            let reason = mcp_core::clip::clip(reason, LOGGED_TEXT_MAX);
            tracing::warn!(protocol, %peer, %type_url, %reason, nacks_since_last_log = more, "Sink rejected a response.");
        }
    }
}

/// Resource names held by every stream together (subscribed, or declared held), against a
/// total: the per-stream limit alone would let a thousand streams hold a thousand times it.
#[derive(Debug)]
pub struct NamesBudget {
    used: AtomicUsize,
    limit: usize,
}

impl NamesBudget {
    /// Names held now, by all streams.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }
}

/// One stream's share of the [`NamesBudget`], given back when it ends.
#[derive(Debug)]
pub struct NamesCharge {
    budget: Arc<NamesBudget>,
    held: usize,
}

impl NamesCharge {
    /// A stream's share, empty.
    pub fn new(budget: Arc<NamesBudget>) -> Self {
        Self { budget, held: 0 }
    }

    /// The stream now holds `names`: fails, keeping the share as it was, if that would take
    /// the total over the budget.
    pub fn set(&mut self, names: usize) -> Result<(), Refused> {
        if names > self.held {
            let more = names - self.held;
            let limit = self.budget.limit;
            self.budget
                .used
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                    used.checked_add(more).filter(|n| *n <= limit)
                })
                .map_err(|_| Refused::ResourceNamesTotal { limit })?;
        } else {
            self.budget
                .used
                .fetch_sub(self.held - names, Ordering::SeqCst);
        }
        self.held = names;
        Ok(())
    }
}

impl Drop for NamesCharge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::SeqCst);
    }
}

/// When each limit last logged, and how many of its refusals were not logged since.
#[derive(Debug, Default)]
struct RefusalLog {
    last: Mutex<Vec<(&'static str, Instant, u64)>>,
}

impl RefusalLog {
    /// `Some(refusals of this limit not logged since its last line)` if `label` may log now.
    fn due(&self, label: &'static str) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match last.iter_mut().find(|(l, _, _)| *l == label) {
            Some((_, at, skipped)) if now.duration_since(*at) < LOG_EVERY => {
                *skipped += 1;
                None
            }
            Some((_, at, skipped)) => {
                *at = now;
                Some(std::mem::take(skipped))
            }
            None => {
                last.push((label, now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_their_flag_and_log_once_per_interval() {
        for (r, flag) in [
            (Refused::Connections { limit: 1 }, "--max-connections"),
            (Refused::Streams { limit: 1 }, "--max-streams"),
            (
                Refused::TypeUrlLength { len: 9, limit: 1 },
                "--max-type-url-length",
            ),
            (
                Refused::TypesPerStream { limit: 1 },
                "--max-types-per-stream",
            ),
            (
                Refused::ResourceNames {
                    type_url: "t".into(),
                    count: 2,
                    limit: 1,
                },
                "--max-resource-names",
            ),
            (
                Refused::RequestSize { len: 9, limit: 1 },
                "--max-request-size",
            ),
            (
                Refused::ResourceNamesTotal { limit: 4 },
                "--max-resource-names",
            ),
            (
                Refused::ResourceNameLength { len: 9, limit: 1 },
                "--max-resource-name-length",
            ),
            (
                Refused::NodeIdLength { len: 9, limit: 1 },
                "--max-node-id-length",
            ),
            (
                Refused::StreamBytes { bytes: 9, limit: 1 },
                "--max-stream-bytes",
            ),
            (
                Refused::ConnectionsPerPeer { limit: 2 },
                "--max-connections-per-peer",
            ),
            (
                Refused::IdleConnection {
                    timeout: Duration::from_secs(1),
                },
                "--idle-connection-timeout",
            ),
            (
                Refused::RequestReceiveTimeout {
                    len: 9,
                    timeout: Duration::from_secs(1),
                },
                "--request-receive-timeout",
            ),
        ] {
            let status = r.status();
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert!(status.message().contains(flag), "{status:?}");
        }
        let limits = ServerLimits::default();
        let mut one = NamesCharge::new(limits.names.clone());
        let mut two = NamesCharge::new(limits.names.clone());
        let total = 4 * MAX_RESOURCE_NAMES;
        one.set(total - 10).expect("within");
        assert_eq!(
            two.set(11),
            Err(Refused::ResourceNamesTotal { limit: total })
        );
        two.set(10).expect("exactly the rest");
        one.set(5).expect("less");
        assert_eq!(limits.names.used(), 15);
        drop(one);
        drop(two);
        assert_eq!(limits.names.used(), 0, "given back");

        let log = RefusalLog::default();
        assert_eq!(log.due("streams"), Some(0));
        assert_eq!(log.due("streams"), None);
        assert_eq!(log.due("streams"), None);
        assert_eq!(log.due("connections"), Some(0), "each limit on its own");
    }
}

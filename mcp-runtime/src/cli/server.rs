//! The gRPC server's limits: what any peer may make it hold, when connections are recycled, and
//! when a slow sink is reported. The defaults never bother Istio (istiod opens one stream per
//! config source and asks for 16 types on it; Pilot's legacy MCP asks for one collection); see
//! `server::limits`.

use std::time::Duration;

use mcp_core::parse;
use mcp_server::limits::{
    ServerLimits, StreamLimits, MAX_CONNECTIONS, MAX_REQUEST_SIZE, MAX_RESOURCE_NAMES, MAX_STREAMS,
    MAX_STREAMS_PER_CONNECTION, MAX_TYPES_PER_STREAM, MAX_TYPE_URL_LENGTH,
};
// #33 stream bounds
use mcp_server::limits::{MAX_NODE_ID_LENGTH, MAX_RESOURCE_NAME_LENGTH, MAX_STREAM_BYTES};
// #33 connection bounds
use mcp_server::limits::{ConnectionBounds, MAX_CONNECTIONS_PER_PEER, MAX_STREAMS_PER_PEER};

/// Flags of the gRPC server's limits.
#[derive(Clone, Debug, clap::Args)]
pub struct ServerArgs {
    /// Most TCP connections served at once (all shard ports together); streams on a connection
    /// over it are refused with RESOURCE_EXHAUSTED, and it is closed.
    #[arg(long, env = "MCP_MAX_CONNECTIONS", default_value_t = MAX_CONNECTIONS, value_parser = positive)]
    pub max_connections: usize,

    /// Most sink streams served at once (all shard ports together); a stream over it is
    /// refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "MCP_MAX_STREAMS", default_value_t = MAX_STREAMS, value_parser = positive)]
    pub max_streams: usize,

    /// Most concurrent streams on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS:
    /// clients wait for a free one).
    #[arg(
        long,
        env = "MCP_MAX_STREAMS_PER_CONNECTION",
        default_value_t = MAX_STREAMS_PER_CONNECTION,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_streams_per_connection: u32,

    /// Most distinct type URLs (or collections) one stream may ask for.
    #[arg(long, env = "MCP_MAX_TYPES_PER_STREAM", default_value_t = MAX_TYPES_PER_STREAM, value_parser = positive)]
    pub max_types_per_stream: usize,

    /// Longest type URL a sink may ask for, in bytes.
    #[arg(long, env = "MCP_MAX_TYPE_URL_LENGTH", default_value_t = MAX_TYPE_URL_LENGTH, value_parser = positive)]
    pub max_type_url_length: usize,

    /// Most resource names one stream may name for a served type: subscribed names, or names
    /// declared held in `initial_resource_versions` (delta, legacy incremental MCP).
    #[arg(long, env = "MCP_MAX_RESOURCE_NAMES", default_value_t = MAX_RESOURCE_NAMES, value_parser = positive)]
    pub max_resource_names: usize,

    /// Largest request a sink may send (`16MiB`; bytes or KiB/MiB/GiB). Requests over 16 KiB
    /// (delta sinks reconnecting with many resources) share 4 × this across all streams while
    /// they are received, and wait for room.
    #[arg(long, env = "MCP_MAX_REQUEST_SIZE", default_value_t = MAX_REQUEST_SIZE, value_parser = request_size)]
    pub max_request_size: usize,

    /// A connection this old is asked to go away (HTTP/2 GOAWAY) and its streams end
    /// `--max-connection-age-grace` later with UNAVAILABLE, so that sinks reconnect and spread
    /// over the replicas again after a rollout. `0`: never.
    #[arg(long, env = "MCP_MAX_CONNECTION_AGE", default_value = "30m", value_parser = parse::duration)]
    pub max_connection_age: Duration,

    /// Time between a connection's GOAWAY and the end of its streams (at least 1s).
    #[arg(long, env = "MCP_MAX_CONNECTION_AGE_GRACE", default_value = "10s", value_parser = grace)]
    pub max_connection_age_grace: Duration,

    /// A stream whose oldest response is unacknowledged for longer than this counts in
    /// `mcp_adapter_unacked_responses` (a sink that stopped ACKing, or lags behind).
    #[arg(long, env = "MCP_UNACKED_THRESHOLD", default_value = "30s", value_parser = parse::duration)]
    pub unacked_threshold: Duration,

    // #33 stream bounds
    /// Longest resource name (or version declared held) a sink may send, in bytes.
    #[arg(long, env = "MCP_MAX_RESOURCE_NAME_LENGTH", default_value_t = MAX_RESOURCE_NAME_LENGTH, value_parser = positive)]
    pub max_resource_name_length: usize,

    /// Longest node id a sink may send, in bytes.
    #[arg(long, env = "MCP_MAX_NODE_ID_LENGTH", default_value_t = MAX_NODE_ID_LENGTH, value_parser = positive)]
    pub max_node_id_length: usize,

    /// Most bytes of type URLs, resource names and declared versions one stream may make the
    /// adapter hold (delta subscriptions add up across requests); bytes or KiB/MiB/GiB.
    #[arg(long, env = "MCP_MAX_STREAM_BYTES", default_value_t = MAX_STREAM_BYTES, value_parser = stream_bytes)]
    pub max_stream_bytes: usize,

    // #33 connection bounds
    /// A connection that opened no stream this long after it was accepted is closed (istiod
    /// opens its stream as soon as it has connected); one whose streams all ended is closed
    /// after 1 min without one (or this, if longer). `0`: never.
    #[arg(long, env = "MCP_IDLE_CONNECTION_TIMEOUT", default_value = "5s", value_parser = parse::duration)]
    pub idle_connection_timeout: Duration,

    /// Most TCP connections served at once from one IP address (all shard ports together);
    /// streams on one over it are refused with RESOURCE_EXHAUSTED, and it is closed.
    #[arg(long, env = "MCP_MAX_CONNECTIONS_PER_PEER", default_value_t = MAX_CONNECTIONS_PER_PEER, value_parser = positive)]
    pub max_connections_per_peer: usize,

    /// Most streams served at once to one IP address (all its connections and the shard ports
    /// together): a stream over it is refused with RESOURCE_EXHAUSTED, so that one address
    /// holding idle streams never takes every `--max-streams` slot.
    #[arg(long, env = "MCP_MAX_STREAMS_PER_PEER", default_value_t = MAX_STREAMS_PER_PEER, value_parser = positive)]
    pub max_streams_per_peer: usize,

    /// A request over 16 KiB must arrive whole within this long of taking its share of the
    /// large-request budget (`--max-request-size`), or its stream ends with RESOURCE_EXHAUSTED.
    #[arg(long, env = "MCP_REQUEST_RECEIVE_TIMEOUT", default_value = "30s", value_parser = receive_timeout)]
    pub request_receive_timeout: Duration,
}

// #33 connection bounds
impl ServerArgs {
    /// The connection bounds these flags set.
    pub fn connection_bounds(&self) -> ConnectionBounds {
        ConnectionBounds {
            idle_timeout: (!self.idle_connection_timeout.is_zero())
                .then_some(self.idle_connection_timeout),
            max_per_peer: self.max_connections_per_peer,
            max_streams_per_peer: self.max_streams_per_peer,
            request_receive_timeout: self.request_receive_timeout,
        }
    }
}

/// `--request-receive-timeout`: a duration above 0.
fn receive_timeout(s: &str) -> Result<Duration, String> {
    let d = parse::duration(s)?;
    if d.is_zero() {
        return Err(format!("invalid timeout {s:?}: must be above 0"));
    }
    Ok(d)
}

impl ServerArgs {
    /// The limits these flags set, with fresh counters.
    pub fn limits(&self) -> ServerLimits {
        ServerLimits::new(
            StreamLimits {
                max_types: self.max_types_per_stream,
                max_type_url_len: self.max_type_url_length,
                max_names: self.max_resource_names,
                max_name_len: self.max_resource_name_length,
                max_node_id_len: self.max_node_id_length,
                max_bytes: self.max_stream_bytes,
            },
            self.max_connections,
            self.max_streams,
            self.max_streams_per_connection,
            self.max_request_size,
            (!self.max_connection_age.is_zero()).then_some(self.max_connection_age),
            self.max_connection_age_grace,
            self.unacked_threshold,
        )
        .with_connection_bounds(self.connection_bounds())
    }
}

/// A count above 0.
fn positive(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid count {s:?}: must be a whole number above 0"))
}

/// `--max-request-size`: a byte count ([`parse::size`]) of at least 1 KiB that fits in memory.
fn request_size(s: &str) -> Result<usize, String> {
    parse::size(s)?
        .try_into()
        .ok()
        .filter(|n: &usize| (1024..=1 << 30).contains(n))
        .ok_or_else(|| format!("invalid size {s:?}: must be between 1KiB and 1GiB"))
}

// #33 stream bounds
/// `--max-stream-bytes`: a byte count ([`parse::size`]) above 0 that fits in memory.
fn stream_bytes(s: &str) -> Result<usize, String> {
    parse::size(s)?
        .try_into()
        .ok()
        .filter(|n: &usize| (1..=1 << 30).contains(n))
        .ok_or_else(|| format!("invalid size {s:?}: must be between 1 and 1GiB"))
}

/// `--max-connection-age-grace`: a duration of at least 1 s, so that the GOAWAY always
/// reaches the sink before its streams end (or it would reconnect on the same connection).
fn grace(s: &str) -> Result<Duration, String> {
    let d = parse::duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("invalid grace {s:?}: must be at least 1s"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServerArgs, String> {
        crate::cli::parse_group(args)
    }

    #[test]
    fn defaults_and_bad_values() {
        let a = parse(&[]).expect("defaults");
        let l = a.limits();
        assert_eq!(l.stream, StreamLimits::default());
        assert_eq!((l.max_connections, l.max_streams), (1024, 1024));
        assert_eq!(l.max_streams_per_connection, 100);
        assert_eq!(l.max_request_size, 16 << 20);
        assert_eq!(l.max_connection_age, Some(Duration::from_secs(1800)));
        assert_eq!(l.connection_age_grace, Duration::from_secs(10));
        assert_eq!(l.unacked_threshold, Duration::from_secs(30));
        let d = ServerLimits::default();
        assert_eq!(
            (
                d.stream,
                d.max_connection_age,
                d.connection_age_grace,
                d.unacked_threshold
            ),
            (
                l.stream,
                l.max_connection_age,
                l.connection_age_grace,
                l.unacked_threshold
            ),
            "ServerLimits::default() is the flags' defaults"
        );
        assert_eq!(
            l.bounds,
            ConnectionBounds::default(),
            "#33 connection bounds"
        );
        let a = parse(&["--idle-connection-timeout", "0"]).expect("ok");
        assert_eq!(a.limits().bounds.idle_timeout, None);
        let a = parse(&["--max-connection-age", "0", "--max-request-size", "4MiB"]).expect("ok");
        assert_eq!(a.limits().max_connection_age, None);
        assert_eq!(a.max_request_size, 4 << 20);
        for bad in [
            &["--max-streams", "0"][..],
            &["--max-connections=-1"],
            &["--max-types-per-stream", "x"],
            &["--max-streams-per-connection", "0"],
            &["--max-request-size", "100"],
            &["--max-connection-age-grace", "500ms"],
            &["--unacked-threshold", "30"],
            &["--max-resource-name-length", "0"],
            &["--max-node-id-length", "x"],
            &["--max-stream-bytes", "0"],
            &["--max-connections-per-peer", "0"],
            &["--request-receive-timeout", "0"],
        ] {
            let e = parse(bad).expect_err(bad[0]);
            let flag = bad[0].split('=').next().unwrap_or_default();
            assert!(e.contains(flag), "{e}");
        }
    }
}

//! The MCP server's metrics (`mcp_adapter_*`), registered beside the data path's.

use mcp_core::metrics::Metrics;
use prometheus::{HistogramVec, IntCounterVec, IntGauge, IntGaugeVec};

/// ACK latency buckets: a sink on the same host ACKs in about a millisecond, istiod under load in
/// tens to hundreds, and one that takes a minute is stuck (`mcp_adapter_unacked_responses`).
const ACK_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// What the server counts: responses, ACKs and NACKs, open streams, refusals, TLS.
#[derive(Clone, Debug)]
pub struct ServerMetrics {
    /// Responses sent, by protocol and type class.
    pub pushes: IntCounterVec,
    /// Encoded bytes of responses sent, by protocol.
    pub push_bytes: IntCounterVec,
    /// Responses not sent because they exceeded `--max-message-size`, by protocol.
    pub oversized: IntCounterVec,
    /// ACKs received, by protocol and type class.
    pub acks: IntCounterVec,
    /// NACKs received, by protocol and type class.
    pub nacks: IntCounterVec,
    /// Open sink streams, by protocol.
    pub sinks: IntGaugeVec,
    /// Streams refused or ended by a server limit, by limit.
    pub refused_streams: IntCounterVec,
    /// Streams whose oldest unacknowledged response is older than `--unacked-threshold`, by
    /// protocol.
    pub unacked: IntGaugeVec,
    /// `--shards`: per shard, open sink streams.
    pub shard_sinks: IntGaugeVec,
    /// `--shards`: per shard, encoded bytes of responses sent.
    pub shard_push_bytes: IntCounterVec,
    /// TLS clients refused, by reason (`handshake`, `san_not_allowed`).
    pub tls_refused: IntCounterVec,
    /// Changed TLS files taken (`ok`) or refused as unusable (`error`).
    pub tls_reloads: IntCounterVec,
    /// 1 while a changed TLS file is not usable (the previous certificate or CAs are served).
    pub tls_reload_failing: IntGauge,
    /// notAfter of the served certificate, Unix seconds (0 without TLS).
    pub tls_not_after: IntGauge,
    /// Connections refused or closed by a server limit, by limit (#33).
    pub refused_connections: IntCounterVec,
    /// Open connections: `served` (within the limits) and `over_limit` (held to answer their
    /// streams' refusals).
    pub connections: IntGaugeVec,
    /// Seconds from a response sent to its ACK, by protocol (served types).
    pub ack_latency: HistogramVec,
    /// (sink stream, served type) pairs by protocol and sync state (`sync_status.rs`).
    pub sink_subscriptions: IntGaugeVec,
}

impl ServerMetrics {
    /// Registers the server's series in `metrics`' registry.
    pub fn new(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let r = metrics.registrar();
        Ok(Self {
            pushes: r.counter(
                "mcp_adapter_pushes_total",
                "Responses sent to sinks.",
                &["protocol", "type"],
            )?,
            push_bytes: r.counter(
                "mcp_adapter_push_bytes_total",
                "Encoded bytes of responses sent to sinks.",
                &["protocol"],
            )?,
            oversized: r.counter(
                "mcp_adapter_oversized_responses_total",
                "Responses not sent because they exceeded --max-message-size (the stream was ended).",
                &["protocol"],
            )?,
            acks: r.counter(
                "mcp_adapter_acks_total",
                "ACKs received from sinks.",
                &["protocol", "type"],
            )?,
            nacks: r.counter(
                "mcp_adapter_nacks_total",
                "NACKs received from sinks.",
                &["protocol", "type"],
            )?,
            sinks: r.gauge_vec(
                "mcp_adapter_connected_sinks",
                "Open sink streams.",
                &["protocol"],
            )?,
            refused_streams: r.counter(
                "mcp_adapter_refused_streams_total",
                "Sink streams refused or ended because they went over a server limit (--max-streams, --max-types-per-stream, ...).",
                &["limit"],
            )?,
            unacked: r.gauge_vec(
                "mcp_adapter_unacked_responses",
                "Sink streams whose oldest unacknowledged response is older than --unacked-threshold.",
                &["protocol"],
            )?,
            shard_sinks: r.gauge_vec(
                "mcp_adapter_shard_connected_sinks",
                "Open sink streams of each shard (--shards).",
                &["shard"],
            )?,
            shard_push_bytes: r.counter(
                "mcp_adapter_shard_push_bytes_total",
                "Encoded bytes of responses sent by each shard (--shards).",
                &["shard"],
            )?,
            tls_refused: r.counter(
                "mcp_adapter_tls_refused_connections_total",
                "TLS clients refused: handshake failed (no or unknown client certificate, not TLS), or san_not_allowed (--tls-client-san).",
                &["reason"],
            )?,
            tls_reloads: r.counter(
                "mcp_adapter_tls_reloads_total",
                "Changed TLS files (certificate and key, client CAs) taken (ok) or refused as unusable (error).",
                &["result"],
            )?,
            tls_reload_failing: r.gauge(
                "mcp_adapter_tls_reload_failing",
                "1 while a changed TLS file is not usable and the previous certificate or client CAs are still served.",
            )?,
            tls_not_after: r.gauge(
                "mcp_adapter_tls_certificate_not_after_seconds",
                "Expiry (notAfter, Unix seconds) of the served TLS certificate; 0 without TLS.",
            )?,
            refused_connections: r.counter(
                "mcp_adapter_refused_connections_total",
                "Connections refused or closed because of a server limit (--max-connections, --max-connections-per-peer, --idle-connection-timeout).",
                &["limit"],
            )?,
            connections: r.gauge_vec(
                "mcp_adapter_connections",
                "Open gRPC connections: served (within the limits), over_limit (held a moment to answer their streams with the limit, then closed).",
                &["state"],
            )?,
            ack_latency: r.histogram(
                "mcp_adapter_ack_latency_seconds",
                "Seconds from a response sent to a sink to its ACK (ServiceEntry types).",
                &["protocol"],
                ACK_BUCKETS,
            )?,
            sink_subscriptions: r.gauge_vec(
                "mcp_adapter_sink_subscriptions",
                "Sink streams' served types by sync state: synced (the newest response sent was acknowledged), pending (a response in flight), nacked (the last response was rejected, none acknowledged since), not_sent (nothing sent yet).",
                &["protocol", "state"],
            )?,
        })
    }
}

//! Prometheus metrics, all named `mcp_adapter_*` and labelled with the `registry` type.

use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Every metric the adapter exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
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
    /// Resources served.
    pub resources: IntGauge,
    /// Services that failed validation.
    pub quarantined: IntGauge,
    /// Things dropped to make a resource valid, by kind.
    pub translation_warnings: IntCounterVec,
    /// Registry watch failures, by kind.
    pub registry_errors: IntCounterVec,
    /// Registry errors a watch retried by itself, without ending, by kind.
    pub registry_retries: IntCounterVec,
    /// 1 while the registry is reachable and in sync, else 0.
    pub registry_healthy: IntGauge,
    /// Seconds since the registry was last known in sync (0 while healthy).
    pub sync_age: IntGauge,
    /// Registry objects currently skipped as bad data.
    pub registry_problems: IntGauge,
    /// New snapshots published.
    pub snapshots: IntCounterVec,
    /// `--shards`: per shard, resources served.
    pub shard_resources: IntGaugeVec,
    /// `--shards`: per shard, new snapshots published.
    pub shard_snapshots: IntCounterVec,
    /// `--shards`: per shard, open sink streams.
    pub shard_sinks: IntGaugeVec,
    /// `--shards`: per shard, encoded bytes of responses sent.
    pub shard_push_bytes: IntCounterVec,
    /// Kubernetes output: requests to the API server, by verb and HTTP code.
    pub kube_requests: IntCounterVec,
    /// Kubernetes output: objects still to write or delete for the newest served set.
    pub kube_pending: IntGauge,
    /// Kubernetes output: seconds since the oldest change the API server does not hold yet
    /// (0 when it holds the served set).
    pub kube_lag: Gauge,
    /// Kubernetes output: 1 while this replica holds the Lease (writes), else 0.
    pub kube_leader: IntGauge,
    /// Kubernetes output: this adapter's objects in the API server.
    pub kube_objects: IntGauge,
    /// Kubernetes output: served names held by someone else's object (left alone).
    pub kube_conflicts: IntGauge,
    /// Kubernetes output: objects the API server refused.
    pub kube_rejected: IntGauge,
    /// TLS clients refused, by reason (`handshake`, `san_not_allowed`).
    pub tls_refused: IntCounterVec,
    /// Changed TLS files taken (`ok`) or refused as unusable (`error`).
    pub tls_reloads: IntCounterVec,
    /// 1 while a changed TLS file is not usable (the previous certificate or CAs are served).
    pub tls_reload_failing: IntGauge,
    /// notAfter of the served certificate, Unix seconds (0 without TLS).
    pub tls_not_after: IntGauge,
}

impl Metrics {
    /// Creates the metrics with `registry=<name>` on every series.
    pub fn new(registry_name: &str) -> Result<Self, prometheus::Error> {
        let labels = [("registry".to_string(), registry_name.to_string())].into();
        let registry = Registry::new_custom(None, Some(labels))?;
        let counter =
            |name: &str, help: &str, l: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help), l)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let gauge_vec =
            |name: &str, help: &str, l: &[&str]| -> Result<IntGaugeVec, prometheus::Error> {
                let g = IntGaugeVec::new(Opts::new(name, help), l)?;
                registry.register(Box::new(g.clone()))?;
                Ok(g)
            };
        Ok(Self {
            pushes: counter(
                "mcp_adapter_pushes_total",
                "Responses sent to sinks.",
                &["protocol", "type"],
            )?,
            push_bytes: counter(
                "mcp_adapter_push_bytes_total",
                "Encoded bytes of responses sent to sinks.",
                &["protocol"],
            )?,
            oversized: counter(
                "mcp_adapter_oversized_responses_total",
                "Responses not sent because they exceeded --max-message-size (the stream was ended).",
                &["protocol"],
            )?,
            acks: counter(
                "mcp_adapter_acks_total",
                "ACKs received from sinks.",
                &["protocol", "type"],
            )?,
            nacks: counter(
                "mcp_adapter_nacks_total",
                "NACKs received from sinks.",
                &["protocol", "type"],
            )?,
            sinks: gauge_vec(
                "mcp_adapter_connected_sinks",
                "Open sink streams.",
                &["protocol"],
            )?,
            refused_streams: counter(
                "mcp_adapter_refused_streams_total",
                "Sink streams refused or ended because they went over a server limit (--max-streams, --max-types-per-stream, ...).",
                &["limit"],
            )?,
            unacked: gauge_vec(
                "mcp_adapter_unacked_responses",
                "Sink streams whose oldest unacknowledged response is older than --unacked-threshold.",
                &["protocol"],
            )?,
            resources: gauge("mcp_adapter_resources", "ServiceEntries served.")?,
            quarantined: gauge(
                "mcp_adapter_quarantined_resources",
                "Services that failed validation (see /debug/resources).",
            )?,
            translation_warnings: counter(
                "mcp_adapter_translation_warnings_total",
                "Labels, endpoints or endpoint ports dropped to keep a ServiceEntry valid.",
                &["kind"],
            )?,
            registry_errors: counter(
                "mcp_adapter_registry_errors_total",
                "Registry watch failures.",
                &["kind"],
            )?,
            registry_retries: counter(
                "mcp_adapter_registry_retries_total",
                "Registry errors a watch retried by itself from where it was, without ending.",
                &["kind"],
            )?,
            registry_healthy: gauge(
                "mcp_adapter_registry_healthy",
                "1 while the registry is reachable and in sync.",
            )?,
            sync_age: gauge(
                "mcp_adapter_last_good_sync_age_seconds",
                "Seconds since the registry was last known in sync (0 while healthy).",
            )?,
            registry_problems: gauge(
                "mcp_adapter_registry_problems",
                "Registry objects skipped as bad data (see /debug/resources).",
            )?,
            snapshots: counter(
                "mcp_adapter_snapshots_total",
                "New served sets published.",
                &["reason"],
            )?,
            shard_resources: gauge_vec(
                "mcp_adapter_shard_resources",
                "ServiceEntries served by each shard (--shards).",
                &["shard"],
            )?,
            shard_snapshots: counter(
                "mcp_adapter_shard_snapshots_total",
                "New served sets published by each shard (--shards).",
                &["shard"],
            )?,
            shard_sinks: gauge_vec(
                "mcp_adapter_shard_connected_sinks",
                "Open sink streams of each shard (--shards).",
                &["shard"],
            )?,
            shard_push_bytes: counter(
                "mcp_adapter_shard_push_bytes_total",
                "Encoded bytes of responses sent by each shard (--shards).",
                &["shard"],
            )?,
            kube_requests: counter(
                "mcp_adapter_kube_output_requests_total",
                "Kubernetes output: requests to the API server, by verb and HTTP code.",
                &["verb", "code"],
            )?,
            kube_pending: gauge(
                "mcp_adapter_kube_output_pending",
                "Kubernetes output: objects still to write or delete for the newest served set.",
            )?,
            kube_lag: {
                let g = Gauge::new(
                    "mcp_adapter_kube_output_lag_seconds",
                    "Kubernetes output: seconds since the oldest change the API server does not hold yet.",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            kube_leader: gauge(
                "mcp_adapter_kube_output_leader",
                "Kubernetes output: 1 while this replica holds the Lease and writes.",
            )?,
            kube_objects: gauge(
                "mcp_adapter_kube_output_objects",
                "Kubernetes output: this adapter's ServiceEntry objects in the API server.",
            )?,
            kube_conflicts: gauge(
                "mcp_adapter_kube_output_conflicts",
                "Kubernetes output: served names held by an object that is not this adapter's (left alone).",
            )?,
            kube_rejected: gauge(
                "mcp_adapter_kube_output_rejected",
                "Kubernetes output: objects the API server refused.",
            )?,
            tls_refused: counter(
                "mcp_adapter_tls_refused_connections_total",
                "TLS clients refused: handshake failed (no or unknown client certificate, not TLS), or san_not_allowed (--tls-client-san).",
                &["reason"],
            )?,
            tls_reloads: counter(
                "mcp_adapter_tls_reloads_total",
                "Changed TLS files (certificate and key, client CAs) taken (ok) or refused as unusable (error).",
                &["result"],
            )?,
            tls_reload_failing: gauge(
                "mcp_adapter_tls_reload_failing",
                "1 while a changed TLS file is not usable and the previous certificate or client CAs are still served.",
            )?,
            tls_not_after: gauge(
                "mcp_adapter_tls_certificate_not_after_seconds",
                "Expiry (notAfter, Unix seconds) of the served TLS certificate; 0 without TLS.",
            )?,
            registry,
        })
    }

    /// Adds a registry's own metric ([`crate::Registry::collectors`]) to those rendered.
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> Result<(), prometheus::Error> {
        self.registry.register(collector)
    }

    /// Text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "Failed to render metrics.");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_renders_with_the_registry_label() {
        let m = Metrics::new("consul").expect("metrics");
        m.pushes.with_label_values(&["xds", "serviceentry"]).inc();
        m.push_bytes.with_label_values(&["xds"]).inc();
        m.oversized.with_label_values(&["xds"]).inc();
        m.acks.with_label_values(&["xds", "serviceentry"]).inc();
        m.nacks.with_label_values(&["xds", "serviceentry"]).inc();
        m.sinks.with_label_values(&["xds"]).inc();
        m.refused_streams.with_label_values(&["streams"]).inc();
        m.unacked.with_label_values(&["xds"]).inc();
        m.translation_warnings.with_label_values(&["label"]).inc();
        m.registry_errors.with_label_values(&["unavailable"]).inc();
        m.registry_retries.with_label_values(&["unavailable"]).inc();
        m.snapshots.with_label_values(&["change"]).inc();
        m.shard_resources.with_label_values(&["0"]).set(1);
        m.shard_snapshots.with_label_values(&["0"]).inc();
        m.shard_sinks.with_label_values(&["0"]).inc();
        m.shard_push_bytes.with_label_values(&["0"]).inc();
        m.kube_requests.with_label_values(&["apply", "200"]).inc();
        m.tls_refused.with_label_values(&["handshake"]).inc();
        m.tls_reloads.with_label_values(&["ok"]).inc();
        let text = m.render();
        for name in [
            "mcp_adapter_pushes_total",
            "mcp_adapter_push_bytes_total",
            "mcp_adapter_oversized_responses_total",
            "mcp_adapter_acks_total",
            "mcp_adapter_nacks_total",
            "mcp_adapter_connected_sinks",
            "mcp_adapter_refused_streams_total",
            "mcp_adapter_unacked_responses",
            "mcp_adapter_resources",
            "mcp_adapter_quarantined_resources",
            "mcp_adapter_translation_warnings_total",
            "mcp_adapter_registry_errors_total",
            "mcp_adapter_registry_retries_total",
            "mcp_adapter_registry_healthy",
            "mcp_adapter_last_good_sync_age_seconds",
            "mcp_adapter_registry_problems",
            "mcp_adapter_snapshots_total",
            "mcp_adapter_shard_resources",
            "mcp_adapter_shard_snapshots_total",
            "mcp_adapter_shard_connected_sinks",
            "mcp_adapter_shard_push_bytes_total",
            "mcp_adapter_tls_refused_connections_total",
            "mcp_adapter_tls_reloads_total",
            "mcp_adapter_tls_reload_failing",
            "mcp_adapter_tls_certificate_not_after_seconds",
            "mcp_adapter_kube_output_requests_total",
            "mcp_adapter_kube_output_pending",
            "mcp_adapter_kube_output_lag_seconds",
            "mcp_adapter_kube_output_leader",
            "mcp_adapter_kube_output_objects",
            "mcp_adapter_kube_output_conflicts",
            "mcp_adapter_kube_output_rejected",
        ] {
            assert!(
                text.contains(&format!("{name}{{")),
                "{name} missing:\n{text}"
            );
        }
        assert!(text.contains("registry=\"consul\""));
    }
}

//! The Kubernetes output's metrics (`mcp_adapter_kube_output_*`), registered beside the data
//! path's.

use mcp_core::metrics::Metrics;
use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec};

/// What the output counts: requests, pending objects, lag, leadership, objects, conflicts.
#[derive(Clone, Debug)]
pub struct OutputMetrics {
    /// Kubernetes output: requests to the API server, by verb and HTTP code.
    pub kube_requests: IntCounterVec,
    /// Kubernetes output: objects still to write or delete for the newest served set.
    pub kube_pending: IntGauge,
    /// Kubernetes output: seconds since the oldest change the API server does not hold yet
    /// (0 when it holds the served set).
    pub kube_lag: Gauge,
    /// Kubernetes output: 1 while this replica holds the Lease (writes), else 0.
    pub kube_leader: IntGauge,
    /// Kubernetes output: 1 when this adapter runs it (`--output kube|both`), else 0: what tells
    /// "no replica leads" from "the output is off" (the leader series is 0 in both).
    pub kube_enabled: IntGauge,
    /// Kubernetes output: this adapter's objects in the API server.
    pub kube_objects: IntGauge,
    /// Kubernetes output: served names held by someone else's object (left alone).
    pub kube_conflicts: IntGauge,
    /// Kubernetes output: objects the API server refused.
    pub kube_rejected: IntGauge,
    /// Kubernetes output: namespaces it cannot list (refused or failing); their objects are left
    /// alone until it can.
    pub kube_unreadable: IntGauge,
    /// Kubernetes output: other adapters that claim this one's objects (same registry, source
    /// and shard), by where they were seen: `lease` (the holder of this adapter's Lease is
    /// configured differently) or `objects` (objects written under another live Lease).
    pub kube_owner_conflicts: IntGaugeVec,
}

impl OutputMetrics {
    /// Registers the output's series in `metrics`' registry.
    pub fn new(metrics: &Metrics) -> Result<Self, prometheus::Error> {
        let r = metrics.registrar();
        let m = Self {
            kube_requests: r.counter(
                "mcp_adapter_kube_output_requests_total",
                "Kubernetes output: requests to the API server, by verb and HTTP code.",
                &["verb", "code"],
            )?,
            kube_pending: r.gauge(
                "mcp_adapter_kube_output_pending",
                "Kubernetes output: objects still to write or delete for the newest served set.",
            )?,
            kube_lag: r.float_gauge(
                "mcp_adapter_kube_output_lag_seconds",
                "Kubernetes output: seconds since the oldest change the API server does not hold yet.",
            )?,
            kube_leader: r.gauge(
                "mcp_adapter_kube_output_leader",
                "Kubernetes output: 1 while this replica holds the Lease and writes.",
            )?,
            kube_enabled: r.gauge(
                "mcp_adapter_kube_output_enabled",
                "Kubernetes output: 1 when this adapter runs it (--output kube or both), else 0.",
            )?,
            kube_objects: r.gauge(
                "mcp_adapter_kube_output_objects",
                "Kubernetes output: this adapter's ServiceEntry objects in the API server.",
            )?,
            kube_conflicts: r.gauge(
                "mcp_adapter_kube_output_conflicts",
                "Kubernetes output: served names held by an object that is not this adapter's (left alone).",
            )?,
            kube_rejected: r.gauge(
                "mcp_adapter_kube_output_rejected",
                "Kubernetes output: objects the API server refused.",
            )?,
            kube_unreadable: r.gauge(
                "mcp_adapter_kube_output_unreadable_namespaces",
                "Kubernetes output: namespaces it cannot list (their objects are left alone until it can; /registryz names them).",
            )?,
            kube_owner_conflicts: r.gauge_vec(
                "mcp_adapter_kube_output_owner_conflicts",
                "Kubernetes output: other adapters claiming this adapter's objects (same registry, source and shard), by where they were seen (lease, objects).",
                &["seen_in"],
            )?,
        };
        // Both series exist from the start: a dashboard tells 0 from "not reported".
        for seen_in in ["lease", "objects"] {
            m.kube_owner_conflicts.with_label_values(&[seen_in]).set(0);
        }
        Ok(m)
    }
}

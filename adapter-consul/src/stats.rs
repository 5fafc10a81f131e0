//! What the adapter costs Consul and how current Consul's answers are, as metrics: requests by
//! endpoint (so a test or an operator can see that a change costs requests in proportion to
//! what changed) and the staleness of the last answer under `?stale` reads.

use prometheus::core::Collector;
use prometheus::{Gauge, IntCounterVec, IntGauge, Opts};

/// The adapter's own Consul metrics; cheap to clone (the clones share the series).
#[derive(Clone, Debug)]
pub struct ConsulStats {
    /// Requests sent to Consul, by endpoint (the path with `:name` for a service name) and
    /// whether they were blocking queries (`watch`) or plain reads (`read`).
    requests: IntCounterVec,
    /// `X-Consul-LastContact` of the last answer, in seconds: how far behind the leader the
    /// server that answered was (0 from the leader itself).
    staleness: Gauge,
    /// Services with their own open blocking query (`--consul-service-watches`).
    service_watches: IntGauge,
}

impl ConsulStats {
    /// New, unregistered series.
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            requests: IntCounterVec::new(
                Opts::new(
                    "mcp_adapter_registry_requests_total",
                    "Requests sent to the registry, by endpoint and mode (watch = blocking query, read).",
                ),
                &["endpoint", "mode"],
            )?,
            staleness: Gauge::new(
                "mcp_adapter_registry_staleness_seconds",
                "How far behind the leader the Consul server that gave the last answer was (X-Consul-LastContact; 0 from the leader).",
            )?,
            service_watches: IntGauge::new(
                "mcp_adapter_registry_service_watches",
                "Services with their own open blocking query: their instance changes cost one answer and no sweep.",
            )?,
        })
    }

    /// Counts one request.
    pub fn request(&self, endpoint: &str, blocking: bool) {
        let mode = if blocking { "watch" } else { "read" };
        self.requests.with_label_values(&[endpoint, mode]).inc();
    }

    /// Records the staleness of an answer.
    pub fn last_contact(&self, seconds: f64) {
        self.staleness.set(seconds);
    }

    /// Sets how many services hold their own blocking query.
    pub fn service_watches(&self, n: usize) {
        self.service_watches
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The series, for the core to serve on /metrics.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.staleness.clone()),
            Box::new(self.service_watches.clone()),
        ]
    }

    /// Requests counted so far for `endpoint` in `mode` (tests).
    #[cfg(test)]
    pub fn count(&self, endpoint: &str, mode: &str) -> u64 {
        self.requests.with_label_values(&[endpoint, mode]).get()
    }
}

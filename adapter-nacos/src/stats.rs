//! What the adapter costs Nacos, as metrics: requests by kind (so a test or an operator can see
//! that an unchanged registry costs one catalog read per namespace per interval and nothing
//! else), pushes received, and the subscriptions held.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

/// The adapter's own Nacos metrics; cheap to clone (the clones share the series).
#[derive(Clone, Debug)]
pub struct NacosStats {
    requests: IntCounterVec,
    pushes: IntCounter,
    unreadable: IntCounter,
    subscriptions: IntGauge,
}

impl NacosStats {
    /// New, unregistered series.
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            requests: IntCounterVec::new(
                Opts::new(
                    "mcp_adapter_registry_requests_total",
                    "Requests sent to the registry, by endpoint (login, namespaces, catalog: one page of a service list over HTTP or gRPC, connect, subscribe, unsubscribe) and mode (read, watch).",
                ),
                &["endpoint", "mode"],
            )?,
            pushes: IntCounter::new(
                "mcp_adapter_registry_pushes_total",
                "Service pushes received from Nacos (each one service's whole instance list).",
            )?,
            unreadable: IntCounter::new(
                "mcp_adapter_registry_unreadable_total",
                "Messages from the registry that could not be read (each acknowledged, named under /debug problems, and its service read again).",
            )?,
            subscriptions: IntGauge::new(
                "mcp_adapter_registry_subscriptions",
                "Nacos services subscribed to (each one's changes are pushed).",
            )?,
        })
    }

    /// Counts one request to `endpoint` (`watch` for subscriptions, `read` for the rest).
    pub fn request(&self, endpoint: &str) {
        let mode = if endpoint == "subscribe" {
            "watch"
        } else {
            "read"
        };
        self.requests.with_label_values(&[endpoint, mode]).inc();
    }

    /// Counts `n` pushes.
    pub fn pushes(&self, n: u64) {
        self.pushes.inc_by(n);
    }

    /// Counts one unreadable message.
    pub fn unreadable(&self) {
        self.unreadable.inc();
    }

    /// Sets how many services are subscribed to.
    pub fn subscriptions(&self, n: usize) {
        self.subscriptions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The series, for the core to serve on /metrics.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.pushes.clone()),
            Box::new(self.unreadable.clone()),
            Box::new(self.subscriptions.clone()),
        ]
    }
}

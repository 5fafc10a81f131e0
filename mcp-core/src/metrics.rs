//! Prometheus metrics, all named `mcp_adapter_*` and labelled with the `registry` type.
//!
//! [`Metrics`] owns the registry every series goes into and holds the data path's own series;
//! the layers above register theirs (the MCP server's, the Kubernetes output's) into the same
//! registry through [`Metrics::registrar`], so one `/metrics` page renders them all.

use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// The data path's metrics (registry health, the served set, translation), and the registry
/// every layer's metrics are rendered from.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
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
}

/// Creates metrics in the shared registry (each name once per process).
#[derive(Clone, Copy, Debug)]
pub struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    /// A counter with labels.
    pub fn counter(
        self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, prometheus::Error> {
        let c = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.0.register(Box::new(c.clone()))?;
        Ok(c)
    }

    /// An integer gauge.
    pub fn gauge(self, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
        let g = IntGauge::new(name, help)?;
        self.0.register(Box::new(g.clone()))?;
        Ok(g)
    }

    /// A floating-point gauge.
    pub fn float_gauge(self, name: &str, help: &str) -> Result<Gauge, prometheus::Error> {
        let g = Gauge::new(name, help)?;
        self.0.register(Box::new(g.clone()))?;
        Ok(g)
    }

    /// A histogram with labels and its bucket bounds.
    pub fn histogram(
        self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> Result<HistogramVec, prometheus::Error> {
        let h = HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            labels,
        )?;
        self.0.register(Box::new(h.clone()))?;
        Ok(h)
    }

    /// An integer gauge with labels.
    pub fn gauge_vec(
        self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, prometheus::Error> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.0.register(Box::new(g.clone()))?;
        Ok(g)
    }
}

impl Metrics {
    /// Creates the metrics with `registry=<name>` on every series.
    pub fn new(registry_name: &str) -> Result<Self, prometheus::Error> {
        let labels = [("registry".to_string(), registry_name.to_string())].into();
        let registry = Registry::new_custom(None, Some(labels))?;
        let r = Registrar(&registry);
        Ok(Self {
            resources: r.gauge("mcp_adapter_resources", "ServiceEntries served.")?,
            quarantined: r.gauge(
                "mcp_adapter_quarantined_resources",
                "Services that failed validation (see /debug/resources).",
            )?,
            translation_warnings: r.counter(
                "mcp_adapter_translation_warnings_total",
                "Labels, endpoints or endpoint ports dropped to keep a ServiceEntry valid.",
                &["kind"],
            )?,
            registry_errors: r.counter(
                "mcp_adapter_registry_errors_total",
                "Registry watch failures.",
                &["kind"],
            )?,
            registry_retries: r.counter(
                "mcp_adapter_registry_retries_total",
                "Registry errors a watch retried by itself from where it was, without ending.",
                &["kind"],
            )?,
            registry_healthy: r.gauge(
                "mcp_adapter_registry_healthy",
                "1 while the registry is reachable and in sync.",
            )?,
            sync_age: r.gauge(
                "mcp_adapter_last_good_sync_age_seconds",
                "Seconds since the registry was last known in sync (0 while healthy).",
            )?,
            registry_problems: r.gauge(
                "mcp_adapter_registry_problems",
                "Registry objects skipped as bad data (see /debug/resources).",
            )?,
            snapshots: r.counter(
                "mcp_adapter_snapshots_total",
                "New served sets published.",
                &["reason"],
            )?,
            shard_resources: r.gauge_vec(
                "mcp_adapter_shard_resources",
                "ServiceEntries served by each shard (--shards).",
                &["shard"],
            )?,
            shard_snapshots: r.counter(
                "mcp_adapter_shard_snapshots_total",
                "New served sets published by each shard (--shards).",
                &["shard"],
            )?,
            registry,
        })
    }

    /// Where another layer creates its metrics, rendered with these (and labelled alike).
    pub fn registrar(&self) -> Registrar<'_> {
        Registrar(&self.registry)
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

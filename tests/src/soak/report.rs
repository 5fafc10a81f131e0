//! What a soak measured: operations, faults, quiet points (how long each took to converge, and
//! every divergence with its diff), the adapters' heap and metric checks; printed, and written
//! as JSON to `target/soak-report.json`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

/// One heap sample of one adapter.
#[derive(Clone, Debug)]
pub struct HeapSample {
    /// The quiet point's index.
    pub quiet: usize,
    /// The adapter's process (a SIGKILLed adapter comes back as another).
    pub pid: u32,
    /// `mcp_adapter_heap_bytes`.
    pub bytes: f64,
    /// Services in its registry then.
    pub services: usize,
}

/// One quiet point.
#[derive(Clone, Debug)]
pub struct Quiet {
    /// What it follows (`warm-up`, a fault's name, `final`).
    pub after: String,
    /// From the heal (or the driver's pause) to equal views; `None`: not within the bound.
    pub converged: Option<Duration>,
    /// The differences still there at the bound (empty when converged).
    pub diff: Vec<String>,
}

/// The whole run.
#[derive(Debug, Default)]
pub struct Report {
    /// Seed, rate asked, registries, ...: the configuration as given.
    pub config: Value,
    /// Startup (registries, adapters, istiod, Envoy), seconds.
    pub startup_secs: f64,
    /// Time spent driving (operations issued), seconds.
    pub driving_secs: f64,
    /// Wall time of the whole run, seconds.
    pub wall_secs: f64,
    /// Operations by registry and kind.
    pub ops: BTreeMap<(String, String), u64>,
    /// Faults by kind and registry.
    pub faults: BTreeMap<(String, String), u64>,
    /// Every quiet point, in order.
    pub quiet: Vec<Quiet>,
    /// Heap samples by adapter (registry name).
    pub heap: BTreeMap<String, Vec<HeapSample>>,
    /// Metric checks that failed (each says which adapter, metric and when).
    pub metric_failures: Vec<String>,
    /// Where a registry's truth differed from what the driver wrote (not the adapters' fault:
    /// a registry that lost writes, or a driver bug), at converged quiet points.
    pub registry_mismatches: Vec<String>,
    /// Heap verdicts per adapter.
    pub heap_verdicts: BTreeMap<String, String>,
    /// Heap checks that failed.
    pub heap_failures: Vec<String>,
}

impl Report {
    /// Counts one operation.
    pub fn op(&mut self, registry: &str, kind: &str) {
        *self
            .ops
            .entry((registry.to_string(), kind.to_string()))
            .or_default() += 1;
    }

    /// Counts one fault.
    pub fn fault(&mut self, kind: &str, registry: &str) {
        *self
            .faults
            .entry((kind.to_string(), registry.to_string()))
            .or_default() += 1;
    }

    /// Quiet points that did not converge within the bound.
    pub fn divergences(&self) -> Vec<&Quiet> {
        self.quiet
            .iter()
            .filter(|q| q.converged.is_none())
            .collect()
    }

    /// Total operations.
    pub fn total_ops(&self) -> u64 {
        self.ops.values().sum()
    }

    /// Checks each adapter's heap: the last sample against a baseline after warm-up (quiet
    /// point 1 on) of the same process, within `factor` times plus `slack` bytes. The
    /// baseline is, of the first half of that process' samples, the one whose population is
    /// nearest the last's (the earliest of equals): like against like.
    pub fn check_heap(&mut self, factor: f64, slack: f64) {
        for (name, samples) in &self.heap {
            let Some(last) = samples.last() else { continue };
            let same: Vec<&HeapSample> = samples
                .iter()
                .filter(|s| s.pid == last.pid && s.quiet >= 1 && s.quiet < last.quiet)
                .collect();
            let early = &same[..same.len().div_ceil(2)];
            let baseline = early
                .iter()
                .min_by_key(|s| (s.services.abs_diff(last.services), s.quiet));
            let Some(first) = baseline else {
                self.heap_verdicts.insert(
                    name.clone(),
                    format!(
                        "not judged: its process (restarted) has one sample after warm-up ({:.0} bytes)",
                        last.bytes
                    ),
                );
                continue;
            };
            let limit = first.bytes * factor + slack;
            let verdict = format!(
                "first {:.0} B ({} services, quiet point {}), last {:.0} B ({} services, quiet point {}), limit {:.0} B",
                first.bytes, first.services, first.quiet, last.bytes, last.services, last.quiet, limit
            );
            if last.bytes > limit {
                self.heap_failures
                    .push(format!("{name}: heap grew: {verdict}"));
            }
            self.heap_verdicts.insert(name.clone(), verdict);
        }
    }

    /// The report as JSON.
    pub fn json(&self) -> Value {
        let mut times: Vec<f64> = self
            .quiet
            .iter()
            .filter_map(|q| q.converged.map(|d| d.as_secs_f64()))
            .collect();
        times.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            times
                .get(((times.len() as f64 - 1.0) * p).round() as usize)
                .copied()
        };
        let ops: BTreeMap<String, BTreeMap<String, u64>> =
            self.ops
                .iter()
                .fold(BTreeMap::new(), |mut m, ((reg, kind), n)| {
                    m.entry(reg.clone()).or_default().insert(kind.clone(), *n);
                    m
                });
        let faults: BTreeMap<String, BTreeMap<String, u64>> =
            self.faults
                .iter()
                .fold(BTreeMap::new(), |mut m, ((kind, reg), n)| {
                    m.entry(kind.clone()).or_default().insert(reg.clone(), *n);
                    m
                });
        let heap: BTreeMap<String, Value> = self
            .heap
            .iter()
            .map(|(name, s)| {
                let first = s.first().map(|x| x.bytes);
                let last = s.last().map(|x| x.bytes);
                (
                    name.clone(),
                    json!({
                        "first_bytes": first, "last_bytes": last,
                        "samples": s.iter().map(|x| json!([x.quiet, x.pid, x.bytes, x.services])).collect::<Vec<_>>(),
                        "verdict": self.heap_verdicts.get(name),
                    }),
                )
            })
            .collect();
        json!({
            "config": self.config,
            "startup_secs": self.startup_secs,
            "driving_secs": self.driving_secs,
            "wall_secs": self.wall_secs,
            "ops_total": self.total_ops(),
            "rate_achieved": self.total_ops() as f64 / self.driving_secs.max(1e-9),
            "ops": ops,
            "faults": faults,
            "quiet_points": self.quiet.len(),
            "convergence_secs": {"max": times.last(), "p50": pct(0.5), "all": self.quiet.iter().map(|q| json!({
                "after": q.after, "secs": q.converged.map(|d| d.as_secs_f64()),
            })).collect::<Vec<_>>()},
            "divergences": self.divergences().iter().map(|q| json!({"after": q.after, "diff": q.diff})).collect::<Vec<_>>(),
            "divergence_count": self.divergences().len(),
            "heap": heap,
            "heap_failures": self.heap_failures,
            "metric_failures": self.metric_failures,
            "registry_mismatches": self.registry_mismatches,
        })
    }

    /// Prints the report and writes it to `target/soak-report.json`; the path.
    pub fn write(&self) -> std::path::PathBuf {
        let text = serde_json::to_string_pretty(&self.json()).unwrap_or_default();
        eprintln!("soak report:\n{text}");
        let path = crate::target_dir()
            .parent()
            .map(|t| t.join("soak-report.json"))
            .unwrap_or_else(|| "soak-report.json".into());
        if let Err(e) = std::fs::write(&path, &text) {
            eprintln!("could not write {}: {e}", path.display());
        }
        path
    }
}

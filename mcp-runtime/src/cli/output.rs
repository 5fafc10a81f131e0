//! `--output` and the Kubernetes output's flags: where the served set goes besides (or instead
//! of) the MCP ports.

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;
use mcp_kube_output::OutputConfig;

/// Where the served set goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Served over MCP on `--listen` (istiod's `configSources`): sidecars and gateways.
    #[default]
    Mcp,
    /// Written as ServiceEntry objects into a Kubernetes cluster, no MCP port: what Istio
    /// ambient (ztunnel, waypoints) needs, since istiod's ambient index reads only Kubernetes.
    Kube,
    /// Both: MCP for istiod's config sources and the objects for ambient.
    Both,
}

impl Output {
    /// The MCP ports are opened.
    pub fn mcp(self) -> bool {
        matches!(self, Output::Mcp | Output::Both)
    }

    /// ServiceEntry objects are written.
    pub fn kube(self) -> bool {
        matches!(self, Output::Kube | Output::Both)
    }
}

/// Flags of the Kubernetes output (used with `--output kube|both`).
#[derive(Clone, Debug, clap::Args)]
pub struct OutputArgs {
    /// Where the served set goes: `mcp`, `kube` (ServiceEntry objects, for ambient) or `both`.
    #[arg(long, env = "MCP_OUTPUT", value_enum, default_value_t = Output::Mcp)]
    pub output: Output,

    /// Kubeconfig of the cluster the output writes to (default: the files `KUBECONFIG` lists,
    /// then `~/.kube/config`, then the in-cluster service account).
    #[arg(long, env = "MCP_OUTPUT_KUBECONFIG")]
    pub output_kubeconfig: Option<PathBuf>,

    /// Kubeconfig context for the output (default: its current context).
    #[arg(long, env = "MCP_OUTPUT_CONTEXT")]
    pub output_context: Option<String>,

    /// The only namespaces the output lists and writes ServiceEntries in (comma-separated): a
    /// namespaced Role in each is then enough; a service translated into another namespace is
    /// not written and is reported. Default: any namespace (needs a ClusterRole).
    #[arg(long, env = "MCP_OUTPUT_NAMESPACES", value_delimiter = ',')]
    pub output_namespaces: Vec<String>,

    /// Namespace of the output's Lease (one writer among replicas). Default: the first of
    /// `--output-namespaces`, else the adapter's `--namespace`.
    #[arg(long, env = "MCP_OUTPUT_LEASE_NAMESPACE")]
    pub output_lease_namespace: Option<String>,

    /// This replica's name in the Lease (default: `POD_NAME`, else the host name, with the pid
    /// and a random suffix).
    #[arg(long, env = "MCP_OUTPUT_IDENTITY")]
    pub output_identity: Option<String>,

    /// Requests per second to the API server, on average (client-side limit; 0.01 to 100000).
    #[arg(long, env = "MCP_OUTPUT_QPS", default_value_t = 50.0, value_parser = rate)]
    pub output_qps: f64,

    /// Requests the output may send at once above `--output-qps`.
    #[arg(long, env = "MCP_OUTPUT_BURST", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub output_burst: u32,

    /// How often the leader re-lists its objects (metadata only) to repair hand edits and
    /// deletions, and to notice a conflicting object that went away (1s to 168h).
    #[arg(long, env = "MCP_OUTPUT_RESYNC", default_value = "5m", value_parser = resync)]
    pub output_resync: Duration,

    /// The fingerprint of the flags that decide what this adapter serves (set by
    /// `entry::run` from the whole command line; see `fingerprint`).
    #[arg(skip)]
    pub config_fingerprint: String,

    /// The same without the shard layout (`fingerprint::of_layout_free`): what the output
    /// writes on its objects.
    #[arg(skip)]
    pub objects_fingerprint: String,
}

/// A rate above zero.
impl OutputArgs {
    /// The output's settings.
    pub fn config(&self) -> OutputConfig {
        OutputConfig {
            kubeconfig: self.output_kubeconfig.clone(),
            context: self.output_context.clone(),
            namespaces: self.output_namespaces.clone(),
            lease_namespace: self.output_lease_namespace.clone(),
            identity: self.output_identity.clone(),
            qps: self.output_qps,
            burst: self.output_burst,
            resync: self.output_resync,
            fingerprint: self.config_fingerprint.clone(),
            objects_fingerprint: self.objects_fingerprint.clone(),
        }
    }
}

/// Fewest and most requests per second `--output-qps` takes: below the least, one request
/// waits for hours (and the wait no longer fits a timer); above the most, it is no limit.
const QPS_RANGE: (f64, f64) = (0.01, 100_000.0);

/// Shortest and longest `--output-resync`: 0 would list the API server in a loop; a resync past
/// a week repairs nothing in practice (and a far one overflows the clock).
const RESYNC_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600));

fn rate(s: &str) -> Result<f64, String> {
    let (least, most) = QPS_RANGE;
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| (least..=most).contains(v))
        .ok_or_else(|| format!("invalid rate {s:?}: a number from {least} to {most}"))
}

fn resync(s: &str) -> Result<Duration, String> {
    let (least, most) = RESYNC_RANGE;
    let d = parse::duration(s)?;
    if !(least..=most).contains(&d) {
        return Err(format!(
            "invalid interval {s:?}: from 1s to 168h (0 would list the API server in a loop)"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<OutputArgs, String> {
        crate::cli::parse_group(args)
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).expect("defaults").config();
        assert_eq!((c.qps, c.burst), (50.0, 100));
        assert_eq!(c.resync, Duration::from_secs(300));
    }

    #[test]
    fn a_resync_of_zero_or_past_a_week_is_refused() {
        for bad in ["0", "0s", "500ms", "169h", "100000000000000h"] {
            let e = parse(&["--output-resync", bad]).err().unwrap_or_default();
            assert!(
                e.contains("--output-resync") && e.contains("1s to 168h"),
                "{bad}: {e}"
            );
        }
        for good in ["1s", "30m", "168h"] {
            assert!(parse(&["--output-resync", good]).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_rate_that_would_overflow_the_wait_is_refused() {
        for bad in ["0", "-1", "1e-300", "0.001", "1e9", "inf", "NaN", "fast"] {
            let e = parse(&[&format!("--output-qps={bad}")])
                .err()
                .unwrap_or_default();
            assert!(
                e.contains("--output-qps") && e.contains("0.01 to 100000"),
                "{bad}: {e}"
            );
        }
        for good in ["0.01", "0.5", "50", "100000"] {
            assert!(parse(&["--output-qps", good]).is_ok(), "{good}");
        }
    }
}

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

    /// This replica's name in the Lease (default: `POD_NAME`, else the host name, with the pid).
    #[arg(long, env = "MCP_OUTPUT_IDENTITY")]
    pub output_identity: Option<String>,

    /// Requests per second to the API server, on average (client-side limit).
    #[arg(long, env = "MCP_OUTPUT_QPS", default_value_t = 50.0, value_parser = positive)]
    pub output_qps: f64,

    /// Requests the output may send at once above `--output-qps`.
    #[arg(long, env = "MCP_OUTPUT_BURST", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub output_burst: u32,

    /// How often the leader re-lists its objects (metadata only) to repair hand edits and
    /// deletions, and to notice a conflicting object that went away.
    #[arg(long, env = "MCP_OUTPUT_RESYNC", default_value = "5m", value_parser = parse::duration)]
    pub output_resync: Duration,
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
        }
    }
}

fn positive(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("invalid rate {s:?}: a number above 0"))
}

//! Command-line and environment settings of adapter-kube.
//!
//! Cluster access follows kubectl: `--kubeconfig` (or `KUBECONFIG`) and `--context`, else the
//! in-cluster service account. Credentials live in the kubeconfig or the mounted token, never in a
//! flag.

use std::path::PathBuf;
use std::time::Duration;

use mcp_core::parse;

/// How a headless Service (`clusterIP: None`) is served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Headless {
    /// Resolution NONE, no endpoints: the proxy passes traffic through to the address the client
    /// dialled (Galley's and Istio's own mapping).
    #[default]
    None,
    /// Resolution STATIC with the ready pod IPs as endpoints (load balancing and mTLS by the
    /// proxy; needs pod IPs routable from the mesh).
    Static,
}

/// Kubernetes connection and selection settings.
#[derive(Clone, Debug, clap::Args)]
pub struct KubeConfig {
    /// Kubeconfig file (default: the files `KUBECONFIG` lists, then `~/.kube/config`, then the
    /// in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use (default: its current context).
    #[arg(long, env = "MCP_KUBE_CONTEXT")]
    pub context: Option<String>,

    /// Only these namespaces (comma-separated or repeated); each is watched on its own, so a
    /// namespaced Role in each is enough. Default: all namespaces (needs a ClusterRole).
    #[arg(
        long = "namespaces",
        env = "MCP_KUBE_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// Only Services matching this label selector (`app=web,tier!=db`), as kubectl's `-l`.
    #[arg(long, env = "MCP_KUBE_LABEL_SELECTOR")]
    pub label_selector: Option<String>,

    /// DNS domain of the watched cluster: hosts are `<service>.<namespace>.svc.<domain>`.
    #[arg(long, env = "MCP_KUBE_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,

    /// Leave the ClusterIP out of `addresses` (the mesh cannot reach the remote cluster's
    /// service network, or two clusters reuse one range).
    #[arg(long, env = "MCP_KUBE_NO_CLUSTER_IP")]
    pub no_cluster_ip: bool,

    /// How headless Services are served.
    #[arg(long, env = "MCP_KUBE_HEADLESS", value_enum, default_value_t = Headless::None)]
    pub headless: Headless,

    /// Network name set on every endpoint (Istio multi-network: the network of the watched
    /// cluster).
    #[arg(long, env = "MCP_KUBE_NETWORK")]
    pub network: Option<String>,

    /// Read Nodes for the region and subzone of each endpoint's locality (needs get, list and
    /// watch on nodes; the zone comes from the EndpointSlice either way).
    #[arg(long, env = "MCP_KUBE_READ_NODES")]
    pub read_nodes: bool,

    /// Read Pods for endpoint labels (DestinationRule subsets) and the service account of each
    /// endpoint (subjectAltNames; needs get, list and watch on pods).
    #[arg(long, env = "MCP_KUBE_READ_PODS")]
    pub read_pods: bool,

    /// How long one watch request lasts before it is renewed from its last resource version
    /// (the API server ends it then; kube-runtime's default).
    #[arg(long, env = "MCP_KUBE_WATCH_TIMEOUT", default_value = "290s", value_parser = parse::duration)]
    pub watch_timeout: Duration,

    /// Trust domain of the watched cluster's workload identities, for subjectAltNames
    /// (`spiffe://<domain>/ns/<ns>/sa/<sa>`), with `--read-pods`.
    #[arg(long, env = "MCP_KUBE_TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
}

/// What `main` runs: these flags build a [`KubeRegistry`](crate::registry::KubeRegistry).
impl mcp_runtime::entry::AdapterConfig for KubeConfig {
    type Registry = crate::registry::KubeRegistry;
    type Error = crate::client::ClientError;
    const NAME: &'static str = env!("CARGO_PKG_NAME");
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const ABOUT: &'static str =
        "Serves Kubernetes Services and EndpointSlices as Istio ServiceEntries over MCP.";

    async fn registry(self) -> Result<Self::Registry, Self::Error> {
        crate::registry::KubeRegistry::connect(&self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        kube: KubeConfig,
    }

    #[test]
    fn namespaces_split_and_defaults() {
        let a = Args::try_parse_from(["x", "--namespaces", "shop,pay", "--headless", "static"])
            .expect("parse");
        assert_eq!(a.kube.namespaces, vec!["shop", "pay"]);
        assert_eq!(a.kube.headless, Headless::Static);
        assert_eq!(a.kube.cluster_domain, "cluster.local");
        assert!(!a.kube.no_cluster_ip && !a.kube.read_nodes && !a.kube.read_pods);
    }

    #[test]
    fn flags_are_consistent() {
        mcp_runtime::entry::command::<KubeConfig>().debug_assert();
    }
}

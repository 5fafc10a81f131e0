//! `adapter-kube`: serves a Kubernetes cluster's Services over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a re-list
// of a large cluster frees as much as it allocates.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use adapter_kube::{KubeConfig, KubeRegistry};
use clap::Parser;

/// Serves Kubernetes Services and EndpointSlices as Istio ServiceEntries over MCP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: mcp_core::CommonArgs,
    #[command(flatten)]
    kube: KubeConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let registry = KubeRegistry::connect(&args.kube).await?;
    mcp_core::runtime::run(registry, args.common).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        super::Args::command().debug_assert();
    }
}

//! `adapter-consul`: serves Consul services over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a re-list
// of a large registry frees as much as it allocates (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use adapter_consul::{ConsulConfig, ConsulRegistry};
use clap::Parser;

/// Serves Consul services as Istio ServiceEntries over MCP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: mcp_core::CommonArgs,
    #[command(flatten)]
    consul: ConsulConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let registry = ConsulRegistry::new(&args.consul)?;
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

//! `adapter-eureka`: serves Eureka applications over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a full
// fetch of a large registry frees as much as it allocates.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use adapter_eureka::{EurekaConfig, EurekaRegistry};
use clap::Parser;

/// Serves Eureka applications as Istio ServiceEntries over MCP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: mcp_core::CommonArgs,
    #[command(flatten)]
    eureka: EurekaConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let registry = EurekaRegistry::new(&args.eureka)?;
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

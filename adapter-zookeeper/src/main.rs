//! `adapter-zookeeper`: serves services registered in ZooKeeper over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a re-list
// of a large registry frees as much as it allocates (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use adapter_zookeeper::{ZookeeperConfig, ZookeeperRegistry};
use clap::Parser;

/// Serves Dubbo and Curator/Spring Cloud services registered in ZooKeeper as Istio
/// ServiceEntries over MCP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: mcp_core::CommonArgs,
    #[command(flatten)]
    zookeeper: ZookeeperConfig,
}

fn main() -> anyhow::Result<()> {
    // The ZooKeeper client logs every watch event at info; keep its warnings only unless the
    // user chose a filter. Set before any thread exists.
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "info,zookeeper_async=warn");
    }
    let args = Args::parse();
    let registry = ZookeeperRegistry::new(&args.zookeeper)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(mcp_core::runtime::run(registry, args.common))?;
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

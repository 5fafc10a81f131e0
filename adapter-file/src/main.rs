//! `adapter-file`: serves ServiceEntries from files over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a re-list
// of a large registry frees as much as it allocates (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use adapter_file::{FileConfig, FileRegistry};
use clap::Parser;

/// Serves Istio ServiceEntries from Istio YAML/JSON files and compact inventories over MCP.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: mcp_core::CommonArgs,
    #[command(flatten)]
    file: FileConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let registry = FileRegistry::new(args.file)?;
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

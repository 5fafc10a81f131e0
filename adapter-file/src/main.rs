//! `adapter-file`: serves ServiceEntries from files over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a re-list
// of a large registry frees as much as it allocates (see BENCHMARKS.md).
// Counted: `mcp_adapter_heap_bytes` tells a leak from memory the allocator keeps.
#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

fn main() -> anyhow::Result<()> {
    mcp_runtime::entry::run::<adapter_file::FileConfig>()?;
    Ok(())
}

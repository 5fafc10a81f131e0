//! `adapter-nacos`: serves Nacos services over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a
// subscription's push carries the service's whole instance list, freed once converted.
// Counted: `mcp_adapter_heap_bytes` tells a leak from memory the allocator keeps.
#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

fn main() -> anyhow::Result<()> {
    mcp_runtime::entry::run::<adapter_nacos::NacosConfig>()?;
    Ok(())
}

//! `adapter-nacos`: serves Nacos services over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a
// subscription's push carries the service's whole instance list, freed once converted.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    mcp_runtime::entry::run::<adapter_nacos::NacosConfig>()?;
    Ok(())
}

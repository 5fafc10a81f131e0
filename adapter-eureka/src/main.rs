//! `adapter-eureka`: serves Eureka applications over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a full
// fetch of a large registry frees as much as it allocates.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    mcp_runtime::entry::run::<adapter_eureka::EurekaConfig>()?;
    Ok(())
}

//! `adapter-kube`: serves a Kubernetes cluster's Services over MCP.

// mimalloc returns freed memory to the system and allocates faster than glibc's malloc: a re-list
// of a large cluster frees as much as it allocates.
// Counted: `mcp_adapter_heap_bytes` tells a leak from memory the allocator keeps.
#[global_allocator]
static GLOBAL: mcp_runtime::heap::Counted<mimalloc::MiMalloc> =
    mcp_runtime::heap::Counted(mimalloc::MiMalloc);

fn main() -> anyhow::Result<()> {
    mcp_runtime::entry::run::<adapter_kube::KubeConfig>()?;
    Ok(())
}

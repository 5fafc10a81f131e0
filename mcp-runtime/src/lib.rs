//! What every adapter binary links: the process around `mcp-core`'s data path.
//!
//! [`entry::run`] is an adapter's whole `main`: it parses the shared flags ([`cli`], with the
//! reusable groups in [`flags`]) and the adapter's own, builds its registry and calls
//! [`runtime::run`], which binds the ports, starts the writer task (registry -> index -> cache),
//! the gRPC server (`mcp-server`), the Kubernetes output (`mcp-kube-output`) and the [`admin`]
//! HTTP server, and runs until SIGTERM. Helpers the adapters share live here too: [`telemetry`]
//! (logs), [`http_client`] (TLS, body cap), [`secret`] (credentials re-read from their files),
//! [`heap`] (the counting allocator behind `mcp_adapter_heap_bytes`).
//!
//! The top of the stack: nothing in the workspace depends on it but the adapters, `mcpctl`'s
//! tests and the end-to-end tests. It must never depend on an adapter or a registry's client
//! library: all it knows of a registry is `mcp_core::Registry`. Feature `testing`:
//! `testing::test_args`, for tests only.

#![deny(missing_docs)]

pub mod admin;
pub mod cli;
pub mod entry;
pub mod fingerprint;
pub mod flags;
pub mod heap;
pub mod http_client;
pub mod runtime;
pub mod secret;
pub mod status;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cli::CommonArgs;

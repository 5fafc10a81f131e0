//! `mcpctl`: a small MCP sink for people and tests.
//!
//! MCP here is Istio's Mesh Configuration Protocol: a config source (such as the adapters of
//! this workspace) serves Istio ServiceEntries to istiod. `mcpctl` plays istiod's part, so one
//! can see exactly what a source serves without running Istio:
//!
//! * [`sink`] connects over MCP-over-xDS (`xds://`, state of the world), delta xDS (`delta://`)
//!   or legacy Istio 1.1-1.7 MCP (`mcp://`), ACKs every response and keeps the resulting state.
//!   Integration tests drive it response by response with [`sink::Sink::next`].
//! * [`render`] prints that state as Istio JSON/YAML or as a table.
//! * [`health`] asks an adapter's admin port whether it is ready (`mcpctl health`, the images'
//!   HEALTHCHECK).
//! * [`status`] reads what every sink of several adapters was sent and acknowledged
//!   (`mcpctl status`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), mcpctl::sink::SinkError> {
//! use mcpctl::sink::{Sink, SinkOptions};
//! let mut sink = Sink::connect(SinkOptions::new("xds://127.0.0.1:15010")).await?;
//! let update = sink.next().await?;
//! print!("{}", mcpctl::render::table(&update.state));
//! # Ok(())
//! # }
//! ```

pub mod health;
pub mod render;
pub mod sink;
pub mod status;

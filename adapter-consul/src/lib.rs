//! adapter-consul: Consul services as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`client`] the Consul HTTP API (over `mcp_runtime::http_client`,
//! with the token from `mcp_runtime::secret`), [`error`] why a request failed, [`convert`] the
//! mapping from Consul's health entries to the model, [`watch`] the blocking queries that signal
//! changes and [`registry`] the watcher that finds and fetches what changed.

pub mod client;
pub mod config;
pub mod convert;
pub mod error;
#[cfg(test)]
mod fake;
pub mod registry;
pub mod stats;
pub mod watch;

pub use config::ConsulConfig;
pub use registry::ConsulRegistry;

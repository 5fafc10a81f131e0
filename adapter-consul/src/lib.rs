//! adapter-consul: Consul services as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`client`] the Consul HTTP API, [`convert`] the mapping from
//! Consul's health entries to the model, and [`registry`] the blocking-query watcher.

pub mod client;
pub mod config;
pub mod convert;
pub mod registry;

pub use config::ConsulConfig;
pub use registry::ConsulRegistry;

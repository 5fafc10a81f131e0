//! adapter-eureka: Eureka applications as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`client`] Eureka's read API (JSON, basic auth, failover),
//! [`dto`] its JSON, [`state`] the local copy that deltas patch and the hashcode checks,
//! [`convert`] the mapping from one app to the model and [`registry`] the watch loop.

pub mod client;
pub mod config;
pub mod convert;
pub mod dto;
pub mod registry;
pub mod state;

pub use config::EurekaConfig;
pub use registry::EurekaRegistry;

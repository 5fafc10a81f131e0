//! adapter-zookeeper: Dubbo (interface and application level) and Curator / Spring Cloud
//! Zookeeper services registered in ZooKeeper, as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`convert`] the mapping from znodes to the model, and
//! [`registry`] the watcher (watches as hints, full re-list on every reconnect and periodically).

pub mod config;
pub mod convert;
pub mod registry;

pub use config::{Layout, ZookeeperConfig};
pub use registry::ZookeeperRegistry;

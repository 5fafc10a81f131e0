//! adapter-zookeeper: Dubbo (interface and application level) and Curator / Spring Cloud
//! Zookeeper services registered in ZooKeeper, as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`filter`] what they select, [`dto`] the URLs and JSON as
//! registries write them, [`convert`] the mapping from one directory's znodes to the model,
//! [`naming`] the names, [`assemble`] what needs the whole registry (name collisions, Dubbo 3
//! dual registration), [`client`] the ZooKeeper client and when to rebuild it, [`registry`] the
//! watcher (watches as hints, full re-list on every reconnect and periodically), [`reads`] its
//! ZooKeeper requests and [`model`] the registry as read (per directory) and what a change sends.

pub mod assemble;
pub mod client;
pub mod config;
pub mod convert;
pub mod dto;
pub mod filter;
mod model;
pub mod naming;
mod reads;
pub mod registry;

pub use config::{DubboDiscovery, Layout, ZookeeperConfig};
pub use registry::ZookeeperRegistry;

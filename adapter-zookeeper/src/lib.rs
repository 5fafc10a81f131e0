//! adapter-zookeeper: Dubbo (interface and application level) and Curator / Spring Cloud
//! Zookeeper services registered in ZooKeeper, as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`filter`] what they select, [`dto`] the URLs and JSON as
//! registries write them, [`convert`] the mapping from one directory's znodes to the model,
//! [`naming`] the names, [`assemble`] what needs the whole registry (name collisions, Dubbo 3
//! dual registration), [`client`] the ZooKeeper client and when to rebuild it. The watch:
//! [`registry`] its loop (watches as hints; after a reconnect every watch is armed again and
//! only what changed is read), [`session`] its passes and what they send, [`reads`] its reads
//! of ZooKeeper, [`requests`] one request (timeout, outcome, counts), [`watches`] the watches'
//! keys and the znodes' stamps, and [`model`] the registry as read (per directory) and what a
//! change sends.

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
mod requests;
mod session;
mod watches;

pub use config::{DubboDiscovery, Layout, ZookeeperConfig};
pub use registry::ZookeeperRegistry;

//! The data path of every MCP adapter, from registry events to versioned snapshots.
//!
//! A [`registry::Registry`] emits [`model::Service`] events -> [`index`] keeps what changed (with
//! [`vip`], [`shard`], [`filter`]) -> [`translate`] validates and builds ServiceEntries ->
//! [`cache`] encodes each version once into shared bytes and snapshots the set (and writes it to
//! the state file). What reads the snapshots (the MCP server, the Kubernetes output) and what
//! wires a process together (flags, admin, the writer task) live in the crates above this one.
//!
//! Must never depend on: tonic, hyper, kube, clap, an HTTP client, or any crate of this
//! workspace but `proto` (messages only, without its `grpc` feature). It does no network I/O.
//! Feature `testing`: a registry the test drives and model builders, for tests and benches only.

#![deny(missing_docs)]

pub mod cache;
pub mod clip;
pub mod filter;
pub mod index;
pub mod metrics;
pub mod model;
pub mod parse;
pub mod problems;
pub mod registry;
pub mod retry;
pub mod shard;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod translate;
pub mod vip;

pub use model::{
    CreationOrder, Endpoint, Host, LabelSet, Labels, Location, Port, Resolution, Service,
    ServiceKey, SharedStr,
};
pub use registry::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};
pub use translate::OnEmpty;

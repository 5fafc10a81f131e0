//! Registry-neutral core of the MCP adapters.
//!
//! Data path: a [`registry::Registry`] emits [`model::Service`] events -> [`index`] keeps what
//! changed -> [`translate`] validates and builds ServiceEntries -> [`cache`] encodes each version
//! once into shared bytes -> [`server`] streams them to every sink (MCP over xDS, delta xDS, legacy
//! MCP). [`runtime::run`] wires it together with the admin HTTP server.

#![deny(missing_docs)]

pub mod admin;
pub mod cache;
pub mod cli;
pub mod clip;
pub mod entry;
pub mod filter;
pub mod flags;
pub mod http_client;
pub mod index;
pub mod kube_output;
pub mod metrics;
pub mod model;
pub mod parse;
pub mod problems;
pub mod registry;
pub mod retry;
pub mod runtime;
pub mod secret;
pub mod server;
pub mod shard;
pub mod status;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod translate;
pub mod vip;

pub use cli::{CommonArgs, OnEmpty};
pub use model::{
    CreationOrder, Endpoint, Host, LabelSet, Labels, Location, Port, Resolution, Service,
    ServiceKey, SharedStr,
};
pub use registry::{channel_stream, EventSender, Registry, RegistryError, RegistryEvent};

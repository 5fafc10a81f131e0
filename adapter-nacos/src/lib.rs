//! adapter-nacos: Nacos services as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`http`] the Open API calls (login, namespaces, the service
//! catalog), [`wire`] the 2.x gRPC payloads, [`session`] one gRPC connection per Nacos
//! namespace (subscriptions and the server's pushes), [`dto`] Nacos' JSON, [`convert`] one
//! service's instances -> the model and [`registry`] the watch loop.

pub mod config;
pub mod convert;
pub mod dto;
pub mod http;
pub mod registry;
pub mod session;
pub mod stats;
pub mod wire;

pub use config::NacosConfig;
pub use registry::NacosRegistry;

//! adapter-nacos: Nacos services as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`http`] the HTTP calls (login, namespaces, service lists),
//! [`wire`] the 2.x gRPC payloads, [`session`] one gRPC connection per Nacos namespace
//! (subscriptions, service lists, the server's pushes left in an [`inbox`]), [`catalog`] how a
//! server's services are listed, [`dto`] Nacos' JSON, [`names`] each service's name,
//! [`convert`] one service's instances -> the model, [`grace`] the start-up grace after a
//! reconnect, [`registry`] the registry and [`watch`] one watch's loop.

pub mod catalog;
pub mod config;
pub mod convert;
pub mod dto;
pub mod grace;
pub mod http;
pub mod inbox;
pub mod names;
pub mod registry;
pub mod session;
pub mod stats;
mod watch;
pub mod wire;

pub use config::NacosConfig;
pub use registry::NacosRegistry;

//! adapter-kube: the Services of a Kubernetes cluster as Istio ServiceEntries.
//!
//! [`config`] holds the flags, [`client`] the connection and what API errors mean, [`compact`]
//! what is kept of each object, [`state`] the join of Services, EndpointSlices, nodes and pods,
//! [`protocol`] Istio's port-protocol rules, [`convert`] the mapping of one Service to the model,
//! [`outage`] the watchers that are retrying and [`registry`] the watch loop.

pub mod client;
pub mod compact;
pub mod config;
pub mod convert;
pub mod outage;
pub mod protocol;
pub mod registry;
pub mod state;

pub use config::KubeConfig;
pub use registry::KubeRegistry;

//! The only place that builds and validates ServiceEntries.
//!
//! A [`Service`] either becomes a [`Translated`] resource (possibly with [`Translated::warnings`] for
//! labels, endpoints or endpoint ports that were dropped) or is rejected with the
//! [`Invalid`] reasons, each naming the field. A rejected service is quarantined by the runtime;
//! it never stops the others.

pub mod istio_rules;
mod labels;
pub mod naming;
mod service_entry;
pub mod template;

use std::time::SystemTime;

use proto::istio::networking::v1alpha3::{ServiceEntry, WorkloadEntry};

use crate::model::{Endpoint, Labels, SharedStr};
use crate::vip::VipCidr;

pub use labels::label_safe;
pub use service_entry::translate;

/// Label naming the registry type of every generated resource.
pub const LABEL_REGISTRY: &str = "mcp-adapter/registry";
/// Label naming the source (adapter instance) of every generated resource.
pub const LABEL_SOURCE: &str = "mcp-adapter/source";

/// Settings that shape every ServiceEntry of one adapter.
#[derive(Clone, Debug)]
pub struct TranslateConfig {
    /// Namespace for keys without one.
    pub namespace: String,
    /// Appended to relative hosts (empty = nothing).
    pub host_suffix: String,
    /// exportTo for services that set none.
    pub export_to: Vec<String>,
    /// Registry type (`consul`).
    pub registry: String,
    /// Source name (defaults to the registry type).
    pub source: String,
    /// What to do with a service that has no instances.
    pub on_empty: OnEmpty,
    /// Where virtual IPs for TCP services without an address come from.
    pub vip_cidr: VipCidr,
    /// Most labels kept per endpoint and per resource (`--max-labels`): registries turn free-form
    /// metadata into labels, and every label of every endpoint is held by istiod and sent to
    /// every proxy.
    pub max_labels: usize,
    /// Host, name, port-name and endpoint-label controls (`template.rs`); the default changes
    /// nothing.
    pub naming: template::Naming,
}

/// What happens to a service whose registry lists no instance of it (every instance gone, or
/// none healthy). `--on-empty`; its values are [`OnEmpty::ALL`], spelled by [`OnEmpty::as_str`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnEmpty {
    /// Keep its ServiceEntry with no endpoints: the host stays known to the mesh, so clients get
    /// a fast "no healthy upstream" (503) instead of a DNS failure or a fall-through to
    /// passthrough, and routing rules that name it stay valid while it scales through zero.
    #[default]
    Keep,
    /// Remove its ServiceEntry until an instance is back.
    Remove,
}

impl OnEmpty {
    /// Every value.
    pub const ALL: [OnEmpty; 2] = [OnEmpty::Keep, OnEmpty::Remove];

    /// Its flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnEmpty::Keep => "keep",
            OnEmpty::Remove => "remove",
        }
    }
}

/// Default of `--max-labels`.
pub const DEFAULT_MAX_LABELS: usize = 64;

/// Settings for unit tests: namespace `ns`, suffix `example`.
#[cfg(any(test, feature = "testing"))]
pub fn test_config(on_empty: OnEmpty, vip_cidr: VipCidr) -> TranslateConfig {
    TranslateConfig {
        namespace: "ns".into(),
        host_suffix: "example".into(),
        export_to: vec![],
        registry: "test".into(),
        source: "test".into(),
        on_empty,
        vip_cidr,
        max_labels: DEFAULT_MAX_LABELS,
        naming: template::Naming::default(),
    }
}

/// A validated ServiceEntry with its MCP metadata, ready to encode.
#[derive(Clone, Debug, PartialEq)]
pub struct Translated {
    /// `namespace/name`.
    pub name: String,
    /// Creation time (the registry's, else the fixed [`FIXED_CREATE_TIME`]).
    pub create_time: SystemTime,
    /// Resource labels, including registry and source.
    pub labels: Labels,
    /// Resource annotations.
    pub annotations: Labels,
    /// The ServiceEntry body, except its endpoints: `translate` leaves `spec.endpoints` empty and
    /// puts them in [`Translated::endpoints`].
    pub spec: ServiceEntry,
    /// The endpoints, validated and in the order they are encoded. They stay in model form so
    /// that their shared label sets and strings are encoded where they are (`cache::encode`)
    /// instead of being copied into a protobuf map and strings per endpoint first.
    pub endpoints: Vec<Endpoint>,
    /// What was dropped to make it valid, one line each.
    pub warnings: Vec<(WarningKind, String)>,
}

impl Translated {
    /// The complete ServiceEntry as a protobuf message, endpoints included. Copies every
    /// endpoint: for tests and tools, not the serving path.
    pub fn service_entry(&self) -> ServiceEntry {
        let mut spec = self.spec.clone();
        spec.endpoints
            .extend(self.endpoints.iter().map(workload_entry));
        spec
    }
}

/// The WorkloadEntry a model endpoint encodes as.
fn workload_entry(ep: &Endpoint) -> WorkloadEntry {
    let text = |s: &Option<SharedStr>| s.as_deref().unwrap_or_default().to_string();
    WorkloadEntry {
        address: ep.address.clone(),
        ports: ep.ports.clone(),
        labels: ep.labels.to_labels(),
        network: text(&ep.network),
        locality: text(&ep.locality),
        weight: ep.weight.unwrap_or(0),
        service_account: text(&ep.service_account),
    }
}

/// What a translation warning dropped (the `kind` label of the warnings metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarningKind {
    /// An invalid label key or value.
    Label,
    /// An endpoint whose address does not fit the resolution.
    Endpoint,
    /// An endpoint port mapping naming no service port or out of range.
    EndpointPort,
    /// Labels over `--max-labels` on one endpoint or resource.
    LabelLimit,
}

impl WarningKind {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Label => "label",
            Self::Endpoint => "endpoint",
            Self::EndpointPort => "endpoint_port",
            Self::LabelLimit => "label_limit",
        }
    }
}

/// Creation time of resources whose registry has none: fixed, so every replica and restart agrees
/// (istiod orders conflicting hosts by creation time, then name).
pub const FIXED_CREATE_TIME: SystemTime = SystemTime::UNIX_EPOCH;

/// Why a service cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {}", .errors.join("; "))]
pub struct Invalid {
    /// Where the service came from.
    pub origin: String,
    /// One `field: problem` per error.
    pub errors: Vec<String>,
}

#[cfg(test)]
mod conformance_tests;

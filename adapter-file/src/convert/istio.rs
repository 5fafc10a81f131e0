//! Istio's ServiceEntry as it is written in YAML/JSON (`kubectl get -o yaml` output included):
//! mirror types that only check shape. [`super::service_entry`] converts them.

use std::collections::BTreeMap;

use mcp_core::model::{Endpoint, LabelSet, Labels, Location, Resolution};
use serde::Deserialize;
use yaml_serde::Value;

use super::de::nullable;

/// `apiVersion`s accepted for `kind: ServiceEntry` (the versions Istio serves).
pub const ISTIO_API_VERSIONS: [&str; 3] = [
    "networking.istio.io/v1",
    "networking.istio.io/v1beta1",
    "networking.istio.io/v1alpha3",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ServiceEntryDoc {
    #[allow(dead_code)] // checked before deserializing, kept so it is not an unknown field
    pub(super) api_version: String,
    #[allow(dead_code)]
    pub(super) kind: String,
    pub(super) metadata: Metadata,
    pub(super) spec: ServiceEntrySpec,
    /// Written by `kubectl get`; ignored.
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) status: Option<Value>,
}

/// Kubernetes object metadata. Unknown fields are allowed here (unlike in `spec`) because
/// `kubectl get -o yaml` writes many (`uid`, `resourceVersion`, `managedFields`) that mean
/// nothing to this adapter.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Metadata {
    pub(super) name: String,
    #[serde(default)]
    pub(super) namespace: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) labels: Labels,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) annotations: Labels,
    #[serde(default)]
    pub(super) creation_timestamp: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ServiceEntrySpec {
    pub(super) hosts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) addresses: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) ports: Vec<PortSpec>,
    #[serde(default)]
    pub(super) location: Option<LocationSpec>,
    #[serde(default)]
    pub(super) resolution: Option<ResolutionSpec>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) endpoints: Vec<EndpointSpec>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) export_to: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) subject_alt_names: Vec<String>,
    #[serde(default)]
    pub(super) workload_selector: Option<WorkloadSelector>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct PortSpec {
    pub(super) number: u32,
    #[serde(default)]
    pub(super) protocol: Option<String>,
    pub(super) name: String,
    #[serde(default)]
    pub(super) target_port: Option<u32>,
}

#[derive(Clone, Copy, Deserialize)]
pub(super) enum LocationSpec {
    #[serde(rename = "MESH_EXTERNAL")]
    External,
    #[serde(rename = "MESH_INTERNAL")]
    Internal,
}

impl From<LocationSpec> for Location {
    fn from(l: LocationSpec) -> Self {
        match l {
            LocationSpec::External => Location::External,
            LocationSpec::Internal => Location::Internal,
        }
    }
}

#[derive(Clone, Copy, Deserialize)]
pub(super) enum ResolutionSpec {
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "STATIC")]
    Static,
    #[serde(rename = "DNS")]
    Dns,
    #[serde(rename = "DNS_ROUND_ROBIN")]
    DnsRoundRobin,
}

impl From<ResolutionSpec> for Resolution {
    fn from(r: ResolutionSpec) -> Self {
        match r {
            ResolutionSpec::None => Resolution::None,
            ResolutionSpec::Static => Resolution::Static,
            ResolutionSpec::Dns => Resolution::Dns,
            ResolutionSpec::DnsRoundRobin => Resolution::DnsRoundRobin,
        }
    }
}

/// A WorkloadEntry inside a ServiceEntry, and an endpoint written as a mapping in an inventory
/// (the same shape, so one type: the two formats cannot drift apart). `address` is required
/// because the model has no address-less (network gateway only) endpoints.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct EndpointSpec {
    pub(super) address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) ports: BTreeMap<String, u32>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) labels: Labels,
    #[serde(default)]
    pub(super) network: Option<String>,
    #[serde(default)]
    pub(super) locality: Option<String>,
    #[serde(default)]
    pub(super) weight: Option<u32>,
    #[serde(default)]
    pub(super) service_account: Option<String>,
}

impl From<EndpointSpec> for Endpoint {
    fn from(e: EndpointSpec) -> Self {
        Endpoint {
            address: e.address,
            ports: e.ports,
            labels: LabelSet::from(e.labels),
            network: e.network.map(Into::into),
            locality: e.locality.map(Into::into),
            weight: e.weight,
            service_account: e.service_account.map(Into::into),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct WorkloadSelector {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) labels: Labels,
}

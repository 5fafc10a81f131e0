//! The compact inventory format (see README.md) as written in YAML/JSON: shape only.
//! [`super::inventory`] converts it.

use std::collections::BTreeMap;

use mcp_core::model::Labels;
use serde::Deserialize;
use yaml_serde::Value;

use super::de::nullable;
use super::istio::{LocationSpec, ResolutionSpec};

/// The only `apiVersion` accepted for `kind: Inventory` (it may also be left out).
pub const INVENTORY_API_VERSION: &str = "mcp-adapter/v1";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct InventoryDoc {
    #[serde(default)]
    pub(super) api_version: Option<String>,
    #[allow(dead_code)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) namespace: Option<String>,
    /// Kept as values so each service is deserialized on its own and errors can name it.
    #[serde(default, deserialize_with = "nullable")]
    pub(super) services: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct InventoryService {
    pub(super) name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) hosts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) addresses: Vec<String>,
    /// Name -> number; a map so that names are unique by construction.
    #[serde(default, deserialize_with = "nullable")]
    pub(super) ports: BTreeMap<String, u32>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) labels: Labels,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) annotations: Labels,
    #[serde(default)]
    pub(super) location: Option<LocationSpec>,
    #[serde(default)]
    pub(super) resolution: Option<ResolutionSpec>,
    /// Strings (`ip`, `ip:port`) or mappings (a ServiceEntry's endpoint,
    /// [`super::istio::EndpointSpec`]); dispatched by hand so errors keep their path.
    #[serde(default, deserialize_with = "nullable")]
    pub(super) endpoints: Vec<Value>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) export_to: Vec<String>,
}

//! Protocol-specific halves: request decoding and response layout for each RPC. The rules live
//! in [`super::engine`]; how a response becomes frames lives in [`super::frames`].
//!
//! A response is laid out as prost's encoding of the message's small fields (the `proto::responses`
//! types with the resources left empty) before and after the repeated resource field, which
//! [`Encoded`] writes around the cache's shared bytes.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use proto::istio::mcp::v1alpha1::{
    IncrementalMeshConfigRequest, MeshConfigRequest, RequestResources,
};
use proto::responses::{
    DeltaDiscoveryResponse, DiscoveryResponse, IncrementalMeshConfigResponse, MeshConfigResponse,
    Resources,
};

use super::engine::{Incremental, Names, Outgoing, Request};
use super::frames::{Encoded, Wrap};
use super::limits::LOGGED_TEXT_MAX;
use mcp_core::clip::clip;

/// Type URLs under which istiod asks for ServiceEntries over xDS (<= 1.23 v1alpha3, 1.24+ v1).
pub const SERVICE_ENTRY_TYPE_URLS: [&str; 3] = [
    "networking.istio.io/v1alpha3/ServiceEntry",
    "networking.istio.io/v1beta1/ServiceEntry",
    "networking.istio.io/v1/ServiceEntry",
];

/// Legacy MCP collection of ServiceEntries (Pilot 1.1-1.7).
pub const SERVICE_ENTRY_COLLECTION: &str = "istio/networking/v1alpha3/serviceentries";

fn xds_served(t: &str) -> bool {
    SERVICE_ENTRY_TYPE_URLS.contains(&t)
}

fn legacy_served(t: &str) -> bool {
    t == SERVICE_ENTRY_COLLECTION || xds_served(t)
}

// A NACK's detail and a node id are the sink's own texts, of any length: they are clipped where
// they are decoded, so that nothing kept or logged carries more than `LOGGED_TEXT_MAX` of them.

fn nack(status: Option<&proto::google::rpc::Status>) -> Option<String> {
    status.map(|s| format!("code {}: {}", s.code, clip(&s.message, LOGGED_TEXT_MAX)))
}

fn envoy_nack(status: Option<&envoy_types::pb::google::rpc::Status>) -> Option<String> {
    status.map(|s| format!("code {}: {}", s.code, clip(&s.message, LOGGED_TEXT_MAX)))
}

fn node_id(id: Option<&str>) -> Option<String> {
    id.map(|id| clip(id, LOGGED_TEXT_MAX).into_owned())
}

/// One RPC's message shapes.
pub trait Protocol: Send + 'static {
    /// Request message.
    type Req: prost::Message + Default + Send + 'static;
    /// Metric / log label.
    const PROTOCOL: &'static str;
    /// The gRPC method's HTTP/2 path.
    const PATH: &'static str;
    /// When responses are incremental.
    const INCREMENTAL: Incremental;
    /// Which type keys carry ServiceEntries.
    fn served(type_key: &str) -> bool;
    /// Decodes a request.
    fn request(req: Self::Req) -> Request;
    /// Node id of the sink, if the request names one, clipped to [`LOGGED_TEXT_MAX`] (its
    /// whole length is in [`Request::node_id_len`]).
    fn node(req: &Self::Req) -> Option<String>;
    /// Lays out a response.
    fn response(out: Outgoing) -> Encoded;
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources` (istiod 1.8+).
pub struct Xds;

impl Protocol for Xds {
    type Req = DiscoveryRequest;
    const PROTOCOL: &'static str = "xds";
    const PATH: &'static str =
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
    const INCREMENTAL: Incremental = Incremental::Never;
    fn served(t: &str) -> bool {
        xds_served(t)
    }
    fn request(r: DiscoveryRequest) -> Request {
        Request {
            node_id_len: r.node.as_ref().map_or(0, |n| n.id.len()),
            error: envoy_nack(r.error_detail.as_ref()),
            type_key: r.type_url,
            nonce: r.response_nonce,
            incremental: false,
            initial_versions: BTreeMap::new(),
            names: Names::Replace(r.resource_names),
        }
    }
    fn node(r: &DiscoveryRequest) -> Option<String> {
        node_id(r.node.as_ref().map(|n| n.id.as_str()))
    }
    fn response(o: Outgoing) -> Encoded {
        Encoded::new(
            DiscoveryResponse {
                version_info: o.version,
                ..Default::default()
            },
            o.resources,
            Wrap::Any { field: 2 },
            DiscoveryResponse {
                type_url: o.type_key,
                nonce: o.nonce,
                ..Default::default()
            },
        )
    }
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`.
pub struct Delta;

impl Protocol for Delta {
    type Req = DeltaDiscoveryRequest;
    const PROTOCOL: &'static str = "delta";
    const PATH: &'static str =
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
    const INCREMENTAL: Incremental = Incremental::Always;
    fn served(t: &str) -> bool {
        xds_served(t)
    }
    fn request(r: DeltaDiscoveryRequest) -> Request {
        Request {
            node_id_len: r.node.as_ref().map_or(0, |n| n.id.len()),
            error: envoy_nack(r.error_detail.as_ref()),
            type_key: r.type_url,
            nonce: r.response_nonce,
            incremental: true,
            initial_versions: r.initial_resource_versions.into_iter().collect(),
            names: Names::Delta {
                subscribe: r.resource_names_subscribe,
                unsubscribe: r.resource_names_unsubscribe,
            },
        }
    }
    fn node(r: &DeltaDiscoveryRequest) -> Option<String> {
        node_id(r.node.as_ref().map(|n| n.id.as_str()))
    }
    fn response(o: Outgoing) -> Encoded {
        Encoded::new(
            DeltaDiscoveryResponse {
                system_version_info: o.version,
                ..Default::default()
            },
            o.resources,
            Wrap::Delta { field: 2 },
            DeltaDiscoveryResponse {
                type_url: o.type_key,
                nonce: o.nonce,
                removed_resources: o.removed,
                ..Default::default()
            },
        )
    }
}

/// `istio.mcp.v1alpha1.ResourceSource/EstablishResourceStream` (Pilot 1.1-1.7).
pub struct Legacy;

impl Protocol for Legacy {
    type Req = RequestResources;
    const PROTOCOL: &'static str = "mcp";
    const PATH: &'static str = "/istio.mcp.v1alpha1.ResourceSource/EstablishResourceStream";
    const INCREMENTAL: Incremental = Incremental::IfRequested;
    fn served(t: &str) -> bool {
        t == SERVICE_ENTRY_COLLECTION
    }
    fn request(r: RequestResources) -> Request {
        Request {
            node_id_len: r.sink_node.as_ref().map_or(0, |n| n.id.len()),
            error: nack(r.error_detail.as_ref()),
            type_key: r.collection,
            nonce: r.response_nonce,
            incremental: r.incremental,
            initial_versions: r.initial_resource_versions,
            names: Names::Unchanged,
        }
    }
    fn node(r: &RequestResources) -> Option<String> {
        node_id(r.sink_node.as_ref().map(|n| n.id.as_str()))
    }
    fn response(o: Outgoing) -> Encoded {
        Encoded::new(
            Resources {
                system_version_info: o.version,
                collection: o.type_key,
                ..Default::default()
            },
            o.resources,
            Wrap::Raw { field: 3 },
            Resources {
                removed_resources: o.removed,
                nonce: o.nonce,
                incremental: o.incremental,
                ..Default::default()
            },
        )
    }
}

/// `istio.mcp.v1alpha1.AggregatedMeshConfigService/StreamAggregatedResources` (Pilot 1.1 legacy
/// mode: the collection travels in `type_url`).
pub struct MeshSotw;

impl Protocol for MeshSotw {
    type Req = MeshConfigRequest;
    const PROTOCOL: &'static str = "mcp-aggregated";
    const PATH: &'static str =
        "/istio.mcp.v1alpha1.AggregatedMeshConfigService/StreamAggregatedResources";
    const INCREMENTAL: Incremental = Incremental::Never;
    fn served(t: &str) -> bool {
        legacy_served(t)
    }
    fn request(r: MeshConfigRequest) -> Request {
        Request {
            node_id_len: r.sink_node.as_ref().map_or(0, |n| n.id.len()),
            error: nack(r.error_detail.as_ref()),
            type_key: r.type_url,
            nonce: r.response_nonce,
            incremental: false,
            initial_versions: BTreeMap::new(),
            names: Names::Unchanged,
        }
    }
    fn node(r: &MeshConfigRequest) -> Option<String> {
        node_id(r.sink_node.as_ref().map(|n| n.id.as_str()))
    }
    fn response(o: Outgoing) -> Encoded {
        Encoded::new(
            MeshConfigResponse {
                version_info: o.version,
                ..Default::default()
            },
            o.resources,
            Wrap::Raw { field: 2 },
            MeshConfigResponse {
                type_url: o.type_key,
                nonce: o.nonce,
                ..Default::default()
            },
        )
    }
}

/// `istio.mcp.v1alpha1.AggregatedMeshConfigService/IncrementalAggregatedResources`.
pub struct MeshIncremental;

impl Protocol for MeshIncremental {
    type Req = IncrementalMeshConfigRequest;
    const PROTOCOL: &'static str = "mcp-aggregated-incremental";
    const PATH: &'static str =
        "/istio.mcp.v1alpha1.AggregatedMeshConfigService/IncrementalAggregatedResources";
    const INCREMENTAL: Incremental = Incremental::Always;
    fn served(t: &str) -> bool {
        legacy_served(t)
    }
    fn request(r: IncrementalMeshConfigRequest) -> Request {
        Request {
            node_id_len: r.sink_node.as_ref().map_or(0, |n| n.id.len()),
            error: nack(r.error_detail.as_ref()),
            type_key: r.type_url,
            nonce: r.response_nonce,
            incremental: true,
            initial_versions: r.initial_resource_versions,
            names: Names::Unchanged,
        }
    }
    fn node(r: &IncrementalMeshConfigRequest) -> Option<String> {
        node_id(r.sink_node.as_ref().map(|n| n.id.as_str()))
    }
    fn response(o: Outgoing) -> Encoded {
        Encoded::new(
            IncrementalMeshConfigResponse {
                system_version_info: o.version,
                ..Default::default()
            },
            o.resources,
            Wrap::Raw { field: 2 },
            IncrementalMeshConfigResponse {
                removed_resources: o.removed,
                nonce: o.nonce,
                ..Default::default()
            },
        )
    }
}

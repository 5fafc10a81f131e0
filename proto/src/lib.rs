//! Protobufs for the Mesh Configuration Protocol (Istio MCP) and the ServiceEntry it carries.
//!
//! * [`istio::mcp::v1alpha1`]: `Metadata`, `Resource`, the legacy MCP messages, and gRPC clients.
//! * [`istio::networking::v1alpha3`]: `ServiceEntry`, `ServicePort`, `WorkloadEntry`, `WorkloadSelector`.
//! * [`google::rpc::Status`]: the NACK detail of the legacy services.
//! * [`responses`]: response messages that are byte-identical on the wire to the real ones but
//!   carry pre-encoded resources as shared [`bytes::Bytes`]. mcp-core lays its responses out with
//!   their small fields (the resources themselves it writes straight from its cache).
//! * `server`: generated gRPC server halves answering with [`responses`] messages. The adapters
//!   do not use them (mcp-server routes the RPCs itself, `mcp-server/src/grpc.rs`); they are
//!   the reference servers of the benches' floors and of mcpctl's network tests.
//!
//! The envoy xDS request types come from the `envoy-types` crate, re-exported as `envoy`.
//!
//! Feature `grpc` (off by default) adds what needs tonic: the gRPC clients, `server` and the
//! envoy types. Without it the crate is messages only (prost), so `mcp-core`, which encodes
//! ServiceEntries but serves nothing, builds without tonic.

#![allow(missing_docs, clippy::all, clippy::unwrap_used)]

/// Generated Istio packages.
pub mod istio {
    /// `istio.mcp.*`
    pub mod mcp {
        /// `istio.mcp.v1alpha1`
        pub mod v1alpha1 {
            include!(concat!(env!("OUT_DIR"), "/istio.mcp.v1alpha1.rs"));
        }
    }
    /// `istio.networking.*`
    pub mod networking {
        /// `istio.networking.v1alpha3`
        pub mod v1alpha3 {
            include!(concat!(env!("OUT_DIR"), "/istio.networking.v1alpha3.rs"));
        }
    }
}

/// Generated google packages.
pub mod google {
    /// `google.rpc`
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
    }
}

pub mod responses;

/// Generated server halves of the streaming services, answering with [`responses`] messages:
/// the benches' floor servers and mcpctl's test servers (not the adapters', see the crate docs).
#[cfg(feature = "grpc")]
pub mod server {
    /// `envoy.service.discovery.v3.AggregatedDiscoveryService` (SotW and delta).
    pub mod ads {
        include!(concat!(
            env!("OUT_DIR"),
            "/servers/envoy.service.discovery.v3.AggregatedDiscoveryService.rs"
        ));
    }
    /// `istio.mcp.v1alpha1.ResourceSource` (Pilot 1.1-1.7).
    pub mod resource_source {
        include!(concat!(
            env!("OUT_DIR"),
            "/servers/istio.mcp.v1alpha1.ResourceSource.rs"
        ));
    }
    /// `istio.mcp.v1alpha1.AggregatedMeshConfigService` (Pilot 1.0/1.1 legacy mode).
    pub mod mesh_config {
        include!(concat!(
            env!("OUT_DIR"),
            "/servers/istio.mcp.v1alpha1.AggregatedMeshConfigService.rs"
        ));
    }
}

/// Envoy xDS types (requests, and full responses for clients).
#[cfg(feature = "grpc")]
pub use envoy_types::pb::envoy;

/// Encoded `FileDescriptorSet` of the protos in this crate, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mcp_descriptor.bin"));

/// `Any.type_url` of an MCP resource inside an xDS response.
pub const MCP_RESOURCE_TYPE_URL: &str = "type.googleapis.com/istio.mcp.v1alpha1.Resource";
/// `Any.type_url` of a ServiceEntry body.
pub const SERVICE_ENTRY_TYPE_URL: &str =
    "type.googleapis.com/istio.networking.v1alpha3.ServiceEntry";

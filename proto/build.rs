//! Generates the Istio MCP / ServiceEntry / google.rpc messages and clients from `proto/`, and the
//! server halves of the four streaming services from hand-declared methods whose responses are the
//! shared-bytes wire views in `src/responses.rs` (so one encoded resource is never copied per sink).

use std::path::PathBuf;

use tonic_prost_build::manual::{Method, Service};

const PROTOS: [&str; 6] = [
    "proto/istio/mcp/v1alpha1/metadata.proto",
    "proto/istio/mcp/v1alpha1/resource.proto",
    "proto/istio/mcp/v1alpha1/mcp.proto",
    "proto/istio/networking/v1alpha3/workload_entry.proto",
    "proto/istio/networking/v1alpha3/service_entry.proto",
    "proto/google/rpc/status.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts are single-threaded here, so setting the variable races with nothing.
    std::env::set_var("PROTOC", protoc);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let wkt = protoc_bin_vendored::include_path()?;

    tonic_prost_build::configure()
        // Ordered maps: equal resources encode to equal bytes on every replica.
        .btree_map(".")
        .build_server(false)
        .build_client(true)
        // The clients need tonic: only with the `grpc` feature (the messages alone need prost).
        .client_mod_attribute(".", "#[cfg(feature = \"grpc\")]")
        .file_descriptor_set_path(out_dir.join("mcp_descriptor.bin"))
        .compile_protos(&PROTOS.map(PathBuf::from), &[PathBuf::from("proto"), wkt])?;

    let bidi = |name: &str, route: &str, input: &str, output: &str| {
        Method::builder()
            .name(name)
            .route_name(route)
            .input_type(input)
            .output_type(output)
            .codec_path("tonic_prost::ProstCodec")
            .client_streaming()
            .server_streaming()
            .build()
    };
    let services = [
        Service::builder()
            .name("AggregatedDiscoveryService")
            .package("envoy.service.discovery.v3")
            .method(bidi(
                "stream_aggregated_resources",
                "StreamAggregatedResources",
                "::envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest",
                "crate::responses::DiscoveryResponse",
            ))
            .method(bidi(
                "delta_aggregated_resources",
                "DeltaAggregatedResources",
                "::envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest",
                "crate::responses::DeltaDiscoveryResponse",
            ))
            .build(),
        Service::builder()
            .name("ResourceSource")
            .package("istio.mcp.v1alpha1")
            .method(bidi(
                "establish_resource_stream",
                "EstablishResourceStream",
                "crate::istio::mcp::v1alpha1::RequestResources",
                "crate::responses::Resources",
            ))
            .build(),
        Service::builder()
            .name("AggregatedMeshConfigService")
            .package("istio.mcp.v1alpha1")
            .method(bidi(
                "stream_aggregated_resources",
                "StreamAggregatedResources",
                "crate::istio::mcp::v1alpha1::MeshConfigRequest",
                "crate::responses::MeshConfigResponse",
            ))
            .method(bidi(
                "incremental_aggregated_resources",
                "IncrementalAggregatedResources",
                "crate::istio::mcp::v1alpha1::IncrementalMeshConfigRequest",
                "crate::responses::IncrementalMeshConfigResponse",
            ))
            .build(),
    ];
    let server_dir = out_dir.join("servers");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::manual::Builder::new()
        .build_client(false)
        .out_dir(&server_dir)
        .compile(&services);
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}

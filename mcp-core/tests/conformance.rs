//! Protocol conformance: the adapter as istiod, Pilot 1.x and other MCP sinks see it.
//!
//! Every test runs a whole adapter (`runtime::start`) over a [`FakeRegistry`] on 127.0.0.1:0 and
//! talks to it over gRPC and HTTP with timeouts.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::registry::{RegistryError, RegistryEvent};
use mcp_core::testing::{mk_service, test_args};
use mcp_core::{Service, ServiceKey};
use mcpctl::sink::{Sink, SinkOptions};
use proto::istio::mcp::v1alpha1::{IncrementalMeshConfigRequest, MeshConfigRequest};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const MESH_CONFIG: &str = "core/v1alpha1/MeshConfig";

type XdsStream = Raw<DiscoveryRequest, DiscoveryResponse>;

/// The gRPC health status of `service` (`""` = the server).
async fn health_of(h: &mut HealthClient<tonic::transport::Channel>, service: &str) -> i32 {
    tokio::time::timeout(
        STEP,
        h.check(HealthCheckRequest {
            service: service.into(),
        }),
    )
    .await
    .expect("health timed out")
    .expect("health answers")
    .into_inner()
    .status
}

/// Every type istiod 1.24+ asks a config source for (besides MeshConfig).
const PILOT_TYPES_V1: [&str; 14] = [
    "security.istio.io/v1/AuthorizationPolicy",
    "security.istio.io/v1/PeerAuthentication",
    "security.istio.io/v1/RequestAuthentication",
    "networking.istio.io/v1/DestinationRule",
    "networking.istio.io/v1/Gateway",
    SE_V1,
    "networking.istio.io/v1/Sidecar",
    "networking.istio.io/v1/VirtualService",
    "networking.istio.io/v1/WorkloadEntry",
    "networking.istio.io/v1/WorkloadGroup",
    "networking.istio.io/v1alpha3/EnvoyFilter",
    "networking.istio.io/v1beta1/ProxyConfig",
    "telemetry.istio.io/v1/Telemetry",
    "extensions.istio.io/v1alpha1/WasmPlugin",
];

/// The same for istiod <= 1.23 (v1alpha3 networking, v1beta1 security).
const PILOT_TYPES_V1ALPHA3: [&str; 14] = [
    "security.istio.io/v1beta1/AuthorizationPolicy",
    "security.istio.io/v1beta1/PeerAuthentication",
    "security.istio.io/v1beta1/RequestAuthentication",
    "networking.istio.io/v1alpha3/DestinationRule",
    "networking.istio.io/v1alpha3/Gateway",
    SE_V1ALPHA3,
    "networking.istio.io/v1alpha3/Sidecar",
    "networking.istio.io/v1alpha3/VirtualService",
    "networking.istio.io/v1alpha3/WorkloadEntry",
    "networking.istio.io/v1alpha3/WorkloadGroup",
    "networking.istio.io/v1alpha3/EnvoyFilter",
    "networking.istio.io/v1beta1/ProxyConfig",
    "telemetry.istio.io/v1alpha1/Telemetry",
    "extensions.istio.io/v1alpha1/WasmPlugin",
];

/// Pilot 1.7's collections over legacy MCP.
const LEGACY_COLLECTIONS: [&str; 14] = [
    "istio/networking/v1alpha3/destinationrules",
    "istio/networking/v1alpha3/envoyfilters",
    "istio/networking/v1alpha3/gateways",
    SE_COLLECTION,
    "istio/networking/v1alpha3/sidecars",
    "istio/networking/v1alpha3/virtualservices",
    "istio/networking/v1alpha3/workloadentries",
    "istio/security/v1beta1/authorizationpolicies",
    "istio/security/v1beta1/peerauthentications",
    "istio/security/v1beta1/requestauthentications",
    "istio/config/v1alpha2/httpapispecbindings",
    "istio/config/v1alpha2/httpapispecs",
    "istio/mixer/v1/config/client/quotaspecbindings",
    "istio/mixer/v1/config/client/quotaspecs",
];

fn reset(h: &mcp_core::testing::FakeHandle, services: Vec<Service>) {
    h.send(RegistryEvent::Reset(services));
}

fn timestamped_nonce(i: usize) -> String {
    format!("2024-05-30 08:08:05.{i:03} +0000 UTC m=+0.{i}")
}

/// A started adapter with `services` synced.
async fn synced(services: Vec<Service>) -> Adapter {
    let a = Adapter::start().await;
    reset(&a.handle, services);
    a.wait_readyz(200).await;
    a
}

/// istiod's pattern: MeshConfig with node and a made-up nonce, then every type, then ACKs.
async fn istiod_pattern(types: &[&str], se_type: &str) {
    let a = synced(vec![mk_service("a", 2), mk_service("b", 1)]).await;
    let mut s = a.xds().await;
    s.send(DiscoveryRequest {
        node: Some(istiod_node()),
        ..xds_req(MESH_CONFIG, &timestamped_nonce(0))
    });
    for (i, t) in types.iter().enumerate() {
        s.send(xds_req(t, &timestamped_nonce(i + 1)));
    }
    let mut got: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for _ in 0..=types.len() {
        let r = s.recv().await;
        got.entry(r.type_url.clone()).or_default().push(r);
    }
    let mut expected: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    expected.push(MESH_CONFIG.into());
    expected.sort();
    assert_eq!(
        got.keys().cloned().collect::<Vec<_>>(),
        expected,
        "one response per requested type, type_url echoed exactly"
    );
    for (t, rs) in &got {
        assert_eq!(rs.len(), 1, "exactly one response for {t}");
        let r = &rs[0];
        assert!(!r.nonce.is_empty(), "{t}: nonce set");
        if t == se_type {
            assert!(!r.version_info.is_empty(), "version_info set");
            let m = decode_xds(r);
            assert_eq!(names(&m), vec!["fake/a", "fake/b"]);
            assert_eq!(m["fake/a"].spec.hosts, vec!["a.fake.local"]);
            assert_eq!(m["fake/b"].spec.hosts, vec!["b.fake.local"]);
            assert_eq!(m["fake/a"].spec.endpoints.len(), 2);
            for d in m.values() {
                assert!(d.create_time.is_some(), "{}: create_time set", d.name);
                assert!(!d.version.is_empty(), "{}: version set", d.name);
            }
        } else {
            assert!(r.resources.is_empty(), "{t} must be empty: {r:?}");
        }
    }
    // Nonces are distinct.
    let nonces: std::collections::BTreeSet<_> =
        got.values().map(|rs| rs[0].nonce.clone()).collect();
    assert_eq!(nonces.len(), got.len(), "every response has its own nonce");
    for rs in got.values() {
        s.send(xds_ack(&rs[0]));
    }
    s.silent("everything ACKed, nothing changed").await;
    a.stop().await;
}

#[tokio::test]
async fn xds_istiod_1_24_request_pattern() {
    istiod_pattern(&PILOT_TYPES_V1, SE_V1).await;
}

#[tokio::test]
async fn xds_istiod_1_22_request_pattern_v1alpha3() {
    istiod_pattern(&PILOT_TYPES_V1ALPHA3, SE_V1ALPHA3).await;
}

#[tokio::test]
async fn xds_service_entry_v1beta1_is_served_too() {
    let mut types = PILOT_TYPES_V1.to_vec();
    types[5] = SE_V1BETA1;
    istiod_pattern(&types, SE_V1BETA1).await;
}

#[tokio::test]
async fn xds_all_three_spellings_carry_the_same_resources() {
    let a = synced(vec![mk_service("a", 1)]).await;
    let mut s = a.xds().await;
    let mut got = BTreeMap::new();
    for t in [SE_V1, SE_V1BETA1, SE_V1ALPHA3] {
        s.send(xds_req(t, ""));
        let r = s.recv().await;
        assert_eq!(r.type_url, t);
        got.insert(t, (r.version_info.clone(), r.resources.clone()));
    }
    let first = got[SE_V1].clone();
    for (t, v) in &got {
        assert_eq!(v, &first, "{t} differs from v1");
    }
    a.stop().await;
}

#[tokio::test]
async fn before_first_sync_only_unknown_types_are_answered() {
    let a = Adapter::start().await;
    let mut health = HealthClient::new(a.channel().await);
    let check = |h: &mut HealthClient<tonic::transport::Channel>| {
        let mut h = h.clone();
        async move {
            tokio::time::timeout(
                STEP,
                h.check(HealthCheckRequest {
                    service: String::new(),
                }),
            )
            .await
            .expect("health timed out")
            .expect("health answers")
            .into_inner()
            .status
        }
    };
    assert_eq!(check(&mut health).await, ServingStatus::NotServing as i32);
    let (code, body) = http_get(a.admin(), "/readyz").await;
    assert_eq!(code, 503, "{body}");

    let mut s = a.xds().await;
    s.send(DiscoveryRequest {
        node: Some(istiod_node()),
        ..xds_req(SE_V1, &timestamped_nonce(1))
    });
    s.send(xds_req(
        "networking.istio.io/v1/VirtualService",
        &timestamped_nonce(2),
    ));
    let r = s.recv().await;
    assert_eq!(r.type_url, "networking.istio.io/v1/VirtualService");
    assert!(r.resources.is_empty());
    s.send(xds_ack(&r));
    s.silent("no ServiceEntry answer before the first sync")
        .await;
    assert_eq!(check(&mut health).await, ServingStatus::NotServing as i32);
    assert_eq!(http_get(a.admin(), "/readyz").await.0, 503);

    reset(&a.handle, vec![mk_service("a", 1)]);
    let r = s.recv().await;
    assert_eq!(r.type_url, SE_V1);
    assert_eq!(names(&decode_xds(&r)), vec!["fake/a"]);
    a.wait_readyz(200).await;
    assert_eq!(check(&mut health).await, ServingStatus::Serving as i32);
    s.send(xds_ack(&r));
    s.silent("VirtualService is not answered again").await;
    a.stop().await;
}

#[tokio::test]
async fn before_first_sync_an_empty_registry_is_answered_once_synced() {
    let a = Adapter::start().await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    s.silent_for(Duration::from_millis(200), "not synced").await;
    reset(&a.handle, vec![]);
    let r = s.recv().await;
    assert_eq!(r.type_url, SE_V1);
    assert!(r.resources.is_empty());
    assert!(!r.version_info.is_empty());
    a.stop().await;
}

#[tokio::test]
async fn xds_update_flow_ack_stale_nack() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    let r1 = s.recv().await;
    assert_eq!(names(&decode_xds(&r1)), vec!["fake/a", "fake/b"]);
    s.send(xds_ack(&r1));

    // A change: full state, new version.
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 3)));
    let r2 = s.recv().await;
    assert_ne!(r2.version_info, r1.version_info);
    assert_ne!(r2.nonce, r1.nonce);
    let m2 = decode_xds(&r2);
    assert_eq!(names(&m2), vec!["fake/a", "fake/b"], "full state");
    assert_eq!(m2["fake/a"].spec.endpoints.len(), 3);
    assert_eq!(m2["fake/b"], decode_xds(&r1)["fake/b"]);
    s.send(xds_ack(&r2));

    // Removal: by omission.
    a.handle.send(RegistryEvent::Remove(ServiceKey::new("b")));
    let r3 = s.recv().await;
    assert_eq!(names(&decode_xds(&r3)), vec!["fake/a"]);
    assert_ne!(r3.version_info, r2.version_info);
    s.send(xds_ack(&r3));

    // A stale nonce: ignored.
    s.send(DiscoveryRequest {
        version_info: r1.version_info.clone(),
        ..xds_req(SE_V1, &r1.nonce)
    });
    s.send(xds_req(SE_V1, "no-such-nonce"));
    s.silent("stale nonces are ignored").await;

    // NACK: the rejected set is not sent again.
    a.handle.send(RegistryEvent::Upsert(mk_service("c", 1)));
    let r4 = s.recv().await;
    assert_eq!(names(&decode_xds(&r4)), vec!["fake/a", "fake/c"]);
    s.send(DiscoveryRequest {
        version_info: r3.version_info.clone(),
        error_detail: Some(envoy_types::pb::google::rpc::Status {
            code: 3,
            message: "rejected by test".into(),
            details: vec![],
        }),
        ..xds_req(SE_V1, &r4.nonce)
    });
    s.silent("a NACKed set is not resent").await;

    // A later change is sent.
    a.handle.send(RegistryEvent::Upsert(mk_service("d", 1)));
    let r5 = s.recv().await;
    assert_eq!(names(&decode_xds(&r5)), vec!["fake/a", "fake/c", "fake/d"]);
    assert_ne!(r5.version_info, r4.version_info);
    s.send(xds_ack(&r5));
    s.silent("ACKed").await;

    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            r#"mcp_adapter_nacks_total{protocol="xds",type="serviceentry",registry="fake"}"#
        ),
        Some(1.0),
        "{m}"
    );
    a.stop().await;
}

#[tokio::test]
async fn relist_without_change_sends_nothing() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 2)]).await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    let r1 = s.recv().await;
    s.send(xds_ack(&r1));
    s.silent_for(Duration::from_millis(100), "ACKed").await;
    let before = metric_sum(&a.metrics().await, "mcp_adapter_snapshots_total");
    assert_eq!(before, 1.0, "one initial snapshot");

    reset(&a.handle, vec![mk_service("b", 2), mk_service("a", 1)]);
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 1)));
    s.silent("an unchanged re-list is not a change").await;
    assert_eq!(
        metric_sum(&a.metrics().await, "mcp_adapter_snapshots_total"),
        before,
        "no new snapshot"
    );

    // The events above were processed: a real change right after them is the next response.
    a.handle.send(RegistryEvent::Upsert(mk_service("b", 3)));
    let r2 = s.recv().await;
    assert_eq!(decode_xds(&r2)["fake/b"].spec.endpoints.len(), 3);
    assert_eq!(
        decode_xds(&r2)["fake/a"],
        decode_xds(&r1)["fake/a"],
        "a unchanged"
    );
    a.stop().await;
}

#[tokio::test]
async fn reconnect_gets_the_same_state_and_version() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    let r1 = s.recv().await;
    s.send(xds_ack(&r1));
    drop(s);

    let mut s = a.xds().await;
    s.send(DiscoveryRequest {
        node: Some(istiod_node()),
        version_info: r1.version_info.clone(),
        ..xds_req(SE_V1, &timestamped_nonce(7))
    });
    let r2 = s.recv().await;
    assert_eq!(r2.version_info, r1.version_info);
    assert_eq!(r2.resources, r1.resources, "byte-identical resources");
    a.stop().await;
}

#[tokio::test]
async fn delta_xds_changes_removals_and_initial_versions() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;
    let mut s = a.delta().await;
    s.send(DeltaDiscoveryRequest {
        node: Some(istiod_node()),
        type_url: SE_V1.into(),
        ..Default::default()
    });
    let r1 = s.recv().await;
    assert_eq!(r1.type_url, SE_V1);
    assert!(r1.removed_resources.is_empty());
    assert!(!r1.system_version_info.is_empty());
    let mut versions = BTreeMap::new();
    for dr in &r1.resources {
        let d = decode_any(dr.resource.as_ref().expect("resource set"));
        assert_eq!(d.name, dr.name, "envelope name = metadata name");
        assert_eq!(d.version, dr.version, "envelope version = metadata version");
        versions.insert(dr.name.clone(), dr.version.clone());
    }
    assert_eq!(
        versions.keys().cloned().collect::<Vec<_>>(),
        vec!["fake/a", "fake/b"]
    );
    s.send(delta_ack(&r1));

    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r2 = s.recv().await;
    let sent: Vec<_> = r2.resources.iter().map(|r| r.name.clone()).collect();
    assert_eq!(sent, vec!["fake/a"], "only the changed resource");
    assert!(r2.removed_resources.is_empty());
    assert_ne!(r2.resources[0].version, versions["fake/a"]);
    let a_version = r2.resources[0].version.clone();
    s.send(delta_ack(&r2));

    a.handle.send(RegistryEvent::Remove(ServiceKey::new("b")));
    let r3 = s.recv().await;
    assert!(r3.resources.is_empty(), "{r3:?}");
    assert_eq!(r3.removed_resources, vec!["fake/b"]);
    s.send(delta_ack(&r3));
    s.silent("ACKed").await;
    drop(s);

    // A new stream telling what it holds: only differences are sent.
    a.handle.send(RegistryEvent::Upsert(mk_service("c", 1)));
    a.handle.send(RegistryEvent::Upsert(mk_service("d", 1)));
    a.wait_served(&["fake/a", "fake/c", "fake/d"]).await;
    let mut s = a.delta().await;
    s.send(DeltaDiscoveryRequest {
        node: Some(istiod_node()),
        type_url: SE_V1.into(),
        initial_resource_versions: [
            ("fake/a".to_string(), a_version),
            ("fake/c".to_string(), "0000000000000000".to_string()),
            ("fake/zzz".to_string(), "1".to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    });
    let r4 = s.recv().await;
    let mut sent: Vec<_> = r4.resources.iter().map(|r| r.name.clone()).collect();
    sent.sort();
    assert_eq!(sent, vec!["fake/c", "fake/d"], "a is up to date");
    assert_eq!(r4.removed_resources, vec!["fake/zzz"]);
    s.send(delta_ack(&r4));
    s.silent("ACKed").await;
    a.stop().await;
}

#[tokio::test]
async fn legacy_pilot_1_7_pattern() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;
    let mut s = a.legacy().await;
    for c in LEGACY_COLLECTIONS {
        s.send(legacy_req(c, "", false));
    }
    let mut got: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for _ in 0..LEGACY_COLLECTIONS.len() {
        let r = s.recv().await;
        got.entry(r.collection.clone()).or_default().push(r);
    }
    let mut expected: Vec<String> = LEGACY_COLLECTIONS.iter().map(|c| c.to_string()).collect();
    expected.sort();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), expected);
    for (c, rs) in &got {
        assert_eq!(rs.len(), 1, "one response for {c}");
        let r = &rs[0];
        assert!(!r.incremental, "{c}: not incremental");
        assert!(r.removed_resources.is_empty());
        if c == SE_COLLECTION {
            let m = decode_legacy(&r.resources);
            assert_eq!(names(&m), vec!["fake/a", "fake/b"]);
            assert_eq!(m["fake/a"].spec.hosts, vec!["a.fake.local"]);
            assert!(!r.system_version_info.is_empty());
        } else {
            assert!(r.resources.is_empty(), "{c} must be empty");
        }
    }
    for rs in got.values() {
        s.send(legacy_ack(&rs[0]));
    }
    s.silent("all ACKed").await;

    // A change: the full state again, not incremental.
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r = s.recv().await;
    assert_eq!(r.collection, SE_COLLECTION);
    assert!(!r.incremental);
    let m = decode_legacy(&r.resources);
    assert_eq!(names(&m), vec!["fake/a", "fake/b"]);
    assert_eq!(m["fake/a"].spec.endpoints.len(), 2);
    s.send(legacy_ack(&r));

    // Stale nonce: ignored.
    s.send(legacy_req(SE_COLLECTION, "stale-nonce", false));
    s.silent("stale nonce").await;

    // One response in flight: a second change waits for the ACK, then the newest state goes.
    a.handle.send(RegistryEvent::Upsert(mk_service("c", 1)));
    let first = s.recv().await;
    assert_eq!(
        names(&decode_legacy(&first.resources)),
        vec!["fake/a", "fake/b", "fake/c"]
    );
    a.handle.send(RegistryEvent::Upsert(mk_service("d", 1)));
    a.handle.send(RegistryEvent::Remove(ServiceKey::new("b")));
    s.silent("one response in flight per collection").await;
    s.send(legacy_ack(&first));
    let newest = s.recv().await;
    assert_eq!(
        names(&decode_legacy(&newest.resources)),
        vec!["fake/a", "fake/c", "fake/d"]
    );
    s.send(legacy_ack(&newest));
    s.silent("ACKed").await;
    a.stop().await;
}

#[tokio::test]
async fn legacy_incremental_when_requested() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;
    let mut s = a.legacy().await;
    s.send(legacy_req(SE_COLLECTION, "", true));
    s.send(legacy_req(
        "istio/networking/v1alpha3/virtualservices",
        "",
        true,
    ));
    let mut first = None;
    for _ in 0..2 {
        let r = s.recv().await;
        if r.collection == SE_COLLECTION {
            first = Some(r);
        } else {
            assert!(r.resources.is_empty());
            s.send(legacy_req(&r.collection, &r.nonce, true));
        }
    }
    let r1 = first.expect("serviceentries answered");
    assert!(!r1.incremental, "the first response is the full state");
    assert_eq!(
        names(&decode_legacy(&r1.resources)),
        vec!["fake/a", "fake/b"]
    );
    s.send(legacy_req(SE_COLLECTION, &r1.nonce, true));

    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r2 = s.recv().await;
    assert!(r2.incremental);
    assert_eq!(names(&decode_legacy(&r2.resources)), vec!["fake/a"]);
    assert!(r2.removed_resources.is_empty());
    s.send(legacy_req(SE_COLLECTION, &r2.nonce, true));

    a.handle.send(RegistryEvent::Remove(ServiceKey::new("b")));
    let r3 = s.recv().await;
    assert!(r3.incremental);
    assert!(r3.resources.is_empty());
    assert_eq!(r3.removed_resources, vec!["fake/b"]);
    s.send(legacy_req(SE_COLLECTION, &r3.nonce, true));

    s.send(legacy_req(SE_COLLECTION, &r1.nonce, true));
    s.silent("stale nonce").await;
    a.stop().await;
}

#[tokio::test]
async fn aggregated_mesh_config_service_sotw_and_incremental() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;

    let mut s = a.mesh_sotw().await;
    s.send(MeshConfigRequest {
        type_url: SE_COLLECTION.into(),
        ..Default::default()
    });
    let r1 = s.recv().await;
    assert_eq!(r1.type_url, SE_COLLECTION);
    assert_eq!(
        names(&decode_legacy(&r1.resources)),
        vec!["fake/a", "fake/b"]
    );
    s.send(MeshConfigRequest {
        type_url: SE_COLLECTION.into(),
        response_nonce: r1.nonce.clone(),
        version_info: r1.version_info.clone(),
        ..Default::default()
    });
    a.handle.send(RegistryEvent::Upsert(mk_service("c", 1)));
    let r2 = s.recv().await;
    assert_eq!(
        names(&decode_legacy(&r2.resources)),
        vec!["fake/a", "fake/b", "fake/c"],
        "full state"
    );
    assert_ne!(r2.version_info, r1.version_info);
    drop(s);

    let mut s = a.mesh_incremental().await;
    s.send(IncrementalMeshConfigRequest {
        type_url: SE_COLLECTION.into(),
        ..Default::default()
    });
    let r1 = s.recv().await;
    assert_eq!(
        names(&decode_legacy(&r1.resources)),
        vec!["fake/a", "fake/b", "fake/c"]
    );
    assert!(r1.removed_resources.is_empty());
    let ack = |nonce: &str| IncrementalMeshConfigRequest {
        type_url: SE_COLLECTION.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    s.send(ack(&r1.nonce));
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 3)));
    a.handle.send(RegistryEvent::Remove(ServiceKey::new("b")));
    // The two events may be published together or one after the other.
    let mut changed = Vec::new();
    let mut removed = Vec::new();
    while removed.is_empty() || changed.is_empty() {
        let r = s.recv().await;
        changed.extend(names(&decode_legacy(&r.resources)));
        removed.extend(r.removed_resources.clone());
        s.send(ack(&r.nonce));
    }
    assert_eq!(changed, vec!["fake/a"]);
    assert_eq!(removed, vec!["fake/b"]);
    a.stop().await;
}

#[tokio::test]
async fn quarantine_serves_only_valid_and_reports_the_invalid() {
    let mut bad = mk_service("bad", 1);
    bad.ports[0].name = "Not_Valid".into();
    let a = synced(vec![mk_service("good", 1), bad]).await;

    let mut sink = Sink::connect(SinkOptions::new(a.xds_url()))
        .await
        .expect("sink connects");
    let u = tokio::time::timeout(STEP, sink.next())
        .await
        .expect("timed out")
        .expect("update");
    assert_eq!(
        u.state.keys().cloned().collect::<Vec<_>>(),
        vec!["fake/good"]
    );

    let d = a.debug().await;
    let served: Vec<_> = d["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(served, vec!["fake/good"]);
    let q = d["quarantined"].as_array().expect("quarantined");
    assert_eq!(q.len(), 1, "{d}");
    assert_eq!(q[0]["key"], "bad");
    assert!(
        q[0]["reasons"].to_string().contains("spec.ports[0].name"),
        "{d}"
    );
    let m = a.metrics().await;
    assert_eq!(
        metric(&m, r#"mcp_adapter_quarantined_resources{registry="fake"}"#),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"mcp_adapter_resources{registry="fake"}"#),
        Some(1.0),
        "{m}"
    );
    a.stop().await;
}

#[tokio::test]
async fn registry_outage_keeps_serving_the_last_good_state() {
    let a = synced(vec![mk_service("a", 1)]).await;
    let mut sink = Sink::connect(SinkOptions::new(a.xds_url()))
        .await
        .expect("sink connects");
    let u = tokio::time::timeout(STEP, sink.next())
        .await
        .expect("timed out")
        .expect("update");
    assert_eq!(u.state.keys().cloned().collect::<Vec<_>>(), vec!["fake/a"]);

    a.handle
        .fail(RegistryError::Unavailable("connection refused".into()));
    // The registry is unhealthy, but the adapter stays ready: it has a state worth serving.
    let body = a.wait_http("/registryz", 503).await;
    assert!(body.contains("connection refused"), "{body}");
    let (code, body) = http_get(a.admin(), "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("last good state"), "{body}");
    assert!(body.contains("connection refused"), "{body}");
    let mut health = HealthClient::new(a.channel().await);
    assert_eq!(
        health_of(&mut health, "").await,
        ServingStatus::Serving as i32,
        "gRPC health agrees with /readyz"
    );
    assert_eq!(
        health_of(&mut health, "registry").await,
        ServingStatus::NotServing as i32
    );
    let d = a.debug().await;
    assert_eq!(d["healthy"], false, "{d}");
    assert_eq!(d["synced"], true, "{d}");
    assert_eq!(d["resources"].as_array().map(Vec::len), Some(1), "{d}");

    // The old sink is told nothing; a new one still gets the last state.
    assert!(sink
        .next_within(Duration::from_millis(300))
        .await
        .expect("stream ok")
        .is_none());
    let mut fresh = Sink::connect(SinkOptions::new(a.xds_url()))
        .await
        .expect("sink connects");
    let u2 = tokio::time::timeout(STEP, fresh.next())
        .await
        .expect("timed out")
        .expect("update");
    assert_eq!(u2.state, u.state);
    assert_eq!(u2.version_info, u.version_info);

    let m = a.metrics().await;
    assert_eq!(
        metric(&m, r#"mcp_adapter_registry_healthy{registry="fake"}"#),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"mcp_adapter_registry_errors_total{kind="unavailable",registry="fake"}"#
        ),
        Some(1.0),
        "{m}"
    );

    // The registry is back: a new Reset on the new watch.
    reset(&a.handle, vec![mk_service("a", 1)]);
    a.wait_http("/registryz", 200).await;
    assert_eq!(
        health_of(&mut health, "registry").await,
        ServingStatus::Serving as i32
    );
    let d = a.debug().await;
    assert_eq!(d["healthy"], true, "{d}");
    let m = a.metrics().await;
    assert_eq!(
        metric(&m, r#"mcp_adapter_registry_healthy{registry="fake"}"#),
        Some(1.0),
        "{m}"
    );
    assert!(
        fresh
            .next_within(Duration::from_millis(300))
            .await
            .expect("stream ok")
            .is_none(),
        "an identical re-list after the outage pushes nothing"
    );
    a.stop().await;
}

#[tokio::test]
async fn two_replicas_serve_identical_resources() {
    let mut services = vec![mk_service("a", 3), mk_service("b", 1)];
    services[0].create_time = Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let x = synced(services.clone()).await;
    services.reverse();
    let y = synced(services).await;
    let mut got = Vec::new();
    for a in [&x, &y] {
        let mut s = a.xds().await;
        s.send(xds_req(SE_V1, ""));
        got.push(s.recv().await);
    }
    assert_eq!(got[0].version_info, got[1].version_info);
    let (mx, my) = (decode_xds(&got[0]), decode_xds(&got[1]));
    assert_eq!(names(&mx), vec!["fake/a", "fake/b"]);
    assert_eq!(mx, my, "names, versions, create_time and bodies agree");
    assert_eq!(
        mx["fake/a"].create_time,
        Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0
        })
    );
    assert_eq!(got[0].resources, got[1].resources, "byte-identical");
    x.stop().await;
    y.stop().await;
}

#[tokio::test]
async fn coalescing_window_merges_a_burst() {
    let mut args = test_args();
    args.coalesce = Duration::from_millis(200);
    let a = Adapter::start_with(args).await;
    let keys = ["a", "b", "c", "d", "e"];
    reset(&a.handle, keys.iter().map(|k| mk_service(k, 1)).collect());
    a.wait_readyz(200).await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    let r1 = s.recv().await;
    let before = decode_xds(&r1);
    assert_eq!(before.len(), 5);
    s.send(xds_ack(&r1));
    s.silent_for(Duration::from_millis(300), "ACKed").await;

    for k in keys {
        a.handle.send(RegistryEvent::Upsert(mk_service(k, 2)));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r2 = s.recv().await;
    let after = decode_xds(&r2);
    for k in keys {
        let n = format!("fake/{k}");
        assert_ne!(after[&n].version, before[&n].version, "{n} changed");
        assert_eq!(after[&n].spec.endpoints.len(), 2);
    }
    s.send(xds_ack(&r2));
    s.silent("the whole burst was one push").await;
    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            r#"mcp_adapter_snapshots_total{reason="change",registry="fake"}"#
        ),
        Some(1.0),
        "{m}"
    );
    a.stop().await;
}

/// A change published while the stream is busy with requests for other types reaches the sink.
///
/// The stream's loop takes requests and snapshot changes from one `select!`; a request handler
/// that marked the newest snapshot as seen would silently drop it for every type the request does
/// not name (istiod would miss that change until the next one). To exercise that race on every
/// change, the sink keeps a closed loop of requests for another served type going (each ACK
/// changes its `resource_names`, so each is answered) plus a few stale requests for an unserved
/// type, while the registry changes. The loop is closed (one request in flight at a time), so the
/// server never falls behind a backlog: a change that does not arrive within [`STEP`] was lost,
/// not late. (An earlier version flooded an unbounded channel; on a loaded machine the backlog
/// grew faster than the server drained it and the ACKs queued behind it, so it failed by timing.)
#[tokio::test]
async fn changes_are_not_lost_while_other_requests_arrive() {
    let a = synced(vec![mk_service("a", 1)]).await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    s.send(xds_req(SE_V1ALPHA3, ""));
    s.send(xds_req("networking.istio.io/v1/VirtualService", ""));
    let mut wide = false;
    let mut rounds = 0usize;
    for _ in 0..3 {
        let r = s.recv().await;
        if r.type_url == SE_V1ALPHA3 {
            other_type_round(&s, &r, &mut wide);
            rounds += 1;
        } else {
            s.send(xds_ack(&r));
        }
    }
    for i in 2..42 {
        a.handle.send(RegistryEvent::Upsert(mk_service("a", i)));
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let r = match tokio::time::timeout_at(deadline, s.rx.message()).await {
                Ok(Ok(Some(r))) => r,
                Ok(other) => panic!("stream ended: {other:?}"),
                Err(_) => {
                    let d = a.debug().await;
                    panic!(
                        "change {i} was published (served version {}) but never sent to the \
                         sink ({rounds} requests for other types answered so far)",
                        d["version"]
                    );
                }
            };
            match r.type_url.as_str() {
                SE_V1ALPHA3 => {
                    other_type_round(&s, &r, &mut wide);
                    rounds += 1;
                }
                SE_V1 => {
                    assert_eq!(
                        decode_xds(&r)["fake/a"].spec.endpoints.len(),
                        i,
                        "change {i} delivered, in order"
                    );
                    s.send(xds_ack(&r));
                    break;
                }
                other => panic!("unexpected response for {other}"),
            }
        }
    }
    assert!(
        rounds >= 40,
        "requests for the other type kept arriving ({rounds} answered)"
    );
    a.stop().await;
}

/// One turn of the other type's closed loop: a few stale requests for an unserved type, then the
/// ACK of `r` with the other resource-name list (so the server answers it again).
fn other_type_round(s: &XdsStream, r: &DiscoveryResponse, wide: &mut bool) {
    for _ in 0..3 {
        s.send(xds_req("networking.istio.io/v1/VirtualService", "stale"));
    }
    *wide = !*wide;
    s.send(DiscoveryRequest {
        resource_names: if *wide {
            Vec::new()
        } else {
            vec!["fake/a".into()]
        },
        ..xds_ack(r)
    });
}

#[tokio::test]
async fn a_service_turning_invalid_keeps_its_last_good_version() {
    let a = synced(vec![mk_service("a", 1), mk_service("b", 1)]).await;
    let mut s = a.xds().await;
    s.send(xds_req(SE_V1, ""));
    let r1 = s.recv().await;
    s.send(xds_ack(&r1));

    let mut bad = mk_service("a", 5);
    bad.ports[0].name = "Not_Valid".into();
    a.handle.send(RegistryEvent::Upsert(bad));
    s.silent("the served set did not change").await;
    let d = a.debug().await;
    let q = d["quarantined"].as_array().expect("quarantined");
    assert_eq!(q.len(), 1, "{d}");
    assert_eq!(q[0]["key"], "a");
    assert_eq!(q[0]["serving_last_good"], true, "{d}");
    assert_eq!(d["resources"].as_array().map(Vec::len), Some(2), "{d}");

    // Valid again: served, and out of quarantine.
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r2 = s.recv().await;
    assert_eq!(decode_xds(&r2)["fake/a"].spec.endpoints.len(), 2);
    let d = a.debug().await;
    assert_eq!(d["quarantined"].as_array().map(Vec::len), Some(0), "{d}");
    a.stop().await;
}

/// Server reflection lists every MCP service (grpcurl and friends can talk to the adapter).
#[tokio::test]
async fn reflection_lists_the_mcp_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let a = synced(vec![mk_service("a", 1)]).await;
    let mut client = ServerReflectionClient::new(a.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .expect("reflection rpc")
        .into_inner();
    let resp = tokio::time::timeout(STEP, stream.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer: {resp:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "istio.mcp.v1alpha1.ResourceSource",
        "istio.mcp.v1alpha1.AggregatedMeshConfigService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    a.stop().await;
}

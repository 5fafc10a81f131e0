//! Protocol conformance: the adapter as istiod, Pilot 1.x and other MCP sinks see it.
//!
//! Every test runs a whole adapter (`runtime::start`) over a [`FakeRegistry`] on 127.0.0.1:0 and
//! talks to it over gRPC and HTTP with timeouts.
//!
//! What every protocol shares (the stream rules of `mcp_server::engine`) is written once
//! as a behaviour taking a [`Protocol`], and [`per_protocol!`] runs it as one test per protocol
//! (`<behaviour>::<protocol>`). The clients' request patterns are one function run per client;
//! what only one protocol or the core does is a test of its own.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, UNIX_EPOCH};

use common::sink::{Ask, Protocol, Update};
use common::*;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use mcp_core::registry::{RegistryError, RegistryEvent};
use mcp_core::testing::mk_service;
use mcp_core::{Service, ServiceKey};
use mcp_runtime::testing::test_args;
use mcpctl::sink::{Sink, SinkOptions, Update as SinkUpdate};
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

fn upsert(a: &Adapter, name: &str, endpoints: usize) {
    a.handle
        .send(RegistryEvent::Upsert(mk_service(name, endpoints)));
}

fn remove(a: &Adapter, name: &str) {
    a.handle.send(RegistryEvent::Remove(ServiceKey::new(name)));
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

// ---- per protocol ----------------------------------------------------------------------------

/// Runs each behaviour `fn b(Protocol)` once per protocol, as tests `b::sotw_v1`, `b::delta_v1`...
macro_rules! per_protocol {
    ($($behaviour:ident),+ $(,)?) => {$(
        mod $behaviour {
            use super::*;
            per_protocol!(@tests $behaviour:
                sotw_v1 => Protocol::Sotw(SE_V1),
                sotw_v1alpha3 => Protocol::Sotw(SE_V1ALPHA3),
                delta_v1 => Protocol::Delta(SE_V1),
                legacy => Protocol::Legacy { incremental: false },
                legacy_incremental => Protocol::Legacy { incremental: true },
                mesh_sotw => Protocol::MeshSotw,
                mesh_incremental => Protocol::MeshIncremental,
            );
        }
    )+};
    (@tests $behaviour:ident: $($name:ident => $protocol:expr),+ $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            super::$behaviour($protocol).await;
        }
    )+};
}

per_protocol!(
    nothing_is_sent_before_the_first_sync,
    changes_additions_and_removals,
    a_burst_ends_in_the_newest_state,
    stale_nonces_are_ignored,
    one_response_in_flight_then_the_newest,
    a_nack_is_not_sent_again,
    reconnecting_gets_the_same_state_and_version,
);

/// `u` answers ServiceEntries (where the protocol says what a response answers).
fn assert_topic(u: &Update, p: Protocol) {
    if let Some(t) = &u.topic {
        assert_eq!(t, p.topic(), "type_url / collection echoed exactly");
    }
}

/// `u` is the first response of a stream: the whole synced state of [`subscribed`].
fn assert_full_state(u: &Update, p: Protocol) {
    assert_topic(u, p);
    assert!(!u.nonce.is_empty(), "nonce set");
    assert!(!u.version.is_empty(), "version set");
    assert_eq!(u.names(), vec!["fake/a", "fake/b"], "full state first");
    assert!(u.removed.is_empty(), "{u:?}");
    assert_ne!(
        u.incremental,
        Some(true),
        "the first response is the full state"
    );
    assert_eq!(u.resources["fake/a"].spec.hosts, vec!["a.fake.local"]);
    assert_eq!(u.resources["fake/b"].spec.hosts, vec!["b.fake.local"]);
    assert_eq!(u.resources["fake/a"].spec.endpoints.len(), 2);
    for d in u.resources.values() {
        assert!(d.create_time.is_some(), "{}: create_time set", d.name);
        assert!(!d.version.is_empty(), "{}: version set", d.name);
    }
}

/// `u` follows a change after which `state` is served: all of it (SotW), or only `changed` and
/// `removed` (incremental).
fn assert_sent(u: &Update, p: Protocol, state: &[&str], changed: &[&str], removed: &[&str]) {
    assert_topic(u, p);
    if let Some(incremental) = u.incremental {
        assert_eq!(incremental, p.incremental(), "incremental flag");
    }
    if p.incremental() {
        assert_eq!(u.names(), changed, "only what changed");
        assert_eq!(u.removed, removed, "what was removed");
    } else {
        assert_eq!(u.names(), state, "full state");
        assert!(u.removed.is_empty(), "removal by omission: {u:?}");
    }
}

/// An adapter synced with `services`, and a sink of `p` that has received its first response and
/// ACKed it.
async fn acked(p: Protocol, services: Vec<Service>) -> (Adapter, common::sink::Sink, Update) {
    let a = synced(services).await;
    let mut s = a.sink(p).await;
    s.subscribe();
    let r = s.recv().await;
    s.ack(&r);
    (a, s, r)
}

/// [`acked`] with `a` (2 endpoints) and `b` (1); the first response was the full state.
async fn subscribed(p: Protocol) -> (Adapter, common::sink::Sink, Update) {
    let (a, s, r) = acked(p, vec![mk_service("a", 2), mk_service("b", 1)]).await;
    assert_full_state(&r, p);
    (a, s, r)
}

/// The next response, checked with [`assert_sent`].
async fn recv_sent(
    s: &mut common::sink::Sink,
    state: &[&str],
    changed: &[&str],
    removed: &[&str],
) -> Update {
    let u = s.recv().await;
    assert_sent(&u, s.protocol, state, changed, removed);
    u
}

/// The end of a behaviour: ACKs `last` (after which `state` is served), checks that nothing
/// more is sent, then that a later change is the next response and only that change (a response
/// that should not have been sent, come after the quiet window, would come first), and stops
/// the adapter.
async fn ack_last_and_stop(a: Adapter, mut s: common::sink::Sink, last: &Update, state: &[&str]) {
    s.ack(last);
    s.silent("ACKed").await;
    upsert(&a, "zz", 1);
    let mut after = state.to_vec();
    after.push("fake/zz");
    let r = recv_sent(&mut s, &after, &["fake/zz"], &[]).await;
    assert_ne!(r.version, last.version);
    a.stop().await;
}

/// Before the first registry sync only types we do not serve are answered (empty, once); then
/// the synced state, even an empty one, is.
async fn nothing_is_sent_before_the_first_sync(p: Protocol) {
    let a = Adapter::start().await;
    let mut s = a.sink(p).await;
    s.subscribe();
    if let Some(other) = p.unserved() {
        s.send(Ask {
            topic: other,
            ..Ask::default()
        });
        let r = s.recv().await;
        assert_eq!(r.topic.as_deref(), Some(other));
        assert!(r.resources.is_empty(), "{other} must be empty");
        s.ack(&r);
    }
    s.silent_for(Duration::from_millis(200), "not synced").await;
    reset(&a.handle, vec![]);
    let r = s.recv().await;
    assert_topic(&r, p);
    assert!(r.resources.is_empty());
    assert!(!r.version.is_empty());
    s.ack(&r);
    s.silent("the other type is not answered again").await;
    // A later change is the next response: the other type answered late would come first.
    upsert(&a, "a", 1);
    recv_sent(&mut s, &["fake/a"], &["fake/a"], &[]).await;
    a.stop().await;
}

/// A change, an addition and a removal: SotW sends the full state each time, incremental
/// protocols what changed and what was removed; every response has a new version and nonce.
async fn changes_additions_and_removals(p: Protocol) {
    let (a, mut s, r1) = subscribed(p).await;

    upsert(&a, "a", 3);
    let r2 = recv_sent(&mut s, &["fake/a", "fake/b"], &["fake/a"], &[]).await;
    assert_ne!(r2.version, r1.version);
    assert_ne!(r2.nonce, r1.nonce);
    assert_eq!(r2.resources["fake/a"].spec.endpoints.len(), 3);
    assert_ne!(
        r2.resources["fake/a"].version,
        r1.resources["fake/a"].version
    );
    if !p.incremental() {
        assert_eq!(
            r2.resources["fake/b"], r1.resources["fake/b"],
            "b unchanged"
        );
    }
    s.ack(&r2);

    upsert(&a, "c", 1);
    let r3 = recv_sent(&mut s, &["fake/a", "fake/b", "fake/c"], &["fake/c"], &[]).await;
    assert_ne!(r3.version, r2.version);
    s.ack(&r3);

    remove(&a, "b");
    let r4 = recv_sent(&mut s, &["fake/a", "fake/c"], &[], &["fake/b"]).await;
    assert_ne!(r4.version, r3.version);
    ack_last_and_stop(a, s, &r4, &["fake/a", "fake/c"]).await;
}

/// A change and a removal sent together (published together or one after the other) end in
/// the newest state; incremental protocols send each once.
async fn a_burst_ends_in_the_newest_state(p: Protocol) {
    let (a, mut s, r1) = subscribed(p).await;
    upsert(&a, "a", 3);
    remove(&a, "b");
    let mut held = r1.resources.clone();
    let mut changed = Vec::new();
    let mut removed = Vec::new();
    let newest = |held: &BTreeMap<String, Decoded>| {
        held.keys().eq(["fake/a"]) && held["fake/a"].spec.endpoints.len() == 3
    };
    while !newest(&held) {
        let r = s.recv().await;
        assert_topic(&r, p);
        r.apply(&mut held, p);
        changed.extend(r.names());
        removed.extend(r.removed.clone());
        s.ack(&r);
    }
    if p.incremental() {
        assert_eq!(changed, vec!["fake/a"]);
        assert_eq!(removed, vec!["fake/b"]);
    }
    a.stop().await;
}

/// A request answering an older response, or a nonce never sent, is ignored; the stream goes on.
async fn stale_nonces_are_ignored(p: Protocol) {
    let (a, mut s, r1) = subscribed(p).await;
    upsert(&a, "a", 3);
    let r2 = s.recv().await;
    s.ack(&r2);

    s.ack(&r1);
    s.send(Ask {
        topic: p.topic(),
        nonce: "no-such-nonce",
        ..Ask::default()
    });
    s.silent("stale nonces are ignored").await;

    // Still in step: the next change is sent.
    upsert(&a, "c", 1);
    recv_sent(&mut s, &["fake/a", "fake/b", "fake/c"], &["fake/c"], &[]).await;
    a.stop().await;
}

/// One response per type is in flight: changes wait for its ACK, then only the newest state
/// goes.
async fn one_response_in_flight_then_the_newest(p: Protocol) {
    let (a, mut s, _) = subscribed(p).await;
    upsert(&a, "c", 1);
    let first = recv_sent(&mut s, &["fake/a", "fake/b", "fake/c"], &["fake/c"], &[]).await;
    upsert(&a, "d", 1);
    remove(&a, "b");
    s.silent("one response in flight per type").await;
    s.ack(&first);
    let newest = recv_sent(
        &mut s,
        &["fake/a", "fake/c", "fake/d"],
        &["fake/d"],
        &["fake/b"],
    )
    .await;
    ack_last_and_stop(a, s, &newest, &["fake/a", "fake/c", "fake/d"]).await;
}

/// A NACKed set is not sent again (and is counted); the next change is, relative to what the
/// sink acknowledged.
async fn a_nack_is_not_sent_again(p: Protocol) {
    let (a, mut s, r1) = subscribed(p).await;
    upsert(&a, "c", 1);
    let r2 = recv_sent(&mut s, &["fake/a", "fake/b", "fake/c"], &["fake/c"], &[]).await;
    s.nack(&r2, &r1.version);
    s.silent("a NACKed set is not resent").await;

    upsert(&a, "d", 1);
    let state = ["fake/a", "fake/b", "fake/c", "fake/d"];
    let r3 = recv_sent(&mut s, &state, &["fake/c", "fake/d"], &[]).await;
    assert_ne!(r3.version, r2.version);
    let series = format!(
        r#"mcp_adapter_nacks_total{{protocol="{}",type="serviceentry",registry="fake"}}"#,
        p.label()
    );
    a.assert_metric(&series, Some(1.0)).await;
    ack_last_and_stop(a, s, &r3, &state).await;
}

/// A sink reconnecting as istiod does (its node, the version it holds, a made-up nonce) gets
/// the same state, version and bytes.
async fn reconnecting_gets_the_same_state_and_version(p: Protocol) {
    let (a, s, r1) = subscribed(p).await;
    drop(s);

    let mut s = a.sink(p).await;
    s.resubscribe(&r1, &timestamped_nonce(7));
    let r2 = s.recv().await;
    assert_full_state(&r2, p);
    assert_eq!(r2.version, r1.version);
    assert_eq!(r2.raw, r1.raw, "byte-identical resources");
    a.stop().await;
}

// ---- the clients' request patterns -----------------------------------------------------------

/// A client's first requests on one stream: istiod (xDS) asks for MeshConfig with its node and
/// a made-up nonce, then for every type with made-up nonces; Pilot 1.7 (legacy MCP) for every
/// collection. Each type gets exactly one response, only ServiceEntries carry resources, and
/// once everything is ACKed nothing more is sent.
async fn request_pattern(p: Protocol, types: &[&str]) {
    let a = synced(vec![mk_service("a", 2), mk_service("b", 1)]).await;
    let mut s = a.sink(p).await;
    let istiod = matches!(p, Protocol::Sotw(_));
    let mut expected: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    if istiod {
        s.send(Ask {
            topic: MESH_CONFIG,
            nonce: &timestamped_nonce(0),
            node: true,
            ..Ask::default()
        });
        expected.push(MESH_CONFIG.into());
    }
    for (i, t) in types.iter().enumerate() {
        let nonce = if istiod {
            timestamped_nonce(i + 1)
        } else {
            String::new()
        };
        s.send(Ask {
            topic: t,
            nonce: &nonce,
            ..Ask::default()
        });
    }
    let mut got: BTreeMap<String, Vec<Update>> = BTreeMap::new();
    for _ in 0..expected.len() {
        let r = s.recv().await;
        got.entry(r.topic.clone().unwrap_or_default())
            .or_default()
            .push(r);
    }
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
        assert_ne!(r.incremental, Some(true), "{t}: not incremental");
        assert!(r.removed.is_empty(), "{t}: nothing removed");
        if t == p.topic() {
            assert_full_state(r, p);
        } else {
            assert!(r.resources.is_empty(), "{t} must be empty: {r:?}");
        }
    }
    let nonces: BTreeSet<_> = got.values().map(|rs| rs[0].nonce.clone()).collect();
    assert_eq!(nonces.len(), got.len(), "every response has its own nonce");
    for rs in got.values() {
        s.ack(&rs[0]);
    }
    s.silent("everything ACKed, nothing changed").await;
    // A later change is the next response, of the served type alone: any type answered
    // again late would come first.
    upsert(&a, "c", 1);
    let r = s.recv().await;
    assert_eq!(r.topic.as_deref(), Some(p.topic()), "{r:?}");
    assert_eq!(r.names(), vec!["fake/a", "fake/b", "fake/c"]);
    a.stop().await;
}

#[tokio::test]
async fn xds_istiod_1_24_request_pattern() {
    request_pattern(Protocol::Sotw(SE_V1), &PILOT_TYPES_V1).await;
}

#[tokio::test]
async fn xds_istiod_1_22_request_pattern_v1alpha3() {
    request_pattern(Protocol::Sotw(SE_V1ALPHA3), &PILOT_TYPES_V1ALPHA3).await;
}

#[tokio::test]
async fn xds_service_entry_v1beta1_is_served_too() {
    let mut types = PILOT_TYPES_V1.to_vec();
    types[5] = SE_V1BETA1;
    request_pattern(Protocol::Sotw(SE_V1BETA1), &types).await;
}

#[tokio::test]
async fn legacy_pilot_1_7_pattern() {
    request_pattern(Protocol::Legacy { incremental: false }, &LEGACY_COLLECTIONS).await;
}

// ---- one protocol, or the core ---------------------------------------------------------------

#[tokio::test]
async fn xds_all_three_spellings_carry_the_same_resources() {
    let a = synced(vec![mk_service("a", 1)]).await;
    let mut s = a.sink(Protocol::Sotw(SE_V1)).await;
    let mut got = BTreeMap::new();
    for t in [SE_V1, SE_V1BETA1, SE_V1ALPHA3] {
        s.send(Ask {
            topic: t,
            ..Ask::default()
        });
        let r = s.recv().await;
        assert_eq!(r.topic.as_deref(), Some(t));
        got.insert(t, (r.version.clone(), r.raw.clone()));
    }
    let first = got[SE_V1].clone();
    for (t, v) in &got {
        assert_eq!(v, &first, "{t} differs from v1");
    }
    a.stop().await;
}

/// Until the first sync, health and /readyz say not serving and ServiceEntries wait; then all
/// say serving.
#[tokio::test]
async fn before_first_sync_only_unknown_types_are_answered() {
    let a = Adapter::start().await;
    let mut health = HealthClient::new(a.channel().await);
    assert_eq!(
        health_of(&mut health, "").await,
        ServingStatus::NotServing as i32
    );
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
    assert_eq!(
        health_of(&mut health, "").await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(http_get(a.admin(), "/readyz").await.0, 503);

    reset(&a.handle, vec![mk_service("a", 1)]);
    let r = s.recv().await;
    assert_eq!(r.type_url, SE_V1);
    assert_eq!(names(&decode_xds(&r)), vec!["fake/a"]);
    a.wait_readyz(200).await;
    assert_eq!(
        health_of(&mut health, "").await,
        ServingStatus::Serving as i32
    );
    s.send(xds_ack(&r));
    s.silent("VirtualService is not answered again").await;
    // A later change is the next response: VirtualService answered late would come first.
    upsert(&a, "b", 1);
    let r = s.recv().await;
    assert_eq!(r.type_url, SE_V1);
    assert_eq!(names(&decode_xds(&r)), vec!["fake/a", "fake/b"]);
    a.stop().await;
}

#[tokio::test]
async fn relist_without_change_sends_nothing() {
    let services = vec![mk_service("a", 1), mk_service("b", 2)];
    let (a, mut s, r1) = acked(Protocol::Sotw(SE_V1), services).await;
    s.silent_for(Duration::from_millis(100), "ACKed").await;
    let before = metric_sum(&a.metrics().await, "mcp_adapter_snapshots_total");
    assert_eq!(before, 1.0, "one initial snapshot");

    reset(&a.handle, vec![mk_service("b", 2), mk_service("a", 1)]);
    upsert(&a, "a", 1);
    s.silent("an unchanged re-list is not a change").await;
    assert_eq!(
        metric_sum(&a.metrics().await, "mcp_adapter_snapshots_total"),
        before,
        "no new snapshot"
    );

    // The events above were processed: a real change right after them is the next response.
    upsert(&a, "b", 3);
    let r2 = s.recv().await;
    assert_eq!(r2.resources["fake/b"].spec.endpoints.len(), 3);
    assert_eq!(
        r2.resources["fake/a"], r1.resources["fake/a"],
        "a unchanged"
    );
    a.stop().await;
}

/// Over delta xDS a new stream telling what it holds (`initial_resource_versions`) gets only the
/// differences: what it lacks or holds at another version, and what it holds that is gone.
#[tokio::test]
async fn delta_xds_initial_versions_send_only_differences() {
    let p = Protocol::Delta(SE_V1);
    let (a, s, r1) = subscribed(p).await;
    drop(s);
    remove(&a, "b");
    upsert(&a, "c", 1);
    upsert(&a, "d", 1);
    a.wait_served(&["fake/a", "fake/c", "fake/d"]).await;

    let mut s = a.delta().await;
    s.send(DeltaDiscoveryRequest {
        node: Some(istiod_node()),
        type_url: SE_V1.into(),
        initial_resource_versions: [
            ("fake/a".to_string(), r1.resources["fake/a"].version.clone()),
            ("fake/c".to_string(), "0000000000000000".to_string()),
            ("fake/zzz".to_string(), "1".to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    });
    let r2 = s.recv().await;
    let mut sent: Vec<_> = r2.resources.iter().map(|r| r.name.clone()).collect();
    sent.sort();
    assert_eq!(sent, vec!["fake/c", "fake/d"], "a is up to date");
    assert_eq!(r2.removed_resources, vec!["fake/zzz"]);
    s.send(delta_ack(&r2));
    s.silent("ACKed").await;
    // A later change is the next response, and only it: anything sent late would come first.
    upsert(&a, "e", 1);
    let r3 = s.recv().await;
    let sent: Vec<_> = r3.resources.iter().map(|r| r.name.clone()).collect();
    assert_eq!(sent, vec!["fake/e"]);
    assert!(r3.removed_resources.is_empty(), "{r3:?}");
    a.stop().await;
}

/// The first update an mcpctl sink gets from `a` over MCP-over-xDS.
async fn mcpctl_first(a: &Adapter) -> (Sink, SinkUpdate) {
    let mut sink = Sink::connect(SinkOptions::new(a.xds_url()))
        .await
        .expect("sink connects");
    let u = tokio::time::timeout(STEP, sink.next())
        .await
        .expect("timed out")
        .expect("update");
    (sink, u)
}

#[tokio::test]
async fn quarantine_serves_only_valid_and_reports_the_invalid() {
    let mut bad = mk_service("bad", 1);
    bad.ports[0].name = "Not_Valid".into();
    let a = synced(vec![mk_service("good", 1), bad]).await;

    let (_sink, u) = mcpctl_first(&a).await;
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
    a.assert_metric(
        r#"mcp_adapter_quarantined_resources{registry="fake"}"#,
        Some(1.0),
    )
    .await;
    a.assert_metric(r#"mcp_adapter_resources{registry="fake"}"#, Some(1.0))
        .await;
    a.stop().await;
}

#[tokio::test]
async fn registry_outage_keeps_serving_the_last_good_state() {
    let a = synced(vec![mk_service("a", 1)]).await;
    let (mut sink, u) = mcpctl_first(&a).await;
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
    let (mut fresh, u2) = mcpctl_first(&a).await;
    assert_eq!(u2.state, u.state);
    assert_eq!(u2.version_info, u.version_info);

    let healthy = r#"mcp_adapter_registry_healthy{registry="fake"}"#;
    a.assert_metric(healthy, Some(0.0)).await;
    a.assert_metric(
        r#"mcp_adapter_registry_errors_total{kind="unavailable",registry="fake"}"#,
        Some(1.0),
    )
    .await;

    // The registry is back: a new Reset on the new watch.
    reset(&a.handle, vec![mk_service("a", 1)]);
    a.wait_http("/registryz", 200).await;
    assert_eq!(
        health_of(&mut health, "registry").await,
        ServingStatus::Serving as i32
    );
    let d = a.debug().await;
    assert_eq!(d["healthy"], true, "{d}");
    a.assert_metric(healthy, Some(1.0)).await;
    assert!(
        fresh
            .next_within(Duration::from_millis(300))
            .await
            .expect("stream ok")
            .is_none(),
        "an identical re-list after the outage pushes nothing"
    );
    // A real change is the next update of both sinks: anything pushed to either after its
    // quiet window would come first (with a's old version).
    upsert(&a, "a", 2);
    for s in [&mut sink, &mut fresh] {
        let u3 = s
            .next_within(STEP)
            .await
            .expect("stream ok")
            .expect("an update");
        assert_eq!(u3.state.keys().cloned().collect::<Vec<_>>(), vec!["fake/a"]);
        assert_ne!(u3.state["fake/a"].version, u.state["fake/a"].version);
    }
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
        let mut s = a.sink(Protocol::Sotw(SE_V1)).await;
        s.subscribe();
        got.push(s.recv().await);
    }
    assert_eq!(got[0].version, got[1].version);
    let (mx, my) = (&got[0].resources, &got[1].resources);
    assert_eq!(got[0].names(), vec!["fake/a", "fake/b"]);
    assert_eq!(mx, my, "names, versions, create_time and bodies agree");
    assert_eq!(
        mx["fake/a"].create_time,
        Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0
        })
    );
    assert_eq!(got[0].raw, got[1].raw, "byte-identical");
    x.stop().await;
    y.stop().await;
}

/// Events spread over most of a coalescing window are one push.
///
/// The burst runs on paused time: each event is sent once the core took the one before, and the
/// clock moves 40 ms between them, so the five span 160 ms of the 200 ms window however slow the
/// machine is (sleeping between them instead let a busy machine stretch the burst past the
/// window). Time resumes once the core took the last one, so nothing can be left out of it.
#[tokio::test]
async fn coalescing_window_merges_a_burst() {
    let mut args = test_args();
    args.coalesce = Duration::from_millis(200);
    let a = Adapter::start_with(args).await;
    let keys = ["a", "b", "c", "d", "e"];
    reset(&a.handle, keys.iter().map(|k| mk_service(k, 1)).collect());
    a.wait_readyz(200).await;
    let mut s = a.sink(Protocol::Sotw(SE_V1)).await;
    s.subscribe();
    let r1 = s.recv().await;
    let before = &r1.resources;
    assert_eq!(before.len(), 5);
    s.ack(&r1);
    s.silent_for(Duration::from_millis(300), "ACKed").await;

    tokio::time::pause();
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            tokio::time::advance(Duration::from_millis(40)).await;
        }
        let taken = a.handle.taken();
        upsert(&a, k, 2);
        // Yielding moves no paused clock: only the core's taking the event ends this.
        let mut yields = 0u32;
        while a.handle.taken() == taken {
            yields += 1;
            assert!(yields < 1_000_000, "the core never took the event for {k}");
            tokio::task::yield_now().await;
        }
    }
    tokio::time::resume();
    let r2 = s.recv().await;
    let after = &r2.resources;
    for k in keys {
        let n = format!("fake/{k}");
        assert_ne!(after[&n].version, before[&n].version, "{n} changed");
        assert_eq!(after[&n].spec.endpoints.len(), 2);
    }
    s.ack(&r2);
    s.silent("the whole burst was one push").await;
    a.assert_metric(
        r#"mcp_adapter_snapshots_total{reason="change",registry="fake"}"#,
        Some(1.0),
    )
    .await;
    // A later change is the next push, alone: a part of the burst pushed late would come
    // first.
    upsert(&a, "a", 3);
    let r3 = s.recv().await;
    assert_eq!(r3.resources["fake/a"].spec.endpoints.len(), 3);
    for k in &keys[1..] {
        let n = format!("fake/{k}");
        assert_eq!(
            r3.resources[&n].version, after[&n].version,
            "{n} as in the burst"
        );
    }
    a.assert_metric(
        r#"mcp_adapter_snapshots_total{reason="change",registry="fake"}"#,
        Some(2.0),
    )
    .await;
    a.stop().await;
}

/// Changes sent as one `Changes` event (adapter-file sends one per edited file) are one push,
/// with coalescing off too: no sink is ever sent part of them.
#[tokio::test]
async fn a_changes_event_is_one_push_without_coalescing() {
    let mut args = test_args();
    args.coalesce = Duration::ZERO;
    let a = Adapter::start_with(args).await;
    let keys = ["a", "b", "c", "d", "e"];
    reset(&a.handle, keys.iter().map(|k| mk_service(k, 1)).collect());
    a.wait_readyz(200).await;
    let mut s = a.sink(Protocol::Sotw(SE_V1)).await;
    s.subscribe();
    let r1 = s.recv().await;
    s.ack(&r1);
    s.silent_for(Duration::from_millis(300), "ACKed").await;

    a.handle.send(RegistryEvent::Changes {
        upserts: keys[1..].iter().map(|k| mk_service(k, 2)).collect(),
        removes: vec![ServiceKey::new("a")],
    });
    let r2 = s.recv().await;
    assert_eq!(r2.names(), vec!["fake/b", "fake/c", "fake/d", "fake/e"]);
    for k in &keys[1..] {
        assert_eq!(r2.resources[&format!("fake/{k}")].spec.endpoints.len(), 2);
    }
    s.ack(&r2);
    s.silent("the whole event was one push").await;
    a.assert_metric(
        r#"mcp_adapter_snapshots_total{reason="change",registry="fake"}"#,
        Some(1.0),
    )
    .await;
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
        upsert(&a, "a", i);
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
    let services = vec![mk_service("a", 1), mk_service("b", 1)];
    let (a, mut s, _) = acked(Protocol::Sotw(SE_V1), services).await;

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
    upsert(&a, "a", 2);
    let r2 = s.recv().await;
    assert_eq!(r2.resources["fake/a"].spec.endpoints.len(), 2);
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

//! Delta xDS subscription changes over real gRPC: the wildcard and explicit names are tracked
//! apart, only the first request can be a legacy wildcard, subscription changes with a stale
//! nonce are honoured, and unsubscribed names are not reported removed (xDS protocol, "Incremental
//! xDS").

mod common;

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use mcp_core::registry::RegistryEvent;
use mcp_core::testing::mk_service;
use mcp_core::Service;

/// A started adapter with `services` synced.
async fn synced(services: Vec<Service>) -> Adapter {
    let a = Adapter::start().await;
    a.handle.send(RegistryEvent::Reset(services));
    a.wait_readyz(200).await;
    a
}

/// A delta request for ServiceEntries changing the subscription.
fn change(nonce: &str, subscribe: &[&str], unsubscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: SE_V1.into(),
        response_nonce: nonce.into(),
        resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

/// The first request of a stream.
fn first(subscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(istiod_node()),
        ..change("", subscribe, &[])
    }
}

/// Names of the resources a response carries, sorted.
fn sent(r: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = r.resources.iter().map(|r| r.name.clone()).collect();
    names.sort();
    names
}

type Delta = Raw<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

/// The next response, which must carry exactly `names` (`why` says why).
async fn expect_sent(s: &mut Delta, names: &[&str], why: &str) -> DeltaDiscoveryResponse {
    let r = s.recv().await;
    assert_eq!(sent(&r), names, "{why}");
    r
}

/// A delta stream on `a` whose first request subscribes to `subscribe`; its first response
/// must carry `names`, and is ACKed.
async fn subscribed(
    a: &Adapter,
    subscribe: &[&str],
    names: &[&str],
    why: &str,
) -> (Delta, DeltaDiscoveryResponse) {
    let mut s = a.delta().await;
    s.send(first(subscribe));
    let r1 = expect_sent(&mut s, names, why).await;
    s.send(delta_ack(&r1));
    (s, r1)
}

/// The end of a test whose last check is that nothing arrives: a later change of `name` is the
/// next response and carries only it (a response sent after the quiet window would come first).
async fn then_only(a: &Adapter, s: &mut Delta, name: &str, endpoints: usize) {
    a.handle
        .send(RegistryEvent::Upsert(mk_service(name, endpoints)));
    let full = format!("fake/{name}");
    let r = expect_sent(
        s,
        &[full.as_str()],
        "a later change is the next response, alone",
    )
    .await;
    assert!(r.removed_resources.is_empty(), "{r:?}");
}

/// The two services most tests start from.
fn a_and_b() -> Vec<Service> {
    vec![mk_service("a", 1), mk_service("b", 1)]
}

#[tokio::test]
async fn unsubscribing_the_wildcard_keeps_explicit_names() {
    let a = synced(a_and_b()).await;
    let (mut s, _) = subscribed(&a, &[], &["fake/a", "fake/b"], "legacy wildcard").await;

    s.send(change("", &["fake/a"], &[]));
    let r2 = expect_sent(&mut s, &["fake/a"], "a newly subscribed name is sent").await;
    assert!(r2.removed_resources.is_empty());
    s.send(delta_ack(&r2));

    s.send(change("", &[], &["*"]));
    s.silent("no removal for fake/a (still held) nor fake/b (dropped by the sink)")
        .await;

    a.handle.send(RegistryEvent::Upsert(mk_service("b", 2)));
    s.silent("fake/b is no longer subscribed").await;
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r3 = expect_sent(&mut s, &["fake/a"], "fake/a is still subscribed").await;
    assert!(r3.removed_resources.is_empty(), "{r3:?}");
    s.send(delta_ack(&r3));
    s.silent("ACKed").await;
    then_only(&a, &mut s, "a", 3).await;
    a.stop().await;
}

#[tokio::test]
async fn unsubscribing_only_before_the_first_answer_is_not_a_wildcard() {
    // Not synced yet: nothing is answered, so the second request precedes any response.
    let a = Adapter::start().await;
    let mut s = a.delta().await;
    s.send(first(&["fake/a"]));
    s.send(change("", &[], &["fake/zzz"]));
    s.silent("not synced").await;
    a.handle.send(RegistryEvent::Reset(a_and_b()));
    let r1 = expect_sent(&mut s, &["fake/a"], "still an explicit subscription").await;
    s.send(delta_ack(&r1));
    a.handle.send(RegistryEvent::Upsert(mk_service("b", 2)));
    s.silent("fake/b was never subscribed").await;
    then_only(&a, &mut s, "a", 2).await;
    a.stop().await;
}

#[tokio::test]
async fn subscription_change_with_a_stale_nonce_is_honoured() {
    let a = synced(a_and_b()).await;
    let (mut s, r1) = subscribed(&a, &["fake/a"], &["fake/a"], "subscribed").await;
    s.silent("ACKed").await;

    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r2 = expect_sent(&mut s, &["fake/a"], "fake/a changed").await;
    // Before handling r2, the sink subscribes to fake/b quoting r1's (now stale) nonce.
    s.send(change(&r1.nonce, &["fake/b"], &[]));
    s.send(delta_ack(&r2));
    let r3 = expect_sent(&mut s, &["fake/b"], "the stale request's change is applied").await;
    s.send(delta_ack(&r3));

    // With nothing in flight, a stale unsubscription is applied too (and needs no answer).
    s.send(change(&r1.nonce, &[], &["fake/a"]));
    s.silent("unsubscribing needs no answer").await;
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 3)));
    s.silent("fake/a is no longer subscribed").await;
    a.handle.send(RegistryEvent::Upsert(mk_service("b", 2)));
    expect_sent(&mut s, &["fake/b"], "fake/b changed").await;
    a.stop().await;
}

#[tokio::test]
async fn explicit_names_outlive_a_wildcard_added_and_dropped() {
    let a = synced(a_and_b()).await;
    let (mut s, _) = subscribed(&a, &["fake/a"], &["fake/a"], "subscribed").await;

    s.send(change("", &["*"], &[]));
    let r2 = expect_sent(&mut s, &["fake/b"], "fake/a is held already").await;
    s.send(delta_ack(&r2));

    s.send(change("", &[], &["*"]));
    s.silent("no removal for fake/a (still subscribed) nor fake/b (dropped by the sink)")
        .await;
    a.handle.send(RegistryEvent::Upsert(mk_service("a", 2)));
    let r3 = expect_sent(&mut s, &["fake/a"], "fake/a is still subscribed").await;
    assert!(r3.removed_resources.is_empty(), "{r3:?}");
    a.stop().await;
}

#[tokio::test]
async fn unsubscribed_names_are_not_reported_removed_and_come_back() {
    let a = synced(a_and_b()).await;
    let both = ["fake/a", "fake/b"];
    let (mut s, _) = subscribed(&a, &both, &both, "subscribed").await;

    s.send(change("", &[], &["fake/b"]));
    s.silent("the sink dropped fake/b itself").await;

    s.send(change("", &["fake/b"], &[]));
    let r2 = expect_sent(&mut s, &["fake/b"], "resent although unchanged").await;
    assert!(r2.removed_resources.is_empty());
    s.send(delta_ack(&r2));
    s.silent("ACKed").await;
    then_only(&a, &mut s, "a", 2).await;
    a.stop().await;
}

#[tokio::test]
async fn subscribing_to_a_missing_name_reports_it_removed() {
    let a = synced(vec![mk_service("a", 1)]).await;
    let (mut s, r1) = subscribed(&a, &["fake/a", "fake/zzz"], &["fake/a"], "fake/a exists").await;
    assert_eq!(
        r1.removed_resources,
        vec!["fake/zzz"],
        "so the sink need not time out"
    );
    a.handle.send(RegistryEvent::Upsert(mk_service("zzz", 1)));
    expect_sent(&mut s, &["fake/zzz"], "sent once it exists").await;
    a.stop().await;
}

#[tokio::test]
async fn unsubscribing_a_name_under_the_wildcard_resends_its_state() {
    let a = synced(a_and_b()).await;
    let (mut s, _) = subscribed(&a, &["*", "fake/a"], &["fake/a", "fake/b"], "subscribed").await;

    // The sink cannot know whether `*` covers fake/a: the server tells it.
    s.send(change("", &[], &["fake/a"]));
    let r2 = expect_sent(&mut s, &["fake/a"], "fake/a's state resent").await;
    assert!(r2.removed_resources.is_empty());
    s.send(delta_ack(&r2));
    s.silent("ACKed").await;
    then_only(&a, &mut s, "b", 2).await;
    a.stop().await;
}

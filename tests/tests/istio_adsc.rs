//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-file: the store istiod would build holds our ServiceEntries, follows an edit and a
//! deletion, and keeps the others when one file turns bad.

use std::time::Duration;

use e2e::forwarder::Forwarder;
use e2e::{item, test_each_istio_version, version_of, wait_for, Adapter, Adsc, IstioVersion};

// Each test runs `scenario` with one build of Istio's client.
test_each_istio_version! {
    "needs Istio's adsc client: tests/istio-adsc/build.sh target/adsc (the README's test command builds it)",
    istio_current_reads_edits_and_deletions, istio_1_22_reads_edits_and_deletions => scenario
}

test_each_istio_version! {
    "needs Istio's adsc client: tests/istio-adsc/build.sh target/adsc (the README's test command builds it)",
    istio_current_moves_to_another_replica_when_its_connection_ages,
    istio_1_22_moves_to_another_replica_when_its_connection_ages => rebalance
}

const SHOP: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: payments
  namespace: shop
  labels: {team: pay}
spec:
  hosts: [payments.shop.internal]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 8080, name: http, protocol: HTTP}
  endpoints:
  - {address: 10.0.0.1, labels: {version: v1}}
  - {address: 10.0.0.2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: stripe
  namespace: shop
spec:
  hosts: [api.stripe.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports:
  - {number: 443, name: tls, protocol: TLS}
"#;

const INVENTORY: &str = r#"
kind: Inventory
namespace: legacy
services:
- name: billing
  ports: {http: 8080}
  endpoints: [10.1.0.1, "10.1.0.2:8081"]
"#;

fn scenario(version: IstioVersion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let shop = dir.path().join("shop.yaml");
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(&shop, SHOP).expect("write");
    std::fs::write(&inventory, INVENTORY).expect("write");
    let path = dir.path().to_string_lossy().to_string();
    let adapter = Adapter::start(
        "adapter-file",
        &[
            "--path",
            &path,
            "--poll-interval",
            "100ms",
            "--host-suffix",
            "legacy.example",
        ],
    );
    let mut adsc = Adsc::start_synced(version, &adapter);
    let synced = adsc.seen.last().expect("the synced event");
    let se_type = synced["serviceEntryTypeUrl"].as_str().unwrap_or_default();
    match version {
        IstioVersion::Current => assert_eq!(se_type, "networking.istio.io/v1/ServiceEntry"),
        IstioVersion::V1_22 => assert_eq!(se_type, "networking.istio.io/v1alpha3/ServiceEntry"),
    }

    let items = adsc.wait_items("three ServiceEntries", |items| items.len() == 3);
    let payments = item(&items, "shop/payments").expect("shop/payments in istio's store");
    assert_eq!(payments["spec"]["hosts"][0], "payments.shop.internal");
    assert_eq!(
        payments["spec"]["endpoints"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(payments["labels"]["team"], "pay");
    assert_eq!(payments["labels"]["mcp-adapter/registry"], "file");
    let v1 = payments["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(v1.len(), 16, "content-hash version: {v1}");
    assert_eq!(payments["creationTimestamp"], "1970-01-01T00:00:00Z");
    let stripe = item(&items, "shop/stripe").expect("shop/stripe");
    assert_eq!(
        stripe["spec"]["location"],
        serde_json::Value::Null,
        "MESH_EXTERNAL is protojson's zero"
    );
    assert_eq!(stripe["spec"]["resolution"], "DNS");
    let billing = item(&items, "legacy/billing").expect("legacy/billing");
    assert_eq!(billing["spec"]["hosts"][0], "billing.legacy.example");
    assert_eq!(billing["spec"]["endpoints"][1]["ports"]["http"], 8081);

    // An edit reaches istio's store with a new version; the others keep theirs.
    let stripe_version = version_of(&items, "shop/stripe");
    std::fs::write(&shop, SHOP.replace("10.0.0.2", "10.0.0.3")).expect("edit");
    let items = adsc.wait_items("edited payments", |items| {
        item(items, "shop/payments")
            .is_some_and(|p| p["spec"]["endpoints"][1]["address"] == "10.0.0.3")
    });
    let payments = item(&items, "shop/payments").expect("payments");
    assert_ne!(payments["resourceVersion"].as_str(), Some(v1.as_str()));
    assert_eq!(version_of(&items, "shop/stripe"), stripe_version);

    // A broken file keeps its last good content in istio's store; the other file still flows.
    std::fs::write(&shop, "kind: ServiceEntry\nspec: [unclosed").expect("break");
    std::fs::write(&inventory, INVENTORY.replace("10.1.0.1", "10.1.0.9")).expect("edit");
    let items = adsc.wait_items("inventory edit while shop.yaml is broken", |items| {
        item(items, "legacy/billing")
            .is_some_and(|b| b["spec"]["endpoints"][0]["address"] == "10.1.0.2")
    });
    assert_eq!(
        items.len(),
        3,
        "shop.yaml's last good content is still served: {items:?}"
    );
    // The parse error is reported once the broken content has settled (adapter-file's
    // --settle-time: a half-written file is not believed at once).
    adapter.wait_problems(
        Duration::from_secs(10),
        "shop.yaml's problem reported",
        |p| p.contains("shop.yaml"),
    );

    // Deletion: the file's ServiceEntries leave istio's store.
    std::fs::remove_file(&shop).expect("delete");
    let items = adsc.wait_items("shop.yaml's entries deleted", |items| items.len() == 1);
    assert!(item(&items, "legacy/billing").is_some());
    adsc.assert_no_errors();
}

/// `--max-connection-age`: two adapter-file replicas behind one address that hands each new
/// connection to the next replica (as a Kubernetes Service does). Istio's client lands on the
/// first; when its connection is 2 s old it gets a GOAWAY, its stream ends 1 s later with
/// UNAVAILABLE naming the flag, and it reconnects over a new connection, to the other replica,
/// keeping its store whole; an edit then reaches it from there.
fn rebalance(version: IstioVersion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let shop = dir.path().join("shop.yaml");
    std::fs::write(&shop, SHOP).expect("write");
    let path = dir.path().to_string_lossy().to_string();
    let args = [
        "--path",
        &path,
        "--poll-interval",
        "100ms",
        "--max-connection-age",
        "2s",
        "--max-connection-age-grace",
        "1s",
    ];
    let replicas = [
        Adapter::start("adapter-file", &args),
        Adapter::start("adapter-file", &args),
    ];
    for r in &replicas {
        r.wait_ready();
    }
    let service = Forwarder::start(replicas.iter().map(|r| r.grpc).collect());
    let mut adsc = Adsc::start(version, service.addr);
    adsc.wait(Duration::from_secs(60), "adsc synced", |e| {
        e["event"] == "synced"
    });
    let sinks = |r: &Adapter| r.metric("mcp_adapter_connected_sinks");
    assert_eq!(service.picks(), vec![1, 0]);
    assert_eq!((sinks(&replicas[0]), sinks(&replicas[1])), (1.0, 0.0));
    let items = adsc.wait_items("two ServiceEntries", |items| items.len() == 2);
    let stripe = version_of(&items, "shop/stripe");

    // The connection ages: the client moves to the other replica.
    wait_for(
        Duration::from_secs(30),
        "the client on the second replica",
        || (sinks(&replicas[0]) == 0.0 && sinks(&replicas[1]) == 1.0).then_some(()),
    );
    assert_eq!(service.picks(), vec![1, 1], "one new connection");
    let log = replicas[0].log();
    assert!(
        log.contains("older than --max-connection-age"),
        "the first replica says why it ended the stream:\n{}",
        replicas[0].log_tail()
    );
    std::fs::write(&shop, SHOP.replace("10.0.0.2", "10.0.0.3")).expect("edit");
    let items = adsc.wait_items("edited payments, from the second replica", |items| {
        item(items, "shop/payments")
            .is_some_and(|p| p["spec"]["endpoints"][1]["address"] == "10.0.0.3")
    });
    assert_eq!(items.len(), 2, "nothing lost in the move: {items:?}");
    assert_eq!(version_of(&items, "shop/stripe"), stripe);
    // The only errors Istio's client saw are the ends of aged streams, with their reason.
    for e in adsc.errors() {
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("Unavailable") && m.contains("--max-connection-age"),
            "{e}"
        );
    }
    for r in &replicas {
        r.assert_no_registry_errors("after the move");
    }
}

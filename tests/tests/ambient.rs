//! Istio ambient: what its node proxy, ztunnel, gets from the real istiod
//! (`PILOT_ENABLE_AMBIENT=true`), asked for as ztunnel asks ([`e2e::ztunnel`]).
//!
//! istiod builds ztunnel's index (services and workloads) from the API server only (its ambient
//! index watches ServiceEntries with a Kubernetes informer, not its config store:
//! `pilot/pkg/serviceregistry/ambient/ambientindex.go:202` of the pinned Istio): a ServiceEntry
//! written there reaches ztunnel and follows changes, while a ServiceEntry that an adapter serves
//! over MCP (`configSources: xds://...`) stays out of it, although istiod holds it and serves it
//! to sidecars. Tests of services the adapters write to the API server themselves belong beside
//! this baseline.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::istiod::{apply_istio_crds, configz_service_entries, registries_of, Istiod, IstiodConfig};
use e2e::kube::KubeApiServer;
use e2e::ztunnel::{workload_addresses, ZtunnelView, ZtunnelWatch};
use e2e::{find, wait_for, wait_served, Adapter};

/// The ServiceEntry written to the API server.
const KUBE_NS: &str = "shop";
const KUBE_NAME: &str = "payments";
const KUBE_HOST: &str = "payments.shop.example";
/// Its key in ztunnel's services (`namespace/hostname`).
const KUBE_KEY: &str = "shop/payments.shop.example";

/// The ServiceEntry only adapter-file serves (over MCP).
const MCP_FILE: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: ext}
spec:
  hosts: [billing.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8443, name: tcp, protocol: TCP}]
  endpoints: [{address: 192.0.2.10}, {address: 192.0.2.11}]
";
const MCP_HOST: &str = "billing.example.com";

/// `shop/payments` with a static endpoint at each of `ips`, as adapters shape their entries
/// (MESH_INTERNAL, STATIC).
fn payments(ips: &[&str]) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": KUBE_NAME, "namespace": KUBE_NS},
        "spec": {
            "hosts": [KUBE_HOST],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
            "endpoints": ips.iter().map(|ip| json!({"address": ip})).collect::<Vec<_>>(),
        },
    })
}

fn apply_payments(kube: &KubeApiServer, ips: &[&str]) {
    kube.apply(
        &format!("/apis/networking.istio.io/v1/namespaces/{KUBE_NS}/serviceentries"),
        &payments(ips),
    );
}

/// The uid istiod gives the endpoint at `ip` of `shop/payments`.
fn endpoint_uid(ip: &str) -> String {
    format!("Kubernetes/networking.istio.io/ServiceEntry/{KUBE_NS}/{KUBE_NAME}/{ip}")
}

/// The uids of the workloads of `shop/payments`, sorted.
fn payments_uids(view: &ZtunnelView) -> Vec<String> {
    let mut v: Vec<String> = view.workloads_of(KUBE_KEY).map(|w| w.uid.clone()).collect();
    v.sort();
    v
}

/// The MCP-only service is nowhere in `view`: no service, no workload of it, no workload at
/// its endpoints' addresses.
fn assert_no_mcp_service(view: &ZtunnelView) {
    assert!(
        !view.mentions_host(MCP_HOST),
        "{MCP_HOST} (served over MCP only) is in ztunnel's view: {view:#?}"
    );
    let at_mcp_endpoints: Vec<&str> = view
        .workloads
        .values()
        .filter(|w| {
            w.addresses
                .iter()
                .any(|a| a == "192.0.2.10" || a == "192.0.2.11")
        })
        .map(|w| w.uid.as_str())
        .collect();
    assert!(
        at_mcp_endpoints.is_empty(),
        "workloads at the MCP service's endpoints: {at_mcp_endpoints:?}"
    );
}

#[test]
#[ignore = "needs kube-apiserver and pilot-discovery: tests/go-peers/build.sh target"]
fn ztunnel_sees_api_server_service_entries_but_not_mcp_ones() {
    let started = Instant::now();
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    kube.namespace(KUBE_NS);
    apply_istio_crds(&kube);
    apply_payments(&kube, &["10.10.0.1", "10.10.0.2"]);

    let files = tempfile::tempdir().expect("tempdir");
    std::fs::write(files.path().join("billing.yaml"), MCP_FILE).expect("write SE file");
    let path = files.path().display().to_string();
    let a = Adapter::start("adapter-file", &["--path", &path]);
    a.wait_ready();
    wait_served(
        Duration::from_secs(30),
        "adapter-file serves ext/billing",
        &a.xds_url(),
        |items| find(items, "billing").is_some(),
    );

    let t = Instant::now();
    let istiod = Istiod::start_with(&[a.grpc], &kube.kubeconfig(), &IstiodConfig::ambient());
    eprintln!("istiod (ambient) ready in {:?}", t.elapsed());

    // istiod holds both ServiceEntries (the CRD's from `k8s://`, the file's from `xds://`) and
    // has both services in its External registry: what sidecars get.
    wait_for(
        Duration::from_secs(60),
        "both ServiceEntries in istiod's configz and registryz",
        || {
            let configz = configz_service_entries(&istiod.debug("configz"));
            let registryz = istiod.debug("registryz");
            (configz == ["ext/billing", "shop/payments"]
                && registries_of(&registryz, MCP_HOST, "ext") == ["External"]
                && registries_of(&registryz, KUBE_HOST, KUBE_NS) == ["External"])
            .then_some(())
        },
    );

    // 1. ztunnel gets the API server's ServiceEntry: its service, and one workload per static
    // endpoint, each an endpoint of that service.
    let t = Instant::now();
    let watch = ZtunnelWatch::connect(istiod.grpc);
    let view = watch.wait_until(
        Duration::from_secs(60),
        "shop/payments with its 2 endpoints",
        |v| v.endpoints_of(KUBE_KEY) == ["10.10.0.1", "10.10.0.2"],
    );
    eprintln!(
        "ztunnel view after {:?} ({} responses): services {:?}, workloads {:?}",
        t.elapsed(),
        watch.responses(),
        view.services.keys().collect::<Vec<_>>(),
        view.workloads.keys().collect::<Vec<_>>()
    );
    let svc = view
        .services
        .get(KUBE_KEY)
        .unwrap_or_else(|| panic!("{KUBE_KEY} in ztunnel's services: {view:#?}"));
    assert_eq!(
        (
            svc.name.as_str(),
            svc.namespace.as_str(),
            svc.hostname.as_str()
        ),
        (KUBE_NAME, KUBE_NS, KUBE_HOST),
        "{svc:?}"
    );
    assert_eq!(
        svc.ports.iter().map(|p| p.service_port).collect::<Vec<_>>(),
        [8080],
        "{svc:?}"
    );
    eprintln!("{KUBE_KEY} VIPs: {:?}", svc.addresses);
    assert_eq!(
        payments_uids(&view),
        [endpoint_uid("10.10.0.1"), endpoint_uid("10.10.0.2")]
    );
    for w in view.workloads_of(KUBE_KEY) {
        assert_eq!(w.namespace, KUBE_NS, "{w:?}");
        assert!(w.healthy, "{w:?}");
        assert_eq!(
            w.services[KUBE_KEY]
                .iter()
                .map(|p| p.service_port)
                .collect::<Vec<_>>(),
            [8080],
            "{w:?}"
        );
    }
    // A one-shot stream gets the same.
    let once = workload_addresses(istiod.grpc, Duration::from_secs(30));
    assert_eq!(once.services.get(KUBE_KEY), Some(svc));
    assert_eq!(payments_uids(&once), payments_uids(&view));

    // 2. It follows changes: an endpoint added is a new workload, one removed is gone (the
    // watch drops a name only on a delta response's `removed_resources`).
    let t = Instant::now();
    apply_payments(&kube, &["10.10.0.1", "10.10.0.2", "10.10.0.3"]);
    let view = watch.wait_until(
        Duration::from_secs(30),
        "a third endpoint of shop/payments",
        |v| v.endpoints_of(KUBE_KEY) == ["10.10.0.1", "10.10.0.2", "10.10.0.3"],
    );
    assert!(view.workloads.contains_key(&endpoint_uid("10.10.0.3")));
    eprintln!("endpoint added: in ztunnel's view after {:?}", t.elapsed());
    let t = Instant::now();
    apply_payments(&kube, &["10.10.0.2", "10.10.0.3"]);
    let view = watch.wait_until(
        Duration::from_secs(30),
        "10.10.0.1 gone from shop/payments",
        |v| v.endpoints_of(KUBE_KEY) == ["10.10.0.2", "10.10.0.3"],
    );
    assert_eq!(
        payments_uids(&view),
        [endpoint_uid("10.10.0.2"), endpoint_uid("10.10.0.3")]
    );
    assert!(
        !view.workloads.contains_key(&endpoint_uid("10.10.0.1")),
        "the removed endpoint's workload is gone: {view:#?}"
    );
    eprintln!(
        "endpoint removed: gone from ztunnel's view after {:?}",
        t.elapsed()
    );

    // 3. The service served over MCP only is in none of them, although istiod held it before
    // ztunnel connected (the first response is the whole index) and before the changes above
    // went through the same pushes.
    assert_no_mcp_service(&once);
    assert_no_mcp_service(&view);
    let registryz = istiod.debug("registryz");
    assert_eq!(registries_of(&registryz, MCP_HOST, "ext"), ["External"]);

    // The watch, which applied deltas, agrees with a fresh stream's full answer.
    let fresh = workload_addresses(istiod.grpc, Duration::from_secs(30));
    watch.wait_until(
        Duration::from_secs(10),
        "the watch's view equal to a fresh stream's",
        |v| v == &fresh,
    );
    eprintln!("whole test in {:?}", started.elapsed());
}

/// A registry service (adapter-file's `ns/orders`) with a static endpoint at each of `ips`.
fn orders_file(ips: &[&str]) -> String {
    let endpoints: Vec<String> = ips.iter().map(|ip| format!("{{address: {ip}}}")).collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: orders, namespace: ns}}\nspec:\n  hosts: [orders.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{}]\n",
        endpoints.join(", ")
    )
}

fn write_orders(dir: &std::path::Path, ips: &[&str]) {
    let tmp = dir.join(".orders.tmp");
    std::fs::write(&tmp, orders_file(ips)).expect("write");
    std::fs::rename(&tmp, dir.join("orders.yaml")).expect("rename");
}

#[test]
#[ignore = "needs kube-apiserver and pilot-discovery: tests/go-peers/build.sh target"]
fn ztunnel_sees_registry_services_once_the_kube_output_writes_them() {
    const KEY: &str = "ns/orders.example.com";
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    kube.namespace("ns");
    apply_istio_crds(&kube);
    let files = tempfile::tempdir().expect("tempdir");
    write_orders(files.path(), &["10.20.0.1", "10.20.0.2"]);
    let path = files.path().display().to_string();
    let mcp_only = ["--path", path.as_str(), "--poll-interval", "100ms"];
    let mut a = Adapter::start("adapter-file", &mcp_only);
    a.wait_ready();
    let istiod = Istiod::start_with(&[a.grpc], &kube.kubeconfig(), &IstiodConfig::ambient());

    // Over MCP only: istiod has the service (sidecars get it), ztunnel does not.
    wait_for(
        Duration::from_secs(60),
        "ns/orders in istiod's registryz",
        || {
            let registryz = istiod.debug("registryz");
            (registries_of(&registryz, "orders.example.com", "ns") == ["External"]).then_some(())
        },
    );
    let watch = ZtunnelWatch::connect(istiod.grpc);
    let view = watch.wait_until(Duration::from_secs(30), "a first view", |_| true);
    assert!(
        !view.mentions_host("orders.example.com"),
        "served over MCP only, yet in ztunnel's view: {view:#?}"
    );

    // The same adapter with the Kubernetes output beside MCP: the service reaches ztunnel, with
    // its endpoints as workloads.
    let kubeconfig = kube.kubeconfig().display().to_string();
    let with_output: Vec<&str> = mcp_only
        .iter()
        .copied()
        .chain([
            "--output",
            "both",
            "--output-kubeconfig",
            kubeconfig.as_str(),
            "--output-namespaces",
            "ns",
        ])
        .collect();
    let t = Instant::now();
    a.restart_with(&with_output);
    a.wait_ready();
    watch.wait_until(
        Duration::from_secs(60),
        "ns/orders with its 2 endpoints in ztunnel's view",
        |v| v.endpoints_of(KEY) == ["10.20.0.1", "10.20.0.2"],
    );
    eprintln!(
        "written and in ztunnel's view {:?} after the restart",
        t.elapsed()
    );
    let view = watch.view();
    let svc = &view.services[KEY];
    assert_eq!(
        (svc.namespace.as_str(), svc.hostname.as_str()),
        ("ns", "orders.example.com")
    );
    assert_eq!(
        svc.ports.iter().map(|p| p.service_port).collect::<Vec<_>>(),
        [80]
    );

    // It follows a registry change: one endpoint replaced.
    let t = Instant::now();
    write_orders(files.path(), &["10.20.0.1", "10.20.0.3"]);
    watch.wait_until(
        Duration::from_secs(30),
        "10.20.0.2 replaced by 10.20.0.3 in ztunnel's view",
        |v| v.endpoints_of(KEY) == ["10.20.0.1", "10.20.0.3"],
    );
    eprintln!("registry change in ztunnel's view after {:?}", t.elapsed());
    // Two writes in all (the service, then its change), none failed.
    assert_eq!(a.kube_writes("apply"), 2.0, "{}", a.log_tail());
    assert_eq!(a.debug()["kubeOutput"]["lastError"], Value::Null);
}

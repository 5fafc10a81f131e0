//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-kube and a real Kubernetes API server: what istiod would store is the remote
//! cluster's Services (hosts, VIPs, ports and protocols, ready endpoints with their pod labels
//! and localities), it follows an EndpointSlice change, and Istio's client reports no error.

use serde_json::{json, Value};

use e2e::kube::{ready, service, slice, KubeApiServer};
use e2e::{endpoint_addresses, item, test_each_istio_version, Adapter, Adsc, IstioVersion};

// Each test runs `scenario` with one build of Istio's client.
test_each_istio_version! {
    "needs kube-apiserver and adsc-watch: tests/kube-apiserver/build.sh target/kube; tests/istio-adsc/build.sh target/adsc",
    istio_current_reads_kubernetes_services, istio_1_22_reads_kubernetes_services => scenario
}

/// shop/web's one EndpointSlice (both ports) with `endpoints`.
fn web_slice(endpoints: Vec<Value>) -> Value {
    slice(
        "shop",
        "web-1",
        "web",
        "IPv4",
        &[("http", 8080), ("grpc", 9090)],
        endpoints,
    )
}

fn scenario(version: IstioVersion) {
    let kube = KubeApiServer::start();
    kube.namespace("shop");
    let mut web = service("shop", "web", &[("http", 80, 8080), ("grpc", 9090, 9090)]);
    web["metadata"]["annotations"] = json!({"networking.istio.io/exportTo": "*"});
    let web = kube.apply_service(&web);
    let mut eps = vec![ready("10.1.0.1"), ready("10.1.0.2")];
    eps[0]["zone"] = json!("zone-a");
    kube.apply_slice(&web_slice(eps));
    let kc = kube.kubeconfig().display().to_string();
    let adapter = Adapter::start(
        "adapter-kube",
        &[
            "--kubeconfig",
            kc.as_str(),
            "--cluster-domain",
            "remote.example",
            "--network",
            "west",
        ],
    );
    let mut adsc = Adsc::start_synced(version, &adapter);
    let items = adsc.wait_items("shop/web", |items| {
        item(items, "shop/web").is_some_and(|o| endpoint_addresses(o).len() == 2)
    });
    let w = item(&items, "shop/web").expect("shop/web in istio's store");
    assert_eq!(w["spec"]["hosts"], json!(["web.shop.svc.remote.example"]));
    assert_eq!(w["spec"]["addresses"], web["spec"]["clusterIPs"]);
    assert_eq!(w["spec"]["resolution"], "STATIC");
    assert_eq!(w["spec"]["ports"][0]["protocol"], "HTTP");
    assert_eq!(w["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(w["spec"]["ports"][1]["protocol"], "GRPC");
    assert_eq!(w["spec"]["exportTo"], json!(["*"]));
    assert_eq!(w["labels"]["mcp-adapter/registry"], "kubernetes");
    let first = &w["spec"]["endpoints"][0];
    assert_eq!(first["address"], "10.1.0.1");
    assert_eq!(first["locality"], "/zone-a");
    assert_eq!(first["network"], "west");

    // A pod replaced: istio's store follows.
    kube.apply_slice(&web_slice(vec![ready("10.1.0.2"), ready("10.1.0.3")]));
    adsc.wait_items("pod replaced", |items| {
        item(items, "shop/web").is_some_and(|o| endpoint_addresses(o) == ["10.1.0.2", "10.1.0.3"])
    });
    adsc.assert_no_errors();
}

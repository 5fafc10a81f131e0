//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-consul and a real Consul agent: what istiod would store is what Consul holds (hosts,
//! ports and protocols, healthy endpoints with their labels), it follows a health change, a new
//! instance and a deregistration, and Istio's client reports no error.

use std::time::Duration;

use e2e::consul::Consul;
use e2e::{endpoint_addresses, item, Adapter, Adsc, IstioVersion};

fn scenario(version: IstioVersion) {
    let consul = Consul::start(None);
    consul.register(
        "n1",
        "web",
        "web-1",
        "10.0.0.1",
        8080,
        &["version|v1"],
        &[("protocol", "http")],
        "passing",
    );
    consul.register(
        "n2",
        "web",
        "web-2",
        "10.0.0.2",
        8080,
        &["version|v2"],
        &[("protocol", "http")],
        "passing",
    );
    consul.register(
        "n1",
        "db",
        "db-1",
        "10.0.1.1",
        5432,
        &[],
        &[("protocol", "tcp")],
        "passing",
    );
    let addr = consul.addr();
    let adapter = Adapter::start(
        "adapter-consul",
        &["--consul-addr", &addr, "--exclude-service", "consul"],
    );
    adapter.wait_ready();

    let mut adsc = Adsc::start(version, adapter.grpc);
    adsc.wait(Duration::from_secs(60), "adsc synced", |e| {
        e["event"] == "synced"
    });
    let items = adsc.wait_items("web and db", |items| {
        item(items, "consul/web").is_some_and(|w| endpoint_addresses(w).len() == 2)
            && item(items, "consul/db").is_some()
    });
    assert_eq!(items.len(), 2, "{items:?}");
    let web = item(&items, "consul/web").expect("consul/web in istio's store");
    assert_eq!(web["spec"]["hosts"][0], "web.service.consul");
    assert_eq!(web["spec"]["ports"][0]["number"], 8080);
    assert_eq!(web["spec"]["ports"][0]["name"], "http-8080");
    assert_eq!(web["spec"]["ports"][0]["protocol"], "HTTP");
    assert_eq!(web["spec"]["resolution"], "STATIC");
    assert_eq!(endpoint_addresses(web), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(web["spec"]["endpoints"][0]["labels"]["version"], "v1");
    assert_eq!(web["spec"]["endpoints"][1]["labels"]["version"], "v2");
    assert_eq!(web["spec"]["endpoints"][0]["locality"], "dc1");
    assert_eq!(web["labels"]["mcp-adapter/registry"], "consul");
    let db = item(&items, "consul/db").expect("consul/db");
    assert_eq!(db["spec"]["hosts"][0], "db.service.consul");
    assert_eq!(db["spec"]["ports"][0]["protocol"], "TCP");
    assert_eq!(endpoint_addresses(db), ["10.0.1.1"]);
    let db_version = db["resourceVersion"].clone();

    // A check goes critical: istio's store drops the endpoint; db is not re-pushed.
    consul.set_check("n2", "web-2", "critical");
    let items = adsc.wait_items("web-2 critical", |items| {
        item(items, "consul/web").is_some_and(|w| endpoint_addresses(w) == ["10.0.0.1"])
    });
    assert_eq!(
        item(&items, "consul/db").expect("db")["resourceVersion"],
        db_version
    );

    // A new instance on a second port: a second port in the entry.
    consul.register(
        "n3",
        "web",
        "web-3",
        "10.0.0.3",
        9090,
        &[],
        &[("protocol", "grpc")],
        "passing",
    );
    let items = adsc.wait_items("web-3 on 9090", |items| {
        item(items, "consul/web").is_some_and(|w| endpoint_addresses(w).len() == 2)
    });
    let web = item(&items, "consul/web").expect("web");
    let ports: Vec<(u64, String)> = web["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["number"].as_u64().unwrap_or(0),
                p["protocol"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [(8080, "HTTP".to_string()), (9090, "GRPC".to_string())]
    );

    // Deregistered entirely: gone from istio's store.
    consul.deregister("n1", "db-1");
    adsc.wait_items("db gone", |items| {
        item(items, "consul/db").is_none() && item(items, "consul/web").is_some()
    });
    assert!(adsc.errors().is_empty(), "adsc errors: {:?}", adsc.errors());
}

#[test]
#[ignore = "needs consul and adsc-watch: tests/consul/build.sh target/consul; tests/istio-adsc/build.sh target/adsc"]
fn istio_current_reads_consul_services() {
    scenario(IstioVersion::Current);
}

#[test]
#[ignore = "needs consul and adsc-watch: tests/consul/build.sh target/consul; tests/istio-adsc/build.sh target/adsc"]
fn istio_1_22_reads_consul_services() {
    scenario(IstioVersion::V1_22);
}

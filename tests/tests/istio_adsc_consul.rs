//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-consul and a real Consul agent: what istiod would store is what Consul holds (hosts,
//! ports and protocols, healthy endpoints with their labels), it follows a health change, a new
//! instance and a deregistration, and Istio's client reports no error.

use e2e::consul::{Consul, Registration};
use e2e::{
    endpoint_addresses, item, port_protocols, ports, test_each_istio_version, version_of, Adapter,
    Adsc, IstioVersion,
};

// Each test runs `scenario` with one build of Istio's client.
test_each_istio_version! {
    "needs consul and adsc-watch: tests/consul/build.sh target/consul; tests/istio-adsc/build.sh target/adsc",
    istio_current_reads_consul_services, istio_1_22_reads_consul_services => scenario
}

/// Instance `id` of `web` on `node`, port 8080, HTTP.
fn web_instance(node: &str, id: &str, ip: &str) -> Registration {
    Registration::new(node, "web", id, ip, 8080).protocol("http")
}

fn scenario(version: IstioVersion) {
    let consul = Consul::start(None);
    consul.register(&web_instance("n1", "web-1", "10.0.0.1").tags(&["version|v1"]));
    consul.register(&web_instance("n2", "web-2", "10.0.0.2").tags(&["version|v2"]));
    consul.register(&Registration::new("n1", "db", "db-1", "10.0.1.1", 5432).protocol("tcp"));
    let addr = consul.addr();
    let adapter = Adapter::start(
        "adapter-consul",
        &["--consul-addr", &addr, "--exclude-service", "consul"],
    );
    let mut adsc = Adsc::start_synced(version, &adapter);
    let items = adsc.wait_exactly("consul/web", 2, &["consul/db"]);
    let web = item(&items, "consul/web").expect("consul/web in istio's store");
    assert_eq!(web["spec"]["hosts"][0], "web.service.consul");
    assert_eq!(ports(web)[0], (8080, "http-8080".into(), "HTTP".into()));
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
    let db_version = version_of(&items, "consul/db");

    // A check goes critical: istio's store drops the endpoint; db is not re-pushed.
    consul.set_check("n2", "web-2", "critical");
    let items = adsc.wait_items("web-2 critical", |items| {
        item(items, "consul/web").is_some_and(|w| endpoint_addresses(w) == ["10.0.0.1"])
    });
    assert_eq!(version_of(&items, "consul/db"), db_version, "db re-pushed");

    // A new instance on a second port: a second port in the entry.
    consul.register(&Registration::new("n3", "web", "web-3", "10.0.0.3", 9090).protocol("grpc"));
    let items = adsc.wait_items("web-3 on 9090", |items| {
        item(items, "consul/web").is_some_and(|w| endpoint_addresses(w).len() == 2)
    });
    assert_eq!(
        port_protocols(item(&items, "consul/web").expect("web")),
        [(8080, "HTTP".to_string()), (9090, "GRPC".to_string())]
    );

    // Deregistered entirely: gone from istio's store.
    consul.deregister("n1", "db-1");
    adsc.wait_items("db gone", |items| {
        item(items, "consul/db").is_none() && item(items, "consul/web").is_some()
    });
    adsc.assert_no_errors();
}

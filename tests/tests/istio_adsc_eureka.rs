//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-eureka and a real Eureka server: what istiod would store is what Eureka holds (hosts,
//! ports and protocols, UP endpoints with their labels), it follows a status change and a
//! cancel, and Istio's client reports no error.

use std::time::Duration;

use e2e::eureka::{Eureka, Instance};
use e2e::{endpoint_addresses, item, Adapter, Adsc, IstioVersion};

fn scenario(version: IstioVersion) {
    let eureka = Eureka::start();
    for (id, ip, v) in [
        ("orders-1", "10.0.0.1", "v1"),
        ("orders-2", "10.0.0.2", "v2"),
    ] {
        let mut i = Instance::new("orders", id, ip, 8080);
        i.vip = Some("orders".into());
        i.metadata.push(("version".into(), v.into()));
        eureka.register(&i);
    }
    let mut pay = Instance::new("payments", "payments-1", "10.0.1.1", 9090);
    pay.metadata.push(("protocol".into(), "grpc".into()));
    pay.secure_port = Some(9443);
    eureka.register(&pay);
    let url = eureka.url();
    let adapter = Adapter::start("adapter-eureka", &["--eureka-url", url.as_str()]);
    adapter.wait_ready();

    let mut adsc = Adsc::start(version, adapter.grpc);
    adsc.wait(Duration::from_secs(60), "adsc synced", |e| {
        e["event"] == "synced"
    });
    let items = adsc.wait_items("orders and payments", |items| {
        item(items, "eureka/orders").is_some_and(|o| endpoint_addresses(o).len() == 2)
            && item(items, "eureka/payments").is_some()
    });
    assert_eq!(items.len(), 2, "{items:?}");
    let orders = item(&items, "eureka/orders").expect("eureka/orders in istio's store");
    assert_eq!(orders["spec"]["hosts"][0], "orders.eureka");
    assert_eq!(orders["spec"]["ports"][0]["number"], 8080);
    assert_eq!(orders["spec"]["ports"][0]["protocol"], "HTTP");
    assert_eq!(orders["spec"]["resolution"], "STATIC");
    assert_eq!(endpoint_addresses(orders), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(orders["labels"]["mcp-adapter/registry"], "eureka");
    let pay = item(&items, "eureka/payments").expect("eureka/payments");
    assert_eq!(pay["spec"]["hosts"][0], "payments.eureka");
    let ports: Vec<(u64, String)> = pay["spec"]["ports"]
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
        [(9090, "GRPC".to_string()), (9443, "TLS".to_string())]
    );
    let pay_version = pay["resourceVersion"].clone();

    // OUT_OF_SERVICE: istio's store drops the endpoint; payments is not re-pushed.
    eureka.set_status("orders", "orders-2", "OUT_OF_SERVICE");
    let items = adsc.wait_items("orders-2 out of service", |items| {
        item(items, "eureka/orders").is_some_and(|o| endpoint_addresses(o) == ["10.0.0.1"])
    });
    assert_eq!(
        item(&items, "eureka/payments").expect("payments")["resourceVersion"],
        pay_version
    );

    // Cancelled: gone from istio's store.
    eureka.deregister("payments", "payments-1");
    adsc.wait_items("payments gone", |items| {
        item(items, "eureka/payments").is_none() && item(items, "eureka/orders").is_some()
    });
    assert!(adsc.errors().is_empty(), "adsc errors: {:?}", adsc.errors());
}

#[test]
#[ignore = "needs eureka and adsc-watch: tests/eureka/build.sh target/eureka; tests/istio-adsc/build.sh target/adsc"]
fn istio_current_reads_eureka_apps() {
    scenario(IstioVersion::Current);
}

#[test]
#[ignore = "needs eureka and adsc-watch: tests/eureka/build.sh target/eureka; tests/istio-adsc/build.sh target/adsc"]
fn istio_1_22_reads_eureka_apps() {
    scenario(IstioVersion::V1_22);
}

//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-eureka and a real Eureka server: what istiod would store is what Eureka holds (hosts,
//! ports and protocols, UP endpoints with their labels), it follows a status change and a
//! cancel, and Istio's client reports no error.

use e2e::eureka::{Eureka, Instance};
use e2e::{
    endpoint_addresses, item, port_protocols, test_each_istio_version, version_of, Adapter, Adsc,
    IstioVersion,
};

// Each test runs `scenario` with one build of Istio's client.
test_each_istio_version! {
    "needs eureka and adsc-watch: tests/eureka/build.sh target/eureka; tests/istio-adsc/build.sh target/adsc",
    istio_current_reads_eureka_apps, istio_1_22_reads_eureka_apps => scenario
}

fn scenario(version: IstioVersion) {
    let eureka = Eureka::start();
    for (id, ip, v) in [
        ("orders-1", "10.0.0.1", "v1"),
        ("orders-2", "10.0.0.2", "v2"),
    ] {
        let mut i = Instance::new("orders", id, ip, 8080).with_metadata("version", v);
        i.vip = Some("orders".into());
        eureka.register(&i);
    }
    let mut pay =
        Instance::new("payments", "payments-1", "10.0.1.1", 9090).with_metadata("protocol", "grpc");
    pay.secure_port = Some(9443);
    eureka.register(&pay);
    let url = eureka.url();
    let adapter = Adapter::start("adapter-eureka", &["--eureka-url", url.as_str()]);
    let mut adsc = Adsc::start_synced(version, &adapter);
    let items = adsc.wait_exactly("eureka/orders", 2, &["eureka/payments"]);
    let orders = item(&items, "eureka/orders").expect("eureka/orders in istio's store");
    assert_eq!(orders["spec"]["hosts"][0], "orders.eureka");
    assert_eq!(port_protocols(orders)[0], (8080, "HTTP".into()));
    assert_eq!(orders["spec"]["resolution"], "STATIC");
    assert_eq!(endpoint_addresses(orders), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(orders["labels"]["mcp-adapter/registry"], "eureka");
    let pay = item(&items, "eureka/payments").expect("eureka/payments");
    assert_eq!(pay["spec"]["hosts"][0], "payments.eureka");
    assert_eq!(
        port_protocols(pay),
        [(9090, "GRPC".to_string()), (9443, "TLS".to_string())]
    );
    let pay_version = version_of(&items, "eureka/payments");

    // OUT_OF_SERVICE: istio's store drops the endpoint; payments is not re-pushed.
    eureka.set_status("orders", "orders-2", "OUT_OF_SERVICE");
    let items = adsc.wait_items("orders-2 out of service", |items| {
        item(items, "eureka/orders").is_some_and(|o| endpoint_addresses(o) == ["10.0.0.1"])
    });
    let payments = version_of(&items, "eureka/payments");
    assert_eq!(payments, pay_version, "payments re-pushed");

    // Cancelled: gone from istio's store.
    eureka.deregister("payments", "payments-1");
    adsc.wait_items("payments gone", |items| {
        item(items, "eureka/payments").is_none() && item(items, "eureka/orders").is_some()
    });
    adsc.assert_no_errors();
}

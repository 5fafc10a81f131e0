//! Istio's own MCP-over-xDS client (the code istiod runs for `configSources: xds://...`) against
//! adapter-zookeeper with a real ZooKeeper: Dubbo 2 providers and a Spring Cloud (Curator)
//! instance reach the store istiod would build, follow a version bump and a provider leaving,
//! and an interface whose last provider left stays with no endpoints (the default).

use e2e::zookeeper::{provider_path, Writer, ZooKeeper};
use e2e::{item, test_each_istio_version, version_of, Adapter, Adsc, IstioVersion};

// Each test runs `scenario` with one build of Istio's client.
test_each_istio_version! {
    "needs zookeeper (scripts/install-zookeeper.sh) and Istio's adsc client (tests/istio-adsc/build.sh target/adsc)",
    istio_current_reads_zookeeper_services, istio_1_22_reads_zookeeper_services => scenario
}

const ORDER: &str = "com.example.OrderService";
const ORDER_ITEM: &str = "zookeeper/com.example.orderservice";
const WAITER_ITEM: &str = "zookeeper/waiter-service";

fn dubbo_url(ip: &str, version: &str) -> String {
    format!(
        "dubbo://{ip}:20880/{ORDER}?application=orders&interface={ORDER}&methods=place,cancel&side=provider&dubbo=2.0.2&release=2.7.23&version={version}&timestamp=1700000000000"
    )
}

const SPRING: &str = r#"{"name":"waiter-service","id":"b1fdcb1e","address":"10.9.1.1","port":8080,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"waiter-service","name":"waiter-service","metadata":{"instance_status":"UP","zone":"a"}},"registrationTimeUTC":1618899361271,"serviceType":"DYNAMIC","uriSpec":null}"#;

fn endpoints(item: &serde_json::Value) -> Vec<serde_json::Value> {
    item["spec"]["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn scenario(version: IstioVersion) {
    let zk = ZooKeeper::start();
    let mut w = Writer::start(&zk);
    let v1 = provider_path(ORDER, &dubbo_url("10.9.0.1", "1.0.0"));
    let v2 = provider_path(ORDER, &dubbo_url("10.9.0.2", "1.0.0"));
    w.create_e(&v1, "");
    w.create_e(&v2, "");
    w.create_e("/services/waiter-service/b1fdcb1e", SPRING);
    let servers = zk.servers();
    let adapter = Adapter::start("adapter-zookeeper", &["--zk-servers", servers.as_str()]);
    let mut adsc = Adsc::start_synced(version, &adapter);
    let items = adsc.wait_exactly(ORDER_ITEM, 2, &[WAITER_ITEM]);
    let order = item(&items, ORDER_ITEM).expect("order service in istio's store");
    assert_eq!(
        order["spec"]["hosts"][0],
        "com.example.orderservice.zookeeper"
    );
    assert_eq!(order["spec"]["resolution"], "STATIC");
    assert_eq!(order["spec"]["ports"][0]["number"], 20880);
    assert_eq!(order["spec"]["ports"][0]["name"], "tcp-20880");
    assert_eq!(order["spec"]["ports"][0]["protocol"], "TCP");
    assert_eq!(order["labels"]["mcp-adapter/registry"], "zookeeper");
    assert_eq!(
        order["annotations"]["dubbo.apache.org/interface"], ORDER,
        "{order}"
    );
    for ep in endpoints(order) {
        assert_eq!(ep["labels"]["version"], "1.0.0", "{ep}");
        assert_eq!(ep["labels"]["application"], "orders", "{ep}");
        assert!(ep["labels"].get("methods").is_none(), "{ep}");
    }
    let waiter = item(&items, WAITER_ITEM).expect("waiter-service");
    assert_eq!(waiter["spec"]["hosts"][0], "waiter-service.zookeeper");
    assert_eq!(waiter["spec"]["ports"][0]["name"], "http-8080");
    assert_eq!(waiter["spec"]["ports"][0]["protocol"], "HTTP");
    assert_eq!(endpoints(waiter)[0]["labels"]["zone"], "a");
    let waiter_version = version_of(&items, WAITER_ITEM);

    // A version bump: the provider re-registers under a new URL; the host stays, the label
    // changes (a DestinationRule subset on `version` follows it).
    w.delete(&v2);
    w.create_e(&provider_path(ORDER, &dubbo_url("10.9.0.2", "1.1.0")), "");
    let items = adsc.wait_items("version bump", |items| {
        item(items, ORDER_ITEM).is_some_and(|o| {
            endpoints(o)
                .iter()
                .any(|e| e["address"] == "10.9.0.2" && e["labels"]["version"] == "1.1.0")
        })
    });
    assert_eq!(items.len(), 2, "a version bump renames nothing: {items:?}");
    assert_eq!(
        version_of(&items, WAITER_ITEM),
        waiter_version,
        "the other service is untouched"
    );

    // Every provider leaves; the interface's `providers` directory stays: kept, no endpoints.
    w.delete(&v1);
    w.delete(&provider_path(ORDER, &dubbo_url("10.9.0.2", "1.1.0")));
    let items = adsc.wait_items("order service without providers", |items| {
        item(items, ORDER_ITEM).is_some_and(|o| endpoints(o).is_empty())
    });
    let order = item(&items, ORDER_ITEM).expect("kept");
    assert_eq!(
        order["spec"]["ports"][0]["name"], "tcp-20880",
        "its port stays while it is empty"
    );
    adsc.assert_no_errors();
}

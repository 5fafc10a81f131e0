//! The whole chain with Istio's real, unmodified istiod (`pilot-discovery`): real Consul,
//! ZooKeeper (a Dubbo provider), Eureka, Nacos (the real 2.4.3) and Kubernetes API server, a ServiceEntry
//! file, each read by its adapter with default flags, and istiod reading all six adapters through
//! `configSources: xds://...`. istiod stores every ServiceEntry (its memory store validates each
//! one), shows their services in the External registry with their endpoints, follows changes in
//! Consul, Nacos and Kubernetes, and logs no rejection of our config.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::consul::{Consul, Registration};
use e2e::eureka::{Eureka, Instance};
use e2e::istiod::{configz_entries, configz_service_entries, Istiod};
use e2e::kube::{ready, service, slice, KubeApiServer};
use e2e::nacos::Nacos;
use e2e::zookeeper::{provider_path, Writer, ZooKeeper};
use e2e::{endpoint_addresses, find, item_names, ns_name, wait_for, Adapter};

const GREETER: &str = "com.example.greeter";
const INVENTORY: &str = "inventory.default-group.public";
const STOCK: &str = "com.example.stock.dubbo.public";

const FILE_SE: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: ext}
spec:
  hosts: [billing.example.com]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 443, name: https, protocol: HTTPS}]
  endpoints: [{address: 192.0.2.10}, {address: 192.0.2.11}]
";

/// What an adapter serves (through mcpctl, as any sink sees it), once `pred` holds.
fn served(what: &str, a: &Adapter, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    e2e::wait_served(Duration::from_secs(60), what, &a.xds_url(), pred)
}

/// The ServiceEntry `name` (`namespace/name`) in istiod's /debug/configz.
fn configz_entry<'a>(configz: &'a Value, name: &str) -> Option<&'a Value> {
    configz_entries(configz).find(|c| ns_name(c) == name)
}

/// shop/web's one EndpointSlice, with a ready endpoint at each of `ips`.
fn web_pods(ips: &[&str]) -> Value {
    let endpoints = ips.iter().map(|ip| ready(ip)).collect();
    slice("shop", "web-1", "web", "IPv4", &[("http", 8080)], endpoints)
}

/// The registries istiod's /debug/registryz names for `host` in `namespace`.
fn registries_of(registryz: &Value, host: &str, namespace: &str) -> Vec<String> {
    registryz
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["hostname"] == host && s["Attributes"]["Namespace"] == namespace)
                .filter_map(|s| s["Attributes"]["ServiceRegistry"].as_str())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The endpoint addresses istiod holds for `host`/`namespace` from the External (ServiceEntry)
/// registry in /debug/endpointShardz, sorted.
fn external_endpoints(shardz: &Value, host: &str, namespace: &str) -> Vec<String> {
    let mut v: Vec<String> = shardz[host][namespace]["Shards"]
        .as_object()
        .map(|shards| {
            shards
                .iter()
                .filter(|(k, _)| k.starts_with("External/"))
                .flat_map(|(_, eps)| eps.as_array().cloned().unwrap_or_default())
                .flat_map(|ep| ep["Addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// (namespace/name, namespace, first host) of every item an adapter serves.
fn entries(items: &[Value]) -> Vec<(String, String, String)> {
    items
        .iter()
        .map(|i| {
            let ns = i["metadata"]["namespace"].as_str().unwrap_or("");
            let host = i["spec"]["hosts"][0].as_str().unwrap_or("");
            (ns_name(i), ns.to_string(), host.to_string())
        })
        .collect()
}

#[test]
#[ignore = "needs pilot-discovery, kube-apiserver, consul, zookeeper, eureka and Nacos: tests/go-peers/build.sh target; tests/consul/build.sh target/consul; scripts/install-zookeeper.sh; tests/eureka/build.sh target/eureka; tests/nacos/build.sh target/nacos"]
fn istiod_accepts_what_every_adapter_serves_and_follows_changes() {
    let started = Instant::now();

    // Kubernetes: one Service with one EndpointSlice in `shop`.
    let kube = KubeApiServer::start();
    kube.namespace("shop");
    kube.namespace("istio-system");
    kube.apply_service(&service("shop", "web", &[("http", 80, 8080)]));
    kube.apply_slice(&web_pods(&["10.1.0.1", "10.1.0.2"]));

    // Consul: one service with two passing instances.
    let consul = Consul::start(None);
    for (id, ip) in [("payments-1", "10.0.0.1"), ("payments-2", "10.0.0.2")] {
        consul.register(&Registration::new("n1", "payments", id, ip, 8080).protocol("http"));
    }

    // ZooKeeper: one Dubbo provider.
    let zk = ZooKeeper::start();
    let mut writer = Writer::start(&zk);
    writer.create_e(
        &provider_path(
            GREETER,
            &format!("dubbo://10.2.0.1:20880/{GREETER}?application=demo&interface={GREETER}&methods=sayHi&side=provider&dubbo=2.0.2"),
        ),
        "",
    );

    // Eureka: one app with two UP instances.
    let eureka = Eureka::start();
    for (id, ip) in [("orders-1", "10.4.0.1"), ("orders-2", "10.4.0.2")] {
        eureka.register(&Instance::new("orders", id, ip, 8080));
    }

    // Nacos: an HTTP service with two instances, and a Dubbo (TCP) one, which gets a VIP.
    let nacos = Nacos::start(e2e::nacos::Version::V2);
    for ip in ["10.6.0.1", "10.6.0.2"] {
        nacos.register(
            &e2e::nacos::Instance::new("inventory", ip, 8080).with_metadata("version", "v1"),
        );
    }
    nacos.register(
        &e2e::nacos::Instance::new("com.example.Stock", "10.6.1.1", 20880)
            .group("DUBBO")
            .with_metadata("protocol", "dubbo"),
    );

    // A ServiceEntry file.
    let files = tempfile::tempdir().expect("tempdir");
    std::fs::write(files.path().join("billing.yaml"), FILE_SE).expect("write SE file");
    let files_path = files.path().display().to_string();

    // Each adapter with default flags, ready and serving its registry.
    let consul_addr = consul.addr();
    let kubeconfig = kube.kubeconfig().display().to_string();
    let zk_servers = zk.servers();
    let a_consul = Adapter::start("adapter-consul", &["--consul-addr", consul_addr.as_str()]);
    let a_zk = Adapter::start("adapter-zookeeper", &["--zk-servers", zk_servers.as_str()]);
    let a_file = Adapter::start("adapter-file", &["--path", files_path.as_str()]);
    let a_kube = Adapter::start("adapter-kube", &["--kubeconfig", kubeconfig.as_str()]);
    let eureka_url = eureka.url();
    let a_eureka = Adapter::start("adapter-eureka", &["--eureka-url", eureka_url.as_str()]);
    let nacos_addr = nacos.server_addr();
    let a_nacos = Adapter::start("adapter-nacos", &["--nacos-addr", nacos_addr.as_str()]);
    for a in [&a_consul, &a_zk, &a_file, &a_kube, &a_eureka, &a_nacos] {
        a.wait_ready();
    }
    let consul_items = served("consul payments x2", &a_consul, |i| {
        find(i, "payments").is_some_and(|p| endpoint_addresses(p).len() == 2)
    });
    let zk_items = served("zookeeper greeter", &a_zk, |i| find(i, GREETER).is_some());
    let file_items = served("file billing", &a_file, |i| find(i, "billing").is_some());
    let eureka_items = served("eureka orders x2", &a_eureka, |i| {
        find(i, "orders").is_some_and(|o| endpoint_addresses(o).len() == 2)
    });
    let nacos_items = served("nacos inventory x2 and the Dubbo service", &a_nacos, |i| {
        find(i, INVENTORY).is_some_and(|o| endpoint_addresses(o).len() == 2)
            && find(i, STOCK).is_some()
    });
    let stock = find(&nacos_items, STOCK).expect("stock");
    assert_eq!(stock["spec"]["ports"][0]["protocol"], "TCP");
    assert!(
        stock["spec"]["addresses"][0]
            .as_str()
            .is_some_and(|a| a.starts_with("242.6.")),
        "a TCP service gets a VIP from adapter-nacos' range: {stock}"
    );
    let inventory = find(&nacos_items, INVENTORY).expect("inventory");
    let inventory_host = inventory["spec"]["hosts"][0]
        .as_str()
        .expect("host")
        .to_string();
    let kube_items = served("kube shop/web x2", &a_kube, |i| {
        i.iter()
            .any(|w| w["metadata"]["namespace"] == "shop" && endpoint_addresses(w).len() == 2)
    });
    let payments = find(&consul_items, "payments").expect("payments");
    let payments_ns = payments["metadata"]["namespace"]
        .as_str()
        .expect("namespace")
        .to_string();
    let payments_host = payments["spec"]["hosts"][0]
        .as_str()
        .expect("host")
        .to_string();
    let web = kube_items
        .iter()
        .find(|w| w["metadata"]["namespace"] == "shop" && w["metadata"]["name"] == "web")
        .expect("shop/web served by adapter-kube");
    let web_host = web["spec"]["hosts"][0].as_str().expect("host").to_string();
    eprintln!(
        "adapters serve: consul {:?}, zookeeper {:?}, file {:?}, kube {:?}, eureka {:?}, nacos {:?} ({:?} since start)",
        item_names(&consul_items),
        item_names(&zk_items),
        item_names(&file_items),
        item_names(&kube_items),
        item_names(&eureka_items),
        item_names(&nacos_items),
        started.elapsed()
    );

    // istiod, after every source is up (one that is down at its start makes it exit).
    let t = Instant::now();
    let istiod = Istiod::start(
        &[
            a_consul.grpc,
            a_zk.grpc,
            a_file.grpc,
            a_kube.grpc,
            a_eureka.grpc,
            a_nacos.grpc,
        ],
        &kube.kubeconfig(),
    );
    eprintln!("istiod ready in {:?}", t.elapsed());
    let log = istiod.log();
    for a in [&a_consul, &a_zk, &a_file, &a_kube, &a_eureka, &a_nacos] {
        let line = format!("Started XDS configSource xds://{}", a.grpc);
        assert!(
            log.contains(&line),
            "istiod did not log {line:?}:\n{}",
            istiod.log_tail(60)
        );
    }

    // 1. Every ServiceEntry of every adapter is in istiod's config store, with the same hosts,
    // and its service is in the External registry.
    let all: Vec<(String, String, String)> = [
        &consul_items,
        &zk_items,
        &file_items,
        &kube_items,
        &eureka_items,
        &nacos_items,
    ]
    .into_iter()
    .flat_map(|items| entries(items))
    .collect();
    // No `k8s://` source: configz holds exactly what the adapters serve, nothing dropped.
    let mut want: Vec<String> = all.iter().map(|(n, _, _)| n.clone()).collect();
    want.sort();
    let configz = wait_for(Duration::from_secs(30), "configz has every entry", || {
        let c = istiod.debug("configz");
        (configz_service_entries(&c) == want).then_some(c)
    });
    for items in [
        &consul_items,
        &zk_items,
        &file_items,
        &kube_items,
        &eureka_items,
        &nacos_items,
    ] {
        for (item, (n, ns, host)) in items.iter().zip(entries(items)) {
            let e = configz_entry(&configz, &n).expect("in configz");
            assert_eq!(e["metadata"]["namespace"], json!(ns), "{n}");
            assert_eq!(e["spec"]["hosts"][0], json!(host), "{n} in configz: {e}");
            // The whole spec, as istiod stored it, is what the adapter served.
            assert_eq!(
                e["spec"], item["spec"],
                "{n}: istiod's spec vs the adapter's"
            );
        }
    }
    eprintln!(
        "configz ServiceEntries: {:?}",
        configz_service_entries(&configz)
    );
    let registryz = wait_for(Duration::from_secs(30), "registryz has every host", || {
        let r = istiod.debug("registryz");
        all.iter()
            .all(|(_, ns, host)| registries_of(&r, host, ns).iter().any(|x| x == "External"))
            .then_some(r)
    });
    for (n, ns, host) in &all {
        eprintln!(
            "registryz {host} ({n}): {:?}",
            registries_of(&registryz, host, ns)
        );
    }

    // 2. The Consul service's two instances are istiod's endpoints.
    wait_for(
        Duration::from_secs(30),
        "consul endpoints in istiod",
        || {
            let s = istiod.debug("endpointShardz");
            (external_endpoints(&s, &payments_host, &payments_ns) == ["10.0.0.1", "10.0.0.2"])
                .then_some(())
        },
    );
    wait_for(Duration::from_secs(30), "kube endpoints in istiod", || {
        let s = istiod.debug("endpointShardz");
        (external_endpoints(&s, &web_host, "shop") == ["10.1.0.1", "10.1.0.2"]).then_some(())
    });

    wait_for(Duration::from_secs(30), "nacos endpoints in istiod", || {
        let s = istiod.debug("endpointShardz");
        (external_endpoints(&s, &inventory_host, "nacos") == ["10.6.0.1", "10.6.0.2"]).then_some(())
    });

    // 3. Changes reach istiod: an instance deregistered in Consul and in Nacos, a pod replaced
    // in Kubernetes (only the External shard counts: istiod's own Kubernetes registry reads the
    // same slice).
    let t = Instant::now();
    consul.deregister("n1", "payments-2");
    nacos.deregister(&e2e::nacos::Instance::new("inventory", "10.6.0.2", 8080));
    kube.apply_slice(&web_pods(&["10.1.0.2", "10.1.0.3"]));
    wait_for(Duration::from_secs(30), "changes in istiod", || {
        let s = istiod.debug("endpointShardz");
        (external_endpoints(&s, &payments_host, &payments_ns) == ["10.0.0.1"]
            && external_endpoints(&s, &inventory_host, "nacos") == ["10.6.0.1"]
            && external_endpoints(&s, &web_host, "shop") == ["10.1.0.2", "10.1.0.3"])
        .then_some(())
    });
    eprintln!("changes reached istiod in {:?}", t.elapsed());

    // 4. istiod rejected nothing: its MCP client received ServiceEntries and logged no
    // warning or error (a resource it cannot unmarshal, convert or store — the store
    // validates — is logged as a warning by the `adsc` scope and dropped).
    let log = istiod.log();
    let received = log
        .lines()
        .filter(|l| l.contains("\tadsc\tReceived") && l.contains("ServiceEntry"))
        .count();
    assert!(
        received >= 6,
        "istiod logged {received} ServiceEntry responses:\n{}",
        istiod.log_tail(60)
    );
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| {
            let level_scope = l.split('\t').skip(1).take(2).collect::<Vec<_>>();
            matches!(level_scope.first(), Some(&"warn") | Some(&"error"))
                && matches!(
                    level_scope.get(1),
                    Some(&"adsc") | Some(&"serviceentry") | Some(&"model")
                )
        })
        .chain(log.lines().filter(|l| {
            let lower = l.to_lowercase();
            lower.contains("serviceentry")
                && (lower.contains("invalid")
                    || lower.contains("rejected")
                    || lower.contains("nack")
                    || lower.contains("failed to convert"))
        }))
        .collect();
    assert!(bad.is_empty(), "istiod complained:\n{}", bad.join("\n"));
    eprintln!("whole chain in {:?}", started.elapsed());
}

//! The registry decoders' fuzz seeds (fuzz/seeds/<target>/), captured from the real peers: each
//! registry started as the other tests start it, with services registered the way they do, and
//! the raw answers the adapters would read kept as they came (HTTP bodies; ZooKeeper's node names
//! and data as read back from the server).
//!
//! Every capture is checked to decode and convert through the same public functions the fuzz
//! targets call, so a seed is never one the adapters reject at the first byte. With
//! `FUZZ_SEEDS_OUT=dir` the captures are also written to `dir/<target>/<name>`.
//!
//! Nacos' gRPC payloads are not captured off the wire (that needs a connection set up over the
//! bi-stream before any subscription answers): the pushes and answers are built with the
//! adapter's own `Payload::new` around the server's HTTP instance lists and service names, which
//! carry the same `ServiceInfo` JSON. ZooKeeper's Dubbo providers are written as the other tests
//! write them, plus one built from what the real Dubbo 3 provider registered in Nacos (its URL
//! parameters and its application-level metadata).

use std::path::PathBuf;
use std::time::Duration;

use adapter_nacos::convert::{convert_service, ServiceId};
use adapter_nacos::dto::{AdminServicePage, CatalogPage, Namespaces, ServiceInfo};
use adapter_nacos::http::{decode, namespace_ids, ListingApi, Page};
use adapter_nacos::names::Names;
use adapter_nacos::wire::Payload;
use e2e::consul::{Consul, Registration};
use e2e::eureka::{Eureka, Instance as EurekaInstance};
use e2e::nacos::{Instance as NacosInstance, Nacos, Version};
use e2e::nacos_clients::{DubboMode, DubboProvider};
use e2e::zookeeper::{provider_path, ZooKeeper};
use prost::Message;
use serde_json::{json, Value};

/// Writes `bytes` as seed `name` of `target` when `FUZZ_SEEDS_OUT` is set.
fn save(target: &str, name: &str, bytes: &[u8]) {
    let Some(dir) = std::env::var_os("FUZZ_SEEDS_OUT") else {
        return;
    };
    let dir = PathBuf::from(dir).join(target);
    std::fs::create_dir_all(&dir).expect("seed dir");
    std::fs::write(dir.join(name), bytes).expect("seed file");
}

/// `parts` joined as the multi-part targets read them (NUL-separated).
fn joined(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&0u8)
}

#[test]
#[ignore = "needs consul: scripts/install-consul.sh"]
fn consul_answers() {
    use adapter_consul::client::{decode, CheckState, NodeServices, NodeState, HEALTH};
    use adapter_consul::convert::{convert, ConvertSettings, HealthEntry};

    let consul = Consul::start(None);
    let regs = [
        Registration::new("node-a", "web", "web-1", "10.0.0.1", 8080)
            .tags(&["v1", "zone|a"])
            .protocol("http"),
        Registration::new("node-b", "web", "web-2", "10.0.0.2", 8080)
            .tags(&["v2"])
            .meta("version", "2")
            .status("warning"),
        Registration::new("node-b", "web", "web-3", "", 8443).status("critical"),
        Registration::new("node-a", "orders", "orders-1", "10.0.1.1", 9090).protocol("grpc"),
        Registration::new("node-a", "db", "db-1", "10.0.2.1", 5432)
            .meta("external", "true")
            .tags(&["primary"]),
    ];
    for r in &regs {
        consul.register(r);
    }
    let settings = ConvertSettings {
        include_warning: false,
        tags: Vec::new(),
        default_protocol: None,
        host_datacenter: false,
    };
    for name in ["web", "orders", "db"] {
        let body = consul.must("GET", &format!("/v1/health/service/{name}"), "");
        let entries: Vec<HealthEntry> = decode(HEALTH, body.as_bytes()).expect("health answer");
        assert!(!entries.is_empty(), "{name}: {body}");
        let c = convert(name, &entries, &settings);
        let s = c
            .service
            .unwrap_or_else(|| panic!("{name} converts: {body}"));
        assert!(!s.endpoints.is_empty(), "{name}: {s:?}");
        save(
            "consul_health",
            &format!("health-{name}.json"),
            body.as_bytes(),
        );
    }
    let services = consul.must("GET", "/v1/catalog/services", "");
    let list: std::collections::BTreeMap<String, Vec<String>> =
        decode("/v1/catalog/services", services.as_bytes()).expect("services");
    assert!(list.contains_key("web"), "{services}");
    save("consul_catalog", "services.json", services.as_bytes());
    let nodes = consul.must("GET", "/v1/catalog/nodes", "");
    let n: Vec<NodeState> = decode("/v1/catalog/nodes", nodes.as_bytes()).expect("nodes");
    assert!(n.iter().any(|n| n.node == "node-a"), "{nodes}");
    save("consul_catalog", "nodes.json", nodes.as_bytes());
    let checks = consul.must("GET", "/v1/health/state/any", "");
    let c: Vec<CheckState> = decode("/v1/health/state/any", checks.as_bytes()).expect("checks");
    assert!(c.iter().any(|c| c.status == "critical"), "{checks}");
    save("consul_catalog", "checks.json", checks.as_bytes());
    let node = consul.must("GET", "/v1/catalog/node-services/node-a", "");
    let ns: NodeServices = decode("node-services", node.as_bytes()).expect("node services");
    assert!(ns.names().contains(&"web".to_string()), "{node}");
    save("consul_catalog", "node-services.json", node.as_bytes());
}

#[test]
#[ignore = "needs the Eureka server: EUREKA_JAR"]
fn eureka_answers() {
    use adapter_eureka::convert::convert_app;
    use adapter_eureka::dto::decode;
    use adapter_eureka::state::LocalRegistry;

    let eureka = Eureka::start();
    eureka.register(&EurekaInstance::new("orders", "orders-1", "10.0.0.1", 8080));
    eureka.register(
        &EurekaInstance::new("orders", "orders-2", "10.0.0.2", 8080)
            .with_metadata("protocol", "grpc")
            .with_metadata("zone", "a"),
    );
    eureka.register(&EurekaInstance::new(
        "billing",
        "billing-1",
        "10.0.1.1",
        9090,
    ));
    let full = |eureka: &Eureka| {
        e2e::settle(Duration::from_secs(30), "3 instances in /apps", || {
            let (status, body) = eureka.call("GET", "/apps", "");
            let apps = decode(body.as_bytes()).map_err(|e| format!("{status} {e}: {body}"))?;
            let n: usize = apps.application.iter().map(|a| a.instance.len()).sum();
            if n == 3 {
                Ok(body)
            } else {
                Err(body)
            }
        })
    };
    let before = full(&eureka);
    let local = LocalRegistry::from_full(decode(before.as_bytes()).expect("full"));
    for name in local.app_names() {
        let insts = local.app(name).expect("app");
        assert!(convert_app(name, insts).service.is_some(), "{name}");
    }
    save("eureka_full", "apps.json", before.as_bytes());

    // Changes the next delta holds: one instance gone, one down, one new, metadata changed.
    eureka.deregister("billing", "billing-1");
    eureka.set_status("orders", "orders-2", "DOWN");
    eureka.set_metadata("orders", "orders-1", "version", "2");
    eureka.register(&EurekaInstance::new(
        "payments",
        "payments-1",
        "10.0.2.1",
        7070,
    ));
    let delta = e2e::settle(
        Duration::from_secs(30),
        "the changes in /apps/delta",
        || {
            let (status, body) = eureka.call("GET", "/apps/delta", "");
            let d = decode(body.as_bytes()).map_err(|e| format!("{status} {e}: {body}"))?;
            let n: usize = d.application.iter().map(|a| a.instance.len()).sum();
            if n >= 4 {
                Ok(body)
            } else {
                Err(body)
            }
        },
    );
    let mut patched = local.clone();
    let touched = patched.apply_delta(decode(delta.as_bytes()).expect("delta"));
    assert!(touched.contains("PAYMENTS"), "{touched:?}: {delta}");
    assert!(patched.app("BILLING").is_none(), "{delta}");
    let after = full(&eureka);
    let server = decode(after.as_bytes()).expect("full after");
    assert_eq!(
        Some(patched.reconcile_hash()),
        server.apps_hashcode,
        "the delta patched the copy into the server's registry"
    );
    save("eureka_full", "apps-after.json", after.as_bytes());
    save("eureka_delta", "delta.json", delta.as_bytes());
    save(
        "eureka_delta",
        "full-then-delta",
        &joined(&[before.as_bytes(), delta.as_bytes()]),
    );
}

/// One Nacos server's answers: namespaces, service pages, instance lists (as gRPC payloads),
/// error bodies; `dubbo` the provider's services when it runs.
fn nacos_answers(version: Version, with_dubbo: bool) -> Vec<(ServiceId, Value)> {
    let nacos = Nacos::start(version);
    let tag = match version {
        Version::V2 => "v2",
        Version::V3 => "v3",
    };
    let insts = [
        NacosInstance::new("orders", "10.0.0.1", 8080).with_metadata("protocol", "http"),
        NacosInstance::new("orders", "10.0.0.2", 8080)
            .weight(2.0)
            .cluster("east")
            .with_metadata("version", "v2"),
        NacosInstance::new("orders", "10.0.0.3", 8080).enabled(false),
        NacosInstance::new("billing", "10.0.1.1", 9090).group("PAY"),
    ];
    for i in &insts {
        nacos.register(i);
    }
    let _provider = with_dubbo.then(|| {
        DubboProvider::start(
            &nacos,
            None,
            DubboMode::All,
            "greeter-app",
            "127.0.0.1",
            free_port(),
            free_port(),
        )
    });
    let api = match version {
        Version::V2 => ListingApi::Console,
        Version::V3 => ListingApi::Admin,
    };
    let (status, body) = nacos.call("GET", api.namespaces_path(), &[]);
    assert_eq!(status, 200, "{body}");
    let ns: Namespaces = decode(body.as_bytes()).expect("namespaces");
    assert!(namespace_ids(ns).contains(&"public".to_string()), "{body}");
    save(
        "nacos_http",
        &format!("namespaces-{tag}.json"),
        body.as_bytes(),
    );

    let mut query = vec![
        ("namespaceId", "public".to_string()),
        ("pageNo", "1".to_string()),
        ("pageSize", "100".to_string()),
        ("withInstances", "false".to_string()),
    ];
    // With the provider: its application and its interface too.
    let want = if with_dubbo { 4 } else { 2 };
    let page = e2e::settle(Duration::from_secs(60), "the services listed", || {
        let mut q = query.clone();
        q.push(match api {
            ListingApi::Console => ("hasIpCount", "false".to_string()),
            ListingApi::Admin => ("ignoreEmptyService", "false".to_string()),
        });
        let (status, body) = nacos.call("GET", api.services_path(), &q);
        let page = match api {
            ListingApi::Console => decode::<CatalogPage>(body.as_bytes())
                .map(|p| Page::console(&p))
                .map_err(|e| e.to_string()),
            ListingApi::Admin => decode::<AdminServicePage>(body.as_bytes())
                .map_err(|e| e.to_string())
                .and_then(Page::admin),
        }
        .map_err(|e| format!("{status} {e}: {body}"))?;
        if page.names.len() >= want {
            Ok((page, body))
        } else {
            Err(body)
        }
    });
    save(
        "nacos_http",
        &format!("services-{tag}.json"),
        page.1.as_bytes(),
    );
    query.truncate(1);

    // Errors: a path the server does not serve, and a refused request (no token where one is
    // needed, or a bad parameter).
    for (name, path) in [
        ("not-found", "/nacos/v1/ns/nothing-here"),
        ("bad-request", "/nacos/v1/ns/instance/list"),
    ] {
        let (status, body) = nacos.call("GET", path, &[]);
        assert!(status >= 400, "{path}: {status} {body}");
        let _ = adapter_nacos::http::error_message(body.as_bytes());
        save(
            "nacos_http",
            &format!("error-{name}-{tag}.json"),
            body.as_bytes(),
        );
    }

    // Each service's instance list: the `ServiceInfo` JSON the server pushes over gRPC.
    let mut infos = Vec::new();
    let ids: Vec<ServiceId> = page
        .0
        .names
        .iter()
        .map(|(g, n)| ServiceId::new("public", g, n))
        .collect();
    let names = Names::assign(&ids);
    for id in &ids {
        let list = e2e::settle(Duration::from_secs(30), "instances listed", || {
            let v = nacos.list(&id.name, &id.group, "public");
            if v["hosts"].as_array().is_some_and(|h| !h.is_empty()) {
                Ok(v)
            } else {
                Err(v.to_string())
            }
        });
        let info: ServiceInfo = serde_json::from_value(list.clone()).expect("instance list");
        assert!(info.hosts.iter().all(Result::is_ok), "{list}");
        let c = convert_service(id, names.get(id).expect("named"), &info);
        assert!(c.service.is_some(), "{id}: {list}");
        infos.push((id.clone(), list));
    }
    infos
}

/// The gRPC payloads a server sends, around `info` (an instance list).
fn grpc_seeds(tag: &str, i: usize, info: &Value) {
    use adapter_nacos::dto::{ResponseBody, ServerRequest};
    let push = Payload::new(
        "NotifySubscriberRequest",
        &json!({"requestId": i.to_string(), "module": "naming", "headers": {}, "serviceInfo": info}),
        &Default::default(),
    );
    let answer = Payload::new(
        "SubscribeServiceResponse",
        &json!({"resultCode": 200, "errorCode": 0, "success": true, "requestId": "1", "serviceInfo": info}),
        &Default::default(),
    );
    for (kind, p) in [("push", push), ("subscribe", answer)] {
        let bytes = p.encode_to_vec();
        let back = Payload::decode(bytes.as_slice()).expect("payload");
        let info = match kind {
            "push" => ServerRequest::parse(back.json())
                .expect("push")
                .service_info
                .expect("service")
                .expect("readable"),
            _ => back
                .parse::<ResponseBody>("SubscribeServiceRequest")
                .expect("answer")
                .service_info
                .expect("service"),
        };
        assert!(!info.hosts.is_empty());
        save("nacos_grpc", &format!("{kind}-{tag}-{i}.pb"), &bytes);
    }
}

#[test]
#[ignore = "needs Nacos 2.4.3 and 3.0.3 (tests/nacos/build-server.sh) and the Dubbo provider"]
fn nacos_answers_both_versions() {
    for (version, tag) in [(Version::V2, "v2"), (Version::V3, "v3")] {
        let infos = nacos_answers(version, version == Version::V2);
        for (i, (_, info)) in infos.iter().enumerate() {
            grpc_seeds(tag, i, info);
        }
        let names: Vec<&str> = infos.iter().map(|(id, _)| id.name.as_str()).collect();
        let list = Payload::new(
            "ServiceListResponse",
            &json!({"resultCode": 200, "errorCode": 0, "count": names.len(), "serviceNames": names}),
            &Default::default(),
        );
        save(
            "nacos_grpc",
            &format!("service-list-{tag}.pb"),
            &list.encode_to_vec(),
        );
    }
}

/// The Dubbo provider's registrations in Nacos, as it would write them to ZooKeeper: its
/// interface-level instances' parameters as provider URLs, its application-level instance as the
/// Curator JSON Dubbo's `ZookeeperInstance` is.
fn dubbo_to_zookeeper(infos: &[(ServiceId, Value)]) -> DubboNodes {
    let mut urls = Vec::new();
    let mut apps = Vec::new();
    for (id, info) in infos {
        for h in info["hosts"].as_array().into_iter().flatten() {
            let meta = &h["metadata"];
            let (ip, port) = (h["ip"].as_str().unwrap_or_default(), &h["port"]);
            if let Some(iface) = meta["interface"].as_str() {
                let proto = meta["protocol"].as_str().unwrap_or("dubbo");
                let mut params: Vec<String> = meta
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
                    .collect();
                params.sort();
                urls.push((
                    iface.to_string(),
                    format!("{proto}://{ip}:{port}/{iface}?{}", params.join("&")),
                ));
            } else if meta.get("dubbo.endpoints").is_some() {
                let app = id.name.clone();
                let id = format!("{ip}:{port}");
                apps.push((
                    app.clone(),
                    id.clone(),
                    json!({"name": app, "id": id, "address": ip, "port": port, "sslPort": null,
                           "payload": {"@class": "org.apache.dubbo.registry.zookeeper.ZookeeperInstance",
                                       "id": id, "name": app, "metadata": meta},
                           "registrationTimeUTC": 1674960781893u64, "serviceType": "DYNAMIC", "uriSpec": null})
                    .to_string(),
                ));
            }
        }
    }
    assert!(
        !urls.is_empty(),
        "no interface-level registration: {infos:?}"
    );
    assert!(
        !apps.is_empty(),
        "no application-level registration: {infos:?}"
    );
    (urls, apps)
}

/// `(interface, provider URL)`s and `(application, instance id, instance JSON)`s.
type DubboNodes = (Vec<(String, String)>, Vec<(String, String, String)>);

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A ZooKeeper client that ignores events.
struct Quiet;
impl zookeeper_async::Watcher for Quiet {
    fn handle(&self, _: zookeeper_async::WatchedEvent) {}
}

#[test]
#[ignore = "needs zookeeper (scripts/install-zookeeper.sh), Nacos 2.4.3 and the Dubbo provider"]
fn zookeeper_nodes() {
    use adapter_zookeeper::assemble::assemble;
    use adapter_zookeeper::convert::{convert_curator, convert_dubbo};
    use adapter_zookeeper::filter::Filters;
    use adapter_zookeeper::DubboDiscovery;

    // The real Dubbo provider's registrations, from Nacos.
    let (dubbo_urls, dubbo_apps) = dubbo_to_zookeeper(&nacos_answers(Version::V2, true));

    let (zk, mut w) = ZooKeeper::start_with_writer();
    const GREETER: &str = "com.example.greeter";
    let url = |ip: &str, extra: &str| {
        format!("dubbo://{ip}:20880/{GREETER}?application=demo&interface={GREETER}&methods=sayHi,sayBye&side=provider&dubbo=2.0.2&release=3.1.4{extra}")
    };
    w.create_e(&provider_path(GREETER, &url("10.0.0.1", "")), "");
    w.create_e(
        &provider_path(
            GREETER,
            &url("10.0.0.2", "&version=1.0.0&group=blue&weight=50"),
        ),
        "",
    );
    w.create_e(
        &provider_path(GREETER, &url("10.0.0.3", "&enabled=false")),
        "",
    );
    let mut ifaces = vec![GREETER.to_string()];
    for (iface, u) in &dubbo_urls {
        w.create_e(&provider_path(iface, u), "");
        ifaces.push(iface.clone());
    }
    ifaces.sort();
    ifaces.dedup();
    let spring = r#"{"name":"waiter-service","id":"x","address":"10.1.0.1","port":8080,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"waiter-service","name":"waiter-service","metadata":{"instance_status":"UP","zone":"a"}},"registrationTimeUTC":1618899361271,"serviceType":"DYNAMIC","uriSpec":null}"#;
    w.create_e("/services/waiter-service/b1fdcb1e", spring);
    let mut services = vec!["waiter-service".to_string()];
    for (app, id, data) in &dubbo_apps {
        w.create_e(&format!("/services/{app}/{id}"), data);
        services.push(app.clone());
    }
    services.sort();
    services.dedup();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (providers, instances) = rt.block_on(async {
        let c = zookeeper_async::ZooKeeper::connect(&zk.servers(), Duration::from_secs(10), Quiet)
            .await
            .expect("zk client");
        let mut providers = Vec::new();
        for iface in &ifaces {
            let mut kids = c
                .get_children(&format!("/dubbo/{iface}/providers"), false)
                .await
                .expect("providers");
            kids.sort();
            providers.push((iface.clone(), kids));
        }
        let mut instances = Vec::new();
        for s in &services {
            let mut kids = c
                .get_children(&format!("/services/{s}"), false)
                .await
                .expect("instances");
            kids.sort();
            let mut data = Vec::new();
            for k in kids {
                let (d, _) = c
                    .get_data(&format!("/services/{s}/{k}"), false)
                    .await
                    .expect("data");
                data.push((k, d));
            }
            instances.push((s.clone(), data));
        }
        (providers, instances)
    });

    let filters = Filters::default();
    let mut dirs = Vec::new();
    let mut text = String::from("interface\n");
    for (iface, kids) in &providers {
        let c = convert_dubbo("/dubbo", iface, kids, &filters);
        let s = c.service.as_ref().expect("interface served");
        assert!(!s.endpoints.is_empty(), "{iface}: {:?}", c.problems);
        let mut parts: Vec<&[u8]> = vec![iface.as_bytes()];
        parts.extend(kids.iter().map(|k| k.as_bytes()));
        let seed = if iface == GREETER {
            "greeter".to_string()
        } else {
            format!("dubbo-{}", dirs.len())
        };
        save("zk_dubbo_url", &seed, &joined(&parts));
        text.push_str(&format!("D {iface}\n"));
        for k in kids {
            text.push_str(&format!("P {k}\n"));
        }
        dirs.push((format!("/dubbo/{iface}/providers"), c));
    }
    for (name, data) in &instances {
        let c = convert_curator(
            "/services",
            name,
            data.iter().map(|(id, d)| (id.as_str(), d.as_slice())),
        );
        let s = c.service.as_ref().expect("service served");
        assert!(!s.endpoints.is_empty(), "{name}: {:?}", c.problems);
        let mut parts: Vec<&[u8]> = vec![name.as_bytes()];
        for (id, d) in data {
            parts.push(id.as_bytes());
            parts.push(d);
        }
        save("zk_curator", name, &joined(&parts));
        text.push_str(&format!("A {name}\n"));
        for (id, d) in data {
            let json = String::from_utf8_lossy(d);
            assert!(!json.contains('\n'), "one line: {json}");
            text.push_str(&format!("I {id} {json}\n"));
        }
        dirs.push((format!("/services/{name}"), c));
    }
    for mode in [
        DubboDiscovery::Interface,
        DubboDiscovery::Application,
        DubboDiscovery::Both,
    ] {
        let a = assemble(
            dirs.iter().map(|(scope, c)| (scope.as_str(), c, None)),
            mode,
            &Default::default(),
        );
        assert!(a.services.len() >= 2, "{mode:?}: {:?}", a.problems);
    }
    save("zk_dubbo3_metadata", "interface", text.as_bytes());
    for mode in ["application", "both"] {
        let t = text.replacen("interface", mode, 1);
        save("zk_dubbo3_metadata", mode, t.as_bytes());
    }
}

//! adapter-zookeeper against a real ZooKeeper server (Debian's package, installed by
//! scripts/install-zookeeper.sh), observed through mcpctl as a sink sees it. Znodes are written
//! by `zk-writer` (an example of adapter-zookeeper), which holds a session so that ephemeral
//! nodes live as long as it does. The adapter runs with its default flags (`--coalesce` too)
//! unless a test is about a flag.

use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::cut_proxy::CutProxy;
use e2e::zookeeper::{adapter_pid, log_field, plain, provider_path, signal, Writer, ZooKeeper};
use e2e::{addresses_of, endpoint_addresses, find, item_names, mcpctl_get, wait_for, Adapter};

/// adapter-zookeeper on `servers` with `extra` flags and `env`, ready: it and its `xds://`
/// address.
fn adapter_on(servers: &str, extra: &[&str], env: &[(&str, &str)]) -> (Adapter, String) {
    let mut args = vec!["--zk-servers", servers];
    args.extend_from_slice(extra);
    let a = Adapter::start_with_env("adapter-zookeeper", &args, env);
    a.wait_ready();
    let xds = a.xds_url();
    (a, xds)
}

/// [`adapter_on`] `zk`, without extra environment.
fn adapter(zk: &ZooKeeper, extra: &[&str]) -> (Adapter, String) {
    adapter_on(&zk.servers(), extra, &[])
}

fn until(what: &str, xds: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    e2e::wait_served(Duration::from_secs(30), what, xds, pred)
}

fn endpoint_count(item: &Value) -> usize {
    item["spec"]["endpoints"].as_array().map_or(0, Vec::len)
}

fn dubbo_url(ip: &str, port: u16, iface: &str, extra: &str) -> String {
    format!("dubbo://{ip}:{port}/{iface}?application=demo&interface={iface}&methods=sayHi,sayBye&side=provider&dubbo=2.0.2&release=3.1.4{extra}")
}

/// The znode of a Dubbo provider of `iface` at `ip:port`, `extra` appended to its URL.
fn provider(iface: &str, ip: &str, port: u16, extra: &str) -> String {
    provider_path(iface, &dubbo_url(ip, port, iface, extra))
}

/// A persistent greeter provider at 10.0.0.1 and adapter-zookeeper (with `extra` flags)
/// serving it: it and its `xds://` address.
fn serve_greeter(zk: &ZooKeeper, w: &mut Writer, extra: &[&str]) -> (Adapter, String) {
    w.create(&provider(GREETER, "10.0.0.1", 20880, ""), "");
    let (a, xds) = adapter(zk, extra);
    until("greeter served", &xds, |i| find(i, GREETER).is_some());
    (a, xds)
}

const GREETER: &str = "com.example.greeter";

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn follows_dubbo_providers() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let p1 = provider(GREETER, "10.0.0.1", 20880, "&env=prod");
    w.create_e(&p1, "10.0.0.1");
    // Categories Dubbo also writes: never services.
    w.create(&format!("/dubbo/{GREETER}/consumers"), "");
    w.create("/dubbo/mapping/com.example.greeter", "demo");
    w.create("/dubbo/config/dubbo/x.configurators", "");
    let (_a, xds) = adapter(&zk, &[]);

    let items = until("greeter served", &xds, |i| find(i, GREETER).is_some());
    assert_eq!(item_names(&items), vec![format!("zookeeper/{GREETER}")]);
    let g = find(&items, GREETER).expect("greeter");
    assert_eq!(g["spec"]["hosts"][0], "com.example.greeter.zookeeper");
    assert_eq!(g["spec"]["ports"][0]["name"], "tcp-20880");
    assert_eq!(g["spec"]["ports"][0]["protocol"], "TCP");
    assert_eq!(g["spec"]["resolution"], "STATIC");
    let labels = &g["spec"]["endpoints"][0]["labels"];
    assert_eq!(labels["env"], "prod");
    assert_eq!(labels["application"], "demo");
    assert_eq!(labels["protocol"], "dubbo");
    assert!(
        labels.get("methods").is_none(),
        "invalid label values are dropped: {labels}"
    );

    // Added.
    let p2 = provider(GREETER, "10.0.0.2", 20880, "&env=prod&weight=30");
    w.create_e(&p2, "");
    let items = until("second provider", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_addresses(g) == ["10.0.0.1", "10.0.0.2"])
    });
    let eps = find(&items, GREETER).expect("greeter")["spec"]["endpoints"].clone();
    assert!(
        eps.as_array()
            .expect("endpoints")
            .iter()
            .any(|e| e["weight"] == 30),
        "{eps}"
    );

    // Metadata changed: Dubbo re-registers under a new URL.
    w.delete(&p2);
    let p2b = provider(GREETER, "10.0.0.2", 20880, "&env=canary");
    w.create_e(&p2b, "");
    until("metadata changed", &xds, |i| {
        find(i, GREETER).is_some_and(|g| {
            g["spec"]["endpoints"]
                .as_array()
                .is_some_and(|e| e.len() == 2 && e.iter().any(|e| e["labels"]["env"] == "canary"))
        })
    });

    // Another version and group of the same interface: the same service, told apart by
    // endpoint labels (DestinationRule subsets); a disabled provider is left out.
    w.create_e(
        &provider(GREETER, "10.0.0.3", 20881, "&version=1.0.0&group=blue"),
        "",
    );
    w.create_e(
        &provider(
            GREETER,
            "10.0.0.4",
            20881,
            "&version=1.0.0&group=blue&enabled=false",
        ),
        "",
    );
    let items = until("versioned provider joins the interface", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_addresses(g).contains(&"10.0.0.3".to_string()))
    });
    assert_eq!(items.len(), 1, "one ServiceEntry per interface: {items:?}");
    let g = find(&items, GREETER).expect("greeter");
    assert_eq!(endpoint_addresses(g), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let blue = g["spec"]["endpoints"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["address"] == "10.0.0.3"))
        .expect("blue endpoint");
    assert_eq!(blue["labels"]["version"], "1.0.0");
    assert_eq!(blue["labels"]["group"], "blue");

    // Removed: the last providers leave while the interface's `providers` directory stays:
    // the service stays, with no endpoints (the core's default `--on-empty keep`).
    w.delete(&p1);
    w.delete(&p2b);
    until("greeter down to the blue provider", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_addresses(g) == ["10.0.0.3"])
    });
    // The writer's session ends: its ephemeral providers vanish.
    w.expire();
    let items = until("greeter kept with no endpoints", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_count(g) == 0)
    });
    assert_eq!(items.len(), 1, "{items:?}");
}

/// Aeraki-style hosts: the interface lower-cased, version as an endpoint label, so a version
/// bump keeps the host; a hash only where two interfaces map to one host, reported.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn dubbo_hosts_are_the_interface_and_survive_version_bumps() {
    const ORDER: &str = "com.example.OrderService";
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let v1 = provider(ORDER, "10.5.0.1", 20880, "&version=1.0.0");
    w.create_e(&v1, "");
    let (a, xds) = adapter(&zk, &[]);
    let items = until("order service served", &xds, |i| {
        find(i, "com.example.orderservice").is_some()
    });
    assert_eq!(item_names(&items), ["zookeeper/com.example.orderservice"]);
    let o = find(&items, "com.example.orderservice").expect("order");
    assert_eq!(o["spec"]["hosts"][0], "com.example.orderservice.zookeeper");
    assert_eq!(o["spec"]["endpoints"][0]["labels"]["version"], "1.0.0");

    // Version bump: the provider re-registers; same host, new label.
    w.delete(&v1);
    w.create_e(&provider(ORDER, "10.5.0.1", 20880, "&version=1.0.1"), "");
    let items = until("version bumped in place", &xds, |i| {
        find(i, "com.example.orderservice")
            .is_some_and(|o| o["spec"]["endpoints"][0]["labels"]["version"] == "1.0.1")
    });
    assert_eq!(items.len(), 1, "{items:?}");

    // Another interface mapping to the same host: it gets a hash, and a problem names both.
    const SHOUTY: &str = "com.example.ORDERSERVICE";
    w.create_e(&provider(SHOUTY, "10.5.0.9", 20880, ""), "");
    let items = until("colliding interface served", &xds, |i| i.len() == 2);
    let o = find(&items, "com.example.orderservice").expect("kept its host");
    assert_eq!(endpoint_addresses(o), ["10.5.0.1"]);
    let hashed = items
        .iter()
        .find(|i| i["metadata"]["name"] != "com.example.orderservice")
        .expect("hashed");
    let name = hashed["metadata"]["name"].as_str().expect("name");
    assert!(name.starts_with("com.example.orderservice-"), "{name}");
    assert_eq!(endpoint_addresses(hashed), ["10.5.0.9"]);
    a.wait_problems(Duration::from_secs(20), "collision problem", |p| {
        p.contains(ORDER) && p.contains(SHOUTY) && p.contains(name)
    });
}

/// #22 item 7: of two Dubbo interfaces mapping to one name, the one whose znode ZooKeeper created
/// first keeps it on every replica and after a restart, whatever each served before. Here the
/// first one is not spelled like the host: before, a replica that served it kept it there, while
/// a replica or restart seeing both at once gave the name to the exact spelling.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn colliding_interfaces_get_the_same_names_on_replicas_and_restarts() {
    const SHOUTY: &str = "com.example.PAYMENTS";
    const EXACT: &str = "com.example.payments";
    let (zk, mut w) = ZooKeeper::start_with_writer();
    w.create_e(&provider(SHOUTY, "10.7.0.1", 20880, ""), "");
    let (mut a, xds_a) = adapter(&zk, &[]);
    until("the first interface", &xds_a, |i| {
        find(i, EXACT).is_some_and(|s| endpoint_addresses(s) == ["10.7.0.1"])
    });
    w.create_e(&provider(EXACT, "10.7.0.2", 20880, ""), "");
    let both = |what: &str, xds: &str| {
        until(what, xds, |i| {
            i.len() == 2 && find(i, EXACT).is_some_and(|s| endpoint_addresses(s) == ["10.7.0.1"])
        })
    };
    let seen_a = both("the older interface keeps the name", &xds_a);
    let hashed = seen_a
        .iter()
        .find(|i| i["metadata"]["name"] != EXACT)
        .expect("renamed");
    assert_eq!(
        endpoint_addresses(hashed),
        ["10.7.0.2"],
        "the newcomer is renamed"
    );
    // A replica started now, and the first one restarted: the same names, the same entries.
    let (b, xds_b) = adapter(&zk, &[]);
    assert_eq!(both("a replica started later", &xds_b), seen_a);
    a.restart();
    a.wait_ready();
    let xds_a = a.xds_url();
    assert_eq!(both("after a restart", &xds_a), seen_a);
    for r in [&a, &b] {
        r.wait_problems(Duration::from_secs(20), "the rename reported", |p| {
            p.contains(SHOUTY) && p.contains(EXACT)
        });
        r.assert_steady(Duration::from_secs(3));
    }
    assert_eq!(mcpctl_get(&xds_a), mcpctl_get(&xds_b));
}

/// Dubbo 3 registers a provider at interface and application level by default: served once.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn dubbo3_dual_registration_is_served_once() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    const API: &str = "org.apache.dubbo.samples.api.GreetingsService";
    let app_instance = |ip: &str| {
        format!(
            r#"{{"name":"first-dubbo-provider","id":"{ip}:20880","address":"{ip}","port":20880,"payload":{{"@class":"org.apache.dubbo.registry.zookeeper.ZookeeperInstance","metadata":{{"dubbo.endpoints":"[{{\"port\":20880,\"protocol\":\"dubbo\"}}]","dubbo.metadata.revision":"871fbc9cb2730caea9b0d858852d5ede"}}}},"serviceType":"DYNAMIC"}}"#
        )
    };
    // 10.6.0.1 registers at both levels; 10.6.0.2 only at application level.
    w.create_e(
        &provider_path(
            API,
            &dubbo_url("10.6.0.1", 20880, API, "")
                .replace("application=demo", "application=first-dubbo-provider"),
        ),
        "",
    );
    w.create_e(
        "/services/first-dubbo-provider/10.6.0.1:20880",
        &app_instance("10.6.0.1"),
    );
    let (a, xds) = adapter(&zk, &[]);
    let items = until("interface served", &xds, |i| {
        find(i, "org.apache.dubbo.samples.api.greetingsservice").is_some()
    });
    assert!(
        find(&items, "first-dubbo-provider").is_none(),
        "the application-level registration of the same endpoint is not served: {items:?}"
    );
    // An instance registered at application level only is served there.
    w.create_e(
        "/services/first-dubbo-provider/10.6.0.2:20880",
        &app_instance("10.6.0.2"),
    );
    let items = until("application-only instance", &xds, |i| {
        find(i, "first-dubbo-provider").is_some()
    });
    assert_eq!(
        endpoint_addresses(find(&items, "first-dubbo-provider").expect("app")),
        ["10.6.0.2"]
    );
    drop(a);

    // `--dubbo-discovery both` serves both registrations.
    let (_both, xds) = adapter(&zk, &["--dubbo-discovery", "both"]);
    until("both levels", &xds, |i| {
        find(i, "first-dubbo-provider").is_some_and(|s| endpoint_addresses(s).len() == 2)
            && find(i, "org.apache.dubbo.samples.api.greetingsservice").is_some()
    });
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn filters_select_services_groups_and_versions() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    for (iface, ip, extra) in [
        (
            "com.example.OrderService",
            "10.7.0.1",
            "&version=1.0.0&group=blue",
        ),
        (
            "com.example.OrderService",
            "10.7.0.2",
            "&version=2.0.0&group=blue",
        ),
        (
            "com.example.OrderService",
            "10.7.0.3",
            "&version=1.0.0&group=green",
        ),
        ("com.example.InternalAdmin", "10.7.0.4", ""),
        ("org.other.Api", "10.7.0.5", ""),
    ] {
        w.create_e(&provider(iface, ip, 20880, extra), "");
    }
    w.create_e(
        "/services/web/1",
        r#"{"name":"web","address":"10.7.1.1","port":80}"#,
    );
    let (_a, xds) = adapter(
        &zk,
        &[
            "--service",
            "com.example.*,web",
            "--exclude-service",
            "*Internal*",
            "--dubbo-group",
            "blue",
            "--exclude-dubbo-version",
            "2.*",
        ],
    );
    let items = until("filtered services", &xds, |i| i.len() == 2);
    assert_eq!(
        item_names(&items),
        ["zookeeper/com.example.orderservice", "zookeeper/web"]
    );
    assert_eq!(
        endpoint_addresses(find(&items, "com.example.orderservice").expect("order")),
        ["10.7.0.1"]
    );
    // A new provider that the filters let through arrives; one they do not, does not.
    w.create_e(
        &provider(
            "com.example.OrderService",
            "10.7.0.6",
            20880,
            "&version=1.1.0&group=blue",
        ),
        "",
    );
    w.create_e(
        &provider(
            "com.example.OrderService",
            "10.7.0.7",
            20880,
            "&version=2.1.0&group=blue",
        ),
        "",
    );
    until("allowed provider added", &xds, |i| {
        find(i, "com.example.orderservice")
            .is_some_and(|o| endpoint_addresses(o) == ["10.7.0.1", "10.7.0.6"])
    });
}

/// Bursts on one providers directory and one Curator directory, written faster than the
/// adapter applies them (watches fire again while it reads what the last one pointed at): what
/// is served ends as the registry ends, with no registry error, and nothing more is pushed once
/// the registry is quiet.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn bursts_end_as_the_registry_ends() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let greeter = |i: usize| provider(GREETER, &format!("10.9.0.{i}"), 20880, "");
    let instance = |i: usize| format!("/services/web/{i}");
    let data = |i: usize, zone: &str| {
        format!(
            r#"{{"name":"web","address":"10.9.1.{i}","port":80,"payload":{{"metadata":{{"zone":"{zone}"}}}}}}"#
        )
    };
    for i in 1..=3 {
        w.create_e(&greeter(i), "");
        w.create_e(&instance(i), &data(i, "a"));
    }
    let (a, xds) = adapter(&zk, &[]);
    until("the first providers and instances", &xds, |i| {
        addresses_of(i, GREETER).is_some_and(|a| a.len() == 3)
            && addresses_of(i, "web").is_some_and(|a| a.len() == 3)
    });

    // Providers 4..=40 join, the odd ones among them leave again, 1 flaps, 2 leaves.
    for i in 4..=40 {
        w.create_e(&greeter(i), "");
    }
    for i in (5..=39).step_by(2) {
        w.delete(&greeter(i));
    }
    for _ in 0..10 {
        w.delete(&greeter(1));
        w.create_e(&greeter(1), "");
    }
    w.delete(&greeter(2));
    // Instances 4..=20 join, change zone in place, every third leaves; 1 leaves.
    for i in 4..=20 {
        w.create_e(&instance(i), &data(i, "a"));
    }
    for i in 4..=20 {
        w.set(&instance(i), &data(i, "b"));
    }
    for i in (4..=20).filter(|i| i % 3 == 0) {
        w.delete(&instance(i));
    }
    w.delete(&instance(1));

    let sorted = |ips: Vec<String>| {
        let mut v = ips;
        v.sort();
        v
    };
    let want_providers = sorted(
        [1, 3]
            .into_iter()
            .chain((4..=40).step_by(2))
            .map(|i| format!("10.9.0.{i}"))
            .collect(),
    );
    let want_web = sorted(
        [2, 3]
            .into_iter()
            .chain((4..=20).filter(|i| i % 3 != 0))
            .map(|i| format!("10.9.1.{i}"))
            .collect(),
    );
    let zones = |items: &[Value]| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = find(items, "web")
            .and_then(|s| s["spec"]["endpoints"].as_array())
            .map(|eps| {
                eps.iter()
                    .map(|e| {
                        (
                            e["address"].as_str().unwrap_or("").to_string(),
                            e["labels"]["zone"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let want_zones: Vec<(String, String)> = want_web
        .iter()
        .map(|ip| {
            let zone = if ip == "10.9.1.2" || ip == "10.9.1.3" {
                "a"
            } else {
                "b"
            };
            (ip.clone(), zone.to_string())
        })
        .collect();
    until("the state after the bursts", &xds, |i| {
        addresses_of(i, GREETER).as_ref() == Some(&want_providers) && zones(i) == want_zones
    });
    a.assert_no_registry_errors("during the bursts");
    a.assert_steady(Duration::from_secs(3));
    // Nothing stale arrived late either.
    let items = mcpctl_get(&xds);
    assert_eq!(addresses_of(&items, GREETER), Some(want_providers));
    assert_eq!(zones(&items), want_zones);
    assert_eq!(items.len(), 2, "{items:?}");
}

/// One ensemble member whose name does not resolve (a StatefulSet pod not created yet) must not
/// keep the adapter from the members that do.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn unresolvable_ensemble_member_does_not_stop_the_others() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    w.create_e(&provider(GREETER, "10.8.0.1", 20880, ""), "");
    let servers = format!("zk-2.no-such-host.invalid:2181,{}", zk.servers());
    let (a, xds) = adapter_on(&servers, &[], &[]);
    until("served through the member that resolves", &xds, |i| {
        find(i, GREETER).is_some()
    });
    assert!(
        a.log().contains("does not resolve"),
        "the unresolvable member is reported"
    );
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn follows_curator_and_dubbo3_instances() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let spring = |ip: &str, port: u16, status: &str, zone: &str| {
        format!(
            r#"{{"name":"waiter-service","id":"x","address":"{ip}","port":{port},"sslPort":null,"payload":{{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"waiter-service","name":"waiter-service","metadata":{{"instance_status":"{status}","zone":"{zone}"}}}},"registrationTimeUTC":1618899361271,"serviceType":"DYNAMIC","uriSpec":null}}"#
        )
    };
    w.create_e(
        "/services/waiter-service/b1fdcb1e",
        &spring("10.1.0.1", 8080, "UP", "a"),
    );
    let dubbo3 = r#"{"name":"first-dubbo-provider","id":"10.2.0.1:20880","address":"10.2.0.1","port":20880,"sslPort":null,"payload":{"@class":"org.apache.dubbo.registry.zookeeper.ZookeeperInstance","id":"10.2.0.1:20880","name":"first-dubbo-provider","metadata":{"dubbo.endpoints":"[{\"port\":20880,\"protocol\":\"dubbo\"},{\"port\":50051,\"protocol\":\"tri\"}]","dubbo.metadata.revision":"871fbc9cb2730caea9b0d858852d5ede","dubbo.metadata.storage-type":"local"}},"registrationTimeUTC":1674960781893,"serviceType":"DYNAMIC","uriSpec":null}"#;
    w.create_e("/services/first-dubbo-provider/10.2.0.1:20880", dubbo3);
    let (_a, xds) = adapter(&zk, &[]);

    let items = until("both served", &xds, |i| i.len() == 2);
    let web = find(&items, "waiter-service").expect("waiter-service");
    assert_eq!(web["spec"]["hosts"][0], "waiter-service.zookeeper");
    assert_eq!(web["spec"]["ports"][0]["name"], "http-8080");
    assert_eq!(web["spec"]["endpoints"][0]["labels"]["zone"], "a");
    let app = find(&items, "first-dubbo-provider").expect("dubbo3 app");
    let ports: Vec<String> = app["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| format!("{}/{}", p["name"], p["protocol"]))
        .collect();
    assert_eq!(
        ports,
        [r#""tcp-20880"/"TCP""#, r#""grpc-50051"/"GRPC""#],
        "{app}"
    );

    // Updated in place (set data): new port and label.
    w.set(
        "/services/waiter-service/b1fdcb1e",
        &spring("10.1.0.1", 9090, "UP", "b"),
    );
    until("instance updated in place", &xds, |i| {
        find(i, "waiter-service").is_some_and(|s| {
            s["spec"]["ports"][0]["name"] == "http-9090"
                && s["spec"]["endpoints"][0]["labels"]["zone"] == "b"
        })
    });
    // Spring marks it OUT_OF_SERVICE: left out. No instance left, but the service directory
    // stays: the service stays with no endpoints and keeps its port (default `--on-empty keep`).
    w.set(
        "/services/waiter-service/b1fdcb1e",
        &spring("10.1.0.1", 9090, "OUT_OF_SERVICE", "b"),
    );
    let items = until("out of service", &xds, |i| {
        find(i, "waiter-service").is_some_and(|s| endpoint_count(s) == 0)
    });
    assert_eq!(
        find(&items, "waiter-service").expect("kept")["spec"]["ports"][0]["name"],
        "http-9090"
    );
    w.set(
        "/services/waiter-service/b1fdcb1e",
        &spring("10.1.0.1", 9090, "UP", "b"),
    );
    w.create_e(
        "/services/waiter-service/c2",
        &spring("10.1.0.2", 9090, "UP", "b"),
    );
    until("second instance", &xds, |i| {
        find(i, "waiter-service").is_some_and(|s| endpoint_addresses(s) == ["10.1.0.1", "10.1.0.2"])
    });
    w.delete("/services/waiter-service/b1fdcb1e");
    until("instance deleted", &xds, |i| {
        find(i, "waiter-service").is_some_and(|s| endpoint_addresses(s) == ["10.1.0.2"])
    });
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn skips_bad_data_with_problems_naming_the_znode() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let good = provider(GREETER, "10.0.0.1", 20880, "");
    w.create_e(&good, "");
    let unparsable = format!("/dubbo/{GREETER}/providers/not-a-url");
    w.create_e(&unparsable, "");
    let port0 = provider(GREETER, "10.0.0.2", 0, "");
    w.create_e(&port0, "");
    let hostname = provider(GREETER, "provider.example.com", 20880, "");
    w.create_e(&hostname, "");
    w.create_e(
        "/services/web/good",
        r#"{"name":"web","address":"10.1.0.1","port":80}"#,
    );
    w.create_e("/services/web/broken", "{not json");
    w.create_e(
        "/services/web/zero",
        r#"{"name":"web","address":"10.1.0.2","port":0}"#,
    );
    w.create_e(
        "/services/web/named",
        r#"{"name":"web","address":"web-1.example.com","port":80}"#,
    );
    let (a, xds) = adapter(&zk, &[]);
    let items = until("good instances served", &xds, |i| i.len() == 2);
    assert_eq!(
        endpoint_addresses(find(&items, GREETER).expect("greeter")),
        ["10.0.0.1"]
    );
    assert_eq!(
        endpoint_addresses(find(&items, "web").expect("web")),
        ["10.1.0.1"]
    );

    let debug = a.debug();
    let problems = debug["problems"].to_string();
    for (znode, why) in [
        (unparsable.as_str(), "not a provider URL"),
        (port0.as_str(), "port 0"),
        (hostname.as_str(), "not an IP address"),
        ("/services/web/broken", "not a Curator ServiceInstance JSON"),
        ("/services/web/zero", "port 0"),
        ("/services/web/named", "not an IP address"),
    ] {
        let line = format!("zookeeper {znode}: ");
        assert!(
            problems.contains(&line) && problems.contains(why),
            "no problem for {znode} ({why}): {problems}"
        );
    }
    assert!(
        problems.contains(&format!("zookeeper /dubbo/{GREETER}/providers")),
        "{problems}"
    );

    // Fixing the data clears the problems.
    w.delete("/services/web/broken");
    w.delete("/services/web/zero");
    w.delete("/services/web/named");
    a.wait_problems(Duration::from_secs(20), "web problems cleared", |p| {
        !p.contains("/services/web/")
    });
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn survives_server_restart_serving_last_good_state() {
    let (mut zk, mut w) = ZooKeeper::start_with_writer();
    let (a, xds) = serve_greeter(&zk, &mut w, &["--zk-session-timeout", "4s"]);

    zk.kill();
    // The registry is unhealthy, but the adapter has a state worth serving: still ready.
    a.wait_registryz(
        Duration::from_secs(20),
        "/registryz 503 while ZooKeeper is down",
        503,
    );
    let (ready, _) = a.get("/readyz");
    assert_eq!(ready, 200, "/readyz stays 200 while ZooKeeper is down");
    let items = mcpctl_get(&xds);
    assert!(
        find(&items, GREETER).is_some(),
        "last good state still served: {items:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    zk.restart();
    a.wait_registryz(Duration::from_secs(20), "/registryz 200 again", 200);
    // The writer's own client reconnects too; the next change must arrive.
    w.retry(&format!(
        "create {} ",
        provider(GREETER, "10.0.0.2", 20880, "")
    ));
    until("change after restart", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_addresses(g) == ["10.0.0.1", "10.0.0.2"])
    });
    // And the one after that (watches re-armed, not just one re-list).
    w.create_e(
        "/services/late/1",
        r#"{"name":"late","address":"10.3.0.1","port":80}"#,
    );
    until("second change after restart", &xds, |i| {
        find(i, "late").is_some()
    });
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn survives_session_expiry() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let (a, xds) = serve_greeter(&zk, &mut w, &["--zk-session-timeout", "2s"]);

    // Freeze the adapter past its session timeout: the server expires the session; on waking
    // the client is told so and silently opens a new session with no watches.
    let pid = adapter_pid(&a);
    signal(pid, "STOP");
    std::thread::sleep(Duration::from_secs(6));
    // A change made while the adapter is frozen, and one after it wakes.
    w.create(&provider(GREETER, "10.0.0.2", 20880, ""), "");
    signal(pid, "CONT");
    until("change made during expiry", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_addresses(g).len() == 2)
    });
    wait_for(
        Duration::from_secs(20),
        "expiry seen in the adapter log",
        || a.log().contains("expired").then_some(()),
    );
    w.create(&provider(GREETER, "10.0.0.3", 20880, ""), "");
    until("change after new session", &xds, |i| {
        find(i, GREETER).is_some_and(|g| endpoint_addresses(g).len() == 3)
    });
    w.create_e(
        "/services/late/1",
        r#"{"name":"late","address":"10.3.0.1","port":80}"#,
    );
    until("new service after new session", &xds, |i| {
        find(i, "late").is_some()
    });
    if std::env::var_os("ZK_E2E_LOG").is_some() {
        eprintln!("{}", a.log());
    }
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn digest_auth_survives_reconnects() {
    let (mut zk, mut w) = ZooKeeper::start_with_writer();
    w.auth("mesh:s3cret");
    w.create_e(
        "/services/open/1",
        r#"{"name":"open","address":"10.4.0.1","port":80}"#,
    );
    w.create_private(
        "/services/secret/1",
        r#"{"name":"secret","address":"10.4.0.2","port":80}"#,
    );

    // Without credentials: the unreadable instance is a problem, the rest is served.
    let (anon, xds) = adapter(&zk, &[]);
    let items = until("open served", &xds, |i| find(i, "open").is_some());
    // Its directory exists, its one instance cannot be read: served with no endpoints.
    assert_eq!(
        find(&items, "secret").map(endpoint_count),
        Some(0),
        "{items:?}"
    );
    anon.wait_problems(Duration::from_secs(20), "NoAuth problem", |p| {
        p.contains("/services/secret/1") && p.contains("NoAuth")
    });
    drop(anon);

    let (a, xds) = adapter_on(&zk.servers(), &[], &[("ZK_DIGEST", "mesh:s3cret")]);
    until("secret served with credentials", &xds, |i| {
        find(i, "secret").is_some_and(|s| endpoint_count(s) == 1) && find(i, "open").is_some()
    });
    assert!(!a.log().contains("s3cret"), "credentials logged");

    // The client forgets auth on reconnect; the adapter adds it again.
    zk.restart();
    a.wait_ready();
    // The writer's client forgot its auth too.
    w.retry("auth mesh:s3cret");
    w.retry(r#"set /services/secret/1 {"name":"secret","address":"10.4.0.3","port":80}"#);
    until("private change after restart", &xds, |i| {
        find(i, "secret").is_some_and(|s| endpoint_addresses(s) == ["10.4.0.3"])
    });
    let p = a.debug()["problems"].to_string();
    assert!(!p.contains("NoAuth"), "{p}");
}

#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn thousand_providers_over_hundred_interfaces() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let log_level = std::env::var("ZK_E2E_LOG");
    let (a, xds) = adapter_on(
        &zk.servers(),
        &[],
        &[("RUST_LOG", log_level.as_deref().unwrap_or("info"))],
    );
    let iface = |i: usize| format!("com.example.svc{i:03}");
    let started = Instant::now();
    for i in 0..100 {
        for j in 0..10 {
            let ip = format!("10.10.{i}.{j}");
            w.create_e(&provider(&iface(i), &ip, 20880, ""), "");
        }
    }
    let written = started.elapsed();
    let items = until("1000 providers served", &xds, |i| {
        i.len() == 100
            && i.iter().all(|s| {
                s["spec"]["endpoints"]
                    .as_array()
                    .is_some_and(|e| e.len() == 10)
            })
    });
    eprintln!(
        "1000 providers over 100 interfaces: written in {written:?}, all served after {:?}",
        started.elapsed()
    );
    assert_eq!(items.len(), 100);

    // Every further change is still served among 1,000 providers (latency is measured by
    // `cargo bench -p e2e --bench zookeeper_latency`, not here).
    // Each is waited for by the new provider's address on its interface (any other change, a
    // re-list, would move the version too).
    for k in 0..10 {
        let ip = format!("10.20.{k}.1");
        let host = format!("{}.zookeeper", iface(k % 100));
        w.create_e(&provider(&iface(k % 100), &ip, 20880, ""), "");
        until(&format!("{ip} served on {host}"), &xds, |items| {
            items.iter().any(|s| {
                s["spec"]["hosts"][0] == host.as_str() && endpoint_addresses(s).contains(&ip)
            })
        });
    }
    if std::env::var_os("ZK_E2E_LOG").is_some() {
        eprintln!("{}", a.log());
    }
}

/// The safety passes logged so far (`Checked ZooKeeper`, with `pass="safety"`).
fn safety_passes(a: &Adapter) -> Vec<String> {
    plain(&a.log())
        .lines()
        .filter(|l| l.contains("Checked ZooKeeper") && l.contains("pass=\"safety\""))
        .map(str::to_string)
        .collect()
}

/// Waits (generously) until `n` safety passes are logged; them.
fn passes_at_least(a: &Adapter, n: usize) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let p = safety_passes(a);
        if p.len() >= n {
            return p;
        }
        assert!(
            Instant::now() < end,
            "{} safety passes logged, not {n}; log:\n{}",
            p.len(),
            a.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The safety pass with nothing changed asks one `exists` per watched znode, lists nothing,
/// reads no data and sends nothing (no snapshot, no `Problems`). A change arrives by its
/// watch; the next pass lists that one directory again (its stamp went with the watch) and
/// the passes after it are quiet again.
///
/// 20 Dubbo interfaces of 3 providers and 10 Curator services of 3 instances: the watched
/// znodes are 2 roots, 20 `providers` directories, 10 Curator directories and 30 instances
/// (62). Before this pass existed, every safety re-list listed 52 znodes' children and read 30
/// instances' data (82 reads, 84 requests) and converted everything again.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn safety_pass_reads_only_what_changed() {
    let (zk, mut w) = ZooKeeper::start_with_writer();
    for i in 0..20 {
        let iface = format!("com.example.safe{i:02}");
        for j in 1..=3 {
            w.create(&provider(&iface, &format!("10.30.{i}.{j}"), 20880, ""), "");
        }
    }
    for i in 0..10 {
        for j in 1..=3 {
            w.create(
                &format!("/services/safe{i}/{j}"),
                &format!(r#"{{"name":"safe{i}","address":"10.31.{i}.{j}","port":80}}"#),
            );
        }
    }
    let (a, xds) = adapter_on(
        &zk.servers(),
        &["--resync-interval", "1s"],
        &[(
            "RUST_LOG",
            "info,adapter_zookeeper=debug,zookeeper_async=warn",
        )],
    );
    until("30 services", &xds, |i| i.len() == 30);
    passes_at_least(&a, 3);
    a.assert_steady_polling(
        Duration::from_secs(3),
        Duration::from_millis(250),
        &["/registryz"],
    );
    // The first list reads everything (as every safety re-list did before), stamping each
    // directory with one `exists` more; a service directory's creation (`czxid`, for names
    // and addresses) comes from that same stamp, not from another `exists` (which cost 30 more).
    let log = plain(&a.log());
    let listed = log
        .lines()
        .find(|l| l.contains("Listed ZooKeeper."))
        .expect("the first list is logged");
    eprintln!("{listed}");
    assert_eq!(log_field(listed, "lists"), Some(52), "{listed}");
    assert_eq!(log_field(listed, "exists"), Some(52), "{listed}");
    assert_eq!(log_field(listed, "data"), Some(30), "{listed}");
    let passes = safety_passes(&a);
    eprintln!("{}", passes[0]);
    assert!(passes.len() >= 5, "{passes:?}");
    for line in &passes {
        assert!(line.contains("nothing changed"), "{line}");
        assert_eq!(log_field(line, "watched"), Some(62), "{line}");
        assert_eq!(log_field(line, "exists"), Some(62), "{line}");
        assert_eq!(log_field(line, "lists"), Some(0), "{line}");
        assert_eq!(log_field(line, "data"), Some(0), "{line}");
        assert_eq!(log_field(line, "bytes"), Some(0), "{line}");
        assert_eq!(log_field(line, "events"), Some(0), "{line}");
    }
    let problems = a.debug()["problems"].to_string();
    assert!(!problems.contains("zookeeper /"), "{problems}");

    // A change arrives by its watch; the next pass lists that directory once, sending nothing
    // more; then the passes are quiet again.
    let seen = safety_passes(&a).len();
    w.create(&provider("com.example.safe07", "10.30.7.9", 20880, ""), "");
    until("the new provider", &xds, |i| {
        find(i, "com.example.safe07").is_some_and(|s| endpoint_count(s) == 4)
    });
    let after = passes_at_least(&a, seen + 3);
    let relisted: Vec<&String> = after[seen..]
        .iter()
        .filter(|l| log_field(l, "lists") != Some(0))
        .collect();
    assert!(relisted.len() <= 1, "{relisted:?}");
    for line in &relisted {
        assert_eq!(log_field(line, "lists"), Some(1), "{line}");
        assert_eq!(log_field(line, "data"), Some(0), "{line}");
        assert_eq!(log_field(line, "events"), Some(0), "{line}");
    }
    let last = after.last().expect("a pass");
    assert!(last.contains("nothing changed"), "{last}");
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    a.assert_steady_polling(
        Duration::from_secs(3),
        Duration::from_millis(250),
        &["/registryz"],
    );
    // A later change is the one new snapshot, and exactly it is served: a snapshot a pass sent
    // after the quiet window above (for the first change, or for nothing) is counted here too.
    w.create(&provider("com.example.safe03", "10.30.3.9", 20880, ""), "");
    let items = until("a provider after the quiet passes", &xds, |i| {
        find(i, "com.example.safe03").is_some_and(|s| endpoint_count(s) == 4)
    });
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "the new provider is the one snapshot since the window; log:\n{}",
        a.log_tail()
    );
    assert_eq!(items.len(), 30);
    let counts: Vec<usize> = items.iter().map(endpoint_count).collect();
    assert_eq!(
        counts.iter().filter(|&&n| n == 4).count(),
        2,
        "safe07 and safe03 grew, nothing else: {counts:?}"
    );
}

/// The re-arm passes logged so far (`Checked ZooKeeper`, with `pass="re-arm"`).
fn rearm_passes(a: &Adapter) -> usize {
    plain(&a.log())
        .lines()
        .filter(|l| l.contains("Checked ZooKeeper") && l.contains("pass=\"re-arm\""))
        .count()
}

/// Cuts `a`'s connections through `proxy` (closed at once, new ones refused), runs `meanwhile`,
/// heals, and waits until `a` has re-armed on the same session once more.
fn cut_and_rearm(a: &Adapter, proxy: &CutProxy, meanwhile: impl FnOnce()) {
    let before = rearm_passes(a);
    proxy.cut();
    wait_for(
        Duration::from_secs(20),
        "the connection loss noticed",
        || {
            plain(&a.log())
                .matches("Lost the ZooKeeper connection")
                .count()
                .gt(&before)
                .then_some(())
        },
    );
    meanwhile();
    proxy.heal();
    wait_for(Duration::from_secs(60), "a re-arm after the cut", || {
        (rearm_passes(a) > before).then_some(())
    });
}

/// Two interfaces collide on one name; the older one's directory is deleted and created again
/// while the adapter is cut off (same session, so it re-arms rather than re-lists). It must
/// then serve what a replica started afterwards serves: the other interface is now the older
/// one and keeps the name (and the virtual IPs follow the same order).
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn a_directory_re_created_while_disconnected_is_re_dated() {
    const SHOUTY: &str = "com.example.PAYMENTS";
    const EXACT: &str = "com.example.payments";
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let shouty = provider(SHOUTY, "10.7.0.1", 20880, "");
    w.create(&shouty, "");
    w.create(&provider(EXACT, "10.7.0.2", 20880, ""), "");
    let proxy = CutProxy::start(zk.addr);
    let (a, xds_a) = adapter_on(
        &proxy.addr.to_string(),
        &["--zk-session-timeout", "20s"],
        &[],
    );
    let holds = |ip: &'static str| {
        move |i: &[Value]| {
            i.len() == 2 && find(i, EXACT).is_some_and(|s| endpoint_addresses(s) == [ip])
        }
    };
    until(
        "the older interface keeps the name",
        &xds_a,
        holds("10.7.0.1"),
    );

    cut_and_rearm(&a, &proxy, || {
        w.delete(&shouty);
        w.delete(&format!("/dubbo/{SHOUTY}/providers"));
        w.delete(&format!("/dubbo/{SHOUTY}"));
        w.create(&shouty, "");
    });
    let (b, xds_b) = adapter(&zk, &[]);
    let seen_b = until("a replica started afterwards", &xds_b, holds("10.7.0.2"));
    let agreed = e2e::wait_served(Duration::from_secs(20), "the same entries", &xds_a, |i| {
        i == seen_b.as_slice()
    });
    assert_eq!(agreed, mcpctl_get(&xds_b));
    for r in [&a, &b] {
        r.assert_no_registry_errors("re-dated");
    }
}

/// A number from the environment, else `default`.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Reconnects on the same session re-arm every watch; the client library must not keep the
/// watchers of the connections before (it keeps every watcher until its znode changes, and
/// those never fire again once their connection is gone). Curator instances (one data watch
/// each) in services of 100; `ZK_E2E_RECONNECT_INSTANCES` (default 2,000; 10,000 by hand) and
/// `ZK_E2E_RECONNECTS` (default 50) forced reconnects after two to warm up: the live heap
/// (`mcp_adapter_heap_bytes`, the median of the first five samples against that of the last
/// five) grows by less than `ZK_E2E_RECONNECT_BOUND_KIB` (default 256 KiB), and a change is still
/// served after the last one. The live heap, not resident memory: mimalloc keeps freed pages
/// until their thread allocates again, so resident memory moved by up to 10 MiB between
/// reconnects that kept nothing (52.7 to 63.4 MiB in one CI run, whose last five were 4.3 MiB
/// above its first five), more than a pile-up of watchers adds (6.0 MiB resident over 50
/// reconnects at 2,000 instances before the fix). Resident memory is printed beside it.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn reconnects_do_not_pile_up_watchers() {
    let instances = env_usize("ZK_E2E_RECONNECT_INSTANCES", 2_000);
    let reconnects = env_usize("ZK_E2E_RECONNECTS", 50);
    let bound = env_usize("ZK_E2E_RECONNECT_BOUND_KIB", 256) as u64;
    assert!(
        reconnects >= 10,
        "ZK_E2E_RECONNECTS: at least 10 (two sets of five samples)"
    );
    let services = instances.div_ceil(100);
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let started = Instant::now();
    for i in 0..instances {
        let (s, j) = (i / 100, i % 100);
        let ip = format!("10.{}.{}.{}", 40 + s / 250, s % 250, j + 1);
        w.create(
            &format!("/services/svc{s:03}/{j}"),
            &format!(r#"{{"name":"svc{s:03}","address":"{ip}","port":8080}}"#),
        );
    }
    eprintln!("{instances} instances written in {:?}", started.elapsed());
    let proxy = CutProxy::start(zk.addr);
    let (a, xds) = adapter_on(
        &proxy.addr.to_string(),
        &["--zk-session-timeout", "30s"],
        &[],
    );
    e2e::wait_served(Duration::from_secs(120), "every instance", &xds, |i| {
        i.len() == services && i.iter().map(endpoint_count).sum::<usize>() == instances
    });
    let pid = adapter_pid(&a);
    for _ in 0..2 {
        cut_and_rearm(&a, &proxy, || {});
    }
    let t = Instant::now();
    let (mut heap, mut rss) = (Vec::new(), Vec::new());
    for _ in 0..reconnects {
        cut_and_rearm(&a, &proxy, || {});
        heap.push(a.metric("mcp_adapter_heap_bytes") as u64 / 1024);
        rss.push(mcp_core::testing::bench::Proc::Pid(pid).mem().rss_kib);
    }
    assert!(heap[0] > 0, "no mcp_adapter_heap_bytes on /metrics");
    let median = |s: &[u64]| {
        let mut s = s.to_vec();
        s.sort_unstable();
        s[s.len() / 2]
    };
    let before = median(&heap[..5]);
    let after = median(&heap[heap.len() - 5..]);
    eprintln!(
        "{instances} instances, {reconnects} reconnects in {:?}: live heap (medians of five) \
         {before} KiB -> {after} KiB (+{} KiB); after each: {heap:?}; resident memory (medians \
         of five) {} KiB -> {} KiB; after each: {rss:?}",
        t.elapsed(),
        after.saturating_sub(before),
        median(&rss[..5]),
        median(&rss[rss.len() - 5..]),
    );
    // Still watching: a change after the last reconnect is served.
    w.create(
        "/services/svc000/new",
        r#"{"name":"svc000","address":"10.39.0.1","port":8080}"#,
    );
    until("a change after the reconnects", &xds, |i| {
        find(i, "svc000").is_some_and(|s| endpoint_count(s) == 101)
    });
    a.assert_no_registry_errors("after the reconnects");
    assert!(
        after.saturating_sub(before) < bound,
        "the live heap grew by {} KiB over {reconnects} reconnects at {instances} instances \
         (bound {bound} KiB): {before} -> {after}, after each: {heap:?}",
        after.saturating_sub(before)
    );
}

/// The same re-creation while the adapter is connected but does not get to read in between
/// (frozen with SIGSTOP, well within its session): the watches fire, and what they read has
/// the same name and content, so nothing says the directory is another one; the next safety
/// pass finds its stat unknown since the watch fired and dates it again.
#[test]
#[ignore = "needs zookeeper: scripts/install-zookeeper.sh (the README's test command runs it)"]
fn a_directory_re_created_between_reads_is_re_dated_by_the_safety_pass() {
    const SHOUTY: &str = "com.example.PAYMENTS";
    const EXACT: &str = "com.example.payments";
    let (zk, mut w) = ZooKeeper::start_with_writer();
    let shouty = provider(SHOUTY, "10.7.0.1", 20880, "");
    w.create(&shouty, "");
    w.create(&provider(EXACT, "10.7.0.2", 20880, ""), "");
    let (a, xds_a) = adapter(&zk, &["--resync-interval", "2s"]);
    let holds = |ip: &'static str| {
        move |i: &[Value]| {
            i.len() == 2 && find(i, EXACT).is_some_and(|s| endpoint_addresses(s) == [ip])
        }
    };
    until(
        "the older interface keeps the name",
        &xds_a,
        holds("10.7.0.1"),
    );

    let pid = adapter_pid(&a);
    signal(pid, "STOP");
    w.delete(&shouty);
    w.delete(&format!("/dubbo/{SHOUTY}/providers"));
    w.delete(&format!("/dubbo/{SHOUTY}"));
    w.create(&shouty, "");
    signal(pid, "CONT");
    let (b, xds_b) = adapter(&zk, &[]);
    let seen_b = until("a replica started afterwards", &xds_b, holds("10.7.0.2"));
    let agreed = e2e::wait_served(Duration::from_secs(20), "the same entries", &xds_a, |i| {
        i == seen_b.as_slice()
    });
    assert_eq!(agreed, mcpctl_get(&xds_b));
    for r in [&a, &b] {
        r.assert_no_registry_errors("re-dated");
    }
}

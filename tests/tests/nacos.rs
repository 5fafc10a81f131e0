//! adapter-nacos against the real Nacos servers, 2.4.3 and 3.0.3 (built from upstream's sources
//! by tests/nacos/build-server.sh), with instances registered through the HTTP API and through
//! the official Java client (`nacos-client` 2.4.3, its gRPC path), in `public` and in other
//! namespaces and groups, observed through mcpctl as a sink sees it.
//!
//! Every test runs against both versions at once (threads named after the version). The tests
//! of one version share
//! one server ([`Nacos::shared`]), each in a namespace or with services of its own; a test that
//! stops, restarts or reconfigures a server starts its own. Nacos 3 without a user allowed its
//! admin API lists only the groups it is told of, over gRPC: a test that needs every group or
//! the namespace list gives the adapter the admin's credentials there.

use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::nacos::{Instance, Nacos, Options, Version, ADMIN_PASSWORD, ADMIN_USER, DEFAULT_GROUP};
use e2e::nacos_clients::Registrar;
use e2e::{addresses_of, find, mcpctl_get, Adapter};

/// A change must reach the sink within this: pushes are immediate, new services wait for the
/// next service listing (5 s); plus a loaded machine.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(45);

/// Each test runs on both versions at once, each in a thread of its own (the tests wait on the
/// servers much more than they compute, and this halves the file's time); a failure names its
/// version.
macro_rules! both_versions {
    ($($name:ident),* $(,)?) => {
        mod both {
            $(
                #[test]
                #[ignore = "needs the Nacos servers and clients: tests/nacos/build.sh target/nacos (the README's test command builds them)"]
                fn $name() {
                    super::on_both_versions(super::$name);
                }
            )*
        }
    };
}

/// `test` on 2.4.3 and on 3.0.3 at once; panics (after both are done) if either failed, saying
/// which.
fn on_both_versions(test: fn(Version)) {
    let failed: Vec<Version> = std::thread::scope(|s| {
        let runs: Vec<_> = Version::ALL
            .iter()
            .map(|v| {
                // The version in the thread's name: a panic's message names it.
                let run = std::thread::Builder::new()
                    .name(v.to_string())
                    .spawn_scoped(s, move || test(*v))
                    .expect("spawn a thread");
                (*v, run)
            })
            .collect();
        runs.into_iter()
            .filter_map(|(v, run)| run.join().is_err().then_some(v))
            .collect()
    });
    assert!(
        failed.is_empty(),
        "failed on {failed:?} (the panics above say where)"
    );
}

both_versions!(
    http_registrations_in_public_reach_the_sink_with_their_endpoints,
    java_clients_in_public_and_in_a_namespace_reach_the_sink_and_leave_with_their_connections,
    unchanged_registry_builds_no_snapshot_and_is_not_listed_again,
    namespaces_groups_and_service_filters,
    only_healthy_enabled_weighted_instances_are_endpoints,
    services_that_map_to_one_name_are_told_apart_and_dubbo_consumers_left_out,
    a_push_over_four_mib_is_read,
    thousands_of_services_subscribed_at_start_keep_their_connections,
    restarts_keep_every_service_until_its_clients_return,
    auth_tokens_refusals_and_one_refused_namespace,
    tls_on_both_ports_with_a_client_certificate,
    fails_over_to_the_next_address_when_the_first_server_stops,
);

/// adapter-nacos with `args` on `nacos` (and `env`), ready: it and its `xds://` address.
fn adapter_env(nacos: &Nacos, args: &[&str], env: &[(&str, &str)]) -> (Adapter, String) {
    let addr = nacos.server_addr();
    let mut all = vec!["--nacos-addr", addr.as_str()];
    all.extend_from_slice(args);
    let a = Adapter::start_with_env("adapter-nacos", &all, env);
    a.wait_ready();
    let xds = a.xds_url();
    (a, xds)
}

fn adapter(nacos: &Nacos, args: &[&str]) -> (Adapter, String) {
    adapter_env(nacos, args, &[])
}

/// The environment that gives the adapter the admin's credentials.
fn as_admin() -> [(&'static str, &'static str); 2] {
    [
        ("NACOS_USERNAME", ADMIN_USER),
        ("NACOS_PASSWORD", ADMIN_PASSWORD),
    ]
}

fn until(what: &str, xds: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    e2e::wait_served(CHANGE_TIMEOUT, what, xds, pred)
}

/// `(address, weight, labels.version)` of each endpoint of `name`, in address order.
fn endpoints(items: &[Value], name: &str) -> Vec<(String, u64, String)> {
    let Some(se) = find(items, name) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64, String)> = se["spec"]["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["address"].as_str().unwrap_or_default().to_string(),
                e["weight"].as_u64().unwrap_or(0),
                e["labels"]["version"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn ep(addr: &str, weight: u64, version: &str) -> (String, u64, String) {
    (addr.to_string(), weight, version.to_string())
}

/// The requests of kind `endpoint` the adapter sent.
fn requests(a: &Adapter, endpoint: &str) -> f64 {
    a.metric_with(
        "mcp_adapter_registry_requests_total",
        &format!("endpoint=\"{endpoint}\""),
    )
}

fn http_registrations_in_public_reach_the_sink_with_their_endpoints(v: Version) {
    // The default namespace, as most users run it: the adapter watches `public` (the shared
    // server's other tests have services there too: `--service` keeps to this test's).
    let nacos = Nacos::shared(v);
    let orders = "t1-orders.default-group.public";
    let o1 = Instance::new("t1-orders", "10.0.0.1", 8080).with_metadata("version", "v1");
    let o2 = Instance::new("t1-orders", "10.0.0.2", 8080)
        .weight(2.0)
        .with_metadata("version", "v1");
    nacos.register(&o1);
    nacos.register(&o2);
    let (a, xds) = adapter(
        nacos,
        &[
            "--nacos-namespace",
            "public",
            "--service",
            "t1-*",
            "--group",
            "DEFAULT_GROUP,SHOP",
        ],
    );
    let items = until("t1-orders served with two endpoints", &xds, |i| {
        endpoints(i, orders).len() == 2
    });
    let se = find(&items, orders).expect("orders");
    assert_eq!(se["metadata"]["namespace"], "nacos");
    assert_eq!(
        se["spec"]["hosts"],
        serde_json::json!([format!("{orders}.nacos")])
    );
    assert_eq!(
        se["spec"]["ports"],
        serde_json::json!([{"name": "http", "number": 8080, "protocol": "HTTP"}])
    );
    assert_eq!(
        endpoints(&items, orders),
        [ep("10.0.0.1", 100, "v1"), ep("10.0.0.2", 200, "v1")]
    );
    assert_eq!(
        se["spec"]["endpoints"][0]["labels"]["nacos-cluster"],
        "DEFAULT"
    );

    // Weight and metadata follow an update (pushed, no listing needed).
    nacos.update(&o1.clone().weight(3.0).with_metadata("version", "v2"));
    until("orders-1 at weight 300, version v2", &xds, |i| {
        endpoints(i, orders) == [ep("10.0.0.1", 300, "v2"), ep("10.0.0.2", 200, "v1")]
    });
    // Disabled: no endpoint; back once enabled.
    nacos.update(&o2.clone().enabled(false));
    until("orders-2 gone while disabled", &xds, |i| {
        endpoints(i, orders) == [ep("10.0.0.1", 300, "v2")]
    });
    nacos.update(&o2.clone());
    until("orders-2 back once enabled", &xds, |i| {
        endpoints(i, orders).len() == 2
    });

    // A new service in another group, its port's protocol from metadata.
    let cart = Instance::new("t1-cart", "10.0.1.1", 20880)
        .group("SHOP")
        .with_metadata("protocol", "dubbo");
    nacos.register(&cart);
    let items = until("t1-cart served after the next listing", &xds, |i| {
        find(i, "t1-cart.shop.public").is_some()
    });
    let cart_se = find(&items, "t1-cart.shop.public").expect("cart");
    assert_eq!(
        cart_se["spec"]["ports"],
        serde_json::json!([{"name": "dubbo", "number": 20880, "protocol": "TCP"}])
    );
    assert_eq!(cart_se["spec"]["hosts"][0], "t1-cart.shop.public.nacos");

    // Deregistered: the endpoint goes at once; the last one leaves the entry with none
    // (default --on-empty keep).
    nacos.deregister(&o1);
    until("orders-1 gone", &xds, |i| {
        endpoints(i, orders) == [ep("10.0.0.2", 200, "v1")]
    });
    nacos.deregister(&o2);
    until("orders kept with no endpoints", &xds, |i| {
        find(i, orders).is_some() && endpoints(i, orders).is_empty()
    });
    // The service deleted: gone from the listing, so its entry goes (two listings in a row
    // lack it); the other service stays.
    nacos.delete_service("t1-orders", DEFAULT_GROUP, "public");
    until("orders removed with its service", &xds, |i| {
        find(i, orders).is_none() && find(i, "t1-cart.shop.public").is_some()
    });
    a.assert_no_registry_errors("as instances came and went");
}

fn java_clients_in_public_and_in_a_namespace_reach_the_sink_and_leave_with_their_connections(
    v: Version,
) {
    let nacos = Nacos::shared(v);
    let ns = "t2-dev";
    let (a, xds) = adapter(
        nacos,
        &[
            "--nacos-namespace",
            &format!("public,{ns}"),
            "--service",
            "t2-payments",
            "--group",
            "SHOP",
        ],
    );
    // Spring Cloud Alibaba services, each instance from its own client: one in the public
    // namespace (the client's default), two in another namespace.
    let mut public = Registrar::start(nacos, None);
    public.register(
        "t2-payments",
        "SHOP",
        "10.0.2.9",
        8080,
        1.0,
        &[
            ("version", "v1"),
            ("preserved.register.source", "SPRING_CLOUD"),
        ],
    );
    let mut first = Registrar::start(nacos, Some(ns));
    first.register(
        "t2-payments",
        "SHOP",
        "10.0.2.1",
        8080,
        1.0,
        &[("version", "v1")],
    );
    let mut second = Registrar::start(nacos, Some(ns));
    second.register(
        "t2-payments",
        "SHOP",
        "10.0.2.2",
        8080,
        0.5,
        &[("version", "v2")],
    );
    let in_public = "t2-payments.shop.public";
    let in_dev = "t2-payments.shop.t2-dev";
    let items = until("payments served in both namespaces", &xds, |i| {
        endpoints(i, in_dev).len() == 2 && endpoints(i, in_public).len() == 1
    });
    assert_eq!(
        endpoints(&items, in_dev),
        [ep("10.0.2.1", 100, "v1"), ep("10.0.2.2", 50, "v2")]
    );
    assert_eq!(endpoints(&items, in_public), [ep("10.0.2.9", 100, "v1")]);
    assert_eq!(
        find(&items, in_dev).expect("payments")["spec"]["hosts"][0],
        "t2-payments.shop.t2-dev.nacos"
    );

    // Deregistered by the client: gone from the sink.
    second.deregister("t2-payments", "SHOP", "10.0.2.2", 8080);
    until(
        "the second instance gone after its deregistration",
        &xds,
        |i| endpoints(i, in_dev) == [ep("10.0.2.1", 100, "v1")],
    );
    // A client shuts down: its ephemeral instance leaves with its connection.
    let shut = Instant::now();
    first.shutdown();
    public.shutdown();
    until("the instances gone with their clients", &xds, |i| {
        endpoints(i, in_dev).is_empty() && endpoints(i, in_public).is_empty()
    });
    eprintln!(
        "{v}: instances gone from the sink {:?} after their clients' shutdown",
        shut.elapsed()
    );
    drop(second);
    a.assert_no_registry_errors("as Java clients came and went");
}

fn unchanged_registry_builds_no_snapshot_and_is_not_listed_again(v: Version) {
    let nacos = Nacos::shared(v);
    let ns = "t3-steady";
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080).namespace(ns));
    nacos.register(
        &Instance::new("cart", "10.0.1.1", 8080)
            .group("SHOP")
            .namespace(ns),
    );
    // Nacos 3 lists every group only through its admin API: the admin's credentials.
    let env: &[(&str, &str)] = match v {
        Version::V2 => &[],
        Version::V3 => &as_admin(),
    };
    let (a, xds) = adapter_env(nacos, &["--nacos-namespace", ns], env);
    until("both served", &xds, |i| {
        find(i, "orders.default-group.t3-steady").is_some()
            && find(i, "cart.shop.t3-steady").is_some()
    });
    // Nacos pushes each service once more just after its subscription: those come first.
    e2e::wait_for(
        CHANGE_TIMEOUT,
        "the pushes that follow the subscriptions",
        || (a.metric("mcp_adapter_registry_pushes_total") >= 2.0).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    let subscribes = requests(&a, "subscribe");
    let connects = requests(&a, "connect");
    let pushes = a.metric("mcp_adapter_registry_pushes_total");
    let catalogs = requests(&a, "catalog");
    assert_eq!(
        subscribes,
        2.0,
        "one subscription per service; log:\n{}",
        a.log_tail()
    );
    assert_eq!(connects, 1.0, "one connection for the one namespace");

    // Three listing intervals of the default 5 s: nothing is re-subscribed, nothing is pushed,
    // no snapshot, no error, ready and in sync.
    let window = Duration::from_secs(16);
    a.assert_steady_polling(window, Duration::from_millis(500), &["/registryz"]);
    assert_eq!(requests(&a, "subscribe"), subscribes);
    assert_eq!(requests(&a, "connect"), connects);
    assert_eq!(a.metric("mcp_adapter_registry_pushes_total"), pushes);
    // One page per interval: 3 in 16 s (4 when a listing fell due just at the end).
    let read = requests(&a, "catalog") - catalogs;
    assert!(
        (3.0..=4.0).contains(&read),
        "{read} listing pages in {window:?}"
    );

    // And the next change is the one snapshot since: the window did not hide a late one.
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    nacos.register(&Instance::new("orders", "10.0.0.2", 8080).namespace(ns));
    until("the new instance served", &xds, |i| {
        endpoints(i, "orders.default-group.t3-steady").len() == 2
    });
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "the change is the one snapshot since before the window"
    );
}

fn namespaces_groups_and_service_filters(v: Version) {
    let nacos = Nacos::shared(v);
    nacos.create_namespace("t6-dev", "dev");
    nacos.create_namespace("t6-prod", "prod");
    for (ns, group, svc, ip) in [
        ("t6-dev", DEFAULT_GROUP, "orders", "10.1.0.1"),
        ("t6-dev", "SHOP", "cart", "10.1.0.2"),
        ("t6-dev", "SHOP", "cart-canary", "10.1.0.3"),
        ("t6-prod", DEFAULT_GROUP, "orders", "10.2.0.1"),
        ("public", DEFAULT_GROUP, "t6-public", "10.3.0.1"),
    ] {
        nacos.register(&Instance::new(svc, ip, 8080).group(group).namespace(ns));
    }
    // Every namespace the server lists, every group: on Nacos 3 through its admin API.
    let env: &[(&str, &str)] = match v {
        Version::V2 => &[],
        Version::V3 => &as_admin(),
    };
    let (all, xds) = adapter_env(nacos, &[], env);
    let mine = |items: &[Value]| -> Vec<String> {
        let mut names: Vec<String> = items
            .iter()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .filter(|n| n.ends_with(".t6-dev") || n.ends_with(".t6-prod"))
            .map(str::to_string)
            .collect();
        names.sort();
        names
    };
    let items = until("every listed namespace served", &xds, |i| {
        mine(i).len() == 4
    });
    assert_eq!(
        mine(&items),
        [
            "cart-canary.shop.t6-dev",
            "cart.shop.t6-dev",
            "orders.default-group.t6-dev",
            "orders.default-group.t6-prod"
        ]
    );
    // The public namespace is among them.
    until("public served too", &xds, |i| {
        find(i, "t6-public.default-group.public").is_some()
    });
    all.assert_no_registry_errors("watching every namespace");

    let (f, xds) = adapter_env(
        nacos,
        &[
            "--nacos-namespace",
            "t6-dev",
            "--group",
            "SHOP",
            "--exclude-service",
            "*-canary",
        ],
        env,
    );
    let items = until("only t6-dev/SHOP/cart", &xds, |i| i.len() == 1);
    assert!(find(&items, "cart.shop.t6-dev").is_some(), "{items:?}");
    // A new service the filters refuse never appears; one they let through does.
    for svc in ["basket-canary", "basket"] {
        nacos.register(
            &Instance::new(svc, "10.1.0.4", 8080)
                .group("SHOP")
                .namespace("t6-dev"),
        );
    }
    let items = until("basket served", &xds, |i| {
        find(i, "basket.shop.t6-dev").is_some()
    });
    assert_eq!(items.len(), 2, "{items:?}");
    f.assert_no_registry_errors("with filters");
}

fn only_healthy_enabled_weighted_instances_are_endpoints(v: Version) {
    // The server's own view of each instance, pushed with its flags: what rnacos could not
    // stage (it ignored `healthy=false` and never pushed a health change).
    let nacos = Nacos::shared(v);
    let ns = "t7-health";
    let name = "orders.default-group.t7-health";
    let at = |ip: &str| Instance::new("orders", ip, 8080).namespace(ns);
    nacos.register(&at("10.7.0.1"));
    nacos.register(&at("10.7.0.2").healthy(false));
    nacos.register(&at("10.7.0.3").enabled(false));
    nacos.register(&at("10.7.0.4").weight(0.0));
    // The HTTP list leaves a disabled instance out; the unhealthy one is listed as such.
    let hosts = nacos.hosts("orders", DEFAULT_GROUP, ns);
    assert!(
        hosts
            .iter()
            .any(|h| h["ip"] == "10.7.0.2" && h["healthy"] == false),
        "{hosts:?}"
    );
    let (a, xds) = adapter(nacos, &["--nacos-namespace", ns]);
    until("only the healthy, enabled, weighted instance", &xds, |i| {
        addresses_of(i, name).is_some_and(|v| v == ["10.7.0.1"])
    });
    // Each made whole again is pushed and becomes an endpoint (the HTTP API updates weight
    // and enabled; an instance's health is the server's to judge, so the unhealthy one is
    // registered again healthy).
    nacos.deregister(&at("10.7.0.2"));
    nacos.register(&at("10.7.0.2"));
    until("the instance back once healthy", &xds, |i| {
        addresses_of(i, name).is_some_and(|v| v == ["10.7.0.1", "10.7.0.2"])
    });
    nacos.update(&at("10.7.0.3"));
    nacos.update(&at("10.7.0.4"));
    until("all four", &xds, |i| {
        addresses_of(i, name).is_some_and(|v| v.len() == 4)
    });
    nacos.deregister(&at("10.7.0.1"));
    nacos.register(&at("10.7.0.1").healthy(false));
    until("one registered unhealthy leaves", &xds, |i| {
        addresses_of(i, name).is_some_and(|v| v == ["10.7.0.2", "10.7.0.3", "10.7.0.4"])
    });
    a.assert_no_registry_errors("as health changed");
}

fn services_that_map_to_one_name_are_told_apart_and_dubbo_consumers_left_out(v: Version) {
    let nacos = Nacos::shared(v);
    let ns = "t12-names";
    for (svc, ip, port) in [
        ("Orders", "10.12.0.1", 8080),
        ("orders", "10.12.0.2", 8080),
        ("a_b", "10.12.0.3", 8080),
        ("a-b", "10.12.0.4", 8080),
        // A Dubbo 2 consumer's own registration, as Dubbo writes it: port 0.
        ("consumers:com.example.Greeter::", "10.12.0.5", 0),
        ("providers:com.example.Greeter::", "10.12.0.6", 20880),
    ] {
        nacos.register(&Instance::new(svc, ip, port).namespace(ns));
    }
    let (a, xds) = adapter(nacos, &["--nacos-namespace", ns]);
    let items = until("five services, each its own name", &xds, |i| i.len() == 5);
    // Each host serves its own service's endpoint: the exact spelling keeps the readable name.
    let by_host = |host: &str| -> Vec<String> {
        items
            .iter()
            .filter(|i| i["spec"]["hosts"][0] == host)
            .flat_map(|i| {
                i["spec"]["endpoints"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|e| e["address"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(
        by_host("orders.default-group.t12-names.nacos"),
        ["10.12.0.2"]
    );
    assert_eq!(by_host("a-b.default-group.t12-names.nacos"), ["10.12.0.4"]);
    let hashed: Vec<&Value> = items
        .iter()
        .filter(|i| {
            let h = i["spec"]["hosts"][0].as_str().unwrap_or_default();
            h.starts_with("orders-") || h.starts_with("a-b-")
        })
        .collect();
    assert_eq!(
        hashed.len(),
        2,
        "Orders and a_b get hashed names: {items:?}"
    );
    let problems = a.wait_problems(CHANGE_TIMEOUT, "the renames listed", |p| {
        p.contains("t12-names/DEFAULT_GROUP/Orders") && p.contains("t12-names/DEFAULT_GROUP/a_b")
    });
    assert!(problems.contains("both map to name"), "{problems}");
    assert!(
        find(
            &items,
            "providers-com.example.greeter.default-group.t12-names"
        )
        .is_some(),
        "the provider is served: {items:?}"
    );
    assert!(
        !items.iter().any(|i| i["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("consumers"))),
        "a consumer's registration is left out by default"
    );
    // The same names whatever the order of discovery: a second adapter agrees.
    let (_b, xds_b) = adapter(nacos, &["--nacos-namespace", ns]);
    let again = until("the second adapter serves five", &xds_b, |i| i.len() == 5);
    let names = |i: &[Value]| {
        let mut n: Vec<String> = i
            .iter()
            .map(|x| {
                x["spec"]["hosts"][0]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&again), names(&items));
    // With --dubbo-consumers, the consumer's entry is served (no port, no endpoint: a problem).
    let (_c, xds_c) = adapter(nacos, &["--nacos-namespace", ns, "--dubbo-consumers"]);
    until("six with the consumer", &xds_c, |i| i.len() == 6);
}

fn a_push_over_four_mib_is_read(v: Version) {
    // 4,000 instances with 1,000 bytes of metadata each (Nacos refuses more than 1,024 per
    // instance): every push and subscription answer of the service is about 5.5 MiB, over
    // tonic's 4 MiB default and under Nacos' own clients' 10 MiB.
    let nacos = Nacos::shared(v);
    let ns = "t10-large";
    let mut client = Registrar::start(nacos, Some(ns));
    client.batch("big", DEFAULT_GROUP, 4000, 8080, 1000);
    let name = "big.default-group.t10-large";
    let (a, xds) = adapter(nacos, &["--nacos-namespace", ns]);
    until("all 4,000 instances served", &xds, |i| {
        endpoints(i, name).len() == 4000
    });
    // And a push of that size: one more instance.
    client.batch("big", DEFAULT_GROUP, 4001, 8080, 1000);
    until("the 4,001st instance pushed", &xds, |i| {
        endpoints(i, name).len() == 4001
    });
    a.assert_no_registry_errors("with 5.5 MiB pushes");
    assert_eq!(requests(&a, "connect"), 1.0, "never reconnected");
}

fn thousands_of_services_subscribed_at_start_keep_their_connections(v: Version) {
    // An idle namespace and a busy one: while the busy one's 2,000 subscriptions are made, and
    // the server pushes each service once more, the idle connection must still answer the
    // server's liveness checks (Nacos closes a connection that does not).
    let nacos = Nacos::shared(v);
    let (idle, busy) = ("t11-idle", "t11-busy");
    nacos.register(&Instance::new("quiet", "10.11.0.1", 8080).namespace(idle));
    let mut client = Registrar::start(nacos, Some(busy));
    client.many("svc", DEFAULT_GROUP, 2000, "10.11.1.1", 8080);
    let (a, xds) = adapter(nacos, &["--nacos-namespace", &format!("{idle},{busy}")]);
    until("2,001 services served", &xds, |i| i.len() == 2001);
    assert_eq!(requests(&a, "connect"), 2.0, "one connection per namespace");
    // Past Nacos' 20 s idle check: still the same connections, and the idle namespace still
    // follows its service.
    std::thread::sleep(Duration::from_secs(25));
    nacos.register(&Instance::new("quiet", "10.11.0.2", 8080).namespace(idle));
    until("the idle namespace's change served", &xds, |i| {
        endpoints(i, "quiet.default-group.t11-idle").len() == 2
    });
    assert_eq!(
        requests(&a, "connect"),
        2.0,
        "no connection was lost; log:\n{}",
        a.log_tail()
    );
    a.assert_no_registry_errors("with 2,001 services");
}

fn restarts_keep_every_service_until_its_clients_return(v: Version) {
    // Default flags on a server of its own, in `public`/`DEFAULT_GROUP`: a persistent instance
    // (it survives a restart) and three Java clients' ephemeral ones (each client registers its
    // own again once it has reconnected).
    let mut nacos = Nacos::start(v);
    let orders = Instance::new("orders", "10.0.0.1", 8080).with_metadata("version", "v1");
    nacos.register(&orders);
    let client = |service: &str, ip: &str| {
        let mut c = Registrar::start(&nacos, None);
        c.register(service, DEFAULT_GROUP, ip, 8080, 1.0, &[("version", "v1")]);
        c
    };
    let mut cart = client("cart", "10.0.3.1");
    let pay = client("pay", "10.0.4.1");
    let gone = client("gone", "10.0.5.1");
    let (a, xds) = adapter(&nacos, &[]);
    let name = |s: &str| format!("{s}.default-group.public");
    until("all four served", &xds, |i| {
        ["orders", "cart", "pay", "gone"]
            .iter()
            .all(|s| endpoints(i, &name(s)).len() == 1)
    });
    let before = mcpctl_get(&xds);
    let errors = a.metric("mcp_adapter_registry_errors_total");

    // 1. The server stops: the last state stays served, /registryz says why. `gone`'s client
    // stops meanwhile: it will never register again.
    nacos.stop();
    // Why: the session to it ended, a listing in flight failed, or (once the adapter tries
    // again) the server refuses the connection, named by its address; every try while it is
    // down says the latter.
    let body = a.wait_registryz(CHANGE_TIMEOUT, "registryz 503 during the outage", 503);
    let server = format!("Nacos at http://{} is unavailable: ", nacos.server_addr());
    let grpc = format!("Nacos gRPC at http://127.0.0.1:{}", nacos.grpc_port());
    let why = body
        .strip_prefix("nacos unhealthy for ")
        .and_then(|b| b.split_once("s: registry unavailable: "))
        .map_or("", |(_, why)| why);
    assert!(
        why.starts_with("the Nacos connection for namespace \"public\" ended")
            || why.contains(&server)
            || why.contains(&grpc),
        "{body}"
    );
    a.wait_admin(
        CHANGE_TIMEOUT,
        "registryz naming the stopped server's refusal",
        "/registryz",
        |s, body| {
            s == 503
                && body.contains(&format!("registry unavailable: {server}"))
                && body.contains("Connection refused")
        },
    );
    assert_eq!(a.get("/readyz").0, 200, "the last good state is served");
    assert_eq!(
        mcpctl_get(&xds),
        before,
        "the last good state, to a new sink"
    );
    drop(gone);

    // 2. It comes back. The persistent instance is there at once, `cart`'s client returns
    // within seconds, `pay`'s client is held up (paused) until well after the adapter has read
    // the server again: `pay` and `gone` keep their endpoints meanwhile, and no snapshot is
    // built while the clients return.
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    let connects = requests(&a, "connect");
    pay.pause(true);
    nacos.restart();
    // The adapter's own reconnect first: its watch ended (counted as a registry error) and a
    // new one opened a session to the restarted server. Only then is a 200 the new watch's
    // (once it has read the server and subscribed again): before, it could be the old watch's
    // listing answering again while its session is still the stopped server's, and every
    // comparison below would hold of an adapter that has read nothing since the restart.
    e2e::wait_for(
        CHANGE_TIMEOUT,
        "the adapter's reconnect: a session opened to the restarted server",
        || (requests(&a, "connect") > connects).then_some(()),
    );
    assert!(
        a.metric("mcp_adapter_registry_errors_total") > errors,
        "the watch of the stopped server ended without an error counted; log:\n{}",
        a.log_tail()
    );
    a.wait_registryz(
        CHANGE_TIMEOUT,
        "registryz 200 once the adapter reads it again",
        200,
    );
    let back = Instant::now();
    e2e::wait_for(CHANGE_TIMEOUT, "cart's client registered again", || {
        (nacos.hosts("cart", DEFAULT_GROUP, "public").len() == 1).then_some(())
    });
    assert!(
        nacos.hosts("pay", DEFAULT_GROUP, "public").is_empty(),
        "pay's client has not returned yet"
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        mcpctl_get(&xds),
        before,
        "every service kept while pay's client is away"
    );
    pay.pause(false);
    e2e::wait_for(CHANGE_TIMEOUT, "pay's client registered again", || {
        (nacos.hosts("pay", DEFAULT_GROUP, "public").len() == 1).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        back.elapsed() < Duration::from_secs(25),
        "the check below must come within the grace (30 s); it came {:?} after",
        back.elapsed()
    );
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots,
        "no snapshot while the clients returned (nothing removed, then added back); log:\n{}",
        a.log_tail()
    );
    assert_eq!(mcpctl_get(&xds), before);

    // 3. `gone`, whose client never returns, is believed once the grace is over.
    until("gone without endpoints once the grace is over", &xds, |i| {
        endpoints(i, &name("gone")).is_empty()
    });
    assert!(
        back.elapsed() > Duration::from_secs(20),
        "gone's endpoint went before the grace was over ({:?})",
        back.elapsed()
    );

    // 4. The sessions that followed are live: changes after the restart are pushed, and the
    // adapter is steady.
    cart.deregister("cart", DEFAULT_GROUP, "10.0.3.1", 8080);
    until("the deregistration after the restart", &xds, |i| {
        endpoints(i, &name("cart")).is_empty()
    });
    nacos.register(&Instance::new("orders", "10.0.0.2", 8080).with_metadata("version", "v1"));
    until("a persistent change after the restart", &xds, |i| {
        endpoints(i, &name("orders")).len() == 2
    });
    a.assert_recovered(Duration::from_secs(6));
}

fn auth_tokens_refusals_and_one_refused_namespace(v: Version) {
    // Auth on, as in production, with tokens of 10 s so that renewals happen within the test.
    let nacos = Nacos::start_with(
        v,
        Options {
            auth: true,
            token_ttl: Some(10),
            ..Options::default()
        },
    );
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080));
    nacos.register(&Instance::new("orders", "10.8.0.1", 8080).namespace("auth-a"));
    nacos.register(&Instance::new("orders", "10.9.0.1", 8080).namespace("auth-b"));

    // 1. Without credentials: refused, and /registryz says so.
    {
        let addr = nacos.server_addr();
        let a = Adapter::start("adapter-nacos", &["--nacos-addr", addr.as_str()]);
        let body = a.wait_registryz(CHANGE_TIMEOUT, "registryz 503 naming the refusal", 503);
        assert!(body.contains("refused"), "{body}");
    }

    // 2. The admin's credentials in a file: served, tokens renewed, nothing refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let creds = dir.path().join("nacos-auth");
    std::fs::write(&creds, format!("{ADMIN_USER}:{ADMIN_PASSWORD}\n")).expect("credentials");
    let creds_arg = creds.display().to_string();
    let (a, xds) = adapter(
        &nacos,
        &[
            "--nacos-auth-file",
            &creds_arg,
            "--nacos-namespace",
            "public,auth-a",
        ],
    );
    until("orders served in public and auth-a", &xds, |i| {
        find(i, "orders.default-group.public").is_some()
            && find(i, "orders.default-group.auth-a").is_some()
    });
    std::thread::sleep(Duration::from_secs(22));
    nacos.register(&Instance::new("cart", "10.0.1.1", 8080));
    until("cart served with a renewed token", &xds, |i| {
        find(i, "cart.default-group.public").is_some()
    });
    let logins = requests(&a, "login");
    assert!(logins >= 3.0, "{logins} logins in 22 s of 10 s tokens");
    a.assert_no_registry_errors("with token renewals");
    assert!(
        !a.log().contains(ADMIN_PASSWORD),
        "the password is never logged"
    );

    // 3. An expired token: the adapter hangs (SIGSTOP) past its token's life; back, its next
    // requests are refused, it logs in again and carries on without an outage.
    let logins = requests(&a, "login");
    let pid = a.pid().expect("running").to_string();
    let signal = |s: &str| {
        std::process::Command::new("kill")
            .args([s, &pid])
            .status()
            .expect("kill");
    };
    signal("-STOP");
    std::thread::sleep(Duration::from_secs(14));
    nacos.register(&Instance::new("basket", "10.0.2.1", 8080));
    signal("-CONT");
    until("basket served after the pause", &xds, |i| {
        find(i, "basket.default-group.public").is_some()
    });
    assert!(requests(&a, "login") > logins, "logged in again");
    a.assert_no_registry_errors("after an expired token");

    // 4. A refused login: the admin's password changed. Once the token runs out the adapter is
    // refused and says so; a new password in the file (a rotated Secret) brings it back.
    nacos.set_password(ADMIN_USER, "another-Adm1n-pw");
    a.wait_admin(
        Duration::from_secs(60),
        "registryz 503 once the old password is refused",
        "/registryz",
        |s, body| s == 503 && body.contains("refused access to POST /nacos/v"),
    );
    assert_eq!(a.get("/readyz").0, 200, "the last good state is served");
    std::fs::write(&creds, format!("{ADMIN_USER}:another-Adm1n-pw\n")).expect("credentials");
    a.wait_registryz(CHANGE_TIMEOUT, "registryz 200 with the new password", 200);
    nacos.set_password(ADMIN_USER, ADMIN_PASSWORD);

    // 5. A user that may read one namespace only: the other namespace is refused and named,
    // the readable one is served and followed meanwhile.
    nacos.create_user("reader-a", "Reader-a-pw1", "auth-a", "r");
    let (r, xds) = adapter_env(
        &nacos,
        &["--nacos-namespace", "auth-a,auth-b"],
        &[
            ("NACOS_USERNAME", "reader-a"),
            ("NACOS_PASSWORD", "Reader-a-pw1"),
        ],
    );
    until("auth-a served", &xds, |i| {
        find(i, "orders.default-group.auth-a").is_some()
    });
    let body = r.wait_registryz(
        CHANGE_TIMEOUT,
        "registryz naming the refused namespace",
        503,
    );
    assert!(body.contains("auth-b"), "{body}");
    nacos.register(&Instance::new("orders", "10.8.0.2", 8080).namespace("auth-a"));
    until("auth-a followed while auth-b is refused", &xds, |i| {
        endpoints(i, "orders.default-group.auth-a").len() == 2
    });
    let items = mcpctl_get(&xds);
    assert!(
        find(&items, "orders.default-group.auth-b").is_none(),
        "{items:?}"
    );
}

fn tls_on_both_ports_with_a_client_certificate(v: Version) {
    // TLS-terminating proxies in front of the server's HTTP port Q and gRPC port Q + 1000, each
    // demanding a client certificate (Nacos' own TLS needs a keystore per server; what the
    // adapter must do is the same).
    let nacos = Nacos::shared(v);
    let ns = "t8-tls";
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080).namespace(ns));
    let pki = tempfile::tempdir().expect("tempdir");
    e2e::pki::make_pki(pki.path());
    let (http, grpc) = loop {
        let q = e2e::free_addr();
        let Some(grpc_port) = q.port().checked_add(1000) else {
            continue;
        };
        let g = std::net::SocketAddr::from(([127, 0, 0, 1], grpc_port));
        if std::net::TcpListener::bind(g).is_ok() {
            break (q, g);
        }
    };
    let nacos_grpc = std::net::SocketAddr::from(([127, 0, 0, 1], nacos.grpc_port()));
    let http_proxy =
        e2e::tls_proxy::TlsProxy::start(http, nacos.http_addr(), pki.path(), true, &["http/1.1"]);
    let grpc_proxy = e2e::tls_proxy::TlsProxy::start(grpc, nacos_grpc, pki.path(), true, &["h2"]);
    let file = |n: &str| pki.path().join(n).display().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let url = format!("https://127.0.0.1:{}", http.port());
    let name = "orders.default-group.t8-tls";

    let a = Adapter::start(
        "adapter-nacos",
        &[
            "--nacos-addr",
            url.as_str(),
            "--nacos-namespace",
            ns,
            "--nacos-ca",
            ca.as_str(),
            "--nacos-client-cert",
            cert.as_str(),
            "--nacos-client-key",
            key.as_str(),
        ],
    );
    a.wait_ready();
    let xds = a.xds_url();
    until("orders served over TLS", &xds, |i| {
        endpoints(i, name).len() == 1
    });
    assert!(http_proxy.handshakes() >= 1 && grpc_proxy.handshakes() >= 1);
    nacos.register(&Instance::new("orders", "10.0.0.2", 8080).namespace(ns));
    until("a push over TLS", &xds, |i| endpoints(i, name).len() == 2);
    a.assert_no_registry_errors("over TLS");

    // Without the client certificate the handshake is refused, and /registryz says where.
    let refused = Adapter::start(
        "adapter-nacos",
        &["--nacos-addr", url.as_str(), "--nacos-ca", ca.as_str()],
    );
    let body = refused.wait_registryz(
        CHANGE_TIMEOUT,
        "registryz 503 without a client certificate",
        503,
    );
    assert!(body.contains(&url), "{body}");
    assert_eq!(refused.get("/readyz").0, 503, "never synced");
}

fn fails_over_to_the_next_address_when_the_first_server_stops(v: Version) {
    // Two independent servers (not a cluster): each registration goes to both, as a cluster's
    // members would all answer for it. The second is the shared one, in a namespace of this
    // test's.
    let ns = "t9-failover";
    let mut first = Nacos::start(v);
    let second = Nacos::shared(v);
    for n in [&first, second] {
        n.register(&Instance::new("orders", "10.0.0.1", 8080).namespace(ns));
    }
    let addrs = format!("{},{}", first.server_addr(), second.server_addr());
    let a = Adapter::start(
        "adapter-nacos",
        &["--nacos-addr", addrs.as_str(), "--nacos-namespace", ns],
    );
    a.wait_ready();
    let xds = a.xds_url();
    let name = "orders.default-group.t9-failover";
    until("orders served", &xds, |i| endpoints(i, name).len() == 1);

    first.stop();
    // A change only the second server knows arrives: the adapter moved to it.
    second.register(&Instance::new("orders", "10.0.0.2", 8080).namespace(ns));
    until("the second server's instance served", &xds, |i| {
        endpoints(i, name).len() == 2
    });
    a.wait_registryz(CHANGE_TIMEOUT, "registryz 200 on the second server", 200);
    assert!(
        a.log().contains(&second.server_addr()),
        "the log names the server it moved to:\n{}",
        a.log_tail()
    );
}

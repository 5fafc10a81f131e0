//! adapter-nacos against a real Nacos server (rnacos 0.8.8, built from crates.io by
//! tests/nacos/build.sh), with instances registered through the HTTP Open API and through the
//! official Java client (`nacos-client` 2.4.3, its gRPC path), observed through mcpctl as a sink
//! sees it. The adapter runs with its default flags unless a test says otherwise.

use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::nacos::{Instance, Nacos, Registrar, DEFAULT_GROUP};
use e2e::{addresses_of, find, mcpctl_get, Adapter};

/// A change must reach the sink within this: pushes are immediate, new services wait for the
/// next catalog read (5 s); plus a loaded machine.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

const ORDERS: &str = "orders.default-group.public";

/// adapter-nacos with `args` on `nacos`, ready: it and its `xds://` address.
fn adapter(nacos: &Nacos, args: &[&str]) -> (Adapter, String) {
    let addr = nacos.server_addr();
    let mut all = vec!["--nacos-addr", addr.as_str()];
    all.extend_from_slice(args);
    let a = Adapter::start("adapter-nacos", &all);
    a.wait_ready();
    let xds = a.xds_url();
    (a, xds)
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

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn http_registrations_weights_metadata_and_removals_reach_the_sink() {
    let nacos = Nacos::start();
    let o1 = Instance::new("orders", "10.0.0.1", 8080).with_metadata("version", "v1");
    let o2 = Instance::new("orders", "10.0.0.2", 8080)
        .weight(2.0)
        .with_metadata("version", "v1");
    nacos.register(&o1);
    nacos.register(&o2);
    let (a, xds) = adapter(&nacos, &[]);

    let items = until("orders served with two endpoints", &xds, |i| {
        endpoints(i, ORDERS).len() == 2
    });
    let se = find(&items, ORDERS).expect("orders");
    assert_eq!(se["metadata"]["namespace"], "nacos");
    assert_eq!(
        se["spec"]["hosts"],
        serde_json::json!([format!("{ORDERS}.nacos")])
    );
    assert_eq!(
        se["spec"]["ports"],
        serde_json::json!([{"name": "http", "number": 8080, "protocol": "HTTP"}])
    );
    assert_eq!(
        endpoints(&items, ORDERS),
        [ep("10.0.0.1", 100, "v1"), ep("10.0.0.2", 200, "v1")]
    );
    assert_eq!(
        se["spec"]["endpoints"][0]["labels"]["nacos-cluster"],
        "DEFAULT"
    );

    // Weight and metadata follow an update (pushed, no catalog read needed).
    nacos.update(&o1.clone().weight(3.0).with_metadata("version", "v2"));
    until("orders-1 at weight 300, version v2", &xds, |i| {
        endpoints(i, ORDERS) == [ep("10.0.0.1", 300, "v2"), ep("10.0.0.2", 200, "v1")]
    });

    // Disabled: rnacos hides it, so its endpoint goes; enabled again, it is back.
    nacos.update(&o2.clone().enabled(false));
    until("orders-2 gone while disabled", &xds, |i| {
        endpoints(i, ORDERS) == [ep("10.0.0.1", 300, "v2")]
    });
    nacos.update(&o2.clone().enabled(true));
    until("orders-2 back once enabled", &xds, |i| {
        endpoints(i, ORDERS).len() == 2
    });

    // A new service in another group and namespace-less port protocol from metadata.
    let cart = Instance::new("cart", "10.0.1.1", 20880)
        .group("SHOP")
        .with_metadata("protocol", "dubbo");
    nacos.register(&cart);
    let items = until("cart served after the next catalog read", &xds, |i| {
        find(i, "cart.shop.public").is_some()
    });
    let cart_se = find(&items, "cart.shop.public").expect("cart");
    assert_eq!(
        cart_se["spec"]["ports"],
        serde_json::json!([{"name": "dubbo", "number": 20880, "protocol": "TCP"}])
    );
    assert_eq!(cart_se["spec"]["hosts"][0], "cart.shop.public.nacos");

    // Deregistered: the endpoint goes at once; the last one leaves the entry with none
    // (default --on-empty keep).
    nacos.deregister(&o1);
    until("orders-1 gone", &xds, |i| {
        endpoints(i, ORDERS) == [ep("10.0.0.2", 200, "v1")]
    });
    nacos.deregister(&o2);
    until("orders kept with no endpoints", &xds, |i| {
        find(i, ORDERS).is_some() && endpoints(i, ORDERS).is_empty()
    });
    // The service deleted: gone from the catalog, so its entry goes at the next read; the
    // other service stays.
    let (status, body) = nacos.call(
        "DELETE",
        "/nacos/v1/ns/service",
        &[
            ("serviceName", "orders".to_string()),
            ("groupName", DEFAULT_GROUP.to_string()),
        ],
    );
    assert_eq!((status, body.trim()), (200, "ok"), "delete the service");
    until("orders removed with its service", &xds, |i| {
        find(i, ORDERS).is_none() && find(i, "cart.shop.public").is_some()
    });
    a.assert_no_registry_errors("as instances came and went");
}

#[test]
#[ignore = "needs rnacos and the Java registrar: tests/nacos/build.sh target/nacos (the README's test command builds them)"]
fn java_client_registrations_over_grpc_reach_the_sink_and_leave_with_the_client() {
    let nacos = Nacos::start();
    nacos.create_namespace("dev", "dev");
    let (a, xds) = adapter(&nacos, &[]);
    // Two services of a Spring Cloud Alibaba shape, each from its own client (one instance per
    // service and connection, as Nacos 2.x keeps them).
    let mut first = Registrar::start(&nacos, Some("dev"));
    first.register(
        "payments",
        "SHOP",
        "10.0.2.1",
        8080,
        1.0,
        &[
            ("version", "v1"),
            ("preserved.register.source", "SPRING_CLOUD"),
        ],
    );
    let mut second = Registrar::start(&nacos, Some("dev"));
    second.register(
        "payments",
        "SHOP",
        "10.0.2.2",
        8080,
        0.5,
        &[("version", "v2")],
    );
    let name = "payments.shop.dev";
    let items = until("payments served with both instances", &xds, |i| {
        endpoints(i, name).len() == 2
    });
    assert_eq!(
        endpoints(&items, name),
        [ep("10.0.2.1", 100, "v1"), ep("10.0.2.2", 50, "v2")]
    );
    assert_eq!(
        find(&items, name).expect("payments")["spec"]["hosts"][0],
        "payments.shop.dev.nacos"
    );

    // Deregistered by the client: gone from the sink.
    second.deregister("payments", "SHOP", "10.0.2.2", 8080);
    until(
        "the second instance gone after its deregistration",
        &xds,
        |i| endpoints(i, name) == [ep("10.0.2.1", 100, "v1")],
    );
    // The first client shuts down: its ephemeral instance leaves with its connection.
    let shut = Instant::now();
    first.shutdown();
    until("the first instance gone with its client", &xds, |i| {
        find(i, name).is_some() && endpoints(i, name).is_empty()
    });
    eprintln!(
        "instance gone from the sink {:?} after the client's shutdown",
        shut.elapsed()
    );
    drop(second);
    a.assert_no_registry_errors("as Java clients came and went");
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn unchanged_registry_builds_no_snapshot_and_is_not_listed_again() {
    let nacos = Nacos::start();
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080));
    nacos.register(&Instance::new("cart", "10.0.1.1", 8080).group("SHOP"));
    let (a, xds) = adapter(&nacos, &[]);
    until("both served", &xds, |i| {
        find(i, ORDERS).is_some() && find(i, "cart.shop.public").is_some()
    });
    // Nacos pushes each service once more just after its subscription (the subscriber's first
    // push, beside the subscription's answer): those two come first.
    e2e::wait_for(
        CHANGE_TIMEOUT,
        "the pushes that follow the subscriptions",
        || (a.metric("mcp_adapter_registry_pushes_total") >= 2.0).then_some(()),
    );
    let subscribes = a.metric_with(
        "mcp_adapter_registry_requests_total",
        "endpoint=\"subscribe\"",
    );
    let connects = a.metric_with(
        "mcp_adapter_registry_requests_total",
        "endpoint=\"connect\"",
    );
    let pushes = a.metric("mcp_adapter_registry_pushes_total");
    let catalogs = a.metric_with(
        "mcp_adapter_registry_requests_total",
        "endpoint=\"catalog\"",
    );
    assert_eq!(
        subscribes,
        2.0,
        "one subscription per service; log:\n{}",
        a.log_tail()
    );
    assert_eq!(connects, 1.0, "one connection for the one namespace");

    // Three catalog intervals of the default 5 s: nothing is re-subscribed, nothing is pushed,
    // no snapshot, no error, ready and in sync.
    let window = Duration::from_secs(16);
    a.assert_steady_polling(window, Duration::from_millis(500), &["/registryz"]);
    assert_eq!(
        a.metric_with(
            "mcp_adapter_registry_requests_total",
            "endpoint=\"subscribe\""
        ),
        subscribes
    );
    assert_eq!(
        a.metric_with(
            "mcp_adapter_registry_requests_total",
            "endpoint=\"connect\""
        ),
        connects
    );
    assert_eq!(a.metric("mcp_adapter_registry_pushes_total"), pushes);
    // One catalog read per interval: 3 in 16 s (4 when a read fell due just at the end).
    let read = a.metric_with(
        "mcp_adapter_registry_requests_total",
        "endpoint=\"catalog\"",
    ) - catalogs;
    assert!(
        (3.0..=4.0).contains(&read),
        "{read} catalog reads in {window:?}"
    );

    // And the next change is the one snapshot since: the window did not hide a late one.
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    nacos.register(&Instance::new("orders", "10.0.0.2", 8080));
    until("the new instance served", &xds, |i| {
        endpoints(i, ORDERS).len() == 2
    });
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "the change is the one snapshot since before the window"
    );
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn server_down_keeps_the_last_state_and_a_restart_is_ridden_out() {
    let mut nacos = Nacos::start();
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080).with_metadata("version", "v1"));
    let (a, xds) = adapter(&nacos, &[]);
    until("orders served", &xds, |i| endpoints(i, ORDERS).len() == 1);
    let before = mcpctl_get(&xds);

    nacos.stop();
    let body = a.wait_registryz(CHANGE_TIMEOUT, "registryz 503 during the outage", 503);
    assert!(body.contains("nacos"), "{body}");
    assert_eq!(a.get("/readyz").0, 200, "the last good state is served");
    assert_eq!(
        addresses_of(&mcpctl_get(&xds), ORDERS),
        Some(vec!["10.0.0.1".to_string()]),
        "the last good state, to a new sink"
    );

    // Back (persistent instances survive an rnacos restart): in sync again with the same
    // content, then a change made after the restart is pushed on the new connection.
    nacos.restart();
    a.wait_registryz(CHANGE_TIMEOUT, "registryz 200 once the server is back", 200);
    let after = mcpctl_get(&xds);
    assert_eq!(
        find(&after, ORDERS).map(|s| &s["spec"]),
        find(&before, ORDERS).map(|s| &s["spec"]),
        "the same state after the restart"
    );
    nacos.register(&Instance::new("orders", "10.0.0.2", 8080).with_metadata("version", "v1"));
    until("a change after the restart is served", &xds, |i| {
        endpoints(i, ORDERS).len() == 2
    });
    a.assert_recovered(Duration::from_secs(6));
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn login_with_a_credentials_file_and_token_renewal() {
    let nacos = Nacos::start_with_auth_env(
        "nacos",
        "s3cret-Pw",
        // Tokens of 12 s: the adapter must renew them to keep reading the catalog.
        &[("RNACOS_API_LOGIN_TIMEOUT", "12")],
    );
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080));

    // Without credentials: refused, and /registryz says so.
    {
        let addr = nacos.server_addr();
        let a = Adapter::start("adapter-nacos", &["--nacos-addr", addr.as_str()]);
        // (503 from the start, "not synced yet", until the first refusal is reported.)
        e2e::wait_for(CHANGE_TIMEOUT, "registryz 503 naming the refusal", || {
            let (status, body) = a.get("/registryz");
            (status == 503 && body.contains("refused access")).then_some(())
        });
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let creds = dir.path().join("nacos-auth");
    std::fs::write(&creds, "nacos:s3cret-Pw\n").expect("write credentials");
    let creds_arg = creds.display().to_string();
    let (a, xds) = adapter(&nacos, &["--nacos-auth-file", creds_arg.as_str()]);
    until("orders served with a login", &xds, |i| {
        find(i, ORDERS).is_some()
    });

    // Past two token lifetimes, a new service is still found by the catalog read.
    std::thread::sleep(Duration::from_secs(26));
    nacos.register(&Instance::new("cart", "10.0.1.1", 8080));
    until("cart served with a renewed token", &xds, |i| {
        find(i, "cart.default-group.public").is_some()
    });
    let logins = a.metric_with("mcp_adapter_registry_requests_total", "endpoint=\"login\"");
    assert!(logins >= 3.0, "{logins} logins in 26 s of 12 s tokens");
    a.assert_no_registry_errors("with token renewals");
    assert!(
        !a.log().contains("s3cret-Pw"),
        "the password is never logged"
    );
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn namespace_group_and_service_filters() {
    let nacos = Nacos::start();
    nacos.create_namespace("dev", "dev");
    nacos.create_namespace("prod", "prod");
    for (ns, group, svc, ip) in [
        ("dev", DEFAULT_GROUP, "orders", "10.1.0.1"),
        ("dev", "SHOP", "cart", "10.1.0.2"),
        ("dev", "SHOP", "cart-canary", "10.1.0.3"),
        ("prod", DEFAULT_GROUP, "orders", "10.2.0.1"),
    ] {
        nacos.register(&Instance::new(svc, ip, 8080).group(group).namespace(ns));
    }
    // Every namespace by default (public, dev, prod).
    let (_all, xds) = adapter(&nacos, &[]);
    let items = until("every namespace served", &xds, |i| i.len() == 4);
    let mut names: Vec<&str> = items
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cart-canary.shop.dev",
            "cart.shop.dev",
            "orders.default-group.dev",
            "orders.default-group.prod"
        ]
    );

    let (f, xds) = adapter(
        &nacos,
        &[
            "--nacos-namespace",
            "dev",
            "--group",
            "SHOP",
            "--exclude-service",
            "*-canary",
        ],
    );
    let items = until("only dev/SHOP/cart", &xds, |i| i.len() == 1);
    assert!(find(&items, "cart.shop.dev").is_some(), "{items:?}");
    // A new service the filters refuse never appears; one they let through does.
    nacos.register(
        &Instance::new("basket-canary", "10.1.0.4", 8080)
            .group("SHOP")
            .namespace("dev"),
    );
    nacos.register(
        &Instance::new("basket", "10.1.0.5", 8080)
            .group("SHOP")
            .namespace("dev"),
    );
    let items = until("basket served", &xds, |i| {
        find(i, "basket.shop.dev").is_some()
    });
    assert_eq!(items.len(), 2, "{items:?}");
    f.assert_no_registry_errors("with filters");
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn an_instance_the_server_finds_unhealthy_is_no_endpoint() {
    // rnacos probes persistent instances over TCP (every 5 s at the least) and marks one whose
    // port does not answer unhealthy: the one way to stage an unhealthy instance on it. It does
    // not push that change (Nacos does), and it leaves unhealthy instances out of subscription
    // answers and pushes (Nacos sends them, marked `healthy: false`): so this shows the outcome
    // end to end, and the adapter's own filter is proved on a Nacos answer by
    // convert::tests::only_healthy_enabled_weighted_instances_are_endpoints.
    let nacos = Nacos::start_with(&[(
        "RNACOS_NAMING_PERPETUAL_INSTANCE_PROBE_INTERVAL_SECOND",
        "5",
    )]);
    let listen = |ip: &str| std::net::TcpListener::bind((ip, 0)).expect("bind");
    let port = |l: &std::net::TcpListener| l.local_addr().expect("addr").port();
    let (up1, up3) = (listen("127.0.0.1"), listen("127.0.0.3"));
    let down_port = port(&listen("127.0.0.2"));
    nacos.register(&Instance::new("orders", "127.0.0.1", port(&up1)));
    nacos.register(&Instance::new("orders", "127.0.0.2", down_port));
    let healthy = |ip: &str| {
        nacos
            .hosts("orders", DEFAULT_GROUP, "")
            .iter()
            .find(|h| h["ip"] == ip)
            .map(|h| h["healthy"] == true)
    };
    e2e::wait_for(
        CHANGE_TIMEOUT,
        "rnacos marks the closed port unhealthy",
        || (healthy("127.0.0.2") == Some(false)).then_some(()),
    );

    // Subscribed now: the answer carries the unhealthy instance, which is no endpoint.
    let (a, xds) = adapter(&nacos, &[]);
    until("only the healthy instance is an endpoint", &xds, |i| {
        addresses_of(i, ORDERS).is_some_and(|v| v == ["127.0.0.1"])
    });
    // A push (a third instance registered) still leaves it out.
    let third = Instance::new("orders", "127.0.0.3", port(&up3));
    nacos.register(&third);
    until(
        "the third instance in, the unhealthy one still out",
        &xds,
        |i| addresses_of(i, ORDERS).is_some_and(|v| v == ["127.0.0.1", "127.0.0.3"]),
    );
    // Its port answers: the next probe makes it healthy, the next push an endpoint.
    let _late = std::net::TcpListener::bind(("127.0.0.2", down_port)).expect("bind the late port");
    e2e::wait_for(CHANGE_TIMEOUT, "rnacos marks it healthy again", || {
        (healthy("127.0.0.2") == Some(true)).then_some(())
    });
    nacos.deregister(&third);
    until("the instance back once healthy", &xds, |i| {
        addresses_of(i, ORDERS).is_some_and(|v| v == ["127.0.0.1", "127.0.0.2"])
    });
    a.assert_no_registry_errors("as health changed");
}

#[test]
#[ignore = "needs rnacos and the Java registrar: tests/nacos/build.sh target/nacos (the README's test command builds them)"]
fn a_restart_that_loses_ephemeral_instances_is_held_until_their_clients_return() {
    // A Java client's instance is ephemeral: a restarted server has lost it until the client
    // has reconnected and registered it again (1-1.5 s here). The adapter's new watch finds no
    // instance where one was served and holds the last state meanwhile (--startup-grace): the
    // sink never sees the service without its endpoint, and no snapshot is built at all.
    let mut nacos = Nacos::start();
    let (a, xds) = adapter(&nacos, &[]);
    let mut client = Registrar::start(&nacos, None);
    client.register(
        "orders",
        DEFAULT_GROUP,
        "10.0.3.1",
        8080,
        1.0,
        &[("version", "v1")],
    );
    until("the client's instance served", &xds, |i| {
        endpoints(i, ORDERS) == [ep("10.0.3.1", 100, "v1")]
    });
    let snapshots = a.metric("mcp_adapter_snapshots_total");

    nacos.restart();
    e2e::wait_for(
        CHANGE_TIMEOUT,
        "the client's instance registered again",
        || (nacos.hosts("orders", DEFAULT_GROUP, "").len() == 1).then_some(()),
    );
    a.wait_registryz(
        CHANGE_TIMEOUT,
        "registryz 200 once the adapter reads it again",
        200,
    );
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots,
        "no snapshot across the restart (nothing was removed, then added back); log:\n{}",
        a.log_tail()
    );
    assert_eq!(
        endpoints(&mcpctl_get(&xds), ORDERS),
        [ep("10.0.3.1", 100, "v1")]
    );
    // And the session that followed is live: the client's next change is pushed.
    client.deregister("orders", DEFAULT_GROUP, "10.0.3.1", 8080);
    until("the deregistration after the restart", &xds, |i| {
        find(i, ORDERS).is_some() && endpoints(i, ORDERS).is_empty()
    });
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn tls_on_both_ports_with_a_client_certificate() {
    // rnacos speaks no TLS: TLS-terminating proxies stand where Nacos' own TLS would be, on an
    // HTTP port Q and its gRPC port Q + 1000, each demanding a client certificate.
    let nacos = Nacos::start();
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080));
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

    let a = Adapter::start(
        "adapter-nacos",
        &[
            "--nacos-addr",
            url.as_str(),
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
        endpoints(i, ORDERS).len() == 1
    });
    assert!(http_proxy.handshakes() >= 1 && grpc_proxy.handshakes() >= 1);
    nacos.register(&Instance::new("orders", "10.0.0.2", 8080));
    until("a push over TLS", &xds, |i| endpoints(i, ORDERS).len() == 2);
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

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn fails_over_to_the_next_address_when_the_first_server_stops() {
    // Two independent servers (no cluster replication in rnacos): each registration goes to
    // both, as a Nacos cluster's members would all answer for it.
    let mut first = Nacos::start();
    let second = Nacos::start();
    for n in [&first, &second] {
        n.register(&Instance::new("orders", "10.0.0.1", 8080));
    }
    let addrs = format!("{},{}", first.server_addr(), second.server_addr());
    let a = Adapter::start("adapter-nacos", &["--nacos-addr", addrs.as_str()]);
    a.wait_ready();
    let xds = a.xds_url();
    until("orders served", &xds, |i| endpoints(i, ORDERS).len() == 1);

    first.stop();
    // A change only the second server knows arrives: the adapter moved to it.
    second.register(&Instance::new("orders", "10.0.0.2", 8080));
    until("the second server's instance served", &xds, |i| {
        endpoints(i, ORDERS).len() == 2
    });
    a.wait_registryz(CHANGE_TIMEOUT, "registryz 200 on the second server", 200);
    assert!(
        a.log().contains(&second.server_addr()),
        "the log names the server it moved to:\n{}",
        a.log_tail()
    );
}

//! The Nacos harness (tests/src/nacos.rs) against the real peers it starts: rnacos 0.8.8 and
//! the official Java client (both built by tests/nacos/build.sh). These tests pin down what
//! later adapter-nacos tests rely on: what the Open API answers after each change, how fast an
//! ephemeral instance of a gRPC client appears and goes, what auth refuses, and what survives a
//! server restart.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::nacos::{Instance, Nacos, Registrar, DEFAULT_GROUP};
use e2e::{http, http_get, wait_for};

/// Bound for an ephemeral instance of the Java client to appear or go (measured: listed ~50 ms
/// after its register command, gone ~0.4 s after its quit command), with room for a busy
/// machine.
const GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// `host` without `instanceId` (checked on its own) as an object of the fields a registry
/// adapter reads.
fn fields(host: &Value) -> Value {
    json!({
        "ip": host["ip"],
        "port": host["port"],
        "weight": host["weight"],
        "healthy": host["healthy"],
        "enabled": host["enabled"],
        "ephemeral": host["ephemeral"],
        "clusterName": host["clusterName"],
        "serviceName": host["serviceName"],
        "metadata": host["metadata"],
    })
}

#[test]
#[ignore = "needs rnacos: tests/nacos/build.sh target/nacos (the README's test command builds it)"]
fn http_open_api_registers_updates_and_deregisters_a_persistent_instance() {
    let nacos = Nacos::start();
    let orders = Instance::new("orders", "10.0.0.1", 8080)
        .weight(2.5)
        .with_metadata("version", "v1")
        .with_metadata("protocol", "http");
    nacos.register(&orders);

    let list = nacos.list("orders", DEFAULT_GROUP, "");
    assert_eq!(list["name"], "DEFAULT_GROUP@@orders");
    let hosts = list["hosts"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 1, "{list}");
    assert_eq!(
        fields(&hosts[0]),
        json!({
            "ip": "10.0.0.1", "port": 8080, "weight": 2.5, "healthy": true, "enabled": true,
            "ephemeral": false, "clusterName": "DEFAULT", "serviceName": "DEFAULT_GROUP@@orders",
            "metadata": {"version": "v1", "protocol": "http"},
        })
    );
    // rnacos' instance id is `ip#port` (Nacos': `ip#port#cluster#group@@service`).
    assert_eq!(hosts[0]["instanceId"], "10.0.0.1#8080");
    assert_eq!(nacos.services(DEFAULT_GROUP, ""), ["orders"]);

    // A new weight and new metadata replace the old.
    nacos.update(&orders.clone().weight(0.5).with_metadata("canary", "true"));
    let hosts = nacos.hosts("orders", DEFAULT_GROUP, "");
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0]["weight"], 0.5);
    assert_eq!(
        hosts[0]["metadata"],
        json!({"version": "v1", "protocol": "http", "canary": "true"})
    );

    // A second instance, in another cluster; each is listed on its own.
    let second = Instance::new("orders", "10.0.0.2", 8081).cluster("east");
    nacos.register(&second);
    let hosts = nacos.hosts("orders", DEFAULT_GROUP, "");
    let addrs: Vec<(Value, Value, Value)> = hosts
        .iter()
        .map(|h| (h["ip"].clone(), h["port"].clone(), h["clusterName"].clone()))
        .collect();
    assert_eq!(
        addrs,
        [
            (json!("10.0.0.1"), json!(8080), json!("DEFAULT")),
            (json!("10.0.0.2"), json!(8081), json!("east"))
        ]
    );

    nacos.deregister(&orders);
    let hosts = nacos.hosts("orders", DEFAULT_GROUP, "");
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0]["ip"], "10.0.0.2");
    nacos.deregister(&second);
    assert_eq!(
        nacos.hosts("orders", DEFAULT_GROUP, ""),
        Vec::<Value>::new()
    );
}

#[test]
#[ignore = "needs rnacos and the Java registrar: tests/nacos/build.sh target/nacos (the README's test command builds them)"]
fn java_client_registers_an_ephemeral_instance_over_grpc_that_goes_with_its_connection() {
    let nacos = Nacos::start();
    nacos.create_namespace("dev", "Development");
    assert_eq!(
        nacos.namespaces(),
        [
            ("".to_string(), "public".to_string()),
            ("dev".to_string(), "Development".to_string())
        ]
    );

    let started = Instant::now();
    let mut registrar = Registrar::start(&nacos, Some("dev"));
    eprintln!(
        "the Java client was connected {:?} after its start",
        started.elapsed()
    );
    let registered = Instant::now();
    registrar.register(
        "payments",
        "pay-group",
        "10.0.0.7",
        9090,
        3.0,
        &[
            ("version", "v3"),
            ("preserved.register.source", "SPRING_CLOUD"),
        ],
    );
    let hosts = wait_for(GONE_TIMEOUT, "the registrar's instance listed", || {
        let hosts = nacos.hosts("payments", "pay-group", "dev");
        (!hosts.is_empty()).then_some(hosts)
    });
    eprintln!(
        "the Java client's instance was listed {:?} after its register command",
        registered.elapsed()
    );
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(
        fields(&hosts[0]),
        json!({
            "ip": "10.0.0.7", "port": 9090, "weight": 3.0, "healthy": true, "enabled": true,
            "ephemeral": true, "clusterName": "DEFAULT", "serviceName": "pay-group@@payments",
            "metadata": {"version": "v3", "preserved.register.source": "SPRING_CLOUD"},
        })
    );
    // Only in its namespace and group.
    assert_eq!(
        nacos.hosts("payments", "pay-group", ""),
        Vec::<Value>::new()
    );
    assert_eq!(
        nacos.hosts("payments", DEFAULT_GROUP, "dev"),
        Vec::<Value>::new()
    );
    assert_eq!(nacos.services("pay-group", "dev"), ["payments"]);

    // Deregistered by command, and registered again.
    registrar.deregister("payments", "pay-group", "10.0.0.7", 9090);
    wait_for(GONE_TIMEOUT, "the deregistered instance gone", || {
        nacos
            .hosts("payments", "pay-group", "dev")
            .is_empty()
            .then_some(())
    });
    registrar.register("payments", "pay-group", "10.0.0.7", 9090, 3.0, &[]);
    wait_for(GONE_TIMEOUT, "the instance listed again", || {
        (nacos.hosts("payments", "pay-group", "dev").len() == 1).then_some(())
    });

    // Its client shuts down: the connection closes and the instance goes with it.
    let shut = Instant::now();
    registrar.shutdown();
    wait_for(GONE_TIMEOUT, "the instance gone after shutDown()", || {
        nacos
            .hosts("payments", "pay-group", "dev")
            .is_empty()
            .then_some(())
    });
    eprintln!(
        "the Java client's instance was gone {:?} after its quit command (shutDown(), exit)",
        shut.elapsed()
    );
}

#[test]
#[ignore = "needs rnacos and the Java registrar: tests/nacos/build.sh target/nacos (the README's test command builds them)"]
fn with_auth_on_unauthenticated_requests_are_refused_and_logged_in_ones_work() {
    let nacos = Nacos::start_with_auth("nacos-admin", "s3cret-pw");
    assert!(nacos.token().is_some_and(|t| !t.is_empty()));
    assert_eq!(nacos.login("nacos-admin", "wrong"), None);

    let list_path = "/nacos/v1/ns/instance/list?serviceName=orders&healthyOnly=false";
    let (status, body) = http_get(nacos.http_addr(), list_path).expect("GET");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("unknown user!"), "{body}");
    let (status, body) = http(
        nacos.http_addr(),
        "POST",
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.9&port=1&ephemeral=false",
        &[],
        "",
    )
    .expect("POST");
    assert_eq!(status, 403, "{body}");
    // A token that is not one is refused too.
    let (status, _) = http(
        nacos.http_addr(),
        "GET",
        list_path,
        &[("accessToken", "not-a-token")],
        "",
    )
    .expect("GET");
    assert_eq!(status, 403);

    // The harness sends its token.
    nacos.register(&Instance::new("orders", "10.0.0.1", 8080));
    let hosts = nacos.hosts("orders", DEFAULT_GROUP, "");
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0]["ip"], "10.0.0.1");

    // The Java client logs in with the same credentials and registers over gRPC.
    let mut registrar = Registrar::start(&nacos, None);
    registrar.register("orders", DEFAULT_GROUP, "10.0.0.2", 8080, 1.0, &[]);
    wait_for(GONE_TIMEOUT, "the registrar's instance listed", || {
        (nacos.hosts("orders", DEFAULT_GROUP, "").len() == 2).then_some(())
    });
    registrar.shutdown();
}

#[test]
#[ignore = "needs rnacos and the Java registrar: tests/nacos/build.sh target/nacos (the README's test command builds them)"]
fn a_restart_keeps_the_ports_persistent_instances_and_namespaces_and_drops_ephemeral_ones() {
    let mut nacos = Nacos::start();
    nacos.create_namespace("dev", "Development");
    let persistent = Instance::new("orders", "10.0.0.1", 8080)
        .namespace("dev")
        .weight(2.0)
        .with_metadata("version", "v1");
    // Registered over HTTP, so nobody sends it heartbeats: it is dropped ~35 s after, but not
    // before the restart.
    let ephemeral = Instance::new("orders", "10.0.0.2", 8080)
        .namespace("dev")
        .ephemeral(true);
    nacos.register(&persistent);
    nacos.register(&ephemeral);
    assert_eq!(nacos.hosts("orders", DEFAULT_GROUP, "dev").len(), 2);
    // A connected 2.x client's ephemeral instance.
    let mut registrar = Registrar::start(&nacos, Some("dev"));
    registrar.register("orders", DEFAULT_GROUP, "10.0.0.3", 8080, 1.0, &[]);
    wait_for(GONE_TIMEOUT, "three instances", || {
        (nacos.hosts("orders", DEFAULT_GROUP, "dev").len() == 3).then_some(())
    });

    let (addr, grpc) = (nacos.http_addr(), nacos.grpc_port());
    let stopped = Instant::now();
    nacos.stop();
    eprintln!("rnacos stopped {:?} after SIGINT", stopped.elapsed());
    assert!(
        http_get(addr, "/health").is_err(),
        "nothing answers once stopped"
    );
    let started = Instant::now();
    nacos.restart();
    eprintln!("rnacos answered {:?} after its restart", started.elapsed());
    assert_eq!((nacos.http_addr(), nacos.grpc_port()), (addr, grpc));

    // The persistent instance and the namespace survive; the HTTP-registered ephemeral one does
    // not.
    let hosts = nacos.hosts("orders", DEFAULT_GROUP, "dev");
    let ips: Vec<&str> = hosts.iter().filter_map(|h| h["ip"].as_str()).collect();
    assert!(!ips.contains(&"10.0.0.2"), "{hosts:?}");
    let kept = hosts
        .iter()
        .find(|h| h["ip"] == "10.0.0.1")
        .unwrap_or_else(|| panic!("the persistent instance after the restart: {hosts:?}"));
    assert_eq!(
        fields(kept),
        json!({
            "ip": "10.0.0.1", "port": 8080, "weight": 2.0, "healthy": true, "enabled": true,
            "ephemeral": false, "clusterName": "DEFAULT", "serviceName": "DEFAULT_GROUP@@orders",
            "metadata": {"version": "v1"},
        })
    );
    assert!(nacos
        .namespaces()
        .contains(&("dev".to_string(), "Development".to_string())));

    // The Java client reconnects and registers its instance again.
    let restarted = Instant::now();
    let hosts = wait_for(
        Duration::from_secs(60),
        "the client's instance back",
        || {
            let hosts = nacos.hosts("orders", DEFAULT_GROUP, "dev");
            hosts.iter().any(|h| h["ip"] == "10.0.0.3").then_some(hosts)
        },
    );
    eprintln!(
        "the Java client's instance was back {:?} after the restart",
        restarted.elapsed()
    );
    let ips: Vec<&str> = hosts.iter().filter_map(|h| h["ip"].as_str()).collect();
    assert_eq!(ips, ["10.0.0.1", "10.0.0.3"]);

    // The API takes changes again.
    nacos.deregister(&persistent);
    registrar.shutdown();
    wait_for(GONE_TIMEOUT, "no instances", || {
        nacos
            .hosts("orders", DEFAULT_GROUP, "dev")
            .is_empty()
            .then_some(())
    });
}

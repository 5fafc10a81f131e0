//! adapter-eureka against a real Spring Cloud Netflix Eureka server (built from Maven Central
//! by tests/eureka/build.sh), observed through mcpctl as a sink sees it. The adapter runs with
//! its default flags (refresh every 5s), so each change is served within one interval.

use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::Value;

use e2e::eureka::{Eureka, Instance};
use e2e::pki::make_pki;
use e2e::{addresses_of, find, mcpctl_get, wait_for, Adapter};

/// A change must reach the sink within this: one 5s refresh, plus a loaded machine.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// adapter-eureka with `args`, ready: it and its `xds://` address.
fn adapter(args: &[&str]) -> (Adapter, String) {
    let a = Adapter::start("adapter-eureka", args);
    a.wait_ready();
    let xds = a.xds_url();
    (a, xds)
}

/// adapter-eureka with its default flags on `eureka`, ready: it and its `xds://` address.
fn adapter_defaults(eureka: &Eureka) -> (Adapter, String) {
    adapter(&["--eureka-url", eureka.url().as_str()])
}

/// Instance orders-1 of `orders` at 10.0.0.1:8080, with metadata `version: v1`.
fn orders_1_v1() -> Instance {
    Instance::new("orders", "orders-1", "10.0.0.1", 8080).with_metadata("version", "v1")
}

fn until(what: &str, xds: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    e2e::wait_served(CHANGE_TIMEOUT, what, xds, pred)
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn harness_registers_changes_and_cancels_through_the_rest_api() {
    let eureka = Eureka::start();
    eureka.register(&orders_1_v1());
    assert_eq!(
        eureka.statuses("orders"),
        [("orders-1".to_string(), "UP".to_string())]
    );
    assert_eq!(eureka.heartbeat("orders", "orders-1"), 200);
    assert_eq!(eureka.heartbeat("orders", "nobody"), 404);
    eureka.set_status("orders", "orders-1", "OUT_OF_SERVICE");
    assert_eq!(eureka.statuses("orders")[0].1, "OUT_OF_SERVICE");
    eureka.clear_status("orders", "orders-1");
    assert_eq!(eureka.statuses("orders")[0].1, "UP");
    eureka.set_metadata("orders", "orders-1", "version", "v2");
    let apps = eureka.apps();
    assert_eq!(
        apps["applications"]["application"][0]["instance"][0]["metadata"]["version"],
        "v2"
    );
    // The delta carries the recent changes and the hash of the full registry.
    let delta = eureka.delta();
    assert_eq!(delta["applications"]["apps__hashcode"], "UP_1_");
    eureka.deregister("orders", "orders-1");
    assert!(eureka.statuses("orders").is_empty());
    assert_eq!(eureka.delta()["applications"]["apps__hashcode"], "");
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn register_status_down_and_deregister_reach_the_sink() {
    let eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    eureka.register(&Instance::new("orders", "orders-2", "10.0.0.2", 8080));
    let (a, xds) = adapter_defaults(&eureka);

    let items = until("orders served with two endpoints", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });
    let orders = find(&items, "orders").expect("orders");
    assert_eq!(orders["metadata"]["namespace"], "eureka");
    assert_eq!(orders["spec"]["hosts"][0], "orders.eureka");
    assert_eq!(orders["spec"]["ports"][0]["number"], 8080);
    assert_eq!(orders["spec"]["ports"][0]["protocol"], "HTTP");

    // Registered later: picked up by a delta.
    let mut pay = Instance::new("payments", "payments-1", "10.0.1.1", 9090);
    pay.vip = Some("payments.example.com".into());
    eureka.register(&pay);
    let items = until("payments served", &xds, |i| find(i, "payments").is_some());
    assert_eq!(
        find(&items, "payments").expect("payments")["spec"]["hosts"][0],
        "payments.example.com"
    );

    // DOWN (an operator's override): its endpoint goes, the other stays.
    eureka.set_status("orders", "orders-1", "DOWN");
    until("orders-1 gone after DOWN", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v == ["10.0.0.2"])
    });
    // Back UP.
    eureka.clear_status("orders", "orders-1");
    until("orders-1 back after UP", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });

    // Every instance OUT_OF_SERVICE: kept with no endpoints (default --on-empty keep).
    eureka.set_status("orders", "orders-1", "OUT_OF_SERVICE");
    eureka.set_status("orders", "orders-2", "OUT_OF_SERVICE");
    until("orders kept with no endpoints", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.is_empty())
    });

    // Cancel: the app leaves Eureka, its ServiceEntry goes.
    eureka.deregister("orders", "orders-1");
    eureka.deregister("orders", "orders-2");
    until("orders removed after cancel", &xds, |i| {
        find(i, "orders").is_none() && find(i, "payments").is_some()
    });
    a.assert_no_registry_errors("as instances came and went");
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn unchanged_registry_builds_no_snapshot_and_has_no_errors() {
    let eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let (a, xds) = adapter_defaults(&eureka);
    until("orders served", &xds, |i| find(i, "orders").is_some());

    // Four refresh intervals of the default 5s.
    a.assert_steady_polling(
        Duration::from_secs(21),
        Duration::from_millis(500),
        &["/registryz"],
    );
    // No full fetch beyond the first: deltas matched the hashcode every time.
    let full_fetches = a.log().matches("full fetch").count();
    assert_eq!(full_fetches, 1, "{}", a.log_tail());
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn server_down_keeps_the_last_good_state() {
    let mut eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let (a, xds) = adapter_defaults(&eureka);
    until("orders served", &xds, |i| find(i, "orders").is_some());

    eureka.stop();
    let body = a.wait_registryz(CHANGE_TIMEOUT, "registryz 503 during the outage", 503);
    assert!(body.contains("eureka"), "{body}");
    assert_eq!(a.get("/readyz").0, 200, "the last good state is served");
    let items = mcpctl_get(&xds);
    assert_eq!(
        addresses_of(&items, "orders"),
        Some(vec!["10.0.0.1".to_string()]),
        "last good state served to a new sink"
    );
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn bad_ip_skips_one_instance_with_a_problem_naming_it() {
    let eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    eureka.register(&Instance::new("orders", "orders-bad", "not-an-ip", 8080));
    let (a, xds) = adapter_defaults(&eureka);
    until("orders served with its good instance", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v == ["10.0.0.1"])
    });
    let problems = a.debug()["problems"].to_string();
    assert!(
        problems.contains("ORDERS") && problems.contains("orders-bad"),
        "{problems}"
    );
    // Fixed by cancelling it: the problem clears.
    eureka.deregister("orders", "orders-bad");
    a.wait_problems(CHANGE_TIMEOUT, "problem cleared", |p| {
        !p.contains("orders-bad")
    });
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn fails_over_to_the_next_url_when_the_first_server_stops() {
    // Two independent servers (no replication): each registration goes to both, as Eureka
    // clients with two `defaultZone` URLs effectively see after peer replication.
    let mut first = Eureka::start();
    let second = Eureka::start();
    for e in [&first, &second] {
        e.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    }
    let (u1, u2) = (first.url(), second.url());
    let (a, xds) = adapter(&[
        "--eureka-url",
        u1.as_str(),
        "--eureka-url",
        u2.as_str(),
        "--failback-after",
        "3s",
    ]);
    until("orders served", &xds, |i| find(i, "orders").is_some());

    first.stop();
    // A change only the second server knows arrives: the adapter switched to it.
    second.register(&Instance::new("orders", "orders-2", "10.0.0.2", 8080));
    until("orders-2 served from the second server", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });
    assert_eq!(a.get("/registryz").0, 200, "{}", a.log_tail());
    assert!(
        a.log().contains("switched Eureka server"),
        "{}",
        a.log_tail()
    );

    // The first server back (empty, then its clients re-register; here with an instance only it
    // has): after --failback-after the adapter returns to it.
    first.restart();
    for id in ["orders-1", "orders-2"] {
        first.register(&Instance::new("orders", id, "10.0.0.1", 8080));
    }
    first.register(&Instance::new("orders", "orders-9", "10.0.0.9", 8080));
    until("served from the first server again", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.contains(&"10.0.0.9".to_string()))
    });
    assert_eq!(a.get("/registryz").0, 200, "{}", a.log_tail());
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn restarted_empty_server_is_not_believed_during_the_startup_grace() {
    let mut eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let (a, xds) = adapter(&[
        "--eureka-url",
        eureka.url().as_str(),
        "--startup-grace",
        "20s",
    ]);
    until("orders served", &xds, |i| find(i, "orders").is_some());

    eureka.restart();
    // The empty registry of the restarted server is held back...
    let held = Instant::now();
    wait_for(CHANGE_TIMEOUT, "the empty registry held back", || {
        a.log()
            .contains("holding the last state during the startup grace")
            .then_some(())
    });
    assert_eq!(
        addresses_of(&mcpctl_get(&xds), "orders"),
        Some(vec!["10.0.0.1".to_string()]),
        "last state served during the grace"
    );
    // ...and believed once the grace is over.
    until("orders removed after the grace", &xds, |i| {
        find(i, "orders").is_none()
    });
    assert!(
        held.elapsed() >= Duration::from_secs(10),
        "{:?}",
        held.elapsed()
    );
    // A client re-registering is served again.
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    until("orders back", &xds, |i| find(i, "orders").is_some());
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn metadata_change_reaches_the_endpoint_labels() {
    let eureka = Eureka::start();
    eureka.register(&orders_1_v1());
    let (_a, xds) = adapter_defaults(&eureka);
    let label = |items: &[Value]| {
        find(items, "orders").map(|o| o["spec"]["endpoints"][0]["labels"]["version"].clone())
    };
    until("v1 served", &xds, |i| label(i).is_some_and(|v| v == "v1"));
    eureka.set_metadata("orders", "orders-1", "version", "v2");
    until("v2 served", &xds, |i| label(i).is_some_and(|v| v == "v2"));
}

/// The registry's creation time of `app` as RFC 3339: the earliest of its instances' first UP
/// on the server (else registration, for one never UP): what the adapter serves as
/// `creationTimestamp`.
fn oldest_lease(eureka: &Eureka, app: &str) -> String {
    let ms = eureka
        .leases(app)
        .iter()
        .map(|(_, registered, up)| if *up > 0 { *up } else { *registered })
        .filter(|ms| *ms > 0)
        .min()
        .expect("leases with times");
    mcpctl::render::rfc3339(UNIX_EPOCH + Duration::from_millis(ms))
}

fn created(items: &[Value], name: &str) -> Value {
    find(items, name).expect("served")["metadata"]["creationTimestamp"].clone()
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn create_time_is_the_oldest_instance_and_replicas_and_restarts_agree() {
    let eureka = Eureka::start();
    eureka.register(&orders_1_v1());
    // Another millisecond for the second instance's lease.
    std::thread::sleep(Duration::from_millis(20));
    eureka.register(&Instance::new("orders", "orders-2", "10.0.0.2", 8080));
    let oldest = oldest_lease(&eureka, "orders");
    assert!(!oldest.starts_with("1970"), "{oldest}");

    let (mut one, xds_one) = adapter_defaults(&eureka);
    let (two, xds_two) = adapter_defaults(&eureka);
    let both = |i: &[Value]| addresses_of(i, "orders").is_some_and(|v| v.len() == 2);
    let a = until("orders on replica one", &xds_one, both);
    let b = until("orders on replica two", &xds_two, both);
    assert_eq!(
        created(&a, "orders"),
        oldest.as_str(),
        "the registry's time"
    );
    assert_eq!(
        find(&a, "orders"),
        find(&b, "orders"),
        "replicas agree on every byte, creation time and version included"
    );

    // Unrelated changes: a third instance, and orders-1 registering again with new metadata
    // (what a Eureka client does when its instance info changes: the server makes a new lease,
    // with a new registration time, and keeps the first-UP time).
    let (_, registered_before, _) = eureka.leases("orders")[0].clone();
    std::thread::sleep(Duration::from_millis(20));
    eureka.register(&Instance::new("orders", "orders-3", "10.0.0.3", 8080));
    eureka.register(
        &Instance::new("orders", "orders-1", "10.0.0.1", 8080).with_metadata("version", "v2"),
    );
    let (_, registered_after, _) = eureka.leases("orders")[0].clone();
    assert!(registered_after > registered_before, "a new lease");
    let changed = |i: &[Value]| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 3)
            && find(i, "orders").is_some_and(|o| {
                o["spec"]["endpoints"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["labels"]["version"] == "v2"))
            })
    };
    let a = until("orders-3 and v2 on replica one", &xds_one, changed);
    let b = until("orders-3 and v2 on replica two", &xds_two, changed);
    assert_eq!(created(&a, "orders"), oldest.as_str(), "unchanged");
    assert_eq!(find(&a, "orders"), find(&b, "orders"));

    // A restart computes the same.
    one.restart();
    one.wait_ready();
    let a = until("orders after a restart", &xds_one, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 3)
    });
    assert_eq!(
        find(&a, "orders"),
        find(&b, "orders"),
        "same bytes after a restart"
    );

    // The oldest instance leaves: the service is as old as its oldest instance left.
    eureka.deregister("orders", "orders-1");
    let next = oldest_lease(&eureka, "orders");
    assert_ne!(next, oldest);
    let a = until("orders-1 gone", &xds_one, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });
    assert_eq!(created(&a, "orders"), next.as_str());
    one.assert_no_registry_errors("while instances came and went");
    two.assert_no_registry_errors("while instances came and went");
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn lease_expiry_removes_the_instance() {
    let eureka = Eureka::start();
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let mut short = Instance::new("orders", "orders-2", "10.0.0.2", 8080);
    short.lease_secs = 3;
    eureka.register(&short);
    let (_a, xds) = adapter_defaults(&eureka);
    // No heartbeats for orders-2: the server evicts it (self-preservation is off), the delta
    // says DELETED.
    until("orders-2 expired", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v == ["10.0.0.1"])
    });
    assert!(eureka
        .statuses("orders")
        .iter()
        .all(|(id, _)| id != "orders-2"));
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn hashcode_mismatch_forces_a_full_fetch() {
    // Changes leave the server's delta queue after 500 ms, long before the adapter's next
    // delta (5 s): the deltas it sees are empty, and only the hashcode tells it that the
    // registry changed.
    let eureka = Eureka::start_with(&[
        "--eureka.server.retention-time-in-m-s-in-delta-queue=500",
        "--eureka.server.delta-retention-timer-interval-in-ms=250",
    ]);
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let (a, xds) = adapter_defaults(&eureka);
    until("orders served", &xds, |i| find(i, "orders").is_some());

    eureka.register(&Instance::new("orders", "orders-2", "10.0.0.2", 8080));
    until("orders-2 served after a full fetch", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });
    assert!(a.log().contains("hashcode mismatch"), "{}", a.log_tail());
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn two_hundred_apps_of_five_instances() {
    let eureka = Eureka::start();
    for app in 0..200 {
        for n in 0..5 {
            eureka.register(&Instance::new(
                &format!("app-{app}"),
                &format!("app-{app}-{n}"),
                &format!("10.{}.{}.{n}", app / 100, app % 100),
                8080,
            ));
        }
    }
    let started = Instant::now();
    let (_a, xds) = adapter_defaults(&eureka);
    let items = until("200 apps served", &xds, |i| i.len() == 200);
    eprintln!(
        "200 apps x 5 served {:?} after the adapter started",
        started.elapsed()
    );
    assert!(items
        .iter()
        .all(|i| i["spec"]["endpoints"].as_array().map(Vec::len) == Some(5)));
    // One change among them is a delta touching one app.
    eureka.set_status("app-7", "app-7-0", "DOWN");
    until("app-7 down to four", &xds, |i| {
        addresses_of(i, "app-7").is_some_and(|v| v.len() == 4)
    });
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn server_with_deltas_disabled_is_read_in_full() {
    // `disable-delta=true`: the server answers /apps/delta with 403.
    let eureka = Eureka::start_with(&["--eureka.server.disable-delta=true"]);
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let (a, xds) = adapter_defaults(&eureka);
    until("orders served", &xds, |i| find(i, "orders").is_some());
    eureka.register(&Instance::new("orders", "orders-2", "10.0.0.2", 8080));
    until("orders-2 served", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });
    a.assert_no_registry_errors("with deltas refused");
    assert!(a.log().contains("refuses deltas"), "{}", a.log_tail());
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn basic_auth_from_env_or_file_and_never_logged() {
    let password = "s3cret-Pa55";
    let eureka = Eureka::start_with_auth("mesh", password);
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let url = eureka.url();

    // Without credentials: refused, reported as such, nothing served.
    let none = Adapter::start("adapter-eureka", &["--eureka-url", url.as_str()]);
    wait_for(CHANGE_TIMEOUT, "an unauthorized error", || {
        none.log().contains("refused access").then_some(())
    });
    assert_eq!(none.get("/readyz").0, 503);

    // From the environment.
    let env = Adapter::start_with_env(
        "adapter-eureka",
        &["--eureka-url", url.as_str()],
        &[("EUREKA_USERNAME", "mesh"), ("EUREKA_PASSWORD", password)],
    );
    env.wait_ready();
    until("orders served (env credentials)", &env.xds_url(), |i| {
        find(i, "orders").is_some()
    });

    // From a file.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("auth");
    std::fs::write(&file, format!("mesh:{password}\n")).expect("write");
    let file = file.to_string_lossy().to_string();
    let from_file = Adapter::start(
        "adapter-eureka",
        &[
            "--eureka-url",
            url.as_str(),
            "--eureka-auth-file",
            file.as_str(),
        ],
    );
    from_file.wait_ready();
    until(
        "orders served (file credentials)",
        &from_file.xds_url(),
        |i| find(i, "orders").is_some(),
    );
    for a in [&none, &env, &from_file] {
        assert!(!a.log().contains(password), "password logged:\n{}", a.log());
    }
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn https_with_a_custom_ca_and_a_client_certificate() {
    let pki = tempfile::tempdir().expect("tempdir");
    make_pki(pki.path());
    let eureka = Eureka::start_with_tls(pki.path());
    eureka.register(&Instance::new("orders", "orders-1", "10.0.0.1", 8080));
    let url = eureka.url();
    assert!(url.starts_with("https://"), "{url}");
    let file = |f: &str| pki.path().join(f).display().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));

    // CA and client certificate: served.
    let (a, xds) = adapter(&[
        "--eureka-url",
        &url,
        "--eureka-ca",
        &ca,
        "--eureka-client-cert",
        &cert,
        "--eureka-client-key",
        &key,
    ]);
    until("orders over HTTPS", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v == ["10.0.0.1"])
    });
    a.assert_no_registry_errors("over HTTPS");

    // The CA but no client certificate: the server refuses the handshake, and /registryz says
    // the registry cannot be read.
    let no_cert = Adapter::start(
        "adapter-eureka",
        &["--eureka-url", &url, "--eureka-ca", &ca],
    );
    // Until the first attempt fails, /registryz only says "not synced yet": wait for the
    // answer that names the server it could not read.
    let body = no_cert.wait_admin(
        CHANGE_TIMEOUT,
        "/registryz 503 naming the server, without a client certificate",
        "/registryz",
        |status, body| status == 503 && (body.contains(&url) || body.contains("127.0.0.1")),
    );
    assert!(
        no_cert.metric("mcp_adapter_registry_errors_total") > 0.0,
        "a registry error is counted: {body}"
    );
    assert_eq!(no_cert.get("/readyz").0, 503, "never synced");

    // A client certificate but not the CA: the server's certificate is not trusted.
    let no_ca = Adapter::start(
        "adapter-eureka",
        &[
            "--eureka-url",
            &url,
            "--eureka-client-cert",
            &cert,
            "--eureka-client-key",
            &key,
        ],
    );
    wait_for(CHANGE_TIMEOUT, "registry errors without the CA", || {
        (no_ca.metric("mcp_adapter_registry_errors_total") > 0.0).then_some(())
    });
    assert_eq!(no_ca.get("/readyz").0, 503, "never synced");
}

#[test]
#[ignore = "needs eureka: tests/eureka/build.sh target/eureka (the README's test command builds it)"]
fn huge_metadata_is_cut_to_max_labels_and_an_answer_over_the_cap_keeps_the_last_good_state() {
    // Changes leave the delta queue (and the server's cached delta) within about a second, so
    // that an instance that came and went does not stay in every delta for 3 minutes.
    let eureka = Eureka::start_with(&[
        "--eureka.server.retention-time-in-m-s-in-delta-queue=1000",
        "--eureka.server.delta-retention-timer-interval-in-ms=250",
        "--eureka.server.response-cache-auto-expiration-in-seconds=1",
    ]);
    eureka.register(&orders_1_v1());
    let (a, xds) = adapter_defaults(&eureka);
    let (capped, capped_xds) = adapter(&[
        "--eureka-url",
        eureka.url().as_str(),
        "--max-response-size",
        "8KiB",
    ]);
    let one = until("orders on the capped adapter", &capped_xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 1)
    });

    // 200 metadata keys with 40-byte values: 12 KiB more in every answer that holds it.
    let mut huge = Instance::new("orders", "orders-2", "10.0.0.2", 8080);
    for i in 0..200 {
        huge = huge.with_metadata(&format!("key-{i:03}"), &format!("{i:040}"));
    }
    eureka.register(&huge);
    let items = until("orders-2 served", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
    });
    let endpoints = find(&items, "orders").expect("orders")["spec"]["endpoints"].clone();
    let labels = endpoints
        .as_array()
        .and_then(|e| e.iter().find(|e| e["address"] == "10.0.0.2"))
        .map(|e| e["labels"].as_object().cloned().unwrap_or_default())
        .expect("orders-2");
    assert_eq!(labels.len(), 64, "the default --max-labels");
    assert!(labels.contains_key("key-063") && !labels.contains_key("key-064"));
    assert_eq!(
        a.metric_with(
            "mcp_adapter_translation_warnings_total",
            "kind=\"label_limit\""
        ),
        1.0,
        "{}",
        a.log_tail()
    );
    a.assert_no_registry_errors("with huge metadata");

    // The capped adapter: the delta (or /apps) is over 8 KiB, an error naming URL and limit;
    // it keeps serving what it had.
    let body = capped.wait_registryz(CHANGE_TIMEOUT, "registryz 503 for the large answer", 503);
    assert!(
        body.contains(&eureka.url()) && body.contains("larger than --max-response-size 8 KiB"),
        "{body}"
    );
    assert_eq!(capped.get("/readyz").0, 200);
    assert_eq!(
        find(&mcpctl_get(&capped_xds), "orders"),
        find(&one, "orders"),
        "the last good state, unchanged"
    );

    // The instance leaves (and the delta queue forgets it): both in sync and steady.
    eureka.deregister("orders", "orders-2");
    until("orders-2 gone", &xds, |i| {
        addresses_of(i, "orders").is_some_and(|v| v.len() == 1)
    });
    capped.wait_registryz(Duration::from_secs(60), "registryz 200 again", 200);
    assert_eq!(
        addresses_of(&mcpctl_get(&capped_xds), "orders"),
        Some(vec!["10.0.0.1".to_string()])
    );
    let snapshots = |x: &Adapter| x.metric("mcp_adapter_snapshots_total");
    let (since, capped_errors) = (
        (snapshots(&a), snapshots(&capped)),
        capped.metric("mcp_adapter_registry_errors_total"),
    );
    // Two refresh intervals of 5 s.
    capped.assert_recovered(Duration::from_secs(11));
    a.assert_no_registry_errors("after the instance left");

    // A small instance after the window is each adapter's one snapshot since before it, and
    // the capped one takes it without an error: a snapshot or error that came late, after the
    // window (a late oversized answer), would be counted here.
    eureka.register(&Instance::new("orders", "orders-3", "10.0.0.3", 8080));
    for (what, x) in [("orders-3 served", &xds), ("orders-3 capped", &capped_xds)] {
        until(what, x, |i| {
            addresses_of(i, "orders").is_some_and(|v| v.len() == 2)
        });
    }
    assert_eq!(
        (snapshots(&a), snapshots(&capped)),
        (since.0 + 1.0, since.1 + 1.0),
        "orders-3 is each one's one snapshot since before the window; log:\n{}\ncapped:\n{}",
        a.log_tail(),
        capped.log_tail()
    );
    assert_eq!(
        capped.metric("mcp_adapter_registry_errors_total"),
        capped_errors,
        "{}",
        capped.log_tail()
    );
    a.assert_no_registry_errors("after orders-3");
}

//! adapter-consul against a real Consul agent (built from the Go module proxy by
//! tests/consul/build.sh), observed through mcpctl as a sink sees it.

use std::time::Duration;

use e2e::consul::Consul;
use e2e::{find, item_names, mcpctl_get, wait_for, Adapter};

const NEEDS: &str =
    "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)";

fn adapter(consul: &Consul, extra: &[&str], env: &[(&str, &str)]) -> Adapter {
    let addr = consul.addr();
    let mut args = vec!["--consul-addr", addr.as_str(), "--coalesce", "0"];
    args.extend_from_slice(extra);
    Adapter::start_with_env("adapter-consul", &args, env)
}

fn until(
    what: &str,
    xds: &str,
    pred: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    wait_for(Duration::from_secs(20), what, || {
        let items = mcpctl_get(xds);
        pred(&items).then_some(items)
    })
}

fn addresses(item: &serde_json::Value) -> Vec<String> {
    item["spec"]["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)"]
fn follows_registrations_health_tags_and_meta() {
    let _ = NEEDS;
    let consul = Consul::start(None);
    consul.register(
        "n1",
        "web",
        "web-1",
        "10.0.0.1",
        8080,
        &["version|v1"],
        &[("protocol", "http")],
        "passing",
    );
    // The deny-list keeps Consul's own `consul` service out.
    let a = adapter(&consul, &["--exclude-service", "cons*"], &[]);
    a.wait_ready();
    let xds = format!("xds://{}", a.grpc);

    let items = until("web served", &xds, |i| find(i, "web").is_some());
    let web = find(&items, "web").expect("web");
    assert_eq!(
        item_names(&items),
        vec!["consul/web"],
        "excluded services are not served: {items:?}"
    );
    assert_eq!(web["spec"]["hosts"][0], "web.service.consul");
    assert_eq!(web["spec"]["ports"][0]["name"], "http-8080");
    assert_eq!(web["spec"]["ports"][0]["protocol"], "HTTP");
    assert_eq!(web["spec"]["endpoints"][0]["labels"]["version"], "v1");
    assert_eq!(web["spec"]["endpoints"][0]["locality"], "dc1");

    // Register a second instance.
    consul.register(
        "n2",
        "web",
        "web-2",
        "10.0.0.2",
        8080,
        &["version|v2"],
        &[("protocol", "http")],
        "passing",
    );
    until("second instance", &xds, |i| {
        find(i, "web").is_some_and(|w| addresses(w) == ["10.0.0.1", "10.0.0.2"])
    });

    // A check goes critical: the instance leaves; back to passing: it returns.
    consul.set_check("n2", "web-2", "critical");
    until("critical instance dropped", &xds, |i| {
        find(i, "web").is_some_and(|w| addresses(w) == ["10.0.0.1"])
    });
    consul.set_check("n2", "web-2", "passing");
    until("instance back", &xds, |i| {
        find(i, "web").is_some_and(|w| addresses(w).len() == 2)
    });

    // Tags and meta change.
    consul.register(
        "n2",
        "web",
        "web-2",
        "10.0.0.2",
        8080,
        &["version|v3", "team=pay"],
        &[("protocol", "http"), ("owner", "ops")],
        "passing",
    );
    let items = until("labels changed", &xds, |i| {
        find(i, "web").is_some_and(|w| w["spec"]["endpoints"][1]["labels"]["version"] == "v3")
    });
    let ep = &find(&items, "web").expect("web")["spec"]["endpoints"][1]["labels"];
    assert_eq!(ep["team"], "pay");
    assert_eq!(ep["owner"], "ops");

    // All instances critical: kept with no endpoints (the default).
    consul.set_check("n1", "web-1", "critical");
    consul.set_check("n2", "web-2", "critical");
    until("no healthy instances", &xds, |i| {
        find(i, "web").is_some_and(|w| addresses(w).is_empty())
    });

    // A new service appears and vanishes.
    consul.register(
        "n3",
        "db",
        "db-1",
        "10.0.1.1",
        5432,
        &[],
        &[("protocol", "tcp"), ("external", "true")],
        "passing",
    );
    let items = until("db appeared", &xds, |i| find(i, "db").is_some());
    let db = find(&items, "db").expect("db");
    assert_eq!(db["spec"]["ports"][0]["name"], "tcp-5432");
    // MESH_EXTERNAL is the enum's zero value: protojson (and so mcpctl and istiod) omit it.
    assert!(db["spec"]["location"].is_null(), "{db}");
    let web_now = find(&items, "web").expect("web");
    assert_eq!(web_now["spec"]["location"], "MESH_INTERNAL");
    consul.deregister("n3", "db-1");
    until("db vanished", &xds, |i| find(i, "db").is_none());

    // Deregistering every instance removes the service.
    consul.deregister("n1", "web-1");
    consul.deregister("n2", "web-2");
    until("web vanished", &xds, |i| find(i, "web").is_none());
    assert_eq!(a.get("/readyz").0, 200);
}

#[test]
#[ignore = "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)"]
fn consul_restart_keeps_last_state_and_recovers_with_an_index_reset() {
    let mut consul = Consul::start(None);
    consul.register("n1", "web", "web-1", "10.0.0.1", 8080, &[], &[], "passing");
    let a = adapter(&consul, &[], &[]);
    a.wait_ready();
    let xds = format!("xds://{}", a.grpc);
    until("web served", &xds, |i| find(i, "web").is_some());

    consul.kill();
    wait_for(
        Duration::from_secs(20),
        "readyz 503 during the outage",
        || {
            let (s, body) = a.get("/readyz");
            (s == 503).then_some(body)
        },
    );
    let (_, body) = a.get("/readyz");
    assert!(body.contains("last good state"), "{body}");
    // The last good state is still served, to new sinks too.
    assert!(find(&mcpctl_get(&xds), "web").is_some());
    let metrics = a.get("/metrics").1;
    assert!(
        metrics.contains("mcp_adapter_registry_healthy{registry=\"consul\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "mcp_adapter_registry_errors_total{kind=\"unavailable\",registry=\"consul\"}"
        ),
        "{metrics}"
    );

    // Consul comes back empty (dev mode), with indexes starting over: the adapter recovers
    // without a restart and serves the new truth.
    consul.restart();
    consul.register(
        "n9",
        "api",
        "api-1",
        "10.0.9.1",
        9090,
        &[],
        &[("protocol", "grpc")],
        "passing",
    );
    let items = until("state after the restart", &xds, |i| {
        find(i, "api").is_some() && find(i, "web").is_none()
    });
    assert_eq!(
        find(&items, "api").expect("api")["spec"]["ports"][0]["protocol"],
        "GRPC"
    );
    a.wait_ready();
    // And it keeps watching after the index reset.
    consul.register(
        "n9",
        "api",
        "api-2",
        "10.0.9.2",
        9090,
        &[],
        &[("protocol", "grpc")],
        "passing",
    );
    until("change after the restart", &xds, |i| {
        find(i, "api").is_some_and(|w| addresses(w).len() == 2)
    });
}

#[test]
#[ignore = "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)"]
fn acl_tokens_without_and_with_rights() {
    let consul = Consul::start(Some(
        r#"acl { enabled = true default_policy = "deny" tokens { initial_management = "root" } }"#,
    ));
    consul.register("n1", "web", "web-1", "10.0.0.1", 8080, &[], &[], "passing");

    // An unknown token: Consul answers 403; the adapter says so and is not ready.
    let bad = adapter(
        &consul,
        &[],
        &[("CONSUL_HTTP_TOKEN", "00000000-0000-0000-0000-000000000000")],
    );
    let body = wait_for(Duration::from_secs(20), "ACL error on /readyz", || {
        let (s, body) = bad.get("/readyz");
        (s == 503 && body.contains("ACL")).then_some(body)
    });
    assert!(body.contains("403"), "{body}");
    assert!(
        !bad.log().contains("00000000-0000-0000-0000-000000000000"),
        "the token must never be logged"
    );
    assert!(bad
        .get("/metrics")
        .1
        .contains("mcp_adapter_registry_errors_total{kind=\"unauthorized\",registry=\"consul\"}"));

    // A valid token without rights sees nothing (Consul filters by ACL).
    let empty = consul.must("PUT", "/v1/acl/token", r#"{"Description":"no rights"}"#);
    let empty: serde_json::Value = serde_json::from_str(&empty).expect("token JSON");
    let empty_secret = empty["SecretID"].as_str().expect("secret").to_string();
    let none = adapter(&consul, &[], &[("CONSUL_HTTP_TOKEN", &empty_secret)]);
    none.wait_ready();
    assert!(mcpctl_get(&format!("xds://{}", none.grpc)).is_empty());

    // A token with service:read and node:read, from a token file.
    consul.must(
        "PUT",
        "/v1/acl/policy",
        r#"{"Name":"mcp-read","Rules":"service_prefix \"\" { policy = \"read\" } node_prefix \"\" { policy = \"read\" }"}"#,
    );
    let tok = consul.must(
        "PUT",
        "/v1/acl/token",
        r#"{"Description":"mcp adapter","Policies":[{"Name":"mcp-read"}]}"#,
    );
    let tok: serde_json::Value = serde_json::from_str(&tok).expect("token JSON");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("token");
    std::fs::write(&file, tok["SecretID"].as_str().expect("secret")).expect("write");
    let good = adapter(
        &consul,
        &["--consul-token-file", file.to_str().expect("utf8")],
        &[],
    );
    good.wait_ready();
    let items = until("web with a token", &format!("xds://{}", good.grpc), |i| {
        find(i, "web").is_some()
    });
    assert_eq!(addresses(find(&items, "web").expect("web")), ["10.0.0.1"]);
}

#[test]
#[ignore = "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)"]
fn five_hundred_services_of_ten_instances() {
    let consul = Consul::start(None);
    for s in 0..500 {
        for i in 0..10 {
            let id = format!("svc-{s}-{i}");
            let addr = format!("10.{}.{}.{}", s / 250, s % 250, i + 1);
            consul.register(
                &format!("node-{i}"),
                &format!("svc-{s}"),
                &id,
                &addr,
                8080,
                &[],
                &[("protocol", "http")],
                "passing",
            );
        }
    }
    let a = adapter(
        &consul,
        &["--consul-concurrency", "64", "--exclude-service", "consul"],
        &[],
    );
    a.wait_ready();
    let xds = format!("xds://{}", a.grpc);
    let items = until("500 services", &xds, |i| i.len() == 500);
    assert!(items.iter().all(|i| addresses(i).len() == 10));
    // A change still arrives promptly with 500 blocking queries open.
    consul.set_check("node-3", "svc-250-3", "critical");
    until("change among 500", &xds, |i| {
        find(i, "svc-250").is_some_and(|w| addresses(w).len() == 9)
    });
}

//! adapter-kube against a real Kubernetes API server (kube-apiserver 1.35 with an embedded etcd,
//! built from the Go module proxy by tests/kube-apiserver/build.sh), observed through mcpctl as
//! a sink sees it. No controller manager runs: the tests write EndpointSlices the way the
//! EndpointSlice controller does.

use std::time::Duration;

use serde_json::{json, Value};

use e2e::kube::{
    not_ready, ready, service, services_path, slice, slices_path, terminating, KubeApiServer,
    TokenUser,
};
use e2e::{
    addresses_of, endpoint_addresses, find, item_names, mcpctl_get, ports, wait_for, Adapter,
};

/// A change must reach the sink within this (a watch event, plus a loaded machine).
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

fn adapter(kube: &KubeApiServer, extra: &[&str]) -> Adapter {
    adapter_as(&kube.kubeconfig(), extra)
}

fn adapter_as(kubeconfig: &std::path::Path, extra: &[&str]) -> Adapter {
    let kc = kubeconfig.display().to_string();
    let mut args = vec!["--kubeconfig", kc.as_str()];
    args.extend_from_slice(extra);
    Adapter::start("adapter-kube", &args)
}

fn until(what: &str, xds: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    e2e::wait_served(CHANGE_TIMEOUT, what, xds, pred)
}

/// `namespace/name` of the served items, sorted.
fn sorted_names(items: &[Value]) -> Vec<String> {
    let mut names = item_names(items);
    names.sort();
    names
}

/// The ports of web's pods in [`seed_shop`] (`api` listens elsewhere than its targetPort).
const WEB_POD_PORTS: &[(&str, u16)] = &[("http", 8080), ("api", 9091)];

/// shop/web's EndpointSlice of `family` (`web-v4` or `web-v6`), with `ports` and `endpoints`.
fn web_slice(family: &str, ports: &[(&str, u16)], endpoints: Vec<Value>) -> Value {
    let name = if family == "IPv6" { "web-v6" } else { "web-v4" };
    slice("shop", name, "web", family, ports, endpoints)
}

/// The shop: `web` (ClusterIP, two ports, one with appProtocol), `db` (headless) and `ext`
/// (ExternalName), with web's endpoints in an IPv4 and an IPv6 slice.
fn seed_shop(kube: &KubeApiServer) -> String {
    kube.namespace("shop");
    let mut web = service("shop", "web", &[("http", 80, 8080), ("api", 9090, 9090)]);
    web["spec"]["ports"][1]["appProtocol"] = json!("kubernetes.io/h2c");
    let web = kube.apply_service(&web);
    let mut db = service("shop", "db", &[("tcp-pg", 5432, 5432)]);
    db["spec"]["clusterIP"] = json!("None");
    kube.apply_service(&db);
    let mut ext = service("shop", "ext", &[("https", 443, 443)]);
    ext["spec"] = json!({"type": "ExternalName", "externalName": "db.example.com",
                         "ports": [{"name": "https", "port": 443}]});
    kube.apply_service(&ext);
    kube.apply_slice(&web_slice(
        "IPv4",
        WEB_POD_PORTS,
        vec![
            ready("10.1.0.1"),
            ready("10.1.0.2"),
            not_ready("10.1.0.3"),
            terminating("10.1.0.4"),
        ],
    ));
    kube.apply_slice(&web_slice("IPv6", WEB_POD_PORTS, vec![ready("fd00::1")]));
    web["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// adapter-kube (with `extra` flags) on the seeded shop, once it serves web's three ready
/// endpoints: it and its `xds://` address.
fn serve_shop(kube: &KubeApiServer, extra: &[&str]) -> (Adapter, String) {
    seed_shop(kube);
    let a = adapter(kube, extra);
    a.wait_ready();
    let xds = a.xds_url();
    until("shop served", &xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v.len() == 3)
    });
    (a, xds)
}

/// Replaces web's IPv4 pods (of [`seed_shop`]) by one at `ip`, and waits until `xds` serves it
/// beside the IPv6 one.
fn replace_web_v4_pods(kube: &KubeApiServer, xds: &str, ip: &str, what: &str) {
    kube.apply_slice(&web_slice("IPv4", &[("http", 8080)], vec![ready(ip)]));
    until(what, xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v == [ip, "fd00::1"])
    });
}

/// A quiet window on `a`, then a positive step after it: `window` with nothing built (as
/// [`Adapter::assert_steady`]), then `new` (a Service `a` watches and takes) applied, which must
/// be the one new snapshot, served beside exactly what was served before. A snapshot built
/// late, after the window, for something before it would be counted here too, and a late
/// change to the served set would show in it: the window cannot pass by its event arriving
/// after it (#34 item 6).
fn steady_then_a_new_service(kube: &KubeApiServer, a: &Adapter, window: Duration, new: &Value) {
    let xds = a.xds_url();
    let snapshots = a.metric("mcp_adapter_snapshots_total");
    let mut want = sorted_names(&mcpctl_get(&xds));
    a.assert_steady(window);
    kube.apply_service(new);
    let meta = &new["metadata"];
    want.push(format!(
        "{}/{}",
        meta["namespace"].as_str().expect("namespace"),
        meta["name"].as_str().expect("name")
    ));
    want.sort();
    until("the new Service served", &xds, |i| sorted_names(i) == want);
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots + 1.0,
        "the new Service is the one snapshot since the window; log:\n{}",
        a.log_tail()
    );
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn services_and_slices_follow_the_cluster() {
    let kube = KubeApiServer::start();
    let cluster_ip = seed_shop(&kube);
    let a = adapter(&kube, &[]);
    a.wait_ready();
    let xds = a.xds_url();

    let items = until("web, db and ext served", &xds, |i| {
        find(i, "web").is_some() && find(i, "db").is_some() && find(i, "ext").is_some()
    });
    let web = find(&items, "web").expect("web");
    assert_eq!(web["metadata"]["namespace"], "shop");
    assert_eq!(
        web["metadata"]["labels"]["mcp-adapter/registry"],
        "kubernetes"
    );
    assert_eq!(web["spec"]["hosts"], json!(["web.shop.svc.cluster.local"]));
    assert_eq!(web["spec"]["addresses"], json!([cluster_ip]));
    assert_eq!(web["spec"]["resolution"], "STATIC");
    assert_eq!(
        ports(web),
        [
            (80, "http".to_string(), "HTTP".to_string()),
            (9090, "api".to_string(), "HTTP2".to_string())
        ]
    );
    // Ready endpoints of both families; not-ready and terminating ones left out.
    assert_eq!(endpoint_addresses(web), ["10.1.0.1", "10.1.0.2", "fd00::1"]);
    // The pods listen on 9091 for `api` (the slice's number), on the targetPort for `http`.
    let ep = &web["spec"]["endpoints"][0];
    assert_eq!(ep["ports"]["api"], 9091, "{ep}");
    assert!(ep["ports"].get("http").is_none(), "{ep}");

    let db = find(&items, "db").expect("db");
    // NONE and MESH_EXTERNAL are the enums' zero values: absent in proto3 JSON.
    assert!(db["spec"].get("resolution").is_none(), "{db}");
    assert!(endpoint_addresses(db).is_empty());
    assert_eq!(ports(db)[0].2, "TCP");
    let ext = find(&items, "ext").expect("ext");
    assert_eq!(ext["spec"]["resolution"], "DNS");
    assert!(ext["spec"].get("location").is_none(), "{ext}");
    assert_eq!(web["spec"]["location"], "MESH_INTERNAL");
    assert_eq!(endpoint_addresses(ext), ["db.example.com"]);

    // Scale up, and a readiness flip: both show.
    kube.apply_slice(&web_slice(
        "IPv4",
        WEB_POD_PORTS,
        ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.5"]
            .map(ready)
            .to_vec(),
    ));
    until("scaled up and 10.1.0.3 ready", &xds, |i| {
        addresses_of(i, "web")
            .is_some_and(|v| v == ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.5", "fd00::1"])
    });
    // Scale down: one pod terminating, one gone.
    kube.apply_slice(&web_slice(
        "IPv4",
        WEB_POD_PORTS,
        vec![ready("10.1.0.2"), terminating("10.1.0.3")],
    ));
    until("scaled down", &xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v == ["10.1.0.2", "fd00::1"])
    });

    // Port renamed on the Service and in the slices (as the controller rewrites them).
    let mut renamed = service(
        "shop",
        "web",
        &[("http-web", 80, 8080), ("api", 9090, 9090)],
    );
    renamed["spec"]["ports"][1]["appProtocol"] = json!("kubernetes.io/h2c");
    kube.apply_service(&renamed);
    kube.apply_slice(&web_slice(
        "IPv6",
        &[("http-web", 8081), ("api", 9091)],
        vec![ready("fd00::1")],
    ));
    let v6_port = |w: &Value| {
        w["spec"]["endpoints"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["address"] == "fd00::1"))
            .map(|e| e["ports"]["http-web"].clone())
    };
    let items = until("port renamed", &xds, |i| {
        find(i, "web")
            .is_some_and(|w| ports(w)[0].1 == "http-web" && v6_port(w) == Some(json!(8081)))
    });
    // The other family's slice still names the old port: its endpoints keep the targetPort.
    let web = find(&items, "web").expect("web");
    assert_eq!(endpoint_addresses(web), ["10.1.0.2", "fd00::1"]);

    // Every pod gone: kept with no endpoints (default --on-empty keep).
    kube.delete(&format!("{}/web-v4", slices_path("shop")));
    kube.delete(&format!("{}/web-v6", slices_path("shop")));
    until("web without endpoints", &xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v.is_empty())
    });
    // The Service deleted: its ServiceEntry goes, the others stay.
    kube.delete(&format!("{}/web", services_path("shop")));
    until("web removed", &xds, |i| {
        find(i, "web").is_none() && find(i, "db").is_some() && find(i, "ext").is_some()
    });
    steady_then_a_new_service(
        &kube,
        &a,
        Duration::from_secs(3),
        &service("shop", "cart", &[("http", 80, 8080)]),
    );
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn namespaces_and_label_selector_choose_what_is_served() {
    let kube = KubeApiServer::start();
    for ns in ["a", "b", "c"] {
        kube.namespace(ns);
        let mut x = service(ns, "x", &[("http", 80, 80)]);
        x["metadata"]["labels"] = json!({"export": "yes"});
        kube.apply_service(&x);
        kube.apply_service(&service(ns, "y", &[("http", 80, 80)]));
    }
    let a = adapter(
        &kube,
        &["--namespaces", "a,b", "--label-selector", "export=yes"],
    );
    a.wait_ready();
    let xds = a.xds_url();
    until("a/x and b/x", &xds, |i| sorted_names(i) == ["a/x", "b/x"]);
    // Labelled later: a/y joins; c/y, outside the namespaces, does not.
    for ns in ["a", "c"] {
        let mut y = service(ns, "y", &[("http", 80, 80)]);
        y["metadata"]["labels"] = json!({"export": "yes"});
        kube.apply_service(&y);
    }
    until("a/y joins", &xds, |i| {
        sorted_names(i) == ["a/x", "a/y", "b/x"]
    });
    // Label removed: leaves.
    kube.apply_service(&service("a", "x", &[("http", 80, 80)]));
    until("a/x leaves", &xds, |i| sorted_names(i) == ["a/y", "b/x"]);
    let mut z = service("b", "z", &[("http", 80, 80)]);
    z["metadata"]["labels"] = json!({"export": "yes"});
    steady_then_a_new_service(&kube, &a, Duration::from_secs(2), &z);
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn api_server_restart_keeps_the_last_state_and_recovers() {
    let mut kube = KubeApiServer::start();
    let (a, xds) = serve_shop(&kube, &[]);
    let snapshots = a.metric("mcp_adapter_snapshots_total");

    // The API server goes away: the watch is not ended (no registry error counted, nothing
    // listed again); the registry is reported unhealthy with the reason, the last good state
    // is served.
    kube.kill();
    let body = a.wait_registryz(Duration::from_secs(30), "/registryz 503", 503);
    assert!(body.contains("list/watch"), "{body}");
    let (status, body) = a.get("/readyz");
    assert_eq!(status, 200, "last good state still served: {body}");
    let items = mcpctl_get(&xds);
    assert_eq!(addresses_of(&items, "web").map(|v| v.len()), Some(3));
    assert!(a.metric("mcp_adapter_registry_retries_total") > 0.0);
    assert_eq!(a.metric("mcp_adapter_registry_healthy"), 0.0);
    a.assert_no_registry_errors("while the API server is down");

    // Back, with nothing changed: healthy again by itself, with no new list, no new snapshot.
    kube.restart();
    a.wait_registryz(CHANGE_TIMEOUT, "/registryz 200 again", 200);
    assert_eq!(a.metric("mcp_adapter_registry_healthy"), 1.0);
    a.assert_no_registry_errors("after the API server came back");
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots,
        "{}",
        a.log_tail()
    );
    let log = a.log();
    assert_eq!(
        log.matches("cluster listed").count(),
        1,
        "listed once, at start: {}",
        a.log_tail()
    );
    assert!(
        log.contains("the watch resumes where it was"),
        "{}",
        a.log_tail()
    );

    // The same watch delivers the next change: one change, one snapshot.
    replace_web_v4_pods(&kube, &xds, "10.1.0.9", "a change after the restart");
    assert_eq!(a.metric("mcp_adapter_snapshots_total"), snapshots + 1.0);
    steady_then_a_new_service(
        &kube,
        &a,
        Duration::from_secs(2),
        &service("shop", "cart", &[("http", 80, 8080)]),
    );
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn an_adapter_started_while_the_api_server_is_down_serves_once_it_answers() {
    let mut kube = KubeApiServer::start();
    seed_shop(&kube);
    kube.kill();
    let a = adapter(&kube, &[]);
    // Not synced yet: unready, and the registry says why, while the watchers retry.
    // 503 comes at once ("not synced yet"); the reason once a list has failed.
    let body = wait_for(CHANGE_TIMEOUT, "/registryz 503 with the reason", || {
        let (status, body) = a.get("/registryz");
        (status == 503 && body.contains("list/watch")).then_some(body)
    });
    assert!(body.contains("list/watch"), "{body}");
    assert_eq!(a.get("/readyz").0, 503, "nothing to serve yet");
    assert!(a.metric("mcp_adapter_registry_retries_total") > 0.0);
    a.assert_no_registry_errors("while the API server is down");

    kube.restart();
    a.wait_ready();
    let xds = a.xds_url();
    until("shop served", &xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v.len() == 3)
    });
    a.wait_registryz(CHANGE_TIMEOUT, "/registryz 200", 200);
    assert_eq!(
        a.log().matches("cluster listed").count(),
        1,
        "{}",
        a.log_tail()
    );
    steady_then_a_new_service(
        &kube,
        &a,
        Duration::from_secs(2),
        &service("shop", "cart", &[("http", 80, 8080)]),
    );
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn an_expired_watch_lists_again_without_an_error_or_a_push() {
    // Without the watch cache, watches read etcd directly; compacting every second makes a
    // renewed watch's resource version too old (410 Gone), as happens after a long quiet spell.
    let kube = KubeApiServer::start_with(
        &[],
        &["--watch-cache=false", "--etcd-compaction-interval=1s"],
    );
    let (a, xds) = serve_shop(&kube, &["--watch-timeout", "2s"]);
    let snapshots = a.metric("mcp_adapter_snapshots_total");

    // Other writes move etcd's revision on while the shop is quiet.
    kube.namespace("churn");
    let log = wait_for(Duration::from_secs(60), "a watch expired", || {
        let n = next_configmap_name();
        kube.apply(
            "/api/v1/namespaces/churn/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": n, "namespace": "churn"}}),
        );
        let log = a.log();
        log.contains("resource version expired").then_some(log)
    });
    assert!(log.contains("listing again"), "{}", a.log_tail());
    // The re-list found what was served: no error, no new snapshot.
    assert_eq!(
        a.metric("mcp_adapter_registry_errors_total"),
        0.0,
        "{}",
        a.log_tail()
    );
    assert_eq!(
        a.metric("mcp_adapter_snapshots_total"),
        snapshots,
        "{}",
        a.log_tail()
    );
    // And the watch goes on.
    replace_web_v4_pods(&kube, &xds, "10.1.0.7", "a change after the expiry");
}

fn next_configmap_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("cm-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn grant(kube: &KubeApiServer, user: &str, namespace: Option<&str>, resources: &[(&str, &str)]) {
    let rules: Vec<Value> = resources
        .iter()
        .map(|(group, res)| json!({"apiGroups": [group], "resources": [res], "verbs": ["get", "list", "watch"]}))
        .collect();
    let name = format!("bridge-{user}");
    let (role_path, binding_path, kind) = match namespace {
        Some(ns) => (
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
            "Role",
        ),
        None => (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles".to_string(),
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".to_string(),
            "ClusterRole",
        ),
    };
    let mut meta = json!({"name": name});
    let mut binding_meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
        binding_meta["namespace"] = json!(ns);
    }
    kube.apply(
        &role_path,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                "metadata": meta, "rules": rules}),
    );
    kube.apply(
        &binding_path,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": format!("{kind}Binding"),
                "metadata": binding_meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    );
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn rbac_denied_says_what_is_missing_and_recovers_when_granted() {
    let kube = KubeApiServer::start_with(
        &[
            TokenUser::new("bridge-token", "bridge"),
            TokenUser::new("shop-token", "shop-reader"),
        ],
        &[],
    );
    seed_shop(&kube);
    // Services but not EndpointSlices: the adapter must say which one it lacks.
    grant(&kube, "bridge", None, &[("", "services")]);
    let a = adapter_as(&kube.kubeconfig_for("bridge-token"), &[]);
    let body = a.wait_admin(
        CHANGE_TIMEOUT,
        "/registryz names the missing permission",
        "/registryz",
        |status, body| status == 503 && body.contains("endpointslices"),
    );
    for part in [
        "get, list and watch",
        "endpointslices.discovery.k8s.io",
        "ClusterRole",
    ] {
        assert!(body.contains(part), "{part:?} not in /registryz: {body}");
    }
    assert_eq!(a.get("/readyz").0, 503, "never synced: not ready");
    assert!(a.log().contains("forbidden"), "{}", a.log_tail());

    grant(
        &kube,
        "bridge",
        None,
        &[("", "services"), ("discovery.k8s.io", "endpointslices")],
    );
    a.wait_ready();
    let xds = a.xds_url();
    until("served once granted", &xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v.len() == 3)
    });

    // The namespaced variant: a Role in `shop` is enough with --namespaces shop.
    grant(
        &kube,
        "shop-reader",
        Some("shop"),
        &[("", "services"), ("discovery.k8s.io", "endpointslices")],
    );
    let scoped = adapter_as(
        &kube.kubeconfig_for("shop-token"),
        &["--namespaces", "shop"],
    );
    scoped.wait_ready();
    let xds = scoped.xds_url();
    until("served through a namespaced Role", &xds, |i| {
        addresses_of(i, "web").is_some_and(|v| v.len() == 3)
    });
    // Within the Role's namespace: both adapters take it.
    steady_then_a_new_service(
        &kube,
        &scoped,
        Duration::from_secs(2),
        &service("shop", "cart", &[("http", 80, 8080)]),
    );
}

/// deploy/kubernetes/NAME in the repository.
fn manifest(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .join(name)
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn shipped_rbac_is_enough_and_nodes_and_pods_add_locality_labels_and_identity() {
    let kube = KubeApiServer::start();
    kube.apply_manifest(&manifest("adapter-kube-rbac.yaml"), |_| ());
    kube.apply_manifest(&manifest("adapter-kube-rbac-nodes-pods.yaml"), |_| ());
    let token = kube.service_account_token("mcp-adapters", "mcp-adapter-kube");

    kube.namespace("shop");
    kube.apply_service(&service("shop", "web", &[("http", 80, 8080)]));
    kube.apply(
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {
            "topology.kubernetes.io/region": "eu-west",
            "topology.kubernetes.io/zone": "eu-west-b",
            "topology.istio.io/subzone": "rack-7"}}}),
    );
    kube.apply(
        "/api/v1/namespaces/shop/serviceaccounts",
        &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "web-sa", "namespace": "shop"}}),
    );
    let pod = |version: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-1", "namespace": "shop",
                            "labels": {"app": "web", "version": version}},
               "spec": {"serviceAccountName": "web-sa", "nodeName": "node-1",
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "web", "image": "example.invalid/web:1"}]}})
    };
    kube.apply("/api/v1/namespaces/shop/pods", &pod("v1"));
    let mut ep = ready("10.1.0.1");
    ep["nodeName"] = json!("node-1");
    ep["zone"] = json!("eu-west-b");
    ep["targetRef"] = json!({"kind": "Pod", "name": "web-1", "namespace": "shop"});
    kube.apply_slice(&slice(
        "shop",
        "web-1",
        "web",
        "IPv4",
        &[("http", 8080)],
        vec![ep],
    ));

    let a = adapter_as(
        &kube.kubeconfig_for(&token),
        &[
            "--read-nodes",
            "--read-pods",
            "--trust-domain",
            "west.example",
        ],
    );
    a.wait_ready();
    let xds = a.xds_url();
    let items = until("web with its pod's details", &xds, |i| {
        find(i, "web").is_some_and(|w| w["spec"]["endpoints"][0]["labels"]["version"] == "v1")
    });
    let web = find(&items, "web").expect("web");
    let ep = &web["spec"]["endpoints"][0];
    assert_eq!(ep["locality"], "eu-west/eu-west-b/rack-7", "{ep}");
    assert_eq!(ep["serviceAccount"], "web-sa", "{ep}");
    assert_eq!(
        web["spec"]["subjectAltNames"],
        json!(["spiffe://west.example/ns/shop/sa/web-sa"])
    );

    // The pod relabelled (a rollout's version label): the endpoint follows.
    kube.apply("/api/v1/namespaces/shop/pods", &pod("v2"));
    until("endpoint labels follow the pod", &xds, |i| {
        find(i, "web").is_some_and(|w| w["spec"]["endpoints"][0]["labels"]["version"] == "v2")
    });
    // The namespaced variant's Service is the one change `a` (every namespace) sees after
    // its quiet window.
    kube.namespace("team-b");
    steady_then_a_new_service(
        &kube,
        &a,
        Duration::from_secs(2),
        &service("team-b", "api", &[("grpc", 9090, 9090)]),
    );

    // The namespaced variant, as shipped but for its namespace.
    kube.apply_manifest(&manifest("adapter-kube-rbac-namespaced.yaml"), |o| {
        o["metadata"]["namespace"] = json!("team-b");
    });
    let scoped = adapter_as(&kube.kubeconfig_for(&token), &["--namespaces", "team-b"]);
    scoped.wait_ready();
    let xds = scoped.xds_url();
    until("team-b/api through the Role", &xds, |i| {
        item_names(i) == ["team-b/api"]
    });
}

#[test]
#[ignore = "needs kube-apiserver: tests/kube-apiserver/build.sh target/kube (the README's test command builds it)"]
fn a_thousand_services_with_ten_endpoints_each() {
    const SERVICES: usize = 1000;
    let kube = KubeApiServer::start();
    kube.namespace("bulk");
    let services: Vec<(String, Value)> = (0..SERVICES)
        .map(|i| {
            (
                services_path("bulk"),
                service("bulk", &format!("svc-{i}"), &[("http", 80, 8080)]),
            )
        })
        .collect();
    kube.create_all(&services, 8);
    let slices: Vec<(String, Value)> = (0..SERVICES)
        .map(|i| {
            let eps = (0..10)
                .map(|e| ready(&format!("10.{}.{}.{}", 100 + i / 250, i % 250, e + 1)))
                .collect();
            (
                slices_path("bulk"),
                slice(
                    "bulk",
                    &format!("svc-{i}-abcde"),
                    &format!("svc-{i}"),
                    "IPv4",
                    &[("http", 8080)],
                    eps,
                ),
            )
        })
        .collect();
    // Half before the adapter starts (listed), half after (watched).
    kube.create_all(&slices[..SERVICES / 2], 8);
    let a = adapter(&kube, &[]);
    a.wait_ready();
    kube.create_all(&slices[SERVICES / 2..], 8);
    let xds = a.xds_url();
    let items = until("1,000 services with 10 endpoints each", &xds, |i| {
        // Beside them: default/kubernetes, the API server's own Service.
        let bulk: Vec<&Value> = i
            .iter()
            .filter(|s| s["metadata"]["namespace"] == "bulk")
            .collect();
        bulk.len() == SERVICES && bulk.iter().all(|s| endpoint_addresses(s).len() == 10)
    });
    assert_eq!(items.len(), SERVICES + 1, "{:?}", item_names(&items));
    steady_then_a_new_service(
        &kube,
        &a,
        Duration::from_secs(3),
        &service("bulk", "svc-late", &[("http", 80, 8080)]),
    );
}

//! Issue #45, item 5: one service moving from one registry to another, written through the
//! Kubernetes output (`--output kube`), where Istio ambient reads it.
//!
//! Two adapter-file instances play the two registries: `--source-name old` (inventory: service
//! `orders`, port `http-8080`, endpoints 10.30.1.1-2) and `--source-name new` (the same service
//! with port `tcp-8080`, endpoints 10.30.2.1-2), both with `--output kube` into namespace
//! `shop` of one API server, configured `--namespace shop --host-template '{service}.shop.mesh'
//! --name-template '{name}-{source}' --port-name 8080=http --endpoint-source-labels`. `old`
//! starts first and `new` over a second later, so that the objects' `creationTimestamp`s (whole
//! seconds) differ: istiod picks between entries of one host by them.
//!
//! One istiod (`k8s://` only, ambient on, `PILOT_ENABLE_SENDING_HBONE=false` so that a stock
//! Envoy, which has no istio-agent for the HBONE cluster's certificates, gets a complete
//! configuration) feeds a sidecar in `default` and a ztunnel client ([`e2e::ztunnel`]).
//! What is observed:
//!
//! 1. The API server holds `shop/orders-old` and `shop/orders-new`: one host,
//!    `orders.shop.mesh`; port 8080 named `http` in both, but with the protocol each inventory
//!    name gave (`old` HTTP, `new` TCP: `--port-name` renames, it does not change the
//!    protocol, so `new`'s entry, still TCP, also gets a virtual IP from its adapter's
//!    `--vip-cidr` and `old`'s none); every endpoint labelled `mcp-adapter/registry: file` and
//!    `mcp-adapter/source: <source>`.
//! 2. Sidecars: one cluster `outbound|8080||orders.shop.mesh` with all four endpoints, and a
//!    DestinationRule with subsets by `mcp-adapter/source` gives `outbound|8080|old|...` and
//!    `outbound|8080|new|...` with each source's two. The proxy's service is the older entry's
//!    (port `http`, HTTP).
//! 3. Ambient does NOT merge: istiod's ambient index keeps one ServiceEntry per namespace and
//!    host, the one with the oldest `creationTimestamp` (`WorkloadServices` in the pinned
//!    Istio's `pilot/pkg/serviceregistry/ambient/services.go`), and drops every endpoint of the
//!    others (it logs `ServiceEntry shop/orders-new was pruned by deduplication. Endpoints from
//!    this ServiceEntry will not be sent to the data plane.`). ztunnel gets one service
//!    `shop/orders.shop.mesh` named `orders-old` and only `orders-old`'s two workloads: the new
//!    registry's instances get no ambient traffic while the old entry exists. The service's
//!    virtual IPs are the winning entry's (`old`'s has none of its own: istiod's
//!    240.240.0.x/2001:2::x). When the old entry goes, the new one takes its place: its
//!    service, its VIP (the adapter's 242.1.x.y: the host's VIP in ambient changes with the
//!    winner) and its workloads; when the old one comes back it is the younger and stays out:
//!    the age of the objects decides, not the source. For sidecars, all the while, the cluster
//!    holds the endpoints of every entry present.
//! 4. Without `--name-template` both adapters want `shop/orders`: the first to write it owns it
//!    (its ownership labels); the second finds an object that is not its own and leaves it
//!    alone: `kubeOutput.conflicts` `["shop/orders"]` on its /debug/resources,
//!    `mcp_adapter_kube_output_conflicts` 1, /registryz and /readyz 200 with `1 names held by
//!    objects not ours, left alone`. Its registry's endpoints reach neither sidecars nor
//!    ztunnel.
//!
//! `cargo test -p e2e --test migration_kube -- --include-ignored` (after `cargo build
//! --workspace --bins`): about 12 s, in a network namespace of its own (the sidecar binds
//! 127.0.0.1:8080).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use e2e::envoy::{Envoy, Interception};
use e2e::istiod::{Istiod, IstiodConfig};
use e2e::kube::KubeApiServer;
use e2e::kube_output::{endpoints, leads_in_step, output};
use e2e::mesh::{apply, mesh_api_server, owned_service_entries, sidecar_scope};
use e2e::netns::{isolate, pod_ip};
use e2e::ztunnel::{workload_addresses, ZtunnelView, ZtunnelWatch};
use e2e::{ports, Adapter};

const NS: &str = "shop";
const HOST: &str = "orders.shop.mesh";
/// The service's key in ztunnel's view (`namespace/hostname`).
const KEY: &str = "shop/orders.shop.mesh";
const CLUSTER: &str = "outbound|8080||orders.shop.mesh";
const OLD_SUBSET: &str = "outbound|8080|old|orders.shop.mesh";
const NEW_SUBSET: &str = "outbound|8080|new|orders.shop.mesh";
/// istiod's id of the sidecar (pod `client-1` in `default`).
const PROXY: &str = "client-1.default";
const WAIT: Duration = Duration::from_secs(60);

/// One of the two registries.
struct Side {
    source: &'static str,
    /// The port's name in its inventory.
    port_name: &'static str,
    /// The protocol adapter-file derives from that name.
    protocol: &'static str,
    ips: [&'static str; 2],
}

const OLD: Side = Side {
    source: "old",
    port_name: "http-8080",
    protocol: "HTTP",
    ips: ["10.30.1.1", "10.30.1.2"],
};

const NEW: Side = Side {
    source: "new",
    port_name: "tcp-8080",
    protocol: "TCP",
    ips: ["10.30.2.1", "10.30.2.2"],
};

impl Side {
    /// `ip:8080` of each endpoint, as Envoy lists them.
    fn envoy_endpoints(&self) -> Vec<String> {
        self.ips.iter().map(|ip| format!("{ip}:8080")).collect()
    }

    /// The object this side's adapter writes with `--name-template '{name}-{source}'`.
    fn object(&self) -> String {
        format!("{NS}/orders-{}", self.source)
    }

    /// Writes its inventory (service `orders`, no host: the template makes it) into `dir`,
    /// renamed into place.
    fn write_inventory(&self, dir: &Path) {
        let text = format!(
            "kind: Inventory\nservices:\n  - name: orders\n    ports: {{{}: 8080}}\n    endpoints: [{}]\n",
            self.port_name,
            self.ips.join(", ")
        );
        let tmp = dir.join(".inventory.tmp");
        std::fs::write(&tmp, text).expect("write inventory");
        std::fs::rename(&tmp, dir.join("inventory.yaml")).expect("rename inventory");
    }

    /// adapter-file's arguments: the migration flags, `--output kube` into `shop`, a fixed
    /// output identity (a restarted process is the same replica and keeps its Lease), and
    /// `--name-template '{name}-{source}'` when `name_template`.
    fn args(&self, dir: &Path, kubeconfig: &Path, name_template: bool) -> Vec<String> {
        let mut v: Vec<String> = [
            "--path",
            &dir.display().to_string(),
            "--poll-interval",
            "100ms",
            "--settle-time",
            "0",
            "--source-name",
            self.source,
            "--namespace",
            NS,
            "--host-template",
            "{service}.shop.mesh",
            "--port-name",
            "8080=http",
            "--endpoint-source-labels",
            "--output",
            "kube",
            "--output-kubeconfig",
            &kubeconfig.display().to_string(),
            "--output-namespaces",
            NS,
            "--output-identity",
            &format!("{}-0", self.source),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if name_template {
            v.extend(["--name-template".into(), "{name}-{source}".into()]);
        }
        v
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// [`e2e::settle`] within [`WAIT`].
fn settle<T>(what: &str, probe: impl FnMut() -> Result<T, String>) -> T {
    e2e::settle(WAIT, what, probe)
}

/// Waits until the objects `side`'s adapter owns are exactly `names` and its output leads, in
/// step; those objects.
fn expect_owned(
    kube: &KubeApiServer,
    a: &Adapter,
    side: &Side,
    names: &[&str],
) -> BTreeMap<String, Value> {
    settle(&format!("{} owns {names:?}, in step", side.source), || {
        let owned = owned_service_entries(kube, side.source);
        if owned.keys().map(String::as_str).eq(names.iter().copied()) && leads_in_step(a) {
            Ok(owned)
        } else {
            Err(format!(
                "owned {:?}; output {}",
                owned.keys().collect::<Vec<_>>(),
                output(a)
            ))
        }
    })
}

/// Asserts what the migration flags made of `side`'s object `obj`: the templated host, port
/// 8080 renamed `http` (protocol as the inventory's name gave it), the side's endpoints each
/// labelled with its registry and source, and the ownership labels.
fn assert_object(obj: &Value, side: &Side) {
    assert_eq!(obj["spec"]["hosts"], json!([HOST]), "{obj:#}");
    assert_eq!(
        ports(obj),
        [(8080, "http".to_string(), side.protocol.to_string())],
        "{obj:#}"
    );
    assert_eq!(endpoints(obj), side.ips, "{obj:#}");
    for e in obj["spec"]["endpoints"].as_array().into_iter().flatten() {
        assert_eq!(
            e["labels"],
            json!({"mcp-adapter/registry": "file", "mcp-adapter/source": side.source}),
            "{obj:#}"
        );
    }
    let labels = &obj["metadata"]["labels"];
    assert_eq!(labels["mcp-adapter/source"], side.source, "{obj:#}");
    assert_eq!(
        labels["app.kubernetes.io/managed-by"], "mcp-adapter",
        "{obj:#}"
    );
}

/// Waits until Envoy's clusters for [`HOST`] are the plain cluster and the two subsets, with
/// `all`, `old` and `new` as their endpoints.
fn expect_envoy(envoy: &Envoy, all: &[&Side], old: &[String], new: &[String]) {
    let mut every: Vec<String> = all.iter().flat_map(|s| s.envoy_endpoints()).collect();
    every.sort();
    let want = BTreeMap::from([
        (CLUSTER.to_string(), every),
        (OLD_SUBSET.to_string(), old.to_vec()),
        (NEW_SUBSET.to_string(), new.to_vec()),
    ]);
    settle(&format!("Envoy's clusters {want:?}"), || {
        let got = envoy.clusters_of(HOST);
        (got == want)
            .then_some(())
            .ok_or_else(|| format!("{got:?}"))
    });
    eprintln!("Envoy: {want:?}");
}

/// `port/name/protocol` of each port of the service istiod's sidecar scope for [`PROXY`] holds
/// for [`HOST`].
fn scope_ports(istiod: &Istiod) -> Vec<String> {
    let scope = istiod.debug(&format!("sidecarz?proxyID={PROXY}"));
    scope["servicesByHostname"][HOST]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}/{}",
                p["port"],
                p["name"].as_str().unwrap_or(""),
                p["protocol"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Whether ztunnel's `view` holds, for [`HOST`], exactly one service, the ServiceEntry `name`'s,
/// and as its workloads exactly `side`'s endpoints, of that entry; nothing at the other
/// side's addresses.
fn ztunnel_holds(view: &ZtunnelView, name: &str, side: &Side) -> Result<(), String> {
    let services: Vec<&String> = view.services.keys().filter(|k| k.ends_with(HOST)).collect();
    let svc = view.services.get(KEY);
    let uids: Vec<&str> = view
        .workloads
        .values()
        .filter(|w| w.services.keys().any(|k| k.ends_with(HOST)))
        .map(|w| w.uid.as_str())
        .collect();
    let want_uids: Vec<String> = side
        .ips
        .iter()
        .map(|ip| format!("Kubernetes/networking.istio.io/ServiceEntry/{NS}/{name}/{ip}"))
        .collect();
    let other = if side.source == OLD.source {
        &NEW
    } else {
        &OLD
    };
    let at_other: Vec<&str> = view
        .workloads
        .values()
        .filter(|w| w.addresses.iter().any(|a| other.ips.contains(&a.as_str())))
        .map(|w| w.uid.as_str())
        .collect();
    if services == [KEY]
        && svc.is_some_and(|s| s.name == name && s.hostname == HOST)
        && uids == want_uids
        && at_other.is_empty()
    {
        Ok(())
    } else {
        Err(format!(
            "services {services:?} ({svc:?}); workloads of the host {uids:?}; at the other \
             side's addresses {at_other:?}"
        ))
    }
}

/// Waits until ztunnel's view is as [`ztunnel_holds`] says; that view.
fn expect_ztunnel(watch: &ZtunnelWatch, name: &str, side: &Side) -> ZtunnelView {
    let what = format!("ztunnel: {HOST} is {name}'s, with {:?}", side.ips);
    let view = watch.wait_until(WAIT, &what, |v| ztunnel_holds(v, name, side).is_ok());
    let svc = &view.services[KEY];
    eprintln!(
        "ztunnel: service {KEY} name {} VIPs {:?} ports {:?}; workloads {:?}",
        svc.name,
        svc.addresses,
        svc.ports,
        view.workloads_of(KEY).map(|w| &w.uid).collect::<Vec<_>>()
    );
    view
}

/// Asserts that the virtual IPs ztunnel has for [`HOST`] are those of the entry `obj` its
/// service comes from: its `spec.addresses` (new's: the VIP its adapter gave its TCP port), or,
/// when it has none (old's port is HTTP, and adapters give VIPs to TCP services only), the
/// pair istiod allocates itself (in 240.240.0.0/16 and 2001:2::/48).
fn assert_vips(view: &ZtunnelView, obj: &Value) {
    let got = &view.services[KEY].addresses;
    match obj["spec"]["addresses"].as_array() {
        Some(own) => assert_eq!(&json!(got), &json!(own), "{obj:#}"),
        None => assert!(
            got.len() == 2 && got[0].starts_with("240.240.") && got[1].starts_with("2001:2::"),
            "{got:?}"
        ),
    }
}

/// Waits until istiod has logged `n` times that its ambient index dropped ServiceEntry
/// `ns_name` for another entry of its host.
fn expect_pruned(istiod: &Istiod, ns_name: &str, n: usize) {
    let line = format!("ServiceEntry {ns_name} was pruned by deduplication");
    settle(&format!("istiod logs {line:?} {n} times"), || {
        let seen = istiod.log().matches(&line).count();
        (seen >= n)
            .then_some(())
            .ok_or_else(|| format!("{seen} times"))
    });
}

#[test]
#[ignore = "needs kube-apiserver, pilot-discovery and envoy: tests/go-peers/build.sh target; scripts/install-envoy.sh target/envoy"]
fn two_registries_one_host_through_the_kubernetes_output() {
    if !isolate("two_registries_one_host_through_the_kubernetes_output") {
        return;
    }
    let started = Instant::now();
    let kube = mesh_api_server();
    kube.namespace(NS);
    apply(&kube, &sidecar_scope(&[NS]));
    apply(
        &kube,
        &json!({
            "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "orders", "namespace": NS},
            "spec": {"host": HOST, "subsets": [
                {"name": "old", "labels": {"mcp-adapter/source": "old"}},
                {"name": "new", "labels": {"mcp-adapter/source": "new"}},
            ]},
        }),
    );
    let kubeconfig = kube.kubeconfig();
    let old_dir = tempfile::tempdir().expect("tempdir");
    let new_dir = tempfile::tempdir().expect("tempdir");
    OLD.write_inventory(old_dir.path());
    NEW.write_inventory(new_dir.path());

    // 1. Both objects, distinct names, one host, port `http`, endpoints labelled by source.
    // `old` first; `new` more than a second later (creationTimestamps are whole seconds).
    let mut old = Adapter::start(
        "adapter-file",
        &strs(&OLD.args(old_dir.path(), &kubeconfig, true)),
    );
    old.wait_ready();
    expect_owned(&kube, &old, &OLD, &[&OLD.object()]);
    std::thread::sleep(Duration::from_millis(1100));
    let mut new = Adapter::start(
        "adapter-file",
        &strs(&NEW.args(new_dir.path(), &kubeconfig, true)),
    );
    new.wait_ready();
    let old_obj = expect_owned(&kube, &old, &OLD, &[&OLD.object()]).remove(&OLD.object());
    let new_obj = expect_owned(&kube, &new, &NEW, &[&NEW.object()]).remove(&NEW.object());
    let (old_obj, new_obj) = (old_obj.expect("old"), new_obj.expect("new"));
    assert_object(&old_obj, &OLD);
    assert_object(&new_obj, &NEW);
    let created = |o: &Value| {
        o["metadata"]["creationTimestamp"]
            .as_str()
            .map(str::to_string)
    };
    assert!(
        created(&old_obj) < created(&new_obj),
        "old's object is the older: {:?} {:?}",
        created(&old_obj),
        created(&new_obj)
    );
    let vip = |o: &Value| o["spec"]["addresses"].clone();
    eprintln!(
        "API server: {} and {}, host {HOST}, ports {:?} / {:?}, VIPs {} / {}, created {:?} / {:?}",
        OLD.object(),
        NEW.object(),
        ports(&old_obj),
        ports(&new_obj),
        vip(&old_obj),
        vip(&new_obj),
        created(&old_obj),
        created(&new_obj)
    );
    for a in [&old, &new] {
        let (status, body) = a.get("/registryz");
        assert_eq!(
            (status, body.lines().nth(1)),
            (
                200,
                Some("kube output: leader, API server in step (1 objects)")
            ),
            "{body}"
        );
        assert_eq!(a.metric("mcp_adapter_kube_output_conflicts"), 0.0);
    }
    eprintln!("objects written in {:?}", started.elapsed());

    // 2. Sidecars: one cluster with both sources' endpoints, and a subset per source.
    let config = IstiodConfig {
        k8s_first: true,
        stock_envoy: true,
        ambient: true,
        env: vec![("PILOT_ENABLE_SENDING_HBONE".into(), "false".into())],
    };
    let istiod = Istiod::start_with(&[], &kubeconfig, &config);
    let envoy = Envoy::start(istiod.grpc, Interception::None, "client-1", pod_ip(0, 1));
    expect_envoy(
        &envoy,
        &[&OLD, &NEW],
        &OLD.envoy_endpoints(),
        &NEW.envoy_endpoints(),
    );
    // The proxy's service for the host is the older entry's: its port, HTTP.
    assert_eq!(scope_ports(&istiod), ["8080/http/HTTP"]);
    eprintln!(
        "istiod and its sidecar in step after {:?}",
        started.elapsed()
    );

    // 3. Ambient: one service, the older entry's, with only its workloads; the other entry's
    // endpoints are dropped.
    let watch = ZtunnelWatch::connect(istiod.grpc);
    expect_pruned(&istiod, &NEW.object(), 1);
    let view = expect_ztunnel(&watch, "orders-old", &OLD);
    assert_vips(&view, &old_obj);
    let once = workload_addresses(istiod.grpc, WAIT);
    ztunnel_holds(&once, "orders-old", &OLD).unwrap_or_else(|e| panic!("a fresh stream: {e}"));

    // The old registry's entry goes: the new one's takes its place, in ambient as for sidecars.
    std::fs::remove_file(old_dir.path().join("inventory.yaml")).expect("remove inventory");
    expect_owned(&kube, &old, &OLD, &[]);
    expect_envoy(&envoy, &[&NEW], &[], &NEW.envoy_endpoints());
    let view = expect_ztunnel(&watch, "orders-new", &NEW);
    assert_vips(&view, &new_obj);
    // It comes back, now the younger (istiod's and Envoy's start took well over a second since
    // new's object was made): sidecars merge again; ambient keeps the new one.
    OLD.write_inventory(old_dir.path());
    let back = expect_owned(&kube, &old, &OLD, &[&OLD.object()]);
    assert!(created(&back[&OLD.object()]) > created(&new_obj));
    expect_envoy(
        &envoy,
        &[&OLD, &NEW],
        &OLD.envoy_endpoints(),
        &NEW.envoy_endpoints(),
    );
    expect_pruned(&istiod, &OLD.object(), 1);
    let view = expect_ztunnel(&watch, "orders-new", &NEW);
    assert_vips(&view, &new_obj);
    let once = workload_addresses(istiod.grpc, WAIT);
    ztunnel_holds(&once, "orders-new", &NEW).unwrap_or_else(|e| panic!("a fresh stream: {e}"));
    eprintln!("ambient cases done after {:?}", started.elapsed());

    // 4. Without --name-template both want shop/orders. `old` (restarted first) takes it; `new`
    // finds an object that is not its own, leaves it alone and says so.
    let shared = format!("{NS}/orders");
    old.restart_with(&strs(&OLD.args(old_dir.path(), &kubeconfig, false)));
    old.wait_ready();
    let orders = expect_owned(&kube, &old, &OLD, &[&shared]).remove(&shared);
    assert_object(&orders.expect("shop/orders"), &OLD);
    new.restart_with(&strs(&NEW.args(new_dir.path(), &kubeconfig, false)));
    new.wait_ready();
    settle(
        "new reports shop/orders as a conflict, owns nothing",
        || {
            let owned = owned_service_entries(&kube, NEW.source);
            let o = output(&new);
            if owned.is_empty() && o["conflicts"] == json!([shared]) && leads_in_step(&new) {
                Ok(())
            } else {
                Err(format!("owned {:?}; output {o}", owned.keys()))
            }
        },
    );
    assert_eq!(new.metric("mcp_adapter_kube_output_conflicts"), 1.0);
    assert_eq!(old.metric("mcp_adapter_kube_output_conflicts"), 0.0);
    for path in ["/registryz", "/readyz"] {
        let (status, body) = new.get(path);
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(
            body.lines().nth(1),
            Some(
                "kube output: leader, API server in step (0 objects); 1 names held by objects \
                 not ours, left alone"
            ),
            "{path}: {body}"
        );
    }
    let orders = kube
        .get(&format!(
            "/apis/networking.istio.io/v1/namespaces/{NS}/serviceentries/orders"
        ))
        .expect("shop/orders");
    assert_object(&orders, &OLD);
    eprintln!(
        "without --name-template: {shared} is old's ({:?}, VIPs {}); new: conflicts {}",
        endpoints(&orders),
        vip(&orders),
        output(&new)["conflicts"]
    );
    // Only the old registry's endpoints reach sidecars and ztunnel.
    expect_envoy(&envoy, &[&OLD], &OLD.envoy_endpoints(), &[]);
    let view = expect_ztunnel(&watch, "orders", &OLD);
    assert_vips(&view, &orders);
    new.assert_no_registry_errors("at the end");
    old.assert_no_registry_errors("at the end");
    eprintln!("whole test in {:?}", started.elapsed());
}

//! The Kubernetes output (`--output kube|both`) against a real kube-apiserver with Istio's CRDs:
//! the objects are what MCP serves, a restart or a new leader writes nothing, a change writes
//! exactly the changed objects, a user's ServiceEntry of the same name is never touched, and of
//! two replicas only the Lease holder writes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use e2e::istiod::apply_istio_crds;
use e2e::kube::KubeApiServer;
use e2e::kube_output::{endpoints, leads_in_step, output, start_file_adapter, write_entry};
use e2e::mesh::{self, mesh_api_server, owned_service_entries, resource_versions};
use e2e::registries::{Instance, Registries, Registry};
use e2e::{mcpctl_get, ns_name, wait_for, Adapter};

const PORT: u16 = 18080;
const WAIT: Duration = Duration::from_secs(60);

/// User plus system CPU seconds of process `pid` so far (`/proc/<pid>/stat`, 100 ticks/s).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 after the command.
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

/// Every object `source` owns has the spec MCP serves for that name, the MCP labels and the
/// ownership labels, and the names are the same on both sides (but for `held`: names held by
/// someone else's object).
fn objects_match_mcp(
    kube: &KubeApiServer,
    source: &str,
    a: &Adapter,
    held: &[&str],
) -> Result<(), String> {
    let objects = owned_service_entries(kube, source);
    let items: BTreeMap<String, Value> = mcpctl_get(&a.xds_url())
        .into_iter()
        .map(|i| (ns_name(&i), i))
        .filter(|(n, _)| !held.contains(&n.as_str()))
        .collect();
    let names = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    if names(&objects) != names(&items) {
        return Err(format!(
            "names differ: objects {:?}, MCP {:?}",
            names(&objects),
            names(&items)
        ));
    }
    for (name, item) in &items {
        let obj = &objects[name];
        if obj["spec"] != item["spec"] {
            return Err(format!(
                "{name}: spec {} != MCP {}",
                obj["spec"], item["spec"]
            ));
        }
        let labels = &obj["metadata"]["labels"];
        for (k, v) in item["metadata"]["labels"].as_object().into_iter().flatten() {
            if &labels[k] != v {
                return Err(format!("{name}: label {k} is {} not {v}", labels[k]));
            }
        }
        if labels["app.kubernetes.io/managed-by"] != "mcp-adapter" {
            return Err(format!("{name}: no managed-by label: {labels}"));
        }
        if obj["metadata"]["annotations"]["mcp-adapter/version"]
            != item["metadata"]["resourceVersion"]
        {
            return Err(format!(
                "{name}: version annotation differs from MCP's version"
            ));
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs kube-apiserver (tests/kube-apiserver/build.sh)"]
fn file_output_writes_changes_only_leaves_a_users_object_alone_and_one_replica_writes() {
    let kube = KubeApiServer::start();
    kube.namespace("ns");
    apply_istio_crds(&kube);
    // A ServiceEntry a user made by hand, with the name adapter-file will want.
    let users = mesh::apply(
        &kube,
        &json!({
            "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "users", "namespace": "ns", "labels": {"team": "a"}},
            "spec": {"hosts": ["users.example.com"], "resolution": "STATIC",
                     "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                     "endpoints": [{"address": "10.9.9.9"}]}
        }),
    );
    let users_path = "/apis/networking.istio.io/v1/namespaces/ns/serviceentries/users";
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, ip) in [
        ("users", "10.0.0.1"),
        ("orders", "10.0.0.2"),
        ("pay", "10.0.0.3"),
    ] {
        write_entry(dir.path(), name, ip);
    }
    let start = |identity: &str| {
        start_file_adapter(
            dir.path(),
            &kube.kubeconfig(),
            "both",
            &["--output-identity", identity],
        )
    };
    let a = start("replica-a");
    a.wait_ready();
    wait_for(WAIT, "replica a writes orders and pay", || {
        let objects = owned_service_entries(&kube, "file");
        (objects.len() == 2 && leads_in_step(&a)).then_some(())
    });
    objects_match_mcp(&kube, "file", &a, &["ns/users"]).unwrap_or_else(|e| panic!("{e}"));

    // The user's object: untouched, and reported.
    let now = kube.get(users_path).expect("users");
    assert_eq!(
        now["metadata"]["resourceVersion"], users["metadata"]["resourceVersion"],
        "the user's ServiceEntry was written: {now}"
    );
    assert_eq!(endpoints(&now), ["10.9.9.9"]);
    assert_eq!(output(&a)["conflicts"], json!(["ns/users"]));
    assert_eq!(a.metric("mcp_adapter_kube_output_conflicts"), 1.0);
    let (status, body) = a.get("/readyz");
    assert_eq!(status, 200);
    assert!(
        body.contains("kube output: leader, API server in step"),
        "{body}"
    );

    // Steady: two applies, nothing more, nothing pending.
    assert_eq!(a.kube_writes("apply"), 2.0, "{}", a.log_tail());
    a.assert_steady(Duration::from_secs(2));
    assert_eq!(a.kube_writes("apply"), 2.0);
    assert_eq!(a.metric("mcp_adapter_kube_output_pending"), 0.0);

    // A second replica follows and writes nothing.
    let mut b = start("replica-b");
    b.wait_ready();
    let mut a = a;
    b.wait_admin(WAIT, "replica b follows", "/readyz", |_, body| {
        body.contains("kube output: following")
    });
    assert_eq!(b.metric("mcp_adapter_kube_output_leader"), 0.0);
    assert_eq!(a.metric("mcp_adapter_kube_output_leader"), 1.0);
    // Following is idle: a Lease look every 2 s, nothing else (no loop on the served set).
    let b_pid = b.pid().expect("b runs");
    let cpu = cpu_seconds(b_pid);
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_seconds(b_pid) - cpu;
    eprintln!("the follower used {used:.2} s of CPU in 3 s");
    assert!(used < 0.3, "the follower used {used:.2} s of CPU in 3 s");

    // One change: exactly that object is written, by the leader only.
    let before = resource_versions(&owned_service_entries(&kube, "file"));
    write_entry(dir.path(), "orders", "10.0.0.22");
    wait_for(WAIT, "orders' new endpoint written", || {
        let objects = owned_service_entries(&kube, "file");
        (objects
            .get("ns/orders")
            .is_some_and(|o| endpoints(o) == ["10.0.0.22"])
            && leads_in_step(&a))
        .then_some(())
    });
    let after = resource_versions(&owned_service_entries(&kube, "file"));
    assert_eq!(after["ns/pay"], before["ns/pay"], "pay was rewritten");
    assert_ne!(after["ns/orders"], before["ns/orders"]);
    assert_eq!(a.kube_writes("apply"), 3.0, "{}", a.log_tail());
    assert_eq!(b.kube_writes("apply") + b.kube_writes("delete"), 0.0);

    // A service leaves: its object goes; the user's stays.
    std::fs::remove_file(dir.path().join("pay.yaml")).expect("remove pay");
    wait_for(WAIT, "pay's object deleted", || {
        let objects = owned_service_entries(&kube, "file");
        (!objects.contains_key("ns/pay") && leads_in_step(&a)).then_some(())
    });
    assert_eq!(a.kube_writes("delete"), 1.0);
    assert_eq!(
        kube.get(users_path).expect("users")["metadata"]["resourceVersion"],
        users["metadata"]["resourceVersion"]
    );

    // The leader dies (SIGKILL: no release): the follower takes over when the Lease expires,
    // finds everything current and writes nothing.
    let before = resource_versions(&owned_service_entries(&kube, "file"));
    a.kill();
    wait_for(
        Duration::from_secs(45),
        "replica b leads and is in step",
        || leads_in_step(&b).then_some(()),
    );
    assert_eq!(b.kube_writes("apply") + b.kube_writes("delete"), 0.0);
    assert_eq!(
        resource_versions(&owned_service_entries(&kube, "file")),
        before
    );
    objects_match_mcp(&kube, "file", &b, &["ns/users"]).unwrap_or_else(|e| panic!("{e}"));

    // The new leader writes the next change.
    write_entry(dir.path(), "orders", "10.0.0.23");
    wait_for(WAIT, "b writes orders' change", || {
        owned_service_entries(&kube, "file")
            .get("ns/orders")
            .is_some_and(|o| endpoints(o) == ["10.0.0.23"])
            .then_some(())
    });
    assert_eq!(b.kube_writes("apply"), 1.0);
    b.assert_no_registry_errors("at the end");
    assert_eq!(output(&b)["lastError"], Value::Null);
    b.terminate(Duration::from_secs(10));
}

#[test]
#[ignore = "needs kube-apiserver, Consul, ZooKeeper and the Eureka server"]
fn every_adapter_writes_what_it_serves_and_restarts_write_nothing() {
    let kube = mesh_api_server();
    // Made before the adapters start (they write at once); checked against the registries' own
    // list below, so that a registry added there is not left without its namespace here.
    let namespaces = [
        "inventory",
        "consul",
        "zookeeper",
        "eureka",
        "store",
        "nacos",
    ];
    for ns in namespaces {
        kube.namespace(ns);
    }
    let kubeconfig = kube.kubeconfig().display().to_string();
    let extra = [
        "--output",
        "both",
        "--output-kubeconfig",
        kubeconfig.as_str(),
        "--output-lease-namespace",
        "default",
        // A restarted process is the same replica (as a restarted container in its pod).
        "--output-identity",
        "replica-0",
    ];
    let (mut regs, ()) = Registries::start_with_args(PORT, &extra, || ());
    assert_eq!(
        regs.namespaces(),
        namespaces,
        "every registry's namespace is made in the mesh cluster before its adapter writes"
    );
    // Addresses on a pod network (the API server refuses loopback in EndpointSlices); nothing
    // is sent to them.
    for r in regs.all_mut() {
        for (service, id, ip) in [("shop", "s1", 1), ("shop", "s2", 2), ("pay", "p1", 3)] {
            let addr = SocketAddr::from(([10, 77, 1, ip], PORT));
            r.register(service, &Instance::new(id, addr));
        }
    }
    // Each adapter's `--source-name` is its registry type, as `kind` names it.
    let source = |r: &dyn Registry| r.kind().to_string();
    let shop = |r: &dyn Registry| -> String {
        let objects = owned_service_entries(&kube, &source(r));
        objects
            .iter()
            .find(|(_, o)| {
                o["spec"]["hosts"]
                    .as_array()
                    .is_some_and(|h| h.iter().any(|h| h == &json!(r.host("shop"))))
            })
            .map(|(k, _)| k.clone())
            .unwrap_or_default()
    };
    for r in regs.all() {
        let a = r.adapter();
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let served = mcpctl_get(&a.xds_url());
            let with_endpoints = |service: &str| {
                let host = json!(r.host(service));
                served.iter().any(|i| {
                    i["spec"]["hosts"]
                        .as_array()
                        .is_some_and(|h| h.contains(&host))
                        && !endpoints(i).is_empty()
                })
            };
            let state = if !with_endpoints("shop") || !with_endpoints("pay") {
                Err(format!(
                    "MCP serves {} items, not shop and pay with endpoints yet",
                    served.len()
                ))
            } else if !leads_in_step(a) {
                Err(format!("output not in step: {}", output(a)))
            } else {
                objects_match_mcp(&kube, &source(r), a, &[])
            };
            match state {
                Ok(()) => break,
                Err(e) if std::time::Instant::now() > deadline => {
                    panic!(
                        "{}: objects never matched MCP: {e}\n{}",
                        r.kind(),
                        a.log_tail()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        assert!(!shop(r).is_empty(), "{}: no shop object", r.kind());
    }

    // One instance leaves each registry: only that registry's `shop` object is rewritten.
    let mut before = BTreeMap::new();
    for r in regs.all() {
        let a = r.adapter();
        before.insert(
            r.kind(),
            (
                resource_versions(&owned_service_entries(&kube, &source(r))),
                a.kube_writes("apply"),
                a.metric_with("mcp_adapter_snapshots_total", "reason=\"change\""),
            ),
        );
    }
    for r in regs.all_mut() {
        r.deregister("shop", "s2");
    }
    for r in regs.all() {
        let a = r.adapter();
        let shop_name = shop(r);
        wait_for(
            WAIT,
            &format!("{} shop down to one endpoint", r.kind()),
            || {
                let objects = owned_service_entries(&kube, &source(r));
                (objects
                    .get(&shop_name)
                    .is_some_and(|o| endpoints(o).len() == 1)
                    && leads_in_step(a))
                .then_some(())
            },
        );
        objects_match_mcp(&kube, &source(r), a, &[])
            .unwrap_or_else(|e| panic!("{}: {e}", r.kind()));
        let (rvs, applies, snapshots) = &before[r.kind()];
        let now = resource_versions(&owned_service_entries(&kube, &source(r)));
        let changed: Vec<&String> = now.keys().filter(|k| now[*k] != rvs[*k]).collect();
        assert_eq!(
            changed,
            [&shop_name],
            "{}: rewritten: {changed:?}",
            r.kind()
        );
        let applied = a.kube_writes("apply") - applies;
        let published =
            a.metric_with("mcp_adapter_snapshots_total", "reason=\"change\"") - snapshots;
        assert!(
            applied >= 1.0 && applied <= published,
            "{}: {applied} applies for {published} new snapshots",
            r.kind()
        );
    }

    // Every adapter restarts with no registry change: not one write, no resourceVersion moves.
    let before: Vec<_> = regs
        .all()
        .iter()
        .map(|r| resource_versions(&owned_service_entries(&kube, &source(*r))))
        .collect();
    for r in regs.all_mut() {
        r.adapter_mut().restart();
    }
    for (r, rvs) in regs.all().iter().zip(&before) {
        let a = r.adapter();
        a.wait_ready();
        wait_for(WAIT, &format!("{} leads again, in step", r.kind()), || {
            leads_in_step(a).then_some(())
        });
        assert_eq!(
            a.kube_writes("apply") + a.kube_writes("delete"),
            0.0,
            "{} wrote after a restart: {}",
            r.kind(),
            a.log_tail()
        );
        assert_eq!(
            &resource_versions(&owned_service_entries(&kube, &source(*r))),
            rvs,
            "{}",
            r.kind()
        );
        a.assert_no_registry_errors("after the restart");
    }
}

/// Applies the output sent that the API server took.
fn applied_ok(a: &Adapter) -> f64 {
    let text = a.get("/metrics").1;
    text.lines()
        .filter(|l| {
            l.starts_with("mcp_adapter_kube_output_requests_total{")
                && l.contains("verb=\"apply\"")
                && l.contains("code=\"200\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
#[ignore = "needs kube-apiserver (tests/kube-apiserver/build.sh)"]
fn an_api_server_outage_and_hand_edits_are_repaired_with_only_what_changed() {
    let mut kube = KubeApiServer::start();
    kube.namespace("ns");
    apply_istio_crds(&kube);
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2")] {
        write_entry(dir.path(), name, ip);
    }
    // `--output kube`: no MCP port at all.
    let a = start_file_adapter(
        dir.path(),
        &kube.kubeconfig(),
        "kube",
        &["--output-resync", "1s"],
    );
    a.wait_ready();
    wait_for(WAIT, "a and b written", || {
        (owned_service_entries(&kube, "file").len() == 2 && leads_in_step(&a)).then_some(())
    });
    assert_eq!(a.get("/registryz").0, 200);
    let before = resource_versions(&owned_service_entries(&kube, "file"));

    // The API server goes away and comes back with nothing changed: one failed list, then
    // /registryz is 200 again without a write (the failure no longer stands once a list
    // answers).
    kube.kill();
    a.wait_registryz(WAIT, "/registryz 503 while the API server is away", 503);
    kube.restart();
    a.wait_registryz(WAIT, "/registryz 200 again, nothing to write", 200);
    assert_eq!(output(&a)["lastError"], Value::Null);
    assert_eq!(a.kube_writes("apply") + a.kube_writes("delete"), 2.0);
    assert_eq!(
        resource_versions(&owned_service_entries(&kube, "file")),
        before
    );

    // The API server goes away; the registry changes meanwhile.
    kube.kill();
    write_entry(dir.path(), "b", "10.0.0.22");
    write_entry(dir.path(), "c", "10.0.0.3");
    let body = a.wait_registryz(WAIT, "/registryz says the output is failing", 503);
    // The registry is fine: the 503 is the output's, which cannot reach the API server. What
    // fails first is a write or the Lease's renewal (the leader's line does not name the
    // latter: its status does).
    assert_eq!(body.lines().next(), Some("file healthy"), "{body}");
    let o = output(&a);
    assert_eq!(o["failing"], true, "{o}");
    let unreachable = |e: &Value| {
        e.as_str()
            .is_some_and(|e| e.contains("client error (Connect)"))
    };
    assert!(
        unreachable(&o["lastError"]) || unreachable(&o["leaseError"]),
        "{body}{o}"
    );
    // The writes of b and c fail: the line says so, quoting the error, and holds back those two.
    let body = a.wait_admin(WAIT, "/registryz: b and c behind", "/registryz", |s, b| {
        s == 503
            && b.lines().nth(1).is_some_and(|l| {
                l.starts_with("kube output: leader, API server 2 objects behind for ")
                    && l.split_once(" (last error: ")
                        .is_some_and(|(_, e)| e.contains("client error (Connect)"))
            })
    });
    let o = output(&a);
    assert_eq!(
        (&o["pending"], &o["failing"]),
        (&json!(2), &json!(true)),
        "{body}{o}"
    );
    let (status, ready) = a.get("/readyz");
    assert_eq!(status, 200, "still ready (the registry is fine): {ready}");
    a.assert_no_registry_errors("during the API server outage");

    // It comes back: only b and c are written; a is left as it was.
    kube.restart();
    wait_for(WAIT, "in step again with b and c written", || {
        let objects = owned_service_entries(&kube, "file");
        (objects.len() == 3
            && objects
                .get("ns/b")
                .is_some_and(|o| endpoints(o) == ["10.0.0.22"])
            && leads_in_step(&a))
        .then_some(())
    });
    let after = resource_versions(&owned_service_entries(&kube, "file"));
    assert_eq!(after["ns/a"], before["ns/a"], "a was rewritten");
    assert_eq!(
        applied_ok(&a),
        4.0,
        "2 at start, b and c after: {}",
        a.log_tail()
    );
    a.wait_registryz(WAIT, "/registryz 200 again", 200);
    let o = output(&a);
    assert_eq!(o["lastError"], Value::Null, "{o}");
    assert_eq!(o["leaseError"], Value::Null, "{o}");
    assert_eq!(a.metric("mcp_adapter_kube_output_pending"), 0.0);
    assert_eq!(a.metric("mcp_adapter_kube_output_lag_seconds"), 0.0);

    // Someone edits one of its objects by hand and deletes another: the next re-list (every
    // second here) writes both back, and only them.
    let collection = "/apis/networking.istio.io/v1/namespaces/ns/serviceentries";
    let mut edited = kube.get(&format!("{collection}/a")).expect("a");
    edited["spec"]["endpoints"] = json!([{"address": "10.6.6.6"}]);
    kube.apply(collection, &edited);
    assert!(kube.delete(&format!("{collection}/c")));
    wait_for(WAIT, "a repaired and c back", || {
        let objects = owned_service_entries(&kube, "file");
        (objects
            .get("ns/a")
            .is_some_and(|o| endpoints(o) == ["10.0.0.1"])
            && objects.contains_key("ns/c")
            && leads_in_step(&a))
        .then_some(())
    });
    assert_eq!(applied_ok(&a), 6.0, "{}", a.log_tail());
}

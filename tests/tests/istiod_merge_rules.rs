//! "One service, several registries" (issue #45): what Istio's real, unmodified istiod
//! (`pilot-discovery`, the pinned module) and a real, stock Envoy sidecar make of one host that
//! several MCP config sources serve, as during a migration from one registry to another.
//!
//! One world for every case: the mesh cluster's API server (Istio's CRDs; a Sidecar, a
//! DestinationRule and two Kubernetes Services with their EndpointSlices in it), three
//! adapter-file instances as three `xds://` config sources, and istiod reading
//! `k8s://, xds://A, xds://B, xds://C` in that order, with one sidecar in namespace `default`:
//! - A: `--source-name consul` (plays the registry being left),
//! - B: `--source-name nacos` (plays the registry being moved to),
//! - C: `--source-name consul` as well, so its resources carry exactly A's labels (as a second
//!   adapter of the same registry would).
//!
//! Every adapter labels what it serves `mcp-adapter/registry` and `mcp-adapter/source`: A's and
//! B's entries never carry equal labels, A's and C's always do.
//!
//! Each case is a host of its own, and each `World` method's doc comment states the rule as
//! observed. What is read: Envoy's clusters for the host and their endpoints (`/clusters`,
//! `/config_dump?include_eds`); the service istiod put in that sidecar's scope for the host
//! (`/debug/sidecarz`: namespace, registry, ports); `/debug/endpointShardz`, `/debug/configz`
//! and `/debug/registryz`. Endpoints are addresses nothing listens on: only configuration is
//! looked at, no request is sent.
//!
//! `cargo test -p e2e --test istiod_merge_rules -- --include-ignored` (after `cargo build
//! --workspace --bins`): about 12 s, 16 s with both cores busy, in a network namespace of its
//! own (the sidecar binds service ports on 127.0.0.1).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};

use e2e::envoy::{Envoy, Interception};
use e2e::istiod::{configz_entries, Istiod, IstiodConfig};
use e2e::kube::{ready, service, slice, KubeApiServer};
use e2e::mesh::{apply, mesh_api_server, Mesh, CONFIG_TIMEOUT};
use e2e::netns::{isolate, pod_ip};
use e2e::{find, ns_name, wait_served, Adapter};

/// istiod's id of the sidecar (pod `client-1` in `default`).
const PROXY: &str = "client-1.default";

/// `metadata.creationTimestamp` values (the MCP resource's `create_time`), oldest first.
const OLDEST: &str = "2020-01-01T00:00:00Z";
const OLDER: &str = "2023-01-01T00:00:00Z";
const OLD: &str = "2024-01-01T00:00:00Z";
const NEW: &str = "2024-06-01T00:00:00Z";

/// Full pushes made at most while waiting to see both sides of a `create_time` tie.
const TIE_PUSHES: usize = 200;

/// A ServiceEntry document for adapter-file: `ns_name` (`namespace/name`) for `host`, created
/// at `created`, STATIC, HTTP `ports` (`"80/http,8080/http-alt"`), one endpoint per address of
/// `ips` (comma-separated, `-` for none) on the service ports.
fn se(ns_name: &str, host: &str, created: &str, ports: &str, ips: &str) -> Value {
    let (ns, name) = ns_name.split_once('/').expect("namespace/name");
    let ports: Vec<Value> = ports
        .split(',')
        .map(|p| {
            let (number, name) = p.split_once('/').expect("number/name");
            let number: u16 = number.parse().expect("port number");
            json!({"number": number, "name": name, "protocol": "HTTP"})
        })
        .collect();
    let endpoints: Vec<Value> = ips
        .split(',')
        .filter(|ip| *ip != "-")
        .map(|ip| json!({"address": ip}))
        .collect();
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": {
            "hosts": [host], "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": ports, "endpoints": endpoints,
        },
    })
}

/// `doc` with `field` of its spec set to `value`.
fn with(mut doc: Value, field: &str, value: Value) -> Value {
    doc["spec"][field] = value;
    doc
}

/// `doc` with the label `registry: <registry>` on every endpoint.
fn registry_label(mut doc: Value, registry: &str) -> Value {
    for e in doc["spec"]["endpoints"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        e["labels"] = json!({"registry": registry});
    }
    doc
}

/// A service of A whose port the tests change to make istiod push in full.
fn filler(port: u16) -> Value {
    se(
        "mig/filler",
        "filler.mig.test",
        OLD,
        &format!("{port}/http"),
        "10.20.12.1",
    )
}

/// Hosts whose two entries (A's and B's) have the same `create_time`.
const TIES: u8 = 4;

/// The `i`th of the [`TIES`] hosts.
fn tie_host(i: u8) -> String {
    format!("tie{i}.mig.test")
}

/// A's `mig/dup`: one port, one endpoint, the newer `create_time`.
fn dup_from_a() -> Value {
    se("mig/dup", "dup.mig.test", NEW, "80/http", "10.20.7.1")
}

/// A file of a source from a line of a table: `file namespace/name host created ports ips`,
/// `created` one of `OLDEST`, `OLDER`, `OLD`, `NEW`, the rest as [`se`] takes them: the file
/// `<file>.json` and its document.
fn entry(line: &str) -> (String, Value) {
    let f: Vec<&str> = line.split_whitespace().collect();
    let [file, ns_name, host, created, ports, ips] = f[..] else {
        panic!("bad entry line {line:?}");
    };
    let created = match created {
        "OLDEST" => OLDEST,
        "OLDER" => OLDER,
        "OLD" => OLD,
        "NEW" => NEW,
        other => panic!("unknown time {other:?} in {line:?}"),
    };
    (file.to_string(), se(ns_name, host, created, ports, ips))
}

/// Replaces the document of `file` among `files` by `edit` of it.
fn edit(files: &mut [(String, Value)], file: &str, edit: impl FnOnce(Value) -> Value) {
    let (_, doc) = files
        .iter_mut()
        .find(|(f, _)| f == file)
        .unwrap_or_else(|| panic!("no file {file}"));
    *doc = edit(doc.take());
}

/// One adapter-file instance: its directory of ServiceEntry documents (`<file>.json` each) and
/// the running adapter.
struct Source {
    name: &'static str,
    dir: tempfile::TempDir,
    adapter: Adapter,
}

impl Source {
    /// Writes `files` and starts adapter-file on them with `--source-name source_name`, polling
    /// every 100 ms and applying removals at once (`--settle-time 0`); waits until it serves
    /// every one of them.
    fn start(name: &'static str, source_name: &str, files: &[(String, Value)]) -> Source {
        let dir = tempfile::tempdir().expect("tempdir");
        for (file, doc) in files {
            write_atomically(dir.path(), file, doc);
        }
        let path = dir.path().display().to_string();
        let adapter = Adapter::start(
            "adapter-file",
            &[
                "--path",
                &path,
                "--poll-interval",
                "100ms",
                "--settle-time",
                "0",
                "--source-name",
                source_name,
            ],
        );
        adapter.wait_ready();
        let want: Vec<&str> = files
            .iter()
            .filter_map(|(_, d)| d["metadata"]["name"].as_str())
            .collect();
        wait_served(
            CONFIG_TIMEOUT,
            &format!("{name} serves {want:?}"),
            &adapter.xds_url(),
            |items| items.len() == want.len() && want.iter().all(|n| find(items, n).is_some()),
        );
        Source { name, dir, adapter }
    }

    /// Replaces (or adds) `<file>.json`.
    fn write(&self, file: &str, doc: &Value) {
        write_atomically(self.dir.path(), file, doc);
    }

    /// Removes `<file>.json`.
    fn remove(&self, file: &str) {
        let path = self.dir.path().join(format!("{file}.json"));
        std::fs::remove_file(&path)
            .unwrap_or_else(|e| panic!("{}: remove {}: {e}", self.name, path.display()));
    }
}

/// Writes `doc` to `dir/<file>.json` through a hidden temporary file and a rename, so that the
/// adapter never reads half a document (it skips names starting with `.`).
fn write_atomically(dir: &Path, file: &str, doc: &Value) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(doc).expect("json")).expect("write");
    std::fs::rename(&tmp, dir.join(format!("{file}.json"))).expect("rename");
}

/// Waits until istiod's configz holds `name` once, with creation time `ts`.
fn wait_create_time(istiod: &Istiod, name: &str, ts: &str) {
    settle(&format!("{name}'s new create_time in configz"), || {
        let e = configz_named(istiod, name);
        let got: Vec<&Value> = e
            .iter()
            .map(|e| &e["metadata"]["creationTimestamp"])
            .collect();
        (got == [ts])
            .then_some(())
            .ok_or_else(|| format!("{got:?}"))
    });
}

/// [`e2e::settle`] within [`CONFIG_TIMEOUT`].
fn settle<T>(what: &str, probe: impl FnMut() -> Result<T, String>) -> T {
    e2e::settle(CONFIG_TIMEOUT, what, probe)
}

/// `want` as [`Envoy::clusters_of`] and [`shards`] read it.
fn view(want: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    want.iter()
        .map(|(k, v)| {
            let mut v: Vec<String> = v.iter().map(|e| e.to_string()).collect();
            v.sort();
            (k.to_string(), v)
        })
        .collect()
}

/// `namespace registry [port/name ...]` of a service as istiod's debug endpoints print it.
fn service_summary(s: &Value) -> String {
    let ports: Vec<String> = s["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| format!("{}/{}", p["port"], p["name"].as_str().unwrap_or("")))
        .collect();
    format!(
        "{} {} [{}]",
        s["Attributes"]["Namespace"].as_str().unwrap_or("?"),
        s["Attributes"]["ServiceRegistry"].as_str().unwrap_or("?"),
        ports.join(" ")
    )
}

/// The service istiod's sidecar scope for [`PROXY`] holds for `host` ([`service_summary`]),
/// `None` when it has none.
fn scope_service(istiod: &Istiod, host: &str) -> Option<String> {
    let scope = istiod.debug(&format!("sidecarz?proxyID={PROXY}"));
    let s = &scope["servicesByHostname"][host];
    (!s.is_null()).then(|| service_summary(s))
}

/// Every service istiod's registry holds for `host` ([`service_summary`] and its creation
/// time), sorted.
fn registry_services(istiod: &Istiod, host: &str) -> Vec<String> {
    let mut v: Vec<String> = istiod
        .debug("registryz")
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["hostname"] == host)
        .map(|s| {
            let created = s["creationTime"].as_str().unwrap_or("?");
            format!("{} {created}", service_summary(s))
        })
        .collect();
    v.sort();
    v
}

/// istiod's endpoint shards for `host`: per `namespace shard-key`, each endpoint as `address
/// port-name`, sorted.
fn shards(istiod: &Istiod, host: &str) -> BTreeMap<String, Vec<String>> {
    let s = istiod.debug("endpointShardz");
    let mut out = BTreeMap::new();
    for (ns, entry) in s[host].as_object().into_iter().flatten() {
        for (key, eps) in entry["Shards"].as_object().into_iter().flatten() {
            let mut v: Vec<String> = eps
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    format!(
                        "{} {}",
                        e["Addresses"][0].as_str().unwrap_or("?"),
                        e["ServicePortName"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            v.sort();
            if !v.is_empty() {
                out.insert(format!("{ns} {key}"), v);
            }
        }
    }
    out
}

/// The ServiceEntries named `ns/name` in istiod's `/debug/configz`.
fn configz_named(istiod: &Istiod, name: &str) -> Vec<Value> {
    let c = istiod.debug("configz");
    configz_entries(&c)
        .filter(|e| ns_name(e) == name)
        .cloned()
        .collect()
}

/// The endpoint addresses of a ServiceEntry as istiod holds it.
fn spec_addresses(e: &Value) -> Vec<String> {
    e["spec"]["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["address"].as_str().map(str::to_string))
        .collect()
}

/// Per endpoint (`ip:port`) of Envoy's EDS cluster `cluster`: its metadata.
fn eds_metadata(envoy: &Envoy, cluster: &str) -> BTreeMap<String, Value> {
    envoy
        .eds_endpoints(cluster)
        .into_iter()
        .map(|(a, lb)| (a, lb["metadata"].clone()))
        .collect()
}

/// The world every case runs in.
struct World {
    kube: KubeApiServer,
    a: Source,
    b: Source,
    c: Source,
    /// What istiod's `configSources` list, after `k8s://`, by source name.
    order: Vec<&'static str>,
    istiod: Istiod,
    /// The sidecar (`None` only while it is replaced).
    sidecar: Option<Envoy>,
    /// The filler's port now ([`World::full_push`]).
    filler_port: u16,
}

impl World {
    fn start() -> World {
        let t = Instant::now();
        let kube = mesh_api_server();
        kube.namespace("shop");
        // (f): two selector-less Kubernetes Services in `shop`, port `http` 80 -> 8080, each
        // with one ready endpoint in its EndpointSlice.
        for (name, ip) in [("orders", "10.20.8.1"), ("payments", "10.20.9.1")] {
            kube.apply_service(&service("shop", name, &[("http", 80, 8080)]));
            kube.apply_slice(&slice(
                "shop",
                &format!("{name}-1"),
                name,
                "IPv4",
                &[("http", 8080)],
                vec![ready(ip)],
            ));
        }
        // The subsets question: one subset per registry, by the endpoints' `registry` label.
        apply(
            &kube,
            &json!({
                "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                "metadata": {"name": "orders", "namespace": "mig"},
                "spec": {"host": "orders.mig.test", "subsets": [
                    {"name": "consul", "labels": {"registry": "consul"}},
                    {"name": "nacos", "labels": {"registry": "nacos"}},
                ]},
            }),
        );
        // The sidecar imports the cases' namespaces, and from its own only `own.test` (not the
        // mesh cluster's `default/kubernetes`, whose port the API server holds here).
        apply(
            &kube,
            &json!({
                "apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                "metadata": {"name": "default", "namespace": "default"},
                "spec": {"egress": [{"hosts": [
                    "mig/*", "mig-a/*", "mig-b/*", "shop/*", "default/own.test",
                ]}]},
            }),
        );
        eprintln!("API server ready in {:?}", t.elapsed());

        #[rustfmt::skip]
        let mut a_files: Vec<(String, Value)> = [
            "orders    mig/orders-consul     orders.mig.test    OLD  80/http   10.20.1.1,10.20.1.2",
            "pay       mig/pay-consul        pay.mig.test       OLD  80/http   10.20.2.1",
            "pay2      mig/pay2-consul       pay2.mig.test      OLD  80/http   10.20.2.5",
            "cart      mig/cart-consul       cart.mig.test      OLD  80/http   10.20.3.1",
            "shelf     mig/shelf-consul      shelf.mig.test     OLD  80/http   10.20.4.1",
            "export    mig/export-consul     export.mig.test    OLD  80/http   10.20.10.1",
            "dns       mig/dns-consul        dns.mig.test       OLD  80/http   10.20.11.1",
            "selector  mig/selector-consul   selector.mig.test  OLD  80/http   10.20.14.1",
            "stock     mig-b/stock           stock.test         OLD  80/http   10.20.5.1",
            "stock2    mig-b/stock2          stock2.test        OLD  80/http   10.20.5.5",
            "own       default/own           own.test           NEW  80/http   10.20.6.1",
            // (f): the Kubernetes Services' hosts, older than the Services.
            "korders   shop/orders-consul    orders.shop.svc.cluster.local    OLDEST 80/http        -",
            "kpayments shop/payments-consul  payments.shop.svc.cluster.local  OLDEST 80/http-legacy -",
        ]
        .into_iter()
        .map(entry)
        .collect();
        edit(&mut a_files, "orders", |d| registry_label(d, "consul"));
        edit(&mut a_files, "export", |d| {
            with(d, "exportTo", json!(["*"]))
        });
        // (f): the entries' endpoints listen on the Services' target port.
        edit(&mut a_files, "korders", |d| {
            with(
                d,
                "endpoints",
                json!([{"address": "10.20.8.11", "ports": {"http": 8080}}]),
            )
        });
        edit(&mut a_files, "kpayments", |d| {
            let ports = json!({"http-legacy": 8080});
            with(
                d,
                "endpoints",
                json!([{"address": "10.20.9.11", "ports": ports}]),
            )
        });
        a_files.push(("dup".to_string(), dup_from_a()));
        a_files.push(("filler".to_string(), filler(80)));
        #[rustfmt::skip]
        let mut b_files: Vec<(String, Value)> = [
            "orders  mig/orders-nacos  orders.mig.test  NEW    80/http        10.20.1.11,10.20.1.12",
            "pay     mig/pay-nacos     pay.mig.test     NEW    80/http-nacos  10.20.2.11",
            "pay2    mig/pay2-nacos    pay2.mig.test    OLDER  80/http-nacos  10.20.2.15",
            "cart    mig/cart-nacos    cart.mig.test    NEW    8080/http-alt  10.20.3.11",
            "stock   mig-a/stock       stock.test       NEW    80/http        10.20.5.11",
            "stock2  mig-a/stock2      stock2.test      OLD    80/http        10.20.5.15",
            "own     mig-a/own         own.test         OLD    80/http        10.20.6.11",
            // The same name as A's `mig/dup`, older, another endpoint, a second port.
            "dup     mig/dup           dup.mig.test     OLDER  80/http,8080/http-alt  10.20.7.11",
        ]
        .into_iter()
        .map(entry)
        .collect();
        edit(&mut b_files, "orders", |d| registry_label(d, "nacos"));
        for i in 1..=TIES {
            let host = tie_host(i);
            let (a, b) = (format!("10.20.13.{i}"), format!("10.20.13.{}", 10 + i));
            let a_ns_name = format!("mig/tie{i}-consul");
            let b_ns_name = format!("mig/tie{i}-nacos");
            a_files.push((format!("tie{i}"), se(&a_ns_name, &host, OLD, "80/http", &a)));
            b_files.push((
                format!("tie{i}"),
                se(&b_ns_name, &host, OLD, "80/http-nacos", &b),
            ));
        }
        #[rustfmt::skip]
        let mut c_files: Vec<(String, Value)> = [
            "shelf     mig/shelf-c     shelf.mig.test     NEW  8080/http-alt  10.20.4.21",
            "export    mig/export-c    export.mig.test    NEW  8080/http-alt  10.20.10.21",
            "dns       mig/dns-c       dns.mig.test       NEW  8080/http-alt  10.20.11.21",
            "selector  mig/selector-c  selector.mig.test  NEW  8080/http-alt  -",
        ]
        .into_iter()
        .map(entry)
        .collect();
        edit(&mut c_files, "dns", |d| with(d, "resolution", json!("DNS")));
        edit(&mut c_files, "selector", |d| {
            with(d, "workloadSelector", json!({"labels": {"app": "legacy"}}))
        });
        let a = Source::start("A", "consul", &a_files);
        let b = Source::start("B", "nacos", &b_files);
        let c = Source::start("C", "consul", &c_files);
        eprintln!("adapters A, B, C serving in {:?}", t.elapsed());

        let order = vec![a.name, b.name, c.name];
        let Mesh { istiod, envoy } =
            Mesh::start(&kube, &[a.adapter.grpc, b.adapter.grpc, c.adapter.grpc]);
        eprintln!(
            "istiod (k8s://, A, B, C) and its sidecar live in {:?}",
            t.elapsed()
        );
        World {
            kube,
            a,
            b,
            c,
            order,
            istiod,
            sidecar: Some(envoy),
            filler_port: 80,
        }
    }

    /// Replaces istiod (and the sidecar, which is then connected to the new one) by one whose
    /// `configSources` list `k8s://`, then B, A, C.
    fn restart_with_b_first(&mut self) {
        let t = Instant::now();
        // The old sidecar goes first: the new one binds the same ports.
        self.sidecar = None;
        self.istiod = Istiod::start_with(
            &[
                self.b.adapter.grpc,
                self.a.adapter.grpc,
                self.c.adapter.grpc,
            ],
            &self.kube.kubeconfig(),
            &IstiodConfig::production(),
        );
        self.sidecar = Some(Envoy::start(
            self.istiod.grpc,
            Interception::None,
            "client-1",
            pod_ip(0, 1),
        ));
        self.order = vec![self.b.name, self.a.name, self.c.name];
        eprintln!(
            "istiod restarted with sources (k8s://, {}) and a new sidecar in {:?}",
            self.order.join(", "),
            t.elapsed()
        );
    }

    /// The sidecar.
    fn envoy(&self) -> &Envoy {
        self.sidecar.as_ref().expect("the sidecar runs")
    }

    /// Waits until Envoy's clusters for `host` and their endpoints are exactly `want` and
    /// istiod's sidecar scope holds `scope` for it.
    fn expect(&self, host: &str, want: &[(&str, &[&str])], scope: &str) {
        let want = view(want);
        settle(&format!("{host}: Envoy {want:?}, scope {scope:?}"), || {
            let got = self.envoy().clusters_of(host);
            let s = scope_service(&self.istiod, host);
            if got == want && s.as_deref() == Some(scope) {
                return Ok(());
            }
            Err(format!(
                "Envoy {got:?}\nscope {s:?}\nregistry {:?}\nshards {:?}",
                registry_services(&self.istiod, host),
                shards(&self.istiod, host)
            ))
        });
        eprintln!("{host}: Envoy {want:?}; sidecar scope {scope}");
    }

    /// Waits until istiod's endpoint shards for `host` are `want` ([`shards`]).
    fn expect_shards(&self, host: &str, want: &[(&str, &[&str])]) {
        let want = view(want);
        settle(&format!("{host}: shards {want:?}"), || {
            let got = shards(&self.istiod, host);
            (got == want)
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        });
        eprintln!("{host}: istiod's endpoint shards {want:?}");
    }

    /// Waits until istiod's registry holds exactly `want` for `host` ([`registry_services`]).
    fn expect_registry(&self, host: &str, want: &[&str]) {
        settle(&format!("{host}: registry {want:?}"), || {
            let got = registry_services(&self.istiod, host);
            (got == want)
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        });
        eprintln!("{host}: istiod's registry {want:?}");
    }

    /// Makes istiod push in full (a port of A's filler service changes: istiod rebuilds its
    /// service index and every sidecar scope) and waits until the sidecar scope and Envoy both
    /// have it: everything that push carried has reached Envoy.
    fn full_push(&mut self) {
        let port = if self.filler_port == 81 { 82 } else { 81 };
        self.a.write("filler", &filler(port));
        let cluster = format!("outbound|{port}||filler.mig.test");
        settle(
            &format!("filler on port {port} in the scope and Envoy"),
            || {
                let scope = scope_service(&self.istiod, "filler.mig.test");
                let envoy = self.envoy().clusters_of("filler.mig.test");
                let want = format!("mig External [{port}/http]");
                (scope.as_deref() == Some(want.as_str()) && envoy.contains_key(&cluster))
                    .then_some(())
                    .ok_or_else(|| format!("scope {scope:?}, Envoy {envoy:?}"))
            },
        );
        self.filler_port = port;
    }

    /// (a) and the subsets question. The same host in the same namespace with the same port
    /// name from two sources: one cluster with both sources' endpoints. istiod keeps each
    /// endpoint's labels, so a DestinationRule subset by an endpoint label (`registry: consul`,
    /// `registry: nacos`) gets a cluster of its own with only that source's endpoints; Envoy's
    /// endpoints carry no labels, only Istio's workload name `<ServiceEntry name>-<index>`.
    fn same_port_name_merges_endpoints(&self) {
        let host = "orders.mig.test";
        self.expect_registry(
            host,
            &[
                "mig External [80/http] 2024-01-01T00:00:00Z",
                "mig External [80/http] 2024-06-01T00:00:00Z",
            ],
        );
        self.expect_shards(
            host,
            &[(
                "mig External/Kubernetes",
                &[
                    "10.20.1.1 http",
                    "10.20.1.2 http",
                    "10.20.1.11 http",
                    "10.20.1.12 http",
                ],
            )],
        );
        self.expect(
            host,
            &[
                (
                    "outbound|80||orders.mig.test",
                    &[
                        "10.20.1.1:80",
                        "10.20.1.2:80",
                        "10.20.1.11:80",
                        "10.20.1.12:80",
                    ],
                ),
                (
                    "outbound|80|consul|orders.mig.test",
                    &["10.20.1.1:80", "10.20.1.2:80"],
                ),
                (
                    "outbound|80|nacos|orders.mig.test",
                    &["10.20.1.11:80", "10.20.1.12:80"],
                ),
            ],
            "mig External [80/http]",
        );
        let shardz = self.istiod.debug("endpointShardz");
        let labels: BTreeMap<String, String> = shardz[host]["mig"]["Shards"]["External/Kubernetes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["Addresses"][0].as_str().unwrap_or("").to_string(),
                    e["Labels"]["registry"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let want: BTreeMap<String, String> = [
            ("10.20.1.1", "consul"),
            ("10.20.1.2", "consul"),
            ("10.20.1.11", "nacos"),
            ("10.20.1.12", "nacos"),
        ]
        .into_iter()
        .map(|(a, r)| (a.to_string(), r.to_string()))
        .collect();
        assert_eq!(
            labels, want,
            "the endpoints' registry labels in istiod's shard"
        );
        let metadata = eds_metadata(self.envoy(), "outbound|80||orders.mig.test");
        let workload = |se: &str, i: u32| {
            json!({"filter_metadata": {"istio": {
                "workload": format!("{se}-{i};mig;{se}-{i};;Kubernetes"),
            }}})
        };
        let want: BTreeMap<String, Value> = [
            ("10.20.1.1:80", workload("orders-consul", 0)),
            ("10.20.1.2:80", workload("orders-consul", 1)),
            ("10.20.1.11:80", workload("orders-nacos", 0)),
            ("10.20.1.12:80", workload("orders-nacos", 1)),
        ]
        .into_iter()
        .map(|(a, m)| (a.to_string(), m))
        .collect();
        assert_eq!(metadata, want, "Envoy's EDS endpoint metadata");
        eprintln!("{host}: Envoy's endpoint metadata {metadata:?}");
    }

    /// (a)/(b) with port names that differ. istiod's shard holds both entries' endpoints, but
    /// the proxy gets one service, the entry with the oldest `create_time` (whatever the order
    /// of the sources), and only the endpoints whose port name is that service's port name:
    /// the other entry's endpoints reach no cluster.
    fn port_name_mismatch_keeps_the_oldest(&self) {
        // A's entry older: A's port name and endpoints.
        self.expect_pay(false);
        // B's entry older: B's, though B is listed after A.
        self.expect_pay2();
    }

    /// `pay.mig.test` (A's entry `http`, B's `http-nacos`) as the proxy gets it: B's when
    /// `b_wins`, else A's.
    fn expect_pay(&self, b_wins: bool) {
        let host = "pay.mig.test";
        self.expect_shards(
            host,
            &[(
                "mig External/Kubernetes",
                &["10.20.2.1 http", "10.20.2.11 http-nacos"],
            )],
        );
        let (ep, scope) = if b_wins {
            ("10.20.2.11:80", "mig External [80/http-nacos]")
        } else {
            ("10.20.2.1:80", "mig External [80/http]")
        };
        self.expect(host, &[("outbound|80||pay.mig.test", &[ep])], scope);
    }

    /// `pay2.mig.test`: B's entry is the older.
    fn expect_pay2(&self) {
        let host = "pay2.mig.test";
        self.expect_shards(
            host,
            &[(
                "mig External/Kubernetes",
                &["10.20.2.5 http", "10.20.2.15 http-nacos"],
            )],
        );
        self.expect(
            host,
            &[("outbound|80||pay2.mig.test", &["10.20.2.15:80"])],
            "mig External [80/http-nacos]",
        );
    }

    /// (b), ties. Two entries of one host and namespace with the same `create_time` are not
    /// ordered by their names (istiod's tie-break compares the service's name, which for a
    /// ServiceEntry is the host, equal here, then the namespace, equal too): which one the
    /// proxy gets follows the order istiod happens to list its services in, and changes between
    /// pushes that have nothing to do with the host. Envoy's endpoints for the host are not
    /// recomputed by such pushes: they keep one entry's endpoints while the proxy's service
    /// flips, so they disagree with it for a while.
    fn create_time_ties_flip_between_pushes(&mut self) {
        // Per tie host: the service when A's entry wins, when B's does, and Envoy's cluster for
        // each.
        let sides = |i: u8| {
            let host = tie_host(i);
            let cluster = format!("outbound|80||{host}");
            let side = |scope: &str, ip: String| {
                (
                    scope.to_string(),
                    BTreeMap::from([(cluster.clone(), vec![format!("{ip}:80")])]),
                )
            };
            [
                side("mig External [80/http]", format!("10.20.13.{i}")),
                side(
                    "mig External [80/http-nacos]",
                    format!("10.20.13.{}", 10 + i),
                ),
            ]
        };
        // What Envoy holds for each at the start: one entry's endpoints, never both (not
        // necessarily those of the service the scope holds now: earlier pushes may have
        // flipped it already).
        let held: Vec<BTreeMap<String, Vec<String>>> = (1..=TIES)
            .map(|i| {
                let host = tie_host(i);
                settle(
                    &format!("{host}: one entry in the scope and in Envoy"),
                    || {
                        let scope = scope_service(&self.istiod, &host).unwrap_or_default();
                        let envoy = self.envoy().clusters_of(&host);
                        let [a, b] = sides(i);
                        let known = |x: &(String, BTreeMap<String, Vec<String>>)| {
                            (x.0 == scope, x.1 == envoy)
                        };
                        let ((sa, ea), (sb, eb)) = (known(&a), known(&b));
                        if (sa || sb) && (ea || eb) {
                            Ok(envoy)
                        } else {
                            Err(format!("scope {scope:?}, Envoy {envoy:?}"))
                        }
                    },
                )
            })
            .collect();
        // Unrelated full pushes until the scope of one of the hosts has held both entries.
        let mut seen: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); usize::from(TIES)];
        let mut disagreed = vec![0usize; usize::from(TIES)];
        let t = Instant::now();
        let mut pushes = 0;
        while seen.iter().all(|s| s.len() < 2) {
            assert!(
                pushes < TIE_PUSHES,
                "{TIE_PUSHES} full pushes and no tie host's scope changed: {seen:?}"
            );
            self.full_push();
            pushes += 1;
            for i in 1..=TIES {
                let (host, k) = (tie_host(i), usize::from(i - 1));
                let scope = scope_service(&self.istiod, &host).unwrap_or_default();
                let [a, b] = sides(i);
                assert!(
                    scope == a.0 || scope == b.0,
                    "{host}: the scope holds {scope:?}"
                );
                let envoy = self.envoy().clusters_of(&host);
                assert_eq!(
                    envoy, held[k],
                    "{host}: Envoy's endpoints changed on a push unrelated to the host"
                );
                let matching = if scope == a.0 { &a.1 } else { &b.1 };
                if &envoy != matching {
                    disagreed[k] += 1;
                }
                *seen[k].entry(scope).or_default() += 1;
            }
        }
        let flipped = seen.iter().position(|s| s.len() == 2).unwrap_or(0);
        assert!(
            disagreed[flipped] > 0,
            "{}: Envoy's endpoints followed the scope",
            tie_host(flipped as u8 + 1)
        );
        for i in 1..=TIES {
            let k = usize::from(i - 1);
            eprintln!(
                "{}: equal create_time, {pushes} unrelated full pushes ({:?}): the proxy's \
                 service was {:?}; Envoy kept {:?} ({} times not the service's)",
                tie_host(i),
                t.elapsed(),
                seen[k],
                held[k],
                disagreed[k]
            );
        }
    }

    /// (c) Ports of two entries of one host and namespace are merged into the proxy's service
    /// only when their labels, exportTo, resolution and workload selector agree; otherwise
    /// only the oldest entry's ports exist and the other's endpoints reach no cluster. Every
    /// adapter labels what it serves with its `mcp-adapter/source`, so entries of two
    /// adapters with different source names never merge their ports; A's and C's (same source
    /// name) do.
    fn ports_merge_only_when_attributes_agree(&self) {
        // A (consul) 80/http, B (nacos) 8080/http-alt: labels differ.
        self.expect_shards(
            "cart.mig.test",
            &[(
                "mig External/Kubernetes",
                &["10.20.3.1 http", "10.20.3.11 http-alt"],
            )],
        );
        self.expect(
            "cart.mig.test",
            &[("outbound|80||cart.mig.test", &["10.20.3.1:80"])],
            "mig External [80/http]",
        );
        // A and C (both consul) 80/http and 8080/http-alt: merged, each port with its endpoints.
        self.expect(
            "shelf.mig.test",
            &[
                ("outbound|80||shelf.mig.test", &["10.20.4.1:80"]),
                ("outbound|8080||shelf.mig.test", &["10.20.4.21:8080"]),
            ],
            "mig External [80/http 8080/http-alt]",
        );
        // Same labels, A's exported to "*", C's without exportTo: not merged.
        self.expect(
            "export.mig.test",
            &[("outbound|80||export.mig.test", &["10.20.10.1:80"])],
            "mig External [80/http]",
        );
        // Same labels, A's STATIC, C's DNS: not merged.
        self.expect(
            "dns.mig.test",
            &[("outbound|80||dns.mig.test", &["10.20.11.1:80"])],
            "mig External [80/http]",
        );
        // Same labels, C's with a workload selector: not merged.
        self.expect(
            "selector.mig.test",
            &[("outbound|80||selector.mig.test", &["10.20.14.1:80"])],
            "mig External [80/http]",
        );
    }

    /// (d) The same host in two namespaces never merges: the proxy gets one namespace's
    /// service and only its endpoints. From a third namespace that is the entry with the
    /// oldest `create_time`, on a tie the namespace first in alphabetical order (the order of
    /// the sources does not matter); a proxy in one of the two namespaces gets its own
    /// namespace's, even when the other is older.
    fn namespaces_never_merge(&self) {
        let host = "stock.test";
        self.expect_registry(
            host,
            &[
                "mig-a External [80/http] 2024-06-01T00:00:00Z",
                "mig-b External [80/http] 2024-01-01T00:00:00Z",
            ],
        );
        self.expect_shards(
            host,
            &[
                ("mig-a External/Kubernetes", &["10.20.5.11 http"]),
                ("mig-b External/Kubernetes", &["10.20.5.1 http"]),
            ],
        );
        // A's mig-b entry is older: the proxy in `default` gets mig-b's.
        self.expect(
            host,
            &[("outbound|80||stock.test", &["10.20.5.1:80"])],
            "mig-b External [80/http]",
        );
        self.namespace_ties_go_alphabetically();
        // The proxy's own namespace (`default`, A's entry) wins over an older one (B's).
        self.expect(
            "own.test",
            &[("outbound|80||own.test", &["10.20.6.1:80"])],
            "default External [80/http]",
        );
    }

    /// (d), ties: the same `create_time` in two namespaces: the namespace first in
    /// alphabetical order (B's mig-a over A's mig-b).
    fn namespace_ties_go_alphabetically(&self) {
        self.expect(
            "stock2.test",
            &[("outbound|80||stock2.test", &["10.20.5.15:80"])],
            "mig-a External [80/http]",
        );
    }

    /// A `create_time` changed on a served entry is not applied as such: it reaches istiod's
    /// config store (`/debug/configz`) but not its service registry (`/debug/registryz` keeps
    /// the old time through any number of pushes) until the entry changes in something else
    /// (here an endpoint label); even then the proxy's service is chosen again only at the next
    /// full push, and Envoy's endpoints for the host follow only when the host's endpoints
    /// next change. A restarted istiod reads it at once.
    fn create_time_changes_apply_late(&mut self) {
        let host = "stock.test";
        let stock_b = |label: &str| {
            let doc = se("mig-a/stock", host, OLDER, "80/http", "10.20.5.11");
            with(
                doc,
                "endpoints",
                json!([{"address": "10.20.5.11", "labels": {"edit": label}}]),
            )
        };
        let registry = |t: &str| {
            vec![
                format!("mig-a External [80/http] {t}"),
                "mig-b External [80/http] 2024-01-01T00:00:00Z".to_string(),
            ]
        };
        // B's mig-a entry made older than A's mig-b one, nothing else changed.
        self.b.write(
            "stock",
            &se("mig-a/stock", host, OLDER, "80/http", "10.20.5.11"),
        );
        wait_create_time(&self.istiod, "mig-a/stock", OLDER);
        self.full_push();
        assert_eq!(
            registry_services(&self.istiod, host),
            registry("2024-06-01T00:00:00Z"),
            "{host}: istiod's registry after B's create_time changed, and a full push"
        );
        self.stock_now(
            "10.20.5.1",
            "mig-b External [80/http]",
            "after the create_time change",
        );
        // Its endpoint changes (a label): the registry takes the new time, but nothing is
        // chosen again yet. istiod handles that change (an endpoint push, which this proxy,
        // whose service is mig-b's, does not get): waited for, by istiod's count of pushes
        // handed to proxies, so that it is not merged into the next full push.
        let dispatched = self.istiod.metric("pilot_proxy_queue_time_count");
        self.b.write("stock", &stock_b("1"));
        let want = registry(OLDER);
        settle(
            &format!("{host}: registry {want:?}, the push dispatched"),
            || {
                let got = registry_services(&self.istiod, host);
                let now = self.istiod.metric("pilot_proxy_queue_time_count");
                (got == want && now > dispatched)
                    .then_some(())
                    .ok_or_else(|| {
                        format!("{got:?}, {now} pushes dispatched ({dispatched} before)")
                    })
            },
        );
        self.stock_now(
            "10.20.5.1",
            "mig-b External [80/http]",
            "after an endpoint label change",
        );
        // The next full push (for another service) chooses mig-a; Envoy's endpoints stay
        // mig-b's.
        self.full_push();
        self.stock_now(
            "10.20.5.1",
            "mig-a External [80/http]",
            "after the next full push",
        );
        // The host's endpoints change again: now Envoy follows.
        self.b.write("stock", &stock_b("2"));
        self.expect(
            host,
            &[("outbound|80||stock.test", &["10.20.5.11:80"])],
            "mig-a External [80/http]",
        );
    }

    /// Asserts that, right now, Envoy's only cluster for `stock.test` has the one endpoint
    /// `envoy_ip` and istiod's sidecar scope holds `scope` for the host.
    fn stock_now(&self, envoy_ip: &str, scope: &str, what: &str) {
        let host = "stock.test";
        let envoy = self.envoy().clusters_of(host);
        let want = view(&[("outbound|80||stock.test", &[&format!("{envoy_ip}:80")])]);
        let s = scope_service(&self.istiod, host);
        assert!(
            envoy == want && s.as_deref() == Some(scope),
            "{host} {what}: Envoy {envoy:?}, scope {s:?}"
        );
        eprintln!("{host} {what}: Envoy {envoy:?}, scope {scope}");
    }

    /// Before the restart: `pay.mig.test`'s B entry made older than A's, nothing else changed:
    /// istiod's registry keeps the old time through a full push, and A's entry stays the one
    /// the proxy gets.
    fn create_time_change_alone_waits(&mut self) {
        let host = "pay.mig.test";
        self.b.write(
            "pay",
            &se("mig/pay-nacos", host, OLDER, "80/http-nacos", "10.20.2.11"),
        );
        wait_create_time(&self.istiod, "mig/pay-nacos", OLDER);
        self.full_push();
        assert_eq!(
            registry_services(&self.istiod, host),
            [
                "mig External [80/http-nacos] 2024-06-01T00:00:00Z",
                "mig External [80/http] 2024-01-01T00:00:00Z",
            ],
            "{host}: istiod's registry after B's create_time changed, and a full push"
        );
        let envoy = self.envoy().clusters_of(host);
        let scope = scope_service(&self.istiod, host);
        assert_eq!(
            (envoy, scope.as_deref()),
            (
                view(&[("outbound|80||pay.mig.test", &["10.20.2.1:80"])]),
                Some("mig External [80/http]")
            ),
            "{host} after B's create_time changed, and a full push"
        );
        eprintln!(
            "{host}: B's entry now {OLDER} in configz, still 2024-06-01 in the registry: A's kept"
        );
    }

    /// After the restart: the `create_time` changed earlier is read at once: B's entries
    /// (`pay.mig.test`'s and `stock.test`'s, now the oldest) are what the proxy gets.
    fn restart_applies_the_changed_create_time(&self) {
        self.expect_registry(
            "pay.mig.test",
            &[
                "mig External [80/http-nacos] 2023-01-01T00:00:00Z",
                "mig External [80/http] 2024-01-01T00:00:00Z",
            ],
        );
        self.expect_pay(true);
        let host = "stock.test";
        self.expect_registry(
            host,
            &[
                "mig-a External [80/http] 2023-01-01T00:00:00Z",
                "mig-b External [80/http] 2024-01-01T00:00:00Z",
            ],
        );
        self.expect(
            host,
            &[("outbound|80||stock.test", &["10.20.5.11:80"])],
            "mig-a External [80/http]",
        );
    }

    /// (e) The same namespace/name from two sources: istiod holds one ServiceEntry, the one of
    /// the source listed first in `configSources`, wholly (its ports, endpoints, labels and
    /// `create_time`; the other's, though older and with one more port, is not seen at all).
    /// When the first source stops serving it, the next source's takes its place; when it
    /// serves it again, it wins again.
    fn same_name_first_source_wins(&self) {
        assert_eq!(self.order[0], self.a.name);
        self.expect_dup_from_a();
        // A stops serving mig/dup: B's, wholly.
        self.a.remove("dup");
        self.expect_dup_from_b();
        eprintln!("dup.mig.test: A's entry removed: B's took its place");
        // A serves it again: A's again.
        self.a.write("dup", &dup_from_a());
        self.expect_dup_from_a();
        eprintln!("dup.mig.test: A's entry back: A's again");
    }

    /// (e) continued: "first" is the order of `configSources`: with B listed before A, B's
    /// `mig/dup` is held, wholly.
    fn first_is_the_configsources_order(&self) {
        assert_eq!(self.order[0], self.b.name);
        self.expect_dup_from_b();
    }

    /// Waits until `mig/dup` is A's in istiod and Envoy: one port, endpoint 10.20.7.1.
    fn expect_dup_from_a(&self) {
        self.expect_dup(Dup {
            who: "A's",
            source: "consul",
            address: "10.20.7.1",
            clusters: &[("outbound|80||dup.mig.test", &["10.20.7.1:80"])],
            ports: "mig External [80/http]",
            shard: &["10.20.7.1 http"],
            created: NEW,
        });
    }

    /// Waits until `mig/dup` is B's in istiod and Envoy: two ports, endpoint 10.20.7.11.
    fn expect_dup_from_b(&self) {
        self.expect_dup(Dup {
            who: "B's",
            source: "nacos",
            address: "10.20.7.11",
            clusters: &[
                ("outbound|80||dup.mig.test", &["10.20.7.11:80"]),
                ("outbound|8080||dup.mig.test", &["10.20.7.11:8080"]),
            ],
            ports: "mig External [80/http 8080/http-alt]",
            shard: &["10.20.7.11 http", "10.20.7.11 http-alt"],
            created: OLDER,
        });
    }

    /// Waits until `mig/dup` is `d`'s in Envoy, istiod's shards and configz, wholly.
    fn expect_dup(&self, d: Dup) {
        let host = "dup.mig.test";
        self.expect(host, d.clusters, d.ports);
        self.expect_shards(host, &[("mig External/Kubernetes", d.shard)]);
        let e = configz_named(&self.istiod, "mig/dup");
        assert_eq!(e.len(), 1, "configz: {e:?}");
        assert_eq!(spec_addresses(&e[0]), [d.address], "configz: {}", e[0]);
        assert_eq!(
            e[0]["metadata"]["labels"]["mcp-adapter/source"], d.source,
            "{}",
            e[0]
        );
        assert_eq!(e[0]["metadata"]["creationTimestamp"], d.created, "{}", e[0]);
        eprintln!(
            "mig/dup: {} (sources k8s://, {})",
            d.who,
            self.order.join(", ")
        );
    }

    /// (f) A Kubernetes Service of that host (its own FQDN) and namespace wins over every
    /// ServiceEntry, even an older one: the proxy gets the Service's ports, and an entry's
    /// endpoints join its cluster when their port name equals the Service's port name (on
    /// the entry's target port); with another port name they are dropped.
    fn kubernetes_service_wins(&self) {
        let host = "orders.shop.svc.cluster.local";
        self.expect_shards(
            host,
            &[
                ("shop External/Kubernetes", &["10.20.8.11 http"]),
                ("shop Kubernetes/Kubernetes", &["10.20.8.1 http"]),
            ],
        );
        self.expect(
            host,
            &[(
                "outbound|80||orders.shop.svc.cluster.local",
                &["10.20.8.1:8080", "10.20.8.11:8080"],
            )],
            "shop Kubernetes [80/http]",
        );
        let registry: Vec<String> = registry_services(&self.istiod, host)
            .into_iter()
            .map(|s| s.split(" [").next().unwrap_or("").to_string())
            .collect();
        assert_eq!(registry, ["shop External", "shop Kubernetes"], "{host}");
        let host = "payments.shop.svc.cluster.local";
        self.expect_shards(
            host,
            &[
                ("shop External/Kubernetes", &["10.20.9.11 http-legacy"]),
                ("shop Kubernetes/Kubernetes", &["10.20.9.1 http"]),
            ],
        );
        self.expect(
            host,
            &[(
                "outbound|80||payments.shop.svc.cluster.local",
                &["10.20.9.1:8080"],
            )],
            "shop Kubernetes [80/http]",
        );
    }
}

#[test]
#[ignore = "needs pilot-discovery, kube-apiserver and envoy: tests/go-peers/build.sh target; scripts/install-envoy.sh target/envoy"]
fn istiod_merge_rules_for_one_host_from_several_sources() {
    if !isolate("istiod_merge_rules_for_one_host_from_several_sources") {
        return;
    }
    let started = Instant::now();
    let mut w = World::start();
    w.same_port_name_merges_endpoints();
    w.port_name_mismatch_keeps_the_oldest();
    w.ports_merge_only_when_attributes_agree();
    w.namespaces_never_merge();
    w.kubernetes_service_wins();
    w.same_name_first_source_wins();
    w.create_time_ties_flip_between_pushes();
    w.create_time_changes_apply_late();
    w.create_time_change_alone_waits();
    eprintln!("first istiod's cases done in {:?}", started.elapsed());

    w.restart_with_b_first();
    w.first_is_the_configsources_order();
    w.restart_applies_the_changed_create_time();
    // Nothing else depends on the order of the sources.
    w.same_port_name_merges_endpoints();
    w.expect_pay2();
    w.ports_merge_only_when_attributes_agree();
    w.namespace_ties_go_alphabetically();
    w.kubernetes_service_wins();
    eprintln!("all cases in {:?}", started.elapsed());
}

/// Whose `mig/dup` istiod and Envoy hold, and what that looks like.
struct Dup {
    who: &'static str,
    source: &'static str,
    address: &'static str,
    clusters: &'static [(&'static str, &'static [&'static str])],
    ports: &'static str,
    shard: &'static [&'static str],
    created: &'static str,
}

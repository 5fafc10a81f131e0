//! Seeds for the I/O fuzz targets (fuzz/fuzz_targets: file_parse, kube_watch, xds_requests,
//! grpc_frames, state_file), captured from real peers: the example files, the API server's JSON
//! for Services and EndpointSlices written as tests/tests/kube.rs writes them (lists and watch
//! events as it sends them), the requests Istio's clients send to an adapter (recorded by a TCP
//! forwarder in front of it: the HTTP/2 DATA frames of each stream), and the state file a real
//! adapter-file run wrote.
//!
//! Every capture is decoded here through the same public functions the targets call, so a
//! seed that no longer reaches the code it was captured for fails this test. With
//! `FUZZ_SEEDS_OUT=dir` the seeds are written to `dir/<target>/`, in each target's input
//! layout (see the targets' docs).
//!
//! `cargo test -p e2e --test fuzz_seeds_io -- --include-ignored`

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::{ObjectList, WatchEvent};
use mcp_server::fuzzing::{Flavour, Stream};
use serde_json::{json, Value};

use e2e::kube::{ready, service, services_path, slice, slices_path, KubeApiServer, ADMIN_TOKEN};
use e2e::xds_sinks::{self, SinkSpec, XdsSinks};
use e2e::{Adapter, Adsc, IstioVersion};

/// Where the seeds go, if anywhere; names each seed by target and a short label.
struct Seeds {
    out: Option<PathBuf>,
    count: BTreeMap<&'static str, usize>,
}

impl Seeds {
    fn new() -> Seeds {
        Seeds {
            out: std::env::var_os("FUZZ_SEEDS_OUT").map(PathBuf::from),
            count: BTreeMap::new(),
        }
    }

    fn add(&mut self, target: &'static str, label: &str, bytes: &[u8]) {
        *self.count.entry(target).or_default() += 1;
        assert!(
            bytes.len() < 64 << 10,
            "{target}/{label}: a seed over 64 KiB"
        );
        if let Some(out) = &self.out {
            let dir = out.join(target);
            std::fs::create_dir_all(&dir).expect("seed dir");
            std::fs::write(dir.join(format!("real-{label}")), bytes).expect("write seed");
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The example files: they parse (YAML, and as JSON when converted).
fn files(seeds: &mut Seeds) {
    for name in ["shop.yaml", "inventory.yaml"] {
        let text =
            std::fs::read_to_string(workspace().join("examples").join(name)).expect("example");
        let services = adapter_file::parse(name, &text, adapter_file::Format::Yaml)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!services.is_empty(), "{name} defines services");
        seeds.add("file_parse", name, &[&[0u8][..], text.as_bytes()].concat());
        // The same documents as one JSON List (the `.json` reader).
        let docs: Vec<Value> = yaml_serde::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
            .filter(|v: &Value| !v.is_null())
            .collect();
        let json = if docs.len() == 1 {
            docs[0].to_string()
        } else {
            json!({"apiVersion": "v1", "kind": "List", "items": docs}).to_string()
        };
        let again = adapter_file::parse(name, &json, adapter_file::Format::Json)
            .unwrap_or_else(|e| panic!("{name} as JSON: {e}"));
        assert_eq!(again.len(), services.len(), "{name} as JSON");
        seeds.add(
            "file_parse",
            &format!("{name}.json"),
            &[&[1u8][..], json.as_bytes()].concat(),
        );
    }
}

/// Services and slices as the API server answers lists and watches of them.
fn kube_objects(kube: &KubeApiServer, seeds: &mut Seeds) {
    kube.namespace("shop");
    let mut web = service("shop", "web", &[("http", 80, 8080), ("api", 9090, 9090)]);
    web["spec"]["ports"][1]["appProtocol"] = json!("kubernetes.io/h2c");
    kube.apply_service(&web);
    let mut db = service("shop", "db", &[("tcp-pg", 5432, 5432)]);
    db["spec"]["clusterIP"] = json!("None");
    kube.apply_service(&db);
    let ext = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "ext", "namespace": "shop"},
        "spec": {"type": "ExternalName", "externalName": "api.example.com",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]},
    });
    kube.apply_service(&ext);
    let endpoints = vec![ready("10.1.0.1"), ready("10.1.0.2")];
    kube.apply_slice(&slice(
        "shop",
        "web-v4",
        "web",
        "IPv4",
        &[("http", 8080), ("api", 9091)],
        endpoints,
    ));
    kube.apply_slice(&slice(
        "shop",
        "web-v6",
        "web",
        "IPv6",
        &[("http", 8080)],
        vec![ready("fd00::1")],
    ));
    kube.apply_slice(&slice(
        "shop",
        "db-x",
        "db",
        "IPv4",
        &[("tcp-pg", 5432)],
        vec![ready("10.2.0.1")],
    ));

    let services = kube.get(&services_path("shop")).expect("service list");
    let slices = kube.get(&slices_path("shop")).expect("slice list");
    let list_s = services.to_string();
    let list_e = slices.to_string();
    let decoded = serde_json::from_str::<ObjectList<Service>>(&list_s).expect("a Service list");
    assert_eq!(decoded.items.len(), 3);
    let slice_list =
        serde_json::from_str::<ObjectList<EndpointSlice>>(&list_e).expect("a slice list");
    assert_eq!(slice_list.items.len(), 3);
    let mut cluster = adapter_kube::state::Cluster::default();
    for s in decoded.items {
        cluster.apply(adapter_kube::registry::service_item(s));
    }
    for s in slice_list.items {
        cluster.apply(adapter_kube::registry::slice_item(s));
    }
    assert_eq!(cluster.service_keys().len(), 3);

    // Watch events, as the API server streams them from version 0 (every object ADDED).
    let watch = |path: &str| -> Vec<String> {
        let r = kube.request(
            ADMIN_TOKEN,
            "GET",
            &format!("{path}?watch=1&resourceVersion=0&timeoutSeconds=1"),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        match r.body {
            Value::String(s) => s.lines().map(str::to_string).collect(),
            one => vec![one.to_string()],
        }
    };
    let s_events = watch(&services_path("shop"));
    let e_events = watch(&slices_path("shop"));
    for l in &s_events {
        serde_json::from_str::<WatchEvent<Service>>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
    for l in &e_events {
        serde_json::from_str::<WatchEvent<EndpointSlice>>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
    assert!(
        s_events.len() >= 3 && e_events.len() >= 3,
        "{s_events:?} {e_events:?}"
    );
    // A deletion, as a watch reports it.
    let deleted = format!(
        "{{\"type\":\"DELETED\",\"object\":{}}}",
        kube.get(&format!("{}/web-v6", slices_path("shop")))
            .expect("slice")
    );

    let line = |kind: char, json: &str| format!("{kind}{json}\n");
    let mut all = String::from("\u{1}");
    all += &line('s', &list_s);
    all += &line('e', &list_e);
    seeds.add("kube_watch", "lists", all.as_bytes());
    let mut events = String::from("\u{0}");
    for l in &s_events {
        events += &line('S', l);
    }
    for l in &e_events {
        events += &line('E', l);
    }
    seeds.add("kube_watch", "watch", events.as_bytes());
    events += &line('E', &deleted);
    seeds.add("kube_watch", "watch-delete", events.as_bytes());
}

/// The bytes one client sent, as they arrive.
type Record = Arc<Mutex<Vec<u8>>>;

/// A TCP forwarder recording what each client sent.
struct Recorder {
    addr: SocketAddr,
    sent: Arc<Mutex<Vec<Record>>>,
}

impl Recorder {
    fn start(upstream: SocketAddr) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let sent: Arc<Mutex<Vec<Record>>> = Arc::default();
        let all = sent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let record = Arc::new(Mutex::new(Vec::new()));
                all.lock().expect("lock").push(record.clone());
                let (c2, s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                std::thread::spawn(move || copy(client, server, Some(record)));
                std::thread::spawn(move || copy(s2, c2, None));
            }
        });
        Recorder { addr, sent }
    }

    /// Each connection's bytes so far.
    fn connections(&self) -> Vec<Vec<u8>> {
        self.sent
            .lock()
            .expect("lock")
            .iter()
            .map(|r| r.lock().expect("lock").clone())
            .collect()
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream, record: Option<Record>) {
    let mut buf = [0u8; 16 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(r) = &record {
                    r.lock().expect("lock").extend_from_slice(&buf[..n]);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The DATA frames of each HTTP/2 stream a client opened (h2c: the preface, then frames).
fn data_frames(conn: &[u8]) -> BTreeMap<u32, Vec<Vec<u8>>> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut streams: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    let Some(mut rest) = conn.strip_prefix(PREFACE) else {
        return streams;
    };
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        let (kind, flags) = (rest[3], rest[4]);
        let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        if rest.len() < 9 + len {
            break;
        }
        let mut payload = &rest[9..9 + len];
        if kind == 0 {
            if flags & 0x8 != 0 {
                let pad = usize::from(payload[0]);
                payload = &payload[1..payload.len() - pad];
            }
            if !payload.is_empty() {
                streams.entry(id).or_default().push(payload.to_vec());
            }
        }
        rest = &rest[9 + len..];
    }
    streams
}

/// gRPC messages of a stream's body.
fn messages(body: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = body;
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if rest.len() < 5 + len {
            break;
        }
        out.push(rest[5..5 + len].to_vec());
        rest = &rest[5 + len..];
    }
    out
}

fn limits() -> Arc<mcp_server::limits::ServerLimits> {
    Arc::new(mcp_server::limits::ServerLimits::new(
        Default::default(),
        16,
        16,
        16,
        64 << 10,
        None,
        Duration::from_secs(10),
        Duration::from_secs(30),
    ))
}

fn selector(f: Flavour) -> u8 {
    Flavour::ALL
        .iter()
        .position(|x| *x == f)
        .expect("a flavour") as u8
}

/// The streams a peer opened, as seeds of both request targets: every message must decode as
/// `flavour`'s request and name a type the adapter serves (its first one at least).
fn requests(rec: &Recorder, flavour: Flavour, label: &str, seeds: &mut Seeds) -> usize {
    let mut streams = 0;
    for (c, conn) in rec.connections().iter().enumerate() {
        for (id, frames) in data_frames(conn) {
            let body = frames.concat();
            let msgs = messages(&body);
            if msgs.is_empty() {
                continue;
            }
            let mut stream = Stream::new(flavour, limits());
            let mut served = false;
            for m in &msgs {
                let (_, out) = stream
                    .request(m, None)
                    .unwrap_or_else(|e| panic!("{label}: a request the target does not take: {e}"));
                served |= out.is_none_or(|s| s.out.served);
            }
            assert!(served, "{label}: no request for a served type");
            streams += 1;
            // xds_requests: publish the first set, then each request as sent.
            let mut ops = vec![selector(flavour), 1, 0];
            for m in &msgs {
                let len = u16::try_from(m.len()).expect("a small request");
                ops.push(0);
                ops.extend_from_slice(&len.to_le_bytes());
                ops.extend_from_slice(m);
            }
            seeds.add("xds_requests", &format!("{label}-{c}-{id}"), &ops);
            // grpc_frames: the body cut where the client's DATA frames ended.
            let cuts: Vec<u8> = frames
                .iter()
                .take(15)
                .map(|f| u8::try_from(f.len().clamp(1, 256) - 1).expect("clamped"))
                .collect();
            let mut framed = vec![selector(flavour), cuts.len() as u8];
            framed.extend_from_slice(&cuts);
            framed.extend_from_slice(&body);
            seeds.add("grpc_frames", &format!("{label}-{c}-{id}"), &framed);
        }
    }
    streams
}

#[test]
#[ignore = "starts kube-apiserver, adapters and Istio's clients"]
fn capture_io_seeds() {
    let mut seeds = Seeds::new();
    files(&mut seeds);

    let kube = e2e::mesh::mesh_api_server();
    kube_objects(&kube, &mut seeds);

    // adapter-file on the shop example, with a state file.
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let shop = workspace().join("examples/shop.yaml");
    let (shop, state_s) = (shop.display().to_string(), state.display().to_string());
    let adapter = Adapter::start("adapter-file", &["--path", &shop, "--state-file", &state_s]);
    adapter.wait_ready();
    let rec = Recorder::start(adapter.grpc);

    for (version, label) in [
        (IstioVersion::Current, "adsc"),
        (IstioVersion::V1_22, "adsc-1.22"),
    ] {
        let mut adsc = Adsc::start(version, rec.addr);
        adsc.wait(Duration::from_secs(60), "adsc synced", |e| {
            e["event"] == "synced"
        });
        // Its ACK of the first response.
        std::thread::sleep(Duration::from_secs(1));
        drop(adsc);
        let before = seeds.count.get("xds_requests").copied().unwrap_or(0);
        requests(&rec, Flavour::Xds, label, &mut seeds);
        rec.sent.lock().expect("lock").clear();
        assert!(
            seeds.count.get("xds_requests").copied().unwrap_or(0) > before,
            "{label}: no stream"
        );
    }

    let sinks = XdsSinks::start(rec.addr, &[SinkSpec::acking(xds_sinks::Flavour::Delta)]);
    e2e::wait_for(
        Duration::from_secs(30),
        "the delta sink's first response",
        || (!sinks.state(0).versions.is_empty()).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    drop(sinks);
    assert!(requests(&rec, Flavour::Delta, "delta-sink", &mut seeds) > 0);
    rec.sent.lock().expect("lock").clear();

    // Istio 1.7's MCP sink (legacy ResourceSource), full-state and incremental.
    for (incremental, label) in [(false, "mcp-sink-1.7"), (true, "mcp-sink-1.7-incremental")] {
        let bin = e2e::peer_binary(
            "ADSC_WATCH_DIR",
            "adsc",
            "mcp-sink-1.7",
            "tests/go-peers/build.sh target",
        );
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["-address", &rec.addr.to_string()]);
        if incremental {
            cmd.arg("-incremental");
        }
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start Istio 1.7's sink");
        std::thread::sleep(Duration::from_secs(3));
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            requests(&rec, Flavour::Legacy, label, &mut seeds) > 0,
            "{label}: no stream"
        );
        rec.sent.lock().expect("lock").clear();
    }

    let istiod = e2e::istiod::Istiod::start(&[rec.addr], &kube.kubeconfig());
    std::thread::sleep(Duration::from_secs(2));
    drop(istiod);
    assert!(requests(&rec, Flavour::Xds, "istiod", &mut seeds) > 0);

    // The state file the adapter wrote for what it served.
    let bytes = e2e::wait_for(Duration::from_secs(20), "the state file", || {
        std::fs::read(&state).ok()
    });
    let saved = mcp_core::cache::state_file::load(&state)
        .expect("the state file loads")
        .expect("the state file exists");
    assert!(
        !saved.snapshot.is_empty(),
        "the state file holds the served set"
    );
    seeds.add("state_file", "adapter-file-shop", &bytes);

    eprintln!("seeds captured: {:?}", seeds.count);
}

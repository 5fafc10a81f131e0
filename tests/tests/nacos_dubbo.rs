//! Dubbo, the main user of Nacos, registering itself: Dubbo 3 providers (Dubbo 3.3 with
//! Dubbo's own Nacos registry, `tests/nacos/dubbo-provider`) registered at interface level and at
//! application level (`register-mode all`), in `public` and in another namespace, on the real
//! Nacos 2.4.3 and 3.0.3; one adapter-nacos per server; istiod (unmodified) reading both; and a
//! stock Envoy sidecar with istio-init's capture. Each provider speaks `dubbo` (TCP) and Triple
//! (gRPC-compatible HTTP/2): every one of its services is reached through Envoy on both ports,
//! by its VIP, and answers from the provider that registered it.
//!
//! The test runs in a network namespace of its own (`e2e::netns`), the providers on the pod
//! network `10.77.5.x`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::envoy::Interception;
use e2e::mesh::{apply, mesh_api_server, sidecar_scope, Mesh, CONFIG_TIMEOUT};
use e2e::nacos::{Nacos, Version};
use e2e::nacos_clients::{DubboMode, DubboProvider, GREETER};
use e2e::netns::{isolate, pod_ip};
use e2e::{find, wait_for, wait_served, Adapter};

const DUBBO_PORT: u16 = 20880;
const TRI_PORT: u16 = 50051;
/// The namespace besides `public`.
const NS: &str = "dubbo-ns";

/// One provider, and what it should be reachable as.
struct Provider {
    app: String,
    ip: String,
    /// The adapter's ServiceEntry names of its two services and the adapter's host suffix.
    interface_name: String,
    app_name: String,
    suffix: &'static str,
    _process: DubboProvider,
}

/// A Dubbo heartbeat through `addr`: the 16-byte header (magic `dabb`, flags two-way request +
/// event + Hessian2, request id 1..8, body length 1) and Hessian2's null `N`. A Dubbo server
/// answers with the event flag, status 20 (OK) and the same id.
fn dubbo_heartbeat(addr: SocketAddr) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let id = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let mut req = vec![0xda, 0xbb, 0xe2, 0x00];
    req.extend_from_slice(&id);
    req.extend_from_slice(&[0, 0, 0, 1, b'N']);
    s.write_all(&req)
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut head = [0u8; 16];
    s.read_exact(&mut head)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let ok =
        head[0..2] == [0xda, 0xbb] && head[2] & 0x20 != 0 && head[3] == 20 && head[4..12] == id;
    ok.then_some(())
        .ok_or_else(|| format!("{addr}: not a Dubbo heartbeat answer: {head:02x?}"))
}

/// `greet("mesh")` over Triple's HTTP/1.1 + JSON, through `addr` with `Host: host`: the
/// answer's body.
fn tri_greet(addr: SocketAddr, host: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let body = r#"["mesh"]"#;
    let req = format!(
        "POST /{GREETER}/greet HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{host} via {addr}: {head}"));
    }
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(rest.to_string());
    }
    // Envoy streams the provider's HTTP/2 answer back in chunks: `<hex size>\r\n<data>\r\n`.
    let mut body = String::new();
    let mut left = rest;
    while let Some((size, after)) = left.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16)
            .map_err(|e| format!("chunk size {size:?}: {e}"))?;
        if n == 0 {
            break;
        }
        body.push_str(after.get(..n).ok_or("a short chunk")?);
        left = after.get(n + 2..).unwrap_or("");
    }
    Ok(body)
}

/// The VIP the adapter gave `name`, from what it serves.
fn vip(items: &[Value], name: &str) -> std::net::IpAddr {
    let se = find(items, name).unwrap_or_else(|| panic!("{name} served: {items:?}"));
    se["spec"]["addresses"][0]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{name} has a VIP: {se}"))
}

/// `(name, number, protocol)` of each port of `name`.
fn ports(items: &[Value], name: &str) -> Vec<(String, u64, String)> {
    e2e::ports(find(items, name).expect("served"))
        .into_iter()
        .map(|(n, name, p)| (name, n, p))
        .collect()
}

#[test]
#[ignore = "needs envoy, pilot-discovery, kube-apiserver, both Nacos servers and the Dubbo provider: scripts/test.sh installs and builds them"]
fn dubbo_providers_registered_through_nacos_are_reached_through_envoy() {
    if !isolate("dubbo_providers_registered_through_nacos_are_reached_through_envoy") {
        return;
    }
    let started = Instant::now();
    let kube = mesh_api_server();
    let servers: Vec<Nacos> = std::thread::scope(|s| {
        let starts: Vec<_> = Version::ALL
            .iter()
            .map(|v| s.spawn(move || Nacos::start(*v)))
            .collect();
        starts
            .into_iter()
            .map(|h| h.join().expect("a Nacos server"))
            .collect()
    });
    eprintln!("both Nacos servers up in {:?}", started.elapsed());

    // Per server: one provider in public, one in NS, each registered at both levels, each on
    // an address of its own with the same two ports.
    let mut providers = Vec::new();
    let mut adapters = Vec::new();
    for (k, (nacos, suffix)) in servers.iter().zip(["nacos2", "nacos3"]).enumerate() {
        let v = nacos.version();
        for (j, ns) in [None, Some(NS)].into_iter().enumerate() {
            let app = format!("greeter-{suffix}-{}", ns.unwrap_or("public"));
            let ip = pod_ip(5, (k * 2 + j + 1) as u8).to_string();
            let process =
                DubboProvider::start(nacos, ns, DubboMode::All, &app, &ip, DUBBO_PORT, TRI_PORT);
            let ns_label = ns.unwrap_or("public");
            providers.push(Provider {
                interface_name: format!(
                    "providers-{}-1.0.0.default-group.{ns_label}",
                    GREETER.to_lowercase()
                ),
                app_name: format!("{app}.default-group.{ns_label}"),
                app,
                ip,
                suffix,
                _process: process,
            });
        }
        // Each adapter in a namespace and with a host suffix of its own, VIPs from ranges of
        // their own: the two registries' services are distinct in the mesh. Nacos 3 runs with
        // no credentials: Dubbo registers in DEFAULT_GROUP, which it lists over gRPC.
        let addr = nacos.server_addr();
        let vips = format!("242.{}.0.0/16", 60 + k);
        let a = Adapter::start(
            "adapter-nacos",
            &[
                "--nacos-addr",
                addr.as_str(),
                "--nacos-namespace",
                &format!("public,{NS}"),
                "--namespace",
                suffix,
                "--host-suffix",
                suffix,
                "--vip-cidr",
                &vips,
            ],
        );
        a.wait_ready();
        eprintln!("{v}: adapter ready");
        adapters.push(a);
    }

    // What each adapter serves: both services of each provider, with Dubbo's two ports, each
    // with the protocol the provider speaks, and the provider's address.
    let mut served = Vec::new();
    for (k, a) in adapters.iter().enumerate() {
        let mine: Vec<&Provider> = providers[k * 2..k * 2 + 2].iter().collect();
        let items = wait_served(
            Duration::from_secs(60),
            "both levels of both providers",
            &a.xds_url(),
            |i| {
                mine.iter().all(|p| {
                    e2e::addresses_of(i, &p.interface_name).is_some_and(|x| x == [p.ip.clone()])
                        && e2e::addresses_of(i, &p.app_name).is_some_and(|x| x == [p.ip.clone()])
                })
            },
        );
        for p in &mine {
            for name in [&p.interface_name, &p.app_name] {
                assert_eq!(
                    ports(&items, name),
                    [
                        (
                            "dubbo".to_string(),
                            u64::from(DUBBO_PORT),
                            "TCP".to_string()
                        ),
                        ("tri".to_string(), u64::from(TRI_PORT), "GRPC".to_string())
                    ],
                    "{name}"
                );
            }
        }
        a.assert_no_registry_errors("with Dubbo providers");
        served.push(items);
    }

    // The mesh: istiod reading both adapters, a sidecar with istio-init's capture.
    apply(&kube, &sidecar_scope(&["nacos2", "nacos3"]));
    let sources: Vec<SocketAddr> = adapters.iter().map(|a| a.grpc).collect();
    let mesh = Mesh::start(&kube, &sources);
    let captured = mesh.sidecar("client-2", 2, Interception::Redirect);
    eprintln!("istiod and the sidecars live in {:?}", started.elapsed());

    // Every service of every provider, through Envoy: Triple by host (Envoy speaks HTTP/2 to
    // the provider, as Istio's protocol GRPC says), Dubbo by the service's VIP.
    for (k, p) in providers.iter().enumerate() {
        let items = &served[k / 2];
        for name in [&p.interface_name, &p.app_name] {
            let host = format!("{name}.{}", p.suffix);
            let vip = vip(items, name);
            let tri = SocketAddr::new(vip, TRI_PORT);
            let answer = wait_for(
                CONFIG_TIMEOUT,
                &format!("{host} over Triple through Envoy"),
                || tri_greet(tri, &host).ok(),
            );
            assert_eq!(
                answer.trim(),
                format!("\"hello mesh from {}@{}:{TRI_PORT} via tri\"", p.app, p.ip),
                "{host}"
            );
            let dubbo = SocketAddr::new(vip, DUBBO_PORT);
            wait_for(
                CONFIG_TIMEOUT,
                &format!("{host}: a Dubbo heartbeat through Envoy"),
                || dubbo_heartbeat(dubbo).ok(),
            );
            eprintln!("{host}: {vip} -> tri {answer}, dubbo heartbeat answered");
        }
    }
    // Both ports' traffic went through the sidecar's clusters of each service (Istio's stat
    // name for a cluster ends in `;`).
    let listeners = captured.listeners();
    for items in &served {
        for se in items {
            if let Some(a) = se["spec"]["addresses"][0].as_str() {
                let l = format!("{a}_{DUBBO_PORT}");
                assert!(listeners.contains(&l), "{l} in {listeners:?}");
            }
        }
    }
    let stats = captured.get("/stats");
    for p in &providers {
        for (name, port) in [&p.interface_name, &p.app_name]
            .into_iter()
            .flat_map(|n| [(n, DUBBO_PORT), (n, TRI_PORT)])
        {
            let counter = format!(
                "cluster.outbound|{port}||{name}.{};.upstream_cx_total: ",
                p.suffix
            );
            let n: u64 = stats
                .lines()
                .find_map(|l| l.strip_prefix(&counter)?.trim().parse().ok())
                .unwrap_or(0);
            assert!(
                n >= 1,
                "{name}:{port}: Envoy connected upstream {n} times; its counters:\n{}",
                stats
                    .lines()
                    .filter(|l| l.contains(name.as_str()) && l.contains("cx_total"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    for a in &adapters {
        a.assert_no_registry_errors("through the test");
    }
    drop(mesh);
    eprintln!("whole test in {:?}", started.elapsed());
}

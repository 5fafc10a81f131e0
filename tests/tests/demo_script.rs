//! `scripts/demo.sh`, end to end, as a newcomer runs it: it starts every peer (Consul,
//! ZooKeeper, Eureka, Nacos (the real server, 2.4.3), two Kubernetes API servers, the adapters,
//! istiod and a stock Envoy) and backends on loopback, prints what the adapters serve, what
//! istiod holds and a curl through Envoy to a service of Consul, ZooKeeper, Eureka and Nacos;
//! `scripts/demo.sh down` then stops every process it started and frees every port.
//!
//! The demo's state dir and ports come from the environment (`DEMO_DIR`, `DEMO_PORT_BASE`), so
//! this test runs beside the others on free ports; the binaries and peers are the ones every
//! other test uses (passed to the script explicitly, so it never builds anything here).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use e2e::load::request;

/// How many ports the demo takes from its `DEMO_PORT_BASE` in one run (BASE..=BASE+80).
const PORT_SPAN: u16 = 81;

/// Nacos' HTTP port, from the base: its Raft port (HTTP - 1000) is BASE+8, in the run above;
/// its client and cluster gRPC ports (HTTP + 1000, + 1001) are BASE+2008 and BASE+2009.
const NACOS_HTTP: u16 = 1008;

/// The four curls the demo prints: host, and the backends that may answer.
const CURLS: [(&str, [&str; 2]); 4] = [
    ("shop.service.consul", ["consul-shop-a", "consul-shop-b"]),
    (
        "orders.zookeeper",
        ["zookeeper-orders-a", "zookeeper-orders-b"],
    ),
    (
        "payments.eureka",
        ["eureka-payments-a", "eureka-payments-b"],
    ),
    // Nacos' `stock` in group DEFAULT_GROUP of namespace public, with adapter-nacos' default
    // host suffix.
    (
        "stock.default-group.public.nacos",
        ["nacos-stock-a", "nacos-stock-b"],
    ),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds tests/")
        .to_path_buf()
}

/// `scripts/demo.sh ARGS` with the demo's environment.
fn demo(env: &[(String, String)], args: &[&str]) -> Output {
    Command::new(repo().join("scripts/demo.sh"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run scripts/demo.sh")
}

/// Stops the demo if the test fails half-way.
struct Down(Vec<(String, String)>, bool);

impl Drop for Down {
    fn drop(&mut self) {
        if !self.1 {
            let out = demo(&self.0, &["down"]);
            eprintln!(
                "scripts/demo.sh down (cleanup):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The line after the line `command` in the demo's output (what that command printed).
fn answer_to<'a>(stdout: &'a str, command: &str) -> &'a str {
    let mut lines = stdout.lines();
    lines
        .by_ref()
        .find(|l| l.trim() == command)
        .unwrap_or_else(|| panic!("the demo printed no `{command}`:\n{stdout}"));
    lines.next().unwrap_or_default().trim()
}

/// `(name, pid, start time)` of every pid file in `dir`.
fn pid_files(dir: &Path) -> Vec<(String, u32, String)> {
    let mut v: Vec<(String, u32, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().replace(".pid", "");
            let text = std::fs::read_to_string(e.path()).expect("pid file");
            let mut parts = text.split_whitespace();
            let pid = parts
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("pid file {name}: {text:?}"));
            (name, pid, parts.next().unwrap_or_default().to_string())
        })
        .collect();
    v.sort();
    v
}

/// The process `pid` runs (not a zombie) and started at `start` (clock ticks since boot): it is
/// the one the demo started, not a later process that reuses the pid.
fn alive(pid: u32, start: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    fields.first().is_some_and(|s| *s != "Z") && fields.get(19) == Some(&start)
}

/// Every address the demo listens on, from its ports file (`NAME=PORT`, `BACKEND_...=IP:PORT`).
fn listen_addrs(ports_file: &Path) -> BTreeMap<String, SocketAddr> {
    let text = std::fs::read_to_string(ports_file)
        .unwrap_or_else(|e| panic!("{}: {e}", ports_file.display()));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let addr = if v.contains(':') {
                v.to_string()
            } else {
                format!("127.0.0.1:{v}")
            };
            let addr = addr
                .parse()
                .unwrap_or_else(|e| panic!("ports file line {k}={v}: {e}"));
            (k.to_string(), addr)
        })
        .collect()
}

#[test]
#[ignore = "needs envoy, pilot-discovery, kube-apiserver, consul, zookeeper, eureka and Nacos 2.4.3 (NACOS2_HOME): scripts/test.sh installs and builds them"]
fn demo_script_starts_everything_curls_each_registry_and_stops_cleanly() {
    // The peers and binaries every other test uses; their helpers fail here, with the command
    // that builds them, rather than the script building them for minutes inside a test.
    let bin_dir = e2e::target_dir();
    for b in [
        "adapter-consul",
        "adapter-zookeeper",
        "adapter-eureka",
        "adapter-nacos",
        "adapter-kube",
        "mcpctl",
    ] {
        e2e::workspace_bin(b);
    }
    e2e::zookeeper::writer_bin();
    let dir_of = |p: PathBuf| {
        p.parent()
            .expect("a peer binary has a directory")
            .display()
            .to_string()
    };
    assert!(
        Path::new("/usr/share/java/zookeeper.jar").exists(),
        "/usr/share/java/zookeeper.jar missing: run scripts/install-zookeeper.sh (the README's test command does)"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("demo");
    // BASE..=BASE+80 and Nacos' ports above them, all free.
    let offsets: Vec<i32> = (0..i32::from(PORT_SPAN))
        .chain([1000, 1001].map(|o| i32::from(NACOS_HTTP) + o))
        .chain([i32::from(NACOS_HTTP)])
        .collect();
    let base = e2e::free_addr_with(&offsets).port();
    let env: Vec<(String, String)> = [
        ("DEMO_DIR", state.display().to_string()),
        ("DEMO_PORT_BASE", base.to_string()),
        ("DEMO_BIN_DIR", bin_dir.display().to_string()),
        (
            "PILOT_DISCOVERY",
            e2e::istiod::pilot_discovery_bin().display().to_string(),
        ),
        ("KUBE_BIN_DIR", dir_of(e2e::kube::kube_bin())),
        ("CONSUL_BIN_DIR", dir_of(e2e::consul::consul_bin())),
        (
            "EUREKA_JAR",
            e2e::eureka::eureka_jar().display().to_string(),
        ),
        ("ENVOY_BIN_DIR", dir_of(e2e::envoy::envoy_bin())),
        (
            "NACOS2_HOME",
            e2e::nacos::Version::V2.home().display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut down = Down(env.clone(), false);

    // Up.
    let t = Instant::now();
    let out = demo(&env, &[]);
    let up = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("scripts/demo.sh (DEMO_PORT_BASE={base}) in {up:?}:\n{stdout}{stderr}");
    assert!(
        out.status.success(),
        "scripts/demo.sh failed ({}):\n{stderr}",
        out.status
    );

    // 1. What each adapter serves: mcpctl's tables, one per adapter, with every service.
    for (adapter, port, services) in [
        ("consul", base + 10, &["shop", "cart"][..]),
        ("zookeeper", base + 11, &["orders", "users"]),
        ("eureka", base + 12, &["payments", "ratings"]),
        ("kube", base + 13, &["catalog"]),
        (
            "nacos",
            base + 14,
            &["stock.default-group.public", "reviews.default-group.public"],
        ),
    ] {
        let command =
            format!("serviceentries --server xds://127.0.0.1:{port}      # adapter-{adapter}");
        let table: Vec<&str> = stdout
            .lines()
            .skip_while(|l| !l.ends_with(&command))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(
            table.first().is_some_and(|h| h.starts_with("NAMESPACE")),
            "no mcpctl table for adapter-{adapter}:\n{stdout}"
        );
        for s in services {
            assert!(
                table.iter().any(|l| l.split_whitespace().nth(1) == Some(s)),
                "adapter-{adapter}'s table lacks {s}: {table:#?}"
            );
        }
    }
    // 2. What istiod holds: every adapter's hosts in its External registry, with endpoints.
    for host in [
        "shop.service.consul",
        "cart.service.consul",
        "orders.zookeeper",
        "users.zookeeper",
        "payments.eureka",
        "ratings.eureka",
        "catalog.store.svc.cluster.local",
        "stock.default-group.public.nacos",
        "reviews.default-group.public.nacos",
    ] {
        assert!(
            stdout.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.get(1) == Some(&host) && f.get(2) == Some(&"External") && f.len() >= 5
            }),
            "istiod's summary lacks {host} in the External registry:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("9 ServiceEntry: consul/cart consul/shop eureka/payments eureka/ratings nacos/reviews.default-group.public nacos/stock.default-group.public store/catalog zookeeper/orders zookeeper/users"),
        "istiod's configz summary:\n{stdout}"
    );

    // 3. The four curls, each answered by a backend of its registry; and the same hosts
    // through Envoy from here: every instance of each service takes requests.
    let proxy = SocketAddr::from(([127, 0, 0, 1], base + 80));
    for (host, backends) in CURLS {
        let answer = answer_to(
            &stdout,
            &format!(
                "$ curl -s -H 'Host: {host}' http://127.0.0.1:{}/",
                base + 80
            ),
        );
        assert!(
            backends.contains(&answer),
            "the demo's curl to {host} was answered by {answer:?}, not one of {backends:?}"
        );
        let seen: BTreeSet<String> = (0..30)
            .map(|i| {
                request(proxy, host, &[])
                    .unwrap_or_else(|e| panic!("request {i} through Envoy to {host}: {e}"))
            })
            .collect();
        let expected: BTreeSet<String> = backends.iter().map(|b| b.to_string()).collect();
        assert_eq!(seen, expected, "30 requests through Envoy to {host}");
    }
    assert!(
        stdout.contains("scripts/demo.sh down") && stdout.contains("Try next"),
        "no commands to try:\n{stdout}"
    );
    // The Nacos one deregisters an instance on this demo's Nacos port (BASE+1008).
    let deregister = format!(
        "curl -s -X DELETE 'http://127.0.0.1:{}/nacos/v1/ns/instance?serviceName=stock&groupName=DEFAULT_GROUP&ip=127.0.0.42&port={}&ephemeral=false'",
        base + NACOS_HTTP,
        base + 80
    );
    assert!(
        stdout.lines().any(|l| l.trim() == deregister),
        "no `{deregister}` to try:\n{stdout}"
    );

    // What it started: 26 processes, all running, and the ports it listed (Nacos' four among
    // them), all taken.
    let pids = pid_files(&state.join("pids"));
    let names: Vec<&str> = pids.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(pids.len(), 26, "pid files: {names:?}");
    for (name, pid, start) in &pids {
        assert!(alive(*pid, start), "{name} (pid {pid}) is not running");
    }
    let addrs = listen_addrs(&state.join("ports"));
    assert_eq!(
        addrs.len(),
        28 + 12,
        "ports file: {addrs:?} (28 ports and 12 backends)"
    );
    for (name, offset) in [
        ("NACOS_RAFT", NACOS_HTTP - 1000),
        ("NACOS_PORT", NACOS_HTTP),
        ("NACOS_GRPC", NACOS_HTTP + 1000),
        ("NACOS_CLUSTER_GRPC", NACOS_HTTP + 1001),
    ] {
        assert_eq!(
            addrs.get(name).map(SocketAddr::port),
            Some(base + offset),
            "ports file: {name}"
        );
    }
    for (name, addr) in &addrs {
        assert!(
            TcpListener::bind(addr).is_err(),
            "{name} ({addr}) is not taken while the demo runs"
        );
    }

    // Down: every process gone, every port free, the state dir removed.
    let t = Instant::now();
    let out = demo(&env, &["down"]);
    down.1 = true;
    eprintln!(
        "scripts/demo.sh down in {:?}:\n{}{}",
        t.elapsed(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "scripts/demo.sh down failed");
    assert!(!state.exists(), "{} is still there", state.display());
    e2e::wait_for(
        Duration::from_secs(10),
        "every process the demo started to be gone",
        || {
            pids.iter()
                .all(|(_, pid, start)| !alive(*pid, start))
                .then_some(())
        },
    );
    // A port taken again by a process this test did not start (another test run on this
    // machine drew it from the same range) is not the demo's: said, not failed.
    let state_dir = state.display().to_string();
    let left: Vec<String> = addrs
        .iter()
        .filter(|(_, a)| TcpListener::bind(a).is_err())
        .filter(|(n, a)| match e2e::process::listener_of(a.port()) {
            Some((pid, cmd)) if !cmd.contains(&state_dir) && !pids.iter().any(|p| p.1 == pid) => {
                eprintln!("{n} {a}: taken since by an unrelated process ({pid}: {cmd})");
                false
            }
            _ => true,
        })
        .map(|(n, a)| format!("{n} {a}"))
        .collect();
    assert!(left.is_empty(), "ports still taken after down: {left:?}");
    eprintln!("demo up in {up:?} (the script's own count: {} s)", {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("==> the demo is up (in "))
            .and_then(|r| r.split(' ').next())
            .unwrap_or("?")
    });
}

//! `--shards` with Istio's real istiod: one adapter-file process serves its set as three
//! `configSources`; istiod holds every service once and follows a change; a restart of the
//! adapter (same shard count) costs istiod nothing; and changing the shard count the safe way
//! (a second adapter beside the first, then istiod rolled to both sets of addresses, then to the
//! new set only) never leaves a service out of what a client of istiod holds, while changing it
//! in place does (which the README warns about).
//!
//! istiod cannot change its `configSources` while it runs: a new mesh config is a new istiod
//! pod. So the roll is done as a Deployment's rolling update does it: the new istiod is ready
//! before the old one stops, and a client of istiod (Istio's own xDS client, `adsc-watch`,
//! recording every change of what it holds) reconnects through one address, as through the
//! istiod Service, from the old istiod to the new one.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::istiod::{configz_entries, configz_service_entries, Istiod};
use e2e::kube::KubeApiServer;
use e2e::{free_addrs, ns_name, service_entry_yaml, wait_for, Adapter, Adsc, IstioVersion};

const SERVICES: usize = 40;

fn write_services(dir: &Path) {
    for i in 0..SERVICES {
        let name = format!("svc-{i:02}");
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            service_entry_yaml(&name, &format!("10.0.0.{}", i + 1)),
        )
        .expect("write");
    }
}

/// The `n` gRPC addresses of an adapter started with `--shards n` on `first`.
fn shard_addrs(first: SocketAddr, n: u16) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::new(first.ip(), first.port() + i))
        .collect()
}

/// `namespace/name` of every ServiceEntry istiod holds, sorted.
fn configz_names(istiod: &Istiod) -> Vec<String> {
    configz_service_entries(&istiod.debug("configz"))
}

/// The endpoint addresses of `name` in istiod's /debug/configz.
fn configz_endpoints(istiod: &Istiod, name: &str) -> Vec<String> {
    let c = istiod.debug("configz");
    configz_entries(&c)
        .filter(|c| ns_name(c) == name)
        .flat_map(|c| {
            c["spec"]["endpoints"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|e| e["address"].as_str().map(str::to_string))
        .collect()
}

fn all_names() -> Vec<String> {
    (0..SERVICES).map(|i| format!("ns/svc-{i:02}")).collect()
}

/// The names each shard serves, from the adapter's /debug/resources.
fn names_by_shard(a: &Adapter, shards: usize) -> Vec<Vec<String>> {
    let d = a.debug();
    let mut by: Vec<Vec<String>> = vec![Vec::new(); shards];
    for r in d["resources"].as_array().into_iter().flatten() {
        let shard = r["shard"].as_u64().expect("shard of a resource") as usize;
        by[shard].push(r["name"].as_str().unwrap_or_default().to_string());
    }
    by
}

/// Waits until every shard of `a` has a sink that acknowledged what it was sent.
fn wait_sinks_on_every_shard(a: &Adapter, shards: usize) {
    wait_for(Duration::from_secs(30), "a sink on every shard", || {
        let m = a.get("/metrics").1;
        (0..shards)
            .all(|i| {
                let series = format!("mcp_adapter_shard_connected_sinks{{shard=\"{i}\"");
                m.lines()
                    .filter(|l| l.starts_with(&series))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
                    >= 1.0
            })
            .then_some(())
    });
}

/// One address in front of one istiod at a time, as the istiod Service is during a rolling
/// update: each new connection goes to the istiod it points at when the connection is made;
/// a connection ends when either end closes it (the old istiod stopping ends its clients'
/// connections, and they reconnect to the new one).
struct IstiodService {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    /// The upstream of every connection made so far, in order.
    connections: Arc<Mutex<Vec<SocketAddr>>>,
}

impl IstiodService {
    fn start(upstream: SocketAddr) -> IstiodService {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let upstream = Arc::new(Mutex::new(upstream));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (u, c) = (upstream.clone(), connections.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let to = *u.lock().expect("upstream");
                let Ok(server) = TcpStream::connect(to) else {
                    // Nothing there: the client's connection closes and it retries.
                    continue;
                };
                c.lock().expect("connections").push(to);
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        IstiodService {
            addr,
            upstream,
            connections,
        }
    }

    /// New connections go to `to` from now on.
    fn point_at(&self, to: SocketAddr) {
        *self.upstream.lock().expect("upstream") = to;
    }

    fn connections(&self) -> Vec<SocketAddr> {
        self.connections.lock().expect("connections").clone()
    }
}

/// Copies `from` to `to` on a thread of its own; when `from` ends, both ends are closed.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (mut from, mut to) = (
        from.try_clone().expect("clone"),
        to.try_clone().expect("clone"),
    );
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// istiod's debounce lines (`Push debounce stable[N] EVENTS for config KEY...`) in `log`: the
/// number of config updates each push merged, and what it names. Every config update istiod
/// counts ends in one of these, so they say what istiod saw, in order.
fn debounces(log: &str) -> Vec<(u64, String)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split_once("Push debounce stable[")?.1;
            let rest = rest.split_once("] ")?.1;
            let (events, what) = rest.split_once(' ')?;
            let what = what.split_once(": ").map_or(what, |(w, _)| w);
            Some((events.parse().ok()?, what.to_string()))
        })
        .collect()
}

/// The debounce line that names `name`'s ServiceEntry (`ns/svc-07` is host
/// `svc-07.example.com`).
fn debounce_of(name: &str) -> String {
    let (ns, short) = name.split_once('/').expect("namespace/name");
    format!("for config ServiceEntry/{ns}/{short}.example.com")
}

/// Moves `name` to a new endpoint address `ip` in the files, waits until istiod holds it, and
/// until istiod's debounce has taken the update (its line after byte `from` of the log names
/// it): every update istiod got before this one from the same source is counted by then.
fn change(istiod: &Istiod, files: &Path, name: &str, ip: &str, from: usize) {
    let short = name.split_once('/').expect("namespace/name").1;
    std::fs::write(
        files.join(format!("{short}.yaml")),
        service_entry_yaml(short, ip),
    )
    .expect("write");
    wait_for(Duration::from_secs(30), "the change in istiod", || {
        (configz_endpoints(istiod, name) == [ip]).then_some(())
    });
    let want = debounce_of(name);
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = istiod.log();
        let seen = debounces(&log[from.min(log.len())..]);
        if seen.iter().any(|(_, what)| what.starts_with(&want)) {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "no debounce line {want:?} for {name} within 30 s; since the change: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first service of each shard: changing them reaches istiod through every source.
fn one_per_shard(by_shard: &[Vec<String>]) -> Vec<String> {
    by_shard
        .iter()
        .map(|names| {
            let mut names = names.clone();
            names.sort();
            names[0].clone()
        })
        .collect()
}

#[test]
#[ignore = "needs pilot-discovery, kube-apiserver and adsc-watch: tests/go-peers/build.sh target; tests/istio-adsc/build.sh target/adsc"]
fn istiod_reads_the_shards_of_one_process_and_the_shard_count_changes_safely() {
    let kube = KubeApiServer::start();
    kube.namespace("istio-system");
    let files = tempfile::tempdir().expect("tempdir");
    write_services(files.path());
    let path = files.path().display().to_string();

    // One process, three shards, three configSources (four ports kept free: it is restarted
    // with four shards at the end).
    let first = free_addrs(4);
    let mut a = Adapter::start_on(
        "adapter-file",
        first,
        &["--path", &path, "--poll-interval", "100ms", "--shards", "3"],
        &[],
    );
    a.wait_ready();
    let by_shard = names_by_shard(&a, 3);
    for (i, names) in by_shard.iter().enumerate() {
        assert!(!names.is_empty(), "shard {i} holds a share: {by_shard:?}");
    }
    let markers = one_per_shard(&by_shard);
    let istiod = Istiod::start(&shard_addrs(first, 3), &kube.kubeconfig());
    wait_for(
        Duration::from_secs(60),
        "istiod holds every service once",
        || (configz_names(&istiod) == all_names()).then_some(()),
    );
    wait_sinks_on_every_shard(&a, 3);
    // Steady: no registry error, /readyz 200, no snapshot while nothing changes.
    a.assert_steady(Duration::from_secs(1));

    // A change on each shard reaches istiod through that shard, as a config update istiod's
    // debounce takes. Once the last is taken, everything istiod got before from every shard
    // (the first sync) is counted: the baseline for the restart below.
    for (i, name) in markers.iter().enumerate() {
        change(
            &istiod,
            files.path(),
            name,
            &format!("10.9.9.{}", i + 1),
            istiod.log().len(),
        );
    }
    let updates = "pilot_inbound_updates";
    let before_restart = istiod.metric(updates);
    let log_before_restart = istiod.log().len();

    // A restart of the adapter (same flags): istiod reconnects to every shard and receives the
    // same names and versions. Then one more change on each shard: on each source istiod
    // handles it after what the reconnection brought, so once istiod's debounce has taken all
    // three, any update the restart caused is counted too, and the only ones are the three.
    a.restart();
    a.wait_ready();
    wait_sinks_on_every_shard(&a, 3);
    for (i, name) in markers.iter().enumerate() {
        change(
            &istiod,
            files.path(),
            name,
            &format!("10.9.8.{}", i + 1),
            log_before_restart,
        );
    }
    let log = istiod.log();
    let seen = debounces(&log[log_before_restart..]);
    let want: Vec<(u64, String)> = markers.iter().map(|n| (1, debounce_of(n))).collect();
    assert_eq!(
        seen, want,
        "istiod saw config updates from a restart that changed nothing (debounce lines since the restart)"
    );
    // Each change is one endpoint update and the config update it triggers: two counts of
    // `pilot_inbound_updates` (types `eds` and `config`), and nothing else.
    assert_eq!(
        istiod.metric(updates) - before_restart,
        2.0 * markers.len() as f64,
        "istiod counted updates beyond the three changes after a restart that changed nothing"
    );
    assert_eq!(configz_names(&istiod), all_names());
    a.assert_steady(Duration::from_secs(1));

    // Changing the count the safe way, with a client of istiod watching throughout: a second
    // adapter with four shards beside the first; istiod rolled to a new replica with both sets
    // of addresses (ready, holding every service, before the old one stops), then to one with
    // only the new ones.
    let service = IstiodService::start(istiod.grpc);
    let mut watcher = Adsc::start(IstioVersion::Current, service.addr);
    // The adapters' services, without what istiod adds of its own (the API server's
    // `default/synthetic-kubernetes`).
    let complete = |items: &[serde_json::Value]| {
        let mut names: Vec<String> = items
            .iter()
            .filter(|i| i["namespace"] == "ns")
            .map(|i| {
                format!(
                    "{}/{}",
                    i["namespace"].as_str().unwrap_or(""),
                    i["name"].as_str().unwrap_or("")
                )
            })
            .collect();
        names.sort();
        names.dedup();
        names
    };
    watcher.wait_items("every service, through the old istiod", |items| {
        complete(items) == all_names()
    });
    let watched_from = watcher.seen.len() - 1;

    let second = free_addrs(4);
    let b = Adapter::start_on(
        "adapter-file",
        second,
        &["--path", &path, "--poll-interval", "100ms", "--shards", "4"],
        &[],
    );
    b.wait_ready();
    let both: Vec<SocketAddr> = shard_addrs(first, 3)
        .into_iter()
        .chain(shard_addrs(second, 4))
        .collect();
    let during = Istiod::start(&both, &kube.kubeconfig());
    wait_for(Duration::from_secs(60), "every service, from both", || {
        let mut names = configz_names(&during);
        names.dedup();
        (names == all_names()).then_some(())
    });
    service.point_at(during.grpc);
    let (old_grpc, during_grpc) = (istiod.grpc, during.grpc);
    drop(istiod);
    let after = Istiod::start(&shard_addrs(second, 4), &kube.kubeconfig());
    wait_for(
        Duration::from_secs(60),
        "every service once, from the new shards",
        || (configz_names(&after) == all_names()).then_some(()),
    );
    for (i, name) in markers.iter().enumerate() {
        assert_eq!(
            configz_endpoints(&after, name),
            [format!("10.9.8.{}", i + 1)]
        );
    }
    // The watcher is on `during` by now or reconnecting to it; wait until it is, so that it
    // moves once more when `during` stops.
    wait_for(
        Duration::from_secs(60),
        "the watcher on the middle istiod",
        || service.connections().contains(&during.grpc).then_some(()),
    );
    service.point_at(after.grpc);
    drop(during);
    // A new service, which only the last istiod (the others have stopped) can give the watcher:
    // once it has it, the watcher went through both moves.
    std::fs::write(
        files.path().join("svc-new.yaml"),
        service_entry_yaml("svc-new", "10.0.1.1"),
    )
    .expect("write");
    let mut with_new = all_names();
    with_new.push("ns/svc-new".to_string());
    with_new.sort();
    let last = watcher.wait_items("the new service, through the last istiod", |items| {
        complete(items).contains(&"ns/svc-new".to_string())
    });
    let mut moves = service.connections();
    moves.dedup();
    assert_eq!(
        moves,
        [old_grpc, during_grpc, after.grpc],
        "the istiods the watcher was connected to, in order"
    );
    let events = watcher.seen.len() - watched_from;
    for (n, ev) in watcher.seen[watched_from..].iter().enumerate() {
        if ev["event"] != "serviceentries" {
            continue;
        }
        let names = complete(
            ev["items"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        );
        let missing: Vec<String> = all_names()
            .into_iter()
            .filter(|n| !names.contains(n))
            .collect();
        assert!(
            missing.is_empty(),
            "the watcher lost {missing:?} during the roll (its event {n} of {events} since it held every service)"
        );
    }
    assert_eq!(
        complete(&last),
        with_new,
        "what the watcher holds at the end"
    );
    drop(after);
    drop(b);
    std::fs::remove_file(files.path().join("svc-new.yaml")).expect("remove");

    // The unsafe way: the same process restarted with four shards while istiod still lists
    // three addresses. The services that moved to the fourth shard leave istiod (its three
    // sources no longer serve them) until istiod is given the fourth address.
    let istiod = Istiod::start(&shard_addrs(first, 3), &kube.kubeconfig());
    wait_for(
        Duration::from_secs(60),
        "istiod on the three shards holds every service once",
        || (configz_names(&istiod) == all_names()).then_some(()),
    );
    a.restart_with(&["--path", &path, "--poll-interval", "100ms", "--shards", "4"]);
    a.wait_ready();
    let moved = names_by_shard(&a, 4)[3].clone();
    assert!(!moved.is_empty(), "some services hash to the fourth shard");
    let mut kept: Vec<String> = all_names()
        .into_iter()
        .filter(|n| !moved.contains(n))
        .collect();
    kept.sort();
    wait_for(
        Duration::from_secs(30),
        "istiod without the services of the unlisted shard",
        || (configz_names(&istiod) == kept).then_some(()),
    );
}

//! `--shards` with Istio's real istiod: one adapter-file process serves its set as three
//! `configSources`; istiod holds every service once and follows a change; a restart of the
//! adapter (same shard count) costs istiod nothing; and changing the shard count the safe way
//! (a second adapter beside the first, then istiod without the old addresses) never leaves a
//! service out of istiod, while changing it in place does (which the README warns about).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use e2e::istiod::{configz_entries, configz_service_entries, Istiod};
use e2e::kube::KubeApiServer;
use e2e::{free_addrs, ns_name, service_entry_yaml, wait_for, Adapter};

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

/// `namespace/name` of every ServiceEntry istiod holds, sorted (twice if two sources hold it).
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

#[test]
#[ignore = "needs pilot-discovery and kube-apiserver: tests/go-peers/build.sh target"]
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
    let istiod = Istiod::start(&shard_addrs(first, 3), &kube.kubeconfig());
    wait_for(
        Duration::from_secs(60),
        "istiod holds every service once",
        || (configz_names(&istiod) == all_names()).then_some(()),
    );
    wait_sinks_on_every_shard(&a, 3);
    // Steady: no registry error, /readyz 200, no snapshot while nothing changes.
    a.assert_steady(Duration::from_secs(1));

    // A change reaches istiod through its shard (and counts as a config update there: the
    // signal that a restart below must not give).
    std::thread::sleep(Duration::from_secs(2));
    let updates = "pilot_inbound_updates";
    let before_change = istiod.metric(updates);
    std::fs::write(
        files.path().join("svc-07.yaml"),
        service_entry_yaml("svc-07", "10.9.9.9"),
    )
    .expect("write");
    wait_for(Duration::from_secs(30), "the change in istiod", || {
        (configz_endpoints(&istiod, "ns/svc-07") == ["10.9.9.9"]).then_some(())
    });
    wait_for(
        Duration::from_secs(10),
        "a config update for the change",
        || (istiod.metric(updates) > before_change).then_some(()),
    );

    // A restart of the adapter (same flags): istiod reconnects to every shard, receives the
    // same names and versions, and counts no config update.
    std::thread::sleep(Duration::from_secs(2));
    let before_restart = istiod.metric(updates);
    a.restart();
    a.wait_ready();
    wait_sinks_on_every_shard(&a, 3);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        istiod.metric(updates),
        before_restart,
        "istiod saw config updates from a restart that changed nothing"
    );
    assert_eq!(configz_names(&istiod), all_names());
    a.assert_steady(Duration::from_secs(1));

    // Changing the count the safe way: a second adapter with four shards beside the first,
    // istiod (a new replica, as a rollout starts it) with both sets of addresses, then one with
    // only the new ones. At every step istiod holds every service.
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
    drop(during);
    let after = Istiod::start(&shard_addrs(second, 4), &kube.kubeconfig());
    wait_for(
        Duration::from_secs(60),
        "every service once, from the new shards",
        || (configz_names(&after) == all_names()).then_some(()),
    );
    assert_eq!(configz_endpoints(&after, "ns/svc-07"), ["10.9.9.9"]);
    drop(after);
    drop(b);

    // The unsafe way: the same process restarted with four shards while istiod still lists
    // three addresses. The services that moved to the fourth shard leave istiod (its three
    // sources no longer serve them) until istiod is given the fourth address.
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

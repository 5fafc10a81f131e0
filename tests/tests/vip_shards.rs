//! Virtual IPs across `--shard i/n` processes (#33 item 6): each process allocates on its own,
//! so with one range two shards would give their services the same address (and, both TCP on
//! one port, the same listener in every sidecar). The real adapter-file binary, default flags.

use std::collections::{BTreeMap, BTreeSet};

use e2e::{mcpctl_get as get, Adapter};
use mcp_core::model::ServiceKey;
use mcp_core::shard::shard_of;
use mcp_core::vip::VipCidr;

/// adapter-file's default `--vip-cidr`.
const FILE_DEFAULT: VipCidr = VipCidr::range(242, 1, 0, 0, 16);

/// A TCP service with no address of its own: it gets a virtual IP.
fn tcp_entry(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  hosts: [{name}.example.com]\n  resolution: STATIC\n  ports: [{{number: 5432, name: tcp, protocol: TCP}}]\n  endpoints: [{{address: {ip}}}]\n"
    )
}

/// `count` groups of three names: two with one home address in the whole default range, and
/// one whose home is the next address. 65,534 usable addresses is even, so two keys with one
/// home are in one shard of two (the home and the shard are one hash modulo 65,534 and 2);
/// the younger of the two takes the next address, the third key's home, in the other shard.
fn colliding_groups(count: usize) -> Vec<[String; 3]> {
    let mut homes: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let base = u32::from(std::net::Ipv4Addr::new(242, 1, 0, 1));
    for i in 0..20_000 {
        let name = format!("db-{i}");
        let key = ServiceKey::namespaced("ns", name.clone());
        let home = FILE_DEFAULT.home_address(&key).map(u32::from);
        homes
            .entry(home.unwrap_or(0) - base)
            .or_default()
            .push(name);
    }
    let groups: Vec<[String; 3]> = homes
        .iter()
        .filter(|(_, names)| names.len() == 2)
        .filter_map(|(home, names)| {
            let next = homes.get(&(home + 1)).filter(|n| n.len() == 1)?;
            Some([names[0].clone(), names[1].clone(), next[0].clone()])
        })
        .take(count)
        .collect();
    assert_eq!(groups.len(), count, "20,000 names hold {count} such groups");
    for [a, b, c] in &groups {
        let shard = |n: &str| shard_of(&ServiceKey::namespaced("ns", n), 2);
        assert!(shard(a) == shard(b) && shard(a) != shard(c), "{a} {b} {c}");
    }
    groups
}

/// `--shard 0/2` and `--shard 1/2` over one directory holding services that collided: no address and port is served by both shards, and each shard's addresses lie in
/// its own half of the default range.
#[test]
fn shard_processes_never_serve_one_address_and_port_for_two_services() {
    let dir = tempfile::tempdir().expect("tempdir");
    let groups = colliding_groups(3);
    let mut written = 0;
    for group in &groups {
        for name in group {
            written += 1;
            std::fs::write(
                dir.path().join(format!("{name}.yaml")),
                tcp_entry(name, &format!("10.0.0.{written}")),
            )
            .expect("write");
        }
    }
    let path = dir.path().to_string_lossy().to_string();
    let mut served: Vec<BTreeMap<(String, u64), String>> = Vec::new();
    let mut adapters = Vec::new();
    let mut halves = Vec::new();
    for i in 0..2 {
        let a = Adapter::start(
            "adapter-file",
            &["--path", &path, "--shard", &format!("{i}/2")],
        );
        a.wait_ready();
        let items = get(&a.xds_url());
        let mut mine = BTreeMap::new();
        for item in &items {
            let name = item["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let addrs = item["spec"]["addresses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert_eq!(addrs.len(), 1, "{name} has one virtual IP: {item}");
            let addr = addrs[0].as_str().unwrap_or("").to_owned();
            let octets: Vec<u8> = addr.split('.').filter_map(|o| o.parse().ok()).collect();
            assert_eq!(
                &octets[..2],
                &[242, 1],
                "{name}: {addr} is in the default range"
            );
            halves.push((name.clone(), addr.clone(), usize::from(octets[2] >= 128), i));
            for port in item["spec"]["ports"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let number = port["number"].as_u64().unwrap_or(0);
                mine.insert((addr.clone(), number), name.clone());
            }
        }
        served.push(mine);
        adapters.push(a);
    }
    assert_eq!(
        served[0].len() + served[1].len(),
        groups.len() * 3,
        "every service is served by one shard"
    );
    let both: BTreeSet<_> = served[0]
        .keys()
        .filter(|k| served[1].contains_key(*k))
        .collect();
    assert!(
        both.is_empty(),
        "address and port served by both shards for two services: {:?}",
        both.iter()
            .map(|k| (k, &served[0][*k], &served[1][*k]))
            .collect::<Vec<_>>()
    );
    for (name, addr, half, shard) in halves {
        assert_eq!(
            half, shard,
            "{name}: {addr} is in shard {shard}'s half of 242.1.0.0/16"
        );
    }
}

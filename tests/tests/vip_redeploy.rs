//! #33 item 5 with the real adapter-consul and Consul: a rolling deploy re-dates a service
//! (Consul has no service object, so a service is as old as its oldest registration), and the
//! virtual IPs of two services with one home address must not trade hands within the
//! quarantine.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::consul::{Consul, Registration};
use e2e::{mcpctl_get, wait_served, Adapter};
use mcp_core::model::ServiceKey;
use mcp_core::vip::VipCidr;

const RANGE: &str = "242.7.0.0/28";

/// The virtual IP of every served item that has one, by name.
fn vips(items: &[Value]) -> BTreeMap<String, String> {
    items
        .iter()
        .filter_map(|i| {
            let name = i["metadata"]["name"].as_str()?;
            Some((
                name.to_string(),
                i["spec"]["addresses"][0].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Two services with one home address in [`RANGE`]; the older one deployed anew (a new
/// instance under a new id, then the old one gone). Watches the adapter until it serves what a
/// replica started after the deploy serves, and returns every address it saw one service
/// receive less than `window` after another last held it.
fn redeploy(quarantine: Duration, window: Duration) -> Vec<String> {
    let cidr: VipCidr = RANGE.parse().expect("range");
    let mut homes = BTreeMap::new();
    let (a, b) = (0..)
        .find_map(|i| {
            let name = format!("db-{i}");
            let home = cidr.home_address(&ServiceKey::new(name.clone()));
            homes.insert(home, name.clone()).map(|first| (first, name))
        })
        .expect("a collision");
    let consul = Consul::start(None);
    let reg = |service: &str, id: &str, ip: &str| {
        Registration::new("node-1", service, id, ip, 5432).protocol("tcp")
    };
    consul.register(&reg(&a, &format!("{a}-0"), "10.9.0.1"));
    consul.register(&reg(&b, &format!("{b}-0"), "10.9.0.2"));
    let addr = consul.addr();
    let q = format!("{}ms", quarantine.as_millis());
    let flags = [
        "--consul-addr",
        addr.as_str(),
        "--vip-cidr",
        RANGE,
        "--vip-quarantine",
        q.as_str(),
        "--exclude-service",
        "consul",
    ];
    let both = |xds: &str| {
        vips(&wait_served(
            Duration::from_secs(60),
            "both services with a virtual IP",
            xds,
            |i| vips(i).len() == 2,
        ))
    };
    let first = Adapter::start("adapter-consul", &flags);
    first.wait_ready();
    let xds = first.xds_url();
    let mut last_held: BTreeMap<String, (String, Instant)> = BTreeMap::new();
    let before = Instant::now();
    for (name, ip) in both(&xds) {
        last_held.insert(ip, (name, before));
    }

    // The deploy: the new instance first, then the old one goes.
    consul.register(&reg(&a, &format!("{a}-1"), "10.9.0.3"));
    consul.deregister("node-1", &format!("{a}-0"));
    let fresh = Adapter::start("adapter-consul", &flags);
    fresh.wait_ready();
    let want = both(&fresh.xds_url());

    let mut violations = Vec::new();
    let deadline = Instant::now() + quarantine * 4 + Duration::from_secs(30);
    loop {
        // What one answer shows held at some moment between `asked` and `answered`: a
        // handover is certain only if it shows within the quarantine of `asked` earlier.
        let asked = Instant::now();
        let now = vips(&mcpctl_get(&xds));
        let answered = Instant::now();
        for (name, ip) in &now {
            if let Some((holder, since)) = last_held.get(ip) {
                if holder != name && answered.duration_since(*since) < window {
                    violations.push(format!(
                        "{name} got {ip} within {:?} of {holder} holding it",
                        answered.duration_since(*since)
                    ));
                }
            }
        }
        for (name, ip) in &now {
            last_held.insert(ip.clone(), (name.clone(), asked));
        }
        if now == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never settled where a fresh replica serves them: {now:?} vs {want:?}"
        );
    }
    first.assert_no_registry_errors("after the deploy");
    violations
}

#[test]
#[ignore = "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)"]
fn a_rolling_deploy_never_hands_a_virtual_ip_to_another_service() {
    let q = Duration::from_secs(4);
    let violations = redeploy(q, q);
    assert!(violations.is_empty(), "{violations:#?}");
}

/// What the adapter did before #33 (no quarantine): the deploy swaps the two addresses.
#[test]
#[ignore = "needs consul: tests/consul/build.sh target/consul (the README's test command builds it)"]
fn without_a_quarantine_a_rolling_deploy_swaps_virtual_ips() {
    let violations = redeploy(Duration::ZERO, Duration::from_secs(4));
    eprintln!("{violations:#?}");
    assert!(!violations.is_empty(), "the swap was not seen");
}

//! Service names (the ServiceEntry name and its host relative to `--host-suffix`).
//!
//! Dubbo: Dubbo-on-Istio users (Aeraki) address a Dubbo service by its interface, so the name
//! is the interface mapped to DNS (lower-cased, other characters than `[a-z0-9.-]` -> `-`):
//! `com.example.OrderService` -> `com.example.orderservice`. Group and version are endpoint
//! labels, not part of the name, so a version bump never renames a service. Only when two
//! interfaces map to one name (`com.foo.Api` and `com.foo.API`, `a.b_c` and `a.b$c`) do all but
//! one of them get a hash of the original interface appended ([`dubbo_hashed_name`]); that is
//! decided across the whole registry by [`crate::assemble`] and reported as a problem.
//!
//! Curator / Spring / Dubbo 3 application names: the name itself when it is a lower-case DNS
//! name (Spring's usual `waiter-service`), else the mapped name plus a hash of the original.

use mcp_core::translate::naming::{fnv1a32, is_dns_subdomain, label_with_hash, map_dns_name};

fn is_plain_dns_name(s: &str) -> bool {
    s.len() <= 200 && is_dns_subdomain(s)
}

/// Keeps a mapped dotted name well under 253 bytes once the host suffix is added, dropping
/// leading labels (the most general part of a Java package name).
fn shorten(mapped: &str) -> Vec<String> {
    let mut labels: Vec<String> = mapped
        .split('.')
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    while labels.iter().map(|l| l.len() + 1).sum::<usize>() > 180 && labels.len() > 1 {
        labels.remove(0);
    }
    labels
}

/// Appends `-{hash}` to the last label of a mapped dotted name, keeping it <= 63 bytes.
fn with_hash(mapped: &str, hash: u32) -> String {
    let mut labels = shorten(mapped);
    match labels.last_mut() {
        Some(last) => *last = label_with_hash(last, hash),
        None => labels.push(format!("z-{hash:08x}")),
    }
    labels.join(".")
}

/// Name of a Dubbo interface's service: the interface mapped to DNS, lower-cased.
///
/// An interface with nothing left after mapping (`ÄÖ`) or one too long for a host gets the
/// hashed form at once: its readable form would not identify it.
pub fn dubbo_name(interface: &str) -> String {
    let mapped = map_dns_name(interface);
    if mapped.is_empty() || mapped.len() > 180 {
        return dubbo_hashed_name(interface);
    }
    mapped
}

/// The name of a Dubbo interface whose [`dubbo_name`] is taken by another interface: the
/// readable name plus `-{8 hex of FNV-1a(interface)}` on its last label.
pub fn dubbo_hashed_name(interface: &str) -> String {
    with_hash(&map_dns_name(interface), fnv1a32(&["dubbo", interface]))
}

/// Name of a Curator / Spring Cloud / Dubbo 3 application service: the name itself when it is
/// a lower-case DNS name, else the mapped name plus a hash of the original.
pub fn curator_name(name: &str) -> String {
    if is_plain_dns_name(name) && name.len() <= 120 {
        name.to_string()
    } else {
        with_hash(&map_dns_name(name), fnv1a32(&["curator", name]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn dubbo_names_are_the_lower_cased_interface() {
        assert_eq!(
            dubbo_name("com.example.OrderService"),
            "com.example.orderservice"
        );
        assert_eq!(dubbo_name("com.foo.api"), "com.foo.api");
        assert_eq!(dubbo_name("com.foo.My_Api$V2"), "com.foo.my-api-v2");
        let h = dubbo_hashed_name("com.foo.API");
        assert!(h.starts_with("com.foo.api-") && is_dns_subdomain(&h), "{h}");
        assert_ne!(h, dubbo_hashed_name("com.foo.Api"));
        for i in ["", "ÄÖ", &"x".repeat(300), &"a.".repeat(150)] {
            let n = dubbo_name(i);
            assert!(is_dns_subdomain(&n) && n.len() <= 200, "{i:?} -> {n:?}");
            assert!(n.split('.').all(|l| l.len() <= 63), "{n}");
        }
        // Hashed names of different interfaces differ.
        let mut seen = BTreeMap::new();
        for i in [
            "com.foo.Api",
            "com.foo.API",
            "com.foo.api",
            "com.foo.a_pi",
            "com.foo.a$pi",
        ] {
            assert!(seen.insert(dubbo_hashed_name(i), i).is_none(), "{i}");
        }
    }

    #[test]
    fn curator_names() {
        assert_eq!(curator_name("waiter-service"), "waiter-service");
        let m = curator_name("My_Service");
        assert!(m.starts_with("my-service-") && is_dns_subdomain(&m), "{m}");
        assert_ne!(curator_name("My_Service"), curator_name("my_service"));
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(fnv1a32(&[""]), 0x811c_9dc5);
        assert_eq!(fnv1a32(&["a"]), 0xe40c_292c);
        assert_ne!(fnv1a32(&["a", "bc"]), fnv1a32(&["ab", "c"]));
    }
}

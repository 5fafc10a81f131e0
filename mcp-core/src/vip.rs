//! Virtual IPs for TCP services that the registry gives no address.
//!
//! Istio builds a listener on `0.0.0.0:<port>` for a ServiceEntry port that is not HTTP (or
//! TLS/SNI) when the entry has no `addresses`: every Dubbo interface on 20880, or every Consul
//! database on 5432, lands on the same listener, and the sidecar sends traffic to the wrong one.
//! Giving each such entry its own address makes the listeners distinct (clients reach it through
//! Istio's DNS proxy, which answers the host with this address).
//!
//! The allocation is a pure function of the set of services that need one: the same on every
//! replica and after every restart, so a reconnecting istiod sees no churn. Each service has a
//! home slot (a stable hash of its key); when two share one, the smaller key keeps it and the
//! other takes the next free slot. Only a service in such a collision chain can move, and only
//! when a service that sorts before it joins or leaves the chain.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::model::{Resolution, Service, ServiceKey};

/// Protocols whose ports share a `0.0.0.0:<port>` listener safely (routed by Host header or SNI).
const SHARED_LISTENER_PROTOCOLS: [&str; 7] = [
    "HTTP",
    "HTTP2",
    "HTTP_PROXY",
    "GRPC",
    "GRPC-WEB",
    "HTTPS",
    "TLS",
];

/// `--vip-cidr`: the range virtual IPs come from, or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VipCidr {
    /// No virtual IPs.
    Off,
    /// An IPv4 range.
    Range {
        /// First address.
        base: Ipv4Addr,
        /// Prefix length, 8-30.
        prefix: u8,
    },
}

impl VipCidr {
    /// A range (for adapters' defaults).
    pub const fn range(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self::Range {
            base: Ipv4Addr::new(a, b, c, d),
            prefix,
        }
    }

    /// Usable addresses (network and broadcast addresses left out) as (first, count).
    fn slots(self) -> Option<(u32, u32)> {
        match self {
            Self::Off => None,
            Self::Range { base, prefix } => {
                let size = 1u32 << (32 - u32::from(prefix));
                Some((u32::from(base) + 1, size - 2))
            }
        }
    }
}

impl fmt::Display for VipCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Range { base, prefix } => write!(f, "{base}/{prefix}"),
        }
    }
}

impl FromStr for VipCidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") || s.is_empty() {
            return Ok(Self::Off);
        }
        let (ip, prefix) = s.split_once('/').ok_or_else(|| {
            format!("invalid --vip-cidr {s:?}: expected e.g. 242.3.0.0/16 or off")
        })?;
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|e| format!("invalid --vip-cidr {s:?}: {e} (IPv4 only)"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (8..=30).contains(p))
            .ok_or_else(|| format!("invalid --vip-cidr {s:?}: prefix length must be 8 to 30"))?;
        let mask = u32::MAX << (32 - u32::from(prefix));
        if u32::from(ip) & !mask != 0 {
            return Err(format!(
                "invalid --vip-cidr {s:?}: host bits set (did you mean {}/{prefix}?)",
                Ipv4Addr::from(u32::from(ip) & mask)
            ));
        }
        Ok(Self::Range { base: ip, prefix })
    }
}

/// Whether `s` needs a virtual IP: no address of its own, endpoints the proxy resolves itself,
/// and a port that would otherwise share a wildcard listener.
pub fn needs_vip(s: &Service) -> bool {
    s.addresses.is_empty()
        && s.resolution != Resolution::None
        && s.ports.iter().any(|p| {
            !p.protocol.as_deref().is_some_and(|proto| {
                SHARED_LISTENER_PROTOCOLS
                    .iter()
                    .any(|x| x.eq_ignore_ascii_case(proto))
            })
        })
}

/// The services that need a VIP and what they got.
#[derive(Debug)]
pub struct Vips {
    cidr: VipCidr,
    members: BTreeSet<ServiceKey>,
    assigned: HashMap<ServiceKey, Ipv4Addr>,
    /// Members left without one because the range is full.
    unassigned: Vec<ServiceKey>,
}

impl Vips {
    /// Allocates from `cidr`.
    pub fn new(cidr: VipCidr) -> Self {
        Self {
            cidr,
            members: BTreeSet::new(),
            assigned: HashMap::new(),
            unassigned: Vec::new(),
        }
    }

    /// Whether allocation is on.
    pub fn enabled(&self) -> bool {
        self.cidr != VipCidr::Off
    }

    /// Records whether `key` needs one; true if membership changed (then [`Vips::reallocate`]).
    pub fn set_member(&mut self, key: &ServiceKey, member: bool) -> bool {
        if !self.enabled() {
            return false;
        }
        if member {
            self.members.insert(key.clone())
        } else {
            self.members.remove(key)
        }
    }

    /// The address of `key`, if it has one.
    pub fn get(&self, key: &ServiceKey) -> Option<Ipv4Addr> {
        self.assigned.get(key).copied()
    }

    /// Members the range had no room for.
    pub fn unassigned(&self) -> &[ServiceKey] {
        &self.unassigned
    }

    /// Recomputes the allocation; returns the keys whose address changed (old or new).
    pub fn reallocate(&mut self) -> Vec<ServiceKey> {
        let Some((first, count)) = self.cidr.slots() else {
            return Vec::new();
        };
        let mut taken: HashSet<u32> = HashSet::with_capacity(self.members.len());
        let mut assigned = HashMap::with_capacity(self.members.len());
        let mut unassigned = Vec::new();
        for key in &self.members {
            if taken.len() as u64 >= u64::from(count) {
                unassigned.push(key.clone());
                continue;
            }
            let mut slot = home_slot(key, count);
            while !taken.insert(slot) {
                slot = (slot + 1) % count;
            }
            assigned.insert(key.clone(), Ipv4Addr::from(first + slot));
        }
        let mut changed: Vec<ServiceKey> = assigned
            .iter()
            .filter(|(k, ip)| self.assigned.get(*k) != Some(*ip))
            .map(|(k, _)| k.clone())
            .collect();
        changed.extend(
            self.assigned
                .keys()
                .filter(|k| !assigned.contains_key(*k))
                .cloned(),
        );
        self.assigned = assigned;
        self.unassigned = unassigned;
        changed
    }
}

/// Stable across processes, versions and platforms (xxh3 is a fixed algorithm).
fn home_slot(key: &ServiceKey, count: u32) -> u32 {
    let mut id = String::with_capacity(key.name.len() + 16);
    id.push_str(key.namespace.as_deref().unwrap_or(""));
    id.push('/');
    id.push_str(&key.name);
    (xxhash_rust::xxh3::xxh3_64(id.as_bytes()) % u64::from(count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Port;

    fn tcp(name: &str) -> Service {
        let mut s = Service::new(ServiceKey::new(name), name.to_string());
        s.ports.push(Port {
            number: 20880,
            name: "tcp".into(),
            protocol: Some("TCP".into()),
            target_port: None,
        });
        s
    }

    #[test]
    fn parses_ranges() {
        assert_eq!(
            "242.3.0.0/16".parse::<VipCidr>(),
            Ok(VipCidr::range(242, 3, 0, 0, 16))
        );
        assert_eq!("off".parse::<VipCidr>(), Ok(VipCidr::Off));
        assert!("242.3.0.1/16".parse::<VipCidr>().is_err());
        assert!("242.3.0.0/31".parse::<VipCidr>().is_err());
        assert!("fd00::/64".parse::<VipCidr>().is_err());
    }

    #[test]
    fn who_needs_one() {
        assert!(needs_vip(&tcp("a")));
        let mut sniffed = tcp("a");
        sniffed.ports[0].protocol = None;
        assert!(
            needs_vip(&sniffed),
            "unknown protocol is sniffed on a wildcard listener"
        );
        let mut http = tcp("a");
        http.ports[0].protocol = Some("http".into());
        assert!(!needs_vip(&http));
        let mut own = tcp("a");
        own.addresses.push("10.1.2.3".into());
        assert!(!needs_vip(&own));
        let mut passthrough = tcp("a");
        passthrough.resolution = Resolution::None;
        assert!(!needs_vip(&passthrough));
    }

    #[test]
    fn allocation_is_a_function_of_the_set() {
        let cidr = VipCidr::range(242, 3, 0, 0, 24);
        let keys: Vec<ServiceKey> = (0..200).map(|i| ServiceKey::new(format!("s{i}"))).collect();
        let mut a = Vips::new(cidr);
        for k in &keys {
            a.set_member(k, true);
            a.reallocate();
        }
        let mut b = Vips::new(cidr);
        for k in keys.iter().rev() {
            b.set_member(k, true);
        }
        b.reallocate();
        let mut seen = HashSet::new();
        for k in &keys {
            let ip = a.get(k).expect("assigned");
            assert_eq!(Some(ip), b.get(k), "{k:?}: same on every replica");
            assert!(seen.insert(ip), "{ip} given twice");
            let o = ip.octets();
            assert_eq!(&o[..3], &[242, 3, 0]);
            assert!(o[3] != 0 && o[3] != 255);
        }
    }

    #[test]
    fn only_collision_chains_move_and_a_full_range_is_reported() {
        let cidr = VipCidr::range(242, 3, 0, 0, 30); // two usable addresses
        let mut v = Vips::new(cidr);
        for n in ["a", "b", "c"] {
            v.set_member(&ServiceKey::new(n), true);
        }
        v.reallocate();
        assert_eq!(v.unassigned(), &[ServiceKey::new("c")]);
        v.set_member(&ServiceKey::new("a"), false);
        let changed = v.reallocate();
        assert!(changed.contains(&ServiceKey::new("a")));
        assert!(v.get(&ServiceKey::new("c")).is_some());
        assert!(v.unassigned().is_empty());
    }
}

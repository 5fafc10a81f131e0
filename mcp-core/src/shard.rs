//! Which services this adapter serves when one registry is split over several adapters.
//!
//! A sink that speaks state-of-the-world (istiod) receives the whole set on every change, so a
//! very large registry is best served by several adapters, each its own `configSources` entry.
//! The split is by service key (`namespace/name`, or the name where the registry has no
//! namespaces, as /debug/resources shows it): a stable hash (`--shard 0/4`) or globs
//! (`--shard-services`, `--shard-exclude-services`). Both are pure functions of the key, so
//! every replica of a shard, and every restart, serves the same services.
//!
//! `--shards COUNT` serves the same split from one process: one registry watch and one index,
//! shard `i` on its own port. A service lands in the same shard either way ([`shard_of`]).

use std::fmt;
use std::str::FromStr;

use crate::filter::NameFilter;
use crate::model::ServiceKey;
use crate::registry::RegistryEvent;

/// `INDEX/COUNT`: the services whose key hash modulo COUNT is INDEX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardIndex {
    /// This shard, `0..count`.
    pub index: u64,
    /// How many shards there are.
    pub count: u64,
}

impl FromStr for ShardIndex {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid shard {s:?}: expected INDEX/COUNT with INDEX < COUNT, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u64 = i.trim().parse().map_err(|_| bad())?;
        let count: u64 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Self { index, count })
    }
}

impl fmt::Display for ShardIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The shard of `count` that the service with this key belongs to: its key's xxh3 hash modulo
/// `count` (xxh3 is specified and stable across versions and platforms).
pub fn shard_of(key: &ServiceKey, count: usize) -> usize {
    if count <= 1 {
        return 0;
    }
    // The hash of the key's text (`namespace/name`, as it displays), streamed: no string is
    // built per service when a full set is split.
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    if let Some(ns) = &key.namespace {
        h.update(ns.as_bytes());
        h.update(b"/");
    }
    h.update(key.name.as_bytes());
    (h.digest() % count as u64) as usize
}

/// The services one adapter serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shard {
    /// Hash split, if any.
    pub index: Option<ShardIndex>,
    /// Glob split, if any (empty = every name).
    pub names: NameFilter,
}

impl Shard {
    /// Whether every service is served (no sharding flag given).
    pub fn is_everything(&self) -> bool {
        self.index.is_none() && self.names == NameFilter::default()
    }

    /// Whether the service with this key belongs to this shard.
    pub fn keeps(&self, key: &ServiceKey) -> bool {
        if self.is_everything() {
            return true;
        }
        self.names.allows(&key.to_string())
            && self
                .index
                .is_none_or(|s| shard_of(key, s.count as usize) as u64 == s.index)
    }

    /// The event restricted to this shard; `None` if nothing of it belongs here. Problems are
    /// kept whole: they describe registry objects, which have no shard until converted.
    pub fn filter(&self, event: RegistryEvent) -> Option<RegistryEvent> {
        if self.is_everything() {
            return Some(event);
        }
        match event {
            RegistryEvent::Reset(mut services) => {
                services.retain(|s| self.keeps(&s.key));
                Some(RegistryEvent::Reset(services))
            }
            RegistryEvent::Upsert(s) => self.keeps(&s.key).then_some(RegistryEvent::Upsert(s)),
            RegistryEvent::Remove(k) => self.keeps(&k).then_some(RegistryEvent::Remove(k)),
            RegistryEvent::Changes {
                mut upserts,
                mut removes,
            } => {
                upserts.retain(|s| self.keeps(&s.key));
                removes.retain(|k| self.keeps(k));
                (!upserts.is_empty() || !removes.is_empty())
                    .then_some(RegistryEvent::Changes { upserts, removes })
            }
            p @ RegistryEvent::Problems { .. } => Some(p),
            h @ (RegistryEvent::Retrying(_) | RegistryEvent::Recovered) => Some(h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Service;

    #[test]
    fn parses_index_over_count() {
        assert_eq!(
            "1/4".parse::<ShardIndex>(),
            Ok(ShardIndex { index: 1, count: 4 })
        );
        for bad in ["4/4", "1/0", "1", "a/2", "-1/2", ""] {
            assert!(bad.parse::<ShardIndex>().is_err(), "{bad}");
        }
    }

    #[test]
    fn shards_partition_the_services() {
        let keys: Vec<ServiceKey> = (0..1000)
            .map(|i| ServiceKey::namespaced("ns", format!("svc-{i}")))
            .collect();
        let shards: Vec<Shard> = (0..4)
            .map(|index| Shard {
                index: Some(ShardIndex { index, count: 4 }),
                names: NameFilter::default(),
            })
            .collect();
        let mut sizes = [0usize; 4];
        for k in &keys {
            let owners: Vec<usize> = (0..4).filter(|i| shards[*i].keeps(k)).collect();
            assert_eq!(owners.len(), 1, "{k} is served by exactly one shard");
            sizes[owners[0]] += 1;
        }
        for s in sizes {
            assert!((200..300).contains(&s), "balanced: {sizes:?}");
        }
        // Stable: the same key lands in the same shard on every run and every replica.
        assert!(shards[(xxhash_rust::xxh3::xxh3_64(b"ns/svc-0") % 4) as usize].keeps(&keys[0]));
    }

    #[test]
    fn filters_events_by_glob() {
        let shard = Shard {
            index: None,
            names: NameFilter::new(vec!["pay*".into()], vec!["*-canary".into()]),
        };
        let svc = |n: &str| Service::new(ServiceKey::new(n), "test");
        let Some(RegistryEvent::Reset(kept)) = shard.filter(RegistryEvent::Reset(vec![
            svc("payments"),
            svc("payments-canary"),
            svc("orders"),
        ])) else {
            panic!("a Reset stays a Reset")
        };
        let names: Vec<_> = kept.iter().map(|s| s.key.name.as_str()).collect();
        assert_eq!(names, ["payments"]);
        assert!(shard.filter(RegistryEvent::Upsert(svc("orders"))).is_none());
        assert!(shard
            .filter(RegistryEvent::Remove(ServiceKey::new("pay")))
            .is_some());
        let Some(RegistryEvent::Changes { upserts, removes }) =
            shard.filter(RegistryEvent::Changes {
                upserts: vec![svc("payments"), svc("orders")],
                removes: vec![ServiceKey::new("orders"), ServiceKey::new("pay")],
            })
        else {
            panic!("Changes with something kept stay Changes")
        };
        assert_eq!(upserts.len(), 1);
        assert_eq!(removes, [ServiceKey::new("pay")]);
        assert!(shard
            .filter(RegistryEvent::Changes {
                upserts: vec![svc("orders")],
                removes: vec![]
            })
            .is_none());
        assert!(shard
            .filter(RegistryEvent::Problems {
                scope: "x".into(),
                problems: vec![]
            })
            .is_some());
        assert!(Shard::default().is_everything());
    }
}

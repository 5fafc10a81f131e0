//! adapter-kube on the API server's JSON: Service and EndpointSlice objects decoded as kube's
//! client decodes list and watch answers (serde_json into `ObjectList<K>` / `WatchEvent<K>`),
//! kept as the watch keeps them (`registry::service_item` / `slice_item`, which compact them),
//! joined (`state::Cluster`), converted (`convert::convert_service`) and translated.
//!
//! Input: one selector byte (bit 0: ClusterIPs as addresses; bit 1: headless Services served
//! STATIC), then lines, each one message: `S`/`E` and a watch event of a Service/EndpointSlice
//! (`{"type":"ADDED","object":{...}}`), or `s`/`e` and a list of them (a re-list).
//!
//! Invariants: no panic; every service converted passes the core (`check_served`); after each
//! message, a Service whose conversion changed is among those the change said it touched (the
//! watch converts only those); the compacted objects convert as the whole ones do; and the
//! join built change by change converts as one built from the final objects at once.

#![no_main]

use std::collections::BTreeMap;

use adapter_kube::config::Headless;
use adapter_kube::convert::{convert_service, Settings};
use adapter_kube::registry::{service_item, slice_item};
use adapter_kube::state::{Cluster, Item, Kind, ObjKey};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::{ObjectList, WatchEvent};
use kube::ResourceExt;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::io::{serve, split, translate_config};
use mcp_core::model::Service as Model;

/// The objects as last sent, by kind and key: what a fresh list would return.
#[derive(Default)]
struct Objects {
    services: BTreeMap<ObjKey, Service>,
    slices: BTreeMap<ObjKey, EndpointSlice>,
}

/// The adapter's join, and one fed the objects whole (not compacted).
struct Joins {
    compact: Cluster,
    whole: Cluster,
}

fn key<K: ResourceExt>(o: &K) -> ObjKey {
    (o.namespace().unwrap_or_default(), o.name_any())
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let settings = Settings {
        cluster_domain: "cluster.local".into(),
        cluster_ip: selector & 1 == 1,
        headless: if selector & 2 == 2 {
            Headless::Static
        } else {
            Headless::None
        },
        network: None,
        trust_domain: "cluster.local".into(),
    };
    let mut joins = Joins {
        compact: Cluster::default(),
        whole: Cluster::default(),
    };
    let mut objects = Objects::default();
    let mut last: BTreeMap<ObjKey, Option<Model>> = BTreeMap::new();
    for line in split(rest, b"\n").take(64) {
        let Some((&kind, json)) = line.split_first() else {
            continue;
        };
        let touched = match kind {
            b'S' => match serde_json::from_slice::<WatchEvent<Service>>(json) {
                Ok(ev) => service_event(ev, &mut joins, &mut objects),
                Err(_) => continue,
            },
            b'E' => match serde_json::from_slice::<WatchEvent<EndpointSlice>>(json) {
                Ok(ev) => slice_event(ev, &mut joins, &mut objects),
                Err(_) => continue,
            },
            b's' => match serde_json::from_slice::<ObjectList<Service>>(json) {
                Ok(list) => {
                    objects.services = list.items.iter().map(|s| (key(s), s.clone())).collect();
                    relist(
                        &mut joins,
                        Kind::Services,
                        list.items,
                        service_item,
                        whole_service,
                    );
                    None
                }
                Err(_) => continue,
            },
            b'e' => match serde_json::from_slice::<ObjectList<EndpointSlice>>(json) {
                Ok(list) => {
                    objects.slices = list.items.iter().map(|s| (key(s), s.clone())).collect();
                    relist(
                        &mut joins,
                        Kind::Slices,
                        list.items,
                        slice_item,
                        whole_slice,
                    );
                    None
                }
                Err(_) => continue,
            },
            _ => continue,
        };
        check_touched(&joins, &settings, touched, &mut last);
    }
    check_fresh(&joins.compact, &objects, &settings);
});

fn whole_service(s: Service) -> Item {
    Item::Service(Box::new(s))
}

fn whole_slice(s: EndpointSlice) -> Item {
    Item::Slice(Box::new(s))
}

/// A re-list: the watch replaces the kind's objects and sends everything again.
fn relist<K: Clone>(
    joins: &mut Joins,
    kind: Kind,
    items: Vec<K>,
    keep: fn(K) -> Item,
    whole: fn(K) -> Item,
) {
    let kept = items.iter().cloned().map(keep).collect();
    joins.compact.replace(kind, None, kept);
    joins
        .whole
        .replace(kind, None, items.into_iter().map(whole).collect());
}

fn service_event(
    ev: WatchEvent<Service>,
    joins: &mut Joins,
    objects: &mut Objects,
) -> Option<Vec<ObjKey>> {
    match ev {
        WatchEvent::Added(s) | WatchEvent::Modified(s) => {
            objects.services.insert(key(&s), s.clone());
            joins.whole.apply(whole_service(s.clone()));
            Some(joins.compact.apply(service_item(s)))
        }
        WatchEvent::Deleted(s) => {
            objects.services.remove(&key(&s));
            joins.whole.delete(whole_service(s.clone()));
            Some(joins.compact.delete(service_item(s)))
        }
        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => Some(Vec::new()),
    }
}

fn slice_event(
    ev: WatchEvent<EndpointSlice>,
    joins: &mut Joins,
    objects: &mut Objects,
) -> Option<Vec<ObjKey>> {
    match ev {
        WatchEvent::Added(s) | WatchEvent::Modified(s) => {
            objects.slices.insert(key(&s), s.clone());
            joins.whole.apply(whole_slice(s.clone()));
            Some(joins.compact.apply(slice_item(s)))
        }
        WatchEvent::Deleted(s) => {
            objects.slices.remove(&key(&s));
            joins.whole.delete(whole_slice(s.clone()));
            Some(joins.compact.delete(slice_item(s)))
        }
        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => Some(Vec::new()),
    }
}

/// Converts every Service as the watch would after this message (`touched`: the keys an
/// object change named; `None` after a re-list, which converts everything).
fn check_touched(
    joins: &Joins,
    settings: &Settings,
    touched: Option<Vec<ObjKey>>,
    last: &mut BTreeMap<ObjKey, Option<Model>>,
) {
    let cfg = translate_config("kubernetes");
    let mut keys = joins.compact.service_keys();
    keys.extend(last.keys().cloned());
    keys.sort();
    keys.dedup();
    for k in keys {
        let out = convert_service(&joins.compact, &k, settings);
        let whole = convert_service(&joins.whole, &k, settings);
        assert_eq!(
            out.service, whole.service,
            "compacting changed the conversion of {k:?}"
        );
        for p in &out.problems {
            assert!(
                p.contains(&k.0) && (p.contains("service") || p.contains("EndpointSlice")),
                "a problem that names no object: {p}"
            );
        }
        let before = last.get(&k).cloned().flatten();
        if out.service != before {
            if let Some(t) = &touched {
                assert!(
                    t.contains(&k),
                    "{k:?} changed, but the change did not name it"
                );
            }
        }
        if let Some(s) = out.service.clone() {
            serve(s, &cfg);
        }
        last.insert(k, out.service);
    }
}

/// The join built change by change converts as one built from the final objects at once.
fn check_fresh(cluster: &Cluster, objects: &Objects, settings: &Settings) {
    let mut fresh = Cluster::default();
    let services = objects
        .services
        .values()
        .cloned()
        .map(service_item)
        .collect();
    fresh.replace(Kind::Services, None, services);
    let slices = objects.slices.values().cloned().map(slice_item).collect();
    fresh.replace(Kind::Slices, None, slices);
    assert_eq!(
        cluster.service_keys(),
        fresh.service_keys(),
        "the Services differ"
    );
    for k in cluster.service_keys() {
        let a = convert_service(cluster, &k, settings);
        let b = convert_service(&fresh, &k, settings);
        assert_eq!(
            a.service, b.service,
            "{k:?} converts differently when listed at once"
        );
    }
}

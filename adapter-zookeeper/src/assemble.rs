//! Everything the directories' services need from each other before they are served:
//!
//! * two Dubbo interfaces whose names map to one host (`com.foo.Api`, `com.foo.API`): the one
//!   whose znode ZooKeeper created first (`czxid`) keeps it, so a newcomer never renames a served
//!   service, and replicas and restarts agree whatever they served before (byte order only for
//!   interfaces with no known czxid); the others get their hashed name, and each renamed one is
//!   reported naming both;
//! * a Dubbo 3 provider registered at interface and application level (`--dubbo-discovery`):
//!   endpoints (address and port) served by the preferred level are left out of the other, and
//!   a service all of whose endpoints are served elsewhere is hidden (and stays hidden while it
//!   is empty, so that a provider shutting down does not make its other registration appear);
//! * one name produced by two directories (the same service under two roots): the first in
//!   path order wins, the other is reported.
//!
//! It runs on every change, over every directory, so it borrows: a service that none of these
//! touch is the directory's own (with the hash the directory computed once), and only the few
//! that are renamed or trimmed are copied and hashed again.

use std::borrow::Cow;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use mcp_core::{Host, Service, ServiceKey};

use crate::config::DubboDiscovery;
use crate::convert::{Converted, Kind, INTERFACE_ANNOTATION};
use crate::naming::dubbo_hashed_name;

/// What is served, and the problems found while assembling, per directory scope.
#[derive(Debug, Default)]
pub struct Assembled<'a> {
    /// The services to serve, by key (borrowed from the directories unless renamed).
    pub services: BTreeMap<Cow<'a, ServiceKey>, Built<'a>>,
    /// Problems per scope, in addition to the directories' own.
    pub problems: BTreeMap<String, Vec<String>>,
    /// Services hidden because another registration serves all their endpoints.
    pub hidden: BTreeSet<ServiceKey>,
}

/// One service to serve and its content hash ([`Service::content_hash`]).
#[derive(Debug)]
pub struct Built<'a> {
    /// The service.
    pub service: Cow<'a, Service>,
    /// Its content hash: what is compared with what was sent.
    pub hash: u64,
}

/// What was sent for one service: not the service (the directories hold the only copy), just
/// enough to tell whether it changed. (Which of two interfaces keeps a shared name is decided by
/// registry facts, never by what was sent: replicas with other histories must agree.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Content hash of the service as sent.
    pub hash: u64,
}

impl Sent {
    /// What to remember of a service sent with content hash `hash`.
    pub fn new(hash: u64) -> Self {
        Self { hash }
    }

    /// What to remember of `built` once it is sent.
    pub fn of(built: &Built<'_>) -> Self {
        Self::new(built.hash)
    }
}

/// One directory's contribution.
struct Candidate<'a> {
    scope: &'a str,
    kind: Kind,
    service: Cow<'a, Service>,
    /// The directory's hash of `service`, while it is not changed here.
    hash: Option<u64>,
}

impl Candidate<'_> {
    /// The service, to change (its directory's hash no longer applies).
    fn service_mut(&mut self) -> &mut Service {
        self.hash = None;
        self.service.to_mut()
    }
}

/// `(address, port)` pairs an endpoint is reached on.
fn endpoint_addrs(s: &Service) -> impl Iterator<Item = (usize, (&str, u32))> + '_ {
    s.endpoints.iter().enumerate().flat_map(move |(i, e)| {
        s.ports.iter().map(move |p| {
            let port = e.ports.get(&p.name).copied().unwrap_or(p.number);
            (i, (e.address.as_str(), port))
        })
    })
}

/// Assembles the directories (in path order) into what is served.
///
/// Each directory comes with its scope, what it converted to and the content hash of its
/// service if known; `hidden` is what was hidden before.
pub fn assemble<'a>(
    dirs: impl IntoIterator<Item = (&'a str, &'a Converted, Option<u64>)>,
    discovery: DubboDiscovery,
    hidden: &BTreeSet<ServiceKey>,
) -> Assembled<'a> {
    let mut out = Assembled::default();
    let mut cands: Vec<Candidate<'a>> = dirs
        .into_iter()
        .filter_map(|(scope, c, hash)| {
            c.service.as_ref().map(|s| Candidate {
                scope,
                kind: c.kind,
                service: Cow::Borrowed(s),
                hash,
            })
        })
        .collect();

    rename_colliding_interfaces(&mut cands, &mut out.problems);
    dedupe_dual_registration(&mut cands, discovery, hidden, &mut out.hidden);

    for c in cands {
        if out.hidden.contains(&c.service.key) {
            continue;
        }
        let key = match c.service {
            Cow::Borrowed(s) => Cow::Borrowed(&s.key),
            Cow::Owned(ref s) => Cow::Owned(s.key.clone()),
        };
        match out.services.entry(key) {
            Entry::Occupied(first) => {
                out.problems
                    .entry(c.scope.to_string())
                    .or_default()
                    .push(format!(
                        "{}: name {} is already used by {}; skipped",
                        c.service.origin,
                        c.service.key.name,
                        first.get().service.origin
                    ));
            }
            Entry::Vacant(slot) => {
                let hash = match c.hash {
                    Some(h) => h,
                    None => c.service.content_hash(),
                };
                slot.insert(Built {
                    service: c.service,
                    hash,
                });
            }
        }
    }
    out
}

/// Gives every Dubbo interface but one of those sharing a name its hashed name.
fn rename_colliding_interfaces(
    cands: &mut [Candidate<'_>],
    problems: &mut BTreeMap<String, Vec<String>>,
) {
    // (name, interface, candidate), borrowed: most registries have no collision, and this runs
    // on every change.
    let mut named: Vec<(&str, &str, usize)> = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| c.kind == Kind::DubboInterface)
        .filter_map(|(i, c)| {
            c.service
                .annotations
                .get(INTERFACE_ANNOTATION)
                .map(|iface| (c.service.key.name.as_str(), iface.as_str(), i))
        })
        .collect();
    named.sort_unstable();
    // One candidate per interface: the first directory's (a second directory of the same
    // interface is reported as a duplicate name below).
    named.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    let groups: Vec<(String, Vec<(String, usize)>)> = named
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|run| run.len() > 1)
        .map(|run| {
            let members = run.iter().map(|(_, f, i)| ((*f).to_string(), *i)).collect();
            (run[0].0.to_string(), members)
        })
        .collect();
    for (name, members) in groups {
        // Created first (the interface znode's czxid), then byte order: `min_by_key` keeps the
        // first of equals, and members are sorted. A fact of the registry, not of what this
        // process served before, so every replica and restart picks the same one.
        let keeper = members
            .iter()
            .enumerate()
            .min_by_key(|(_, (_, i))| {
                let created = cands[*i].service.creation_order;
                (created.is_none(), created)
            })
            .map_or(0, |(j, _)| j);
        let kept = members[keeper].0.clone();
        for (j, (iface, i)) in members.iter().enumerate() {
            if j == keeper {
                continue;
            }
            let hashed = dubbo_hashed_name(iface);
            let c = &mut cands[*i];
            problems.entry(c.scope.to_string()).or_default().push(format!(
                "{}: interfaces {kept} and {iface} both map to host {name}; {iface} is served as {hashed}",
                c.service.origin
            ));
            let s = c.service_mut();
            s.key = ServiceKey::new(hashed.clone());
            s.hosts = vec![Host::Relative(hashed)];
        }
    }
}

/// Leaves endpoints registered at both Dubbo levels out of the level not preferred.
fn dedupe_dual_registration(
    cands: &mut [Candidate<'_>],
    discovery: DubboDiscovery,
    was_hidden: &BTreeSet<ServiceKey>,
    hidden: &mut BTreeSet<ServiceKey>,
) {
    let (preferred, other) = match discovery {
        DubboDiscovery::Both => return,
        DubboDiscovery::Interface => (Kind::DubboInterface, Kind::Dubbo3Application),
        DubboDiscovery::Application => (Kind::Dubbo3Application, Kind::DubboInterface),
    };
    // Most registries hold one level only: nothing to compare, nothing to allocate.
    if !cands.iter().any(|c| c.kind == other) {
        return;
    }
    let served: BTreeSet<(String, u32)> = cands
        .iter()
        .filter(|c| c.kind == preferred)
        .flat_map(|c| endpoint_addrs(&c.service).map(|(_, (a, p))| (a.to_string(), p)))
        .collect();
    for c in cands.iter_mut().filter(|c| c.kind == other) {
        if c.service.endpoints.is_empty() {
            if was_hidden.contains(&c.service.key) {
                hidden.insert(c.service.key.clone());
            }
            continue;
        }
        let covered: BTreeSet<usize> = endpoint_addrs(&c.service)
            .filter(|(_, (a, p))| served.contains(&((*a).to_string(), *p)))
            .map(|(i, _)| i)
            .collect();
        if covered.is_empty() {
            continue;
        }
        if covered.len() == c.service.endpoints.len() {
            tracing::debug!(
                service = %c.service.key.name,
                "Every endpoint is served by the preferred Dubbo registration; not serving this one."
            );
            hidden.insert(c.service.key.clone());
            continue;
        }
        let s = c.service_mut();
        let mut i = 0;
        s.endpoints.retain(|_| {
            let keep = !covered.contains(&i);
            i += 1;
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_core::{CreationOrder, Endpoint, LabelSet, Port};

    fn svc(name: &str, kind: Kind, iface: &str, eps: &[(&str, u32)]) -> Converted {
        let mut s = Service::new(ServiceKey::new(name), format!("zookeeper /x/{iface}"));
        if kind == Kind::DubboInterface {
            s.annotations
                .insert(INTERFACE_ANNOTATION.into(), iface.to_string());
        }
        let mut ports: Vec<u32> = eps.iter().map(|e| e.1).collect();
        ports.sort();
        ports.dedup();
        s.ports = ports
            .iter()
            .map(|p| Port {
                number: *p,
                name: format!("tcp-{p}"),
                protocol: Some("TCP".into()),
                target_port: None,
            })
            .collect();
        s.endpoints = eps
            .iter()
            .map(|(a, _)| Endpoint {
                address: (*a).to_string(),
                ports: BTreeMap::new(),
                labels: LabelSet::new(),
                network: None,
                locality: None,
                weight: None,
                service_account: None,
            })
            .collect();
        Converted {
            service: Some(s),
            problems: vec![],
            kind,
        }
    }

    fn names(a: &Assembled<'_>) -> Vec<String> {
        a.services.keys().map(|k| k.name.clone()).collect()
    }

    fn created(mut c: Converted, czxid: u64) -> Converted {
        if let Some(s) = c.service.as_mut() {
            s.creation_order = Some(CreationOrder::new(czxid));
        }
        c
    }

    #[test]
    fn colliding_interfaces_get_hashes_and_a_problem_naming_both() {
        let a = created(
            svc("com.foo.api", Kind::DubboInterface, "com.foo.API", &[]),
            30,
        );
        let b = created(
            svc("com.foo.api", Kind::DubboInterface, "com.foo.Api", &[]),
            10,
        );
        let c = created(
            svc("com.foo.api", Kind::DubboInterface, "com.foo.api", &[]),
            20,
        );
        let none = BTreeSet::new();
        let out = assemble(
            [("s1", &a, None), ("s2", &b, None), ("s3", &c, None)],
            DubboDiscovery::Interface,
            &none,
        );
        let mut want = vec![
            "com.foo.api".to_string(),
            dubbo_hashed_name("com.foo.API"),
            dubbo_hashed_name("com.foo.api"),
        ];
        want.sort();
        assert_eq!(names(&out), want);
        let p = &out.problems["s1"][0];
        assert!(
            p.contains("interfaces com.foo.Api and com.foo.API both map to host com.foo.api"),
            "{p}"
        );
        assert!(
            !out.problems.contains_key("s2"),
            "the interface created first keeps the name, even against the exact spelling"
        );
        // Without creation facts the first in byte order keeps it.
        let (a, b) = (
            svc("com.foo.api", Kind::DubboInterface, "com.foo.API", &[]),
            svc("com.foo.api", Kind::DubboInterface, "com.foo.Api", &[]),
        );
        let out = assemble(
            [("s1", &a, None), ("s2", &b, None)],
            DubboDiscovery::Interface,
            &none,
        );
        assert!(out.services.contains_key(&ServiceKey::new("com.foo.api")));
        assert!(out.problems["s2"][0].contains("com.foo.API and com.foo.Api"));
        // A lone interface keeps the plain name.
        let out = assemble([("s2", &b, None)], DubboDiscovery::Interface, &none);
        assert_eq!(names(&out), ["com.foo.api"]);
        assert!(out.problems.is_empty());
    }

    #[test]
    fn dual_registration_is_served_once() {
        let iface = svc(
            "com.foo.api",
            Kind::DubboInterface,
            "com.foo.Api",
            &[("10.0.0.1", 20880), ("10.0.0.2", 20880)],
        );
        let both = svc(
            "app",
            Kind::Dubbo3Application,
            "",
            &[("10.0.0.1", 20880), ("10.0.0.2", 20880)],
        );
        let partly = svc(
            "app2",
            Kind::Dubbo3Application,
            "",
            &[("10.0.0.1", 20880), ("10.0.0.9", 20880)],
        );
        let dirs = [
            ("i", &iface, None),
            ("a", &both, None),
            ("b", &partly, None),
        ];
        let none = ((), BTreeSet::new());
        let out = assemble(dirs, DubboDiscovery::Interface, &none.1);
        assert_eq!(names(&out), ["app2", "com.foo.api"]);
        assert_eq!(out.hidden, [ServiceKey::new("app")].into());
        let app2 = &out.services[&ServiceKey::new("app2")];
        assert_eq!(app2.service.endpoints.len(), 1);
        assert_eq!(app2.service.endpoints[0].address, "10.0.0.9");

        let out = assemble(dirs, DubboDiscovery::Application, &none.1);
        assert_eq!(names(&out), ["app", "app2"]);
        assert_eq!(out.hidden, [ServiceKey::new("com.foo.api")].into());

        let out = assemble(dirs, DubboDiscovery::Both, &none.1);
        assert_eq!(names(&out).len(), 3);

        // The provider shuts down: its hidden registration stays hidden while empty.
        let empty = svc("app", Kind::Dubbo3Application, "", &[]);
        let iface_empty = svc("com.foo.api", Kind::DubboInterface, "com.foo.Api", &[]);
        let hidden: BTreeSet<ServiceKey> = [ServiceKey::new("app")].into();
        let out = assemble(
            [("i", &iface_empty, None), ("a", &empty, None)],
            DubboDiscovery::Interface,
            &hidden,
        );
        assert_eq!(names(&out), ["com.foo.api"]);
    }

    #[test]
    fn duplicates_are_reported_and_hashes_follow_changes() {
        let first = svc("web", Kind::Curator, "", &[("10.0.0.1", 8080)]);
        let other = svc("web", Kind::Curator, "", &[("10.0.0.2", 80)]);
        let none = ((), BTreeSet::new());
        let out = assemble(
            [("s1", &first, Some(7)), ("s2", &other, None)],
            DubboDiscovery::Interface,
            &none.1,
        );
        let web = &out.services[&ServiceKey::new("web")];
        assert_eq!(web.service.endpoints[0].address, "10.0.0.1");
        assert!(matches!(web.service, Cow::Borrowed(_)));
        assert_eq!(
            web.hash, 7,
            "an untouched service keeps its directory's hash"
        );
        assert!(out.problems["s2"][0].contains("already used"));

        // A service trimmed here is hashed again: its directory's hash is not what is served.
        let iface = svc(
            "com.foo.api",
            Kind::DubboInterface,
            "com.foo.Api",
            &[("10.0.0.1", 20880)],
        );
        let app = svc(
            "app",
            Kind::Dubbo3Application,
            "",
            &[("10.0.0.1", 20880), ("10.0.0.9", 20880)],
        );
        let out = assemble(
            [("i", &iface, Some(1)), ("a", &app, Some(2))],
            DubboDiscovery::Interface,
            &none.1,
        );
        let trimmed = &out.services[&ServiceKey::new("app")];
        assert_eq!(trimmed.service.endpoints.len(), 1);
        assert_eq!(trimmed.hash, trimmed.service.content_hash());
        assert_eq!(out.services[&ServiceKey::new("com.foo.api")].hash, 1);
        let sent = Sent::of(&out.services[&ServiceKey::new("com.foo.api")]);
        assert_eq!(sent.hash, 1);
    }
}

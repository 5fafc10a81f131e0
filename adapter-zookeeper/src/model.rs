//! The registry as the adapter knows it, per service directory, and what a change sends.
//!
//! The state is held once, per service directory ([`DirState`]): what its children were read
//! as ([`shape`] says what they make it) and the service they convert to. What reading one
//! directory found ([`Read`], after a fired watch or a re-list) replaces that directory's state
//! alone ([`Model::apply`]); [`Model::sync`] then sends only what changed, and assembles the
//! whole registry again only when the change can affect another service. What was sent is
//! remembered as content hashes ([`Sent`]), not as a second copy of the services.
//!
//! Nothing here talks to ZooKeeper (that is [`crate::reads`]), so all of it is tested without one.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use mcp_core::{CreationOrder, RegistryEvent, Service, ServiceKey};

use crate::assemble::{assemble, Assembled, Built, Sent};
use crate::config::{DubboDiscovery, Layout};
use crate::convert::{convert_curator, Converted, Kind};

/// Dubbo categories: a directory holding one of them is a Dubbo interface.
const DUBBO_CATEGORIES: [&str; 4] = ["providers", "consumers", "routers", "configurators"];
/// Dubbo 3 bookkeeping under the Dubbo root, never services.
const DUBBO_RESERVED: [&str; 3] = ["config", "mapping", "metadata"];

/// One service directory: `{root}/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Dir {
    pub(crate) root: String,
    pub(crate) name: String,
    pub(crate) layout: Layout,
}

impl Dir {
    pub(crate) fn path(&self) -> String {
        join(&self.root, &self.name)
    }

    /// Problems scope: a Dubbo interface's `providers` directory, else the directory.
    pub(crate) fn scope(&self, dubbo: bool) -> String {
        if dubbo {
            format!("zookeeper {}", join(&self.path(), "providers"))
        } else {
            format!("zookeeper {}", self.path())
        }
    }
}

pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// The registry as the adapter knows it: the one copy of its state.
#[derive(Debug, Default)]
pub(crate) struct Model {
    /// Service directories per root, as last listed.
    pub(crate) dirs: BTreeMap<String, BTreeSet<Dir>>,
    /// What each directory holds.
    pub(crate) states: BTreeMap<Dir, DirState>,
    /// What was sent, per service (hashes, not the services: see [`Sent`]).
    pub(crate) served: BTreeMap<ServiceKey, Sent>,
    /// Services hidden because the other Dubbo registration serves their endpoints.
    hidden: BTreeSet<ServiceKey>,
    /// How many directories produce each service key (before assembling). Services affect
    /// one another only through a shared name or Dubbo 3 dual registration, so a change whose
    /// keys no other directory produces is sent without assembling everything again.
    names: HashMap<ServiceKey, usize>,
    /// Directories holding a Dubbo 3 application (dual registration is compared only then).
    dubbo3: usize,
    /// Directories changed since the last [`Model::sync`], with the key their service had
    /// before the first of those changes.
    dirty: BTreeMap<Dir, Option<ServiceKey>>,
}

/// What one directory holds: what its children were read as and what they convert to.
#[derive(Debug, Default)]
pub(crate) struct DirState {
    /// Problems scope ([`Dir::scope`]).
    pub(crate) scope: String,
    /// What the next change to the directory is applied to.
    pub(crate) held: Held,
    pub(crate) converted: Converted,
    /// `content_hash` of the service, computed once per change of the directory, so comparing
    /// everything that is served with what was sent costs nothing for the others.
    hash: Option<u64>,
    /// The directory znode's `czxid`, once read: when ZooKeeper created it, as every replica
    /// sees it (who keeps a contested name or virtual IP). Kept while the directory lives.
    created: Option<CreationOrder>,
}

/// What a directory's children were read as.
#[derive(Debug, Default, PartialEq)]
pub(crate) enum Held {
    /// Nothing further to read: a Dubbo interface without `providers`, Dubbo 3 bookkeeping,
    /// or something that could not be read (a problem; read again when its directory changes
    /// and on every re-list).
    #[default]
    Nothing,
    /// A Dubbo interface's `providers` directory: the znode names are the providers, so
    /// nothing is kept but the service they convert to.
    Providers,
    /// Curator / Dubbo 3 instances by id: the data as read, or why it could not be read. Kept
    /// so that a change reads the data of new or changed instances only.
    Instances(BTreeMap<String, Result<Vec<u8>, String>>),
}

impl DirState {
    pub(crate) fn new(scope: String, held: Held, converted: Converted) -> Self {
        Self {
            scope,
            held,
            converted,
            hash: None,
            created: None,
        }
    }

    /// Whether the directory's `czxid` is known.
    pub(crate) fn dated(&self) -> bool {
        self.created.is_some()
    }

    /// Nothing to serve and nothing wrong.
    pub(crate) fn nothing(scope: String) -> Self {
        Self::new(scope, Held::Nothing, Converted::default())
    }

    /// Nothing to serve: `problem` says why.
    pub(crate) fn unreadable(scope: String, problem: String) -> Self {
        let converted = Converted {
            problems: vec![problem],
            ..Converted::default()
        };
        Self::new(scope, Held::Nothing, converted)
    }
}

/// What reading one directory found.
#[derive(Debug)]
pub(crate) enum Read {
    /// Nothing changed: every watch on it is still armed.
    Unchanged,
    /// The directory is gone.
    Gone,
    /// Its new state.
    State(Box<DirState>),
    /// Curator / Dubbo 3 instances: the ids it holds now and the data read again (new or
    /// changed instances); the rest keeps what it held ([`merge_instances`]).
    Instances {
        ids: Vec<String>,
        read: Vec<(String, Fetched)>,
    },
}

impl From<DirState> for Read {
    fn from(st: DirState) -> Self {
        Self::State(Box::new(st))
    }
}

/// One instance's data, as read.
#[derive(Debug)]
pub(crate) enum Fetched {
    Data(Vec<u8>),
    /// Unreadable (reported as a problem).
    Problem(String),
    /// Deleted since its directory was listed.
    Missing,
}

/// What a directory's children make it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Dubbo 3 bookkeeping under a Dubbo root: never a service.
    Reserved,
    /// A Dubbo interface, with or without a `providers` directory.
    Dubbo { providers: bool },
    /// Curator / Dubbo 3 instances, by id.
    Curator(Vec<String>),
}

/// Classifies a directory by its children.
pub(crate) fn shape(dir: &Dir, children: Vec<String>) -> Shape {
    let dubbo = match dir.layout {
        Layout::Dubbo => true,
        Layout::Curator | Layout::Dubbo3 => false,
        Layout::Auto => children
            .iter()
            .any(|c| DUBBO_CATEGORIES.contains(&c.as_str())),
    };
    if dubbo {
        return Shape::Dubbo {
            providers: children.iter().any(|c| c == "providers"),
        };
    }
    // Dubbo 3 bookkeeping under a Dubbo root (a Spring service may well be called `config`
    // under the Curator default root).
    if dir.layout == Layout::Auto
        && dir.root != "/services"
        && DUBBO_RESERVED.contains(&dir.name.as_str())
    {
        return Shape::Reserved;
    }
    Shape::Curator(children)
}

/// The instances a directory holds after a read: `ids` are its children now, `read` what was
/// read again; every other instance keeps the data it had.
fn merge_instances(
    mut held: BTreeMap<String, Result<Vec<u8>, String>>,
    ids: Vec<String>,
    read: Vec<(String, Fetched)>,
) -> BTreeMap<String, Result<Vec<u8>, String>> {
    let now: BTreeSet<String> = ids.into_iter().collect();
    held.retain(|id, _| now.contains(id));
    for (id, fetched) in read {
        match fetched {
            Fetched::Data(d) => {
                held.insert(id, Ok(d));
            }
            Fetched::Problem(p) => {
                held.insert(id, Err(p));
            }
            Fetched::Missing => {
                held.remove(&id);
            }
        }
    }
    held
}

/// Converts a Curator directory's instances (the unreadable ones as problems).
fn convert_instances(dir: &Dir, held: &BTreeMap<String, Result<Vec<u8>, String>>) -> Converted {
    let readable = held
        .iter()
        .filter_map(|(id, d)| d.as_ref().ok().map(|d| (id.as_str(), d.as_slice())));
    let mut c = convert_curator(&dir.root, &dir.name, readable);
    c.problems
        .extend(held.values().filter_map(|d| d.as_ref().err().cloned()));
    c
}

/// What a directory's new state keeps from its old one, then its hash.
///
/// A Dubbo 3 application with no instance left looks like an empty Curator service; it is
/// still the same application (for `--dubbo-discovery`). A service whose last endpoint went
/// keeps the ports it had, so that its host does not change shape while it is empty (the core
/// decides whether an empty service stays).
fn settle(new: &mut DirState, old: Option<&DirState>) {
    let before = old.and_then(|o| o.converted.service.as_ref().map(|s| (o.converted.kind, s)));
    if let (Some(service), Some((kind, before))) = (new.converted.service.as_mut(), before) {
        if service.endpoints.is_empty() {
            if new.converted.kind == Kind::Curator && kind == Kind::Dubbo3Application {
                new.converted.kind = Kind::Dubbo3Application;
            }
            if service.ports.is_empty() && service.key == before.key {
                service.ports.clone_from(&before.ports);
            }
        }
    }
    new.hash = new.converted.service.as_ref().map(Service::content_hash);
}

impl Model {
    /// Applies what reading `dir` found; pushes the problem scopes that may have changed
    /// (the new one and, if it moved or went, the old one) to `touched`.
    pub(crate) fn apply(&mut self, dir: Dir, read: Read, touched: &mut Vec<String>) {
        self.apply_dated(dir, read, None, touched);
    }

    /// [`Model::apply`], with the directory's `czxid` if it was read this time (else the one
    /// read before is kept).
    pub(crate) fn apply_dated(
        &mut self,
        dir: Dir,
        read: Read,
        czxid: Option<i64>,
        touched: &mut Vec<String>,
    ) {
        if matches!(read, Read::Unchanged) {
            self.redate(&dir, czxid);
            return;
        }
        let mut old = self.states.remove(&dir);
        if let Some(o) = &old {
            self.count(o, false);
        }
        let before = old
            .as_ref()
            .and_then(|o| o.converted.service.as_ref())
            .map(|s| s.key.clone());
        self.dirty.entry(dir.clone()).or_insert(before);
        let mut new = match read {
            // Returned above, before anything was taken out.
            Read::Unchanged => return,
            Read::Gone => {
                touched.extend(old.map(|o| o.scope));
                return;
            }
            Read::State(st) => *st,
            Read::Instances { ids, read } => {
                let held = match old.as_mut().map(|o| std::mem::take(&mut o.held)) {
                    Some(Held::Instances(m)) => m,
                    _ => BTreeMap::new(),
                };
                let held = merge_instances(held, ids, read);
                let converted = convert_instances(&dir, &held);
                DirState::new(dir.scope(false), Held::Instances(held), converted)
            }
        };
        new.created = czxid
            .and_then(|z| u64::try_from(z).ok())
            .map(CreationOrder::new)
            .or(old.as_ref().and_then(|o| o.created));
        if let Some(s) = new.converted.service.as_mut() {
            s.creation_order = new.created;
        }
        settle(&mut new, old.as_ref());
        if let Some(o) = old.filter(|o| o.scope != new.scope) {
            touched.push(o.scope);
        }
        touched.push(new.scope.clone());
        self.count(&new, true);
        self.states.insert(dir, new);
    }

    /// Dates a directory whose content did not change with the `czxid` just read, if it
    /// differs from the one held: it was deleted and created again between two reads (while
    /// disconnected, or between a watch firing and the read), or was never dated. A replica
    /// started now reads the new one, and who keeps a contested name or VIP must agree.
    fn redate(&mut self, dir: &Dir, czxid: Option<i64>) {
        let Some(created) = czxid
            .and_then(|z| u64::try_from(z).ok())
            .map(CreationOrder::new)
        else {
            return;
        };
        let Some(st) = self.states.get_mut(dir) else {
            return;
        };
        if st.created == Some(created) {
            return;
        }
        st.created = Some(created);
        let key = st.converted.service.as_mut().map(|s| {
            s.creation_order = Some(created);
            s.key.clone()
        });
        st.hash = st.converted.service.as_ref().map(Service::content_hash);
        self.dirty.entry(dir.clone()).or_insert(key);
    }

    /// Counts a directory's state in (`add`) or out of [`Model::names`] and [`Model::dubbo3`].
    fn count(&mut self, st: &DirState, add: bool) {
        let Some(service) = &st.converted.service else {
            return;
        };
        let dubbo3 = usize::from(st.converted.kind == Kind::Dubbo3Application);
        if add {
            *self.names.entry(service.key.clone()).or_default() += 1;
            self.dubbo3 += dubbo3;
            return;
        }
        if let Some(n) = self.names.get_mut(&service.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.names.remove(&service.key);
            }
        }
        self.dubbo3 = self.dubbo3.saturating_sub(dubbo3);
    }

    /// Brings `served` and `hidden` up to what is served now: the events that tell the core
    /// (one `Reset` of everything when `reset`, else the removals and the upserts of what
    /// changed, nothing else), and the problems found while assembling (`None`: as before).
    ///
    /// A change that cannot affect another service (see [`Model::isolated`]) is sent as the
    /// changed directories hold it, in time proportional to the change; anything else
    /// assembles every directory again.
    pub(crate) fn sync(
        &mut self,
        discovery: DubboDiscovery,
        reset: bool,
    ) -> (Vec<RegistryEvent>, Option<BTreeMap<String, Vec<String>>>) {
        let dirty = std::mem::take(&mut self.dirty);
        if !reset && self.isolated(&dirty, discovery) {
            return (self.send_dirty(&dirty), None);
        }
        let Model {
            states,
            served,
            hidden,
            ..
        } = self;
        let Assembled {
            services,
            problems,
            hidden: now_hidden,
        } = assemble(
            states
                .values()
                .map(|st| (st.scope.as_str(), &st.converted, st.hash)),
            discovery,
            hidden,
        );
        let events = if reset {
            served.clear();
            let mut all = Vec::with_capacity(services.len());
            for (key, built) in services {
                served.insert(key.into_owned(), Sent::of(&built));
                all.push(built.service.into_owned());
            }
            vec![RegistryEvent::Reset(all)]
        } else {
            changes(served, services)
        };
        *hidden = now_hidden;
        (events, Some(problems))
    }

    /// Whether the changed directories' services can be sent as they are: no Dubbo 3 dual
    /// registration to compare (nor anything hidden by it), and no key they had or have is
    /// produced by another directory or still served for one (no rename, no duplicate).
    fn isolated(
        &self,
        dirty: &BTreeMap<Dir, Option<ServiceKey>>,
        discovery: DubboDiscovery,
    ) -> bool {
        if (discovery != DubboDiscovery::Both && self.dubbo3 > 0) || !self.hidden.is_empty() {
            return false;
        }
        dirty.iter().all(|(dir, before)| {
            let now = self
                .states
                .get(dir)
                .and_then(|st| st.converted.service.as_ref())
                .map(|s| &s.key);
            let now_alone = now.is_none_or(|k| {
                self.names.get(k) == Some(&1)
                    && (before.as_ref() == Some(k) || !self.served.contains_key(k))
            });
            let before_gone = before
                .as_ref()
                .is_none_or(|k| now == Some(k) || !self.names.contains_key(k));
            now_alone && before_gone
        })
    }

    /// The events for an isolated change ([`Model::isolated`]): removals of the keys the
    /// changed directories no longer produce, upserts of their services that differ from what
    /// was sent.
    fn send_dirty(&mut self, dirty: &BTreeMap<Dir, Option<ServiceKey>>) -> Vec<RegistryEvent> {
        let mut removals = Vec::new();
        let mut upserts = Vec::new();
        for (dir, before) in dirty {
            let now = self
                .states
                .get(dir)
                .and_then(|st| st.converted.service.as_ref().map(|s| (s, st.hash)));
            if let Some(k) = before {
                if now.is_none_or(|(s, _)| s.key != *k) && self.served.remove(k).is_some() {
                    removals.push(RegistryEvent::Remove(k.clone()));
                }
            }
            let Some((service, hash)) = now else {
                continue;
            };
            let hash = hash.unwrap_or_else(|| service.content_hash());
            if self
                .served
                .get(&service.key)
                .is_some_and(|s| s.hash == hash)
            {
                continue;
            }
            self.served.insert(service.key.clone(), Sent::new(hash));
            upserts.push(RegistryEvent::Upsert(service.clone()));
        }
        removals.extend(upserts);
        removals
    }
}

/// Brings `served` up to `next`: removals of what went, upserts of what is new or changed.
fn changes(
    served: &mut BTreeMap<ServiceKey, Sent>,
    next: BTreeMap<Cow<'_, ServiceKey>, Built<'_>>,
) -> Vec<RegistryEvent> {
    // Both are sorted by key: one pass over the two, no lookup per service.
    let mut gone = Vec::new();
    let mut changed = Vec::new();
    let mut sent = served.iter().peekable();
    for (key, built) in next {
        while let Some((k, _)) = sent.next_if(|(k, _)| *k < key.as_ref()) {
            gone.push(k.clone());
        }
        let same = sent
            .next_if(|(k, _)| *k == key.as_ref())
            .is_some_and(|(_, s)| s.hash == built.hash);
        if !same {
            changed.push((key, built));
        }
    }
    gone.extend(sent.map(|(k, _)| k.clone()));
    let mut events = Vec::with_capacity(gone.len() + changed.len());
    for key in gone {
        served.remove(&key);
        events.push(RegistryEvent::Remove(key));
    }
    for (key, built) in changed {
        served.insert(key.into_owned(), Sent::of(&built));
        events.push(RegistryEvent::Upsert(built.service.into_owned()));
    }
    events
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::convert::convert_dubbo;
    use crate::filter::Filters;
    use crate::reads::instances_to_read;
    use crate::watches::data_key;

    fn dir(root: &str, name: &str) -> Dir {
        Dir {
            root: root.into(),
            name: name.into(),
            layout: Layout::Auto,
        }
    }

    /// What reading a Dubbo interface's `providers` finds, one provider per address.
    fn providers(d: &Dir, ips: &[&str]) -> Read {
        let names: Vec<String> = ips
            .iter()
            .map(|ip| {
                format!(
                    "dubbo://{ip}:20880/{0}?interface={0}&side=provider&application=demo",
                    d.name
                )
            })
            .collect();
        let converted = convert_dubbo(&d.root, &d.name, &names, &Filters::default());
        Read::from(DirState::new(d.scope(true), Held::Providers, converted))
    }

    fn instance(ip: &str) -> Fetched {
        Fetched::Data(format!(r#"{{"name":"web","address":"{ip}","port":80}}"#).into_bytes())
    }

    fn dubbo3_instance(ip: &str) -> Fetched {
        Fetched::Data(
            format!(
                r#"{{"name":"app","address":"{ip}","port":20880,"payload":{{"metadata":{{"dubbo.endpoints":"[{{\"port\":20880,\"protocol\":\"dubbo\"}}]"}}}}}}"#
            )
            .into_bytes(),
        )
    }

    fn ids(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_string()).collect()
    }

    fn upserted(events: &[RegistryEvent]) -> Vec<(String, Vec<String>)> {
        events
            .iter()
            .filter_map(|e| match e {
                RegistryEvent::Upsert(s) => Some((
                    s.key.name.clone(),
                    s.endpoints.iter().map(|e| e.address.clone()).collect(),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_providers_change_sends_only_its_interface() {
        let (a, b) = (dir("/dubbo", "com.foo.A"), dir("/dubbo", "com.foo.B"));
        let mut m = Model::default();
        let mut touched = Vec::new();
        m.apply(a.clone(), providers(&a, &["10.0.0.1"]), &mut touched);
        m.apply(b.clone(), providers(&b, &["10.0.1.1"]), &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, true);
        assert!(
            matches!(&events[..], [RegistryEvent::Reset(all)] if all.len() == 2),
            "{events:?}"
        );

        // A provider joins A: A alone is sent, with both.
        touched.clear();
        m.apply(
            a.clone(),
            providers(&a, &["10.0.0.2", "10.0.0.1"]),
            &mut touched,
        );
        assert_eq!(touched, [a.scope(true)]);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert_eq!(
            upserted(&events),
            [("com.foo.a".to_string(), ids(&["10.0.0.1", "10.0.0.2"]))]
        );
        assert_eq!(events.len(), 1, "{events:?}");

        // The same providers again (a watch that fired for nothing): nothing is sent.
        m.apply(
            a.clone(),
            providers(&a, &["10.0.0.1", "10.0.0.2"]),
            &mut touched,
        );
        m.apply(a.clone(), Read::Unchanged, &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert!(events.is_empty(), "{events:?}");

        // B's last provider leaves: B stays, with no endpoints and the port it had.
        m.apply(b.clone(), providers(&b, &[]), &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        let [RegistryEvent::Upsert(empty)] = &events[..] else {
            panic!("{events:?}");
        };
        assert_eq!(empty.key.name, "com.foo.b");
        assert!(empty.endpoints.is_empty());
        assert_eq!(empty.ports[0].number, 20880);

        // B's `providers` directory goes, then B itself: removed once.
        touched.clear();
        m.apply(
            b.clone(),
            Read::from(DirState::nothing(b.scope(true))),
            &mut touched,
        );
        m.apply(b.clone(), Read::Gone, &mut touched);
        assert_eq!(touched, [b.scope(true), b.scope(true)]);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert!(
            matches!(&events[..], [RegistryEvent::Remove(k)] if k.name == "com.foo.b"),
            "{events:?}"
        );
        assert_eq!(m.served.len(), 1);
        assert_eq!(m.states.len(), 1);
    }

    #[test]
    fn a_change_to_a_shared_name_is_assembled_with_the_others() {
        // Both map to `com.foo.api`; `com.foo.API` keeps it (byte order), `com.foo.Api` is
        // renamed. `other` has a name of its own.
        let (upper, lower) = (dir("/dubbo", "com.foo.API"), dir("/dubbo", "com.foo.Api"));
        let other = dir("/dubbo", "com.foo.Other");
        let hashed = crate::naming::dubbo_hashed_name("com.foo.Api");
        let mut m = Model::default();
        let mut touched = Vec::new();
        m.apply(
            upper.clone(),
            providers(&upper, &["10.0.0.1"]),
            &mut touched,
        );
        m.apply(
            lower.clone(),
            providers(&lower, &["10.0.0.2"]),
            &mut touched,
        );
        m.apply(
            other.clone(),
            providers(&other, &["10.0.0.3"]),
            &mut touched,
        );
        let (_, problems) = m.sync(DubboDiscovery::Interface, true);
        assert!(problems.is_some_and(|p| p.contains_key(&lower.scope(true))));
        assert!(m.served.contains_key(&ServiceKey::new(hashed.clone())));

        // A change elsewhere is sent alone, without assembling (the rename stays as it was).
        m.apply(
            other.clone(),
            providers(&other, &["10.0.0.4"]),
            &mut touched,
        );
        assert!(m.isolated(&m.dirty, DubboDiscovery::Interface));
        let (events, problems) = m.sync(DubboDiscovery::Interface, false);
        assert!(problems.is_none(), "assembly problems kept as they were");
        assert_eq!(
            upserted(&events),
            [("com.foo.other".to_string(), ids(&["10.0.0.4"]))]
        );

        // The interface holding the name goes: the other one takes the plain name.
        m.apply(upper.clone(), Read::Gone, &mut touched);
        assert!(!m.isolated(&m.dirty, DubboDiscovery::Interface));
        let (events, problems) = m.sync(DubboDiscovery::Interface, false);
        assert!(problems.is_some_and(|p| p.is_empty()), "the rename is over");
        let removed: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                RegistryEvent::Remove(k) => Some(k.name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(removed, [hashed.as_str()]);
        assert_eq!(
            upserted(&events),
            [("com.foo.api".to_string(), ids(&["10.0.0.2"]))]
        );
        assert_eq!(m.names.get(&ServiceKey::new("com.foo.api")), Some(&1));

        // A Dubbo 3 application anywhere: dual registration is compared on every change.
        let app = dir("/services", "app");
        let registered = Read::Instances {
            ids: ids(&["10.0.9.1:20880"]),
            read: vec![("10.0.9.1:20880".to_string(), dubbo3_instance("10.0.9.1"))],
        };
        m.apply(app, registered, &mut touched);
        m.sync(DubboDiscovery::Interface, false);
        m.apply(
            other.clone(),
            providers(&other, &["10.0.0.5"]),
            &mut touched,
        );
        assert!(!m.isolated(&m.dirty, DubboDiscovery::Interface));
        assert!(m.isolated(&m.dirty, DubboDiscovery::Both));
    }

    /// A directory deleted and created again between two reads (while disconnected) has a new
    /// `czxid`: read again with nothing else changed, it is re-dated, and the contested name
    /// goes to the interface that is now the older one, as on a replica started afresh.
    #[test]
    fn a_re_created_directory_is_re_dated_even_when_its_content_is_unchanged() {
        let (upper, lower) = (dir("/dubbo", "com.foo.API"), dir("/dubbo", "com.foo.Api"));
        // What a model that read `lower` created at `lower_czxid` (and `upper` at 20) serves:
        // name -> endpoint addresses.
        let fresh = |lower_czxid: i64| {
            let mut m = Model::default();
            let mut touched = Vec::new();
            m.apply_dated(
                lower.clone(),
                providers(&lower, &["10.0.0.2"]),
                Some(lower_czxid),
                &mut touched,
            );
            m.apply_dated(
                upper.clone(),
                providers(&upper, &["10.0.0.1"]),
                Some(20),
                &mut touched,
            );
            let (events, _) = m.sync(DubboDiscovery::Interface, true);
            let [RegistryEvent::Reset(all)] = &events[..] else {
                panic!("{events:?}");
            };
            let served: BTreeMap<String, Vec<String>> = all
                .iter()
                .map(|s| {
                    let ips = s.endpoints.iter().map(|e| e.address.clone()).collect();
                    (s.key.name.clone(), ips)
                })
                .collect();
            (m, served)
        };
        let (mut m, before) = fresh(10);
        assert_eq!(before["com.foo.api"], ids(&["10.0.0.2"]), "created first");

        // Re-created unseen: the providers are the same, the czxid is newer than API's.
        let mut touched = Vec::new();
        m.apply_dated(lower.clone(), Read::Unchanged, Some(30), &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        let mut now = before.clone();
        for (name, ips) in upserted(&events) {
            now.insert(name, ips);
        }
        for e in &events {
            if let RegistryEvent::Remove(k) = e {
                now.remove(&k.name);
            }
        }
        let (replica, theirs) = fresh(30);
        assert_eq!(now, theirs, "{events:?}");
        assert_eq!(now["com.foo.api"], ids(&["10.0.0.1"]));
        assert_eq!(
            m.states.get(&lower).and_then(|s| s.created),
            replica.states.get(&lower).and_then(|s| s.created)
        );

        // The same czxid again: nothing to send.
        m.apply_dated(lower.clone(), Read::Unchanged, Some(30), &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert!(events.is_empty(), "{events:?}");
    }

    #[test]
    fn curator_changes_read_only_new_and_fired_instances() {
        let d = dir("/services", "web");
        let path = d.path();
        let mut m = Model::default();
        let mut touched = Vec::new();
        let read = vec![
            ("1".to_string(), instance("10.0.0.1")),
            ("2".to_string(), instance("10.0.0.2")),
        ];
        let first = Read::Instances {
            ids: ids(&["1", "2"]),
            read,
        };
        m.apply(d.clone(), first, &mut touched);
        m.sync(DubboDiscovery::Interface, true);

        // Which instances a change reads: new ones and those whose data watch fired.
        let Some(DirState {
            held: Held::Instances(held),
            ..
        }) = m.states.get(&d)
        else {
            panic!("instances held");
        };
        let armed: HashSet<String> = [data_key(&join(&path, "1"))].into();
        assert_eq!(
            instances_to_read(&path, &ids(&["1", "2", "3"]), Some(held), false, &armed),
            ids(&["2", "3"])
        );
        assert_eq!(
            instances_to_read(&path, &ids(&["1"]), Some(held), true, &armed),
            ids(&["1"]),
            "a full list reads everything"
        );

        // One joins: its data is all that is read; the others keep theirs.
        let joined = Read::Instances {
            ids: ids(&["1", "2", "3"]),
            read: vec![("3".to_string(), instance("10.0.0.3"))],
        };
        m.apply(d.clone(), joined, &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert_eq!(
            upserted(&events),
            [(
                "web".to_string(),
                ids(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])
            )]
        );

        // One's data changed, one left, one became unreadable.
        let changed = Read::Instances {
            ids: ids(&["1", "3"]),
            read: vec![
                ("1".to_string(), instance("10.0.0.9")),
                (
                    "3".to_string(),
                    Fetched::Problem("zookeeper /services/web/3: NoAuth".into()),
                ),
            ],
        };
        m.apply(d.clone(), changed, &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert_eq!(upserted(&events), [("web".to_string(), ids(&["10.0.0.9"]))]);
        assert_eq!(
            m.states[&d].converted.problems,
            ["zookeeper /services/web/3: NoAuth"]
        );

        // Deleted between listing and reading: gone; the service keeps its port while empty.
        let vanished = Read::Instances {
            ids: ids(&["1", "3"]),
            read: vec![("1".to_string(), Fetched::Missing)],
        };
        m.apply(d.clone(), vanished, &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        let [RegistryEvent::Upsert(web)] = &events[..] else {
            panic!("{events:?}");
        };
        assert!(web.endpoints.is_empty());
        assert_eq!(web.ports[0].number, 80);
        let Held::Instances(held) = &m.states[&d].held else {
            panic!("instances held");
        };
        assert_eq!(held.keys().collect::<Vec<_>>(), ["3"]);
    }

    #[test]
    fn an_emptied_dubbo3_application_stays_hidden() {
        let iface = dir("/dubbo", "com.foo.A");
        let app = dir("/services", "app");
        let mut m = Model::default();
        let mut touched = Vec::new();
        m.apply(
            iface.clone(),
            providers(&iface, &["10.0.0.1"]),
            &mut touched,
        );
        let registered = Read::Instances {
            ids: ids(&["10.0.0.1:20880"]),
            read: vec![("10.0.0.1:20880".to_string(), dubbo3_instance("10.0.0.1"))],
        };
        m.apply(app.clone(), registered, &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, true);
        let RegistryEvent::Reset(all) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(all.len(), 1, "served at interface level only: {all:?}");

        // The provider shuts down at both levels: the application is still one (not a plain
        // Curator service) and stays hidden; the interface is sent, empty.
        m.apply(
            app.clone(),
            Read::Instances {
                ids: Vec::new(),
                read: Vec::new(),
            },
            &mut touched,
        );
        assert_eq!(m.states[&app].converted.kind, Kind::Dubbo3Application);
        m.apply(iface.clone(), providers(&iface, &[]), &mut touched);
        let (events, _) = m.sync(DubboDiscovery::Interface, false);
        assert_eq!(upserted(&events), [("com.foo.a".to_string(), Vec::new())]);
    }

    #[test]
    fn directories_are_classified_by_their_children() {
        let kids = |c: &[&str]| ids(c);
        assert_eq!(
            shape(&dir("/dubbo", "com.foo.A"), kids(&["consumers"])),
            Shape::Dubbo { providers: false }
        );
        assert_eq!(
            shape(&dir("/dubbo", "com.foo.A"), kids(&["providers", "routers"])),
            Shape::Dubbo { providers: true }
        );
        assert_eq!(
            shape(&dir("/dubbo", "mapping"), kids(&["com.foo.A"])),
            Shape::Reserved
        );
        assert_eq!(
            shape(&dir("/services", "config"), kids(&["1"])),
            Shape::Curator(kids(&["1"]))
        );
        let dubbo = Dir {
            layout: Layout::Dubbo,
            ..dir("/dubbo", "x")
        };
        assert_eq!(shape(&dubbo, Vec::new()), Shape::Dubbo { providers: false });
        let curator = Dir {
            layout: Layout::Curator,
            ..dir("/services", "x")
        };
        assert_eq!(
            shape(&curator, kids(&["providers"])),
            Shape::Curator(kids(&["providers"]))
        );
    }
}

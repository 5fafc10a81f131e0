//! Watches ZooKeeper.
//!
//! ZooKeeper watches are one-shot hints, and `zookeeper-async` loses them silently on every
//! reconnect (it never re-sends them) and opens a new session silently after expiry. So the
//! watcher applies each fired watch at once, and relies on re-listing to be correct:
//!
//! * one client is shared by every `watch()` call; a state listener records each transition;
//!   it is rebuilt (resolving the ensemble again) after a terminal state or when the ensemble
//!   resolves to other addresses (see [`crate::client`]);
//! * a watch starts by waiting for a connected session, adding digest auth, listing every root
//!   and service directory (arming child and data watches) and sending one `Reset`;
//! * a fired watch is applied at once with what re-arming it returns: the children of a Dubbo
//!   `providers` directory are its providers (one request, nothing else read), the children of
//!   a Curator directory its instances (data read for new ones only), an instance's data that
//!   instance; a root's children its service directories (new ones read whole). Only the
//!   services that changed are sent (`Upsert`/`Remove`). Watches that fired meanwhile are
//!   applied in the same pass; nothing waits for more (the core coalesces bursts,
//!   `--coalesce`);
//! * every transition back to `Connected` (a reconnect on the same session, or a new session
//!   after expiry) forgets all armed watches and re-lists everything, re-adding auth first (the
//!   client does not re-send auth either);
//! * a safety re-list runs every `--resync-interval`;
//! * a connection that stays down longer than [`DISCONNECT_GRACE`], or any request that fails
//!   with a connection error or times out, ends the watch with `Unavailable`: the core keeps
//!   serving the last good state (and stays ready: it has a state worth serving), reports the
//!   registry unhealthy, and calls `watch()` again, which waits for the session and starts over
//!   with a new `Reset`.
//!
//! The registry's state is held once, per service directory ([`DirState`]); what was sent is
//! remembered as content hashes ([`Sent`]), not as a second copy of the services.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use mcp_core::problems::ProblemLedger;
use mcp_core::{
    channel_stream, EventSender, Registry, RegistryError, RegistryEvent, Service, ServiceKey,
};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use zookeeper_async::{WatchedEvent, ZkError, ZkState, ZooKeeper};

use crate::assemble::{assemble, Assembled, Built, Sent};
use crate::client::{is_terminal, Client, Clients};
use crate::config::{DubboDiscovery, Layout, ZookeeperConfig};
use crate::convert::{convert_curator, convert_dubbo, Converted, Kind};
use crate::filter::Filters;

/// How long the connection may be down before the watch fails (the core then reports the
/// registry unhealthy on `/registryz`; it keeps serving and stays ready).
pub const DISCONNECT_GRACE: Duration = Duration::from_secs(1);
/// Longest a new watch waits for a connected session before failing.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Dubbo categories: a directory holding one of them is a Dubbo interface.
const DUBBO_CATEGORIES: [&str; 4] = ["providers", "consumers", "routers", "configurators"];
/// Dubbo 3 bookkeeping under the Dubbo root, never services.
const DUBBO_RESERVED: [&str; 3] = ["config", "mapping", "metadata"];

/// Why the adapter cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The digest credentials could not be read.
    #[error("cannot read --zk-digest-file {path}: {error}")]
    DigestFile {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The digest credentials are not `user:password`.
    #[error("digest credentials must be user:password")]
    Digest,
    /// No root to read.
    #[error("no root path to read")]
    NoRoot,
}

/// ZooKeeper as a watched registry.
#[derive(Clone)]
pub struct ZookeeperRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZookeeperRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperRegistry")
            .field("servers", &self.inner.servers)
            .field("roots", &self.inner.roots)
            .finish_non_exhaustive()
    }
}

struct Inner {
    servers: String,
    request_timeout: Duration,
    resync: Duration,
    concurrency: usize,
    digest: Option<String>,
    roots: Vec<(String, Layout)>,
    filters: Filters,
    discovery: DubboDiscovery,
    clients: Clients,
    /// The registry as the last watch knew it, handed to the next one: which of two colliding
    /// interfaces keeps the plain name, the ports of empty services and hidden Dubbo 3
    /// registrations must survive a reconnect, not only changes within one watch.
    model: std::sync::Mutex<Model>,
}

impl ZookeeperRegistry {
    /// Builds the registry; digest credentials come from `ZK_DIGEST` or `--zk-digest-file`.
    pub fn new(cfg: &ZookeeperConfig) -> Result<Self, ConfigError> {
        let digest = match &cfg.zk_digest_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|error| ConfigError::DigestFile {
                        path: path.display().to_string(),
                        error,
                    })?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("ZK_DIGEST").ok().filter(|d| !d.is_empty()),
        };
        Self::with_digest(cfg, digest)
    }

    /// Builds the registry with explicit digest credentials (tests).
    pub fn with_digest(cfg: &ZookeeperConfig, digest: Option<String>) -> Result<Self, ConfigError> {
        if digest
            .as_deref()
            .is_some_and(|d| d.split_once(':').is_none_or(|(u, _)| u.is_empty()))
        {
            return Err(ConfigError::Digest);
        }
        let roots = cfg.roots();
        if roots.is_empty() {
            return Err(ConfigError::NoRoot);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                servers: cfg.zk_servers.clone(),
                request_timeout: cfg.zk_request_timeout.max(Duration::from_millis(100)),
                resync: cfg.resync_interval.max(Duration::from_secs(1)),
                concurrency: cfg.zk_concurrency.max(1),
                digest,
                roots,
                filters: Filters::new(cfg),
                discovery: cfg.dubbo_discovery,
                clients: Clients::new(cfg.zk_servers.clone(), cfg.zk_session_timeout),
                model: std::sync::Mutex::new(Model::default()),
            }),
        })
    }
}

impl Registry for ZookeeperRegistry {
    const NAME: &'static str = "zookeeper";
    const DEFAULT_HOST_SUFFIX: &'static str = "zookeeper";
    const DEFAULT_NAMESPACE: &'static str = "zookeeper";
    const DEFAULT_VIP_CIDR: mcp_core::vip::VipCidr =
        mcp_core::vip::VipCidr::range(242, 3, 0, 0, 16);

    fn watch(&self) -> BoxStream<'static, Result<RegistryEvent, RegistryError>> {
        let inner = Arc::clone(&self.inner);
        channel_stream(move |tx| async move { inner.watch(tx).await })
    }
}

/// A fired watch: which armed watch (`c:`/`d:`/`e:` + path) it was.
struct Hint(String);

/// Why a read failed.
enum OpError {
    /// The connection or session is gone: end the watch.
    Fatal(RegistryError),
    /// This znode cannot be read (reported as a problem).
    Skip(String),
}

fn fatal(e: RegistryError) -> OpError {
    OpError::Fatal(e)
}

/// One service directory: `{root}/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Dir {
    root: String,
    name: String,
    layout: Layout,
}

impl Dir {
    fn path(&self) -> String {
        join(&self.root, &self.name)
    }

    /// Problems scope: a Dubbo interface's `providers` directory, else the directory.
    fn scope(&self, dubbo: bool) -> String {
        if dubbo {
            format!("zookeeper {}", join(&self.path(), "providers"))
        } else {
            format!("zookeeper {}", self.path())
        }
    }
}

/// The registry as the adapter knows it: the one copy of its state.
#[derive(Debug, Default)]
struct Model {
    /// Service directories per root, as last listed.
    dirs: BTreeMap<String, BTreeSet<Dir>>,
    /// What each directory holds.
    states: BTreeMap<Dir, DirState>,
    /// What was sent, per service (hashes, not the services: see [`Sent`]).
    served: BTreeMap<ServiceKey, Sent>,
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
struct DirState {
    /// Problems scope ([`Dir::scope`]).
    scope: String,
    /// What the next change to the directory is applied to.
    held: Held,
    converted: Converted,
    /// `content_hash` of the service, computed once per change of the directory, so comparing
    /// everything that is served with what was sent costs nothing for the others.
    hash: Option<u64>,
}

/// What a directory's children were read as.
#[derive(Debug, Default, PartialEq)]
enum Held {
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
    fn new(scope: String, held: Held, converted: Converted) -> Self {
        Self {
            scope,
            held,
            converted,
            hash: None,
        }
    }

    /// Nothing to serve and nothing wrong.
    fn nothing(scope: String) -> Self {
        Self::new(scope, Held::Nothing, Converted::default())
    }

    /// Nothing to serve: `problem` says why.
    fn unreadable(scope: String, problem: String) -> Self {
        let converted = Converted {
            problems: vec![problem],
            ..Converted::default()
        };
        Self::new(scope, Held::Nothing, converted)
    }
}

/// What reading one directory found.
#[derive(Debug)]
enum Read {
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
enum Fetched {
    Data(Vec<u8>),
    /// Unreadable (reported as a problem).
    Problem(String),
    /// Deleted since its directory was listed.
    Missing,
}

/// What a directory's children make it.
#[derive(Debug, PartialEq, Eq)]
enum Shape {
    /// Dubbo 3 bookkeeping under a Dubbo root: never a service.
    Reserved,
    /// A Dubbo interface, with or without a `providers` directory.
    Dubbo { providers: bool },
    /// Curator / Dubbo 3 instances, by id.
    Curator(Vec<String>),
}

/// Classifies a directory by its children.
fn shape(dir: &Dir, children: Vec<String>) -> Shape {
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

/// The instances of the directory at `path` to read: every one when `full`, else those not
/// held yet and those whose data watch is not armed (it fired, or could not be armed).
fn instances_to_read(
    path: &str,
    ids: &[String],
    held: Option<&BTreeMap<String, Result<Vec<u8>, String>>>,
    full: bool,
    armed: &HashSet<String>,
) -> Vec<String> {
    ids.iter()
        .filter(|id| {
            full || !held.is_some_and(|m| m.contains_key(*id))
                || !armed.contains(&data_key(&join(path, id)))
        })
        .cloned()
        .collect()
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
    fn apply(&mut self, dir: Dir, read: Read, touched: &mut Vec<String>) {
        if matches!(read, Read::Unchanged) {
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
        settle(&mut new, old.as_ref());
        if let Some(o) = old.filter(|o| o.scope != new.scope) {
            touched.push(o.scope);
        }
        touched.push(new.scope.clone());
        self.count(&new, true);
        self.states.insert(dir, new);
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
    fn sync(
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
            served,
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
            self.served
                .insert(service.key.clone(), Sent::new(service, hash));
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

fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// Key of the child watch on `path` in [`Session::armed`].
fn child_key(path: &str) -> String {
    format!("c:{path}")
}

/// Key of the data watch on `path` in [`Session::armed`].
fn data_key(path: &str) -> String {
    format!("d:{path}")
}

fn is_connected(s: ZkState) -> bool {
    matches!(s, ZkState::Connected | ZkState::ConnectedReadOnly)
}

/// What a fired watch on a path points at.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Root(String, Layout),
    Dir(Dir),
}

/// The root or service directory a watched path belongs to (the longest matching root).
fn target(roots: &[(String, Layout)], path: &str) -> Option<Target> {
    let (root, layout) = roots
        .iter()
        .filter(|(r, _)| {
            path == r
                || path
                    .strip_prefix(r.as_str())
                    .is_some_and(|rest| rest.starts_with('/') || r == "/")
        })
        .max_by_key(|(r, _)| r.len())?;
    if path == root {
        return Some(Target::Root(root.clone(), *layout));
    }
    let rest = path.get(root.len()..)?.trim_start_matches('/');
    let name = rest.split('/').next().filter(|n| !n.is_empty())?;
    Some(Target::Dir(Dir {
        root: root.clone(),
        name: name.to_string(),
        layout: *layout,
    }))
}

/// Per-watch state: what is armed, the registry as known, what was sent.
struct Session<'a> {
    inner: &'a Inner,
    zk: Arc<ZooKeeper>,
    hints: mpsc::UnboundedSender<Hint>,
    /// Watches armed and not fired yet: what they watch is known to be as read.
    armed: HashSet<String>,
    /// Taken from [`Inner::model`] for this watch, handed back when it ends.
    model: Model,
    /// Root-level problems (scope -> problems).
    root_problems: BTreeMap<String, Vec<String>>,
    /// Problems last sent per scope (only changes are sent again).
    sent_problems: ProblemLedger,
    /// Problems from the last assembly (renamed interfaces, duplicate names), per scope.
    assembly_problems: BTreeMap<String, Vec<String>>,
}

impl Inner {
    /// Runs a ZooKeeper request with the request timeout and classifies its failure.
    async fn op<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, ZkError>>,
    ) -> Result<Option<T>, OpError> {
        match timeout(self.request_timeout, fut).await {
            Err(_) => Err(fatal(RegistryError::Unavailable(format!(
                "ZooKeeper request for {what} timed out after {:?}",
                self.request_timeout
            )))),
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(ZkError::NoNode)) => Ok(None),
            Ok(Err(ZkError::NoAuth)) => Err(OpError::Skip(format!(
                "zookeeper {what}: not readable with the configured credentials (NoAuth)"
            ))),
            Ok(Err(ZkError::AuthFailed)) => Err(fatal(RegistryError::Unauthorized(format!(
                "ZooKeeper refused the digest credentials ({what})"
            )))),
            Ok(Err(
                e @ (ZkError::ConnectionLoss
                | ZkError::SessionExpired
                | ZkError::SessionMoved
                | ZkError::OperationTimeout
                | ZkError::MarshallingError),
            )) => Err(fatal(RegistryError::Unavailable(format!(
                "ZooKeeper request for {what} failed: {e:?}"
            )))),
            Ok(Err(e)) => Err(OpError::Skip(format!(
                "zookeeper {what}: cannot read ({e:?})"
            ))),
        }
    }

    /// Waits until the shared client has a connected session.
    async fn wait_connected(&self, client: &mut Client) -> Result<(), RegistryError> {
        let deadline = Instant::now() + CONNECT_WAIT;
        loop {
            let (seen, state) = *client.state.borrow_and_update();
            if is_connected(state) {
                return Ok(());
            }
            if seen == 0 {
                // The Connected transition may have happened before the listener was added:
                // a request that succeeds proves the session.
                let probe = timeout(Duration::from_secs(1), client.zk.exists("/", false)).await;
                if matches!(probe, Ok(Ok(_))) {
                    return Ok(());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RegistryError::Unavailable(format!(
                    "no ZooKeeper session with {} (state {state:?})",
                    self.servers
                )));
            }
            let _ = timeout(left.min(Duration::from_millis(500)), client.state.changed()).await;
        }
    }

    async fn watch(self: Arc<Self>, tx: EventSender) -> Result<(), RegistryError> {
        let mut client = self.clients.get().await?;
        if let Err(e) = self.wait_connected(&mut client).await {
            if is_terminal(client.state.borrow().1) {
                self.clients
                    .discard("no session and the state is terminal")
                    .await;
            }
            return Err(e);
        }
        let (hint_tx, mut hints) = mpsc::unbounded_channel();
        let model = self
            .model
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default();
        let mut s = Session {
            inner: &self,
            zk: Arc::clone(&client.zk),
            hints: hint_tx,
            armed: HashSet::new(),
            model,
            root_problems: BTreeMap::new(),
            sent_problems: ProblemLedger::new(),
            assembly_problems: BTreeMap::new(),
        };
        let mut seen_gen = client.state.borrow_and_update().0;
        s.full_list(&tx, true).await?;
        tracing::info!(
            servers = %self.servers,
            services = s.model.served.len(),
            directories = s.model.states.len(),
            "Listed ZooKeeper."
        );

        let mut resync = tokio::time::interval_at(Instant::now() + self.resync, self.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut down_since: Option<Instant> = None;
        loop {
            let grace = async {
                match down_since {
                    Some(t) => tokio::time::sleep_until(t + DISCONNECT_GRACE).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = client.state.changed() => {
                    if changed.is_err() {
                        self.clients.discard("its IO task stopped").await;
                        return Err(RegistryError::Unavailable("ZooKeeper client stopped".into()));
                    }
                    let (gen, state) = *client.state.borrow_and_update();
                    if gen == seen_gen {
                        continue;
                    }
                    seen_gen = gen;
                    if is_connected(state) {
                        // Back on the same session or on a new one: watches (and auth) are
                        // gone either way.
                        down_since = None;
                        tracing::info!("ZooKeeper connected again; re-listing everything.");
                        s.armed.clear();
                        s.full_list(&tx, false).await?;
                    } else if state == ZkState::AuthFailed {
                        self.clients.discard("ZooKeeper refused the digest credentials").await;
                        return Err(RegistryError::Unauthorized(
                            "ZooKeeper refused the digest credentials".into(),
                        ));
                    } else if is_terminal(state) {
                        self.clients.discard("the session was closed").await;
                        return Err(RegistryError::Unavailable(format!(
                            "the ZooKeeper session with {} was closed",
                            self.servers
                        )));
                    } else if down_since.is_none() {
                        down_since = Some(Instant::now());
                    }
                }
                () = grace => {
                    return Err(RegistryError::Unavailable(format!(
                        "lost the ZooKeeper connection to {} for more than {DISCONNECT_GRACE:?}",
                        self.servers
                    )));
                }
                _ = resync.tick() => {
                    if down_since.is_none() {
                        tracing::debug!("Periodic ZooKeeper re-list.");
                        s.full_list(&tx, false).await?;
                    }
                }
                hint = hints.recv() => {
                    let Some(Hint(first)) = hint else {
                        return Err(RegistryError::Ended);
                    };
                    // Whatever else has fired by now goes into the same pass; nothing waits for
                    // more (bursts are the core's to coalesce, `--coalesce`).
                    let mut fired = vec![first];
                    while let Ok(Hint(k)) = hints.try_recv() {
                        fired.push(k);
                    }
                    if down_since.is_none() {
                        let t = Instant::now();
                        let watches = fired.len();
                        s.apply_fired(&tx, fired).await?;
                        tracing::debug!(watches, took = ?t.elapsed(), "Applied fired watches.");
                    } else {
                        // Re-listed anyway once connected again.
                        for k in fired {
                            s.armed.remove(&k);
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Session<'_> {
    /// Hands the registry as known to the next watch (see [`Inner::model`]).
    fn drop(&mut self) {
        if let Ok(mut m) = self.inner.model.lock() {
            *m = std::mem::take(&mut self.model);
        }
    }
}

impl Session<'_> {
    /// A watch closure that reports `key` when it fires.
    fn watcher(&self, key: String) -> impl FnOnce(WatchedEvent) + Send + 'static {
        let tx = self.hints.clone();
        move |ev: WatchedEvent| {
            tracing::debug!(watch = %key, event = ?ev.event_type, "ZooKeeper watch fired.");
            let _ = tx.send(Hint(key));
        }
    }

    /// Children of `path`, arming a child watch unless one is armed; `None` if it is missing.
    /// Newly armed watch keys are pushed to `armed`.
    async fn children(
        &self,
        path: &str,
        armed: &mut Vec<String>,
    ) -> Result<Option<Vec<String>>, OpError> {
        let key = child_key(path);
        let zk = &self.zk;
        let r = if self.armed.contains(&key) {
            self.inner.op(path, zk.get_children(path, false)).await?
        } else {
            let r = self
                .inner
                .op(path, zk.get_children_w(path, self.watcher(key.clone())))
                .await?;
            if r.is_some() {
                armed.push(key);
            }
            r
        };
        Ok(r)
    }

    /// Lists a root's service directories; a missing root gets a creation watch.
    async fn list_root(&mut self, root: &str, layout: Layout) -> Result<(), RegistryError> {
        let zk = Arc::clone(&self.zk);
        let ekey = format!("e:{root}");
        let exists = if self.armed.contains(&ekey) {
            self.inner.op(root, zk.exists(root, false)).await
        } else {
            let w = self.watcher(ekey.clone());
            let r = self.inner.op(root, zk.exists_w(root, w)).await;
            if r.is_ok() {
                self.armed.insert(ekey);
            }
            r
        };
        let names = match exists {
            Ok(Some(Some(_))) => {
                let mut newly = Vec::new();
                let r = self.children(root, &mut newly).await;
                self.armed.extend(newly);
                r.map(Option::unwrap_or_default)
            }
            Ok(_) => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        let scope = format!("zookeeper {root}");
        let (names, problems) = match names {
            Ok(n) => (n, Vec::new()),
            Err(OpError::Fatal(e)) => return Err(e),
            Err(OpError::Skip(p)) => (Vec::new(), vec![p]),
        };
        self.root_problems.insert(scope, problems);
        let dirs = names
            .into_iter()
            .filter(|n| !(root == "/" && n == "zookeeper"))
            .filter(|n| self.inner.filters.services.allows(n))
            .map(|name| Dir {
                root: root.to_string(),
                name,
                layout,
            })
            .collect();
        self.model.dirs.insert(root.to_string(), dirs);
        Ok(())
    }

    /// Reads what may have changed in one directory, re-arming as it reads: everything when
    /// `full`, else only what has no armed watch (a watch that fired is disarmed, a new child
    /// has none); what is still watched is as `old` holds it. Returns the watches it armed.
    async fn read_dir(
        &self,
        dir: &Dir,
        old: Option<&DirState>,
        full: bool,
    ) -> Result<(Read, Vec<String>), RegistryError> {
        let path = dir.path();
        let mut newly = Vec::new();
        let known = old.filter(|_| !full && self.armed.contains(&child_key(&path)));
        let shape = match known.map(|o| &o.held) {
            Some(Held::Nothing) => return Ok((Read::Unchanged, newly)),
            Some(Held::Providers) => Shape::Dubbo { providers: true },
            Some(Held::Instances(m)) => Shape::Curator(m.keys().cloned().collect()),
            None => match self.children(&path, &mut newly).await {
                Ok(Some(children)) => shape(dir, children),
                Ok(None) => return Ok((Read::Gone, newly)),
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => {
                    return Ok((Read::from(DirState::unreadable(dir.scope(false), p)), newly))
                }
            },
        };
        let read = match shape {
            Shape::Reserved => Read::from(DirState::nothing(dir.scope(false))),
            Shape::Dubbo { providers: false } => Read::from(DirState::nothing(dir.scope(true))),
            Shape::Dubbo { providers: true } => {
                self.read_providers(dir, old, full, &mut newly).await?
            }
            Shape::Curator(ids) => self.read_instances(dir, old, full, ids, &mut newly).await?,
        };
        Ok((read, newly))
    }

    /// A Dubbo interface's providers: the children of its `providers` directory, converted
    /// whole (the znode names are the data), unless that directory's watch is still armed.
    async fn read_providers(
        &self,
        dir: &Dir,
        old: Option<&DirState>,
        full: bool,
        newly: &mut Vec<String>,
    ) -> Result<Read, RegistryError> {
        let path = join(&dir.path(), "providers");
        let scope = dir.scope(true);
        if !full
            && old.is_some_and(|o| o.held == Held::Providers)
            && self.armed.contains(&child_key(&path))
        {
            return Ok(Read::Unchanged);
        }
        Ok(match self.children(&path, newly).await {
            Ok(Some(providers)) => {
                let converted =
                    convert_dubbo(&dir.root, &dir.name, &providers, &self.inner.filters);
                Read::from(DirState::new(scope, Held::Providers, converted))
            }
            // Deleted since its parent was listed: no `providers` directory, nothing served.
            Ok(None) => Read::from(DirState::nothing(scope)),
            Err(OpError::Fatal(e)) => return Err(e),
            Err(OpError::Skip(p)) => Read::from(DirState::unreadable(scope, p)),
        })
    }

    /// A Curator directory's instances `ids`: the data of those that are new or whose data
    /// watch fired (of all of them when `full`), arming data watches; the others keep theirs.
    async fn read_instances(
        &self,
        dir: &Dir,
        old: Option<&DirState>,
        full: bool,
        ids: Vec<String>,
        newly: &mut Vec<String>,
    ) -> Result<Read, RegistryError> {
        let path = dir.path();
        let held = old.and_then(|o| match &o.held {
            Held::Instances(m) => Some(m),
            _ => None,
        });
        let to_read = instances_to_read(&path, &ids, held, full, &self.armed);
        // Nothing to read and no instance gone (every id is held, and as many as held).
        if to_read.is_empty() && held.is_some_and(|m| m.len() == ids.len()) {
            return Ok(Read::Unchanged);
        }
        let inner = self.inner;
        let results: Vec<_> = stream::iter(to_read)
            .map(|id| {
                let p = join(&path, &id);
                let key = data_key(&p);
                let w = (!self.armed.contains(&key)).then(|| self.watcher(key.clone()));
                let zk = &self.zk;
                async move {
                    let r = match w {
                        Some(w) => inner.op(&p, zk.get_data_w(&p, w)).await,
                        None => inner.op(&p, zk.get_data(&p, false)).await,
                    };
                    (id, key, r)
                }
            })
            .buffered(inner.concurrency)
            .collect()
            .await;
        let mut read = Vec::with_capacity(results.len());
        for (id, key, r) in results {
            let fetched = match r {
                Ok(Some((data, _stat))) => {
                    if !self.armed.contains(&key) {
                        newly.push(key);
                    }
                    Fetched::Data(data)
                }
                Ok(None) => Fetched::Missing,
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => Fetched::Problem(p),
            };
            read.push((id, fetched));
        }
        Ok(Read::Instances { ids, read })
    }

    /// Reads directories concurrently and applies what they hold.
    async fn read_dirs(
        &mut self,
        dirs: Vec<Dir>,
        full: bool,
        touched: &mut Vec<String>,
    ) -> Result<(), RegistryError> {
        let results: Vec<_> = {
            let this = &*self;
            stream::iter(dirs)
                .map(|d| async move {
                    let r = this.read_dir(&d, this.model.states.get(&d), full).await;
                    (d, r)
                })
                .buffer_unordered(this.inner.concurrency)
                .collect()
                .await
        };
        for (dir, r) in results {
            let (read, newly) = r?;
            self.armed.extend(newly);
            self.model.apply(dir, read, touched);
        }
        Ok(())
    }

    /// Re-lists every root and directory and sends the result (`Reset` when `reset`).
    async fn full_list(&mut self, tx: &EventSender, reset: bool) -> Result<(), RegistryError> {
        if let Some(d) = &self.inner.digest {
            let zk = Arc::clone(&self.zk);
            match self
                .inner
                .op("auth", zk.add_auth("digest", d.as_bytes().to_vec()))
                .await
            {
                Ok(_) => {}
                Err(OpError::Fatal(e)) => return Err(e),
                Err(OpError::Skip(p)) => {
                    return Err(RegistryError::Unauthorized(p));
                }
            }
        }
        for (root, layout) in self.inner.roots.clone() {
            self.list_root(&root, layout).await?;
        }
        let all: Vec<Dir> = self.model.dirs.values().flatten().cloned().collect();
        let keep: BTreeSet<&Dir> = all.iter().collect();
        let gone: Vec<Dir> = self
            .model
            .states
            .keys()
            .filter(|d| !keep.contains(d))
            .cloned()
            .collect();
        let mut touched = Vec::new();
        for d in gone {
            self.model.apply(d, Read::Gone, &mut touched);
        }
        self.read_dirs(all, true, &mut touched).await?;
        self.publish(tx, reset, touched, true).await
    }

    /// Applies fired watches: a root is listed again (new directories read whole, gone ones
    /// dropped), a directory reads what its fired watches point at.
    async fn apply_fired(
        &mut self,
        tx: &EventSender,
        fired: Vec<String>,
    ) -> Result<(), RegistryError> {
        let mut roots = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        for key in fired {
            self.armed.remove(&key);
            let path = key.get(2..).unwrap_or("");
            match target(&self.inner.roots, path) {
                Some(Target::Root(root, layout)) => {
                    roots.insert((root, layout));
                }
                Some(Target::Dir(dir)) => {
                    dirs.insert(dir);
                }
                None => {}
            }
        }
        let mut touched = Vec::new();
        for (root, layout) in &roots {
            // Taken out, not copied: list_root puts the new listing in its place.
            let before = self.model.dirs.remove(root).unwrap_or_default();
            self.list_root(root, *layout).await?;
            let after = self.model.dirs.get(root);
            let (gone, new): (Vec<Dir>, Vec<Dir>) = match after {
                Some(after) => (
                    before.difference(after).cloned().collect(),
                    after.difference(&before).cloned().collect(),
                ),
                None => (before.into_iter().collect(), Vec::new()),
            };
            for d in gone {
                dirs.remove(&d);
                self.model.apply(d, Read::Gone, &mut touched);
            }
            dirs.extend(new);
        }
        // Only directories still present under their root.
        let dirs: Vec<Dir> = dirs
            .into_iter()
            .filter(|d| self.model.dirs.get(&d.root).is_some_and(|s| s.contains(d)))
            .collect();
        self.read_dirs(dirs, false, &mut touched).await?;
        self.publish(tx, false, touched, false).await
    }

    /// Sends the problems that changed and the services that changed (or a `Reset` of
    /// everything). `touched` are the directory scopes whose problems may have changed;
    /// `all` re-reports every scope (a full list).
    async fn publish(
        &mut self,
        tx: &EventSender,
        reset: bool,
        touched: Vec<String>,
        all: bool,
    ) -> Result<(), RegistryError> {
        let (events, assembled) = self.model.sync(self.inner.discovery, reset);
        // Every scope that may have changed, with its full list: the directory's own problems
        // plus those from assembling (which may come and go for directories that did not
        // change); only the ones that differ from what was sent go out.
        let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for scope in touched {
            problems.insert(scope, Vec::new());
        }
        if let Some(assembled) = assembled {
            let before = std::mem::replace(&mut self.assembly_problems, assembled);
            for scope in before
                .into_keys()
                .chain(self.assembly_problems.keys().cloned())
            {
                problems.insert(scope, Vec::new());
            }
        }
        for st in self.model.states.values() {
            if all {
                problems.insert(st.scope.clone(), st.converted.problems.clone());
            } else if !st.converted.problems.is_empty() {
                if let Some(p) = problems.get_mut(&st.scope) {
                    p.extend(st.converted.problems.iter().cloned());
                }
            }
        }
        for (scope, p) in &self.root_problems {
            problems
                .entry(scope.clone())
                .or_default()
                .extend(p.iter().cloned());
        }
        for (scope, p) in problems.iter_mut() {
            if let Some(extra) = self.assembly_problems.get(scope) {
                p.extend(extra.iter().cloned());
            }
        }
        for (scope, p) in problems {
            // A new watch re-sends everything: the core may hold scopes from an earlier one.
            let event = if reset {
                Some(self.sent_problems.record(&scope, p))
            } else {
                self.sent_problems.update(&scope, p)
            };
            if let Some(event) = event {
                if let RegistryEvent::Problems { problems, .. } = &event {
                    for line in problems {
                        tracing::warn!(problem = %line, "Skipped part of a ZooKeeper service.");
                    }
                }
                tx.send(event).await?;
            }
        }
        for ev in events {
            tx.send(ev).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Filters;

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

    #[test]
    fn fired_paths_map_to_roots_and_directories() {
        let roots = vec![
            ("/dubbo".to_string(), Layout::Auto),
            ("/services".to_string(), Layout::Auto),
            ("/services/x".to_string(), Layout::Curator),
        ];
        let dir = |root: &str, name: &str, layout| {
            Some(Target::Dir(Dir {
                root: root.into(),
                name: name.into(),
                layout,
            }))
        };
        assert_eq!(
            target(&roots, "/dubbo"),
            Some(Target::Root("/dubbo".into(), Layout::Auto))
        );
        assert_eq!(
            target(&roots, "/dubbo/com.foo.Api/providers"),
            dir("/dubbo", "com.foo.Api", Layout::Auto)
        );
        assert_eq!(
            target(&roots, "/services/web/1"),
            dir("/services", "web", Layout::Auto)
        );
        assert_eq!(
            target(&roots, "/services/x/y"),
            dir("/services/x", "y", Layout::Curator)
        );
        assert_eq!(target(&roots, "/dubbox/a"), None);
        assert_eq!(target(&roots, "/other"), None);
        let slash = vec![("/".to_string(), Layout::Curator)];
        assert_eq!(target(&slash, "/web/1"), dir("/", "web", Layout::Curator));
        assert_eq!(
            target(&slash, "/"),
            Some(Target::Root("/".into(), Layout::Curator))
        );
    }
}
